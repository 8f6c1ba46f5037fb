"""watch(), Watch() and WatchOptions share one list of keywords: names, order, defaults and annotations agree."""

from __future__ import annotations

import dataclasses
import gc
import inspect
import typing
import weakref

import pytest
import torch
import torch.nn as nn

import hookscope
from hookscope.watch._options import WatchOptions


def _keywords(function: typing.Callable[..., object]) -> list[tuple[str, object, object]]:
    parameters = inspect.signature(function).parameters.values()
    return [(p.name, p.default, p.annotation) for p in parameters if p.kind == p.KEYWORD_ONLY]


def _fields() -> list[tuple[str, object, object]]:
    hints = typing.get_type_hints(WatchOptions)
    return [(f.name, f.default, hints[f.name]) for f in dataclasses.fields(WatchOptions)]


def test_watch_and_watch_class_list_every_option_field() -> None:
    fields = _fields()
    assert [name for name, _, _ in fields][:5] == ["select", "budget", "every", "max_steps", "train_only"]  # in order
    assert _keywords(hookscope.watch) == fields
    assert _keywords(hookscope.Watch) == fields


def test_positional_parameters_of_watch_and_watch_class() -> None:
    def positional(function: typing.Callable[..., object]) -> list[tuple[str, object]]:
        parameters = inspect.signature(function).parameters.values()
        return [(p.name, p.default) for p in parameters if p.kind == p.POSITIONAL_OR_KEYWORD]

    assert positional(hookscope.watch) == [("model", inspect.Parameter.empty), ("optimizer", None)]
    assert positional(hookscope.Watch) == [("model", None), ("optimizer", None)]


def test_every_option_is_documented_once_in_watch_docstring() -> None:
    doc = inspect.getdoc(hookscope.watch) or ""
    args = doc.split("Args:")[1].split("Returns:")[0]
    documented = [line.split(":")[0].strip() for line in args.splitlines() if line.startswith("    ") and ":" in line
                  and not line.startswith("        ")]  # fmt: skip
    assert documented == ["model", "optimizer", *[name for name, _, _ in _fields()]]
    assert doc.count("Args:") == 1


def test_options_reach_the_watch_and_unknown_keywords_fail() -> None:
    w = hookscope.watch(nn.Linear(2, 2), every=3, groups=["activations"], near_zero=1)
    assert (w.options.every, w.options.groups, w.options.near_zero) == (3, frozenset({"activations"}), 1.0)
    with pytest.raises(TypeError, match=r"^watch\(\) got an unexpected keyword argument 'evry'; did you mean every="):
        hookscope.watch(nn.Linear(2, 2), evry=3)
    with pytest.raises(TypeError, match=r"^Watch\(\) got an unexpected keyword argument 'evry'; did you mean every="):
        hookscope.Watch(nn.Linear(2, 2), evry=3)
    with pytest.raises(ValueError, match="every must be a positive int, got 0"):
        WatchOptions(every=0)


def test_options_do_not_keep_the_scaler_alive() -> None:
    """The watch reads the scaler through a weak reference, as before its options were gathered in one object."""
    scaler = torch.amp.GradScaler("cpu")
    w = hookscope.Watch(nn.Linear(2, 2), scaler=scaler)
    gone = weakref.ref(scaler)
    del scaler
    gc.collect()
    assert gone() is None and w.options.scaler is None
