"""RELIABILITY.md groups G (persistence), F (numerics) and H (security) through watch(), the report and files."""

from __future__ import annotations

import os
import pickle
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from hookscope.checkpoint import load_state, save_state
from hookscope.hooks import CompiledModelWarning
from hookscope.monitors import MonitorPool, OutputMonitor
from hookscope.reducers import StatsReducer
from hookscope.results import WatchResults
from hookscope.watch import watch


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3))


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, w: object, steps: range) -> None:
    for step in steps:
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        w.log_loss(loss)  # type: ignore[attr-defined]


def test_g1_stopped_at_step_137_and_resumed_equals_the_uninterrupted_run(tmp_path: Path) -> None:
    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    with watch(model, optimizer, every=1) as w:
        _train(model, optimizer, w, range(200))
    whole = w.results()

    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    with watch(model, optimizer, every=1) as w:
        _train(model, optimizer, w, range(137))
        save_state(tmp_path / "watch.safetensors", w)
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, tmp_path / "train.pt")
    del model, optimizer, w
    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    saved = torch.load(tmp_path / "train.pt", weights_only=True)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    resumed_watch = watch(model, optimizer, every=1)
    load_state(tmp_path / "watch.safetensors", resumed_watch)
    with resumed_watch as w:
        _train(model, optimizer, w, range(137, 200))
    resumed = w.results()
    assert torch.equal(resumed.steps, whole.steps) and resumed.num_steps == 200
    assert resumed.dropped == whole.dropped
    for path, stats in whole.activations.items():
        for name, values in stats.items():
            assert torch.allclose(resumed.activations[path][name], values, equal_nan=True, atol=1e-5), (path, name)
    for name, values in whole.update_ratios.items():
        assert torch.allclose(resumed.update_ratios[name], values, atol=1e-6)
    assert whole.losses is not None and resumed.losses is not None
    assert torch.allclose(resumed.losses, whole.losses)


def test_g2_crash_during_results_save_leaves_the_previous_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _mlp()
    with watch(model) as w:
        model(torch.randn(4, 6))
    path = w.save(tmp_path / "r.safetensors")
    before = WatchResults.load(path)

    def crash(*args: object) -> None:
        raise KeyboardInterrupt

    with watch(model) as w2:
        model(torch.randn(4, 6))
        model(torch.randn(4, 6))
    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        w2.save(path)
    monkeypatch.undo()
    assert torch.equal(WatchResults.load(path).steps, before.steps)


def test_g6_a_million_values_into_a_reservoir_keep_memory_bounded() -> None:
    from hookscope.reducers import ReservoirReducer

    reducer = ReservoirReducer(256)
    for _ in range(100):
        reducer.push(torch.randn(10_000))
    kept = reducer.dump()
    assert kept is not None and kept.numel() <= 256 + 1
    assert reducer.dropped >= 1_000_000 - 256


def test_f1_fp16_extremes_give_finite_statistics_that_match_fp32() -> None:
    layer = nn.Linear(4, 4).half()
    with torch.no_grad():
        layer.weight.fill_(0.0)
        layer.bias.copy_(torch.tensor([300.0, 6000.0, 30000.0, 60000.0]))
    model = nn.Sequential(layer)
    with watch(model, groups=("activations",)) as w:
        model(torch.zeros(1024, 4, dtype=torch.float16))
    stats = w.results().activations["0"]
    reference = layer.bias.double().repeat(1024)
    assert torch.isfinite(stats["mean"]).all() and torch.isfinite(stats["std"]).all()
    assert torch.allclose(stats["mean"][0], reference.mean(), rtol=1e-5)
    assert torch.allclose(stats["std"][0], reference.std(), rtol=1e-4)


def test_f4_f5_nan_produced_at_a_known_layer_is_blamed_there_and_does_not_poison_others() -> None:
    class Sqrt(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.sqrt()  # NaN for negative inputs

    model = nn.Sequential(nn.Linear(4, 4), Sqrt(), nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    with watch(model, select=["0", "1", "2", "3", "4"]) as w:
        model(torch.ones(2, 4)).sum().backward()  # step 0 may be finite or not; step 1 surely is not
        with torch.no_grad():
            model[0].bias.fill_(-100.0)
        model(torch.ones(2, 4)).sum().backward()
    results = w.results()
    assert results.first_nonfinite["forward"] is not None
    assert results.first_nonfinite["forward"]["path"] == "1"
    first_layer = results.activations["0"]
    assert torch.isfinite(first_layer["mean"]).all()  # layer 0 is finite: its statistics stay clean
    assert results.activations["1"]["nonfinite"][-1] > 0


def test_d1_d4_watch_warns_on_compiled_models_and_refuses_scripted_ones() -> None:
    compiled = torch.compile(_mlp(), backend="eager")
    with pytest.warns(CompiledModelWarning), watch(compiled):
        pass
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        scripted = torch.jit.script(_mlp())
    with pytest.raises(TypeError, match="TorchScript"), watch(scripted):
        pass


def test_b6_a_forward_called_directly_leaves_the_module_listed_as_unobserved() -> None:
    class Direct(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Linear(3, 3)
            self.head = nn.Linear(3, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.inner.forward(x))  # bypasses __call__: hooks cannot see it

    model = Direct()
    with warnings.catch_warnings(record=True), watch(model) as w:
        warnings.simplefilter("always")
        model(torch.randn(2, 3))
    results = w.results()
    assert "inner" in results.unobserved and "head" not in results.unobserved


def test_c7_eval_passes_between_training_steps_are_not_recorded() -> None:
    model = _mlp()
    with watch(model, groups=("activations",)) as w:
        for _ in range(3):
            model.train()
            model(torch.randn(4, 6))
            model.eval()
            with torch.no_grad():
                model(torch.full((4, 6), 1000.0))
    results = w.results()
    assert results.num_steps == 3
    assert results.activations["0"]["max"].max() < 100  # the eval batch of 1000s never reached the series


def test_h1_files_with_pickle_payloads_are_refused_by_every_loader(tmp_path: Path) -> None:
    class Payload:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, (f"touch {tmp_path / 'pwned'}",))

    evil = tmp_path / "evil.safetensors"
    evil.write_bytes(pickle.dumps(Payload()))
    pool = MonitorPool(OutputMonitor.partialconstructor(StatsReducer()), _mlp(), select="0")
    for load in (WatchResults.load, load_state, lambda path: load_state(path, pool), StatsReducer.load):
        with pytest.raises(ValueError, match="not a safetensors file"):
            load(evil)
    assert not (tmp_path / "pwned").exists()


def test_h4_truncated_results_fail_cleanly(tmp_path: Path) -> None:
    model = _mlp()
    with watch(model) as w:
        model(torch.randn(2, 6))
    path = w.save(tmp_path / "r.safetensors")
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ValueError, match="not a readable hookscope safetensors file"):
        WatchResults.load(path)


def test_state_with_unsupported_values_names_where(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"state\['bad'\] must hold tensors, numbers, .* got set"):
        save_state(tmp_path / "s.safetensors", {"ok": 1, "bad": {1, 2}})
    state = {"a": (1, float("nan"), None), 3: [torch.ones(2)], "b": {"c": "text"}}
    save_state(tmp_path / "s.safetensors", state)
    loaded = load_state(tmp_path / "s.safetensors")
    assert loaded["a"][0] == 1 and loaded["a"][1] != loaded["a"][1] and loaded["a"][2] is None
    assert torch.equal(loaded[3][0], torch.ones(2)) and loaded["b"] == {"c": "text"}


def test_f3_grad_scaler_parameter_norms_are_unscaled_and_a_skipped_step_moves_nothing() -> None:
    from hookscope.weights import MaxNorm, register_constraint

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    constraint = register_constraint(model, MaxNorm(10.0), mode="step", optimizer=optimizer)
    reference: list[float] = []
    with watch(model, optimizer, groups=("param_grads",)) as w:
        for step in range(4):
            optimizer.zero_grad()
            loss = model(torch.randn(8, 4)).pow(2).mean()
            scaler.scale(loss * (float("inf") if step == 1 else 1.0)).backward()
            scaler.unscale_(optimizer)
            if step != 1:
                reference.append(model[0].weight.grad.norm().item())
            scaler.step(optimizer)  # skipped at step 1: optimizer.step() never runs
            scaler.update()
    constraint.remove()
    results = w.results()
    assert results.num_steps == 3  # the skipped step is not an optimizer step
    assert torch.allclose(
        results.param_grads["0.weight"]["norm"], torch.tensor(reference, dtype=torch.float64), rtol=1e-5
    )
    assert constraint.applications == {"0": 3, "2": 3}  # no projection after the skipped step
