"""RELIABILITY.md group A (lifecycle and removal) and G7 (threads), on the hook primitives."""

from __future__ import annotations

import gc
import threading
import tracemalloc
import weakref

import pytest
import torch
import torch.nn as nn

from hookscope.hooks import Hook, Hooks, hook_output, hook_outputs, register_module_hook, scope
from hookscope.hooks._registry import REGISTRY


def _model() -> nn.Sequential:
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def _sizes(model: nn.Module) -> list[int]:
    return [len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) for m in model.modules()]


def test_a1_user_hook_raising_inside_a_scope_restores_hook_dicts() -> None:
    model = _model()
    before = _sizes(model)

    def explode(*args: object) -> None:
        raise RuntimeError("user hook failed")

    with pytest.raises(RuntimeError, match="user hook failed"), scope():
        hook_outputs(model, grad=True)
        register_module_hook(model[1], "forward", explode)
        model(torch.randn(2, 4))
    assert _sizes(model) == before


def test_a2_forward_raising_halfway_runs_always_call_hooks_with_none_output() -> None:
    class Half(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("halfway")

    model = nn.Sequential(nn.Linear(2, 2), Half())
    outputs: list[object] = []
    with pytest.raises(ValueError, match="halfway"), scope():
        register_module_hook(model[1], "forward", lambda m, a, o: outputs.append(o), always_call=True)
        model(torch.randn(1, 2))
    assert outputs == [None]
    assert _sizes(model) == [0, 0, 0]


def test_a3_removing_twice_is_a_no_op_and_records_are_not_duplicated() -> None:
    model = _model()
    hook = hook_output(model[0])
    model(torch.randn(3, 4))
    first = hook.stored
    hook.remove()
    hook.remove()
    model(torch.randn(3, 4))
    assert hook.stored is first
    assert _sizes(model) == [0, 0, 0, 0]


def test_a4_inner_scope_leaves_user_hook_and_outer_scope_firing() -> None:
    model = _model()
    fired: list[str] = []
    user = model[0].register_forward_hook(lambda *a: fired.append("user"))
    with scope():
        register_module_hook(model[0], "forward", lambda *a: fired.append("outer"))
        with scope():
            register_module_hook(model[0], "forward", lambda *a: fired.append("inner"))
        model(torch.randn(1, 4))
    model(torch.randn(1, 4))
    assert fired == ["user", "outer", "user"]
    user.remove()


def test_a5_hook_removing_another_handle_mid_call() -> None:
    lin = nn.Linear(1, 1)
    fired: list[str] = []
    later = register_module_hook(lin, "forward", lambda *a: fired.append("later"))
    first = register_module_hook(lin, "forward", lambda *a: (fired.append("first"), later.remove()), prepend=True)
    lin(torch.zeros(1, 1))
    lin(torch.zeros(1, 1))
    first.remove()
    assert fired == ["first", "later", "first"]


def test_a6_prepended_hook_sees_output_before_a_steering_hook_edits_it() -> None:
    lin = nn.Linear(2, 2)
    seen: dict[str, torch.Tensor] = {}
    with scope():
        register_module_hook(lin, "forward", lambda m, a, o: o * 0)  # steering: replaces the output
        register_module_hook(lin, "forward", lambda m, a, o: seen.__setitem__("after", o))
        register_module_hook(lin, "forward", lambda m, a, o: seen.__setitem__("before", o), prepend=True)
        out = lin(torch.ones(1, 2))
    assert torch.equal(out, torch.zeros(1, 2)) and torch.equal(seen["after"], torch.zeros(1, 2))
    assert torch.allclose(seen["before"], lin(torch.ones(1, 2)))


def test_a7_no_cycle_through_bound_method_hooks() -> None:
    gc.collect()
    gc.disable()
    try:
        model = _model()
        ref = weakref.ref(model)
        hooks = Hooks(model, lambda m, i, o: o.mean())
        model(torch.randn(2, 4))
        hooks.remove()
        del model
        assert ref() is None
    finally:
        gc.enable()


def test_a8_thousand_cycles_keep_memory_and_handle_count_flat() -> None:
    lin = nn.Linear(2, 2)
    x = torch.randn(1, 2)
    before = len(REGISTRY)

    def cycle(n: int) -> None:
        for _ in range(n):
            with hook_output(lin), hook_output(lin, grad=True):
                lin(x).sum().backward()

    tracemalloc.start()
    cycle(300)  # warm-up: first-use allocations in torch and the interpreter
    gc.collect()
    start = tracemalloc.get_traced_memory()[0]
    cycle(1000)
    gc.collect()
    growth = tracemalloc.get_traced_memory()[0] - start
    tracemalloc.stop()
    assert len(REGISTRY) == before
    assert len(lin._forward_hooks) == 0
    assert growth < 8 * 1024, f"{growth} bytes kept by 1000 attach/remove cycles"


def test_g7_threads_running_forward_on_a_shared_hooked_model_lose_no_calls() -> None:
    model = _model()
    counts = {"calls": 0}
    lock = threading.Lock()

    def count(*args: object) -> None:
        with lock:
            counts["calls"] += 1

    def worker() -> None:
        for _ in range(50):
            model(torch.randn(2, 4))

    with scope():
        register_module_hook(model[0], "forward", count)
        threads = [threading.Thread(target=worker) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert counts["calls"] == 8 * 50


def test_scopes_in_threads_do_not_capture_each_others_hooks() -> None:
    lin = nn.Linear(1, 1)
    ready, release = threading.Event(), threading.Event()
    handles: list[object] = []

    def other() -> None:
        handles.append(register_module_hook(lin, "forward", lambda *a: None))
        ready.set()
        release.wait(5)

    thread = threading.Thread(target=other)
    with scope():
        thread.start()
        ready.wait(5)
    release.set()
    thread.join()
    assert len(lin._forward_hooks) == 1  # the other thread's hook was not in this thread's scope
    Hook.remove(type("H", (), {"handle": handles[0]})())  # type: ignore[arg-type]
    assert len(lin._forward_hooks) == 0


def test_g3_g4_deepcopy_and_torch_save_of_a_hooked_model_carry_no_hookscope_state(tmp_path: object) -> None:
    import copy
    import io

    model = _model()
    x = torch.randn(2, 4)
    with hook_output(model[0]) as forward, hook_output(model[2], grad=True) as backward:
        twin = copy.deepcopy(model)
        twin(x).sum().backward()  # the copy's hooks are inert: nothing lands in the original's hooks
        assert forward.stored is None and backward.stored is None
        buffer = io.BytesIO()
        torch.save(model, buffer)  # succeeds without serializing stored data
        model(x).sum().backward()
        assert forward.stored is not None and backward.stored is not None
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)  # our own bytes, written just above
    assert torch.allclose(loaded(x), model(x))


def test_a7_output_grad_hook_does_not_keep_a_detached_module_alive() -> None:
    gc.collect()
    gc.disable()
    try:
        lin = nn.Linear(2, 2)
        ref = weakref.ref(lin)
        with hook_output(lin, grad=True):
            lin(torch.randn(1, 2)).sum().backward()
        del lin
        assert ref() is None
    finally:
        gc.enable()
