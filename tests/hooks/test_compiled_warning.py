"""CompiledModelWarning tells the truth about hooks added after torch.compile ran, and is issued once."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
import torch
import torch.nn as nn

from hookscope.hooks import CompiledModelWarning
from hookscope.results import WatchResults
from hookscope.watch import watch

INPUTS = [torch.randn(8, 4, generator=torch.Generator().manual_seed(k)) for k in range(3)]


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))


def train(model: nn.Module, run: nn.Module, reset: bool = False) -> tuple[WatchResults, list[str]]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with watch(run, optimizer) as w:
            if reset:
                torch._dynamo.reset()
            for x in INPUTS:
                run(x).pow(2).mean().backward()
                optimizer.step()
                optimizer.zero_grad()
    return w.results(), [str(c.message) for c in caught if c.category is CompiledModelWarning]


def test_hooks_added_after_the_first_compiled_call_record_nothing_until_a_recompile_and_one_warning_says_so() -> None:
    model = mlp()
    compiled = torch.compile(model, backend="eager")
    compiled(INPUTS[0])  # compiled for this shape: nothing below makes it recompile
    results, said = train(model, compiled)
    assert len(said) == 1, said  # was issued twice (once per hook on the compiled root)
    assert "runs without them until torch.compile recompiles it" in said[0]
    assert "torch._dynamo.reset() after attaching" in said[0]
    assert set(results.unobserved) == {"0", "1", "2"}  # what the warning announces
    assert all(torch.isnan(results.activations[p]["mean"]).all() for p in ("0", "1", "2"))


def test_after_the_advised_reset_the_hooks_record_what_eager_mode_records() -> None:
    reference = mlp()
    eager, _ = train(reference, reference)
    model = mlp()
    compiled = torch.compile(model, backend="eager")
    compiled(INPUTS[0])
    results, said = train(model, compiled, reset=True)
    assert len(said) == 1 and results.unobserved == {}
    for path in ("0", "1", "2"):
        torch.testing.assert_close(results.activations[path]["mean"], eager.activations[path]["mean"])
        torch.testing.assert_close(results.output_grads[path]["norm"], eager.output_grads[path]["norm"])
