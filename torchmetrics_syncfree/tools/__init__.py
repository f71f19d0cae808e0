"""The project's tooling, which the patched code never imports.

The sync audit (``audit``), the census of TorchMetrics classes (``census``), the training-loop demo (``demo``), the
GPU check (``gpu_check``) and the kernel-launch counter (``launches``). Importing ``torchmetrics_syncfree`` does not
import this subpackage; the command line (``python -m torchmetrics_syncfree``) imports its modules when a subcommand
needs them.

"""
