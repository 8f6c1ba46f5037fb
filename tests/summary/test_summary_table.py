"""summary(): rows, totals and FLOPs against independent computations; restoration; inputs; errors; renderings."""

from __future__ import annotations

import doctest
import gc
import importlib
import io
import json
import weakref
from typing import Any, NamedTuple

import pytest
import torch
import torch.nn as nn
import torch.nn.modules.module as module_globals
from summary_models import Encoder, LSTMTagger, Shared, SmallCNN, mlp
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import hookscope.hooks as hooks
from hookscope.hooks._registry import REGISTRY
from hookscope.summary import ModelSummary, summary
from hookscope.summary._render import format_bytes, format_flops


def hook_counts(model: nn.Module) -> list[int]:
    dicts = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")
    return [len(getattr(m, name)) for m in model.modules() for name in dicts]


def global_hook_counts() -> tuple[int, int]:
    return len(module_globals._global_forward_pre_hooks), len(module_globals._global_forward_hooks)


def fcm_counts(model: nn.Module, *args: Any) -> tuple[int, dict[str, int]]:
    """Total and per-module FLOPs as plain FlopCounterMode reports them (module names `Type.path`)."""
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(*args)
    return counter.get_total_flops(), {k: sum(v.values()) for k, v in counter.get_flop_counts().items()}


PER_ELEMENT = {nn.BatchNorm2d: 2, nn.LayerNorm: 2, nn.ReLU: 1, nn.Tanh: 1}  # the header's rule, by layer type


def elementwise_flops(model: nn.Module, *args: Any) -> dict[str, int]:
    """FLOPs of normalization and activation layers by hand: elements of their outputs times the per-element rule,
    summed up to every ancestor path (outputs seen with plain torch forward hooks)."""
    counts: dict[str, int] = {}
    handles = []
    for path, module in model.named_modules():
        rule = PER_ELEMENT.get(type(module), 0)

        def hook(m: nn.Module, a: Any, out: torch.Tensor, path: str = path, rule: int = rule) -> None:
            parts = path.split(".") if path else []
            for depth in range(len(parts) + 1):
                key = ".".join(parts[:depth])
                counts[key] = counts.get(key, 0) + rule * out.numel()

        if rule:
            handles.append(module.register_forward_hook(hook))
    with torch.no_grad():
        model(*args)
    for handle in handles:
        handle.remove()
    return counts


# --- FLOPs -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("make, shape", [(mlp, (8, 16)), (SmallCNN, (2, 3, 16, 16))])
def test_flops_agree_with_flop_counter_mode_per_module(make: Any, shape: tuple[int, ...]) -> None:
    model = make().eval()
    x = torch.rand(shape)
    total, per_module = fcm_counts(model, x)
    extra = elementwise_flops(model, x)
    s = summary(model, x)
    assert s.total_flops == total + extra[""] and extra[""] > 0
    root = type(model).__name__
    for row in s.rows:
        name = f"{root}.{row.path}" if row.path else root
        assert row.flops == per_module.get(name, 0) + extra.get(row.path, 0), row.path
    assert sum(row.self_flops for row in s.rows) == s.total_flops


def test_cnn_flops_match_the_convolution_formula() -> None:
    s = summary(SmallCNN(), input_size=(2, 3, 16, 16))
    conv0 = 2 * (2 * 8 * 16 * 16) * (3 * 3 * 3)  # 2 * output elements * (C_in * k * k)
    conv1 = 2 * (2 * 16 * 8 * 8) * (8 * 3 * 3)
    head = 2 * 2 * 16 * 10
    bn0, relu0 = 2 * (2 * 8 * 16 * 16), 2 * 8 * 16 * 16  # normalization: 2 per element; activation: 1
    bn1, relu1 = 2 * (2 * 16 * 8 * 8), 2 * 16 * 8 * 8
    assert (s["features.0.0"].flops, s["features.1.0"].flops, s["head"].flops) == (conv0, conv1, head)
    assert (s["features.0.1"].flops, s["features.0.2"].flops, s["features.1.1"].flops) == (bn0, relu0, bn1)
    assert s.total_flops == conv0 + conv1 + head + bn0 + relu0 + bn1 + relu1


def test_lstm_flops_are_counted_and_match_the_gate_matmuls() -> None:
    batch, steps, hidden = 4, 7, 20
    s = summary(LSTMTagger(), input_size=(batch, steps), dtypes=torch.long)
    gates = steps * batch * (4 * hidden + hidden)  # sigmoid/tanh of the 4 gates and tanh of the cell: 1 each
    layer0 = steps * (2 * batch * 12 * 4 * hidden + 2 * batch * hidden * 4 * hidden) + gates
    layer1 = steps * (2 * batch * hidden * 4 * hidden + 2 * batch * hidden * 4 * hidden) + gates
    head = 2 * batch * steps * hidden * 5
    assert s["lstm"].flops == layer0 + layer1
    assert s.total_flops == layer0 + layer1 + head
    assert torch.backends.mkldnn.enabled  # switched off only during the summary


def test_attention_matmuls_count_and_match_the_math_kernel() -> None:
    model = Encoder().eval()
    tokens = torch.zeros(2, 6, dtype=torch.long)
    s = summary(model, tokens)
    tokens_n, d, ff, heads = 2 * 6, 16, 32, 2
    projections = 2 * tokens_n * d * 3 * d + 2 * tokens_n * d * d
    attention = 2 * (2 * (2 * heads) * 6 * 6 * (d // heads))  # scores and weighted sum
    mlp_part = 2 * (2 * tokens_n * d * ff)
    relu, norms = tokens_n * ff, 2 * (2 * tokens_n * d)  # 1 per ReLU element; 2 LayerNorms at 2 per element
    assert s["encoder.layers.0.self_attn"].flops == projections + attention
    assert s["encoder.layers.0"].flops == projections + attention + mlp_part + relu + norms
    assert s.total_flops == 2 * (projections + attention + mlp_part + relu + norms) + 2 * 2 * d * 3
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with sdpa_kernel(SDPBackend.MATH):  # the math kernel is plain bmm (and a softmax), which we can count
            total, _ = fcm_counts(model, tokens)
    finally:
        torch.backends.mha.set_fastpath_enabled(True)
    assert s.total_flops == total + 2 * (relu + norms)
    assert torch.backends.mha.get_fastpath_enabled()


# --- parameters, sharing, trainable, modes, hooks ----------------------------------------------------------------


def test_shared_parameters_and_modules_are_counted_once_and_marked() -> None:
    model = Shared()
    s = summary(model, input_size=(3, 5), dtypes=torch.long)
    unique = {id(p): p.numel() for m in model.modules() for p in m.parameters(recurse=False)}
    assert s.total_params == sum(unique.values()) == 20 * 8 + (8 * 8 + 8) + 16
    assert s.shared_params == 160
    assert s.shared_names == (("embed.weight", "out.weight"),)
    assert s["embed"].shares_with == ("out",) and s["out"].shares_with == ("embed",)
    assert s["block"].calls == 2 and s["block.0"].calls == 2
    assert s["stack.0"].same_as == "block" and s["stack.2"].same_as == "block" and s["stack.0"].calls == 0
    assert s["stack"].params == 72 + 16
    assert s.param_bytes == 4 * s.total_params
    tanh, norm = 2 * 15 * 8, 2 * 15 * 8  # Tanh twice (1 per element), LayerNorm once (2 per element)
    assert sum(row.self_flops for row in s.rows) == s.total_flops == 2 * 2 * 15 * 8 * 8 + 2 * 15 * 8 * 20 + tanh + norm
    # leaf activations: embed, block.0 x2, block.1 x2, stack.1, out
    assert s.activation_bytes == 4 * (15 * 8 * 6 + 15 * 20)


def test_trainable_and_mode_columns_show_the_users_state() -> None:
    model = SmallCNN()  # features.0.1 frozen and in eval mode
    model.head.requires_grad_(False)
    s = summary(model, input_size=(1, 3, 8, 8))
    assert (s[""].trainable, s["features.0"].trainable, s["features.1"].trainable) == ("Partial", "Partial", True)
    assert (s["features.0.1"].trainable, s["head"].trainable, s["pool"].trainable) == (False, False, False)
    assert s["features.0.1"].mode == "eval" and s["features.0.0"].mode == "train"
    assert s.trainable_params == 216 + 1184
    assert s.non_trainable_params == 16 + 170
    assert s.buffer_bytes == sum(b.numel() * b.element_size() for b in model.buffers())


def test_hooks_column_lists_hooks_placed_before_and_the_summary_leaves_none() -> None:
    model = SmallCNN()
    hook = hooks.hook_output(model.head)
    model.pool.register_forward_pre_hook(lambda m, a: None)
    hooks.register_post_accumulate_grad_hook(model.head.weight, lambda p: None, owner="clipper")
    before, registry = hook_counts(model), len(REGISTRY)
    s = summary(model, input_size=(1, 3, 8, 8))
    assert s["head"].hooks == ("forward[Hook]", "weight.post_accumulate_grad[clipper]")
    assert s["pool"].hooks == ("forward_pre[user]",)
    assert s["features"].hooks == ()
    assert hook_counts(model) == before and len(REGISTRY) == registry
    hook.remove()


def test_model_is_freed_after_summary_with_gc_disabled() -> None:
    gc.disable()
    try:
        model = mlp()
        ref = weakref.ref(model)
        s = summary(model, input_size=(2, 16))
        del model
        assert ref() is None and s.total_params == 676
    finally:
        gc.enable()


# --- failures and restoration ------------------------------------------------------------------------------------


class Breaks(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise ValueError("bad input for this layer")


def test_failing_forward_names_the_module_and_restores_modes_and_hooks() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.ReLU(), Breaks()), nn.Linear(4, 2)).train()
    model[0].eval()
    model[2].register_forward_hook(lambda m, a, o: None)
    before, modes, globals_before = hook_counts(model), [m.training for m in model.modules()], global_hook_counts()
    with pytest.raises(
        RuntimeError, match=r"failed in module '1\.1'; the last module that completed was '1\.0'"
    ) as info:
        summary(model, input_size=(3, 4))
    assert isinstance(info.value.__cause__, ValueError) and "bad input for this layer" in str(info.value)
    assert hook_counts(model) == before and global_hook_counts() == globals_before
    assert [m.training for m in model.modules()] == modes
    assert torch.backends.mha.get_fastpath_enabled()


def test_failure_in_the_root_before_any_submodule() -> None:
    with pytest.raises(RuntimeError, match=r"failed in module '' \(the root\); no module completed"):
        summary(Breaks(), input_size=(1,))


@pytest.mark.parametrize("mode", ["train", "same"])
def test_train_mode_leaves_buffers_and_rng_as_they_were(mode: str) -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Dropout(0.5)).train()
    buffers = {k: v.clone() for k, v in model.state_dict().items() if "running" in k or "num_batches" in k}
    x = torch.randn(8, 3).add(5)
    rng = torch.get_rng_state()
    s = summary(model, x, mode=mode)
    assert s.run_mode == mode and model.training
    for key, value in buffers.items():
        torch.testing.assert_close(model.state_dict()[key], value)
    assert torch.equal(torch.get_rng_state(), rng)


# --- inputs and outputs ------------------------------------------------------------------------------------------


def test_kwargs_inputs_and_dict_output() -> None:
    s = summary(Encoder(), tokens=torch.zeros(2, 6, dtype=torch.long), scale=2.0)
    assert s.input_shape == {"tokens": torch.Size([2, 6]), "scale": "2.0"}
    assert s.output_shape == {"logits": torch.Size([2, 3]), "hidden": torch.Size([2, 6, 16])}
    assert s["encoder.layers"].calls == 0 and s["encoder.layers"].flops == s["encoder"].flops
    assert s["encoder.layers.0.self_attn.out_proj"].calls == 0  # used functionally by MultiheadAttention


class DictIn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(3, 2), nn.Linear(5, 2)

    def forward(self, batch: dict[str, torch.Tensor], extra: Any = None) -> tuple[Any, ...]:
        return self.a(batch["x"]) + self.b(batch["y"]), None, "tag", 3


def test_dict_input_and_tuple_output_with_non_tensors() -> None:
    s = summary(DictIn(), {"x": torch.zeros(4, 3), "y": torch.zeros(4, 5)})
    assert s.input_shape == {"x": torch.Size([4, 3]), "y": torch.Size([4, 5])}
    assert s.output_shape == (torch.Size([4, 2]), "None", "'tag'", "3")
    assert "([4, 2], None, 'tag', 3)" in str(s)
    assert s.input_bytes == 4 * (12 + 20)


def test_input_size_forms() -> None:
    two = nn.Bilinear(3, 5, 2)
    by_list = summary(two, input_size=[(4, 3), (4, 5)])
    assert by_list.input_shape == (torch.Size([4, 3]), torch.Size([4, 5])) and by_list.output_shape == (4, 2)
    by_dict = summary(two, input_size={"input1": (4, 3), "input2": (4, 5)})
    assert by_dict.total_flops == by_list.total_flops
    tokens = summary(LSTMTagger(), input_size=(2, 3), dtypes=[torch.long])
    assert tokens.input_shape == torch.Size([2, 3]) and tokens.output_shape[0] == (2, 3, 5)


def test_meta_model_is_summarized_without_memory() -> None:
    with torch.device("meta"):
        model = SmallCNN()
    s = summary(model, input_size=(64, 3, 224, 224))
    assert s.total_params == 1586 and s.input_bytes == 4 * 64 * 3 * 224 * 224
    conv0 = 2 * (64 * 8 * 224 * 224) * 27
    assert s["features.0.0"].flops == conv0 and s["features.0.0"].output_shape == (64, 8, 224, 224)


def test_wrappers_are_unwrapped() -> None:
    s = summary(nn.DataParallel(mlp()), input_size=(2, 16))
    assert [row.path for row in s.rows] == ["", "0", "1", "2", "3"] and s.model == "Sequential"


# --- errors ------------------------------------------------------------------------------------------------------


def test_argument_errors() -> None:
    model = mlp()
    x = torch.zeros(2, 16)
    with pytest.raises(ValueError, match=r"mode must be one of \('eval', 'train', 'same'\), got 'test'"):
        summary(model, x, mode="test")
    with pytest.raises(ValueError, match="depth must be None or a non-negative int, got -1"):
        summary(model, x, depth=-1)
    with pytest.raises(ValueError, match="pass either positional example inputs or input_size, got both"):
        summary(model, x, input_size=(2, 16))
    with pytest.raises(ValueError, match=r"input_size must be a shape .*got \(2, -1\) for input 0"):
        summary(model, input_size=(2, -1))
    with pytest.raises(ValueError, match="input_size must be a shape .*got 'x'"):
        summary(model, input_size="x")
    with pytest.raises(ValueError, match=r"dtypes must be one dtype, or one dtype per input \(1 here"):
        summary(model, input_size=(2, 16), dtypes=[torch.float32, torch.long])
    with pytest.raises(TypeError, match="model must be an nn.Module, got 3"):
        summary(3)  # type: ignore[arg-type]
    with pytest.raises(KeyError, match="path must name an existing module path, got 'O'"):
        summary(model, x)["O"]


# --- renderings --------------------------------------------------------------------------------------------------


def cnn_summary() -> ModelSummary:
    return summary(SmallCNN(), input_size=(2, 3, 16, 16))


def test_to_dict_is_json_ready_and_complete() -> None:
    s = cnn_summary()
    data = json.loads(json.dumps(s.to_dict()))
    assert data["totals"]["total_params"] == 1586 and data["totals"]["non_trainable_params"] == 16
    assert len(data["rows"]) == len(s.rows) == 12
    conv = next(r for r in data["rows"] if r["path"] == "features.0.0")
    assert conv["input_shape"] == [2, 3, 16, 16] and conv["output_shape"] == [2, 8, 16, 16]
    assert conv["trainable"] is True and conv["mode"] == "train" and conv["flops"] == s["features.0.0"].flops
    assert data["rows"][0]["trainable"] == "Partial"


def test_depth_folds_rows_and_ascii_only_is_ascii() -> None:
    s = cnn_summary()
    folded = s.to_text(depth=1, ascii_only=True)
    assert folded.isascii() and "features.0" not in folded and "|-features" in folded and "`-head" in folded
    assert "1,416" in folded  # the folded container keeps its subtree's params
    assert "features.1.2" in s.to_text() and not s.to_text().isascii()
    assert s.max_depth == 3
    deep = summary(SmallCNN(), input_size=(2, 3, 16, 16), depth=2)
    assert "features.0.0" not in str(deep) and "features.0 " in str(deep)


def test_long_shapes_are_cut_in_text_only() -> None:
    s = summary(Encoder(), torch.zeros(2, 6, dtype=torch.long))
    cut = s.to_text(shape_width=20, ascii_only=True)
    assert "{logits: [2, 3], ..." in cut and "{logits: [2, 3], hidden: [2, 6, 16]}" in s.to_text(shape_width=None)


def test_rich_rendering() -> None:
    from rich.console import Console

    console = Console(file=io.StringIO(), width=200, record=True)
    console.print(cnn_summary())
    text = console.export_text()
    assert "features.0.0" in text and "[2, 8, 16, 16]" in text and "Total params: 1,586" in text


class Pair(NamedTuple):
    mean: torch.Tensor
    scale: torch.Tensor | None


class Heads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mean = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> Pair:
        return Pair(self.mean(x), None)


def test_namedtuple_output_keeps_field_names() -> None:
    s = summary(Heads(), input_size=(4, 3))
    assert s.output_shape == {"mean": torch.Size([4, 2]), "scale": "None"}
    assert "{mean: [4, 2], scale: None}" in str(s)


@pytest.mark.parametrize("module", ["_api", "_probes", "_fit", "_inputs"])
def test_docstring_examples_run(module: str) -> None:
    result = doctest.testmod(importlib.import_module(f"hookscope.summary.{module}"))
    assert result.attempted > 0 and result.failed == 0


def test_empty_container_and_parameterless_model_are_rows() -> None:
    s = summary(nn.Sequential(nn.Linear(2, 2), nn.Sequential()), input_size=(1, 2))
    assert [row.path for row in s.rows] == ["", "0", "1"] and s["1"].calls == 1 and s["1"].output_shape == (1, 2)
    empty = summary(nn.Identity(), input_size=(3,))
    assert (empty.total_params, empty.total_flops, empty[""].trainable) == (0, 0, False)


class Functional(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(6, 4)
        self.table = nn.Parameter(torch.zeros(4, 9))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) @ self.table  # a functional matmul in the root's own code


def test_functional_ops_count_as_the_callers_self_flops() -> None:
    s = summary(Functional(), input_size=(5, 6))
    assert s["proj"].flops == 2 * 5 * 6 * 4
    assert s[""].self_flops == 2 * 5 * 4 * 9 and s.total_flops == 2 * 5 * 6 * 4 + 2 * 5 * 4 * 9
    assert s[""].own_params == 36 and s[""].params == 36 + 28


def test_number_formats() -> None:
    assert [format_flops(n) for n in (0, 950, 1234, 4_560_000_000)] == ["0", "950", "1.23K", "4.56G"]
    assert [format_bytes(n) for n in (0, 512, 1234, 5_000_000)] == ["0 B", "512 B", "1.23 kB", "5.00 MB"]
