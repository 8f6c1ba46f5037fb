"""A summary shows the progress of its forward on a terminal (modules run / modules with a forward), clears it, and
gives the same summary as without; off a terminal, or with `progress=False`, nothing is written."""

from __future__ import annotations

import io
import sys

import pytest
import torch
import torch.nn as nn

import hookscope._progress as progress_module
from fake_terminal import Terminal, counts, is_clear
from hookscope import summary


@pytest.fixture
def every_drawing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Draw at every count (no delay, no interval), so a fast forward shows each module."""
    monkeypatch.setattr(progress_module, "DELAY", 0.0)
    monkeypatch.setattr(progress_module, "INTERVAL", 0.0)


class Net(nn.Module):
    """Modules with a forward: the root, 3 Linear, 1 ReLU (called 3 times), `unused` (never called): 6, 5 of
    which run. `layers` (a ModuleList) has no forward."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
        self.act = nn.ReLU()
        self.unused = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = self.act(layer(x))
        return x


def test_on_a_terminal_the_forward_counts_its_modules_and_clears_the_line(
    monkeypatch: pytest.MonkeyPatch, every_drawing: None
) -> None:
    model = Net()
    quiet = summary(model, input_size=(2, 4), progress=False)  # the oracle: the same summary without a line
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    shown = summary(model, input_size=(2, 4))
    # Each module counts once, when its forward first completes: layers.0, act, layers.1, layers.2, the root.
    assert counts(terminal.getvalue(), "modules") == [(1, 6), (2, 6), (3, 6), (4, 6), (5, 6), (5, 6)]
    assert is_clear(terminal.getvalue())
    assert shown.to_text() == quiet.to_text() and shown.rows == quiet.rows


def test_a_transformer_counts_what_plain_forward_hooks_see(
    monkeypatch: pytest.MonkeyPatch, every_drawing: None
) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=50, n_positions=16)
    model = transformers.GPT2LMHeadModel(config).eval()
    tokens = torch.randint(0, 50, (1, 8))
    with_forward = [m for m in model.modules() if type(m).forward is not nn.Module.forward]
    ran: set[int] = set()
    handles = [m.register_forward_hook(lambda m, a, o: ran.add(id(m))) for m in with_forward]
    with torch.no_grad():
        model(tokens)
    for handle in handles:
        handle.remove()
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    summary(model, tokens)
    drawn = counts(terminal.getvalue(), "modules")
    assert drawn[-1] == (len(ran), len(with_forward))
    assert [done for done, _ in drawn[:-1]] == list(range(1, len(ran) + 1))  # one more at each module's first end
    assert is_clear(terminal.getvalue())


@pytest.mark.parametrize(("stream", "progress"), [(io.StringIO(), None), (Terminal(), False)])
def test_off_a_terminal_or_turned_off_nothing_is_written(
    monkeypatch: pytest.MonkeyPatch, every_drawing: None, stream: io.StringIO, progress: bool | None
) -> None:
    monkeypatch.setattr(sys, "stderr", stream)
    summary(Net(), input_size=(2, 4), progress=progress)
    assert stream.getvalue() == ""


def test_the_line_is_cleared_when_forward_fails(monkeypatch: pytest.MonkeyPatch, every_drawing: None) -> None:
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(5, 4))
    with pytest.raises(RuntimeError, match="failed in module '1'"):
        summary(model, input_size=(2, 4))
    assert counts(terminal.getvalue(), "modules")[0] == (1, 3) and is_clear(terminal.getvalue())


def test_progress_must_be_a_bool_or_none() -> None:
    with pytest.raises(TypeError, match=r"progress must be a bool \(True or False\) or None, got 1"):
        summary(Net(), input_size=(2, 4), progress=1)


def test_asking_for_progress_without_rich_warns_at_the_callers_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "rich", None)
    with pytest.warns(Warning, match="progress=True needs rich") as caught:
        summary(Net(), input_size=(2, 4), progress=True)
    assert caught[0].filename == __file__
