"""`hookscope._torch`: each private PyTorch reliance is checked, and a torch that changed it gives ONE warning naming
what stops working (then the documented fallback), never a silent gap. Each test takes the probed internal away
(as a torch release might) and checks the warning, its count and the fallback against what torch itself does."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.modules.module as module_globals

import hookscope
from hookscope import _torch
from hookscope._errors import TorchInternalsWarning
from hookscope.callbacks import Callback, LoopDriver
from hookscope.callbacks._steps import in_backward
from hookscope.hooks import normalize_path
from hookscope.hooks._guards import is_compiled
from hookscope.hooks._select import unwrap
from hookscope.watch import watch


@pytest.fixture(autouse=True)
def fresh_checks() -> Iterator[None]:
    _torch.forget_checks()
    yield
    _torch.forget_checks()  # the next test sees the real torch again, checked anew


def warned_once(call: Callable[[], Any], match: str) -> Any:
    """Call `call` twice; exactly one TorchInternalsWarning matching `match` in all; return the first result."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = call()
        call()
    ours = [w for w in caught if issubclass(w.category, TorchInternalsWarning)]
    assert len(ours) == 1, [str(w.message) for w in ours]
    message = str(ours[0].message)
    assert "private PyTorch API" in message and torch.__version__ in message, message
    assert match in message, message
    return first


def test_every_reliance_holds_on_the_pinned_torch_without_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert all(_torch.is_available(key) for key in _torch.RELIANCES)
    with pytest.raises(KeyError):
        _torch.is_available("no such reliance")


def _in_backward_from_a_hook() -> list[bool]:
    seen: list[bool] = []
    x = torch.ones(2, requires_grad=True)
    out = x * 2
    out.register_hook(lambda grad: seen.append(in_backward()))  # type: ignore[no-untyped-call]
    out.sum().backward()  # type: ignore[no-untyped-call]
    return [*seen, in_backward()]


def test_graph_task_id_missing_warns_and_recomputations_are_not_recognized(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _in_backward_from_a_hook() == [True, False]  # inside the backward, then outside
    _torch.forget_checks()  # checked at first use: a torch that changed is a new process, checked anew
    monkeypatch.delattr(torch._C, "_current_graph_task_id")
    assert warned_once(_torch.graph_task_id, "checkpoint recomputation") == -1
    assert _in_backward_from_a_hook() == [False, False]  # no longer recognized, as the warning said


def test_execution_engine_missing_warns_and_after_backward_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    class Count(Callback):
        def __init__(self) -> None:
            self.after = 0

        def after_backward(self) -> None:
            self.after += 1

    def run() -> int:
        model, count = nn.Linear(2, 1), Count()
        driver = LoopDriver([count], model)
        model(torch.ones(3, 2)).sum().backward()
        driver.detach()
        return count.after

    assert run() == 1
    _torch.forget_checks()
    engine = torch.autograd.Variable._execution_engine

    class WithoutQueue:  # the engine of a torch that dropped queue_callback (backward itself still runs)
        def __getattr__(self, name: str) -> Any:
            if name == "queue_callback":
                raise AttributeError(name)
            return getattr(engine, name)

    monkeypatch.setattr(torch.autograd.Variable, "_execution_engine", WithoutQueue())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert run() == 0 and run() == 0
    messages = [str(w.message) for w in caught if issubclass(w.category, TorchInternalsWarning)]
    assert len(messages) == 1 and "after_backward events no longer fire" in messages[0]


def test_grad_scaler_that_clears_its_state_in_place_is_caught_by_the_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """If torch cleared `_per_optimizer_states` in place at update() instead of replacing it, skipped steps would go
    unseen by identity: the probe sees it, warns once, and the watch says its norms stay scaled."""
    update = torch.amp.GradScaler.update

    def clearing_update(self: torch.amp.GradScaler, new_scale: Any = None) -> None:
        states = self._per_optimizer_states
        update(self, new_scale)
        states.clear()
        self._per_optimizer_states = states

    monkeypatch.setattr(torch.amp.GradScaler, "update", clearing_update)
    scaler = torch.amp.GradScaler("cpu")
    assert warned_once(lambda: _torch.scaler_states(scaler), "steps the scaler skips are counted as steps") is None
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch(model, optimizer, scaler=scaler) as w:
        scaler.scale(model(torch.ones(4, 2)).sum()).backward()
        scaler.step(optimizer)
        scaler.update()
    assert w.results().meta["grad_scaler"] == "scaled (GradScaler unreadable)"


def test_grad_scaler_without_scale_attribute_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    init = torch.amp.GradScaler.__init__

    def renaming_init(self: torch.amp.GradScaler, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.__dict__["_scale_v2"] = self.__dict__.pop("_scale", None)

    monkeypatch.setattr(torch.amp.GradScaler, "__init__", renaming_init)
    monkeypatch.setattr(torch.amp.GradScaler, "_lazy_init_scale_growth_tracker", lambda self, dev: None)
    scaler = torch.amp.GradScaler("cpu")
    assert warned_once(lambda: _torch.scaler_scale(scaler), "stay multiplied by the loss scale") is None


def test_is_view_missing_warns_and_every_gradient_is_copied(monkeypatch: pytest.MonkeyPatch) -> None:
    base = torch.zeros(4)
    assert _torch.is_view(base[:2]) and not _torch.is_view(base)
    _torch.forget_checks()
    monkeypatch.setattr(torch.Tensor, "_is_view", None)  # defined on torch._C.TensorBase: shadowed, not callable
    assert warned_once(lambda: _torch.is_view(base), "copied before it is described") is True


def test_foreach_missing_warns_and_copies_one_tensor_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(torch, "_foreach_copy_")
    sources = [torch.arange(3.0), torch.full((2, 2), 7.0)]
    targets = [torch.zeros(3), torch.zeros(2, 2)]
    warned_once(lambda: _torch.foreach_copy_(targets, sources), "one tensor at a time")
    assert all(torch.equal(t, s) for t, s in zip(targets, sources, strict=True))
    _torch.foreach_sub_(targets, sources)
    assert all(torch.equal(t, torch.zeros_like(s)) for t, s in zip(targets, sources, strict=True))


def test_flatten_missing_warns_and_concatenates_from_python(monkeypatch: pytest.MonkeyPatch) -> None:
    tensors = [torch.arange(6.0).view(2, 3).t(), torch.full((2,), 7, dtype=torch.int64), torch.ones(1, 1)]
    wanted = torch.tensor([0.0, 3.0, 1.0, 4.0, 2.0, 5.0, 7.0, 7.0, 1.0])  # each flattened in order, promoted
    assert torch.equal(_torch.flatten(tensors), wanted)
    _torch.forget_checks()
    monkeypatch.delattr(torch._C._nn, "flatten_dense_tensors")
    assert torch.equal(warned_once(lambda: _torch.flatten(tensors), "one reshape each"), wanted)


def test_module_hook_dict_renamed_warns_instead_of_listing_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    model = nn.Sequential(nn.Linear(2, 2))
    model[0].register_forward_hook(lambda *args: None)
    assert [r.kind for r in hookscope.list_hooks(model)] == ["forward"]
    _torch.forget_checks()
    init = nn.Module.__init__

    def renaming_init(self: nn.Module, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.__dict__["_forward_hooks_v2"] = self.__dict__.pop("_forward_hooks")

    monkeypatch.setattr(nn.Module, "__init__", renaming_init)
    rows = warned_once(lambda: hookscope.list_hooks(model), "list_hooks no longer lists hooks")
    assert rows == []  # said, not silent


def test_tensor_hook_dict_moved_warns(monkeypatch: pytest.MonkeyPatch) -> None:
    elsewhere: dict[int, Any] = {}

    def moved(self: torch.Tensor, hook: Any) -> Any:
        handle = torch.utils.hooks.RemovableHandle(elsewhere)
        elsewhere[handle.id] = hook
        return handle

    monkeypatch.setattr(torch.Tensor, "register_hook", moved)
    assert warned_once(lambda: _torch.tensor_hooks(torch.zeros(1)), "on parameters") == {}


def test_global_hook_dict_renamed_warns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(module_globals, "_global_forward_pre_hooks")
    assert warned_once(lambda: hookscope.list_hooks(nn.Linear(1, 1)), "global module hooks") == []


def test_compiled_call_impl_missing_warns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(nn.Module, "_compiled_call_impl")
    assert warned_once(lambda: is_compiled(nn.Linear(1, 1)), "module.compile()") is False


def test_modules_dict_missing_warns_and_children_are_listed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    shared = nn.Linear(1, 1)
    model = nn.Sequential(shared, shared)
    assert [name for name, _ in _torch.children(model)] == ["0", "1"]
    _torch.forget_checks()
    monkeypatch.setattr(nn.Sequential, "__init__", _renamed_modules(nn.Sequential.__init__))
    probe = warned_once(lambda: _torch.children(model), "shown once")
    assert [name for name, _ in probe] == ["0"]  # named_children(): the public fallback


def _renamed_modules(init: Callable[..., None]) -> Callable[..., None]:
    def renamed(self: nn.Module, *args: Any) -> None:
        init(self, *args)
        object.__setattr__(self, "_modules_v2", self.__dict__.pop("_modules"))

    return renamed


def test_a_wrapper_without_its_attribute_warns_once_and_stays_wrapped() -> None:
    inner = nn.Linear(2, 2)
    compiled = torch.compile(inner, backend="eager")
    assert unwrap(compiled) is inner and normalize_path("_orig_mod.weight") == "weight"
    broken = type("OptimizedModule", (nn.Module,), {})()
    assert warned_once(lambda: unwrap(broken), "OptimizedModule._orig_mod") is broken


def test_aten_ops_missing_are_named_in_one_warning() -> None:
    names = ("relu", "_no_such_op_in_torch")
    ops = warned_once(lambda: _torch.aten_ops(names, "FLOPs"), "_no_such_op_in_torch")
    assert ops == [torch.ops.aten.relu]


def test_probe_failures_never_raise_into_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> bool:
        raise RuntimeError("torch changed")

    monkeypatch.setitem(_torch.RELIANCES, "is_view", _torch.Reliance("x", "y", broken))
    with pytest.warns(TorchInternalsWarning, match="changed x"):
        assert _torch.is_available("is_view") is False
