"""HTML pieces that the report and the notebook displays share: escaped text, cells, tables, small line charts.

Everything shown comes from users' models (module paths, class names, messages), so every piece of text goes
through `text`: bidi and control characters made visible (`hookscope._text.neutralize`), then HTML-escaped,
quotes included. The line charts are inline SVG drawn here (no matplotlib, no script, no network), small enough
to sit in a table cell. Styles are inline attributes, so a fragment looks the same in a notebook, where a page's
style sheet is not ours, and in the report.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from typing import Any

from ._text import neutralize

__all__ = ["NUMBER_STYLE", "TABLE_STYLE", "cell", "is_number", "sparkline", "table", "text"]

TABLE_STYLE = "border-collapse:collapse;font-size:.85em;margin:.4em 0"
"""The style of a table: a table holds small figures side by side."""
NUMBER_STYLE = "text-align:right;font-variant-numeric:tabular-nums"
"""The style of a number cell: right-aligned, digits of one width."""
_CELL_STYLE = "border:1px solid #d5dbe6;padding:.15em .45em;text-align:left;vertical-align:middle"
_HEAD = "background:#eef1f6"


def text(value: object) -> str:
    """Return `value` as HTML text: neutralized (see `hookscope._text.neutralize`), then escaped, quotes included.

    >>> text("<img src=x onerror=alert(1)>\\u202e")
    '&lt;img src=x onerror=alert(1)&gt;&lt;U+202E&gt;'
    """
    return html.escape(neutralize(value), quote=True)


def is_number(value: object) -> bool:
    """Whether `value` is an int or float (not a bool): numbers are right-aligned and formatted by `cell`."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def cell(value: object) -> str:
    """Return the text of a table cell (not escaped): floats with 4 significant digits, ints with thousands
    separators, `None` as empty.

    >>> cell(0.000123456), cell(1234567), cell(None), cell("ReLU")
    ('0.0001235', '1,234,567', '', 'ReLU')
    """
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return "" if value is None else str(value)


def table(
    header: Iterable[object], rows: Iterable[Iterable[Any]], *, raw: Sequence[int] = (), styled: bool = True
) -> str:
    """Return an HTML table: escaped header and cells, numbers marked `class="num"` (and right-aligned).

    Args:
        header: The column titles.
        rows: The rows of cells: numbers, text or `None`.
        raw: Indices of columns whose cells are HTML already made safe by the caller (a `sparkline`).
        styled: Inline styles on every element (a notebook); `False` leaves the styling to the page's style
            sheet (the report).

    >>> table(["layer", "mean"], [["<b>", 0.5]], styled=False).split("<tbody>")[1]
    '<tr><td>&lt;b&gt;</td><td class="num">0.5</td></tr></tbody></table>'
    """
    plain, number, heading = (
        (f' style="{_CELL_STYLE}"', f' style="{_CELL_STYLE};{NUMBER_STYLE}"', f' style="{_CELL_STYLE};{_HEAD}"')
        if styled
        else ("", "", "")
    )
    head = "".join(f"<th{heading}>{text(title)}</th>" for title in header)
    body = []
    for row in rows:
        cells = []
        for index, value in enumerate(row):
            if index in raw:
                cells.append(f"<td{plain}>{value}</td>")
            elif is_number(value):
                cells.append(f'<td class="num"{number}>{text(cell(value))}</td>')
            else:
                cells.append(f"<td{plain}>{text(cell(value))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    opening = f'<table style="{TABLE_STYLE}">' if styled else "<table>"
    return f"{opening}<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def sparkline(
    values: Sequence[float], *, width: int = 120, height: int = 26, title: str = "", color: str = "#3b6fb6"
) -> str:
    """Return a small inline SVG line chart of `values` (oldest first), its range in the tooltip.

    Non-finite values leave a gap; a lone finite value is a dot. More values than `width` are drawn as `width`
    points, each the mean of the finite values of an equal run of steps (a gap where a run has none), so the
    chart stays small however long the run. `title` (escaped) names the series in the tooltip, with the first
    and last value and the range of every value. With no finite value, a short note is returned instead.
    """
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return '<span style="color:#889">no finite values</span>'
    low, high = min(finite), max(finite)
    span = high - low or 1.0
    drawn = _thinned(values, width)
    step = (width - 4) / max(len(drawn) - 1, 1)
    points = [
        (2 + i * step, height - 2 - (v - low) / span * (height - 4)) if math.isfinite(v) else None
        for i, v in enumerate(drawn)
    ]
    shapes = [_path(run, color) if len(run) > 1 else _dot(run[0], color) for run in _runs(points)]
    first, last = next(v for v in values if math.isfinite(v)), finite[-1]
    tip = f"{title}: " if title else ""
    tip += f"{cell(first)} → {cell(last)} (min {cell(low)}, max {cell(high)}, {len(values)} steps)"
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'role="img" aria-label="{text(tip)}" style="vertical-align:middle"><title>{text(tip)}</title>'
        f"{''.join(shapes)}</svg>"
    )


def _thinned(values: Sequence[float], most: int) -> list[float]:
    """`values` as at most `most` points: the mean of the finite values of each of `most` equal runs (NaN if none)."""
    if len(values) <= most:
        return list(values)
    out = []
    for index in range(most):
        run = [v for v in values[index * len(values) // most : (index + 1) * len(values) // most] if math.isfinite(v)]
        out.append(sum(run) / len(run) if run else math.nan)
    return out


def _runs(points: list[tuple[float, float] | None]) -> list[list[tuple[float, float]]]:
    """Split the points into runs of consecutive finite ones (a gap where a value is missing)."""
    runs: list[list[tuple[float, float]]] = [[]]
    for point in points:
        if point is None:
            if runs[-1]:
                runs.append([])
        else:
            runs[-1].append(point)
    return [run for run in runs if run]


def _path(run: list[tuple[float, float]], color: str) -> str:
    coordinates = " ".join(f"{x:.1f},{y:.1f}" for x, y in run)
    return f'<polyline fill="none" stroke="{color}" stroke-width="1.3" points="{coordinates}"/>'


def _dot(point: tuple[float, float], color: str) -> str:
    return f'<circle cx="{point[0]:.1f}" cy="{point[1]:.1f}" r="1.8" fill="{color}"/>'
