"""Unusual outputs pass through hookscope untouched: generators, defaultdicts, dataclasses, complex, sparse and
nested tensors; a model on the meta device is refused at attach with a message that says what to do."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn as nn

from hookscope.callbacks import ActivationStats
from hookscope.hooks import hook_output
from hookscope.monitors import OutputMonitor
from hookscope.reducers import HistoryReducer
from hookscope.watch import watch


class Wrap(nn.Module):
    """A linear layer whose output is handed back in the container `pack` makes."""

    def __init__(self, pack: Any) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 4)
        self.pack = pack

    def forward(self, x: torch.Tensor) -> Any:
        return self.pack(self.linear(x))


def generator_of(y: torch.Tensor) -> Iterator[torch.Tensor]:
    return (row for row in y)


def test_a_generator_output_is_not_consumed() -> None:
    model = nn.Sequential(Wrap(generator_of))
    x = torch.randn(2, 3)
    with hook_output(model[0]) as hook, watch(model, select="0") as w:
        rows = list(model(x))
    assert len(rows) == 2 and torch.equal(torch.stack(rows), model[0].linear(x))  # the caller still gets them
    assert isinstance(hook.stored, Iterator)  # kept as it is, not listed
    assert w.results().steps.tolist() == [0]


def test_a_defaultdict_output_passes_and_is_stored_detached() -> None:
    def pack(y: torch.Tensor) -> collections.defaultdict[str, Any]:
        out: collections.defaultdict[str, Any] = collections.defaultdict(list)
        out["y"] = y
        return out

    module = Wrap(pack)
    with hook_output(module) as hook:
        out = module(torch.randn(2, 3))
    assert isinstance(hook.stored, collections.defaultdict) and hook.stored.default_factory is list
    assert hook.stored["y"].grad_fn is None and out["y"].grad_fn is not None


@dataclasses.dataclass(frozen=True)
class Output:
    logits: torch.Tensor
    extra: tuple[torch.Tensor, ...]
    note: str = "kept"


def test_tensors_inside_a_dataclass_output_are_detached_in_the_stored_copy() -> None:
    module = Wrap(lambda y: Output(y, (y * 2,)))
    with hook_output(module, detach=True) as hook:
        out = module(torch.randn(2, 3))
    assert hook.stored.logits.grad_fn is None and hook.stored.extra[0].grad_fn is None
    assert hook.stored.note == "kept" and out.logits.grad_fn is not None  # the output itself is untouched


def test_a_complex_outputs_gradient_norm_keeps_the_imaginary_part() -> None:
    model = nn.Sequential(Wrap(lambda y: torch.complex(y, 2 * y)))
    x = torch.randn(5, 3)
    with watch(model, select="0") as w:
        out = model(x)
        out.retain_grad()
        out.abs().pow(2).sum().backward()
    expected = out.grad.abs().pow(2).sum().sqrt()  # sqrt(sum |g|^2)
    assert float(w.results().output_grads["0"]["norm"][0]) == pytest.approx(float(expected), rel=1e-5)


def sparse(y: torch.Tensor) -> torch.Tensor:
    return y.to_sparse()


def nested(y: torch.Tensor) -> torch.Tensor:
    return torch.nested.as_nested_tensor([y[:1], y[1:]])


def total(out: torch.Tensor) -> torch.Tensor:
    return torch.sparse.sum(out) if out.layout == torch.sparse_coo else sum(t.sum() for t in out.unbind())


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")
@pytest.mark.parametrize("pack", [sparse, nested], ids=["sparse", "nested"])
def test_sparse_and_nested_outputs_do_not_crash_any_recorder(pack: Any) -> None:
    model = nn.Sequential(Wrap(pack), nn.Identity())
    x = torch.randn(3, 3)
    expected = pack(model[0].linear(x))
    stats = ActivationStats(modules="0")
    with (
        watch(model, select="0") as w,
        stats.attach(model),
        OutputMonitor(HistoryReducer(), module=model[0]) as monitor,
        hook_output(model[0], grad=True) as grads,
    ):
        out = model(x)
        total(out).backward()
    assert torch.equal(
        out.to_padded_tensor(0.0) if out.is_nested else out.to_dense(),
        (expected.to_padded_tensor(0.0) if expected.is_nested else expected.to_dense()),
    )  # passed through as the module made it
    assert w.results().dropped["unsupported_layout"] >= 1  # not described: counted
    assert len(stats.stats) == 1 and monitor.counts["recorded"] == 1 and grads.stored is not None


def test_a_model_on_the_meta_device_is_refused_at_attach() -> None:
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(3, 4))
    message = r"model must hold real tensors, got '0.weight' on the meta device .* model.to_empty\(device='cpu'\)"
    with pytest.raises(ValueError, match=message):
        watch(model).attach()
    with pytest.raises(ValueError, match=message):
        ActivationStats().attach(model)
    assert not model[0]._forward_hooks and not model._forward_pre_hooks  # nothing left behind
