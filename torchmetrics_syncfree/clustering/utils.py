"""Sync-free ``torchmetrics.functional.clustering.utils``: the shared counting of the clustering metrics.

==================================================  ===========================================================
stock                                                sync-free
==================================================  ===========================================================
``torch.unique(x, return_inverse=True)``: the        dense labels by one ``sort`` and a running count of value
labels renumbered 0..k-1, k read by the host          changes, scattered back to the samples' order (fixed shape)
``torch.bincount(...)`` of those labels,             ``index_add_`` of ones into a table of one slot per sample
``p[p > 0]``                                         (every number of clusters fits); the table cut to the k
                                                     clusters after the one read
``sparse_coo_tensor(...).to_dense()`` contingency    the same table from the dense labels (``index_put_`` with
                                                     ``accumulate``), its shape from the one read
``torch.nonzero(contingency)`` (mutual information)  the occupied cells found without the table: the pair keys
                                                     ``target * n + preds`` sorted and counted as above, in the
                                                     row-major order of ``nonzero``
==================================================  ===========================================================

The number of clusters is data-sized: a compute (and so a ``forward``) of a clustering metric reads the host ONCE,
one small tensor with every size it needs (the numbers of predicted and target clusters, of occupied contingency
cells, and for AdjustedMutualInfoScore the largest cluster sizes); everything after it is fixed-shape device work.
RandScore, AdjustedRandScore and FowlkesMallowsIndex take only sums of squared cluster and cell sizes, which the
tables of one slot per sample give as they are (empty slots add 0): they read nothing. The update appends the batch
to list states, as stock, and reads nothing. Every metric runs this one implementation on every device.

The public helpers replaced here (``everywhere``: the functional modules import them by name): ``calculate_entropy``
counts without any read (a table of one slot per sample, empty slots adding 0: its float sum runs over more terms
than stock's, equal within float32 rounding, relative 1e-6) and ``calculate_contingency_matrix`` reads the two cluster
counts once (stock's table to the bit, dense or sparse). Where host reads are free (CPU) both are stock's
(:func:`takes_stock`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor
from torchmetrics.functional.clustering.utils import (
    _validate_intrinsic_cluster_data,
    _validate_intrinsic_labels_to_samples,
)

from torchmetrics_syncfree import _deferred
from torchmetrics_syncfree._registry import replaces, stock

_FUNCTIONAL = "torchmetrics.functional.clustering.utils"


def stock_rejects(labels: Tensor) -> bool:
    """Whether stock's code runs for its own outcome: the labels are not 1-d (stock's error) or empty."""
    return labels.ndim != 1 or labels.numel() == 0


def takes_stock(labels: Tensor) -> bool:
    """Whether the public helpers ``calculate_entropy`` and ``calculate_contingency_matrix`` run stock's code.

    No metric calls them (each metric's function here counts its own tables). Where host reads are free (CPU) stock's
    ``torch.unique`` costs less than their read-free forms (1.2-1.8x stock's CPU time at 32 samples), and stock's
    entropy sums only the occupied clusters, to the bit; elsewhere (and on empty or non-1-d labels: stock's outcome)
    the read-free forms run.
    """
    return _deferred.reads_are_free(labels) or stock_rejects(labels)


def _group_ids(values: Tensor) -> Tensor:
    """0-based group ids of sorted values: a running count of the places where a value differs from its predecessor."""
    ids = torch.zeros_like(values, dtype=torch.long)
    torch.cumsum(values[1:] != values[:-1], 0, out=ids[1:])
    return ids


def dense_labels(x: Tensor) -> tuple[Tensor, Tensor]:
    """Stock's ``torch.unique(x, return_inverse=True)[1]`` without a data-sized output, and the largest label.

    Returns the labels renumbered 0..k-1 in the order of their values (int64, ``x``'s shape; ``x`` is 1-d and not
    empty) and k - 1 as a 1-element int64 tensor (on the device, not read: the caller adds 1 after its one read).
    """
    values, order = x.sort()
    group = _group_ids(values)
    return torch.empty_like(group).scatter_(0, order, group), group[-1:]


def label_counts(labels: Tensor, ones: Tensor | None = None) -> Tensor:
    """The number of samples of each dense label, in a table of one slot per sample (int64; empty slots are 0).

    ``ones``: int64 ones of ``labels``' shape, when the caller has them (one launch fewer).
    """
    return torch.zeros_like(labels).index_add_(0, labels, torch.ones_like(labels) if ones is None else ones)


def entropy_of_counts(counts: Tensor) -> Tensor:
    """Stock's ``calculate_entropy`` from the (positive) counts of its labels: its operations on the same values."""
    n = counts.sum()
    return -torch.sum((counts / n) * (torch.log(counts) - torch.log(n)))


def power_mean(x: Tensor, method: str) -> Tensor:
    """Stock's ``calculate_generalized_mean`` of two entropies, without its input check.

    The check (``not is_nonnegative(x)``: a host read) cannot fail for entropies: each of their terms is
    ``(p / n) * (log p - log n)`` with ``0 < p <= n``, never positive.
    """
    if method == "min":
        return x.min()
    if method == "geometric":
        return torch.exp(torch.mean(x.log()))
    if method == "arithmetic":
        return x.mean()
    return x.max()


@dataclass
class PairTables:
    """Two clusterings counted together without a host read: tables of one slot per sample (int64, empty slots 0).

    The samples in (target, preds) order: ``keys`` their pair keys ``target * n + preds`` of the dense labels
    (sorted), ``cell`` their occupied contingency cell (numbered in row-major order); ``cells`` the count of each
    cell, ``target_counts``/``preds_counts`` the size of each cluster; ``largest_target``/``largest_preds`` the
    largest dense labels (1 element each, the numbers of clusters less one).
    """

    n: int
    largest_target: Tensor
    largest_preds: Tensor
    keys: Tensor
    cell: Tensor
    cells: Tensor
    target_counts: Tensor
    preds_counts: Tensor


def pair_tables(preds: Tensor, target: Tensor) -> PairTables:
    """Count two clusterings (1-d, same non-zero length) into :class:`PairTables`: two sorts, no host read."""
    n = preds.numel()
    # sorted by preds, then stably by target: the samples in (target, preds) order, the cells its runs of equal pairs
    # (the first sort need not be stable: equal preds are interchangeable; a stable CPU sort costs half as much again)
    preds_sorted, preds_order = preds.sort()
    preds_labels = _group_ids(preds_sorted)
    target_sorted, pair_order = target.gather(0, preds_order).sort(stable=True)
    target_labels = _group_ids(target_sorted)
    keys = target_labels * n + preds_labels.gather(0, pair_order)
    cell = _group_ids(keys)
    ones = torch.ones_like(keys)
    return PairTables(
        n=n,
        largest_target=target_labels[-1:],
        largest_preds=preds_labels[-1:],
        keys=keys,
        cell=cell,
        cells=label_counts(cell, ones),
        target_counts=label_counts(target_labels, ones),
        preds_counts=label_counts(preds_labels, ones),
    )


def squared_sums(tables: PairTables) -> Tensor:
    """The sums of the squared cell, target cluster and predicted cluster sizes (int64, 3 values: exact)."""
    return torch.stack([tables.cells, tables.target_counts, tables.preds_counts]).square_().sum(1)


def pair_confusion(tables: PairTables) -> Tensor:
    """Stock's ``calculate_pair_cluster_confusion_matrix`` (int64 2x2), exact, without a host read.

    Stock's ``(contingency * sum_k).sum()`` weighs each cell by its column's sum: per column that is the column sum
    squared, so every entry is a difference of :func:`squared_sums`.
    """
    cells, target_clusters, preds_clusters = squared_sums(tables).unbind()
    n = tables.n
    same_preds, same_target = target_clusters - cells, preds_clusters - cells  # stock's [0, 1] and [1, 0]
    neither = n * n - same_preds - same_target - cells
    return torch.stack([neither, same_preds, same_target, cells - n]).view(2, 2)


@dataclass
class LabelPairs:
    """Two clusterings counted together after the one host read (every tensor on the labels' device).

    ``rows``/``cols``/``cells``: the target cluster, predicted cluster and count of each occupied contingency cell,
    in the row-major order of ``torch.nonzero(contingency)``; ``target_counts``/``preds_counts``: the sizes of the
    target and predicted clusters (the contingency's row and column sums); ``extra``: the values that the caller's
    ``extra`` function added to the read.
    """

    n: int
    rows: Tensor
    cols: Tensor
    cells: Tensor
    target_counts: Tensor
    preds_counts: Tensor
    extra: list[int] = field(default_factory=list)


def label_pairs(
    preds: Tensor, target: Tensor, extra: Callable[[Tensor, Tensor], list[Tensor]] | None = None
) -> LabelPairs:
    """Count two clusterings (1-d, same non-zero length) with ONE host read: :func:`pair_tables` cut to size.

    ``extra(target_counts, preds_counts)`` may add 1-element int64 tensors (computed from the per-sample count
    tables) to that read.
    """
    tables = pair_tables(preds, target)
    n = tables.n
    # every key of a cell is the same: the scatter writes equal values
    cell_keys = torch.zeros_like(tables.keys).scatter_(0, tables.cell, tables.keys)
    added = [] if extra is None else extra(tables.target_counts, tables.preds_counts)
    # the one host read of the call: every data-sized shape at once (the largest labels: counts less one)
    sizes = torch.cat([tables.largest_target, tables.largest_preds, tables.cell[-1:], *added]).tolist()
    num_target_clusters, num_preds_clusters, occupied = (size + 1 for size in sizes[:3])
    cell_keys = cell_keys[:occupied]
    return LabelPairs(
        n=n,
        rows=cell_keys // n,
        cols=cell_keys % n,
        cells=tables.cells[:occupied],
        target_counts=tables.target_counts[:num_target_clusters],
        preds_counts=tables.preds_counts[:num_preds_clusters],
        extra=sizes[3:],
    )


def mutual_info(pairs: LabelPairs) -> Tensor:
    """Stock's ``_mutual_info_score_compute`` over the occupied cells: the same operations on the same values."""
    n = torch.full((), pairs.n, dtype=torch.int64, device=pairs.cells.device)  # stock: ``contingency.sum()``
    rows, cols = pairs.target_counts.index_select(0, pairs.rows), pairs.preds_counts.index_select(0, pairs.cols)
    log_outer = torch.log(rows) + torch.log(cols)
    contingency = pairs.cells
    return (contingency / n * (torch.log(n) + torch.log(contingency) - log_outer)).sum()


@replaces(f"{_FUNCTIONAL}.calculate_entropy", params=("x",), everywhere=True)
def calculate_entropy(x: Tensor) -> Tensor:
    """Stock's entropy of a tensor of labels, counted in a fixed-size table (no host read)."""
    if takes_stock(x):
        return stock(f"{_FUNCTIONAL}.calculate_entropy")(x)
    counts = label_counts(dense_labels(x)[0])
    n = counts.sum()
    occupied = counts > 0
    safe = torch.where(occupied, counts, 1)
    return -torch.where(occupied, (counts / n) * (torch.log(safe) - torch.log(n)), 0).sum()


@replaces(f"{_FUNCTIONAL}.calculate_contingency_matrix", params=("preds", "target", "eps", "sparse"), everywhere=True)
def calculate_contingency_matrix(
    preds: Tensor, target: Tensor, eps: float | None = None, sparse: bool = False
) -> Tensor:
    """Stock's contingency matrix (target clusters x predicted clusters) with one host read: its shape."""
    if takes_stock(preds) or target.ndim != 1:
        return stock(f"{_FUNCTIONAL}.calculate_contingency_matrix")(preds, target, eps, sparse)
    if eps is not None and sparse is True:
        raise ValueError("Cannot specify `eps` and return sparse tensor.")
    preds_labels, last_preds = dense_labels(preds)
    target_labels, last_target = dense_labels(target)
    shape = tuple(size + 1 for size in torch.cat([last_target, last_preds]).tolist())  # the one host read
    ones = torch.ones_like(target_labels)
    if sparse:
        return torch.sparse_coo_tensor(torch.stack((target_labels, preds_labels)), ones, shape)
    contingency = torch.zeros(shape, dtype=ones.dtype, device=ones.device)
    contingency.index_put_((target_labels, preds_labels), ones, accumulate=True)
    if eps:
        contingency = contingency + eps
    return contingency


def clusters(labels: Tensor) -> tuple[Tensor, Tensor, int]:
    """The dense labels of an intrinsic metric's samples, each cluster's size (int64) and the number of clusters.

    One host read (the number of clusters) where there are labels; ``labels`` is 1-d.
    """
    if labels.numel() == 0:
        nothing = torch.zeros(0, dtype=torch.long, device=labels.device)
        return nothing, nothing, 0
    dense, last = dense_labels(labels)
    num_labels = int(last.tolist()[0]) + 1  # the one host read
    return dense, label_counts(dense)[:num_labels], num_labels


def validated_clusters(data: Tensor, labels: Tensor) -> tuple[Tensor, Tensor, int]:
    """:func:`clusters` between stock's two checks of an intrinsic metric's input (its errors, its texts)."""
    _validate_intrinsic_cluster_data(data, labels)
    dense, counts, num_labels = clusters(labels)
    _validate_intrinsic_labels_to_samples(num_labels, data.shape[0])
    return dense, counts, num_labels


def cluster_means(data: Tensor, labels: Tensor, counts: Tensor) -> Tensor:
    """Each cluster's mean in ``data``'s dtype.

    One ``index_add_``: the sums run in another order than stock's per-cluster ``mean``, equal within rounding.
    """
    sums = torch.zeros((counts.numel(), data.shape[1]), dtype=data.dtype, device=data.device)
    return sums.index_add_(0, labels, data) / counts[:, None]
