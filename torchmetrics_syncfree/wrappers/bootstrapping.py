"""Sync-free ``torchmetrics.wrappers.bootstrapping``: ``BootStrapper.update`` draws its samples on the device.

==================================================  ===========================================================
stock                                                sync-free (device path)
==================================================  ===========================================================
``_bootstrap_sampler`` per bootstrap, on the CPU:    one ``torch.randint(size, (num_bootstraps, size))`` on the
``Poisson(1).sample((size,))`` (a host-to-device     metric's device per update: ``size`` indices drawn uniformly
copy of the rate and a read), ``arange(size)         with replacement for every bootstrap (a fixed shape), each
.repeat_interleave(counts)`` (a data-dependent       bootstrap's inputs by ``index_select`` with its row (no copy,
shape), then ``.to(self.device)`` (a copy of the     no read)
indices per bootstrap); ``"multinomial"``:
``torch.multinomial`` on the CPU, copied
``if sample_idx.numel() == 0: continue``             never empty (``size`` draws); an input of size 0 is stock's
==================================================  ===========================================================

``forward`` is :mod:`.checks`' (``Metric.forward`` of the wrapper, holding the bootstrap copies), ``compute`` is
stock's. Where reads are free (CPU) the update is stock's: its draws from the global CPU generator, so seeded runs
give stock's values to the bit.

Deviations from stock (device path; documented in ``docs/other-metrics.md``, tested in
``tests/test_wrappers_more.py``):

* the draws come from the device's generator (on CUDA, ``torch.cuda.manual_seed``), not the global CPU generator:
  the same seed gives other samples than stock's, so values agree in distribution, not draw by draw;
* ``sampling_strategy="multinomial"``: the same distribution as stock's (``size`` uniform draws with replacement);
* ``sampling_strategy="poisson"``: stock's per-sample counts are independent ``Poisson(1)``, so a bootstrap's size
  varies (``Poisson(size)``, empty with probability ``exp(-size)``, when stock skips it). A fixed shape cannot vary:
  the device path draws exactly ``size`` samples, which is stock's distribution *conditioned on its size being
  ``size``* (independent Poisson counts given their sum are multinomial). Each sample's count is
  ``Binomial(size, 1/size)`` (mean 1, variance ``1 - 1/size``) instead of ``Poisson(1)`` (mean 1, variance 1): the
  bootstrap's spread of a mean is ``sqrt(1 - 1/size)`` of stock's, the usual (exact) bootstrap; stock's Poisson
  scheme approximates it for large batches.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning_utilities import apply_to_collection
from torch import Tensor

from torchmetrics_syncfree import _deferred
from torchmetrics_syncfree._registry import replaces, stock

_UPDATE = "torchmetrics.wrappers.bootstrapping.BootStrapper.update"


def first_tensor(args: Any, kwargs: Any) -> Tensor | None:
    """The first tensor among ``args`` and ``kwargs`` (nested collections too), or ``None``."""
    found: list[Tensor] = []
    apply_to_collection((args, kwargs), Tensor, found.append)
    return found[0] if found else None


@replaces(_UPDATE, params=("self", "args", "kwargs"), kind="metric_method")
def _update(self: Any, *args: Any, **kwargs: Any) -> None:
    """Stock's update where reads are free; on the device path every bootstrap's indices from one device draw."""
    sample = first_tensor(args, kwargs)
    if sample is None or _deferred.reads_are_free(sample):
        stock(_UPDATE)(self, *args, **kwargs)
        return
    # stock's sampling size: the length of the first tensor argument, else of the first tensor keyword argument
    args_sizes = apply_to_collection(args, Tensor, len)
    kwargs_sizes = apply_to_collection(kwargs, Tensor, len)
    size = args_sizes[0] if len(args_sizes) > 0 else next(iter(kwargs_sizes.values()))
    if size == 0:  # stock skips every (empty) bootstrap
        stock(_UPDATE)(self, *args, **kwargs)
        return
    indices = torch.randint(size, (self.num_bootstraps, size), device=self.device)
    for idx, metric in enumerate(self.metrics):
        new_args = apply_to_collection(args, Tensor, torch.index_select, dim=0, index=indices[idx])
        new_kwargs = apply_to_collection(kwargs, Tensor, torch.index_select, dim=0, index=indices[idx])
        metric.update(*new_args, **new_kwargs)
