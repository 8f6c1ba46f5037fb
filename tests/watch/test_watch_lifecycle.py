"""watch(): attach/detach, clean-up on errors, unobserved modules, persistence, sinks, the doctor, options."""

from __future__ import annotations

import csv
import gc
import json
import math
import warnings
import weakref
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from hookscope.hooks._registry import REGISTRY
from hookscope.results import WatchResults
from hookscope.watch import CSVSink, JSONLSink, TensorBoardSink, UnobservedModuleWarning, Watch, watch
from hookscope.watch._stepper import UNOBSERVED_AFTER


def mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1))


def train(model: nn.Module, opt: torch.optim.Optimizer, steps: int, w: object = None, seed: int = 0) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        loss = model(torch.randn(16, 3, generator=generator)).pow(2).mean()
        if w is not None:
            w.log_loss(loss)  # type: ignore[attr-defined]
        loss.backward()
        opt.step()
        opt.zero_grad()


def no_hooks(model: nn.Module) -> bool:
    return all(not (m._forward_hooks or m._forward_pre_hooks or m._backward_hooks) for m in model.modules())


def test_hooks_are_gone_after_the_loop_and_after_an_exception() -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = len(REGISTRY)
    with watch(model, opt) as w:
        train(model, opt, 2)
        assert w.is_attached and not no_hooks(model)
    assert no_hooks(model) and len(REGISTRY) == before and not w.is_attached
    with pytest.raises(RuntimeError, match="mid-step"), watch(model, opt) as failing:
        model(torch.randn(2, 3))
        raise RuntimeError("mid-step")
    assert no_hooks(model) and len(REGISTRY) == before
    assert not opt._optimizer_step_pre_hooks and not opt._optimizer_step_post_hooks
    assert failing.results().steps.tolist() == [0]  # what was recorded before the error is kept


def test_attach_twice_is_an_error_and_detach_twice_a_no_op() -> None:
    model = mlp()
    w = watch(model)
    w.attach()
    with pytest.raises(RuntimeError, match="watch is already attached to a model; call detach"):
        w.attach()
    model(torch.randn(2, 3))
    w.detach()
    w.detach()
    assert no_hooks(model) and w.results().steps.tolist() == [0]
    with pytest.raises(ValueError, match="model must be given to attach"):
        Watch().attach()


def test_a_reattached_watch_continues_its_steps() -> None:
    model = mlp()
    w = watch(model, select="0")
    for _ in range(2):
        with w:
            model(torch.randn(2, 3))
    assert w.results().steps.tolist() == [0, 1]


def test_a_deleted_model_is_freed_after_detach() -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch(model, opt) as w:
        train(model, opt, 2)
    del opt
    ref = weakref.ref(model)
    gc.disable()
    try:
        del model
        assert ref() is None
    finally:
        gc.enable()
    assert w.results().num_steps == 2


class AttentionBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.attn(x, x, x)[0])


def test_multihead_attention_out_proj_is_not_observed_by_default_but_its_parameters_are() -> None:
    model = AttentionBlock()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to warn about: out_proj is not selected as a module
        with watch(model, opt) as w:
            for _ in range(2):
                model(torch.randn(2, 5, 8)).sum().backward()
                opt.step()
                opt.zero_grad()
    results = w.results()
    assert list(results.layers) == ["attn", "head"] and results.unobserved == {}
    for name in ("attn.out_proj.weight", "attn.out_proj.bias"):
        assert results.param_grads[name]["norm"].isfinite().all() and (results.update_ratios[name] > 0).all()
    assert list(results.param_grads) == [name for name, _ in model.named_parameters()]  # model order


def test_multihead_attention_out_proj_selected_by_name_is_listed_unobserved_with_advice() -> None:
    model = AttentionBlock()
    with (
        pytest.warns(UnobservedModuleWarning, match="never calls its out_proj"),
        watch(model, select=["attn", "attn.out_proj"]) as w,
    ):
        for _ in range(2):
            model(torch.randn(2, 5, 8)).sum().backward()
    results = w.results()
    assert list(results.unobserved) == ["attn.out_proj"]
    assert "select 'attn'" in results.unobserved["attn.out_proj"]
    assert results.activations["attn"]["mean"].isfinite().all()
    assert results.activations["attn.out_proj"]["mean"].isnan().all()


def test_a_module_called_through_forward_is_unobserved() -> None:
    class Direct(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner.forward(x)

    model = Direct()
    with pytest.warns(UnobservedModuleWarning, match="calls m.forward"), watch(model) as w:
        model(torch.randn(1, 2))
    assert list(w.results().unobserved) == ["inner"]


class LaterBranch(nn.Module):
    """`late` runs from forward number `start` on (0: never)."""

    def __init__(self, start: int) -> None:
        super().__init__()
        self.first, self.late, self.start, self.calls = nn.Linear(2, 2), nn.Linear(2, 2), start, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        x = self.first(x)
        return self.late(x) if self.start and self.calls >= self.start else x


@pytest.mark.parametrize("start", [2, UNOBSERVED_AFTER])
def test_a_module_that_first_runs_in_a_later_step_is_not_called_unobserved(start: int) -> None:
    model = LaterBranch(start)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with watch(model) as w:
            for _ in range(5):
                model(torch.randn(3, 2)).sum().backward()
    assert w.results().unobserved == {}
    assert w.results().activations["late"]["count"].tolist() == [0.0] * (start - 1) + [6.0] * (6 - start)


def test_a_module_that_never_runs_is_warned_about_once_enough_steps_were_recorded() -> None:
    model = LaterBranch(0)
    with watch(model) as w:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(UNOBSERVED_AFTER):  # the third step is closed when the fourth begins
                model(torch.randn(3, 2)).sum().backward()
        assert not [c for c in caught if issubclass(c.category, UnobservedModuleWarning)]
        with pytest.warns(UnobservedModuleWarning, match="'late'"):
            model(torch.randn(3, 2)).sum().backward()
    assert list(w.results().unobserved) == ["late"]


def test_results_save_and_load_round_trip(tmp_path: Path) -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch(model, opt) as w:
        train(model, opt, 3, w)
    results = w.results()
    loaded = WatchResults.load(w.save(tmp_path / "run.safetensors"))
    for name in ("layers", "identical_units", "first_nonfinite", "unobserved", "execution_order", "dropped", "meta"):
        assert getattr(loaded, name) == getattr(results, name), name
    for group in ("activations", "output_grads", "param_grads"):
        for key, stats in getattr(results, group).items():
            for stat, values in stats.items():
                torch.testing.assert_close(getattr(loaded, group)[key][stat], values, equal_nan=True)
    for group in ("histograms", "hist_edges", "unit_activity", "update_ratios"):
        assert getattr(loaded, group).keys() == getattr(results, group).keys()
        for key, values in getattr(results, group).items():
            torch.testing.assert_close(getattr(loaded, group)[key], values, equal_nan=True)
    assert results.losses is not None and loaded.losses is not None
    torch.testing.assert_close(loaded.losses, results.losses)
    assert loaded.execution_order == ["0", "1", "2"]


def test_to_dataframe_has_one_row_per_recorded_value() -> None:
    pytest.importorskip("pandas")
    model = mlp()
    with watch(model, select="0", groups=("activations",)) as w:
        model(torch.randn(4, 3))
    frame = w.to_dataframe()
    assert list(frame.columns) == ["step", "group", "name", "stat", "value"]
    assert len(frame) == 9  # 10 activation statistics (count, sampled), saturation NaN (not a saturating module)


def test_sinks_receive_every_recorded_value(tmp_path: Path) -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sinks = [CSVSink(tmp_path / "run.csv"), JSONLSink(tmp_path / "run.jsonl"), TensorBoardSink(tmp_path / "tb")]
    with watch(model, opt, sinks=sinks, buffer_steps=2) as w:
        train(model, opt, 5, w)
    expected = w.results().to_records()
    with (tmp_path / "run.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == len(expected)
    assert {(int(r["step"]), r["group"], r["name"], r["stat"]) for r in rows} == {
        (r["step"], r["group"], r["name"], r["stat"]) for r in expected
    }
    lines = [json.loads(line) for line in (tmp_path / "run.jsonl").read_text().splitlines()]
    assert len(lines) == len(expected) and lines[0]["value"] == pytest.approx(expected[0]["value"])
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    losses = events.Scalars("losses/loss/loss")
    assert [e.step for e in losses] == [0, 1, 2, 3, 4]
    assert losses[2].value == pytest.approx(float(w.results().losses[2]))  # type: ignore[index]


def test_sink_and_option_errors() -> None:
    with pytest.raises(
        TypeError, match="sinks must be a list of Sink, got .*; use an object with write\\(results\\) and close\\(\\)"
    ):
        watch(mlp(), sinks=[object()])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="exactly one of log_dir or writer"):
        TensorBoardSink()
    with pytest.raises(ValueError, match="every must be a positive int, got 0"):
        watch(mlp(), every=0)
    with pytest.raises(ValueError, match=r"capacity must be a positive int or None \(keep every recorded step\)"):
        watch(mlp(), capacity=0)
    with pytest.raises(ValueError, match="groups must be names from"):
        watch(mlp(), groups=("activations", "gradients"))
    with pytest.raises(TypeError, match="groups must be a list of str, got 'activations'; wrap a single name"):
        watch(mlp(), groups="activations")
    with pytest.raises(ValueError, match=r"hist_range must be a pair \(low, high\)"):
        watch(mlp(), hist_range=(1.0, 1.0))
    with pytest.raises(ValueError, match="near_zero must be a finite number >= 0"):
        watch(mlp(), near_zero=-1.0)
    with pytest.raises(TypeError, match="optimizer must be a torch.optim.Optimizer or None, got 'sgd'"):
        watch(mlp(), "sgd")  # type: ignore[arg-type]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        scripted = torch.jit.script(nn.Linear(1, 1))
    with pytest.raises(TypeError, match="hooks are unsupported on ScriptModule"):
        watch(scripted)
    model = mlp()
    with pytest.raises(ValueError, match="select must name an existing module path"):
        watch(model, select="encoder").attach()


def test_state_dict_resumes_exactly_where_it_stopped() -> None:
    def fresh() -> tuple[nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(1)
        model = mlp()
        return model, torch.optim.SGD(model.parameters(), lr=0.1)

    model, opt = fresh()
    with watch(model, opt) as whole:
        train(model, opt, 3, whole, seed=0)
        train(model, opt, 3, whole, seed=1)
    model, opt = fresh()
    with watch(model, opt) as first:
        train(model, opt, 3, first, seed=0)
    state = first.state_dict()
    resumed = watch(model, opt)
    resumed.load_state_dict(state)
    with resumed:
        train(model, opt, 3, resumed, seed=1)
    a, b = whole.results(), resumed.results()
    assert b.steps.tolist() == a.steps.tolist() == list(range(6))
    torch.testing.assert_close(b.activations["2"]["mean"], a.activations["2"]["mean"])
    torch.testing.assert_close(b.update_ratios["0.weight"], a.update_ratios["0.weight"])
    torch.testing.assert_close(b.unit_activity["1"], a.unit_activity["1"])
    with pytest.raises(ValueError, match="state must be a Watch.state_dict"):
        resumed.load_state_dict({"version": 0})


def test_doctor_warns_once_per_finding() -> None:
    doctor = pytest.importorskip("hookscope.doctor")
    model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1))
    with torch.no_grad():
        model[0].bias.fill_(-100.0)  # every ReLU unit is dead
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with watch(model, opt, doctor=True, doctor_every=2) as w:
            train(model, opt, 9, w)
    messages = [str(c.message) for c in caught if issubclass(c.category, doctor.DiagnosisWarning)]
    dead = [m for m in messages if "[dead_units]" in m]
    assert len(dead) == 1 and "'1'" in dead[0]
    assert math.isfinite(float(w.results().activations["1"]["mean"][0]))


def test_a_user_hook_that_raises_leaves_no_watch_hook_behind() -> None:
    from hookscope.hooks import register_module_hook

    model = mlp()

    def broken(module: nn.Module, args: object, output: object) -> None:
        raise KeyError("user hook")

    with register_module_hook(model[2], "forward", broken):
        before = {id(m): len(m._forward_hooks) for m in model.modules()}
        with pytest.raises(KeyError, match="user hook"), watch(model):
            model(torch.randn(2, 3))
        assert {id(m): len(m._forward_hooks) for m in model.modules()} == before
    assert no_hooks(model)


def test_summary_lists_layers_loss_and_problems() -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch(model, opt) as w:
        train(model, opt, 3, w)
        model(torch.full((1, 3), float("nan")))
    text = w.results().summary()
    lines = text.splitlines()
    assert lines[0] == "WatchResults: 4 recorded steps, 3 layers"
    assert lines[2].split()[:2] == ["0", "Linear"] and lines[2].split()[-1] == "8"
    assert "first non-finite (forward): '0' at step 3" in text


def test_a_deepcopy_of_the_watched_model_neither_records_nor_counts() -> None:
    import copy

    model = mlp()
    with watch(model) as w:
        model(torch.randn(2, 3))
        teacher = copy.deepcopy(model)
        teacher(torch.full((2, 3), 1e3))
        model(torch.randn(2, 3))
    results = w.results()
    assert results.steps.tolist() == [0, 1] and float(results.activations["0"]["max"].max()) < 100
    assert results.dropped == {}
