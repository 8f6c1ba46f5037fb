"""summary() on what it used to refuse: no inputs, no forward, legacy dtypes, input_size with kwargs, batch_dim."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn
from summary_models import LSTMTagger, SmallCNN, mlp

from hookscope.summary import summary
from hookscope.summary._inputs import to_dtype


def own_counts(model: nn.Module) -> dict[str, int]:
    """Parameters of each module path, submodules included, counted by hand (each parameter once)."""
    return {path: sum(p.numel() for p in module.parameters()) for path, module in model.named_modules()}


# --- no inputs: a parameter-only summary -------------------------------------------------------------------------


def test_no_inputs_gives_the_parameter_table_with_empty_shape_and_flops_columns() -> None:
    model = SmallCNN()
    s = summary(model)
    assert not s.has_run and s.total_flops == 0 and s.input_shape is None and s.output_shape is None
    assert {row.path: row.params for row in s.rows} == own_counts(model)
    assert s.total_params == sum(p.numel() for p in model.parameters()) == 1586
    assert s.trainable_params == sum(p.numel() for p in model.parameters() if p.requires_grad)
    text = s.to_text()
    lines = text.splitlines()
    assert lines[0] == "SmallCNN: parameters only, no forward run; FLOPs and Params include submodules"
    assert lines[1].startswith("No forward run: no example inputs were given") and "columns are empty" in lines[1]
    header = next(line for line in lines if line.startswith("Layer"))
    conv = next(line for line in lines if "features.0.0" in line)
    for column in ("Input shape", "Output shape", "FLOPs"):  # shown, empty
        start = header.index(column)
        assert conv[start : start + len(column)].strip() == "", column
    assert "(not called)" not in text and "Total FLOPs: unknown (no forward run)" in text


def test_a_forward_without_parameters_still_runs_without_inputs() -> None:
    class Constant(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = nn.Parameter(torch.ones(3, 2))

        def forward(self) -> torch.Tensor:
            return self.table * 2

    s = summary(Constant())
    assert s.has_run and s.output_shape == (3, 2) and s.total_params == 6


# --- models with no forward ----------------------------------------------------------------------------------------


class ParamsOnly(nn.Module):
    """Holds parameters and buffers, has no forward (as a parameter store or an embedding table holder)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(4))
        self.table = nn.ParameterList([nn.Parameter(torch.zeros(3, 5)), nn.Parameter(torch.zeros(7))])
        self.register_buffer("count", torch.zeros(2, dtype=torch.long))


@pytest.mark.parametrize(
    "make",
    [lambda: nn.ModuleList(), lambda: nn.ModuleList([nn.Linear(3, 4), nn.Conv2d(2, 5, 3)]), ParamsOnly],
    ids=["empty ModuleList", "ModuleList", "parameters only"],
)
def test_models_without_forward_list_their_parameters(make: object) -> None:
    model = make()  # type: ignore[operator]
    s = summary(model)
    assert not s.has_run
    assert s.total_params == sum(p.numel() for p in model.parameters())
    assert {row.path: row.params for row in s.rows} == own_counts(model)
    assert s.buffer_bytes == sum(b.numel() * b.element_size() for b in model.buffers())
    assert f"{type(model).__name__} has no forward (a container)" in str(s)


def test_inputs_given_to_a_model_without_forward_are_unused_with_a_warning() -> None:
    model = nn.ModuleList([nn.Linear(3, 4)])
    with pytest.warns(UserWarning, match="ModuleList has no forward .a container., so the example inputs were not"):
        s = summary(model, torch.zeros(2, 3))
    assert not s.has_run and s.total_params == 16


# --- dtypes --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spelling", "dtype"),
    [
        (torch.LongTensor, torch.int64),
        (torch.FloatTensor, torch.float32),
        (torch.HalfTensor, torch.float16),
        (torch.cuda.LongTensor, torch.int64),  # the dtype only; the device is chosen by `device`
        ("long", torch.int64),
        ("int64", torch.int64),
        ("torch.bfloat16", torch.bfloat16),
        (int, torch.int64),
        (torch.int32, torch.int32),
    ],
)
def test_to_dtype_reads_legacy_tensor_types_names_and_python_types(spelling: object, dtype: torch.dtype) -> None:
    assert to_dtype(spelling) is dtype


def test_to_dtype_errors_name_the_argument() -> None:
    with pytest.raises(ValueError, match=r"dtypes must be a torch.dtype, a tensor type such as torch.LongTensor.*'x'"):
        to_dtype("x")
    with pytest.raises(ValueError, match=r"--dtype must be .*got <class 'str'>"):
        to_dtype(str, "--dtype")


def test_legacy_tensor_types_as_dtypes_build_the_inputs() -> None:
    s = summary(LSTMTagger(), input_size=(2, 5), dtypes=torch.LongTensor)
    assert s.output_shape[0] == (2, 5, 5) and s["embed"].input_shape == (2, 5)

    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.proj = nn.Embedding(10, 3), nn.Linear(4, 3)

        def forward(self, tokens: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
            assert tokens.dtype == torch.int64 and features.dtype == torch.float32
            return self.embed(tokens) + self.proj(features)

    mixed = summary(Mixed(), input_size=[(2, 6), (2, 6, 4)], dtypes=[torch.LongTensor, torch.FloatTensor])
    assert mixed.output_shape == (2, 6, 3)
    named = summary(Mixed(), input_size={"tokens": (2, 6), "features": (2, 6, 4)}, dtypes={"tokens": "long"})
    assert named.output_shape == (2, 6, 3)


def test_float_inputs_into_an_embedding_get_a_hint() -> None:
    with pytest.raises(RuntimeError, match=r"failed in module 'embed'.*for token ids pass dtypes=torch.long"):
        summary(LSTMTagger(), input_size=(2, 5))


# --- input_size with keyword inputs, batch_dim ---------------------------------------------------------------------


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, scale: float = 1.0) -> torch.Tensor:
        out = self.proj(x) * scale
        return out if mask is None else out * mask


def test_input_size_goes_with_forward_kwargs() -> None:
    mask = torch.zeros(4, 2)
    s = summary(Scaled(), input_size=(4, 3), mask=mask, scale=3.0)
    assert s.input_shape == (torch.Size([4, 3]), {"mask": torch.Size([4, 2]), "scale": "3.0"})
    assert s.output_shape == (4, 2) and s["proj"].input_shape == (4, 3)
    with pytest.raises(ValueError, match=r"input_size and the keyword inputs both give \['x'\]; give each input once"):
        summary(Scaled(), input_size={"x": (4, 3)}, x=torch.zeros(4, 3))
    with pytest.raises(ValueError, match="pass either positional example inputs or input_size, got both"):
        summary(Scaled(), torch.zeros(4, 3), input_size=(4, 3))


def test_batch_dim_inserts_a_batch_of_one() -> None:
    s = summary(mlp(), input_size=(16,), batch_dim=0)
    assert s.input_shape == (1, 16) and s.output_shape == (1, 4) and s.batch_dim == 0
    assert s["0"].flops == 2 * 16 * 32  # per sample
    assert "Inputs built with a batch of 1 at dim 0" in str(s)
    time_major = summary(nn.LSTM(12, 4), input_size=(7, 12), batch_dim=1)  # (T, B, C)
    assert time_major.input_shape == (7, 1, 12) and time_major.output_shape[0] == (7, 1, 4)
    assert summary(nn.Identity(), input_size=(3, 5), batch_dim=-1).input_shape == (3, 5, 1)
    with pytest.raises(ValueError, match=r"batch_dim must be a dimension of the input .*\(2 dims for input 0"):
        summary(mlp(), input_size=(16,), batch_dim=2)
    with pytest.raises(ValueError, match="batch_dim is for shapes given without their batch dimension"):
        summary(mlp(), torch.zeros(2, 16), batch_dim=0)
    with pytest.raises(TypeError, match="batch_dim must be an int or None, got '0'"):
        summary(mlp(), input_size=(16,), batch_dim="0")  # type: ignore[arg-type]


# --- the mode header (issue 16: the header said eval while every row said train) ----------------------------------


def test_header_explains_the_mode_column_when_it_differs_from_the_run() -> None:
    model = SmallCNN()  # in train mode, but for features.0.1 (frozen, in eval mode)
    s = summary(model, input_size=(1, 3, 8, 8))
    header = s.to_text().splitlines()[:4]
    assert "forward run in eval mode" in header[0]
    assert "Mode: each module's own train/eval setting, restored after the eval-mode run" in header
    assert {row.mode for row in s.rows} == {"train", "eval"}  # the user's settings, features.0.1 frozen in eval
    same = summary(model, input_size=(1, 3, 8, 8), mode="same")
    assert not any(line.startswith("Mode:") for line in same.to_text().splitlines())
    eval_model = summary(SmallCNN().eval(), input_size=(1, 3, 8, 8))
    assert not any(line.startswith("Mode:") for line in eval_model.to_text().splitlines())


def test_no_deprecation_or_other_warning_on_a_plain_summary() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        summary(mlp(), input_size=(2, 16))
        summary(mlp())
