"""Host time of ``update``/``forward``/``compute`` for the audit's catalogue, stock and patched in the same run.

Every configuration and call is one pytest-benchmark *group* holding a stock and a patched benchmark side by side,
so the ratio reads directly from the group table (``--benchmark-group-by=group``) or from
``python benchmarks/ratios.py <saved run>.json``. ``tox -e bench`` runs them fully; in the test environments they
run once each with ``--benchmark-disable`` as a correctness check (every call works in both modes, patched
``compute()`` equals stock).

"""

from __future__ import annotations

import pytest
import torch
import torchmetrics

from torchmetrics_syncfree.tools.audit import CALLS, CATALOGUE, MODES, _mode, build_metric, make_inputs

LIST_STATE_ROUNDS = 300


def _reference(config) -> torch.Tensor:
    """Stock ``compute()`` after the single warm-up update every benchmarked metric gets."""
    metric = build_metric(config.spec)
    args, kwargs = make_inputs(config.inputs, metric, torch.device("cpu"))
    metric.update(*args, **kwargs)
    return metric.compute()


# marked slow: the smoke run (~2.5 min for 438 cases on 2 cores) runs in the newest release's env only; the per-version
# parity and sync tests cover every release, and timings are taken on one release (``tox -e bench``)
@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("config", CATALOGUE, ids=[c.label for c in CATALOGUE])
def test_host_time(benchmark, config, call, mode):
    reference = _reference(config) if call == "compute" else None
    benchmark.group = f"{config.label} :: {call}"
    benchmark.extra_info.update(
        {
            "config": config.label,
            "call": call,
            "mode": mode,
            "area": config.area,
            "torch": torch.__version__,
            "torchmetrics": torchmetrics.__version__,
        }
    )
    with _mode(mode):
        metric = build_metric(config.spec)
        args, kwargs = make_inputs(config.inputs, metric, torch.device("cpu"))
        metric.update(*args, **kwargs)
        if call != "compute" and any(isinstance(default, list) for default in metric._defaults.values()):
            # list states (CatMetric) grow with every call: start each round from the same one-update state, or
            # the cost depends on how many rounds each mode happened to run

            def fresh_state():
                metric.reset()
                metric.update(*args, **kwargs)

            target = metric.update if call == "update" else metric
            benchmark.pedantic(target, args=args, kwargs=kwargs, setup=fresh_state, rounds=LIST_STATE_ROUNDS)
        elif call == "update":
            benchmark(metric.update, *args, **kwargs)
        elif call == "forward":
            benchmark(metric, *args, **kwargs)
        else:

            def compute():
                metric._computed = None  # the wrapper caches compute(); measure the computation itself
                return metric.compute()

            value = benchmark(compute)
            torch.testing.assert_close(value, reference, equal_nan=True)
