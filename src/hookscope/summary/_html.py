"""The summary as an HTML fragment for notebooks: the text table's lines, header and totals, escaped. Pure.

It draws the same cells as the text table (`_cells.table_lines`), so the two cannot disagree; a notebook wraps
long cells instead of cutting them, so nothing is shortened here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._html import NUMBER_STYLE, TABLE_STYLE, text
from ._cells import column_names, table_lines
from ._columns import COLUMNS, TableView
from ._render import footer_lines, title_lines

if TYPE_CHECKING:
    from ._table import ModelSummary

__all__ = ["render_html", "short_repr"]

_CELL = "border-bottom:1px solid #e3e7ef;padding:.1em .6em;text-align:left;vertical-align:top"
_TREE = "white-space:pre;font-family:ui-monospace,monospace"


def render_html(s: ModelSummary, depth: int | None, view: TableView | None = None) -> str:
    """Return the summary as an HTML table (rows down to `depth`) with its header notes and totals.

    Every cell is escaped: module paths and class names come from the user's model.
    """
    view = view or s.view
    names = column_names(s, view)
    numeric = [COLUMNS[name].is_number for name in names]
    head = f'<th style="{_CELL}">Layer</th>' + "".join(
        f'<th style="{_CELL}{";" + NUMBER_STYLE if number else ""}">{text(COLUMNS[name].header)}</th>'
        for name, number in zip(names, numeric, strict=True)
    )
    body = []
    for line in table_lines(s, depth, view, ascii_only=False):
        layer = f'<td style="{_CELL};{_TREE}">{text(line.prefix)}{_name(line.name, line.is_param)}{text(line.suffix)}'
        cells = "".join(
            f'<td style="{_CELL}{";" + NUMBER_STYLE if number else ""}">{text(line.cells.get(name, ""))}</td>'
            for name, number in zip(names, numeric, strict=True)
        )
        body.append(f"<tr>{layer}</td>{cells}</tr>")
    title = "<br>".join(text(line) for line in title_lines(s))
    footer = "<br>".join(text(line) for line in footer_lines(s, depth))
    return (
        f"<div class='hookscope-summary'><p style='margin:.3em 0'>{title}</p>"
        f'<table style="{TABLE_STYLE}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'
        f"<p style='margin:.3em 0;color:#445'>{footer}</p></div>"
    )


def _name(name: str, is_param: bool) -> str:
    return f"<i>{text(name)}</i>" if is_param else text(name)


def short_repr(s: ModelSummary) -> str:
    """One line: the model, its modules, parameters and FLOPs (`str(s)` is the whole table).

    >>> import torch.nn as nn
    >>> from hookscope import summary
    >>> summary(nn.Linear(2, 3), input_size=(1, 2))
    ModelSummary(Linear: 1 module, 9 params, 12 FLOPs; print() it for the table)
    """
    modules = len(s.rows)
    flops = f", {s.total_flops:,} FLOPs" if s.has_run else ""
    plural = "" if modules == 1 else "s"
    return (
        f"ModelSummary({s.model}: {modules} module{plural}, {s.total_params:,} params{flops}; print() it for the table)"
    )
