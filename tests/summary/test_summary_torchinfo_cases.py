"""torchinfo-style models through summary(), checked against independent counts.

Each case is run twice: by summary(), and plainly, with torch's own forward hooks noting every module call. The
summary's params must equal `sum(p.numel())` over each module (and torchinfo's published totals where known), and
its call counts and output shapes must equal what the plain run saw.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parameter import is_lazy
from torch.nn.utils import prune
from torch.nn.utils.rnn import pack_padded_sequence

from hookscope.summary import ModelSummary, summary

Inputs = tuple[tuple[Any, ...], dict[str, Any]]


def shape_of(value: Any) -> Any:
    """Shapes of a value, written independently of hookscope: tuples for tensors, containers kept."""
    if isinstance(value, torch.Tensor):
        return tuple(value.shape)
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return {name: shape_of(item) for name, item in zip(value._fields, value, strict=True)}
    if isinstance(value, dict):
        return {str(key): shape_of(item) for key, item in value.items()}
    if isinstance(value, (tuple, list)):
        return tuple(shape_of(item) for item in value)
    return None


def as_plain(description: Any) -> Any:
    """The summary's shape description in the same plain form (non-tensor leaves become None)."""
    if isinstance(description, torch.Size):
        return tuple(description)
    if isinstance(description, dict):
        return {key: as_plain(item) for key, item in description.items()}
    if isinstance(description, tuple):
        return tuple(as_plain(item) for item in description)
    return None


def plain_run(model: nn.Module, inputs: Inputs) -> dict[str, tuple[int, Any]]:
    """Run `model` in eval mode without hookscope; return {path: (calls, first output shape)} per eager module."""
    seen: dict[str, tuple[int, Any]] = {}
    handles = []
    for path, module in model.named_modules(remove_duplicate=True):
        if isinstance(module, torch.jit.ScriptModule):
            continue

        def hook(m: nn.Module, args: Any, out: Any, path: str = path) -> None:
            calls, first = seen.get(path, (0, shape_of(out)))
            seen[path] = (calls + 1, first)

        handles.append(module.register_forward_hook(hook))
    training = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            model(*inputs[0], **inputs[1])
    finally:
        for handle in handles:
            handle.remove()
        for module, mode in training:
            module.training = mode
    return seen


def check_against_plain_run(model: nn.Module, inputs: Inputs, total: int | None = None) -> ModelSummary:
    s = summary(model, *inputs[0], **inputs[1])
    modules = dict(model.named_modules(remove_duplicate=False))
    for row in s.rows:
        assert row.params == sum(p.numel() for p in modules[row.path].parameters()), row.path
    assert s.total_params == sum(p.numel() for p in model.parameters())
    if total is not None:
        assert s.total_params == total
    seen = plain_run(model, inputs)
    for row in s.rows:
        if row.same_as is not None or row.in_script or row.is_scripted:
            continue
        calls, first = seen.get(row.path, (0, None))
        assert row.calls == calls, row.path
        if calls:
            assert as_plain(row.output_shape) == first, row.path
    return s


# --- the models (after torchinfo's fixtures; written here) ----------------------------------------------------------


class SingleInputNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 10, 5), nn.Conv2d(10, 20, 5)
        self.conv2_drop = nn.Dropout2d(0.3)
        self.fc1, self.fc2 = nn.Linear(320, 50), nn.Linear(50, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        return F.log_softmax(self.fc2(F.relu(self.fc1(x.view(-1, 320)))), dim=1)


class MultipleInputDtypes(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1a, self.fc1b = nn.Linear(300, 50), nn.Linear(300, 50)
        self.fc2a, self.fc2b = nn.Linear(50, 10), nn.Linear(50, 10)

    def forward(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        a = self.fc2a(F.relu(self.fc1a(x1)))
        b = self.fc2b(F.relu(self.fc1b(x2.float())))
        return torch.cat((a, b), 0)


class RecursiveNet(nn.Module):
    """One conv used three times per forward (torchinfo's "recursive" layers)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(64, 64, 3, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(3):
            x = self.conv1(x)
        return x


class Nested(nn.Module):
    """Containers in containers: ModuleDict of ModuleList of Sequential."""

    def __init__(self) -> None:
        super().__init__()
        self.parts = nn.ModuleDict(
            {
                "stem": nn.ModuleList([nn.Sequential(nn.Linear(6, 8), nn.ReLU()), nn.Linear(8, 8)]),
                "head": nn.Sequential(nn.Sequential(nn.Linear(8, 3))),
            }
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.parts["stem"]:
            x = layer(x)
        return self.parts["head"](x)


class Siamese(nn.Module):
    """Shared tower applied to two inputs; tied output weights."""

    def __init__(self) -> None:
        super().__init__()
        self.tower = nn.Sequential(nn.Linear(10, 16), nn.Tanh())
        self.project = nn.Linear(16, 16, bias=False)
        self.unproject = nn.Linear(16, 16, bias=False)
        self.unproject.weight = self.project.weight

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.unproject(self.project(self.tower(a) - self.tower(b)))


class DictAndListInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.image, self.text = nn.Linear(12, 4), nn.Embedding(20, 4)
        self.mix = nn.Linear(8, 2)

    def forward(self, batch: dict[str, Any], extras: list[torch.Tensor], *, scale: float = 1.0) -> dict[str, Any]:
        joint = torch.cat([self.image(batch["image"]), self.text(batch["tokens"]).mean(1)], -1)
        return {"out": self.mix(joint) * scale + extras[0], "parts": [joint, extras[1]]}


class PackedLSTM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(60, 12)
        self.lstm = nn.LSTM(12, 10, batch_first=True)
        self.hidden2out = nn.Linear(10, 5)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        packed = pack_padded_sequence(self.embedding(tokens), lengths, batch_first=True, enforce_sorted=False)
        _, (hidden, _) = self.lstm(packed)
        return self.hidden2out(hidden[-1])


class Pair(NamedTuple):
    mean: torch.Tensor
    log_std: torch.Tensor


class NamedTupleOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mean, self.log_std = nn.Linear(4, 2), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> Pair:
        return Pair(self.mean(x), self.log_std(x))


class FunctionalParams(nn.Module):
    """Parameters used with functional ops, in the root's own code."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(6, 4))
        self.scales = nn.ParameterList([nn.Parameter(torch.ones(4)), nn.Parameter(torch.ones(4))])
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc((x @ self.weight) * self.scales[0] + self.scales[1])


class AutoEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.decoder = nn.Sequential(nn.ConvTranspose2d(16, 3, 2, stride=2), nn.Sigmoid())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.encoder(x))


def rnns() -> nn.Module:
    class RNNs(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = nn.RNN(5, 7, num_layers=2, batch_first=True)
            self.gru = nn.GRU(7, 6, bidirectional=True, batch_first=True)
            self.lstm = nn.LSTM(12, 4, num_layers=2, batch_first=True, proj_size=3)
            self.cell = nn.LSTMCell(3, 3)

        def forward(self, x: torch.Tensor) -> Any:
            out, _ = self.rnn(x)
            out, _ = self.gru(out)
            out, (h, _) = self.lstm(out)
            return self.cell(out[:, -1], (h[-1], torch.zeros_like(h[-1])))

    return RNNs()


def rnn_params() -> int:
    """The RNN stack's parameters from the gate formulas, not from the modules."""
    rnn = (7 * 5 + 7 * 7 + 2 * 7) + (7 * 7 + 7 * 7 + 2 * 7)
    gru = 2 * (3 * 6 * 7 + 3 * 6 * 6 + 2 * 3 * 6)
    lstm = (4 * 4 * 12 + 4 * 4 * 3 + 2 * 4 * 4 + 3 * 4) + (4 * 4 * 3 + 4 * 4 * 3 + 2 * 4 * 4 + 3 * 4)
    cell = 4 * 3 * 3 + 4 * 3 * 3 + 2 * 4 * 3
    return rnn + gru + lstm + cell


def transformer() -> nn.Module:
    return nn.Transformer(16, 2, 1, 1, 32, dropout=0.0, batch_first=True)


def transformer_params() -> int:
    attention = 3 * 16 * 16 + 3 * 16 + 16 * 16 + 16
    feedforward = 16 * 32 + 32 + 32 * 16 + 16
    norm = 2 * 16
    encoder = attention + feedforward + 2 * norm + norm  # one layer and the final norm
    decoder = 2 * attention + feedforward + 3 * norm + norm
    return encoder + decoder


CASES: dict[str, tuple[Callable[[], nn.Module], Callable[[], Inputs], int | None]] = {
    "single input": (SingleInputNet, lambda: ((torch.rand(2, 1, 28, 28),), {}), 21_840),  # torchinfo's total
    "two dtypes": (MultipleInputDtypes, lambda: ((torch.rand(2, 300), torch.ones(2, 300, dtype=torch.long)), {}), None),
    "recursive": (RecursiveNet, lambda: ((torch.rand(1, 64, 8, 8),), {}), 36_928),
    "nested": (Nested, lambda: ((torch.rand(3, 6),), {}), (6 * 8 + 8) + (8 * 8 + 8) + (8 * 3 + 3)),
    "shared": (Siamese, lambda: ((torch.rand(2, 10), torch.rand(2, 10)), {}), (10 * 16 + 16) + 16 * 16),
    "dict, list and kwargs": (
        DictAndListInput,
        lambda: (
            ({"image": torch.rand(2, 12), "tokens": torch.zeros(2, 5, dtype=torch.long)}, [torch.ones(2), None]),
            {"scale": 0.5},
        ),
        (12 * 4 + 4) + 20 * 4 + (8 * 2 + 2),
    ),
    "rnns": (rnns, lambda: ((torch.rand(2, 9, 5),), {}), rnn_params()),
    "packed sequence": (
        PackedLSTM,
        lambda: ((torch.zeros(3, 6, dtype=torch.long), torch.tensor([6, 4, 2])), {}),
        60 * 12 + (4 * 10 * 12 + 4 * 10 * 10 + 2 * 4 * 10) + (10 * 5 + 5),
    ),
    "namedtuple output": (NamedTupleOut, lambda: ((torch.rand(3, 4),), {}), 2 * (4 * 2 + 2)),
    "functional": (FunctionalParams, lambda: ((torch.rand(2, 6),), {}), 24 + 8 + 15),
    "autoencoder": (AutoEncoder, lambda: ((torch.rand(1, 3, 8, 8),), {}), (3 * 16 * 9 + 16) + (16 * 3 * 4 + 3)),
    "transformer": (transformer, lambda: ((torch.rand(2, 5, 16), torch.rand(2, 4, 16)), {}), transformer_params()),
}


@pytest.mark.filterwarnings("ignore:LSTM with projections is not supported with oneDNN")  # torch's, plain run
@pytest.mark.parametrize("name", list(CASES))
def test_case_matches_independent_counts(name: str) -> None:
    make, inputs, total = CASES[name]
    torch.manual_seed(0)
    check_against_plain_run(make(), inputs(), total)


def test_recursive_and_shared_rows() -> None:
    s = summary(RecursiveNet(), torch.rand(1, 64, 8, 8))
    assert s["conv1"].calls == 3 and s["conv1"].flops == 3 * 2 * (64 * 8 * 8) * (64 * 9)
    shared = summary(Siamese(), torch.rand(2, 10), torch.rand(2, 10))
    assert shared["tower"].calls == 2 and shared.shared_params == 16 * 16
    assert shared.shared_names == (("project.weight", "unproject.weight"),)


def test_packed_sequence_shapes() -> None:
    s = summary(PackedLSTM(), torch.zeros(3, 6, dtype=torch.long), torch.tensor([6, 4, 2]))
    packed = s["lstm"].input_shape
    assert packed["data"] == (6 + 4 + 2, 12) and packed["batch_sizes"] == (6,)  # one packed row per real token
    assert s["lstm"].output_shape[0]["data"] == (12, 10) and s.output_shape == (3, 5)


# --- lazy, pruned, scripted, forward-less -------------------------------------------------------------------------


def test_lazy_modules_uninitialized_then_run() -> None:
    model = nn.Sequential(nn.LazyConv2d(4, 3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(5), nn.Linear(5, 2))
    before = summary(model)
    assert before.uninitialized == ("0", "3") and before.total_params == 5 * 2 + 2
    assert before["0"].is_lazy and before["0"].params == 0 and before[""].is_lazy
    text = str(before)
    assert "Uninitialized lazy parameters in '0', '3': not counted" in text
    line = next(line for line in text.splitlines() if "─0 " in line or "─0  " in line)
    assert "uninitialized" in line and "forward_pre" not in text  # torch's init hook is not a user hook
    after = check_against_plain_run(model, ((torch.rand(2, 3, 6, 6),), {}))
    assert after.uninitialized == () and after["3"].params == (4 * 4 * 4) * 5 + 5  # in_features inferred: 64


def test_pruned_layers_report_stored_and_effective_counts() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 4 * 4, 10))
    prune.l1_unstructured(model[0], "weight", amount=0.5)
    prune.random_unstructured(model[3], "weight", amount=0.3)
    prune.l1_unstructured(model[3], "bias", amount=0.2)
    s = check_against_plain_run(model, ((torch.rand(2, 3, 6, 6),), {}))
    masks = {name: buffer for name, buffer in model.named_buffers() if name.endswith("_mask")}
    pruned_away = sum(int((mask == 0).sum()) for mask in masks.values())
    assert s.total_params == sum(p.numel() for p in model.parameters()) == 8 * 27 + 8 + 128 * 10 + 10
    assert s.effective_params == s.total_params - pruned_away
    assert s["3"].effective_params == int(masks["3.weight_mask"].sum()) + int(masks["3.bias_mask"].sum())
    infos = {info.name: info for info in s["0"].parameters}
    assert infos["weight"].is_pruned and infos["weight"].numel == 216 and infos["weight"].effective == 108
    assert not infos["bias"].is_pruned and infos["bias"].effective == 8
    text = str(s)
    header = next(line for line in text.splitlines() if line.startswith("Layer"))
    assert "Effective" in header and f"Effective params (pruning masks applied): {s.effective_params:,}" in text


def scripted(module: nn.Module) -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit is deprecated, still used
        return torch.jit.script(module)


class PartlyScripted(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(6, 8)
        self.body = scripted(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)))
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.stem(x)))


def test_eager_model_with_a_scripted_submodule() -> None:
    model = PartlyScripted()
    s = check_against_plain_run(model, ((torch.rand(3, 6),), {}), (6 * 8 + 8) + (8 * 8 + 8) + (8 * 4 + 4) + 10)
    assert s.scripted == ("body",) and s["body"].is_scripted and not s["body"].in_script
    assert (s["body"].calls, s["body"].input_shape, s["body"].output_shape) == (1, (3, 8), (3, 4))
    assert s["body"].flops == 2 * 3 * 8 * 8 + 3 * 8 + 2 * 3 * 8 * 4  # what ran inside, counted from outside
    assert s["body.0"].in_script and s["body.0"].calls == 0 and s["body.0"].type == "Linear"
    text = str(s)
    assert "TorchScript modules ('body') run without Python hooks" in text
    assert "body (TorchScript)" in text and "body.0 (in TorchScript)" in text


def test_scripted_and_traced_models() -> None:
    eager = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2))
    x = torch.rand(5, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        traced = torch.jit.trace(eager, x)
    for model in (scripted(eager), traced):
        s = summary(model, x)
        assert s.model == "Sequential" and s.total_params == (4 * 6 + 6) + (6 * 2 + 2)
        assert [row.type for row in s.rows] == ["Sequential", "Linear", "Tanh", "Linear"]
        assert s.output_shape == (5, 2) and s[""].calls == 1 and s.scripted == ("",)
        assert all(row.in_script and row.calls == 0 for row in s.rows[1:])
        assert s.total_flops == 2 * 5 * 4 * 6 + 5 * 6 + 2 * 5 * 6 * 2
        params_only = summary(model)
        assert not params_only.has_run and params_only.total_params == s.total_params


@pytest.mark.parametrize(
    ("make", "total"),
    [
        (lambda: nn.ModuleList(), 0),
        (lambda: nn.ModuleList([nn.Linear(3, 4), nn.Sequential(nn.Conv2d(1, 2, 3))]), 16 + 20),
        (lambda: nn.ParameterList([nn.Parameter(torch.zeros(3, 2)), nn.Parameter(torch.zeros(4))]), 10),
        (lambda: nn.ModuleDict({"a": nn.Linear(2, 2), "b": nn.LazyLinear(3)}), 6),
    ],
    ids=["empty ModuleList", "ModuleList", "ParameterList", "ModuleDict with a lazy layer"],
)
def test_forwardless_models(make: Callable[[], nn.Module], total: int) -> None:
    model = make()
    s = summary(model)
    assert not s.has_run and s.total_params == total
    modules = dict(model.named_modules())
    for row in s.rows:
        params = [p for p in modules[row.path].parameters() if not is_lazy(p)]
        assert row.params == sum(p.numel() for p in params)
