"""RELIABILITY.md groups B (module shapes), C (autograd) and D (compile/script) on the hook primitives."""

from __future__ import annotations

import warnings
from collections import namedtuple

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from hookscope.hooks import (
    hook_output,
    register_module_hook,
    register_output_grad_hook,
    register_post_accumulate_grad_hook,
    scope,
)
from hookscope.hooks._grad import UnsupportedOutputWarning
from hookscope.hooks._tree import tensor_leaves

Out = namedtuple("Out", ["a", "b"])


class KwargsOnly(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, *, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return self.lin(x) * scale


def test_b1_kwargs_are_seen_and_a_steering_pre_hook_rewrites_once() -> None:
    module = KwargsOnly()
    seen: list[dict[str, object]] = []

    def steer(m: nn.Module, args: tuple[object, ...], kwargs: dict[str, object]) -> tuple[object, dict[str, object]]:
        return args, {**kwargs, "scale": 2.0 * float(kwargs["scale"])}  # type: ignore[arg-type]

    x = torch.randn(1, 2)
    with scope():
        register_module_hook(module, "forward_pre", steer, with_kwargs=True)
        register_module_hook(module, "forward", lambda m, a, k, o: seen.append(dict(k)), with_kwargs=True)
        out = module(x=x, scale=3.0)
    assert torch.allclose(out, module.lin(x) * 6.0)
    assert seen[0]["scale"] == 6.0 and torch.equal(seen[0]["x"], x)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "make",
    [
        lambda y: {"logits": y, "aux": [y * 2, None]},
        lambda y: [y, y + 1],
        lambda y: Out(y, "label"),
        lambda y: None,
        lambda y: "text",
        lambda y: torch.distributions.Normal(y, torch.ones_like(y)),
    ],
    ids=["dict", "list", "namedtuple", "none", "str", "distribution"],
)
def test_b2_any_output_structure_records_every_tensor_leaf(make: object) -> None:
    class Odd(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> object:
            return make(self.lin(x))  # type: ignore[operator]

    module = Odd()
    with (
        hook_output(module) as forward,
        hook_output(module, grad=True) as backward,
        warnings.catch_warnings(record=True) as caught,
    ):
        warnings.simplefilter("always")
        out = module(torch.randn(3, 2))
        leaves = [t for _, t in tensor_leaves(out) if t.requires_grad]
        if leaves:
            loss = sum((i + 1) * t.sum() for i, t in enumerate(leaves))
            oracle = torch.autograd.grad(loss, leaves, retain_graph=True)  # type: ignore[arg-type]
            loss.backward()  # type: ignore[union-attr]
    expected = [t.detach() for _, t in tensor_leaves(out)]
    stored = [t for _, t in tensor_leaves(forward.stored)]
    assert len(stored) == len(expected) and all(torch.equal(a, b) for a, b in zip(stored, expected, strict=True))
    if leaves:
        assert len(backward.stored) == len(leaves)
        assert all(torch.equal(g, o) for g, o in zip(backward.stored, oracle, strict=True))
    else:
        assert backward.stored is None
    unsupported = [w for w in caught if issubclass(w.category, UnsupportedOutputWarning)]
    assert len(unsupported) == (1 if isinstance(out, torch.distributions.Distribution) else 0)


def test_b3_module_called_three_times_pairs_each_call_with_its_gradient() -> None:
    relu = nn.ReLU()
    grads: dict[int, torch.Tensor] = {}
    x = torch.randn(4, 3, requires_grad=True)
    with register_output_grad_hook(relu, lambda m, g, i: grads.__setitem__(i, g[0])):
        (relu(x) * 1 + relu(x * 2) * 10 + relu(x * 3) * 100).sum().backward()
    assert sorted(grads) == [0, 1, 2]
    assert all(torch.equal(grads[i], torch.full((4, 3), 10.0**i)) for i in range(3))


def test_b4_parameterless_modules_and_identity_returning_its_input() -> None:
    identity = nn.Identity()
    x = torch.randn(2, 2, requires_grad=True)
    with hook_output(identity) as forward, hook_output(identity, grad=True) as backward:
        y = identity(x)
        assert y is x
        (y * 3).sum().backward()
    assert torch.equal(forward.stored, x.detach())
    assert torch.equal(backward.stored[0], torch.full((2, 2), 3.0))


def test_b5_inputs_without_grad_give_none_grad_input_and_no_error() -> None:
    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, x: torch.Tensor, flag: bool, mask: torch.Tensor | None) -> torch.Tensor:
            return self.lin(x)

    module = Mixed()
    seen: list[tuple[object, ...]] = []
    with scope(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Full backward hook is firing")  # torch's own, expected here
        register_module_hook(module, "backward", lambda m, gi, go: seen.append(gi))
        module(torch.randn(1, 2), True, None).sum().backward()
    assert seen == [(None, None, None)]  # one entry per positional input; none of them requires grad


def test_b7_integer_and_empty_outputs_are_skipped_for_gradients() -> None:
    class Argmax(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.argmax(dim=-1)

    module = Argmax()
    with hook_output(module) as forward, hook_output(module, grad=True) as backward:
        out = module(torch.randn(3, 4))
        module(torch.randn(0, 4))
    assert out.dtype == torch.int64 and forward.stored.shape == (0,)
    assert backward.stored is None


def test_c1_inplace_relu_after_monitored_module_keeps_gradients_identical() -> None:
    def make() -> nn.Sequential:
        torch.manual_seed(1)
        return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(inplace=True), nn.Conv2d(4, 2, 3))

    x = torch.randn(2, 3, 8, 8)
    plain, watched = make(), make()
    plain(x).sum().backward()
    with hook_output(watched[1], grad=True) as h:
        watched(x).sum().backward()
    assert h.stored is not None
    for a, b in zip(plain.parameters(), watched.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)


def test_c2_stored_activations_have_no_graph() -> None:
    lin = nn.Linear(2, 2)
    with hook_output(lin) as h:
        lin(torch.randn(1, 2)).sum().backward()
    assert h.stored.grad_fn is None and not h.stored.requires_grad


def test_c3_double_backward_fires_once_per_backward_call() -> None:
    # autograd.grad(create_graph=True) is one backward; backpropagating through its graph is a second one that
    # again computes d/d output: one record each, both for call 0, and nothing kept afterwards.
    lin = nn.Linear(2, 1)
    calls: list[int] = []
    x = torch.randn(3, 2, requires_grad=True)
    with register_output_grad_hook(lin, lambda m, g, i: calls.append(i)):
        y = lin(x).pow(2).sum()
        (grad_x,) = torch.autograd.grad(y, x, create_graph=True)
        grad_x.sum().backward()
    assert calls == [0, 0]


def test_c4_autograd_grad_on_inputs_only_reports_missing_gradients_as_none() -> None:
    lin = nn.Linear(2, 2)
    got: list[tuple[torch.Tensor | None, ...]] = []
    x = torch.randn(1, 2, requires_grad=True)
    with register_output_grad_hook(lin, lambda m, g, i: got.append(g)):
        torch.autograd.grad(lin(x).sum(), inputs=[x])
    assert len(got) == 1 and torch.equal(got[0][0], torch.ones(1, 2))


@pytest.mark.parametrize("reentrant", [True, False])
def test_c5_checkpoint_recompute_is_labelled_and_param_hooks_fire_once(reentrant: bool) -> None:
    inner = nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 3))
    forwards: list[bool] = []
    param_calls: list[int] = []
    x = torch.randn(2, 3, requires_grad=True)
    with scope():
        register_module_hook(inner[0], "forward", lambda m, a, o: forwards.append(torch.is_grad_enabled()))
        register_post_accumulate_grad_hook(inner[0].weight, lambda p: param_calls.append(1))
        checkpoint(inner, x, use_reentrant=reentrant).sum().backward()
    assert len(forwards) == 2  # the forward and its recomputation during backward: hooks see both
    assert param_calls == [1]


def test_c6_parameter_used_twice_is_seen_once_after_accumulation() -> None:
    lin = nn.Linear(2, 2)
    seen: list[torch.Tensor] = []
    with register_post_accumulate_grad_hook(lin.weight, lambda p: seen.append(p.grad.clone())):
        lin(lin(torch.randn(1, 2))).sum().backward()
    assert len(seen) == 1 and torch.equal(seen[0], lin.weight.grad)


def test_c7_no_grad_and_inference_mode_passes_record_no_gradients() -> None:
    lin = nn.Linear(2, 2)
    calls: list[int] = []
    with register_output_grad_hook(lin, lambda m, g, i: calls.append(i)):
        with torch.no_grad():
            lin(torch.randn(1, 2))
        with torch.inference_mode():
            lin(torch.randn(1, 2))
        lin(torch.randn(1, 2)).sum().backward()
    assert calls == [0]


def test_d2_hooks_placed_before_compile_match_eager_on_aot_eager() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    x = torch.randn(5, 3)
    eager: list[torch.Tensor] = []
    compiled_seen: list[torch.Tensor] = []
    with hook_output(model[0]) as h:
        model(x)
        eager.append(h.stored)
        compiled = torch.compile(model, backend="aot_eager")
        compiled(x)
        compiled_seen.append(h.stored)
    assert torch.allclose(eager[0], compiled_seen[0])
