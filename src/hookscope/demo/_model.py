"""The demo's model, a small CNN for 8x8 digits, and the faults `--fault` plants in it."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn

__all__ = ["FAULTS", "DigitsCNN", "Fault", "UnsafeSqrt", "apply_fault"]


class UnsafeSqrt(nn.Module):
    """A hand-written activation, `sqrt(x)`: NaN for every negative input (the `nan` fault's source)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        root: torch.Tensor = torch.sqrt(x)
        return root


class DigitsCNN(nn.Module):
    """Two 3x3 convolutions (16, 32 channels) with ReLU and a 2x2 max-pool, then a 64-unit hidden layer,
    batch-normalized before its ReLU.

    Why the normalization: the hidden layer's inputs come out of a ReLU and a max-pool, so they are all >= 0, and
    a unit whose weights sum below zero starts (and stays) off. Without it, 16 of the 64 hidden units are off on
    every training image at the first step and 24-32 (seed 0-2) are dead after one epoch, which the doctor rightly
    reports (`dead_units`); centred by `BatchNorm1d`, none is, and the accuracy rises (96-99% -> 99%).

    Shape:
        input (B, 1, 8, 8) -> output (B, 10) logits.
    """

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            OrderedDict(
                conv1=nn.Conv2d(1, 16, 3, padding=1),
                act1=nn.ReLU(),
                conv2=nn.Conv2d(16, 32, 3, padding=1),
                act2=nn.ReLU(),
                pool=nn.MaxPool2d(2),
            )
        )
        self.classifier = nn.Sequential(
            OrderedDict(
                flatten=nn.Flatten(),
                fc1=nn.Linear(32 * 4 * 4, 64),
                norm=nn.BatchNorm1d(64),
                act3=nn.ReLU(),
                fc2=nn.Linear(64, 10),
            )
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.classifier(self.features(x))
        return logits

    def hidden(self) -> nn.Linear:
        """Return the hidden fully connected layer, `classifier.fc1`."""
        layer = self.get_submodule("classifier.fc1")
        if not isinstance(layer, nn.Linear):
            raise TypeError(f"classifier.fc1 must be an nn.Linear, got {type(layer).__name__}")
        return layer

    def hidden_norm(self) -> nn.BatchNorm1d:
        """Return the normalization of the hidden layer, `classifier.norm` (what feeds its ReLU)."""
        layer = self.get_submodule("classifier.norm")
        if not isinstance(layer, nn.BatchNorm1d):
            raise TypeError(f"classifier.norm must be an nn.BatchNorm1d, got {type(layer).__name__}")
        return layer


@dataclass(frozen=True)
class Fault:
    """A known problem to plant: what it is, what the doctor should find, and how to plant it."""

    description: str
    expected_check: str
    plant: Callable[[DigitsCNN], None]
    lr_factor: float = 1.0


def _dead_relu(model: DigitsCNN) -> None:
    with torch.no_grad():  # three quarters of the hidden units start (and stay) below zero: the bias that feeds
        model.hidden_norm().bias[:48] = -20.0  # the ReLU is the normalization's (fc1's would be normalized away)


def _constant_init(model: DigitsCNN) -> None:
    with torch.no_grad():  # the units of each layer start equal, so their gradients and updates stay equal
        for module in model.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                module.weight.fill_(0.05)
                if module.bias is not None:
                    module.bias.zero_()


def _nan_source(model: DigitsCNN) -> None:
    model.features.act2 = UnsafeSqrt()


FAULTS: dict[str, Fault] = {
    "high-lr": Fault("learning rate 300x too high (Adam lr 0.9)", "lr_too_high", lambda model: None, 300.0),
    "dead-relu": Fault("a bias of -20 kills 3/4 of the hidden ReLU units", "dead_units", _dead_relu),
    "constant-init": Fault("every weight initialized to the same constant", "symmetry", _constant_init),
    "nan": Fault("a hand-written sqrt activation makes NaN from negative inputs", "nonfinite_forward", _nan_source),
}
"""The faults `hookscope demo --fault NAME` plants, by name."""


def apply_fault(model: DigitsCNN, name: str | None) -> float:
    """Plant fault `name` (or nothing for `None`) in `model`; return the factor to apply to the learning rate.

    Raises:
        ValueError: `name` is not one of `FAULTS`.
    """
    if name is None:
        return 1.0
    fault = FAULTS.get(name)
    if fault is None:
        raise ValueError(f"fault must be one of {', '.join(FAULTS)}, got {name!r}")
    fault.plant(model)
    return fault.lr_factor
