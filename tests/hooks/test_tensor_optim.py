"""Tensor, parameter post-accumulate-grad, optimizer and global hooks go through the registry."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from hookscope.hooks import (
    list_hooks,
    register_global_module_hook,
    register_global_optimizer_hook,
    register_optimizer_hook,
    register_post_accumulate_grad_hook,
    register_tensor_hook,
    scope,
)
from hookscope.hooks._registry import REGISTRY


def test_tensor_hook_can_replace_the_gradient() -> None:
    x = torch.randn(3, requires_grad=True)
    with register_tensor_hook(x, lambda g: g * 2, path="x") as handle:
        (x * 3).sum().backward()
        assert handle.kind == "tensor" and handle.path == "x"
    assert torch.equal(x.grad, torch.full((3,), 6.0))


def test_post_accumulate_grad_hook_fires_once_for_a_parameter_used_twice() -> None:
    lin = nn.Linear(2, 2)
    seen: list[torch.Tensor] = []
    with register_post_accumulate_grad_hook(lin.weight, lambda p: seen.append(p.grad.clone())):
        x = torch.randn(4, 2)
        lin(lin(x)).sum().backward()
    assert len(seen) == 1 and torch.equal(seen[0], lin.weight.grad)
    rows = [r for r in list_hooks(lin) if r.is_hookscope]
    assert rows == []


def test_tensor_hook_errors_name_the_fix() -> None:
    with pytest.raises(TypeError, match=r"tensor must be a torch.Tensor, got \[1.0\]"):
        register_tensor_hook([1.0], lambda g: g)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"tensor must require grad .*requires_grad_\(\)"):
        register_tensor_hook(torch.zeros(1), lambda g: g)
    with pytest.raises(ValueError, match="parameter must be a leaf tensor"):
        register_post_accumulate_grad_hook(torch.zeros(1, requires_grad=True) * 2, lambda p: None)


def test_optimizer_step_hooks_see_before_and_after() -> None:
    lin = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(lin.parameters(), lr=0.5)
    lin(torch.ones(1, 2)).sum().backward()
    before = lin.weight.detach().clone()
    seen: dict[str, torch.Tensor] = {}
    with scope():
        register_optimizer_hook(optimizer, "step_pre", lambda o, a, k: seen.update(pre=lin.weight.detach().clone()))
        register_optimizer_hook(optimizer, "step_post", lambda o, a, k: seen.update(post=lin.weight.detach().clone()))
        optimizer.step()
    assert torch.equal(seen["pre"], before)
    assert torch.equal(seen["post"], before - 0.5 * lin.weight.grad)
    assert len(optimizer._optimizer_step_pre_hooks) == 0 and len(optimizer._optimizer_step_post_hooks) == 0
    with pytest.raises(TypeError, match="optimizer must be a torch.optim.Optimizer, got Linear"):
        register_optimizer_hook(lin, "step_pre", lambda o, a, k: None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="kind must be one of 'step_pre', 'step_post', got 'step'"):
        register_optimizer_hook(optimizer, "step", lambda o, a, k: None)


def test_global_hooks_fire_for_every_module_and_optimizer_and_are_listed() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    fired: list[str] = []
    before = len(REGISTRY)
    with scope():
        register_global_module_hook("forward", lambda m, a, o: fired.append(type(m).__name__))
        register_global_optimizer_hook("step_post", lambda o, a, k: fired.append("step"))
        model(torch.randn(1, 2)).sum().backward()
        optimizer.step()
        assert [r.kind for r in list_hooks(model) if r.path == "<global>"] == ["global_forward"]
    assert fired == ["Linear", "ReLU", "Sequential", "step"]
    assert len(REGISTRY) == before
    with pytest.raises(ValueError, match="kind must be one of 'step_pre', 'step_post'"):
        register_global_optimizer_hook("pre", lambda o, a, k: None)
