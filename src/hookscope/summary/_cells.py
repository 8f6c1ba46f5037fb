"""The lines of a summary table as text cells: module rows (and parameter rows), ordered, labelled. Pure.

A `Line` keeps the layer cell in three parts, the tree prefix, the name (a module path, which may shorten) and a
suffix (`(2 calls)`, `: 1-2`), so fitting a width shortens the path and never the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._columns import DEFAULT_COLUMNS, TableView
from ._params import ParamInfo
from ._shapes import format_shape

if TYPE_CHECKING:
    from ._table import LayerRow, ModelSummary

__all__ = ["Line", "column_names", "format_bytes", "format_flops", "table_lines", "visible_rows"]

_TREE = {False: ("├─", "└─", "│ ", "  "), True: ("|-", "`-", "| ", "  ")}


@dataclass
class Line:
    """One line of the table: the layer cell in parts, and the other cells by column name."""

    prefix: str
    name: str
    suffix: str
    cells: dict[str, str]
    is_param: bool = False


def format_flops(flops: int) -> str:
    """Format a FLOP count with a K/M/G/T/P suffix: `950`, `1.23K`, `4.56G`."""
    value = float(flops)
    for suffix in ("", "K", "M", "G", "T"):
        if abs(value) < 1000:
            return f"{flops}" if not suffix else f"{value:.2f}{suffix}"
        value /= 1000
    return f"{value:.2f}P"


def format_bytes(size: int) -> str:
    """Format a byte count in decimal units: `512 B`, `1.23 kB`, `4.56 MB`."""
    value = float(size)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(value) < 1000:
            return f"{size} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1000
    return f"{value:.2f} PB"


def visible_rows(s: ModelSummary, depth: int | None, order: str = "tree") -> list[LayerRow]:
    """The rows down to `depth`, in tree order or in the order of their first call."""
    rows = [row for row in s.rows if depth is None or row.depth <= depth]
    if order == "tree":
        return rows
    below = _first_call_below(rows)
    keys: list[float] = []
    for row, called in zip(rows, below, strict=True):  # uncalled rows go just before their first called descendant,
        if row.first_call is not None:  # else right after the row before them
            keys.append(float(row.first_call))
        else:
            keys.append(called - 0.5 if called is not None else keys[-1] if keys else -1.0)
    return [row for _, _, row in sorted(zip(keys, range(len(rows)), rows, strict=True))]


def _first_call_below(rows: list[LayerRow]) -> list[int | None]:
    """For each row (in tree order), the earliest first call among its descendants, in one backward pass."""
    found: list[int | None] = [None] * len(rows)
    stack: list[tuple[int, int | None]] = []  # (depth, earliest call in that row's subtree), deepest last
    for index in range(len(rows) - 1, -1, -1):
        depth, earliest = rows[index].depth, None
        while stack and stack[-1][0] > depth:
            earliest = _earlier(earliest, stack.pop()[1])
        found[index] = earliest
        stack.append((depth, _earlier(earliest, rows[index].first_call)))
    return found


def _earlier(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def column_names(s: ModelSummary, view: TableView) -> list[str]:
    """The columns to draw after `layer`: the chosen ones, or the defaults that carry information."""
    if view.columns is not None:
        return list(view.columns)
    names = list(DEFAULT_COLUMNS)
    if s.effective_params != s.total_params:
        names.insert(names.index("params") + 1, "effective_params")
    if not any(row.hooks for row in s.rows):
        names.remove("hooks")
    return names


def _params_cell(row: LayerRow) -> str:
    if row.same_as is not None or (row.params == 0 and not row.is_lazy):
        return "--"
    if row.is_lazy:
        return "uninitialized" if row.params == 0 else f"{row.params:,}+?"
    return f"{row.params:,}" + ("*" if row.shares_with else "")


def _percent(count: int, total: int) -> str:
    return f"{100 * count / total:.2f}%" if count and total else "--"


def _shape_cells(s: ModelSummary, row: LayerRow) -> tuple[str, str, str]:
    """Input shape, output shape and FLOPs cells: empty without a forward run, `--` where nothing was seen."""
    if not s.has_run:
        return "", "", ""
    if row.calls == 0:
        return "--", "--", format_flops(row.flops) if row.flops and not row.in_script else "--"
    return format_shape(row.input_shape), format_shape(row.output_shape), format_flops(row.flops)


def _module_cells(s: ModelSummary, row: LayerRow) -> dict[str, str]:
    alias = row.same_as is not None
    inputs, outputs, flops = _shape_cells(s, row)
    kernel = row.kernel_size
    return {
        "type": row.type,
        "input_shape": inputs,
        "output_shape": outputs,
        "kernel_size": "--" if kernel is None else "x".join(str(k) for k in kernel),
        "groups": "--" if row.groups is None else str(row.groups),
        "params": _params_cell(row),
        "params_percent": "--" if alias else _percent(row.params, s.total_params),
        "effective_params": "--" if alias or row.effective_params == 0 else f"{row.effective_params:,}",
        "trainable": "--" if alias or (row.params == 0 and not row.is_lazy) else str(row.trainable),
        "flops": flops,
        "mode": row.mode,
        "hooks": ", ".join(row.hooks),
    }


def _param_cells(s: ModelSummary, info: ParamInfo) -> dict[str, str]:
    kind = "UninitializedParameter" if info.is_lazy else "Parameter (pruned)" if info.is_pruned else "Parameter"
    return {
        "type": kind,
        "input_shape": "",
        "output_shape": "?" if info.shape is None else format_shape(info.shape),
        "kernel_size": "",
        "groups": "",
        "params": "uninitialized" if info.is_lazy else f"{info.numel:,}",
        "params_percent": _percent(info.numel, s.total_params),
        "effective_params": "" if info.is_lazy else f"{info.effective:,}",
        "trainable": str(info.trainable),
        "flops": "",
        "mode": "",
        "hooks": "",
    }


def _suffix(s: ModelSummary, row: LayerRow) -> str:
    if row.same_as is not None:
        return f" (= {row.same_as or 'root'})"
    if row.in_script:
        return " (in TorchScript)"
    scripted = " (TorchScript)" if row.is_scripted else ""
    if row.calls == 0:
        return scripted + (" (not called)" if s.has_run and row.has_forward else "")
    return scripted + (f" ({row.calls} calls)" if row.calls > 1 else "")


def _tree_prefixes(depths: list[int], ascii_only: bool) -> list[str]:
    tee, elbow, bar, blank = _TREE[ascii_only]
    last = _last_children(depths)
    ancestors: list[bool] = []  # ancestors[depth]: whether the open line at that depth is a last child
    out = []
    for depth, is_last in zip(depths, last, strict=True):
        del ancestors[depth:]
        parts = [blank if done else bar for done in ancestors[1:]]
        out.append("".join(parts) + ((elbow if is_last else tee) if depth else ""))
        ancestors.append(is_last)
    return out


def _last_children(depths: list[int]) -> list[bool]:
    """Whether each line is the last child of its parent (one backward pass)."""
    last = [True] * len(depths)
    seen: set[int] = set()  # depths met since the last shallower line, scanning backwards
    for index in range(len(depths) - 1, -1, -1):
        depth = depths[index]
        last[index] = depth not in seen
        seen = {d for d in seen if d < depth} | {depth}
    return last


def table_lines(s: ModelSummary, depth: int | None, view: TableView, ascii_only: bool) -> list[Line]:
    """Every line of the table, prefixes and labels included, cells not yet cut to any width."""
    lines: list[Line] = []
    depths: list[int] = []
    counters: dict[int, int] = {}
    for row in visible_rows(s, depth, view.order):
        suffix = _suffix(s, row)
        if view.depth_index and row.depth:
            counters[row.depth] = counters.get(row.depth, 0) + 1
            suffix += f": {row.depth}-{counters[row.depth]}"
        name = row.path or f"{s.model} (root)"
        lines.append(Line("", name, suffix, _module_cells(s, row)))
        depths.append(row.depth)
        if view.param_rows and row.same_as is None:
            for info in row.parameters:
                lines.append(Line("", info.name, "", _param_cells(s, info), is_param=True))
                depths.append(row.depth + 1)
    prefixes = _tree_prefixes(depths, ascii_only) if view.order == "tree" else ["  " * d for d in depths]
    for line, prefix in zip(lines, prefixes, strict=True):
        line.prefix = prefix
    return lines
