"""A run numbers its training batches once: drivers follow the count a watch keeps (its step state), so every
callback of the run sees the numbers the watch's steps have; without a watch, the driver counts them itself
(with a forward that raises: `tests/watch/test_step_rule.py`)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import hookscope
from hookscope import Callback
from hookscope.integrations._common import EventRelay


class Numbers(Callback):
    def __init__(self) -> None:
        self.started: list[int] = []
        self.ended: list[int] = []

    def on_batch_start(self, batch: int) -> None:
        self.started.append(batch)

    def on_batch_end(self, batch: int) -> None:
        self.ended.append(batch)


def test_the_batches_of_steps_a_watch_leaves_alone_are_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The watch's own driver stops following batches on steps the budget leaves alone (one batch a step, counted
    by the watch): the number it gives the next batch it follows is still the loop's."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    w = hookscope.Watch(model, opt)
    monkeypatch.setattr(type(w.stepper.budget), "_rule", lambda self, step, credit: step % 10 == 0)
    driver = w.attach()
    seen: list[int] = []
    with driver:
        for _ in range(25):
            model(torch.randn(4, 3)).sum().backward()
            opt.step()
            opt.zero_grad()
            seen.append(driver.batch)
            w.log_loss(0.0)
    measured = w.results().steps.tolist()
    assert measured[:3] == [0, 10, 20]  # the budget rule above (and the last step)
    assert seen[-1] == 24  # 25 batches, numbered from 0, whatever the driver saw
    assert seen[20] == 20  # a measured step after ten left alone has its loop number


def test_a_trainer_relay_follows_the_watch_and_a_saved_count() -> None:
    model, numbers = nn.Sequential(nn.Linear(3, 1)), Numbers()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    w = hookscope.Watch(every=1)
    relay = EventRelay((w, numbers), "Trainer")
    relay.fit_start(model, opt, True)
    for _ in range(3):  # as a trainer drives it: batch start, forward, backward, step, batch end
        relay.batch_start()
        model(torch.randn(4, 3)).sum().backward()
        opt.step()
        relay.batch_end()
    saved = relay.state_dict()
    relay.fit_end()
    assert numbers.started == [0, 1, 2]

    resumed_watch, resumed_numbers = hookscope.Watch(every=1), Numbers()
    resumed = EventRelay((resumed_watch, resumed_numbers), "Trainer")
    resumed.load_state_dict(saved)
    resumed.fit_start(model, opt, True)  # the watch's saved state applies when it starts
    assert resumed.batch == 2
    for _ in range(2):
        resumed.batch_start()
        model(torch.randn(4, 3)).sum().backward()
        opt.step()
        resumed.batch_end()
    resumed.fit_end()
    assert resumed_numbers.started == [3, 4]  # the watch's loaded count goes on
    assert resumed_watch.results().steps.tolist() == [0, 1, 2, 3, 4]
