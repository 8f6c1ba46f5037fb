"""The registry: listing, removal by owner/tag/kind/path, nested scopes, weakref safety, no leaks."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
import torch.nn as nn
import torch.nn.modules.module as module_globals

from hookscope.hooks import (
    Hook,
    hook_output,
    list_hooks,
    register_global_module_hook,
    register_module_hook,
    register_output_grad_hook,
    remove_hooks,
    scope,
)
from hookscope.hooks._registry import REGISTRY


def _model() -> nn.Sequential:
    return nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1)))


def _noop(*args: object) -> None:
    return None


def test_list_hooks_lists_ours_and_counts_user_hooks() -> None:
    model = _model()
    user = model[0].register_forward_hook(_noop)
    user_param = model[0].weight.register_hook(lambda g: None)
    with scope():
        register_module_hook(model[2][1], "forward", _noop, owner="me", tags=("a",))
        register_output_grad_hook(model[0], lambda m, g, i: None)
        rows = list_hooks(model)
        ours = [(r.path, r.kind, r.owner, r.tags) for r in rows if r.is_hookscope]
        theirs = sorted((r.path, r.kind) for r in rows if not r.is_hookscope)
        assert sorted(ours) == [("0", "output_grad", "", ()), ("2.1", "forward", "me", ("a",))]
        assert theirs == [("0", "forward"), ("0.weight", "tensor")]
    assert [r.is_hookscope for r in list_hooks(model)] == [False, False]
    user.remove()
    user_param.remove()


def test_list_hooks_lists_every_kind_of_hook_anyone_placed() -> None:
    """Every hook torch lets a user place, module, parameter and global (each `register_module_*` function of
    torch.nn.modules.module), is listed as not hookscope's, and hookscope's own global hook as its own."""
    model = _model()
    placed = {  # kind -> torch's public registration, on the module, its weight, or for all modules
        "forward_pre": lambda: model[0].register_forward_pre_hook(_noop),
        "forward": lambda: model[0].register_forward_hook(_noop),
        "backward_pre": lambda: model[0].register_full_backward_pre_hook(_noop),
        "backward": lambda: model[0].register_full_backward_hook(_noop),
        "tensor": lambda: model[0].weight.register_hook(_noop),
        "post_accumulate_grad": lambda: model[0].weight.register_post_accumulate_grad_hook(_noop),
        "global_forward_pre": lambda: module_globals.register_module_forward_pre_hook(_noop),
        "global_forward": lambda: module_globals.register_module_forward_hook(_noop),
        "global_backward_pre": lambda: module_globals.register_module_full_backward_pre_hook(_noop),
        "global_backward": lambda: module_globals.register_module_full_backward_hook(_noop),
        "global_buffer_registration": lambda: module_globals.register_module_buffer_registration_hook(_noop),
        "global_module_registration": lambda: module_globals.register_module_module_registration_hook(_noop),
        "global_parameter_registration": lambda: module_globals.register_module_parameter_registration_hook(_noop),
    }
    before = {(r.path, r.kind) for r in list_hooks(model)}  # what other tests left, if anything
    handles = [register() for register in placed.values()]
    try:
        with scope():
            register_global_module_hook("forward_pre", _noop, owner="me")
            rows = [r for r in list_hooks(model) if (r.path, r.kind) not in before or r.is_hookscope]
            theirs = sorted((r.path, r.kind) for r in rows if not r.is_hookscope)
            ours = [(r.path, r.kind, r.owner) for r in rows if r.is_hookscope]
        where = {"tensor": "0.weight", "post_accumulate_grad": "0.weight"}
        expected = sorted((where.get(k, "<global>" if k.startswith("global_") else "0"), k) for k in placed)
        assert theirs == expected
        assert ours == [("<global>", "global_forward_pre", "me")]
    finally:
        for handle in handles:
            handle.remove()
    assert {(r.path, r.kind) for r in list_hooks(model)} == before


def test_remove_by_owner_tag_kind_and_path_glob() -> None:
    model = _model()
    owner = object.__new__(type("Owner", (), {}))
    handles = [
        register_module_hook(model[0], "forward", _noop, owner=owner),
        register_module_hook(model[2][0], "forward_pre", _noop, tags=("x",)),
        register_module_hook(model[2][1], "forward", _noop, tags=("x",)),
        register_module_hook(model[1], "backward", _noop),
    ]
    assert remove_hooks(owner=owner) == 1 and handles[0].is_removed
    assert remove_hooks(tag="x", kind="forward") == 1 and handles[2].is_removed
    assert remove_hooks(model=model, path="2.*") == 1 and handles[1].is_removed
    assert remove_hooks(model=model) == 1
    assert all(h.is_removed for h in handles)
    assert not [r for r in list_hooks(model) if r.is_hookscope]


def test_remove_hooks_needs_a_criterion() -> None:
    with pytest.raises(ValueError, match="remove_hooks needs at least one of owner, tag, kind, path or model"):
        remove_hooks()


def test_nested_scopes_remove_only_their_own_hooks() -> None:
    model = _model()
    fired: list[str] = []
    user = model[0].register_forward_hook(lambda *a: fired.append("user"))
    with scope():
        register_module_hook(model[0], "forward", lambda *a: fired.append("outer"))
        with scope():
            register_module_hook(model[0], "forward", lambda *a: fired.append("inner"))
            model(torch.randn(1, 2))
            assert fired == ["user", "outer", "inner"]
        fired.clear()
        model(torch.randn(1, 2))
        assert fired == ["user", "outer"]
    fired.clear()
    model(torch.randn(1, 2))
    assert fired == ["user"]
    user.remove()


@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyboardInterrupt()])
def test_scope_cleans_up_when_body_raises(error: BaseException) -> None:
    model = _model()
    before = len(REGISTRY)
    with pytest.raises(type(error)), scope():
        Hook(model[0], lambda m, i, o: o)
        register_global_module_hook("forward", _noop)
        raise error
    assert len(model[0]._forward_hooks) == 0
    assert len(REGISTRY) == before
    assert len(torch.nn.modules.module._global_forward_hooks) == 0


def test_hook_that_raises_propagates_and_scope_removes_hooks() -> None:
    model = _model()

    def bad(module: nn.Module, args: object, output: object) -> None:
        raise ValueError("inside hook")

    with pytest.raises(ValueError, match="inside hook"), scope():
        register_module_hook(model[2][0], "forward", bad)
        hook_output(model[0])
        model(torch.randn(1, 2))
    assert all(len(m._forward_hooks) == 0 for m in model.modules())


def test_forward_that_raises_halfway_leaves_no_hooks() -> None:
    model = nn.Sequential(nn.Linear(2, 3), nn.Linear(4, 1))  # second layer's shape is wrong
    stored: list[str] = []
    with pytest.raises(RuntimeError), scope():
        register_module_hook(model[0], "forward", lambda *a: stored.append("0"))
        register_module_hook(model[1], "forward", lambda *a: stored.append("1"), always_call=True)
        model(torch.randn(1, 2))
    assert stored == ["0", "1"]  # the always-call hook still ran on the failing layer
    assert all(len(m._forward_hooks) == 0 for m in model.modules())


def test_firing_order_follows_registration_and_prepend() -> None:
    lin = nn.Linear(1, 1)
    fired: list[int] = []
    with scope():
        register_module_hook(lin, "forward", lambda *a: fired.append(1))
        register_module_hook(lin, "forward", lambda *a: fired.append(2))
        register_module_hook(lin, "forward", lambda *a: fired.append(0), prepend=True)
        register_module_hook(lin, "forward_pre", lambda *a: fired.append(-1))
        lin(torch.zeros(1, 1))
    assert fired == [-1, 0, 1, 2]


def test_hook_that_removes_a_handle_during_a_call() -> None:
    lin = nn.Linear(1, 1)
    fired: list[str] = []
    handles = {}

    def first(*args: object) -> None:
        fired.append("first")
        handles["second"].remove()
        handles["first"].remove()

    handles["first"] = register_module_hook(lin, "forward", first)
    handles["second"] = register_module_hook(lin, "forward", lambda *a: fired.append("second"))
    lin(torch.zeros(1, 1))
    lin(torch.zeros(1, 1))
    assert fired == ["first", "second"]  # removed hooks still run in the call that removed them, never after
    assert len(lin._forward_hooks) == 0


def test_model_is_freed_after_remove_and_when_deleted_while_hooked() -> None:
    gc.collect()
    gc.disable()
    try:
        model = _model()
        ref = weakref.ref(model)
        hooks = [hook_output(m, grad=g) for m in model for g in (False, True)]
        model(torch.randn(2, 2)).sum().backward()
        for hook in hooks:
            hook.remove()
        del model
        assert ref() is None
        model = _model()
        ref = weakref.ref(model)
        kept = Hook(model[0], lambda m, i, o: o)
        count = len(REGISTRY)
        del model
        assert ref() is None
        assert len(REGISTRY) == count - 1  # the handle dropped out of the registry with its module
        assert kept.removed is False
    finally:
        gc.enable()


def test_thousand_attach_remove_cycles_leave_nothing_behind() -> None:
    model = _model()
    before = len(REGISTRY)
    x = torch.randn(4, 2)
    for _ in range(1000):
        with scope():
            hook_output(model[0])
            register_output_grad_hook(model[2][1], lambda m, g, i: None)
            model(x)
    assert len(REGISTRY) == before
    assert all(len(m._forward_hooks) == 0 and len(m._forward_pre_hooks) == 0 for m in model.modules())


def test_handle_is_a_context_manager_and_reports_state() -> None:
    lin = nn.Linear(1, 1)
    with register_module_hook(lin, "forward", _noop, path="lin") as handle:
        assert "active" in repr(handle) and handle.target is lin
    assert handle.is_removed and "removed" in repr(handle)
    with pytest.raises(ValueError, match="kind must be one of"):
        register_module_hook(lin, "sideways", _noop)
    with pytest.raises(ValueError, match="kind must be one of"):
        register_global_module_hook("backward_pre", _noop)


def test_global_hooks_of_every_kind_are_listed_whoever_placed_them() -> None:
    """torch's three global module hook dicts, filled directly (not through hookscope) and through hookscope."""
    model = _model()

    def global_rows() -> list[tuple[str, bool]]:
        return sorted((r.kind, r.is_hookscope) for r in list_hooks(model) if r.path == "<global>")

    before = global_rows()
    foreign = [
        torch.nn.modules.module.register_module_forward_pre_hook(_noop),
        torch.nn.modules.module.register_module_forward_hook(_noop),
        torch.nn.modules.module.register_module_full_backward_hook(_noop),
    ]
    try:
        with scope():
            register_global_module_hook("forward_pre", _noop)
            added = global_rows()
            for row in before:
                added.remove(row)
    finally:
        for handle in foreign:
            handle.remove()
    assert added == [
        ("global_backward", False),
        ("global_forward", False),
        ("global_forward_pre", False),
        ("global_forward_pre", True),
    ]
    assert global_rows() == before
