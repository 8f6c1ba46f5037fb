"""Monitors attached before torch.compile record what eager mode records, without graph breaks or per-step
recompiles (backend aot_eager: the same graph capture as inductor, without compiling kernels)."""

from __future__ import annotations

import re
import warnings
from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._dynamo.utils import counters

from hookscope.callbacks import ActivationStats
from hookscope.demo import TinyGPT, TinyGPTConfig, tiny_gpt_optimizer
from hookscope.demo._transformer import repeat_batch
from hookscope.hooks import CompiledModelWarning
from hookscope.results import WatchResults
from hookscope.watch import watch

# The only "break" dynamo may log: the training-loop driver's root hooks, run as is before and after the graph.
_DRIVER_SKIP = "Skip calling `torch.compiler.disable()`d function"


def model() -> nn.Sequential:
    # a large output (16 x 4096 values: described in the hook in eager mode) and small ones (batched per step)
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 4096), nn.ReLU(), nn.Linear(4096, 16), nn.Tanh(), nn.Linear(16, 2))


INPUTS = [torch.randn(16, 8, generator=torch.Generator().manual_seed(k)) for k in range(4)]


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Any:
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def train_watched(compiled: bool, **options: Any) -> WatchResults:
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with watch(net, opt, exact=True, **options) as w:  # every value: sampling would draw differently per path
        run = torch.compile(net, backend="aot_eager") if compiled else net
        for x in INPUTS:
            loss = run(x).pow(2).mean()
            w.log_loss(loss)
            loss.backward()
            opt.step()
            opt.zero_grad()
    return w.results()


def close(got: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6, equal_nan=True)


def assert_same(eager: WatchResults, compiled: WatchResults) -> None:
    assert compiled.steps.tolist() == eager.steps.tolist()
    for path in eager.layers:
        for name in eager.activations[path]:
            close(compiled.activations[path][name], eager.activations[path][name])
        for name in eager.output_grads[path]:
            close(compiled.output_grads[path][name], eager.output_grads[path][name])
        assert torch.equal(compiled.histograms[path], eager.histograms[path]), path
    for name in eager.param_grads:
        close(compiled.param_grads[name]["norm"], eager.param_grads[name]["norm"])
        close(compiled.update_ratios[name], eager.update_ratios[name])
    for path, activity in eager.unit_activity.items():
        close(compiled.unit_activity[path], activity)
    assert eager.losses is not None and compiled.losses is not None
    close(compiled.losses, eager.losses)


def assert_no_graph_break() -> None:
    assert all(reason.startswith(_DRIVER_SKIP) for reason in counters["graph_break"]), list(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 1  # one graph, reused by every step: no recompile per step


def test_watch_records_the_same_statistics_compiled_and_eager() -> None:
    eager = train_watched(compiled=False)
    compiled = train_watched(compiled=True)
    assert_same(eager, compiled)
    assert_no_graph_break()
    assert "attention_compiled" not in compiled.dropped  # no attention in this model: nothing left out


@pytest.mark.slow
def test_attention_is_not_measured_compiled_and_the_watch_says_so() -> None:
    # one attention kind: compiled, neither path reaches Python (the functions are never wrapped)
    found = []
    for compiled in (False, True):
        torch.manual_seed(0)
        gpt = TinyGPT(TinyGPTConfig(length=8, layers=1, sdpa=True))
        optimizer = tiny_gpt_optimizer(gpt, lr=1e-2)
        with warnings.catch_warnings(record=True) as caught, watch(gpt, optimizer, every=2) as w:
            warnings.simplefilter("always")
            run = torch.compile(gpt, backend="aot_eager") if compiled else gpt
            for k in range(4):  # steps 0 and 2 recorded
                ids = repeat_batch(torch.Generator().manual_seed(k), batch=4, length=8)
                loss = F.cross_entropy(run(ids[:, :-1]).reshape(-1, 64), ids[:, 1:].reshape(-1))
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
        said = [c for c in caught if issubclass(c.category, CompiledModelWarning) and "attention" in str(c.message)]
        found.append((w.results(), said))
    (eager, eager_said), (compiled_results, compiled_said) = found
    assert list(eager.attention) == ["blocks.0.attn"] and eager_said == []
    assert "attention_compiled" not in eager.dropped
    assert compiled_results.attention == {} and compiled_results.dropped["attention_compiled"] == 2  # steps 0, 2
    assert len(compiled_said) == 1  # warned once
    assert re.search(r"attention is not measured in forwards run under torch.compile", str(compiled_said[0].message))
    assert compiled_said[0].filename == __file__  # points at the training loop's forward
    torch.testing.assert_close(  # the rest is recorded as in eager mode
        compiled_results.param_grads["head.weight"]["norm"], eager.param_grads["head.weight"]["norm"]
    )
    assert all(reason.startswith(_DRIVER_SKIP) for reason in counters["graph_break"]), list(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] <= 2  # the counting call runs before the graph: no graph added


def test_every_records_the_same_steps_compiled() -> None:
    eager = train_watched(compiled=False, every=2)
    compiled = train_watched(compiled=True, every=2)
    assert compiled.steps.tolist() == [0, 2]
    assert_same(eager, compiled)
    assert counters["stats"]["unique_graphs"] <= 2  # a recording and a checking variant, both reused


def test_explain_finds_one_graph_and_no_break_with_monitors_attached() -> None:
    net = model()
    stats = ActivationStats(with_hist=True)
    with watch(net), stats.attach(net):
        explained = torch._dynamo.explain(net)(INPUTS[0])
    assert explained.graph_count == 1
    assert explained.graph_break_count == 0


def test_activation_stats_records_the_same_statistics_compiled_and_eager() -> None:
    records = []
    for compiled in (False, True):
        net = model()
        stats = ActivationStats(with_hist=True)
        with stats.attach(net):
            run = torch.compile(net, backend="aot_eager") if compiled else net
            for x in INPUTS:
                run(x).pow(2).mean().backward()
        records.append(stats)
    eager, compiled_stats = records
    assert len(compiled_stats.stats) == len(eager.stats) == len(INPUTS)
    for k, record in enumerate(eager.stats):
        for j, entry in enumerate(record):
            got = compiled_stats.stats[k][j]
            for name in ("mean", "std", "near_zero"):
                assert got[name] == pytest.approx(entry[name], rel=1e-5, abs=1e-7), (k, j, name)
            assert torch.equal(got["hist"], entry["hist"]), (k, j)
    assert_no_graph_break()


# ---- gradients a compiled backward hands over: non-finite values, their provenance, huge norms ------------------


class _OneNaNGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()
        grad.view(-1)[0] = float("nan")  # one NaN in the gradient of what comes before
        return grad


class OneNaNGrad(nn.Module):
    """Identity whose backward puts one NaN into the gradient it passes back (to module "2"'s output)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _OneNaNGrad.apply(x)  # type: ignore[no-any-return]


def faulty_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 4), OneNaNGrad(), nn.ReLU(), nn.Linear(4, 1))


def oracle_output_grads(net: nn.Sequential, x: torch.Tensor, scale: float = 1.0) -> dict[str, torch.Tensor]:
    """d loss / d output of each child, by plain eager autograd (no hook, no compile), float64."""
    outputs, h = [], x
    for child in net:
        h = child(h)
        outputs.append(h)
    grads = torch.autograd.grad(h.sum() * scale, outputs)
    return {str(j): g.double() for j, g in enumerate(grads)}


def watched_compiled(net: nn.Module, inputs: list[torch.Tensor], scale: float = 1.0) -> WatchResults:
    with watch(net, select=lambda path, m: path != "", exact=True) as w:
        run = torch.compile(net, backend="aot_eager")
        for x in inputs:
            (run(x).sum() * scale).backward()
    return w.results()


@pytest.mark.slow
def test_a_nan_gradient_through_a_compiled_model_is_counted_and_its_producer_named() -> None:
    net = faulty_model()
    inputs = INPUTS[:2]
    expected = [oracle_output_grads(net, x[:, :3]) for x in inputs]
    results = watched_compiled(net, [x[:, :3] for x in inputs])
    for path in ("0", "1", "2", "3", "4", "5"):
        want = [int((~torch.isfinite(e[path])).sum()) for e in expected]
        assert results.output_grads[path]["nonfinite"].tolist() == want, path
        norms = torch.stack([e[path].nan_to_num(0.0, 0.0, 0.0).norm() for e in expected])
        close(results.output_grads[path]["norm"], norms)
    assert results.output_grads["2"]["nonfinite"].tolist() == [1.0, 1.0]  # the one NaN, where it entered
    # Backward order of a compiled run is assumed to be the reverse forward order: "2" is reached before "1"
    # and "0" (which get the NaN through it), so it is the first producer.
    assert results.first_nonfinite["backward"] == {"path": "2", "step": 0}
    assert results.first_nonfinite["forward"] is None  # the forward stayed finite


@pytest.mark.slow
def test_compiled_runs_assume_the_reverse_forward_order_for_backward() -> None:
    net = faulty_model()
    with watch(net, select=lambda path, m: path != "") as w:
        run = torch.compile(net, backend="aot_eager")
        run(INPUTS[0][:, :3]).sum().backward()
        state = w.state_dict()
    forward, backward = state["recorder"]["forward_order"], state["recorder"]["backward_order"]
    assert forward == [0, 1, 2, 3, 4, 5]  # children of the root, in the order their forwards completed
    assert backward == forward[::-1]


@pytest.mark.slow
def test_huge_gradient_norms_through_a_compiled_model_equal_the_float64_reference() -> None:
    """Gradients of about 1e20: their squares overflow float32 (norms above ~1.8e19 did), not the engine's record."""
    net = model()
    scale = 1e20
    results = watched_compiled(net, INPUTS[:2], scale=scale)
    expected = [oracle_output_grads(net, x, scale) for x in INPUTS[:2]]
    for path in ("0", "1", "2", "3", "4"):
        norms = torch.stack([e[path].norm() for e in expected])
        assert bool(torch.isfinite(norms).all()) and float(norms.min()) > 1.8e19, path
        torch.testing.assert_close(results.output_grads[path]["norm"], norms, rtol=1e-5, atol=0.0)
        assert results.output_grads[path]["nonfinite"].tolist() == [0.0, 0.0], path
