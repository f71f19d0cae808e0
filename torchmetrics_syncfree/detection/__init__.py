"""Sync-free ``torchmetrics.detection``: the box IoU metrics (area ``detection_iou``)."""
