"""L1/L2 penalties, decoupled weight decay on post-accumulate-grad hooks, direct weight access."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
from torch.nn.utils import parametrize
from weights_support import make_mlp, train_step

from hookscope.hooks import list_hooks
from hookscope.weights import (
    NonNeg,
    get_weights,
    init_weights_,
    l1_penalty,
    l2_penalty,
    register_constraint,
    register_weight_decay,
    scale_weights_,
    set_weights_,
)


def test_penalties_equal_hand_sums_and_are_differentiable() -> None:
    model = make_mlp()
    weights = [model[0].weight, model[2].weight]
    assert l1_penalty(model).item() == pytest.approx(sum(w.abs().sum().item() for w in weights), rel=1e-6)
    assert l2_penalty(model).item() == pytest.approx(sum(w.square().sum().item() for w in weights), rel=1e-6)
    assert l2_penalty(model, "2").item() == pytest.approx(model[2].weight.square().sum().item(), rel=1e-6)
    l2_penalty(model, "0").backward()
    torch.testing.assert_close(model[0].weight.grad, 2 * model[0].weight.detach())
    assert model[2].weight.grad is None and model[0].bias.grad is None


def test_decoupled_decay_matches_adamw_exactly() -> None:
    model = make_mlp()
    reference = copy.deepcopy(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    adamw = torch.optim.AdamW(
        [{"params": [reference[0].weight, reference[2].weight]},
         {"params": [reference[0].bias, reference[2].bias], "weight_decay": 0.0}],
        lr=0.01, weight_decay=0.1,
    )  # fmt: skip
    handles = register_weight_decay(model, 0.1, lr=optimizer)
    for _ in range(5):
        batch = torch.randn(4, 4)
        train_step(model, optimizer, batch)
        train_step(reference, adamw, batch)
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
    assert len(handles) == 2
    handles.remove()
    assert list_hooks(model) == []


def test_decay_runs_once_per_backward_for_a_shared_weight_and_follows_the_lr() -> None:
    shared = nn.Linear(3, 3, bias=False)
    model = nn.Sequential(shared, nn.Tanh(), shared)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    register_weight_decay(model, 0.2, lr=optimizer)
    before = shared.weight.detach().clone()
    model(torch.randn(2, 3)).sum().backward()  # the weight is used twice, decayed once
    torch.testing.assert_close(shared.weight.detach(), before * (1 - 0.5 * 0.2))
    optimizer.param_groups[0]["lr"] = 0.1  # a scheduler's change is followed
    before = shared.weight.detach().clone()
    model(torch.randn(2, 3)).sum().backward()
    torch.testing.assert_close(shared.weight.detach(), before * (1 - 0.1 * 0.2))


def test_decay_with_a_fixed_lr_skips_frozen_weights_and_checks_arguments() -> None:
    model = make_mlp()
    model[2].weight.requires_grad_(False)
    handles = register_weight_decay(model, 0.5, lr=0.1)
    assert [h.path for h in handles] == ["0"]
    with pytest.raises(ValueError, match="weight_decay must be a number >= 0, got -0.1"):
        register_weight_decay(model, -0.1, lr=0.1)
    with pytest.raises(ValueError, match="lr must be a positive number or the optimizer to read it from, got 0"):
        register_weight_decay(model, 0.1, lr=0)


def test_get_set_init_and_scale_weights() -> None:
    model = make_mlp()
    copies = get_weights(model)
    assert set(copies) == {"0", "2"} and copies["0"] is not model[0].weight
    parameter = model[0].weight
    scale_weights_(model, 2.0, "0")
    assert model[0].weight is parameter  # same Parameter: the optimizer still holds it
    torch.testing.assert_close(model[0].weight.detach(), 2 * copies["0"])
    set_weights_(model, {"0": copies["0"]})
    assert torch.equal(model[0].weight.detach(), copies["0"])
    assert init_weights_(model, nn.init.zeros_, nn.Linear) == ["0", "2"]
    assert model[2].weight.abs().sum().item() == 0.0 and model[2].weight.requires_grad


def test_writes_bump_the_version_counter_so_stale_graphs_fail() -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 1))
    loss = model(torch.randn(2, 3)).sum()
    scale_weights_(model, 0.5, "2")
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()  # .data would have silently used the new weight


def test_set_weights_errors_and_parametrized_layers() -> None:
    model = make_mlp()
    with pytest.raises(ValueError, match="weights must name an existing layer path, got '1'"):
        set_weights_(model, {"1": torch.zeros(1)})
    with pytest.raises(ValueError, match=r"weights\['0'\] must have the weight's shape \(8, 4\), got \(4, 8\)"):
        set_weights_(model, {"0": torch.zeros(4, 8)})
    register_constraint(model, NonNeg(), "0", mode="parametrize")
    target = torch.rand(8, 4)
    set_weights_(model, {"0": target})
    assert parametrize.is_parametrized(model[0], "weight")
    torch.testing.assert_close(model[0].weight.detach(), target)
    scale_weights_(model, -1.0, "0")  # scales the stored original; the constraint still applies on read
    assert model[0].weight.min().item() >= 0.0
    with pytest.raises(ValueError, match="factor must be a finite number, got inf"):
        scale_weights_(model, float("inf"))
