"""steer.record: values per site and call, detached, offloaded, bounded by max_bytes, hooks gone after the block."""

from __future__ import annotations

import warnings
from collections import OrderedDict

import pytest
import torch
import torch.nn as nn

from hookscope import HookscopeWarning, list_hooks, steer


def _model() -> nn.Sequential:
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def test_outputs_and_inputs_match_a_manual_forward_and_are_detached() -> None:
    model = _model()
    x = torch.randn(3, 4)
    hidden = model[0](x)
    with steer.record(model, ["0", "2"]) as outputs, steer.record(model, "2", at="input") as inputs:
        model(x)
    assert list(outputs) == ["0", "2"] and len(outputs) == 2
    assert torch.equal(outputs["0"], hidden) and torch.equal(outputs["2"], model(x))
    assert torch.equal(inputs["2"], hidden.relu())
    assert outputs["0"].grad_fn is None and not outputs["0"].requires_grad


def test_calls_keeps_every_call_and_the_mapping_the_last() -> None:
    relu = nn.ReLU()
    model = nn.Sequential(nn.Linear(4, 4), relu, nn.Linear(4, 4), relu)  # the same ReLU twice per forward
    x = torch.randn(2, 4)
    with steer.record(model, "1") as rec:
        model(x)
        model(x)
    first = model[0](x).relu()
    second = model[2](first).relu()
    calls = rec.calls("1")
    assert len(calls) == 4 and torch.equal(calls[0], first) and torch.equal(calls[1], second)
    assert torch.equal(rec["1"], second)


def test_kwargs_only_input_and_tuple_output_are_recorded() -> None:
    class KeywordBlock(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 4)

        def forward(self, *, hidden: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, str]:
            return self.linear(hidden), "aux"

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = KeywordBlock()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.block(hidden=x, mask=None)[0]

    model, x = Outer(), torch.randn(2, 4)
    with steer.record(model, "block", at="input") as inputs, steer.record(model, "block") as outputs:
        out = model(x)
    assert torch.equal(inputs["block"], x) and torch.equal(outputs["block"], out)


def test_device_cpu_offloads() -> None:
    model = _model()
    with steer.record(model, "0", device="cpu") as rec:
        model(torch.randn(1, 4))
    assert rec["0"].device == torch.device("cpu")


def test_max_bytes_drops_a_whole_site_with_one_warning_and_never_breaks_the_forward() -> None:
    model = _model()
    x = torch.randn(3, 4)  # "0": 3*8*4 = 96 bytes, "2": 3*2*4 = 24 bytes
    expected = model[2](model[1](model[0](x)))
    with warnings.catch_warnings(record=True) as caught, steer.record(model, ["0", "2"], max_bytes=100) as rec:
        warnings.simplefilter("always")
        out = model(x)  # "0" is kept (96), "2" would make 120: left out
        assert torch.equal(out, expected)
        assert rec.dropped == ["2"] and "2" not in rec and "0" in rec and rec.bytes == 96
        model(x)  # a second call of "0" would make 192: "0" is left out whole (its first call released)
    messages = [str(w.message) for w in caught if issubclass(w.category, HookscopeWarning)]
    assert len(messages) == 2
    assert messages[0].startswith(
        "steer.record: site '2' is left out: keeping its value (24 bytes) would pass max_bytes=100"
    )
    assert messages[1].startswith("steer.record: site '0' is left out: keeping its value (96 bytes)")
    assert rec.dropped == ["2", "0"] and len(rec) == 0 and rec.bytes == 0
    with pytest.raises(KeyError, match="'0' was dropped: its values would pass max_bytes=100"):
        rec["0"]


def test_the_hooks_are_in_the_registry_tagged_steer_and_gone_after_the_block_even_on_error() -> None:
    model = _model()
    with pytest.raises(RuntimeError, match="boom"), steer.record(model, "0"):
        rows = [row for row in list_hooks(model) if row.is_hookscope]
        assert [(row.path, row.kind, row.tags) for row in rows] == [("0", "forward", ("steer",))]
        raise RuntimeError("boom")
    assert not list_hooks(model) and not model[0]._forward_hooks


def test_bad_arguments_are_refused() -> None:
    named = nn.Sequential(OrderedDict(encoder=nn.Linear(4, 4), decoder=nn.Linear(4, 4)))
    with (
        pytest.raises(
            ValueError, match=r"select must name an existing module path, got 'encodr'.*Closest module paths: 'encoder'"
        ),
        steer.record(named, "encodr"),
    ):
        pass
    model = _model()
    with (
        pytest.raises(ValueError, match="at must be one of 'input', 'output', got 'inputs'"),
        steer.record(model, "0", at="inputs"),
    ):
        pass
    with (
        pytest.raises(ValueError, match="max_bytes must be an int or None > 0, got 0"),
        steer.record(model, "0", max_bytes=0),
    ):
        pass
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with steer.record(model, "0") as rec:
            pass
    with pytest.raises(KeyError, match="'0' was never called while recording"):
        rec["0"]
