"""The path of one activation's mean through watch(): from the forward hook to `WatchResults.activations`.

A reader follows a value from the hook to the results in the order the files are laid out; each cross-file call
on its way is a hop to read (issue 23). `trace_value_path` follows the value with `sys.setprofile`: one module of
the model outputs a marker constant (`MARK`, exact in float32 and float64), so every tensor that holds the marker
carries that module's values or statistics (its copy, its records, the step's chunk, the results). A hookscope
call is on the path when the marker flows through it (in an argument and out of its return), when it keeps the
marker (a method that takes it and returns nothing: the value is stored), when it makes the marker's next form
from what it holds (a table's rows), and when it is a caller of such a call below the outermost `hookscope.watch`
frame (the forward hook, the end of a root forward, or `Watch.results`). Each cross-file call on that path
(caller function -> callee function) is counted once, in the order first made.

`python tests/watch/test_value_path.py` prints the path.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
import types
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn

import hookscope
from hookscope.stats._tables import RecordTable
from hookscope.watch import watch

MARK = 0.8125
"""Every value of the marked module's output (exact in float32 and float64; no other tensor of the run has it)."""
MAX_HOPS = 11
"""The most cross-file calls the path may take: the count this layout reaches (18 before issue 23's layout)."""

PACKAGE = Path(hookscope.__file__).resolve().parent
Edge = tuple[str, str]  # (caller, callee), each "file:function"


class MarkedActivation(nn.Module):
    """Output `MARK` everywhere, shaped as the input, and pass the gradient straight through; watched by default
    (a leaf whose class name ends with `Activation`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - x.detach()) + MARK  # exactly MARK: x - x is 0


def marked_model() -> nn.Sequential:
    torch.manual_seed(0)
    # last: no later hook of the forward sees the marker staged in the forward's frame
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3), MarkedActivation())


MARKED = "3"  # the marked module's path


def train_and_read(steps: int = 3) -> Any:
    """`steps` measured steps of `watch(model, opt, every=1)` on the marked model, then `results()`."""
    model = marked_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, target = torch.randn(16, 4), torch.randn(16, 3)
    with watch(model, opt, every=1) as w:
        for _ in range(steps):
            opt.zero_grad()
            (model(x) * target).mean().backward()
            opt.step()
        return w.results()


def _holds(value: Any, depth: int = 6) -> bool:
    """Whether `value` (a tensor, a container of them, a dataclass or a slotted hookscope record) holds `MARK`."""
    if isinstance(value, torch.Tensor):
        if not value.is_floating_point() or value.layout != torch.strided or value.is_meta or not value.numel():
            return False
        with torch.no_grad():
            return bool((value == MARK).any())
    if depth == 0 or isinstance(value, (str, bytes, int, float, bool, type(None), types.FunctionType)):
        return False
    if isinstance(value, dict):
        return any(_holds(v, depth - 1) for v in list(value.values())[:256])
    if isinstance(value, (list, tuple)):
        return any(_holds(v, depth - 1) for v in value[:256])
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return any(_holds(getattr(value, f.name), depth - 1) for f in dataclasses.fields(value))
    slots = getattr(type(value), "__slots__", ())
    if slots and type(value).__module__.startswith("hookscope."):
        return any(_holds(getattr(value, name, None), depth - 1) for name in slots)
    return False


class PathTracer:
    """A `sys.setprofile` function that collects the cross-file calls on the marker's path.

    Args:
        extra: Files outside hookscope whose functions count as steps of the path too (named by file name).
    """

    def __init__(self, extra: Iterable[str] = ()) -> None:
        self.edges: dict[Edge, None] = {}  # in the order first made
        self._extra = {str(Path(f).resolve()) for f in extra}
        self._names: dict[types.CodeType, str | None] = {}
        self._carrying: set[types.FrameType] = set()  # frames that took the marker in an argument

    def __call__(self, frame: types.FrameType, event: str, arg: Any) -> None:
        if event == "call" and self._where(frame) is not None:
            code = frame.f_code
            names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
            if any(_holds(frame.f_locals.get(n)) for n in names if n not in ("self", "cls")):
                self._carrying.add(frame)
        elif event == "return" and frame in self._carrying:
            self._carrying.discard(frame)
            keeps = arg is None and frame.f_code.co_varnames[:1] == ("self",)
            if keeps or _holds(arg):
                self._on_path(frame)
        elif event == "return" and self._where(frame) is not None and _holds(arg):
            self._on_path(frame)

    def _where(self, frame: types.FrameType) -> str | None:
        """`file:function` of a counted frame (relative to the package), `None` for any other frame."""
        code = frame.f_code
        if code in self._names:
            return self._names[code]
        if not Path(code.co_filename).is_absolute():  # a generated function (a dataclass's __init__): its class's
            owner = frame.f_locals.get("self")
            module = sys.modules.get(type(owner).__module__) if owner is not None else None
            return self._name(getattr(module, "__file__", None) or "", code)
        name = self._names[code] = self._name(code.co_filename, code)
        return name

    def _name(self, filename: str, code: types.CodeType) -> str | None:
        path = Path(filename).resolve()
        if path.is_relative_to(PACKAGE):
            return f"{path.relative_to(PACKAGE).as_posix()}:{code.co_qualname}"
        return f"{path.name}:{code.co_qualname}" if str(path) in self._extra else None

    def _on_path(self, frame: types.FrameType) -> None:
        """Count the cross-file calls from the outermost `hookscope.watch` frame down to `frame`."""
        names: list[str] = []
        current: types.FrameType | None = frame
        top = 0
        while current is not None:
            name = self._where(current)
            if name is not None:
                names.append(name)
                top = len(names) if name.startswith("watch/") else top
            current = current.f_back
        chain = names[:top][::-1]
        for caller, callee in itertools.pairwise(chain):
            if caller.split(":")[0] != callee.split(":")[0]:
                self.edges.setdefault((caller, callee), None)


def trace_value_path(run: Callable[[], Any], extra: Iterable[str] = ()) -> tuple[list[Edge], Any]:
    """The cross-file calls on the marker's path while `run()` runs (in the order first made), and its result."""
    tracer = PathTracer(extra)
    previous = sys.getprofile()
    sys.setprofile(tracer)
    try:
        result = run()
    finally:
        sys.setprofile(previous)
    return list(tracer.edges), result


def draw(edges: list[Edge]) -> str:
    """The path as numbered lines `caller -> callee`, then its files in the order first reached."""
    lines = [f"{k:2d}. {caller} -> {callee}" for k, (caller, callee) in enumerate(edges, 1)]
    return "\n".join([*lines, f"{len(edges)} cross-file calls through: {' > '.join(_files(edges))}"])


def _files(edges: list[Edge]) -> Iterator[str]:
    return iter(dict.fromkeys(name.split(":")[0] for edge in edges for name in edge))


@pytest.fixture(scope="module")
def warm() -> None:
    train_and_read()  # first calls import lazily: keep them out of the traced run (and its time)


def test_the_mean_goes_from_the_forward_hook_to_the_results_in_at_most_max_hops(warm: None) -> None:
    edges, results = trace_value_path(train_and_read)
    assert results.activations[MARKED]["mean"].tolist() == [MARK] * 3  # the oracle: a constant output's mean
    assert edges, "the marker was not followed"
    assert edges[0][0].startswith("watch/_recorder.py:Recorder.")  # from the forward hook
    assert edges[-1][1] == "watch/_assemble.py:build_results"  # to the results
    assert len(edges) <= MAX_HOPS, f"the value path grew past {MAX_HOPS} cross-file calls:\n{draw(edges)}"


def test_the_count_sees_a_forwarding_layer_added_to_the_path(warm: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A layer that only forwards (here, this file between the recorder and the table) costs one more hop."""
    edges, _ = trace_value_path(train_and_read)
    stage = RecordTable.stage

    def forwarding(self: RecordTable, *args: Any, **kwargs: Any) -> Any:
        return stage(self, *args, **kwargs)

    monkeypatch.setattr(RecordTable, "stage", forwarding)
    longer, results = trace_value_path(train_and_read, extra=[__file__])
    assert results.activations[MARKED]["mean"].tolist() == [MARK] * 3
    added = {edge for edge in longer if "test_value_path.py" in edge[0] + edge[1]}
    assert len(longer) == len(edges) + 1 and len(added) == 2, draw(longer)


if __name__ == "__main__":
    found, _ = trace_value_path(train_and_read)
    print(draw(found))
