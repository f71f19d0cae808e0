"""Patch TorchMetrics at interpreter start-up when TORCHMETRICS_SYNCFREE_AUTOPATCH=1.

Put this directory on PYTHONPATH (tools/upstream_tests.py does) so that processes spawned by upstream's DDP tests,
which never see the pytest plugin, run patched too.
"""

import os

if os.environ.get("TORCHMETRICS_SYNCFREE_AUTOPATCH", "") not in ("", "0"):
    import torchmetrics_syncfree

    torchmetrics_syncfree.patch_all()
