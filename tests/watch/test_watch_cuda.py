"""watch() and ActivationStats on a CUDA device: the statistics match the oracle (also under autocast and a
GradScaler), and the steps between two flushes never synchronize the host with the device. Skipped without CUDA.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
import torch.nn as nn
from test_watch_perf_paths import Capture, check_activations, large_model, train

from hookscope.callbacks import ActivationStats, LoopDriver
from hookscope.watch import Watch, watch
from stats_oracle import expected, values_of
from sync_debug import syncs_raise

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_statistics_on_cuda_match_the_oracle() -> None:
    """Large outputs (described in the hook), the small last one (batched over steps), an in-place ReLU after a
    hooked Linear, output and parameter gradients: as on the CPU (tests/watch/test_watch_perf_paths.py)."""
    torch.manual_seed(0)
    model, paths = large_model().cuda(), ["0", "1", "2", "4"]
    w = watch(model, select=paths, exact=True)
    inputs = [torch.randn(64, 16, device="cuda") for _ in range(3)]
    forward, backward, seen = train(model, w, inputs, paths)
    results = w.results()
    check_activations(results, paths, forward, steps=3)
    for j, path in enumerate(paths):
        for k in range(3):
            grad = backward.batches[k][j][0]
            assert float(results.output_grads[path]["norm"][k]) == pytest.approx(float(grad.norm()), rel=1e-4)
    for k, (grads, ratios) in enumerate(seen):
        for name, norm in grads.items():
            assert float(results.param_grads[name]["norm"][k]) == pytest.approx(norm, rel=1e-4)
            assert float(results.update_ratios[name][k]) == pytest.approx(ratios[name], rel=1e-3)


def test_sampled_statistics_on_cuda_keep_their_bounds() -> None:
    """An output above the sampling threshold: mean, min, max and count exact, the std within 2 %."""
    torch.manual_seed(7)
    model, paths = nn.Sequential(nn.Linear(16, 1024), nn.ReLU()).cuda(), ["0", "1"]
    capture, w = Capture(paths), Watch(select=paths)
    with LoopDriver([capture, w], model):
        model(torch.randn(256, 16, device="cuda") + 0.5)
    results = w.results()
    for j, path in enumerate(paths):
        want = expected(values_of(capture.batches[0][j][0]))
        assert float(results.activations[path]["sampled"][0]) == 1.0
        for name in ("mean", "min", "max", "count"):
            assert float(results.activations[path][name][0]) == pytest.approx(float(getattr(want, name)), rel=1e-5)
        assert float(results.activations[path]["std"][0]) == pytest.approx(float(want.std), rel=0.02)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_outputs_and_scaled_gradients_match_the_oracle(dtype: torch.dtype) -> None:
    """Under autocast the hooked outputs are half precision: their statistics are those of the half values.
    With a GradScaler the output-gradient norms are divided by the loss scale, as the scaler does for parameters."""
    torch.manual_seed(3)
    model, paths = large_model().cuda(), ["0", "2", "4"]
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0**10)
    capture = Capture(paths)
    grads: list[list[torch.Tensor]] = []

    def keep(m: nn.Module, grad_input: Any, grad_output: Any) -> None:
        grads[-1].append(grad_output[0].float().clone() / scaler.get_scale())

    w = watch(model, opt, select=paths, exact=True, scaler=scaler, every=1)
    handle = model[4].register_full_backward_hook(keep)
    try:
        with LoopDriver([capture], model, opt), w:
            for _ in range(3):
                grads.append([])
                with torch.autocast("cuda", dtype=dtype):
                    loss = model(torch.randn(64, 16, device="cuda")).float().pow(2).mean()
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                opt.zero_grad()
    finally:
        handle.remove()
    results = w.results()
    assert capture.batches[0][0][0].dtype == torch.float32  # Capture's copy; the hooked output was half
    check_activations(results, paths, capture, steps=3)
    for k in range(3):
        want = float(grads[k][0].norm())
        assert float(results.output_grads["4"]["norm"][k]) == pytest.approx(want, rel=1e-3)


def _train(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, steps: int, log: Any = None) -> None:
    for _ in range(steps):
        loss = model(x).pow(2).mean()
        if log is not None:
            log(loss)
        loss.backward()
        opt.step()
        opt.zero_grad()


@contextmanager
def kept_outputs(module: nn.Module) -> Iterator[list[torch.Tensor]]:
    """Float32 copies of `module`'s training outputs, kept on the device (no sync): the oracle's input."""
    outputs: list[torch.Tensor] = []

    def keep(m: nn.Module, i: Any, o: torch.Tensor) -> None:
        if torch.is_grad_enabled():
            outputs.append(o.detach().float().clone())

    handle = module.register_forward_hook(keep)
    try:
        yield outputs
    finally:
        handle.remove()


WATCHES: dict[str, dict[str, Any]] = {
    "defaults": {},
    "every=1": {"every": 1},
    "every=4": {"every": 4},
    "every=1, bf16 autocast": {"every": 1},
}


@pytest.mark.parametrize("config", list(WATCHES))
def test_watch_syncs_the_device_only_at_a_flush(config: str) -> None:
    """Between two flushes no step synchronizes (small outputs batched, large ones described in their hooks,
    histograms, unit activity, the budget), and the flush at the end gives every measured step's
    statistics (the last one's checked against the oracle) and every loss."""
    torch.manual_seed(4)
    model = large_model().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 16, device="cuda")
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=config.endswith("autocast"))
    with watch(model, opt, **WATCHES[config]) as w, kept_outputs(model[2]) as outputs:
        with autocast:
            _train(model, opt, x, 3, log=w.log_loss)  # layouts and buffers are built in the first steps
        with syncs_raise(), autocast:
            _train(model, opt, x, 13, log=w.log_loss)
    results = w.results()
    assert results.meta["measured"]["steps"] == 16
    want_steps = list(range(0, 16, 4)) if config == "every=4" else list(range(16))
    assert results.steps.tolist() == want_steps
    assert results.logged_steps.tolist() == list(range(16))  # the loss is logged every step, measured or not
    assert results.logged_losses is not None and bool(torch.isfinite(results.logged_losses).all())
    last = expected(values_of(outputs[want_steps[-1]]))
    assert float(results.activations["2"]["mean"][-1]) == pytest.approx(float(last.mean), rel=1e-4)
    assert float(results.activations["2"]["max"][-1]) == pytest.approx(float(last.max), rel=1e-6)


@pytest.mark.parametrize("budget", [0.03, None])
def test_activation_stats_syncs_the_device_only_when_read(budget: float | None) -> None:
    torch.manual_seed(5)
    model = large_model().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 16, device="cuda")
    stats = ActivationStats(budget=budget, with_hist=True, exact=True)  # the Linears: 0, 2 (large) and 4 (small)
    with stats.attach(model, opt), kept_outputs(model[2]) as outputs:
        _train(model, opt, x, 3)
        with syncs_raise():
            _train(model, opt, x, 13)
    assert stats.batches == list(range(16))  # the first 16 batches are observed under a budget too
    for k in (0, 15):
        want = expected(values_of(outputs[k]), near_zero=0.05, signed=True)
        got = stats.stats[k][1]
        assert float(got["mean"]) == pytest.approx(float(want.mean), rel=1e-4)
        assert float(got["std"]) == pytest.approx(float(want.std), rel=1e-4)
        assert float(got["near_zero"]) == pytest.approx(float(want.near_zero), abs=1e-6)
