"""Activation patching, side by side: hookscope's batched sweep against a naive loop of forwards, nnsight 0.8 and
TransformerLens 4.3's HF bridge, on one GPT-2 built from a config (random weights, no download).

Every method sweeps the same cells (each block's output x each position), in this one process, interleaved in
rounds (A B C D ... A B C D) after a warm-up, so machine drift hits all of them alike. Each round times one whole
sweep per method (recording the clean run included); the table gives the median time, its ratio to hookscope's,
and the process CPU time's ratio (steadier than wall time on a shared
machine), and the peak memory the sweep added, measured in one more sweep apart from the timed ones: on CUDA,
`torch.cuda.max_memory_allocated` above what was allocated before; on the CPU, the peak resident set size sampled
every millisecond by a thread, above the RSS before (a coarse figure: memory the allocator kept from an earlier
sweep is not counted again). Every method's effects are checked against hookscope's (the largest absolute
difference is printed; above `TOLERANCE` the run fails).

    python bench/steer.py                  # the default GPT-2 (4 layers, width 128, 24 tokens, batch 4)
    python bench/steer.py --quick          # a short run
    python bench/steer.py --device cuda    # on a GPU
    python bench/steer.py --layers 6 --width 256 --seq 32 --batch 8 --batch-size 64
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import platform
import statistics
import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import torch
import torch.nn as nn

from hookscope import steer

HERE = Path(__file__).resolve().parent
Sweep = Callable[[], torch.Tensor]
TOLERANCE = 1e-4
"""The most two methods' effects may differ: float32 rounding of stacked and single forwards, divided by the
metric's clean-corrupted span (the test suite holds the small GPT-2 of tests/steer to 1e-5)."""
warnings.filterwarnings("ignore", message=".*token_id must be `None` or an integer.*")


def gpt2(layers: int, width: int, seq: int, device: str) -> tuple[nn.Module, Any]:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_layer=layers,
        n_embd=width,
        n_head=max(1, width // 32),
        vocab_size=1000,
        n_positions=max(seq, 16),
        use_cache=False,
        attn_implementation="eager",  # the kernels TransformerLens's bridge forces, for all
    )
    return GPT2LMHeadModel(config).eval().to(device), config


class Problem:
    """Clean and corrupted tokens that differ at one position, and the logit-difference metric at the end."""

    def __init__(self, batch: int, seq: int, device: str) -> None:
        gen = torch.Generator().manual_seed(0)
        self.clean = torch.randint(0, 1000, (batch, seq), generator=gen).to(device)
        self.corrupted = self.clean.clone()
        self.corrupted[:, seq // 3] = (self.clean[:, seq // 3] + 1) % 1000
        self.layers_seq = (0, seq)

    @staticmethod
    def metric(logits: torch.Tensor) -> torch.Tensor:
        return (logits[:, -1, 1] - logits[:, -1, 2]).mean()


def normalised(patched: list[torch.Tensor], clean: torch.Tensor, corrupted: torch.Tensor, layers: int) -> torch.Tensor:
    low, high = corrupted.double(), clean.double()
    return ((torch.stack(patched).double() - low) / (high - low)).view(layers, -1).cpu()


def hookscope_sweep(model: nn.Module, problem: Problem, batch_size: int | None) -> Sweep:
    def run() -> torch.Tensor:
        result = steer.patch(
            model,
            problem.clean,
            problem.corrupted,
            lambda out: problem.metric(out.logits),
            select="transformer.h.*",
            positions="each",
            batch_size=batch_size,
        )
        return result.effects

    return run


def naive_sweep(model: nn.Module, problem: Problem, layers: int, seq: int) -> Sweep:
    """What people write by hand: record the clean run, then one forward per cell with a torch forward hook."""

    def run() -> torch.Tensor:
        blocks = model.transformer.h
        saved: dict[int, torch.Tensor] = {}
        handles = [
            b.register_forward_hook(lambda m, a, o, i=i: saved.__setitem__(i, o.detach())) for i, b in enumerate(blocks)
        ]
        with torch.no_grad():
            clean = problem.metric(model(problem.clean).logits)
        for handle in handles:
            handle.remove()
        with torch.no_grad():
            corrupted = problem.metric(model(problem.corrupted).logits)
            patched = []
            for layer in range(layers):
                for position in range(seq):

                    def hook(m: nn.Module, a: Any, out: torch.Tensor, layer: int = layer, p: int = position) -> Any:
                        out = out.clone()
                        out[:, p] = saved[layer][:, p]
                        return out

                    handle = blocks[layer].register_forward_hook(hook)
                    patched.append(problem.metric(model(problem.corrupted).logits))
                    handle.remove()
        return normalised(patched, clean, corrupted, layers)

    return run


def _nnsight_batched(model: nn.Module) -> Any:
    import nnsight

    class Batched(nnsight.NNsight):  # type: ignore[misc]
        """NNsight with its documented batching hooks filled in for token tensors: invokes stack along dim 0."""

        def _batch_size(self, *inputs: Any, **kwargs: Any) -> int:
            return int(inputs[0].shape[0]) if inputs else 0

        def _batch(self, invokes: list[tuple[Any, Any]], fn: Any) -> tuple[Any, Any]:
            if len(invokes) == 1:
                return invokes[0]
            return (torch.cat([args[0] for args, _ in invokes]),), invokes[0][1]

    return Batched(model)


def nnsight_sweep(model: nn.Module, problem: Problem, layers: int, seq: int, batch_size: int | None) -> Sweep:
    """nnsight's way: save the clean blocks' outputs in one trace, then patch by assignment, one invoke per cell;
    `batch_size` invokes share a trace (one forward), or one trace per cell when `batch_size` is None."""
    wrapped = _nnsight_batched(model)
    cells = [(layer, position) for layer in range(layers) for position in range(seq)]

    def run() -> torch.Tensor:
        saved = []
        with torch.no_grad():
            with wrapped.trace(problem.clean):
                for layer in range(layers):
                    saved.append(wrapped.transformer.h[layer].output.save())
                clean = wrapped.lm_head.output.save()
            with wrapped.trace(problem.corrupted):
                corrupted = wrapped.lm_head.output.save()
            outputs = []
            step = batch_size or 1
            for start in range(0, len(cells), step):
                with wrapped.trace() as tracer:
                    for layer, position in cells[start : start + step]:
                        with tracer.invoke(problem.corrupted):
                            wrapped.transformer.h[layer].output[:, position] = saved[layer][:, position]
                            outputs.append(wrapped.lm_head.output.save())
        patched = [problem.metric(logits) for logits in outputs]
        return normalised(patched, problem.metric(clean), problem.metric(corrupted), layers)

    return run


def lens_sweep(model: nn.Module, config: Any, problem: Problem, layers: int, seq: int) -> Sweep:
    """TransformerLens 4.3's HF bridge around a copy of the model: run_with_cache, then run_with_hooks per cell."""
    from transformer_lens.model_bridge.sources._bridge_builder import build_bridge_from_module

    bridge = build_bridge_from_module(copy.deepcopy(model), "GPT2LMHeadModel", hf_config=config)

    def run() -> torch.Tensor:
        with torch.no_grad():
            clean_logits, cache = bridge.run_with_cache(problem.clean, names_filter=lambda n: n.endswith("resid_post"))
            corrupted = problem.metric(bridge(problem.corrupted))
            patched = []
            for layer in range(layers):
                name = f"blocks.{layer}.hook_resid_post"
                for position in range(seq):

                    def hook(value: torch.Tensor, hook: Any, name: str = name, p: int = position) -> torch.Tensor:
                        value[:, p] = cache[name][:, p]
                        return value

                    patched.append(problem.metric(bridge.run_with_hooks(problem.corrupted, fwd_hooks=[(name, hook)])))
        return normalised(patched, problem.metric(clean_logits), corrupted, layers)

    return run


class PeakMemory:
    """The peak memory a block adds: CUDA's allocator peak, or the sampled peak RSS on the CPU."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.peak = 0

    def __enter__(self) -> PeakMemory:
        gc.collect()
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._base = torch.cuda.memory_allocated()
            return self
        self._process = psutil.Process()
        self._base = self._process.memory_info().rss
        self._top = self._base
        self._running = True
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while self._running:
            self._top = max(self._top, self._process.memory_info().rss)
            time.sleep(0.001)

    def __exit__(self, *exc_info: object) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated() - self._base
            return
        self._running = False
        self._thread.join()
        self.peak = max(0, self._top - self._base)


def measure(sweeps: dict[str, Sweep], rounds: int, device: str) -> dict[str, dict[str, Any]]:
    reference = sweeps["hookscope"]()
    differences = {}
    for name, sweep in sweeps.items():  # warm-up, and the agreement check
        got = sweep()
        differences[name] = float((got - reference).abs().max()) if got.shape == reference.shape else float("inf")
        if not differences[name] <= TOLERANCE:
            raise SystemExit(f"{name}: effects disagree with hookscope's: max |difference| {differences[name]}")
    times: dict[str, list[float]] = {name: [] for name in sweeps}
    cpu: dict[str, list[float]] = {name: [] for name in sweeps}
    for _ in range(rounds):
        for name, sweep in sweeps.items():
            gc.collect()
            start, start_cpu = time.perf_counter(), time.process_time()
            sweep()
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    peaks = {}
    for name, sweep in sweeps.items():  # apart from the timed rounds: the sampling thread would slow them
        with PeakMemory(device) as memory:
            sweep()
        peaks[name] = memory.peak
    base = statistics.median(times["hookscope"])
    return {
        name: {
            "median_s": statistics.median(times[name]),
            "ratio_to_hookscope": statistics.median(times[name]) / base,
            "median_cpu_s": statistics.median(cpu[name]),
            "cpu_ratio_to_hookscope": statistics.median(cpu[name]) / statistics.median(cpu["hookscope"]),
            "peak_bytes": peaks[name],
            "max_abs_difference": differences[name],
        }
        for name in sweeps
    }


def table(rows: dict[str, dict[str, Any]], cells: int) -> str:
    lines = [
        f"| method ({cells} cells) | median sweep (s) | time vs hookscope | CPU time vs hookscope | peak memory added "
        "(MiB) | max abs diff |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, row in rows.items():
        lines.append(
            f"| {name} | {row['median_s']:.3f} | {row['ratio_to_hookscope']:.2f}x "
            f"| {row['cpu_ratio_to_hookscope']:.2f}x | {row['peak_bytes'] / 2**20:.1f} "
            f"| {row['max_abs_difference']:.1e} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a short run: a smaller model, 2 rounds")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--seq", type=int, default=24)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32, help="patched copies per forward (hookscope, nnsight)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--no-lens", action="store_true", help="leave TransformerLens's bridge out")
    parser.add_argument("--out", default=str(HERE / "results" / "steer.json"))
    args = parser.parse_args(argv)
    if args.quick:
        args.layers, args.width, args.seq, args.batch, args.rounds = 2, 64, 8, 2, 2
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, config = gpt2(args.layers, args.width, args.seq, args.device)
    problem = Problem(args.batch, args.seq, args.device)
    sweeps: dict[str, Sweep] = {
        "hookscope": hookscope_sweep(model, problem, args.batch_size),
        "hookscope, one cell per forward": hookscope_sweep(model, problem, 1),
        "naive loop of forwards (torch hooks)": naive_sweep(model, problem, args.layers, args.seq),
        "nnsight, batched invokes": nnsight_sweep(model, problem, args.layers, args.seq, args.batch_size),
        "nnsight, one trace per cell": nnsight_sweep(model, problem, args.layers, args.seq, None),
    }
    if not args.no_lens:
        sweeps["TransformerLens bridge, run_with_hooks per cell"] = lens_sweep(
            model, config, problem, args.layers, args.seq
        )
    rows = measure(sweeps, args.rounds, args.device)
    cells = args.layers * args.seq
    print(
        f"GPT-2 from a config: {args.layers} layers, width {args.width}, {args.seq} tokens, batch {args.batch}, "
        f"{args.device}, {args.rounds} rounds; hookscope and nnsight stack {args.batch_size} copies per forward"
    )
    print(
        f"{platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads, load average "
        f"{os.getloadavg()[0]:.1f}, torch {torch.__version__}"
    )
    print(table(rows, cells))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"arguments": vars(args), "cells": cells, "results": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
