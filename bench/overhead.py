"""Monitoring overhead, side by side: the median ratio of a watched training step to the bare step.

Every configuration of one model runs in this one process, interleaved in rounds (A B C A B C ...) after a
warm-up, so machine drift hits all of them alike. Each configuration trains its own copy of the model with its
monitoring attached for the whole run (periodic work such as flushes is timed at its steady rate). Each round
times `steps` training steps (forward, backward, optimizer step) per configuration (more for the configurations
that measure only some steps: `PERIODIC_STEPS`); the ratio of a round is its mean step time over the bare mean of
the same round. The table gives the median ratio and its interquartile range over rounds.

    python bench/overhead.py                 # all models, full run; writes bench/results/overhead.json
    python bench/overhead.py --quick         # a short run
    python bench/overhead.py --models tiny --rounds 3 --steps 5
    python bench/overhead.py --repeat 2      # each model measured twice (columns "mlp", "mlp #2" ...)
    python bench/overhead.py --device cuda   # on a GPU (steps synchronize before and after each round)
    python bench/overhead.py --configs "watch(every=1)"   # bare and the configurations named (CONFIGS' keys)
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

import hookscope
from hookscope.hooks import register_module_hook, scope, select_modules

HERE = Path(__file__).resolve().parent
Step = Callable[[], None]
Config = Callable[[nn.Module, torch.optim.Optimizer], contextlib.AbstractContextManager[Any]]


def mlp() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    layers: list[nn.Module] = []
    for _ in range(3):
        layers += [nn.Linear(1024, 1024), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(1024, 10)), torch.randn(256, 1024), torch.randint(0, 10, (256,))


def tiny() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 10))
    return model, torch.randn(8, 32), torch.randint(0, 10, (8,))


def cnn() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    layers: list[nn.Module] = []
    channels = [3, 32, 32, 64, 64, 128, 128, 128, 128]
    for index in range(8):
        stride = 2 if index in (2, 4, 6) else 1
        layers += [nn.Conv2d(channels[index], channels[index + 1], 3, stride, 1, bias=False)]
        layers += [nn.BatchNorm2d(channels[index + 1]), nn.ReLU(inplace=True)]
    model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))
    return model, torch.randn(64, 3, 32, 32), torch.randint(0, 10, (64,))


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
        self.head = nn.Linear(256, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x).mean(dim=1))


def transformer() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    return Encoder(), torch.randn(16, 128, 256), torch.randint(0, 10, (16,))


class SqueezeExcite(nn.Module):
    """Channel attention of MobileNetV3: pool, reduce, expand, hard sigmoid, rescale."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        squeezed = max(8, channels // 4)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.reduce, self.relu = nn.Conv2d(channels, squeezed, 1), nn.ReLU(inplace=True)
        self.expand, self.gate = nn.Conv2d(squeezed, channels, 1), nn.Hardsigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gate(self.expand(self.relu(self.reduce(self.pool(x)))))


class InvertedResidual(nn.Module):
    """MobileNetV3's block: 1x1 expansion, depthwise 3x3, optional squeeze-excitation, 1x1 projection."""

    def __init__(self, inputs: int, expanded: int, outputs: int, stride: int, excite: bool) -> None:
        super().__init__()
        self.expand = nn.Sequential(
            nn.Conv2d(inputs, expanded, 1, bias=False), nn.BatchNorm2d(expanded), nn.Hardswish()
        )
        self.depthwise = nn.Sequential(
            nn.Conv2d(expanded, expanded, 3, stride, 1, groups=expanded, bias=False),
            nn.BatchNorm2d(expanded),
            nn.Hardswish(),
        )
        self.excite = SqueezeExcite(expanded) if excite else nn.Identity()
        self.project = nn.Sequential(nn.Conv2d(expanded, outputs, 1, bias=False), nn.BatchNorm2d(outputs))
        self.residual = stride == 1 and inputs == outputs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.project(self.excite(self.depthwise(self.expand(x))))
        return x + y if self.residual else y


def mobile() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """A MobileNetV3-small-style CNN: many large activations per FLOP, the worst case for monitoring."""
    blocks = [(16, 64, 16, 1, False), (16, 72, 24, 2, False), (24, 88, 24, 1, False), (24, 96, 40, 2, True)]
    blocks += [(40, 240, 40, 1, True), (40, 120, 48, 1, True)]
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, 2, 1, bias=False),
        nn.BatchNorm2d(16),
        nn.Hardswish(),
        *(InvertedResidual(*block) for block in blocks),
        nn.Conv2d(48, 288, 1, bias=False),
        nn.BatchNorm2d(288),
        nn.Hardswish(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(288, 10),
    )
    return model, torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))


class FlatGPT(nn.Module):
    """`hookscope.demo.TinyGPT` (explicit-softmax attention) with its logits flattened for `CrossEntropyLoss`."""

    def __init__(self) -> None:
        super().__init__()
        from hookscope.demo import TinyGPT

        self.gpt = TinyGPT()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.gpt(ids)
        return logits.reshape(-1, logits.shape[-1])


def gpt() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The tiny pre-LN decoder of the doctor's transformer checks: batch 16, 31 tokens."""
    ids = torch.randint(0, 64, (16, 32))
    return FlatGPT(), ids[:, :-1], ids[:, 1:].reshape(-1)


MODELS = {"mlp": mlp, "cnn": cnn, "transformer": transformer, "tiny": tiny, "mobile": mobile, "gpt": gpt}
STEPS = {"mlp": 10, "cnn": 5, "transformer": 4, "tiny": 200, "mobile": 2, "gpt": 20}
"""Steps timed per configuration per round (about 0.2-2 s each: a sub-millisecond step needs many)."""

PERIODIC_STEPS = {"mlp": 60, "cnn": 30, "transformer": 30, "tiny": 300, "mobile": 160, "gpt": 250}
"""Steps timed per round by the configurations that measure some steps (`PERIODIC`): about three of their periods.
A budget of 3 % measures one step about every (what a measured step costs beyond a bare one) / 0.03 steps, 6 to
80 steps on these models (`every=10`: 10), so a round of `STEPS` would hold a measured step in some rounds and
none in others, and the median of such rounds is the cost of neither; a round of a few periods holds them in the
share the run does."""


def make_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> Step:
    loss_fn = nn.CrossEntropyLoss()

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        optimizer.step()

    return step


# ---- configurations: each a context manager factory (model, optimizer) -> context ---------------------------


def bare(model: nn.Module, optimizer: torch.optim.Optimizer) -> contextlib.AbstractContextManager[Any]:
    return contextlib.nullcontext()


@contextlib.contextmanager
def noop_hooks(model: nn.Module, optimizer: torch.optim.Optimizer) -> Iterator[None]:
    with scope():
        for _, module in select_modules(model):
            register_module_hook(module, "forward", _noop)
        yield


def _noop(module: nn.Module, args: Any, output: Any) -> None:
    return None


@contextlib.contextmanager
def naive_item(model: nn.Module, optimizer: torch.optim.Optimizer) -> Iterator[None]:
    """The common pattern: per-layer mean, std, near-zero with `.item()` and a 40-bin histc, every step."""
    records: list[tuple[float, float, float, torch.Tensor]] = []

    def hook(module: nn.Module, args: Any, output: Any) -> None:
        out = (output if isinstance(output, torch.Tensor) else output[0]).detach().float()  # attention: a tuple
        records.append((out.mean().item(), out.std().item(), (out <= 0.05).float().mean().item(), out.histc(40, -7, 7)))

    with scope():
        for _, module in select_modules(model):
            register_module_hook(module, "forward", hook)
        yield


@contextlib.contextmanager
def reads_alone(model: nn.Module, optimizer: torch.optim.Optimizer) -> Iterator[None]:
    """The floor of `watch(every=1)` on the CPU: the reads it makes of every step's tensors, with the engine's own
    read functions, and nothing else (no bookkeeping, no describing, nothing kept past the step). A large output:
    its sums, extremes and a sample (`take_sample`); a small one: a copy. A large output gradient: its sum of
    squares, read on the host; a small one: kept. The parameters: small gradients flattened into one copy, large
    ones their sums of squares; small weights flattened before and after the optimizer step and subtracted, large
    ones a sample gathered before and after. Ratios below this one cannot come from faster bookkeeping."""
    from hookscope._torch import flatten
    from hookscope.stats._describe import sample_values, sum_of_squares, take_sample
    from hookscope.stats._sample import Sampler
    from hookscope.stats._tables import SMALL_BELOW
    from hookscope.watch._selection import default_selection

    sampler, kept, before = Sampler(), [], []
    modules, owners = default_selection(model)
    params = [p for _, m in owners for p in m.parameters(recurse=False)]
    small, large = [p for p in params if p.numel() < SMALL_BELOW], [p for p in params if p.numel() >= SMALL_BELOW]

    def output_grad(grad: torch.Tensor) -> None:
        kept.append(float(sum_of_squares(grad)) if grad.numel() >= SMALL_BELOW else grad)

    def output(module: nn.Module, args: Any, out: Any) -> None:
        x = out if isinstance(out, torch.Tensor) else out[0]
        kept.append(take_sample(x, sampler) if x.numel() >= SMALL_BELOW else x.detach().clone())
        if x.requires_grad:
            x.register_hook(output_grad)

    def before_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        with torch.no_grad():
            kept.append(flatten([p.grad for p in small if p.grad is not None]))
            kept.extend(float(sum_of_squares(p.grad)) for p in large if p.grad is not None)
            before[:] = [flatten(small)]
            for p in large:
                comb, _, start = sampler.draw_positions(p.numel(), p.device)
                before.append((p, comb, start, sample_values(p, comb, start)))

    def after_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        with torch.no_grad():
            after = flatten(small)
            kept.extend((before[0].sub_(after), after))
            kept.extend(values.sub_(sample_values(p, comb, start)) for p, comb, start, values in before[1:])
        kept.clear()

    handles = [optimizer.register_step_pre_hook(before_step), optimizer.register_step_post_hook(after_step)]
    try:
        with scope():
            for _, module in modules:
                register_module_hook(module, "forward", output)
            yield
    finally:
        for handle in handles:
            handle.remove()


def activation_stats(**options: Any) -> Config:
    @contextlib.contextmanager
    def config(model: nn.Module, optimizer: torch.optim.Optimizer) -> Iterator[None]:
        from hookscope.callbacks import ActivationStats

        with ActivationStats(with_hist=True, **options).attach(model):
            yield

    return config


@contextlib.contextmanager
def watch_defaults(model: nn.Module, optimizer: torch.optim.Optimizer) -> Iterator[None]:
    from hookscope.watch import watch

    with watch(model, optimizer):  # the defaults: steps measured within a 3 % overhead budget
        yield


@contextlib.contextmanager
def watch_everything(model: nn.Module, optimizer: torch.optim.Optimizer) -> Iterator[None]:
    from hookscope.watch import watch

    with watch(model, optimizer, every=1, capacity=None):  # every step measured and kept: no thinning
        yield


@contextlib.contextmanager
def watch_without_attention(model: nn.Module, optimizer: torch.optim.Optimizer) -> Iterator[None]:
    from hookscope.watch import watch
    from hookscope.watch._options import GROUPS

    groups = [group for group in GROUPS if group not in ("attention", "residual")]
    with watch(model, optimizer, capacity=None, groups=groups):  # what the attention and residual groups add
        yield


@contextlib.contextmanager
def attached_then_detached(model: nn.Module, optimizer: torch.optim.Optimizer) -> Iterator[None]:
    from hookscope.watch import watch

    watcher = watch(model, optimizer)
    watcher.attach()
    watcher.detach()
    yield


CONFIGS: dict[str, Config] = {
    "bare": bare,
    "hooks doing nothing": noop_hooks,
    "ActivationStats defaults (budget 3 %)": activation_stats(),
    "ActivationStats, every step": activation_stats(budget=None),
    "ActivationStats, every=10": activation_stats(every=10),
    "watch() defaults (budget 3 %)": watch_defaults,
    "watch(every=1)": watch_everything,
    "watch() defaults without attention and residual": watch_without_attention,
    "attached then detached": attached_then_detached,
    "naive per-layer .item() (reference)": naive_item,
    "the reads of watch(every=1) alone (floor)": reads_alone,
}

PERIODIC = (
    "ActivationStats defaults (budget 3 %)",
    "ActivationStats, every=10",
    "watch() defaults (budget 3 %)",
    "watch() defaults without attention and residual",
)
"""The configurations that measure only some steps: timed over `PERIODIC_STEPS` steps a round."""


def available(name: str) -> bool:
    """Whether the configuration's library part exists in this checkout (it is skipped, and said so, if not)."""
    needs = {"ActivationStats": "hookscope.callbacks", "watch": "hookscope.watch", "attached": "hookscope.watch"}
    for word, module in needs.items():
        if word in name:
            try:
                imported = __import__(module, fromlist=["*"])
            except ImportError:
                return False
            if word in ("watch", "attached") and not hasattr(imported, "watch"):
                return False
            if word == "ActivationStats" and not hasattr(imported, "ActivationStats"):
                return False
    return True


def warmup_steps(quick: bool) -> int:
    """Untimed steps before the rounds: past the steps a budgeted watch measures whatever they cost (its warm-up),
    so that every configuration is timed at its steady rate."""
    try:
        from hookscope.callbacks._budget import WARMUP_STEPS
    except ImportError:
        WARMUP_STEPS = 0
    return (2 if quick else 5) + WARMUP_STEPS


def time_round(step: Step, steps: int) -> float:
    """Mean seconds per step over `steps` steps. As `timeit`, the cyclic garbage collector is off while timing
    (collected before), so its pauses do not land at random in one configuration's round."""
    gc.collect()
    _synchronize()
    enabled = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        _synchronize()
        return (time.perf_counter() - start) / steps
    finally:
        if enabled:
            gc.enable()


def _synchronize() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def bench_model(
    name: str,
    configs: dict[str, Config],
    rounds: int,
    steps: int,
    warmup: int,
    device: str = "cpu",
    periodic_steps: int | None = None,
) -> dict[str, Any]:
    """Time every configuration of model `name` in interleaved rounds; each has its own copy of the model, with
    its monitoring attached for the whole run, so periodic work (flushes to the host, batched statistics) is
    timed at its steady-state rate. The configurations in `PERIODIC` time `periodic_steps` steps a round (default:
    `steps`)."""
    torch.manual_seed(0)
    model, x, y = MODELS[name]()
    model, x, y = model.to(device), x.to(device), y.to(device)
    times: dict[str, list[float]] = {config: [] for config in configs}
    with contextlib.ExitStack() as stack:
        runs: dict[str, Step] = {}
        for config, factory in configs.items():
            copy = model if config == "bare" else copy_module(model)
            optimizer = torch.optim.SGD(copy.parameters(), lr=1e-3, momentum=0.9)
            stack.enter_context(factory(copy, optimizer))
            runs[config] = make_step(copy, optimizer, x, y)
            for _ in range(warmup):
                runs[config]()
        periodic = periodic_steps or steps
        periodic_bare: list[float] | None = None if periodic == steps else []
        for _ in range(rounds):
            for config, step in runs.items():
                times[config].append(time_round(step, periodic if config in PERIODIC else steps))
                if config == "bare" and periodic_bare is not None:
                    periodic_bare.append(time_round(step, periodic))  # their reference: as many steps
    return summarize(times, periodic_bare)


def copy_module(model: nn.Module) -> nn.Module:
    """An independent copy with the same weights (fresh memory, no hooks)."""
    import copy

    return copy.deepcopy(model)


def summarize(times: dict[str, list[float]], periodic_bare: list[float] | None = None) -> dict[str, Any]:
    """Median ratio (and quartiles) of each configuration's rounds over the bare rounds; the configurations in
    `PERIODIC` over `periodic_bare` when given (bare rounds of as many steps as theirs: a round's first steps after
    the other configurations ran are slower, and weigh less in a longer round)."""
    out: dict[str, Any] = {}
    for config, values in times.items():
        bare_times = periodic_bare if periodic_bare is not None and config in PERIODIC else times["bare"]
        ratios = sorted(v / b for v, b in zip(values, bare_times, strict=True))
        quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        out[config] = {
            "median_ratio": statistics.median(ratios),
            "q1": quartiles[0],
            "q3": quartiles[2],
            "median_step_ms": 1000 * statistics.median(values),
        }
    return out


COMPILED = {"mlp": mlp, "tiny": tiny}
"""The models of the compiled pairs: Sequentials (`_own_code` gives each copy a graph of its own)."""


def bench_compiled(
    model_name: str, rounds: int, steps: int, backend: str = "inductor", device: str = "cpu"
) -> dict[str, Any]:
    """Compiled bare vs compiled watched `model_name` (watch attached before compiling), and whether it recorded.

    dynamo caches compiled code per code object and does not guard on module hooks by default, so two models of
    one class would share one graph (without or with the hooks). Each model here gets a root class with a forward
    of its own (`_own_code`), hence its own graph.
    """
    from hookscope.watch import watch

    torch.manual_seed(0)
    options: dict[str, dict[str, Any]] = {"watched": {}, "watched every=1": {"every": 1, "capacity": None}}
    results: dict[str, list[float]] = {"bare": [], **{config: [] for config in options}}
    runners, watchers = {}, {}
    for config in results:
        model, x, y = COMPILED[model_name]()
        model, x, y = _own_code(model).to(device), x.to(device), y.to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        if config in options:
            watchers[config] = watch(model, optimizer, **options[config])
            watchers[config].attach()
        compiled = torch.compile(model, backend=backend)
        runners[config] = make_step(compiled, optimizer, x, y)
        for _ in range(warmup_steps(quick=True)):
            runners[config]()
    for _ in range(rounds):
        for config, step in runners.items():
            results[config].append(time_round(step, steps))
    summary = summarize(results)
    for config, watcher in watchers.items():
        watcher.detach()
        measured = watcher.results().meta["measured"]
        summary[config]["recorded_steps"], summary[config]["steps"] = measured["recorded"], measured["steps"]
    return summary


def _own_code(model: nn.Sequential) -> nn.Module:
    """`model`'s layers under a root whose forward is a code object of its own (what dynamo caches graphs by)."""
    namespace: dict[str, Any] = {}
    exec("def forward(self, x):\n    for layer in self:\n        x = layer(x)\n    return x\n", namespace)
    root = type("OwnSequential", (nn.Sequential,), {"forward": namespace["forward"]})
    return root(*model)


def peak_rss_growth(steps: int) -> dict[str, float]:
    """Peak RSS (MiB) of a fresh process after `steps` bare tiny-MLP steps, then after 10% and 100% of `steps`
    watched steps of the same model: the watched peak should sit a fixed amount above the bare one and not grow
    with steps. A process of its own: the peak of this one is the largest model's."""
    probe = [sys.executable, str(Path(__file__).resolve()), "--rss-probe", str(steps)]
    done = subprocess.run(probe, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _rss_probe(steps: int) -> dict[str, float]:
    from hookscope.watch import watch

    model, x, y = tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    step = make_step(model, optimizer, x, y)
    for _ in range(steps):
        step()
    marks = {"bare": _peak_rss_mib()}
    with watch(model, optimizer):
        for index in range(steps):
            step()
            if index + 1 in (steps // 10, steps):
                marks[f"watched_after_{index + 1}"] = _peak_rss_mib()
    return marks


def _peak_rss_mib() -> float:
    """This process's peak RSS: Linux's VmHWM (reset by exec; `ru_maxrss` survives exec, so a child started
    by a large parent would report the parent's peak), else `ru_maxrss`."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def machine(device: str) -> str:
    """One line naming the machine: architecture, CPU model, cores and torch threads (and the GPU, if used)."""
    cpu = platform.processor() or "cpu"
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    line = f"{platform.machine()}, {cpu}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"
    if device.startswith("cuda") and torch.cuda.is_available():
        line += f", {torch.cuda.get_device_name()}"
    return line


def markdown(results: dict[str, dict[str, Any]]) -> str:
    models = list(results)
    configs = list(next(iter(results.values())))
    lines = ["| configuration | " + " | ".join(models) + " |", "|---|" + "---|" * len(models)]
    for config in configs:
        cells = []
        for model in models:
            row = results[model].get(config)
            cells.append("n/a" if row is None else f"{row['median_ratio']:.3f} ({row['q1']:.3f}-{row['q3']:.3f})")
        lines.append(f"| {config} | " + " | ".join(cells) + " |")
    bare_ms = [f"{results[m]['bare']['median_step_ms']:.2f} ms" for m in models]
    lines.append("| bare step (median) | " + " | ".join(bare_ms) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a short run (few rounds and steps)")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None, help="steps per round (default: per model, STEPS)")
    parser.add_argument("--memory-steps", type=int, default=None, help="watched tiny-MLP steps for the RSS check")
    parser.add_argument("--configs", default=None, help="comma-separated configurations to run (default: all)")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile pair")
    parser.add_argument("--compiled", default=",".join(COMPILED), help="the models of the compiled pairs")
    parser.add_argument("--compile-backend", default="inductor", help="torch.compile backend of the compiled pair")
    parser.add_argument("--repeat", type=int, default=1, help="measure each model this many times (noisy machines)")
    parser.add_argument("--device", default="cpu", help="where the models run (cpu, cuda)")
    parser.add_argument("--out", default=str(HERE / "results" / "overhead.json"))
    parser.add_argument("--rss-probe", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rss_probe is not None:  # the fresh process of peak_rss_growth
        print(json.dumps(_rss_probe(args.rss_probe)))
        return 0
    rounds = args.rounds or (3 if args.quick else 15)
    memory_steps = args.memory_steps if args.memory_steps is not None else (200 if args.quick else 10_000)
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        parser.error(f"--models must be among {', '.join(MODELS)}, got {', '.join(unknown)}")
    configs = {name: factory for name, factory in CONFIGS.items() if available(name)}
    skipped = [name for name in CONFIGS if name not in configs]
    if args.configs is not None:
        wanted = ["bare", *(c for c in args.configs.split(",") if c and c != "bare")]
        unknown = [c for c in wanted if c not in CONFIGS]
        if unknown:
            parser.error(f"--configs must be among {', '.join(CONFIGS)}, got {', '.join(unknown)}")
        configs = {name: configs[name] for name in wanted if name in configs}
    results, steps_per_round = {}, {}
    for model in models:
        steps = args.steps or (max(2, STEPS[model] // 10) if args.quick else STEPS[model])
        periodic = args.steps or (max(2, PERIODIC_STEPS[model] // 10) if args.quick else PERIODIC_STEPS[model])
        steps_per_round[model] = steps if periodic == steps else f"{steps} ({periodic} periodic)"
        for run in range(max(1, args.repeat)):
            print(
                f"benchmarking {model} ({rounds} rounds x {steps} steps x {len(configs)} configurations) ...",
                file=sys.stderr,
            )
            column = model if run == 0 else f"{model} #{run + 1}"
            results[column] = bench_model(
                model, configs, rounds, steps, warmup_steps(args.quick), args.device, periodic_steps=periodic
            )
    report: dict[str, Any] = {
        "machine": machine(args.device),
        "torch": torch.__version__,
        "hookscope": hookscope.__version__,
        "rounds": rounds,
        "steps_per_round": steps_per_round,
        "results": results,
        "skipped": skipped,
    }
    table = markdown(results)
    per_model = ", ".join(f"{m} {n}" for m, n in steps_per_round.items())
    print(f"machine: {report['machine']}, torch {torch.__version__}, {rounds} rounds; steps per round: {per_model}\n")
    print(table)
    if skipped:
        print(f"\nskipped (not in this checkout): {', '.join(skipped)}")
    if available("watch") and not args.no_compile:
        for name in [m for m in args.compiled.split(",") if m in COMPILED]:
            compiled_steps = args.steps or (max(2, STEPS[name] // 10) if args.quick else STEPS[name])
            report[f"compiled_{name}"] = bench_compiled(name, rounds, compiled_steps, args.compile_backend, args.device)
            for config in ("watched", "watched every=1"):
                compiled = report[f"compiled_{name}"][config]
                print(
                    f"\ntorch.compile ({args.compile_backend}), {name}: {config}/bare = "
                    f"{compiled['median_ratio']:.3f} ({compiled['q1']:.3f}-{compiled['q3']:.3f}), "
                    f"{compiled['recorded_steps']} of {compiled['steps']} steps recorded"
                )
    if available("watch") and memory_steps:
        report["peak_rss_mib"] = peak_rss_growth(memory_steps)
        print(
            f"\npeak RSS (MiB) of a fresh process, {memory_steps} bare then watched tiny steps: "
            f"{report['peak_rss_mib']}"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"\nwrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
