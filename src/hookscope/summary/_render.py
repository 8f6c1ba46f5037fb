"""Render a `ModelSummary`: a plain-text table (Unicode or ASCII tree) and a `rich` table. Pure formatting.

Both renderings take the same lines (`_cells.py`) and, given a width, the same fitting (`_fit.py`): text columns
shorten (paths in the middle, names in the middle, shapes at the end), then low-priority columns are left out
and the caption says which; numbers are never cut.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._cells import Line, column_names, format_bytes, format_flops, table_lines
from ._columns import COLUMNS, DROP_ORDER, Column, TableView
from ._fit import ColumnFit, fit_widths, shorten_end, shorten_middle, shorten_path
from ._flops import COUNTED_OPS

if TYPE_CHECKING:
    from ._table import ModelSummary

__all__ = ["format_bytes", "format_flops", "render_rich", "render_text"]

_GAP = 2  # characters between columns, in both renderings


@dataclass
class _Grid:
    """The table cut to its widths: headers, cells, alignment, and the columns left out."""

    headers: list[str]
    cells: list[list[str]]
    numeric: list[bool]
    dropped: list[str]
    width: int | None


def _ellipsis(ascii_only: bool) -> str:
    return "..." if ascii_only else "…"


def _layer_cell(line: Line, width: int | None, ellipsis: str) -> str:
    text = line.prefix + line.name + line.suffix
    if width is None or len(text) <= width:
        return text
    for suffix in (line.suffix, ""):  # a note such as "(not called)" goes before the name becomes unreadable
        room = width - len(line.prefix) - len(suffix)
        if room >= len(ellipsis) + 5:  # ancestors are on the rows above: keep the end of the path
            return line.prefix + shorten_path(line.name, room, ellipsis, keep_first=False) + suffix
    return shorten_end(text, width, ellipsis)


def _cut(column: Column, text: str, width: int | None, ellipsis: str) -> str:
    if width is None or column.is_number:
        return text
    return shorten_middle(text, width, ellipsis) if column.shorten == "middle" else shorten_end(text, width, ellipsis)


def _column_fit(column: Column, natural: int, header: str) -> ColumnFit:
    """How a column may shrink: headers stay whole until the last resort (hard minimums)."""
    soft = None if column.soft_minimum is None else max(column.soft_minimum, len(header))
    return ColumnFit(natural, soft, column.hard_minimum)


def _header(s: ModelSummary, view: TableView, name: str) -> str:
    if name == "output_shape" and view.param_rows and s.has_run:
        return "Output / param shape"
    if name == "output_shape" and view.param_rows:
        return "Param shape"
    return COLUMNS[name].header


def _grid(
    s: ModelSummary, depth: int | None, view: TableView, ascii_only: bool, caps: dict[str, int], width: int | None
) -> _Grid:
    lines = table_lines(s, depth, view, ascii_only)
    names = ["layer", *column_names(s, view)]
    headers = [_header(s, view, name) for name in names]
    ellipsis = _ellipsis(ascii_only)

    def natural(index: int) -> int:
        name = names[index]
        texts = [line.prefix + line.name + line.suffix if name == "layer" else line.cells[name] for line in lines]
        longest = max([len(headers[index]), *(len(text) for text in texts)])
        cap = caps.get(name)
        return longest if cap is None or COLUMNS[name].is_number else max(min(longest, cap), len(headers[index]))

    widths = {i: natural(i) for i in range(len(names))}
    dropped: list[int] = []
    if width is not None:
        fits = [_column_fit(COLUMNS[n], widths[i], headers[i]) for i, n in enumerate(names)]
        empty = [i for i, n in enumerate(names) if n != "layer" and not any(line.cells[n] for line in lines)]
        order = empty + [names.index(n) for n in DROP_ORDER if n in names and names.index(n) not in empty]
        result = fit_widths(fits, width, _GAP, order)
        widths, dropped = result.widths, list(result.dropped)
    kept = [i for i in range(len(names)) if i not in dropped]
    cells = [
        [
            _layer_cell(line, widths[i], ellipsis)
            if names[i] == "layer"
            else _cut(COLUMNS[names[i]], line.cells[names[i]], widths[i], ellipsis)
            for i in kept
        ]
        for line in lines
    ]
    return _Grid(
        headers=[_cut(COLUMNS[names[i]], headers[i], widths[i], ellipsis) for i in kept],
        cells=cells,
        numeric=[COLUMNS[names[i]].is_number for i in kept],
        dropped=[headers[i] for i in dropped],
        width=width,
    )


def _run_words(s: ModelSummary) -> str:
    if not s.has_run:
        return "parameters only, no forward run"
    how = {"same": "with each module's own train/eval mode"}.get(s.run_mode, f"in {s.run_mode} mode")
    grad = "with gradients (to see what backward keeps)" if s.memory is not None else "without gradients"
    return f"forward run {how}, {grad}"


def title_lines(s: ModelSummary) -> list[str]:
    """The header: what ran and how, and what the table can and cannot tell (notes)."""
    lines = [f"{s.model}: {_run_words(s)}; FLOPs and Params include submodules"]
    lines += list(s.notes)
    if s.has_run:
        lines.append(COUNTED_OPS)
        if s.run_mode != "same" and any(row.mode != s.run_mode for row in s.rows):
            lines.append(f"Mode: each module's own train/eval setting, restored after the {s.run_mode}-mode run")
    return lines


def _memory_lines(s: ModelSummary) -> list[str]:
    memory = s.memory
    if memory is None:
        return []
    lines = [
        f"Saved for backward (est.): {format_bytes(memory.saved_bytes)}",
        f"Gradients: {format_bytes(memory.gradient_bytes)}",
    ]
    if memory.optimizer is not None:
        lines.append(f"Optimizer state ({memory.optimizer}): {format_bytes(memory.optimizer_bytes)}")
    lines.append(f"Training step total (est.): {format_bytes(memory.total_bytes)}")
    return lines


def _param_lines(s: ModelSummary) -> list[str]:
    lines = [
        f"Total params: {s.total_params:,}",
        f"Trainable params: {s.trainable_params:,}",
        f"Non-trainable params: {s.non_trainable_params:,}",
    ]
    if s.effective_params != s.total_params:
        lines.append(f"Effective params (pruning masks applied): {s.effective_params:,}")
    if s.shared_params:
        ties = "; ".join(" = ".join(names) for names in s.shared_names)
        lines.append(f"Shared params: {s.shared_params:,}, counted once (* rows): {ties}")
    return lines


def footer_lines(s: ModelSummary, depth: int | None, dropped: list[str] | None = None, width: int = 0) -> list[str]:
    """Return the totals and notes printed under the table."""
    lines = _param_lines(s)
    flops = f"{format_flops(s.total_flops)} (forward)" if s.has_run else "unknown (no forward run)"
    lines += [f"Total FLOPs: {flops}"]
    if s.has_run:
        lines += [
            f"Input size: {format_bytes(s.input_bytes)}",
            f"Forward activations (est.): {format_bytes(s.activation_bytes)}",
        ]
    lines += [f"Params size: {format_bytes(s.param_bytes)}", f"Buffers size: {format_bytes(s.buffer_bytes)}"]
    lines += [f"Estimated total size: {format_bytes(s.total_bytes)}", *_memory_lines(s)]
    if s.global_hooks:
        lines.append(f"Global hooks: {', '.join(s.global_hooks)}")
    if any(row.same_as is not None for row in s.rows if depth is None or row.depth <= depth):
        lines.append("(= path): the same module object registered again; its parameters and calls are on that row")
    if dropped:
        lines.append(f"Left out to fit {width} columns: {', '.join(dropped)} (widen the terminal or pick columns=)")
    return lines


def render_text(
    s: ModelSummary,
    depth: int | None,
    ascii_only: bool = False,
    shape_width: int | None = 60,
    view: TableView | None = None,
    width: int | None = None,
) -> str:
    """Render the summary as a text table with a tree of module paths, then the totals."""
    view = view or s.view
    caps = {"input_shape": shape_width, "output_shape": shape_width} if shape_width is not None else {}
    caps.update(dict(view.widths))
    grid = _grid(s, depth, view, ascii_only, {k: v for k, v in caps.items() if v is not None}, width)
    widths = [max(len(line[i]) for line in [grid.headers, *grid.cells]) for i in range(len(grid.headers))]

    def join(line: list[str]) -> str:
        padded = (c.rjust(w) if num else c.ljust(w) for c, w, num in zip(line, widths, grid.numeric, strict=True))
        return (" " * _GAP).join(padded).rstrip()

    rule_width = sum(widths) + _GAP * (len(widths) - 1)
    heavy, light = ("=" * rule_width, "-" * rule_width) if ascii_only else ("═" * rule_width, "─" * rule_width)
    body = [join(line) for line in grid.cells]
    title, footer = title_lines(s), footer_lines(s, depth, grid.dropped, width or 0)
    if width is not None:  # words wrap, as rich does: no number is cut
        title, footer = _wrapped(title, width), _wrapped(footer, width)
    return "\n".join([*title, heavy, join(grid.headers), heavy, *body, light, *footer]) + "\n"


def _wrapped(lines: list[str], width: int) -> list[str]:
    return [part for line in lines for part in textwrap.wrap(line, width, break_on_hyphens=False) or [""]]


def render_rich(s: ModelSummary, depth: int | None, view: TableView | None = None, width: int | None = None) -> Any:
    """Return a `rich.table.Table` of the summary fitted to `width` columns, totals in its caption."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    view = view or s.view
    grid = _grid(s, depth, view, False, dict(view.widths), width)
    caption = Text("\n".join(footer_lines(s, depth, grid.dropped, width or 0)))
    table = Table(
        title=Text("\n".join(title_lines(s))),
        caption=caption,
        title_justify="left",
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        collapse_padding=True,
    )
    widths = [max(len(line[i]) for line in [grid.headers, *grid.cells]) for i in range(len(grid.headers))]
    for header, numeric, column_width in zip(grid.headers, grid.numeric, widths, strict=True):
        table.add_column(
            header, justify="right" if numeric else "left", no_wrap=True, width=column_width, min_width=column_width
        )
    for line in grid.cells:
        table.add_row(*(Text(cell) for cell in line))  # Text: shapes like [2, 3] are not markup
    return table
