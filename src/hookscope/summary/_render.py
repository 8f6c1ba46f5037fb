"""Render a `ModelSummary`: a plain-text table (Unicode or ASCII tree) and a `rich` table. Pure formatting."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._shapes import format_shape

if TYPE_CHECKING:
    from ._table import LayerRow, ModelSummary

__all__ = ["format_bytes", "format_flops", "render_rich", "render_text"]

_HEADERS = ("Layer", "Type", "Input shape", "Output shape", "Params", "Trainable", "FLOPs", "Mode", "Hooks")
_RIGHT = {"Params", "FLOPs"}
_TREE = {False: ("├─", "└─", "│ ", "  "), True: ("|-", "`-", "| ", "  ")}


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


def _visible(s: ModelSummary, depth: int | None) -> list[LayerRow]:
    return [row for row in s.rows if depth is None or row.depth <= depth]


def _prefixes(rows: list[LayerRow], ascii_only: bool) -> list[str]:
    tee, elbow, bar, blank = _TREE[ascii_only]
    last = _last_children(rows)
    ancestors: list[bool] = []  # ancestors[depth]: whether the open row at that depth is a last child
    out = []
    for row, is_last in zip(rows, last, strict=True):
        del ancestors[row.depth :]
        parts = [blank if done else bar for done in ancestors[1:]]
        out.append("".join(parts) + ((elbow if is_last else tee) if row.depth else ""))
        ancestors.append(is_last)
    return out


def _last_children(rows: list[LayerRow]) -> list[bool]:
    """Whether each row is the last child of its parent among `rows` (one backward pass)."""
    last = [True] * len(rows)
    seen: set[int] = set()  # depths met since the last shallower row, scanning backwards
    for index in range(len(rows) - 1, -1, -1):
        depth = rows[index].depth
        last[index] = depth not in seen
        seen = {d for d in seen if d < depth} | {depth}
    return last


def _name(row: LayerRow, model: str) -> str:
    name = row.path or f"{model} (root)"
    if row.same_as is not None:
        return f"{name} (= {row.same_as or 'root'})"
    if row.calls == 0:
        return f"{name} (not called)" if row.has_forward else name
    return f"{name} ({row.calls} calls)" if row.calls > 1 else name


def _cut(text: str, width: int | None, ascii_only: bool) -> str:
    if width is None or len(text) <= width:
        return text
    ellipsis = "..." if ascii_only else "…"
    return text[: max(width - len(ellipsis), 1)] + ellipsis


def _cells(row: LayerRow, model: str, shape_width: int | None, ascii_only: bool) -> list[str]:
    alias, called = row.same_as is not None, row.calls > 0
    params = "--" if alias or row.params == 0 else f"{row.params:,}" + ("*" if row.shares_with else "")
    trainable = "--" if alias or row.params == 0 else str(row.trainable)
    return [
        _name(row, model),
        row.type,
        _cut(format_shape(row.input_shape), shape_width, ascii_only) if called else "--",
        _cut(format_shape(row.output_shape), shape_width, ascii_only) if called else "--",
        params,
        trainable,
        format_flops(row.flops) if called or row.flops else "--",
        row.mode,
        ", ".join(row.hooks),
    ]


def _table(
    s: ModelSummary, depth: int | None, ascii_only: bool, shape_width: int | None
) -> tuple[list[str], list[list[str]]]:
    rows = _visible(s, depth)
    cells = [_cells(row, s.model, shape_width, ascii_only) for row in rows]
    for prefix, line in zip(_prefixes(rows, ascii_only), cells, strict=True):
        line[0] = prefix + line[0]
    headers = list(_HEADERS)
    if not any(line[-1] for line in cells):
        headers, cells = headers[:-1], [line[:-1] for line in cells]
    return headers, cells


def footer_lines(s: ModelSummary, depth: int | None) -> list[str]:
    """Return the totals and notes printed under the table."""
    lines = [
        f"Total params: {s.total_params:,}",
        f"Trainable params: {s.trainable_params:,}",
        f"Non-trainable params: {s.non_trainable_params:,}",
    ]
    if s.shared_params:
        ties = "; ".join(" = ".join(names) for names in s.shared_names)
        lines.append(f"Shared params: {s.shared_params:,}, counted once (* rows): {ties}")
    lines += [
        f"Total FLOPs: {format_flops(s.total_flops)} (forward, FlopCounterMode)",
        f"Input size: {format_bytes(s.input_bytes)}",
        f"Forward activations (est.): {format_bytes(s.activation_bytes)}",
        f"Params size: {format_bytes(s.param_bytes)}",
        f"Buffers size: {format_bytes(s.buffer_bytes)}",
        f"Estimated total size: {format_bytes(s.total_bytes)}",
    ]
    if s.global_hooks:
        lines.append(f"Global hooks: {', '.join(s.global_hooks)}")
    if any(row.same_as is not None for row in _visible(s, depth)):
        lines.append("(= path): the same module object registered again; its parameters and calls are on that row")
    return lines


def _title(s: ModelSummary) -> str:
    how = {"same": "with each module's own train/eval mode"}.get(s.run_mode, f"in {s.run_mode} mode")
    return f"{s.model}: forward run {how}, without gradients; FLOPs and Params include submodules"


def render_text(s: ModelSummary, depth: int | None, ascii_only: bool = False, shape_width: int | None = 60) -> str:
    """Render the summary as a text table with a tree of module paths, then the totals."""
    headers, cells = _table(s, depth, ascii_only, shape_width)
    widths = [max(len(line[i]) for line in [headers, *cells]) for i in range(len(headers))]

    def join(line: list[str]) -> str:
        padded = (c.rjust(w) if h in _RIGHT else c.ljust(w) for c, w, h in zip(line, widths, headers, strict=True))
        return "  ".join(padded).rstrip()

    rule_width = sum(widths) + 2 * (len(widths) - 1)
    heavy, light = ("=" * rule_width, "-" * rule_width) if ascii_only else ("═" * rule_width, "─" * rule_width)
    body = [join(line) for line in cells]
    return "\n".join([_title(s), heavy, join(headers), heavy, *body, light, *footer_lines(s, depth)]) + "\n"


def render_rich(s: ModelSummary, depth: int | None) -> Any:
    """Return a `rich.table.Table` of the summary, totals in its caption."""
    from rich.table import Table
    from rich.text import Text

    headers, cells = _table(s, depth, ascii_only=False, shape_width=None)
    caption = Text("\n".join(footer_lines(s, depth)))
    table = Table(title=Text(_title(s)), caption=caption, caption_justify="left")
    for header in headers:
        table.add_column(header, justify="right" if header in _RIGHT else "left", no_wrap=header == "Layer")
    for line in cells:
        table.add_row(*(Text(cell) for cell in line))  # Text: shapes like [2, 3] are not markup
    return table
