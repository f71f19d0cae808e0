"""Sync-free ``torchmetrics.wrappers``, one module per upstream module it patches.

* :mod:`~torchmetrics_syncfree.wrappers.minmax` (area ``minmax``): ``MinMaxMetric.compute``;
* :mod:`~torchmetrics_syncfree.wrappers.bootstrapping` (area ``bootstrapping``): ``BootStrapper.update``;
* :mod:`~torchmetrics_syncfree.wrappers.multioutput` (area ``multioutput``):
  ``MultioutputWrapper._get_args_kwargs_by_output``;
* :mod:`~torchmetrics_syncfree.wrappers.checks` (area ``wrapper_checks``): the wrappers' internal resets and computes.
"""
