"""Sync-free ``torchmetrics.text``: :mod:`~torchmetrics_syncfree.text.perplexity` (area ``perplexity``)."""
