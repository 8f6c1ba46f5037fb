"""Fitting the table into a terminal: names and paths shorten, low-priority columns go, numbers stay whole."""

from __future__ import annotations

import functools
import io

import pytest
import torch
import torch.nn as nn
from rich.console import Console
from summary_models import ResNet18

from hookscope.summary import ModelSummary, summary
from hookscope.summary._fit import ColumnFit, fit_widths, shorten_end, shorten_middle, shorten_path
from hookscope.summary._render import format_flops

# --- the pure helpers --------------------------------------------------------------------------------------------


def test_shorten_path_drops_whole_segments_first() -> None:
    path = "encoder.layer.11.attention.self_attention.query"
    assert shorten_path(path, len(path)) == path
    assert shorten_path(path, 30) == "encoder.…self_attention.query"
    assert shorten_path(path, 31, keep_first=False) == "…attention.self_attention.query"
    assert shorten_path(path, 30, keep_first=False) == "…self_attention.query"
    assert shorten_path(path, 12, keep_first=False) == "…query"
    assert shorten_path(path, 5) == "…qu…y"  # the last segment alone does not fit: cut in its middle
    assert shorten_path("averyveryverylongname", 9) == "aver…name"
    for width in range(3, len(path) + 1):
        assert len(shorten_path(path, width)) <= width and len(shorten_path(path, width, keep_first=False)) <= width


def test_shorten_middle_and_end() -> None:
    assert shorten_middle("AdaptiveAvgPool2d", 13) == "Adapti…Pool2d"
    assert shorten_middle("AdaptiveAvgPool2d", 13, "...") == "Adapt...ool2d"
    assert shorten_end("[64, 3, 224, 224]", 11) == "[64, 3, …"  # never "[64, 3, 22…"
    assert shorten_end("[64, 3, 224, 224]", 12) == "[64, 3, 224…"
    assert shorten_end("{logits: [2, 8, 50257]}", 20) == "{logits: [2, 8, …"
    assert shorten_end("Sequential", 6) == "Seque…"  # one word: cut, since stopping before it leaves nothing
    for width in range(1, 20):
        assert len(shorten_end("[64, 3, 224, 224]", width)) <= width


def test_fit_widths_shrinks_text_then_drops_columns_and_never_shrinks_numbers() -> None:
    columns = [ColumnFit(30, 12, 6), ColumnFit(20, 10, 4), ColumnFit(10), ColumnFit(8, 6, 3)]
    roomy = fit_widths(columns, 200, gap=2)
    assert roomy.widths == {0: 30, 1: 20, 2: 10, 3: 8} and roomy.fits and not roomy.dropped
    tight = fit_widths(columns, 50, gap=2, drop_order=[3, 1])
    assert tight.fits and tight.widths[2] == 10 and sum(tight.widths.values()) + 2 * 3 == 50 and not tight.dropped
    narrower = fit_widths(columns, 38, gap=2, drop_order=[3, 1])  # soft minimums: 12 + 10 + 10 + 2 gaps
    assert narrower.dropped == (3,) and narrower.widths[2] == 10 and sum(narrower.widths.values()) + 4 == 38
    assert narrower.widths[0] >= 12 and narrower.widths[1] >= 10  # text at or above its soft minimum
    hopeless = fit_widths(columns, 5, gap=2, drop_order=[3, 1])
    assert not hopeless.fits and hopeless.widths[2] == 10 and hopeless.dropped == (3, 1)


# --- rich tables at 80, 100 and 160 columns ------------------------------------------------------------------------


class Attention(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.query_projection = nn.Linear(width, width)
        self.key_projection = nn.Linear(width, width)
        self.value_projection = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.query_projection(x), self.key_projection(x), self.value_projection(x)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


class LongNames(nn.Module):
    """A transformer-ish model with long module names, built on the meta device with a 4096 width (big numbers)."""

    def __init__(self, width: int = 4096) -> None:
        super().__init__()
        self.embeddings_for_tokens = nn.Embedding(50_257, width)
        self.transformer_encoder_layers = nn.ModuleList(
            nn.ModuleDict({"self_attention_block": Attention(width), "final_layer_normalization": nn.LayerNorm(width)})
            for _ in range(2)
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embeddings_for_tokens(tokens)
        for layer in self.transformer_encoder_layers:
            x = layer["final_layer_normalization"](x + layer["self_attention_block"](x))
        return x


def render(s: ModelSummary, width: int) -> list[str]:
    console = Console(file=io.StringIO(), width=width, record=True)
    console.print(s)
    return console.export_text().splitlines()


def table_header(lines: list[str]) -> int:
    return next(i for i, line in enumerate(lines) if line.startswith("Layer"))


def table_body(lines: list[str]) -> list[str]:
    rule = next(i for i, line in enumerate(lines) if set(line.strip()) == {"─"})
    end = next(i for i, line in enumerate(lines) if line.startswith("Total params:"))
    return lines[rule + 1 : end]


def meta(make: type[nn.Module]) -> nn.Module:
    with torch.device("meta"):
        return make()


CASES = [
    (lambda: meta(ResNet18), {"input_size": (1, 3, 224, 224)}),
    (lambda: meta(LongNames), {"input_size": (1, 128), "dtypes": torch.long}),
]


@functools.cache
def case_summary(case: int) -> tuple[nn.Module, ModelSummary]:
    """One summary per model, drawn at every width."""
    make, inputs = CASES[case]
    model = make()
    return model, summary(model, **inputs)


@pytest.mark.parametrize("width", [80, 100, 160])
@pytest.mark.parametrize("case", range(len(CASES)), ids=["resnet18", "long names"])
def test_rich_table_fits_the_terminal_and_keeps_numbers_whole(width: int, case: int) -> None:
    model, s = case_summary(case)
    lines = render(s, width)
    assert max(map(len, lines)) <= width
    body = table_body(lines)
    modules = dict(model.named_modules())
    assert len(body) == len(s.rows)
    for line, row in zip(body, s.rows, strict=True):
        params = sum(p.numel() for p in modules[row.path].parameters())  # counted here, not by the summary
        if params:
            assert f" {params:,}" in line, (width, row.path, line)
        if row.calls and "FLOPs" in lines[table_header(lines)]:
            assert f" {format_flops(row.flops)}" in line, (width, row.path, line)  # whole, as formatted
    text = "\n".join(lines)
    assert f"Total params: {sum(p.numel() for p in model.parameters()):,}" in text
    if width == 160:
        assert "Left out to fit" not in text  # everything fits on a wide terminal


def test_at_80_columns_paths_shorten_and_the_caption_says_what_was_left_out() -> None:
    _, s = case_summary(1)
    text = "\n".join(render(s, 80))
    assert "transformer_encoder_layers.0.self_attention_block.query_projection" not in text
    assert "…query_projection" in text or "…y_projection" in text  # the end of the path is kept
    assert "Left out to fit 80 columns: " in text
    assert "50,257" not in text and f"{50_257 * 4096:,}" in text  # the embedding's params, whole


def test_text_table_fits_a_width_too() -> None:
    model, s = case_summary(0)
    total = f"{sum(p.numel() for p in model.parameters()):,}"
    for width in (80, 100):
        lines = s.to_text(width=width).splitlines()
        assert max(map(len, lines)) <= width
        assert total in next(line for line in lines if "(root)" in line)
    with pytest.raises(ValueError, match="width must be None or an int of at least 20 .columns., got 10"):
        s.to_text(width=10)
