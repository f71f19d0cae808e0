"""Sync-free ``torchmetrics.segmentation``: GeneralizedDiceScore (area ``generalized_dice``)."""
