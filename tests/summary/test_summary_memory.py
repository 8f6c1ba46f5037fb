"""The training-step memory estimate against measured allocations: the CPU allocator as torch's profiler sees it
(each allocation and free), and on a lent GPU the CUDA caching allocator's counters."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile

from hookscope.summary import summary
from hookscope.summary._memory import OPTIMIZER_STATES


def cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(inplace=True),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.Tanh(),
        nn.Flatten(),
        nn.Linear(8 * 8 * 8, 10),
    ).train()


def cpu_net_bytes(fn: Callable[[], Any]) -> tuple[Any, int, int]:
    """Run `fn`; return its result, the bytes it left allocated (allocations minus frees, as profiled) and how far
    that may be from the tensors' own bytes (none on the CPU: each allocation is its tensor's size)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    return result, sum(event.self_cpu_memory_usage for event in prof.key_averages()), 0


ROUNDING = 512
"""The CUDA caching allocator's block: every allocation takes a whole number of them (at least one)."""


def cuda_net_bytes(fn: Callable[[], Any]) -> tuple[Any, int, int]:
    """As `cpu_net_bytes`, from the CUDA caching allocator's counters: each allocation made may hold up to
    `ROUNDING - 1` bytes more than its tensor."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()
    result = fn()
    torch.cuda.synchronize()
    after = torch.cuda.memory_stats()
    made = after["allocation.all.allocated"] - before["allocation.all.allocated"]
    net = after["allocated_bytes.all.current"] - before["allocated_bytes.all.current"]
    return result, net, (ROUNDING - 1) * made


DEVICES = [
    pytest.param("cpu", cpu_net_bytes, id="cpu"),
    pytest.param(
        "cuda",
        cuda_net_bytes,
        id="cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU"),
    ),
]


@pytest.mark.parametrize(("device", "net_bytes"), DEVICES)
def test_saved_activations_and_gradients_match_measured_allocations(
    device: str, net_bytes: Callable[[Callable[[], Any]], tuple[Any, int, int]]
) -> None:
    """The estimate counts the tensors' bytes: on the CPU it is what was allocated, on CUDA what was allocated
    less the allocator's rounding (at most a block less a byte per allocation)."""
    model = cnn().to(device)
    x = torch.rand(4, 3, 8, 8, device=device)
    s = summary(model, x, with_backward=True)
    memory = s.memory
    assert memory is not None and s.run_mode == "train" and "with gradients" in str(s).splitlines()[0]
    out, forward, forward_slack = net_bytes(lambda: model(x))
    saved = forward - out.numel() * out.element_size()  # what the forward left behind, besides its output
    assert memory.saved_bytes > 0 and 0 <= saved - memory.saved_bytes <= forward_slack
    _, backward, backward_slack = net_bytes(lambda: out.sum().backward())  # allocates the gradients, frees what
    # was saved
    assert abs(memory.gradient_bytes - (backward + saved)) <= forward_slack + backward_slack
    assert memory.gradient_bytes == sum(p.grad.numel() * p.grad.element_size() for p in model.parameters())
    assert memory.param_bytes == sum(p.numel() * p.element_size() for p in model.parameters())
    assert memory.input_bytes == x.numel() * x.element_size()


def optimizers() -> list[tuple[str, Callable[[list[nn.Parameter]], torch.optim.Optimizer]]]:
    return [
        ("sgd", lambda ps: torch.optim.SGD(ps, lr=0.1)),
        ("sgd_momentum", lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)),
        ("adam", lambda ps: torch.optim.Adam(ps)),
        ("adam_amsgrad", lambda ps: torch.optim.AdamW(ps, amsgrad=True)),
        ("adamw", lambda ps: torch.optim.AdamW(ps)),
        ("adamax", lambda ps: torch.optim.Adamax(ps)),
        ("nadam", lambda ps: torch.optim.NAdam(ps)),
        ("radam", lambda ps: torch.optim.RAdam(ps)),
        ("rmsprop", lambda ps: torch.optim.RMSprop(ps, momentum=0.9, centered=True)),
        ("adagrad", lambda ps: torch.optim.Adagrad(ps)),
        ("adadelta", lambda ps: torch.optim.Adadelta(ps)),
        ("asgd", lambda ps: torch.optim.ASGD(ps)),
        ("rprop", lambda ps: torch.optim.Rprop(ps)),
    ]


def test_optimizer_state_matches_what_a_real_step_allocates() -> None:
    assert {name for name, _ in optimizers()} == set(OPTIMIZER_STATES)
    model = cnn()
    model[0].requires_grad_(False)  # frozen parameters have no state
    x = torch.rand(2, 3, 8, 8)
    trainable = [p for p in model.parameters() if p.requires_grad]
    for name, make in optimizers():
        estimate = summary(model, x, optimizer=make(trainable)).memory
        assert estimate is not None and estimate.optimizer == name
        model(x).sum().backward()

        def first_step(make: Callable[[list[nn.Parameter]], torch.optim.Optimizer] = make) -> torch.optim.Optimizer:
            optimizer = make(trainable)  # Adagrad makes its state here, the others at their first step
            optimizer.step()
            return optimizer

        optimizer, allocated, _ = cpu_net_bytes(first_step)
        state = [v for per_param in optimizer.state.values() for v in per_param.values() if torch.is_tensor(v)]
        assert estimate.optimizer_bytes == allocated == sum(v.numel() * v.element_size() for v in state), name
        model.zero_grad(set_to_none=True)
    by_name = summary(model, x, optimizer="Adam").memory
    # Adam: two moments the size of each trainable parameter, and a float32 step per parameter
    assert by_name is not None and by_name.optimizer_bytes == 2 * by_name.gradient_bytes + 4 * len(trainable)


def test_memory_lines_in_the_footer_and_dict() -> None:
    s = summary(cnn(), torch.rand(2, 3, 8, 8), optimizer="adam")
    text = str(s)
    for line in ("Saved for backward (est.): ", "Gradients: ", "Optimizer state (adam): ", "Training step total"):
        assert line in text
    memory = s.to_dict()["memory"]
    parts = ("saved_bytes", "gradient_bytes", "optimizer_bytes", "param_bytes", "buffer_bytes", "input_bytes")
    assert memory["total_bytes"] == sum(memory[k] for k in parts)
    assert summary(cnn(), torch.rand(2, 3, 8, 8)).memory is None


def test_memory_errors() -> None:
    with pytest.raises(ValueError, match=r"optimizer must be a torch.optim optimizer or one of \['adadelta'.*'lion'"):
        summary(cnn(), torch.rand(1, 3, 8, 8), optimizer="lion")
    with pytest.raises(ValueError, match="with_backward and optimizer need a forward run .*no example inputs"):
        summary(cnn(), with_backward=True)
    with pytest.raises(TypeError, match=r"with_backward must be a bool \(True or False\), got 1"):
        summary(cnn(), torch.rand(1, 3, 8, 8), with_backward=1)  # type: ignore[arg-type]
