"""Constraints: the max-norm pre-hook, MaxNorm/Clamp/UnitNorm/NonNeg in three modes, counts, key remapping."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
import torch.nn as nn
from weights_support import forbid_host_sync, make_mlp, train_step

from hookscope.hooks import list_hooks
from hookscope.weights import (
    Clamp,
    MaxNorm,
    NonNeg,
    UnitNorm,
    add_weight_norm_constraint_hook,
    register_constraint,
    remap_state_dict,
)
from hookscope.weights._constrain import load_state_dict_remapped


def _row_norms(weight: torch.Tensor) -> torch.Tensor:
    return weight.detach().reshape(weight.shape[0], -1).double().norm(dim=1)


def test_max_norm_hook_rescales_only_rows_above_the_bound() -> None:
    conv = nn.Conv2d(2, 4, 3)
    with torch.no_grad():
        conv.weight.mul_(torch.tensor([0.1, 50.0, 0.2, 80.0]).view(4, 1, 1, 1))
    before = conv.weight.detach().clone()
    norms = _row_norms(before)
    assert norms[1] > 1 and norms[3] > 1 and norms[0] < 1 and norms[2] < 1
    handles = add_weight_norm_constraint_hook(nn.Sequential(conv), max_norm=1.0)
    conv(torch.randn(1, 2, 5, 5))
    after = conv.weight.detach()
    assert torch.equal(after[0], before[0]) and torch.equal(after[2], before[2])  # bit for bit
    for row in (1, 3):
        assert _row_norms(after)[row].item() == pytest.approx(1.0, rel=1e-6)
        expected = before[row].double() / norms[row]  # same direction
        torch.testing.assert_close(after[row].double(), expected, rtol=1e-6, atol=1e-7)
    assert len(handles) == 1
    handles[0].remove()
    handles[0].remove()
    assert list_hooks(conv) == []


def test_max_norm_hook_chooses_layers_and_rejects_bad_bounds() -> None:
    model = make_mlp()
    handles = add_weight_norm_constraint_hook(model, 2.0, select="2")
    assert [h.path for h in handles] == ["2"]
    for bad in (0, -1.0):
        with pytest.raises(ValueError, match="max_norm must be a positive number"):
            add_weight_norm_constraint_hook(model, bad)
    with pytest.raises(TypeError, match="max_norm must be a number, got '3'"):
        add_weight_norm_constraint_hook(model, "3")  # type: ignore[arg-type]


def test_constraint_projections_against_hand_computations() -> None:
    weight = torch.tensor([[3.0, 4.0], [0.3, 0.4], [-1.0, 0.0], [0.0, 0.0]])
    torch.testing.assert_close(MaxNorm(1.0).project(weight), torch.tensor([[0.6, 0.8], [0.3, 0.4], [-1, 0], [0, 0.0]]))
    torch.testing.assert_close(UnitNorm().project(weight), torch.tensor([[0.6, 0.8], [0.6, 0.8], [-1, 0], [0, 0.0]]))
    torch.testing.assert_close(NonNeg().project(weight), weight.clamp(min=0))
    torch.testing.assert_close(Clamp(-0.5, 0.5).project(weight), weight.clamp(-0.5, 0.5))
    torch.testing.assert_close(MaxNorm(1.0, dim=1).project(weight), weight / weight.norm(dim=0).clamp(min=1))
    assert not MaxNorm(5.0).violated(weight) and MaxNorm(4.0).violated(weight)
    assert not UnitNorm().violated(torch.tensor([[0.6, 0.8], [0.0, 0.0]]))
    assert NonNeg().violated(weight) and not NonNeg().violated(weight.abs())
    assert not Clamp(max=5.0).violated(weight)


def test_constraint_argument_errors() -> None:
    with pytest.raises(ValueError, match="max_norm must be a positive finite number, got 0"):
        MaxNorm(0)
    with pytest.raises(ValueError, match="Clamp must get min or max"):
        Clamp()
    with pytest.raises(ValueError, match="min must be <= max, got min=1, max=0"):
        Clamp(1, 0)
    with pytest.raises(TypeError, match="min must be a number or None, got 'a'"):
        Clamp("a")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"dim must be an int, got 0.5"):
        UnitNorm(dim=0.5)  # type: ignore[arg-type]
    model = make_mlp()
    with pytest.raises(
        TypeError, match="constraint must be a Constraint, got .*; use one of MaxNorm, Clamp, UnitNorm, NonNeg"
    ):
        register_constraint(model, lambda w: w)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="mode must be one of 'parametrize', 'step', 'forward', got 'after'"):
        register_constraint(model, NonNeg(), mode="after")
    with pytest.raises(ValueError, match="mode 'step' must be given the optimizer"):
        register_constraint(model, NonNeg(), mode="step")


@pytest.mark.parametrize("mode", ["step", "forward", "parametrize"])
def test_max_norm_bound_holds_after_every_step(mode: str) -> None:
    model = make_mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    handle = register_constraint(model, MaxNorm(0.5), mode=mode, optimizer=optimizer if mode == "step" else None)
    for _ in range(8):
        inputs = torch.randn(16, 4) * 5
        train_step(model, optimizer, inputs)
        if mode == "forward":
            model(inputs)  # the projection happens before the next forward
        for layer in (model[0], model[2]):
            assert _row_norms(layer.weight).max().item() <= 0.5 * (1 + 1e-6)
    assert handle.applications["0"] >= 8
    assert 0 < handle.corrections["0"] <= handle.applications["0"]


def test_counts_only_corrections_that_were_needed() -> None:
    layer = nn.Linear(3, 2)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[-1.0, 2.0, 3.0], [1.0, 1.0, 1.0]]))
    model = nn.Sequential(layer)
    handle = register_constraint(model, NonNeg(), mode="forward")
    with forbid_host_sync():
        for _ in range(3):
            model(torch.randn(1, 3))
    assert handle.applications == {"0": 3}
    assert handle.corrections == {"0": 1}  # only the first forward had a negative weight
    assert torch.equal(layer.weight.detach(), torch.tensor([[0.0, 2.0, 3.0], [1.0, 1.0, 1.0]]))
    handle.remove()
    assert list_hooks(layer) == []


def test_step_mode_skips_steps_that_grad_scaler_skips() -> None:
    model = make_mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    handle = register_constraint(model, MaxNorm(0.1), optimizer=optimizer)
    assert handle.mode == "step"
    loss = model(torch.randn(2, 4)).sum()
    scaler.scale(loss).backward()
    model[0].weight.grad[0, 0] = float("inf")  # the scaler will skip this step
    scaler.step(optimizer)
    scaler.update()
    assert handle.applications == {"0": 0, "2": 0}
    optimizer.zero_grad()
    scaler.scale(model(torch.randn(2, 4)).sum()).backward()
    scaler.step(optimizer)
    assert handle.applications == {"0": 1, "2": 1}


def test_parametrize_mode_is_differentiable_and_removal_keeps_the_projection() -> None:
    model = make_mlp()
    with torch.no_grad():
        model[0].weight.mul_(100)
    handle = register_constraint(model, MaxNorm(1.0), "0", mode="parametrize")
    assert "0.parametrizations.weight.original" in model.state_dict()
    model(torch.randn(2, 4)).sum().backward()
    original = model[0].parametrizations.weight.original
    assert original.grad is not None and _row_norms(original).min() > 1
    assert handle.corrections == {"0": 1}
    projected = model[0].weight.detach().clone()
    handle.remove()
    assert "0.weight" in model.state_dict() and "0.parametrizations.weight.original" not in model.state_dict()
    assert torch.equal(model[0].weight.detach(), projected)


def test_checkpoints_load_across_constrained_and_plain_models() -> None:
    plain = make_mlp()
    constrained = make_mlp()
    register_constraint(constrained, UnitNorm(), mode="parametrize")
    with pytest.raises(RuntimeError, match="Missing key"):
        constrained.load_state_dict(plain.state_dict())
    load_state_dict_remapped(constrained, plain.state_dict())
    assert torch.equal(constrained[0].parametrizations.weight.original, plain[0].weight)
    other = make_mlp()
    result = load_state_dict_remapped(other, constrained.state_dict())
    assert not result.missing_keys and not result.unexpected_keys
    assert torch.equal(other[2].weight, constrained[2].parametrizations.weight.original)
    wrapped = {f"module._orig_mod.{k}": v for k, v in plain.state_dict().items()}
    assert set(remap_state_dict(wrapped, other)) == set(other.state_dict())
    assert remap_state_dict({"extra": torch.zeros(1)}, other) == {"extra": torch.zeros(1)}


def test_apply_now_and_handle_is_a_context_manager() -> None:
    model = nn.Sequential(nn.Linear(2, 2))
    with torch.no_grad():
        model[0].weight.fill_(5.0)
    with register_constraint(model, Clamp(max=1.0)) as handle:
        handle.apply()
        assert model[0].weight.max().item() == 1.0
        assert len(list_hooks(model)) == 1
    assert list_hooks(model) == []
    assert "removed" in repr(handle)


def test_constraint_hooks_do_not_keep_the_model_alive() -> None:
    gc.disable()
    try:
        model = make_mlp()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        register_constraint(model, MaxNorm(1.0), mode="forward")
        register_constraint(model, MaxNorm(1.0), optimizer=optimizer)
        reference = weakref.ref(model)
        del model, optimizer
        assert reference() is None
    finally:
        gc.enable()


class _WrappedSGD(torch.optim.SGD):
    def step(self, closure=None):  # type: ignore[no-untyped-def]
        return super().step(closure)


def test_step_mode_runs_once_per_step_for_a_subclass_calling_super_step() -> None:
    torch.optim.SGD(make_mlp().parameters(), lr=0.1)  # wraps SGD.step with torch's hook caller
    model = make_mlp()
    optimizer = _WrappedSGD(model.parameters(), lr=0.1)
    handle = register_constraint(model, MaxNorm(0.1), optimizer=optimizer)
    for _ in range(3):
        train_step(model, optimizer, torch.randn(2, 4))
    assert handle.applications == {"0": 3, "2": 3}
