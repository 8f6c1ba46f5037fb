"""Table options: columns=, widths=, per-parameter rows, depth-index labels, execution order."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn as nn
from summary_models import SmallCNN

from hookscope.summary import ModelSummary, summary


def header_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("Layer"))


def headers_of(text: str) -> list[str]:
    return [h.strip() for h in header_line(text).split("  ") if h.strip()]


def spans_of(text: str) -> dict[str, tuple[int, int]]:
    """Character span of each column: runs of characters that some line of the table fills (header or body),
    separated by the 2-space gutters every line shares."""
    lines = [header_line(text), *body_of(text)]
    width = max(map(len, lines))
    lines = [line.ljust(width + 2) for line in lines]
    filled = [any(line[p] != " " for line in lines) for p in range(width + 2)]
    spans, start = [], None
    for p in range(width + 2):
        if filled[p] and start is None:
            start = p
        elif not filled[p] and start is not None and not filled[p + 1]:
            spans.append((start, p))
            start = None
    return dict(zip(headers_of(text), spans, strict=True))


def body_of(text: str) -> list[str]:
    """The table lines between the header's rule and the closing rule."""
    lines = text.splitlines()
    start = [i for i, line in enumerate(lines) if line[:3] in ("═══", "===")][-1]
    end = next(i for i, line in enumerate(lines) if line[:3] in ("───", "---"))
    return lines[start + 1 : end]


def cell(text: str, path: str, column: str) -> str:
    """The cell of `column` in the row whose layer name is `path`."""
    spans = spans_of(text)
    start, end = spans["Layer"]
    for line in body_of(text):
        name = line[start:end].strip().lstrip("├└│─|`- ").split(" (")[0].split(":")[0]
        if name == path:
            return line[spans[column][0] : spans[column][1]].strip()
    raise AssertionError(f"no row {path!r}")


def cnn() -> ModelSummary:
    return summary(SmallCNN(), input_size=(2, 3, 16, 16))


def test_columns_choose_and_order_the_table() -> None:
    s = cnn()
    text = s.to_text(columns=["kernel_size", "groups", "params", "params_percent", "output_shape"])
    assert headers_of(text) == ["Layer", "Kernel", "Groups", "Params", "Params %", "Output shape"]
    model = SmallCNN()
    total = sum(p.numel() for p in model.parameters())
    conv = model.features[1][0]
    assert cell(text, "features.1.0", "Kernel") == "x".join(map(str, conv.kernel_size)) == "3x3"
    assert cell(text, "features.1.0", "Groups") == str(conv.groups) == "1"
    assert cell(text, "features.1.0", "Params %") == f"{100 * conv.weight.numel() / total:.2f}%"
    assert cell(text, "head", "Kernel") == "--" and cell(text, "head", "Params %") == f"{100 * 170 / total:.2f}%"
    assert cell(text, "SmallCNN", "Params %") == "100.00%"
    grouped = summary(nn.Sequential(nn.Conv2d(4, 8, (3, 1), groups=2), nn.GroupNorm(4, 8)), input_size=(1, 4, 5, 5))
    assert (grouped["0"].kernel_size, grouped["0"].groups, grouped["1"].groups) == ((3, 1), 2, 4)


def test_columns_given_to_summary_are_the_default_of_its_renderings() -> None:
    s = summary(SmallCNN(), input_size=(1, 3, 8, 8), columns=("trainable", "mode"))
    assert headers_of(str(s)) == ["Layer", "Trainable", "Mode"]
    assert headers_of(s.to_text(columns=["params"])) == ["Layer", "Params"]


def test_widths_shorten_text_columns_but_never_numbers() -> None:
    s = cnn()
    text = s.to_text(widths={"type": 6, "layer": 14}, ascii_only=True)
    assert cell(text, "pool", "Type") == "Ad...d"  # AdaptiveAvgPool2d, cut in the middle
    assert "...0.0" in text and "features.0.0" not in text  # the path keeps its end under the tree
    assert cell(text, "head", "Params") == "170" and "1,586" in body_of(text)[0]  # numbers whole
    with pytest.raises(ValueError, match=r"widths can only limit the text columns .*numbers are never cut.*'params'"):
        s.to_text(widths={"params": 3})
    with pytest.raises(ValueError, match=r"widths\['type'\] must be an int of at least 3, got 1"):
        s.to_text(widths={"type": 1})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"columns": ["params", "size"]}, r"columns must be a sequence of names from \['type', 'input_shape'"),
        ({"columns": []}, r"columns must be a sequence of names from"),
        ({"order": "random"}, r"order must be one of \('tree', 'execution'\), got 'random'"),
        ({"widths": [("type", 3)]}, r"widths must be a dict of column name -> maximum width"),
    ],
)
def test_view_option_errors(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        summary(nn.Linear(2, 2), input_size=(1, 2), **options)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"param_rows must be a bool \(True or False\), got 1"):
        summary(nn.Linear(2, 2), input_size=(1, 2), param_rows=1)  # type: ignore[arg-type]


def test_param_rows_show_each_parameter_under_its_module() -> None:
    model = SmallCNN()
    s = summary(model, input_size=(1, 3, 8, 8))
    text = s.to_text(param_rows=True)
    assert "Output / param shape" in text
    for path, module in model.named_modules():
        for name, parameter in module.named_parameters(recurse=False):
            lines = [line for line in body_of(text) if line.split("─")[-1].startswith(f"{name} ")]
            shape = "[" + ", ".join(map(str, parameter.shape)) + "]"
            assert any(shape in line and f"{parameter.numel():,}" in line for line in lines), (path, name)
    assert [(p.name, tuple(p.shape or ()), p.numel) for p in s["head"].parameters] == [
        ("weight", (10, 16), 160),
        ("bias", (10,), 10),
    ]
    frozen = [p.trainable for p in s["features.0.1"].parameters]
    assert frozen == [False, False]  # BatchNorm frozen in SmallCNN
    lines = body_of(text)
    head = next(i for i, line in enumerate(lines) if line.split("─")[-1].startswith("head "))
    assert lines[head + 1].split("─")[-1].startswith("weight ") and lines[head + 2].split("─")[-1].startswith("bias ")
    assert "└─bias" in lines[head + 2]  # the last child of the last row closes the tree


def test_depth_index_labels_count_modules_per_depth_in_table_order() -> None:
    model = SmallCNN()
    s = summary(model, input_size=(1, 3, 8, 8), depth_index=True)
    expected, counters = {}, {}
    for path, _ in model.named_modules():  # torchinfo's rule: depth-<n-th module at that depth>
        depth = path.count(".") + 1 if path else 0
        if depth:
            counters[depth] = counters.get(depth, 0) + 1
            expected[path] = f"{depth}-{counters[depth]}"
    labels = dict(re.findall(r"─([\w.]+): (\d+-\d+)", str(s)))
    assert labels == expected and labels["features.1.2"] == "3-6"
    assert "SmallCNN (root)  " in str(s)  # the root has no label, as in torchinfo


class CallsOutOfOrder(nn.Module):
    """Registered second, called first; a ModuleList in between whose children run last."""

    def __init__(self) -> None:
        super().__init__()
        self.late = nn.Linear(4, 4)
        self.early = nn.Linear(3, 4)
        self.blocks = nn.ModuleList([nn.ReLU(), nn.Tanh()])
        self.unused = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.late(self.early(x))
        for block in reversed(self.blocks):
            x = block(x)
        return x


def test_execution_order_lists_modules_by_first_call() -> None:
    model = CallsOutOfOrder()
    s = summary(model, input_size=(2, 3), order="execution")
    called: list[str] = []
    paths = {module: path for path, module in model.named_modules()}
    handles = [m.register_forward_pre_hook(lambda m, a: called.append(paths[m])) for m in model.modules()]
    model(torch.zeros(2, 3))
    for handle in handles:
        handle.remove()
    names = [line.split()[0] for line in body_of(str(s))]
    names = ["" if name == "CallsOutOfOrder" else name for name in names]
    order = [name for name in names if name in called]
    assert order == list(dict.fromkeys(called)) == ["", "early", "late", "blocks.1", "blocks.0"]
    assert names.index("blocks") == names.index("blocks.1") - 1  # a container just before its first child
    assert names.index("unused") > names.index("late")
    assert all(line.startswith("  ") for line in body_of(str(s))[1:])  # indented, no tree lines
    assert [row.path for row in s.rows][:3] == ["", "late", "early"]  # the data keeps registration order
