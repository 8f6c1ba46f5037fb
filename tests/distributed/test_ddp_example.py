"""examples/ddp_train.py under `torchrun --nproc-per-node 2` (CPU, gloo) against the same script in one process."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import socket
import subprocess
import sys
from pathlib import Path

import torch

from hookscope.results import WatchResults

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "ddp_train.py"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _single_process(out: Path) -> str:
    spec = importlib.util.spec_from_file_location("ddp_train_example", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        module.main(["--steps", "6", "--out", str(out)])
    return printed.getvalue()


def test_torchrun_two_ranks_merge_to_the_single_process_statistics(tmp_path: Path) -> None:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
        "--master-port", str(_free_port()), str(SCRIPT), "--steps", "6", "--out", str(tmp_path / "ddp.hs"),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("WatchResults: 6 recorded steps, 5 layers") == 1  # rank 0 alone prints
    assert "ranks: 2" in done.stdout and str(tmp_path / "ddp.hs") in done.stdout
    assert "ranks: 1" in _single_process(tmp_path / "one.hs")
    merged, single = WatchResults.load(tmp_path / "ddp.hs"), WatchResults.load(tmp_path / "one.hs")
    assert list(merged.layers) == list(single.layers) == ["0", "1", "2", "3", "4"]
    assert merged.losses is not None and single.losses is not None
    assert torch.allclose(merged.losses, single.losses, rtol=1e-5)
    for group in ("activations", "output_grads", "param_grads"):
        for name, stats in getattr(single, group).items():
            for stat, values in stats.items():
                got = getattr(merged, group)[name][stat]
                assert torch.allclose(got, values, rtol=1e-4, atol=1e-6, equal_nan=True), (group, name, stat)
    for path, counts in single.histograms.items():
        assert torch.equal(merged.histograms[path], counts)
    assert merged.meta["distributed"]["world_size"] == 2 and merged.meta["grad_reduction"] == "after all-reduce (DDP)"
