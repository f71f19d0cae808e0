"""The motivating report's experiment as a command: a training loop with metrics, stock vs patched.

``python -m torchmetrics_syncfree demo`` trains a model on random images and updates ``MeanMetric(loss)`` plus
multiclass ``Accuracy``, ``Precision``, ``Recall`` and ``F1Score`` on every step; every ``--log-every`` steps it
calls ``compute()``, reads the values with ``.item()``, prints them and resets the metrics. It does so three ways in
one process:

``none``
    the same loop without metrics (the baseline);
``stock``
    stock TorchMetrics (nothing patched: checked before the run);
``patched``
    the same code inside :func:`torchmetrics_syncfree.patched`.

Each variant starts from the same seed and sees the same batches, so stock and patched must end with the same metric
values. The table shows steps/s, time/step and the syncs per step: would-be syncs counted by the CPU
:class:`~torchmetrics_syncfree.SyncProbe`, or real ones on CUDA (``torch.cuda.set_sync_debug_mode``), measured over a
few extra training steps after the timed run (the probe slows the code it watches, so it never runs while timing).

The variants take turns in rounds of ``chunk`` steps, in rotating order, so that a slower or faster spell of a shared
machine hits all of them alike. Each round gives every variant one time per step; the report shows the median and the
spread (interquartile range) of those over the rounds, and compares variants by the median of their per-round ratios,
in which such spells cancel.

On CPU the model is a small CNN on 32x32 images; on CUDA it is torchvision's ResNet-18 on 224x224 images, batch 128
and 1000 classes as in the report, when torchvision can be imported.

"""

from __future__ import annotations

import contextlib
import json
import math
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

import torch
from torch import nn

from torchmetrics_syncfree import _registry
from torchmetrics_syncfree.probe import SyncEvent, SyncProbe

VARIANTS = ("none", "stock", "patched")
METRIC_NAMES = ("loss", "accuracy", "precision", "recall", "f1")


@dataclass
class DemoConfig:
    """Options of the demo (the command line's flags have the same names)."""

    steps: int | None = None  # timed steps per variant; default: 200
    batch_size: int | None = None  # default: 32 for the CNN, 128 for ResNet-18
    num_classes: int | None = None  # default: 10 for the CNN, 1000 for ResNet-18
    device: str = "auto"
    model: str = "auto"  # "cnn", "resnet18" or "auto" (ResNet-18 on CUDA when torchvision imports)
    variants: Sequence[str] = VARIANTS
    average: str = "macro"
    log_every: int = 50
    warmup: int = 5
    probe_steps: int = 3
    chunk: int = 10  # variants take turns every `chunk` steps
    threads: int | None = 1  # CPU threads for torch (None: torch's default)
    seed: int = 0
    quiet: bool = False  # no per-window metric lines
    progress: bool = True

    def resolve(self) -> DemoConfig:
        """Fill the ``None``/``auto`` fields for the chosen device and model."""
        device = self.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if torch.device(device).type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"--device {self.device} asked for CUDA, but torch {torch.__version__} sees no GPU")
        model = self.model
        if model == "auto":
            model = "resnet18" if torch.device(device).type == "cuda" and _torchvision() is not None else "cnn"
        big = model == "resnet18"
        unknown = sorted(set(self.variants) - set(VARIANTS))
        if unknown or not self.variants:
            raise ValueError(f"unknown variant(s) {unknown}; choose from {', '.join(VARIANTS)}")
        return DemoConfig(
            steps=self.steps if self.steps is not None else 200,
            batch_size=self.batch_size or (128 if big else 32),
            num_classes=self.num_classes or (1000 if big else 10),
            device=device,
            model=model,
            variants=[v for v in VARIANTS if v in self.variants],
            average=self.average,
            log_every=self.log_every,
            warmup=self.warmup,
            probe_steps=self.probe_steps,
            chunk=max(self.chunk, 1),
            threads=self.threads,
            seed=self.seed,
            quiet=self.quiet,
            progress=self.progress,
        )


def _torchvision() -> Any:
    try:
        import torchvision
    except Exception:
        return None
    return torchvision


class SmallCNN(nn.Module):
    """A CIFAR-sized convolutional classifier: small enough for a CPU, big enough that metrics are not all it does."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1),
        )
        self.classifier = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits ``(batch, num_classes)`` for images ``(batch, 3, height, width)``."""
        return self.classifier(torch.flatten(self.features(x), 1))


def build_model(config: DemoConfig) -> tuple[nn.Module, int]:
    """The model and the side of its square input images."""
    if config.model == "resnet18":
        torchvision = _torchvision()
        if torchvision is None:
            raise RuntimeError("--model resnet18 needs torchvision (it does not import here); use --model cnn")
        return torchvision.models.resnet18(num_classes=config.num_classes), 224
    if config.model == "cnn":
        return SmallCNN(config.num_classes), 32
    raise ValueError(f"unknown model {config.model!r}; choose cnn or resnet18")


def make_batches(config: DemoConfig, image_size: int, count: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A small pool of random batches, cycled through: same data for every variant, no loader in the timing."""
    gen = torch.Generator().manual_seed(config.seed + 1)
    batches = []
    for _ in range(count):
        images = torch.randn(config.batch_size, 3, image_size, image_size, generator=gen)
        labels = torch.randint(0, config.num_classes, (config.batch_size,), generator=gen)
        batches.append((images.to(config.device), labels.to(config.device)))
    return batches


class MetricSet:
    """The report's metric collection: MeanMetric of the loss and four multiclass classification metrics."""

    def __init__(self, num_classes: int, average: str, device: str) -> None:
        import torchmetrics
        from torchmetrics.aggregation import MeanMetric

        task = {"task": "multiclass", "num_classes": num_classes, "average": average}
        self.loss = MeanMetric().to(device)
        self.classification = {
            "accuracy": torchmetrics.Accuracy(**task).to(device),
            "precision": torchmetrics.Precision(**task).to(device),
            "recall": torchmetrics.Recall(**task).to(device),
            "f1": torchmetrics.F1Score(**task).to(device),
        }

    def update(self, loss: torch.Tensor, logits: torch.Tensor, target: torch.Tensor) -> None:
        """Feed one step's loss to the loss mean and its logits and targets to the classification metrics."""
        self.loss.update(loss)
        for metric in self.classification.values():
            metric.update(logits, target)

    def compute(self) -> dict[str, float]:
        """Every metric's value as a float, read as a logger does (compute, then ``.item()``: a sync); then reset."""
        values = {"loss": self.loss.compute().item()}
        values.update({name: metric.compute().mean().item() for name, metric in self.classification.items()})
        self.reset()
        return values

    def reset(self) -> None:
        """Reset the loss mean and every classification metric."""
        self.loss.reset()
        for metric in self.classification.values():
            metric.reset()


class Progress:
    """A one-line progress bar on a terminal; a few plain lines elsewhere (CI logs)."""

    def __init__(self, label: str, total: int, stream: TextIO, enabled: bool = True) -> None:
        self.label, self.total, self.stream, self.enabled = label, total, stream, enabled
        self.tty = enabled and stream.isatty()
        self.start = time.perf_counter()
        self.shown = -1.0
        self.next_mark = 0

    def update(self, done: int) -> None:
        """Show ``done`` of ``total`` steps finished: redrawn at most every 0.1 s on a terminal, else per quarter."""
        if not self.enabled:
            return
        now = time.perf_counter()
        rate = done / max(now - self.start, 1e-9)
        if self.tty:
            if now - self.shown < 0.1 and done < self.total:
                return
            self.shown = now
            filled = int(24 * done / max(self.total, 1))
            bar = "#" * filled + "-" * (24 - filled)
            self.stream.write(f"\r{self.label:<8} |{bar}| {done}/{self.total} {rate:6.1f} steps/s")
            if done >= self.total:
                self.stream.write("\n")
            self.stream.flush()
        elif done * 4 >= self.next_mark * self.total:
            self.stream.write(f"{self.label:<8} {done}/{self.total} steps ({rate:.1f} steps/s)\n")
            self.stream.flush()
            self.next_mark = (done * 4) // max(self.total, 1) + 1

    def message(self, text: str) -> None:
        """Write ``text`` as a line of its own, clearing the progress bar first on a terminal."""
        if self.tty:
            self.stream.write("\r\033[K")
        self.stream.write(text + "\n")
        self.stream.flush()


@dataclass(frozen=True)
class Spread:
    """Median, quartiles and range of one quantity measured once per round.

    Example:
        >>> Spread.of([3.0, 1.0, 2.0, 10.0])
        Spread(median=2.5, q1=1.75, q3=4.75, min=1.0, max=10.0, rounds=4)

    """

    median: float
    q1: float
    q3: float
    min: float
    max: float
    rounds: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        """The spread of ``values`` (at least one)."""
        ordered = sorted(values)
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive") if len(ordered) > 1 else ordered * 3
        return cls(statistics.median(ordered), q1, q3, ordered[0], ordered[-1], len(ordered))

    def holds(self, value: float) -> bool:
        """Whether ``value`` lies within the interquartile range."""
        return self.q1 <= value <= self.q3


@dataclass
class VariantResult:
    """What one variant measured: timed steps, step times, syncs per step by kind and source, final values."""

    variant: str
    steps: int
    seconds: float
    step_ms: list[float]
    syncs_per_step: float
    sync_kinds: dict[str, float]  # per step
    sync_sources: list[dict[str, Any]] = field(default_factory=list)  # grouped events of the probed steps
    final_values: dict[str, float] = field(default_factory=dict)
    #: mean time per step of each round (``chunk`` steps), in the order the rounds ran
    round_ms: list[float] = field(default_factory=list)

    @property
    def steps_per_s(self) -> float:
        """Timed training steps per second."""
        return self.steps / self.seconds

    @property
    def ms_per_step(self) -> float:
        """Mean wall time of one timed step, in milliseconds."""
        return 1000 * self.seconds / self.steps

    @property
    def rounds(self) -> Spread:
        """Median and spread of the per-round time per step, in milliseconds."""
        return Spread.of(self.round_ms or [self.ms_per_step])


def _compare(a: dict[str, float], b: dict[str, float]) -> tuple[bool, float]:
    diff = max(abs(a[k] - b[k]) for k in a)
    return all(math.isclose(a[k], b[k], rel_tol=1e-6, abs_tol=1e-7) for k in a), diff


@dataclass
class DemoReport:
    """One demo run: resolved configuration, versions, how syncs were counted, per-variant results, replay."""

    config: dict[str, Any]
    versions: dict[str, str]
    sync_counting: str
    results: list[VariantResult]
    #: the stock model's outputs on a few batches fed to fresh stock and patched metrics: {"stock": ..., "patched": ...}
    replay: dict[str, dict[str, float]] | None = None

    def result(self, variant: str) -> VariantResult | None:
        """The result of ``variant``, or ``None`` if that variant did not run."""
        return next((r for r in self.results if r.variant == variant), None)

    def agreement(self) -> tuple[bool, float] | None:
        """(stock and patched final values agree, largest absolute difference), if both ran."""
        stock, patched = self.result("stock"), self.result("patched")
        if stock is None or patched is None:
            return None
        return _compare(stock.final_values, patched.final_values)

    def paired(self, variant: str, baseline: str) -> Spread | None:
        """Per-round ratios of ``variant``'s step time to ``baseline``'s (same rounds), if both ran."""
        a, b = self.result(variant), self.result(baseline)
        if a is None or b is None or not a.round_ms or len(a.round_ms) != len(b.round_ms):
            return None
        return Spread.of([x / y for x, y in zip(a.round_ms, b.round_ms)])

    def comparisons(self) -> dict[str, Spread]:
        """``"stock/none"``, ``"patched/none"``, ``"patched/stock"``: the paired ratios of the variants that ran."""
        pairs = {
            f"{a}/{b}": self.paired(a, b) for a, b in (("stock", "none"), ("patched", "none"), ("patched", "stock"))
        }
        return {name: spread for name, spread in pairs.items() if spread is not None}

    def replay_agreement(self) -> tuple[bool, float] | None:
        """The same comparison on identical inputs, immune to nondeterministic training kernels (GPU)."""
        return None if self.replay is None else _compare(self.replay["stock"], self.replay["patched"])

    def agrees(self) -> bool:
        """Whether stock and patched agree, as ``--require-agreement`` checks.

        Identical inputs (the replay) must give identical values; on CPU, where training is deterministic, the two
        training runs must end with the same values too.
        """
        replay, training = self.replay_agreement(), self.agreement()
        if replay is not None and not replay[0]:
            return False
        cpu = torch.device(self.config["device"]).type == "cpu"
        return not (cpu and training is not None and not training[0])

    def to_json(self) -> str:
        """The report as indented JSON, with the training and replay agreements added."""
        payload = asdict(self)
        for result, data in zip(self.results, payload["results"]):
            data["summary"] = asdict(result.rounds)
        payload["paired"] = {name: asdict(spread) for name, spread in self.comparisons().items()}
        agreement = self.agreement()
        payload["agreement"] = None if agreement is None else {"agree": agreement[0], "max_abs_diff": agreement[1]}
        replay = self.replay_agreement()
        payload["replay_agreement"] = None if replay is None else {"agree": replay[0], "max_abs_diff": replay[1]}
        return json.dumps(payload, indent=2)


def _sources(events: Sequence[SyncEvent], steps: int) -> list[dict[str, Any]]:
    from torchmetrics_syncfree.tools.audit import short_location

    counts = Counter((e.kind, e.location, e.source) for e in events)
    return [
        {"per_step": n / steps, "kind": kind, "location": short_location(location), "source": source}
        for (kind, location, source), n in counts.most_common()
    ]


def _variant_context(variant: str) -> contextlib.AbstractContextManager:
    if variant == "patched":
        return _registry.patched()
    active = _registry.patched_targets()
    if active:
        raise RuntimeError(
            f"the {variant!r} variant must run on stock TorchMetrics, but {len(active)} targets are patched"
        )
    return contextlib.nullcontext()


class _Variant:
    """One variant's model, optimizer, metrics and measurements; runs its steps in chunks."""

    def __init__(self, variant: str, config: DemoConfig, batches: list, progress: Progress) -> None:
        self.variant, self.config, self.batches, self.progress = variant, config, batches, progress
        self.device = torch.device(config.device)
        with _variant_context(variant):
            torch.manual_seed(config.seed)
            model, _ = build_model(config)
            self.model = model.to(self.device)
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
            self.metrics = MetricSet(config.num_classes, config.average, config.device) if variant != "none" else None
            for index in range(config.warmup):
                self.step(index)
            if self.metrics is not None and config.warmup:
                self.metrics.compute()  # also resets: the timed run starts from empty metrics
        self.done = 0
        self.seconds = 0.0
        self.step_ms: list[float] = []
        self.round_ms: list[float] = []
        self.values: dict[str, float] = {}

    def step(self, index: int) -> None:
        images, labels = self.batches[index % len(self.batches)]
        self.optimizer.zero_grad(set_to_none=True)
        logits = self.model(images)
        loss = nn.functional.cross_entropy(logits, labels)
        loss.backward()
        self.optimizer.step()
        if self.metrics is not None:
            self.metrics.update(loss.detach(), logits.detach(), labels)

    def run(self, count: int) -> None:
        """``count`` more timed steps (fewer at the end), computing/printing/resetting every ``log_every``."""
        config = self.config
        count = min(count, config.steps - self.done)
        if count <= 0:
            return
        with _variant_context(self.variant):
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(count):
                tick = time.perf_counter()
                self.step(config.warmup + self.done)
                self.done += 1
                if self.metrics is not None and (self.done % config.log_every == 0 or self.done == config.steps):
                    self.values = self.metrics.compute()
                    if not config.quiet:
                        shown = " ".join(f"{k} {v:.4f}" for k, v in self.values.items())
                        self.progress.message(f"[{self.variant}] step {self.done}: {shown}")
                self.step_ms.append(1000 * (time.perf_counter() - tick))
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - start
            self.seconds += elapsed
            self.round_ms.append(1000 * elapsed / count)

    def replay_window(self, steps: int) -> tuple[list[tuple[torch.Tensor, ...]], dict[str, float]]:
        """The model's (loss, logits, labels) on ``steps`` batches, and this variant's metric values over them."""
        window = []
        with _variant_context(self.variant), torch.no_grad():
            self.metrics.reset()
            for index in range(steps):
                images, labels = self.batches[index % len(self.batches)]
                logits = self.model(images)
                loss = nn.functional.cross_entropy(logits, labels)
                window.append((loss, logits, labels))
                self.metrics.update(loss, logits, labels)
            return window, self.metrics.compute()

    def probe(self) -> VariantResult:
        """Count the syncs of a few more training steps (metric updates included, no compute)."""
        steps = max(self.config.probe_steps, 1)
        with _variant_context(self.variant), SyncProbe(self.device.type) as probe:
            for index in range(steps):
                self.step(self.config.warmup + self.config.steps + index)
        return VariantResult(
            variant=self.variant,
            steps=self.done,
            seconds=self.seconds,
            step_ms=self.step_ms,
            syncs_per_step=probe.count / steps,
            sync_kinds={kind: n / steps for kind, n in probe.counts().items()},
            sync_sources=_sources(probe.events, steps),
            final_values=self.values,
            round_ms=self.round_ms,
        )


def run_demo(config: DemoConfig, stream: TextIO = sys.stderr) -> DemoReport:
    """Run the variants interleaved in chunks of ``chunk`` steps, so that background load hits them alike."""
    config = config.resolve()
    if config.steps < 1 or config.log_every < 1:
        raise ValueError("--steps and --log-every must be at least 1")
    threads = torch.get_num_threads()
    if config.threads and torch.device(config.device).type == "cpu":
        # one intra-op thread by default: on a small shared machine OpenMP threads that spin-wait for a busy core
        # make every step tens of times slower and bury the metrics' cost in noise
        torch.set_num_threads(config.threads)
    try:
        return _run_demo(config, stream)
    finally:
        torch.set_num_threads(threads)


def _run_demo(config: DemoConfig, stream: TextIO) -> DemoReport:
    import torchmetrics

    from torchmetrics_syncfree import __version__

    _, image_size = build_model(config)
    batches = make_batches(config, image_size)
    counting = (
        "real syncs (set_sync_debug_mode)"
        if torch.device(config.device).type == "cuda"
        else "would-be syncs (CPU probe)"
    )
    stream.write(
        f"demo: {config.model} on {config.device}, batch {config.batch_size}, {config.num_classes} classes,"
        f" {config.steps} timed steps per variant ({', '.join(config.variants)}, interleaved in chunks of"
        f" {config.chunk}), metrics computed every {config.log_every} steps, average={config.average!r},"
        f" {torch.get_num_threads()} CPU thread(s)\n"
    )
    progress = Progress("steps", config.steps * len(config.variants), stream, enabled=config.progress)
    variants = [_Variant(variant, config, batches, progress) for variant in config.variants]
    rounds = 0
    while any(v.done < config.steps for v in variants):
        order = variants[rounds % len(variants) :] + variants[: rounds % len(variants)]
        for variant in order:
            variant.run(config.chunk)
            progress.update(sum(v.done for v in variants))
        rounds += 1
    results = [variant.probe() for variant in variants]
    versions = {
        "torch": torch.__version__,
        "torchmetrics": torchmetrics.__version__,
        "torchmetrics_syncfree": __version__,
    }
    replay = None
    if {"stock", "patched"} <= set(config.variants):
        stock = next(v for v in variants if v.variant == "stock")
        window, stock_values = stock.replay_window(len(batches))
        with _registry.patched():
            metrics = MetricSet(config.num_classes, config.average, config.device)
            for inputs in window:
                metrics.update(*inputs)
            replay = {"stock": stock_values, "patched": metrics.compute()}
    return DemoReport(asdict(config), versions, counting, results, replay)


def _kinds(result: VariantResult) -> str:
    return ", ".join(f"{n:g} {kind}" for kind, n in sorted(result.sync_kinds.items()))


def _percent(ratio: float) -> str:
    return f"{100 * (ratio - 1):+.0f}%"


def _versus(spread: Spread | None) -> str:
    return "-" if spread is None else f"{_percent(spread.median)} ({_percent(spread.q1)}..{_percent(spread.q3)})"


def _patched_vs_stock(report: DemoReport) -> list[str]:
    """The stock-patched comparison in words, with what the spread allows one to conclude."""
    ratio = report.paired("patched", "stock")
    if ratio is None:
        return []
    if ratio.holds(1.0):
        verdict = "no difference this run can resolve (equal time lies within the spread)"
    else:
        verdict = f"patched is {'faster' if ratio.median < 1 else 'slower'} than stock beyond the spread"
    return [
        f"patched vs stock in the same rounds: {_percent(ratio.median)} in the median round (IQR"
        f" {_percent(ratio.q1)} to {_percent(ratio.q3)}, {ratio.rounds} rounds):",
        f"{verdict}.",
    ]


_CPU_MEANING = (
    "What the CPU numbers mean: on CPU a sync costs nothing. Reading a CPU tensor on the host waits for no queue of",
    "device work, so these times measure host overhead only (the Python and dispatch work of each variant's code) and",
    "cannot show what the patch is for. On a GPU each of stock's syncs/step stalls the host until the GPU has finished",
    "all queued work; removing that stall is the point of the patch, and only --device cuda measures it. syncs/step",
    "here counts the would-be syncs the CPU probe sees.",
)


def format_report(report: DemoReport) -> str:
    """The report as text: speed and syncs per variant, stock-vs-patched agreement, where the syncs come from."""
    chunk, rounds = report.config["chunk"], report.results[0].rounds.rounds
    lines = [
        f"torch {report.versions['torch']} | torchmetrics {report.versions['torchmetrics']} |"
        f" torchmetrics_syncfree {report.versions['torchmetrics_syncfree']} | {report.config['model']} on"
        f" {report.config['device']}, batch {report.config['batch_size']}, {report.config['steps']} steps",
        "",
        f"{'variant':<8} {'steps/s':>8} {'ms/step':>8} {'median round':>13} {'IQR of rounds':>14}"
        f" {'vs none (IQR)':>18} {'syncs/step':>11}  kinds ({report.sync_counting})",
    ]
    for r in report.results:
        spread = r.rounds
        versus = _versus(report.paired(r.variant, "none") if r.variant != "none" else None)
        lines.append(
            f"{r.variant:<8} {r.steps_per_s:>8.1f} {r.ms_per_step:>8.2f} {spread.median:>13.2f}"
            f" {f'{spread.q1:.2f}-{spread.q3:.2f}':>14} {versus:>18} {r.syncs_per_step:>11g}  {_kinds(r)}"
        )
    lines += [
        "",
        f"The variants took turns in {rounds} rounds of {chunk} steps, in rotating order. ms/step: mean over all timed",
        "steps (compute() included); median round, IQR: over the rounds' time per step; 'vs none' and the line below:",
        "median (IQR) of per-round ratios, in which a slow or fast spell of the machine cancels out.",
        *_patched_vs_stock(report),
    ]
    if torch.device(report.config["device"]).type == "cpu":
        lines += ["", *_CPU_MEANING]
    agreement = report.agreement()
    if agreement is not None:
        agree, diff = agreement
        verdict = "yes" if agree else "NO"
        if not agree and torch.device(report.config["device"]).type == "cuda":
            verdict = "no, the training runs diverged (GPU kernels are not bit-deterministic; see the replay line)"
        lines += ["", f"stock and patched final metric values agree: {verdict} (max |difference| {diff:.3g})"]
        replay = report.replay_agreement()
        if replay is not None:
            lines.append(
                "same model outputs replayed through fresh stock and patched metrics agree:"
                f" {'yes' if replay[0] else 'NO'}"
                f" (max |difference| {replay[1]:.3g})"
            )
        stock, patched = report.result("stock"), report.result("patched")
        lines += [
            f"  {name:<10} stock {stock.final_values[name]:.6f}  patched {patched.final_values[name]:.6f}"
            for name in stock.final_values
        ]
    for r in report.results:
        if r.sync_sources:
            lines += ["", f"{r.variant}: where the syncs of one training step come from"]
            for source in r.sync_sources:
                lines.append(f"  {source['per_step']:g}/step {source['kind']:<21} {source['location']}")
                if source["source"]:
                    lines.append(f"  {'':<6} {'':<21} {source['source']}")
    return "\n".join(lines)


def plot(report: DemoReport, path: str) -> None:
    """Step time per variant (the optional ``plot`` extra: matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError("--plot needs matplotlib: pip install 'torchmetrics-syncfree[plot]'") from None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in report.results:
        ax.plot(range(1, len(r.step_ms) + 1), r.step_ms, label=f"{r.variant} ({r.ms_per_step:.1f} ms/step)", lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel("host time per step [ms]")
    ax.set_yscale("log")
    ax.set_title(
        f"{report.config['model']} on {report.config['device']}, torchmetrics {report.versions['torchmetrics']}:"
        " metrics every step, compute every"
        f" {report.config['log_every']}"
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
