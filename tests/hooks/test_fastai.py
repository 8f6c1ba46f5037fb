"""Hook, Hooks, hook_output(s): stored values against reference computations."""

from __future__ import annotations

from collections import namedtuple

import pytest
import torch
import torch.nn as nn

from hookscope.hooks import Hook, Hooks, hook_output, hook_outputs


def _mlp() -> tuple[nn.Sequential, list[nn.Module]]:
    layers: list[nn.Module] = [nn.Linear(5, 10), nn.ReLU(), nn.Linear(10, 3)]
    return nn.Sequential(*layers), layers


def test_hook_stores_result_of_hook_func() -> None:
    lin = nn.Linear(3, 2)
    x = torch.randn(4, 3)
    with Hook(lin, lambda m, i, o: (i[0] * 2, o)) as hook:
        out = lin(x)
    doubled, stored = hook.stored
    assert torch.equal(doubled, x * 2)
    assert torch.equal(stored, out)
    assert stored.grad_fn is None and not stored.requires_grad
    assert len(lin._forward_hooks) == 0


def test_hook_detach_false_keeps_graph_and_cpu_moves() -> None:
    lin = nn.Linear(3, 2)
    with Hook(lin, lambda m, i, o: o, detach=False) as hook:
        lin(torch.randn(2, 3))
    assert hook.stored.grad_fn is not None
    with Hook(lin, lambda m, i, o: o, cpu=True) as hook:
        lin(torch.randn(2, 3))
    assert hook.stored.device.type == "cpu"


def test_backward_hook_receives_grad_input_and_grad_output() -> None:
    lin = nn.Linear(3, 2)
    x = torch.randn(4, 3, requires_grad=True)
    with Hook(lin, lambda m, gi, go: (gi[0], go[0]), is_forward=False) as hook:
        lin(x).sum().backward()
    grad_input, grad_output = hook.stored
    assert torch.allclose(grad_output, torch.ones(4, 2))
    assert torch.allclose(grad_input, torch.ones(4, 2) @ lin.weight)
    assert torch.allclose(grad_input, x.grad)


def test_remove_is_idempotent() -> None:
    lin = nn.Linear(3, 2)
    hook = Hook(lin, lambda m, i, o: o)
    hook.remove()
    hook.remove()
    assert hook.removed and len(lin._forward_hooks) == 0


def test_hooks_on_module_means_children_in_order() -> None:
    model, layers = _mlp()
    x = torch.randn(7, 5)
    with Hooks(model, lambda m, i, o: o.shape) as hooks:
        model(x)
    assert len(hooks) == 3
    assert hooks.stored == [torch.Size([7, 10]), torch.Size([7, 10]), torch.Size([7, 3])]
    assert [type(h) for h in hooks] == [Hook] * 3 and hooks[1] is list(hooks)[1]
    assert all(len(m._forward_hooks) == 0 for m in layers)


def test_hook_outputs_grad_matches_the_issue_example() -> None:
    model, layers = _mlp()
    x = torch.randn(6, 5)
    with hook_outputs(layers, grad=True) as h:
        y = model(x)
        loss = y.pow(2).mean()
        loss.backward()
    expected = 2 * y.detach() / y.numel()
    assert torch.allclose(h.stored[2][0], expected)
    assert torch.allclose(h.stored[1][0], expected @ layers[2].weight.detach())


def test_hook_output_stores_forward_output() -> None:
    model, layers = _mlp()
    x = torch.randn(2, 5)
    with hook_output(layers[0]) as h:
        model(x)
    assert torch.allclose(h.stored, layers[0](x))


def test_grad_hook_survives_inplace_relu_after_module() -> None:
    lin, relu = nn.Linear(4, 4), nn.ReLU(inplace=True)
    x = torch.randn(8, 4)
    with hook_output(lin, grad=True) as h:
        relu(lin(x)).sum().backward()
    assert torch.equal(h.stored[0], (lin(x) > 0).float())


Pair = namedtuple("Pair", ["left", "right"])


class _Nested(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> dict[str, object]:
        y = self.lin(x)
        return {"pair": Pair(y * 2, y * 3), "label": "text", "none": None}


def test_grad_hook_sees_every_leaf_of_dict_and_namedtuple_outputs() -> None:
    module = _Nested()
    with hook_output(module, grad=True) as h:
        out = module(torch.randn(2, 3))
        (out["pair"].left.sum() + out["pair"].right.pow(2).sum()).backward()
    left, right = h.stored
    assert torch.equal(left, torch.ones(2, 3))
    assert torch.allclose(right, 2 * out["pair"].right.detach())


def test_grad_hook_with_input_that_does_not_require_grad_and_no_grad_pass() -> None:
    lin = nn.Linear(3, 1)
    with hook_output(lin, grad=True) as h:
        with torch.no_grad():
            lin(torch.randn(2, 3))
        assert h.stored is None
        lin(torch.randn(2, 3)).sum().backward()
    assert torch.equal(h.stored[0], torch.ones(2, 1))


def test_shared_module_calls_are_paired_with_their_own_gradient() -> None:
    relu = nn.ReLU()
    lin = nn.Linear(3, 3)
    seen: list[tuple[int, torch.Tensor]] = []

    def record(module: nn.Module, grads: tuple[torch.Tensor | None, ...], call_index: int) -> None:
        assert grads[0] is not None
        seen.append((call_index, grads[0].clone()))

    from hookscope.hooks import register_output_grad_hook

    x = torch.randn(2, 3)
    with register_output_grad_hook(relu, record):
        a = relu(x.requires_grad_())
        b = relu(lin(a))
        c = relu(lin(b))
        (c * 5).sum().backward()
        indices = sorted(i for i, _ in seen)
        assert indices == [0, 1, 2]
        by_index = dict(seen)
        assert torch.equal(by_index[2], torch.full((2, 3), 5.0))
        # the first call's output gradient is what flows back through lin and relu twice
        a2 = relu(x.detach()).requires_grad_()
        b2 = relu(lin(a2))
        (relu(lin(b2)) * 5).sum().backward()
        assert torch.allclose(by_index[0], a2.grad)
        seen.clear()
        relu(lin(x)).sum().backward()
        assert [i for i, _ in seen] == [0]


def test_hook_rejects_bad_arguments() -> None:
    with pytest.raises(TypeError, match="hook_func must be a callable, got 'not callable'; pass the function itself"):
        Hook(nn.Linear(1, 1), "not callable")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="m must be an nn.Module, got 3"):
        Hook(3, lambda m, i, o: o)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ms must be an nn.Module or a list of nn.Module, got 5"):
        Hooks(5, lambda m, i, o: o)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"modules must be an nn.Module or a list of nn.Module, got \['x'\]"):
        hook_outputs(["x"])  # type: ignore[list-item]


def test_hooks_placed_before_a_failure_are_removed() -> None:
    lin = nn.Linear(2, 2)
    with pytest.raises(TypeError):
        Hooks([lin, "bad"], lambda m, i, o: o)  # type: ignore[list-item]
    assert len(lin._forward_hooks) == 0
