"""FLOPs of normalization and activation layers, and the shapes of outputs that are not tensors."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.nn as nn
from torch.distributions import Categorical, Normal

from hookscope.summary import summary
from hookscope.summary._flops import COUNTED_OPS

# --- normalizations: 2 FLOPs per element; activations: 1 ------------------------------------------------------------


@pytest.mark.parametrize(
    ("layer", "shape", "per_element"),
    [
        (nn.BatchNorm1d(6), (4, 6), 2),
        (nn.BatchNorm2d(3), (2, 3, 5, 5), 2),
        (nn.BatchNorm3d(2, affine=False), (2, 2, 3, 3, 3), 2),
        (nn.LayerNorm(7), (3, 5, 7), 2),
        (nn.LayerNorm(7, elementwise_affine=False), (3, 7), 2),
        (nn.GroupNorm(2, 4), (2, 4, 3, 3), 2),
        (nn.InstanceNorm2d(3), (2, 3, 4, 4), 2),
        (nn.PReLU(), (3, 8), 1),
        (nn.PReLU(8), (3, 8), 1),
        (nn.ReLU(), (3, 8), 1),
        (nn.ReLU(inplace=True), (3, 8), 1),
        (nn.LeakyReLU(), (3, 8), 1),
        (nn.GELU(), (3, 8), 1),
        (nn.SiLU(), (3, 8), 1),
        (nn.Sigmoid(), (3, 8), 1),
        (nn.Tanh(), (3, 8), 1),
        (nn.ELU(), (3, 8), 1),
        (nn.Hardswish(), (3, 8), 1),
        (nn.ReLU6(), (3, 8), 1),
        (nn.Softmax(-1), (3, 8), 1),
        (nn.LogSoftmax(-1), (3, 8), 1),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, nn.Module) else None,
)
@pytest.mark.parametrize("mode", ["eval", "train"])
def test_normalizations_and_activations_count_per_element(
    layer: nn.Module, shape: tuple[int, ...], per_element: int, mode: str
) -> None:
    s = summary(layer, input_size=shape, mode=mode)
    elements = int(np.prod(shape))  # every layer here keeps the shape of its input
    assert s.output_shape == shape and s.total_flops == per_element * elements


def test_a_block_adds_its_parts_and_the_header_says_what_is_counted() -> None:
    block = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.PReLU(), nn.Dropout(0.5), nn.Linear(16, 4))
    s = summary(block, input_size=(5, 8))
    matmuls = 2 * 5 * 8 * 16 + 2 * 5 * 16 * 4  # 2 per multiply-add
    assert s.total_flops == matmuls + 2 * 5 * 16 + 5 * 16
    assert s["3"].flops == 0  # dropout, pooling and other elementwise arithmetic are not counted
    assert COUNTED_OPS in str(s).splitlines()
    assert "normalizations (2/element)" in COUNTED_OPS and "activations" in COUNTED_OPS


# --- shapes of outputs that are not tensors -----------------------------------------------------------------------


@dataclass
class Prediction:
    logits: torch.Tensor
    hidden: tuple[torch.Tensor, torch.Tensor]
    label: str = "class"


class Holder:
    def __init__(self, x: torch.Tensor) -> None:
        self.features = x
        self.count = 3
        self._cache = x  # private attributes are not shown


class Outputs(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.proj = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> object:
        y = self.proj(x)
        if self.kind == "numpy":
            return y.detach().numpy()
        if self.kind == "normal":
            return Normal(y, y.exp())
        if self.kind == "categorical":
            return Categorical(logits=y)
        if self.kind == "dataclass":
            return Prediction(y, (x, y))
        return Holder(y)


@pytest.mark.parametrize(
    ("kind", "shape", "text", "tensor_bytes"),
    [
        ("numpy", {"type": "ndarray", "shape": [5, 3]}, "ndarray[5, 3]", 0),
        ("normal", {"type": "Normal", "shape": [5, 3]}, "Normal[5, 3]", 2 * 5 * 3 * 4),
        ("categorical", {"type": "Categorical", "shape": [5]}, "Categorical[5]", 5 * 3 * 4),
        (
            "dataclass",
            {"type": "Prediction", "fields": {"logits": [5, 3], "hidden": [[5, 4], [5, 3]]}},
            "Prediction(logits: [5, 3], hidden: ([5, 4], [5, 3]))",
            (15 + 20 + 15) * 4,
        ),
        ("object", {"type": "Holder", "fields": {"features": [5, 3]}}, "Holder(features: [5, 3])", 15 * 4),
    ],
)
def test_outputs_that_are_not_tensors_show_their_shapes(
    kind: str, shape: dict[str, object], text: str, tensor_bytes: int
) -> None:
    model = Outputs(kind)
    s = summary(model, input_size=(5, 4))
    assert s.to_dict()["output_shape"] == shape
    assert text in str(s)
    assert s[""].output_bytes == tensor_bytes  # tensors held by the object, counted from their shapes
    direct = model(torch.zeros(5, 4))  # the same model run without hookscope
    if kind == "numpy":
        assert list(direct.shape) == shape["shape"]
    elif kind in ("normal", "categorical"):
        assert list(direct.sample().shape) == shape["shape"]  # the shape of one sample
