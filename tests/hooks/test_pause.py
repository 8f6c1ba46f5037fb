"""Pausing a module or optimizer hook: off its target (torch's fast path) while it stays registered, then back on."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
import torch.nn as nn

from hookscope._torch import module_hooks
from hookscope.hooks import list_hooks, register_module_hook, register_optimizer_hook, register_tensor_hook


def torch_hook_count(module: nn.Module) -> int:
    """How many hooks torch would call on `module` (anyone's), read from torch's own tables."""
    return sum(len(table) for table in module_hooks(module).values())


def test_a_paused_hook_is_off_the_module_and_back_after_resume() -> None:
    model = nn.Sequential(nn.Linear(2, 2))
    calls: list[int] = []
    handle = register_module_hook(model[0], "forward", lambda m, a, o: calls.append(1))
    model(torch.ones(1, 2))
    handle.pause()
    assert handle.is_paused and torch_hook_count(model[0]) == 0  # torch sees no hook: its fast path
    model(torch.ones(1, 2))
    assert [h.kind for h in list_hooks(model) if h.is_hookscope] == ["forward"]  # still registered, listed
    handle.resume()
    assert not handle.is_paused and torch_hook_count(model[0]) == 1
    model(torch.ones(1, 2))
    assert calls == [1, 1]  # called before the pause and after the resume, not while paused
    handle.remove()
    assert torch_hook_count(model[0]) == 0 and not list_hooks(model)


def test_pause_and_resume_twice_do_nothing_more_and_remove_works_while_paused() -> None:
    module = nn.Linear(2, 2)
    handle = register_module_hook(module, "forward_pre", lambda m, a: None)
    handle.pause()
    handle.pause()
    handle.remove()
    handle.resume()  # removed: stays off
    assert torch_hook_count(module) == 0 and handle.is_removed


def test_a_resumed_hook_runs_after_the_hooks_placed_while_it_was_paused() -> None:
    module = nn.Linear(2, 2)
    order: list[str] = []
    ours = register_module_hook(module, "forward", lambda m, a, o: order.append("ours"))
    ours.pause()
    module.register_forward_hook(lambda m, a, o: order.append("user's"))
    ours.resume()
    module(torch.ones(1, 2))
    assert order == ["user's", "ours"]


def test_a_resumed_hook_keeps_its_kind_and_flags() -> None:
    module = nn.Linear(2, 2)
    seen: list[bool] = []

    def hook(m: nn.Module, args: tuple[object, ...], kwargs: dict[str, object], output: object) -> None:
        seen.append(isinstance(kwargs, dict))

    handle = register_module_hook(module, "forward", hook, with_kwargs=True, always_call=True)
    handle.pause()
    handle.resume()
    module(torch.ones(1, 2))
    with pytest.raises(RuntimeError):
        module(torch.ones(1, 3))  # the forward raises: an always-called hook still runs
    assert seen == [True, True]


@pytest.mark.parametrize("paused", [True, False])
def test_copies_and_pickles_leave_paused_and_resumed_hooks_behind(paused: bool) -> None:
    model = nn.Sequential(nn.Linear(2, 2))
    handle = register_module_hook(model[0], "forward", lambda m, a, o: None)
    handle.pause()
    if not paused:
        handle.resume()
    for copied in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert torch_hook_count(copied[0]) == 0
    buffer = io.BytesIO()
    torch.save(model, buffer)
    assert b"hookscope" not in buffer.getvalue()
    handle.remove()


def test_an_optimizer_hook_pauses_and_resumes_after_the_hooks_placed_meanwhile() -> None:
    layer = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    calls: list[str] = []
    handle = register_optimizer_hook(optimizer, "step_pre", lambda o, a, k: calls.append("ours"))
    optimizer.step()
    handle.pause()
    assert handle.is_paused
    optimizer.step()  # torch calls nothing of ours
    users = optimizer.register_step_pre_hook(lambda o, a, k: calls.append("user"))
    handle.resume()
    optimizer.step()
    assert calls == ["ours", "user", "ours"]  # back on, after the hook placed meanwhile
    handle.pause()
    handle.remove()  # removing a paused hook leaves nothing behind
    handle.resume()  # nothing happens once removed
    optimizer.step()
    assert calls == ["ours", "user", "ours", "user"]
    users.remove()


def test_only_module_and_optimizer_hooks_pause() -> None:
    x = torch.ones(2, requires_grad=True)
    handle = register_tensor_hook(x, lambda g: None)
    with pytest.raises(TypeError, match="only module and optimizer hooks can be paused, not a 'tensor' hook"):
        handle.pause()
    handle.remove()
