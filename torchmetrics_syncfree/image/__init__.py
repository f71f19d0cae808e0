"""Sync-free ``torchmetrics.image``: :mod:`~torchmetrics_syncfree.image.psnr` (area ``psnr``)."""
