"""Training with an intervention on is training with the same hand-written forward hook: same parameters."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
import torch.nn as nn

from hookscope import steer

from .models import WIDTH, AttentionOnly, _batch

HandEdit = Callable[[torch.Tensor], torch.Tensor]


def _zero_head_1(z: torch.Tensor) -> torch.Tensor:
    z = z.clone()
    z[..., WIDTH // 2 :] = 0.0
    return z


DIRECTION = torch.randn(WIDTH, generator=torch.Generator().manual_seed(3))


def _project_off(x: torch.Tensor) -> torch.Tensor:
    unit = DIRECTION / DIRECTION.norm()
    return x - (x @ unit).unsqueeze(-1) * unit


def _add_at_2(x: torch.Tensor) -> torch.Tensor:
    x = x.clone()
    x[:, 2] = x[:, 2] + 0.5 * DIRECTION
    return x


CASES = [
    ("blocks.0.attn.out_proj", "input", steer.Zero(heads=[1], n_heads=2), _zero_head_1),
    ("blocks.1.resid_pre", "output", steer.Project(DIRECTION), _project_off),
    ("embedded", "output", steer.Add(DIRECTION, scale=0.5, positions=2), _add_at_2),
]


def _train(model: nn.Module, steps: int) -> nn.Module:
    gen = torch.Generator().manual_seed(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        tokens, predictable = _batch(gen, batch=16)
        logits = model(tokens)[:, :-1]
        loss = nn.functional.cross_entropy(logits[predictable], tokens[:, 1:][predictable])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model


@pytest.mark.parametrize(("site", "at", "intervention", "by_hand"), CASES, ids=[c[0] for c in CASES])
def test_the_parameters_match_a_run_with_the_hand_written_hook(
    site: str, at: str, intervention: steer.Intervention, by_hand: HandEdit
) -> None:
    start = AttentionOnly()
    steered, reference = copy.deepcopy(start), copy.deepcopy(start)
    module = reference.get_submodule(site)
    if at == "input":
        handle = module.register_forward_pre_hook(lambda m, args: (by_hand(args[0]),))
    else:
        handle = module.register_forward_hook(lambda m, args, out: by_hand(out))
    _train(reference, 20)
    handle.remove()
    with steer.intervene(steered, {site: intervention}, at=at):
        _train(steered, 20)
    for (name, got), expected in zip(steered.named_parameters(), reference.parameters(), strict=True):
        assert torch.allclose(got, expected, atol=1e-6, rtol=0), name
    untouched = _train(copy.deepcopy(start), 20)
    assert not all(torch.allclose(a, b) for a, b in zip(untouched.parameters(), reference.parameters(), strict=True))
