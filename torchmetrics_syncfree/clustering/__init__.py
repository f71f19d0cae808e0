"""Sync-free ``torchmetrics.clustering`` (area ``clustering``), one module per upstream functional module it patches.

The twelve clustering metrics keep stock's update (list states, no read); their compute (and so ``forward``'s batch
value) reads the host ONCE per call, the data-sized number of clusters (and of occupied contingency cells, largest
cluster sizes), after which everything is fixed-shape device work. The shared counting lives in
:mod:`~torchmetrics_syncfree.clustering.utils`; the entry points that the metric classes call are replaced in:

* :mod:`.mutual_info_score`, :mod:`.normalized_mutual_info_score`, :mod:`.adjusted_mutual_info_score`;
* :mod:`.rand_score`, :mod:`.adjusted_rand_score`, :mod:`.fowlkes_mallows_index`;
* :mod:`.homogeneity_completeness_v_measure` (HomogeneityScore, CompletenessScore, VMeasureScore);
* :mod:`.calinski_harabasz_score`, :mod:`.davies_bouldin_score`, :mod:`.dunn_index` (intrinsic: data and labels).

ClusterAccuracy (a confusion matrix and a linear assignment on the host) is not covered. Details:
``docs/clustering.md``.
"""

from torchmetrics_syncfree.clustering import (  # noqa: F401  (declare the area's patches)
    adjusted_mutual_info_score,
    adjusted_rand_score,
    calinski_harabasz_score,
    davies_bouldin_score,
    dunn_index,
    fowlkes_mallows_index,
    homogeneity_completeness_v_measure,
    mutual_info_score,
    normalized_mutual_info_score,
    rand_score,
    utils,
)
