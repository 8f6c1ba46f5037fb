"""What the overhead budget charges itself against what it really costs, per model.

A bare copy and a watched copy of one model (`bench/overhead.py`'s models) train in alternating blocks of steps,
after a warm-up; "real" is the watched blocks' time over the bare blocks', "charged" is 1 + the time the budget
counted as its own over the rest of the watched blocks (what `measured["seconds"]["own"]` gained, read between
blocks). The two agree when the budget sees what it costs; what is left between them is the fixed cost of
following the steps (a root pre-hook, an optimizer hook), which it does not charge.

    python bench/budget.py                          # watch() and ActivationStats() on the tiny MLP
    python bench/budget.py --models tiny,mlp --threads 2 --rounds 8
    python bench/budget.py --models tiny,mlp,mobile --device cuda --block 500
    python bench/budget.py --models mobile --device cuda --batch 32   # a device-bound step
"""

from __future__ import annotations

import argparse
import copy
from typing import Any

import torch
from overhead import MODELS, Step, make_step, time_round

BLOCK = {"tiny": 2000, "mlp": 100, "gpt": 300, "cnn": 40, "mobile": 150, "transformer": 30}
"""Steps a block (about 0.3-3 s)."""


def measure(
    name: str, monitor: str, rounds: int, block: int | None = None, device: str = "cpu", batch: int = 1
) -> dict[str, Any]:
    """Alternate `rounds` bare and watched blocks of `name` (`block` steps each, default `BLOCK`), its batch
    repeated `batch` times; return the real and charged ratios."""
    from hookscope.callbacks import ActivationStats
    from hookscope.watch import watch

    model, x, y = MODELS[name]()
    model, x, y = model.to(device), x.repeat(batch, *[1] * (x.dim() - 1)).to(device), y.repeat(batch).to(device)
    steps = block or BLOCK[name]
    bare_model, watched_model = copy.deepcopy(model), copy.deepcopy(model)
    bare = make_step(bare_model, torch.optim.SGD(bare_model.parameters(), lr=1e-3, momentum=0.9), x, y)
    optimizer = torch.optim.SGD(watched_model.parameters(), lr=1e-3, momentum=0.9)
    watched = make_step(watched_model, optimizer, x, y)
    if monitor == "watch":
        watcher = watch(watched_model, optimizer)
        watcher.attach()
        measured, detach = (lambda: watcher.measured), watcher.detach  # read without a flush
    else:
        stats = ActivationStats(with_hist=True)
        driver = stats.attach(watched_model)
        measured, detach = (lambda: stats.measured), driver.detach
    try:
        run(watched, 3 * steps // 2)  # the warm-up's measured steps, then steady
        run(bare, steps // 2)
        if "budget" not in measured():
            raise RuntimeError(f"{monitor}'s default has no budget: it changed, and this benchmark with it")
        bare_time = watched_time = own = 0.0
        for _ in range(rounds):
            bare_time += run(bare, steps)
            before = measured()["seconds"]["own"]  # read between the timed blocks
            watched_time += run(watched, steps)
            own += measured()["seconds"]["own"] - before
    finally:
        detach()
    return {"real": watched_time / bare_time, "charged": 1 + own / (watched_time - own)}


def run(step: Step, steps: int) -> float:
    """Seconds `steps` steps take (timed as `bench/overhead.py` times its rounds)."""
    return time_round(step, steps) * steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny", help=f"comma-separated, of {', '.join(BLOCK)}")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--block", type=int, default=None, help="steps per block (default: per model, BLOCK)")
    parser.add_argument("--device", default="cpu", help="where the models run (cpu, cuda)")
    parser.add_argument("--batch", type=int, default=1, help="repeat each model's batch this many times")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print("| model | monitor | real | charged |\n|---|---|---|---|")
    for name in args.models.split(","):
        if name not in BLOCK:
            raise ValueError(f"--models must name models of {', '.join(BLOCK)}, got {name!r}")
        for monitor in ("watch", "ActivationStats"):
            result = measure(name, monitor, args.rounds, args.block, args.device, args.batch)
            print(f"| {name} | {monitor} | {result['real']:.3f} | {result['charged']:.3f} |")


if __name__ == "__main__":
    main()
