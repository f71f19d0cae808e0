"""Sync-free ``torchmetrics.wrappers``: :mod:`~torchmetrics_syncfree.wrappers.minmax` (area ``minmax``)."""
