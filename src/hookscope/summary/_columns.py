"""The columns a summary table can show, and the view options (`columns=`, `widths=`, rows) with their checks.

Each `Column` says its header, whether it holds numbers (right-aligned, never cut) and how its text shortens
(`path`, `middle`, `end`). `TableView` holds the choices of `summary(...)` and `to_text`/`to_rich`: which columns,
maximum widths of text columns, per-parameter rows, depth-index labels and row order. Cells are computed in
`_render.py`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["COLUMNS", "DEFAULT_COLUMNS", "DROP_ORDER", "ORDERS", "Column", "TableView", "make_view"]


@dataclass(frozen=True)
class Column:
    """One column of the table: its header, alignment and how its text may shorten to fit a width."""

    name: str
    header: str
    is_number: bool = False
    shorten: str = "end"  # "path" (dotted paths), "middle" (names), "end" (shapes, lists); numbers never
    soft_minimum: int | None = None
    hard_minimum: int | None = None


COLUMNS: dict[str, Column] = {
    column.name: column
    for column in (
        Column("layer", "Layer", shorten="path", soft_minimum=24, hard_minimum=12),
        Column("type", "Type", shorten="middle", soft_minimum=12, hard_minimum=6),
        Column("input_shape", "Input shape", soft_minimum=16, hard_minimum=8),
        Column("output_shape", "Output shape", soft_minimum=16, hard_minimum=8),
        Column("kernel_size", "Kernel", soft_minimum=8, hard_minimum=5),
        Column("groups", "Groups", is_number=True),
        Column("params", "Params", is_number=True),
        Column("params_percent", "Params %", is_number=True),
        Column("effective_params", "Effective", is_number=True),
        Column("trainable", "Trainable", soft_minimum=7, hard_minimum=5),
        Column("flops", "FLOPs", is_number=True),
        Column("mode", "Mode"),
        Column("hooks", "Hooks", soft_minimum=12, hard_minimum=6),
    )
}
"""Every column, by the name `columns=` and `widths=` use (`layer` is always shown, first)."""

DEFAULT_COLUMNS = ("type", "input_shape", "output_shape", "params", "trainable", "flops", "mode", "hooks")
"""The columns shown when `columns=None` (plus `effective_params` when a pruning mask applies; `hooks` only when
some module has one)."""

DROP_ORDER = (
    "hooks", "input_shape", "mode", "groups", "kernel_size", "params_percent", "trainable", "type",
    "effective_params", "output_shape", "flops",
)  # fmt: skip
"""Which columns go first when a table cannot fit its width otherwise (`layer` and `params` never go)."""

ORDERS = ("tree", "execution")


@dataclass(frozen=True)
class TableView:
    """How a summary is drawn: columns, text widths, extra rows, labels and row order.

    Attributes:
        columns: Names of the columns after `layer`, in order (`None`: `DEFAULT_COLUMNS`).
        widths: `(column, maximum width)` pairs for text columns (`layer`, `type`, shapes, `kernel_size`,
            `trainable`, `hooks`); longer text is shortened, numbers never are.
        param_rows: Whether each module's own parameters get a row (name, shape, count), as torchinfo's
            `verbose=2`.
        depth_index: Whether module names carry torchinfo's `depth-index` label (`: 2-3`, the third module at
            depth 2 in the table).
        order: `"tree"` (registration order, with tree lines) or `"execution"` (order of first call, indented).
    """

    columns: tuple[str, ...] | None = None
    widths: tuple[tuple[str, int], ...] = ()
    param_rows: bool = False
    depth_index: bool = False
    order: str = "tree"

    def width_of(self, column: str) -> int | None:
        """The maximum width set for `column`, or `None`."""
        return dict(self.widths).get(column)


def _check_columns(columns: Any) -> tuple[str, ...] | None:
    if columns is None:
        return None
    names = (columns,) if isinstance(columns, str) else tuple(columns) if isinstance(columns, Iterable) else None
    choices = [name for name in COLUMNS if name != "layer"]
    if names is None or not names or any(name not in choices for name in names):
        raise ValueError(f"columns must be a sequence of names from {choices}, got {columns!r}")
    return tuple(dict.fromkeys(names))


def _check_widths(widths: Any) -> tuple[tuple[str, int], ...]:
    if widths is None:
        return ()
    text_columns = [name for name, column in COLUMNS.items() if not column.is_number and column.name != "mode"]
    if not isinstance(widths, Mapping):
        raise ValueError(f"widths must be a dict of column name -> maximum width, got {widths!r}")
    for name, width in widths.items():
        if name not in text_columns:
            raise ValueError(
                f"widths can only limit the text columns {text_columns} (numbers are never cut), got {name!r}"
            )
        if not isinstance(width, int) or isinstance(width, bool) or width < 3:
            raise ValueError(f"widths[{name!r}] must be an int of at least 3, got {width!r}")
    return tuple(widths.items())


def _check_flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def make_view(
    base: TableView | None = None,
    *,
    columns: Any = None,
    widths: Any = None,
    param_rows: Any = None,
    depth_index: Any = None,
    order: Any = None,
) -> TableView:
    """Return `base` (default: `TableView()`) with the options given (`None`: keep), each checked.

    Raises:
        ValueError: an option is malformed; the message names it, the value and the choices.
    """
    view = base or TableView()
    if order is not None and order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    return TableView(
        columns=_check_columns(columns) if columns is not None else view.columns,
        widths=_check_widths(widths) if widths is not None else view.widths,
        param_rows=_check_flag("param_rows", param_rows) if param_rows is not None else view.param_rows,
        depth_index=_check_flag("depth_index", depth_index) if depth_index is not None else view.depth_index,
        order=order if order is not None else view.order,
    )
