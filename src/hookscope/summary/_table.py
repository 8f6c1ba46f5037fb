"""The summary as data: one `LayerRow` per module, the totals, and `to_dict` / text / rich views."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from .._errors import unknown_name
from ._columns import TableView, make_view
from ._memory import TrainingMemory
from ._params import ParamInfo
from ._shapes import as_lists

__all__ = ["LayerRow", "ModelSummary", "Trainable"]

Trainable = bool | Literal["Partial"]


@dataclass(frozen=True)
class LayerRow:
    """One module of the model, with what its calls in the recorded forward did.

    Counts are inclusive: `params`, `param_bytes`, `buffer_bytes` and `flops` of a row cover its submodules
    (parameters used by several submodules once), so a row folded by `depth` still tells its whole subtree.

    Attributes:
        path: Dotted module path (`""` for the root), normalized as `hookscope.hooks.named_modules` does.
        type: Class name of the module.
        depth: Nesting depth (0 for the root).
        calls: How many times the module ran in the forward (0: never called).
        input_shape: Shape description of the arguments of its first call (`None` if never called).
        output_shape: Shape description of the output of its first call.
        params: Parameters of the module and its submodules, each counted once.
        own_params: Parameters of the module itself, not of its submodules.
        trainable: `True` if every parameter requires grad, `"Partial"` if some do, `False` otherwise (also
            when there are no parameters).
        flops: FLOPs of all its calls, submodule calls included (FlopCounterMode's count); for a module that
            never ran itself (a ModuleList), the sum of its children's.
        self_flops: FLOPs of its calls minus those of the module calls they made; these sum to the total.
        mode: `"train"` or `"eval"`: the module's mode as the user had it (not the mode the summary ran in).
        hooks: Hooks attached to it and its own parameters before the summary, as `kind[owner]` labels.
        shares_with: Paths of other modules that use one of its own parameters (tied weights).
        same_as: For a module object registered under a second path, the path of its first row.
        param_bytes: Bytes of its parameters (inclusive, counted once).
        buffer_bytes: Bytes of its buffers (inclusive, counted once).
        output_bytes: Bytes of the tensors its calls returned.
        is_leaf: Whether it has no submodules.
        has_forward: Whether the module can be called (a ModuleList or ModuleDict cannot).
        kernel_size: Its `kernel_size` as a tuple (convolutions, pooling), else `None`.
        groups: Its `groups` (convolutions) or `num_groups` (GroupNorm), else `None`.
        parameters: The parameters it holds itself: name, shape, stored and effective counts, flags.
        effective_params: Like `params`, with pruning masks applied (non-zero mask entries).
        is_lazy: Whether it or a submodule holds an uninitialized lazy parameter (not counted in `params`).
        is_scripted: Whether it is a TorchScript module.
        in_script: Whether it runs inside a scripted module, where no hook sees its calls.
        first_call: Position of its first call among all module calls of the forward (`None`: never called).
    """

    path: str
    type: str
    depth: int
    calls: int
    input_shape: Any
    output_shape: Any
    params: int
    own_params: int
    trainable: Trainable
    flops: int
    self_flops: int
    mode: str
    hooks: tuple[str, ...]
    shares_with: tuple[str, ...]
    same_as: str | None
    param_bytes: int
    buffer_bytes: int
    output_bytes: int
    is_leaf: bool
    has_forward: bool
    kernel_size: tuple[int, ...] | None = None
    groups: int | None = None
    parameters: tuple[ParamInfo, ...] = ()
    effective_params: int = 0
    is_lazy: bool = False
    is_scripted: bool = False
    in_script: bool = False
    first_call: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the row as JSON-ready values (shapes as nested lists)."""
        values = {name: getattr(self, name) for name in self.__dataclass_fields__}
        values["input_shape"] = as_lists(self.input_shape)
        values["output_shape"] = as_lists(self.output_shape)
        values["hooks"], values["shares_with"] = list(self.hooks), list(self.shares_with)
        values["kernel_size"] = None if self.kernel_size is None else list(self.kernel_size)
        values["parameters"] = [info.to_dict() for info in self.parameters]
        return values


@dataclass(frozen=True, repr=False)
class ModelSummary:
    """What `summary(model, ...)` found: rows in model order, totals, and renderings.

    `str(s)` (`print(s)`) is the text table, `repr(s)` one line; a notebook shows the table in HTML;
    `s.to_text(depth=1, ascii_only=True)` folds and picks the characters; `rich.print(s)` draws a rich table fitted
    to the terminal's width; `s.to_dict()` is JSON-ready.
    `s["encoder.0"]` is the row at a path.

    Attributes:
        model: Class name of the model.
        rows: One row per module, root first, in registration order.
        input_shape: Shape description of the inputs; `output_shape` that of the output.
        total_params: Parameters, each counted once even when shared between modules.
        trainable_params: Parameters that require grad.
        shared_params: Parameters that belong to more than one module (counted once in `total_params`).
        shared_names: For each shared parameter, its names in the modules that hold it (`embed.weight`, ...).
        param_bytes: Bytes of the parameters; `buffer_bytes` of the buffers.
        input_bytes: Bytes of the input tensors.
        activation_bytes: Estimate of the forward activations: bytes of the outputs of every leaf-module call.
        total_flops: FLOPs of the forward, FlopCounterMode's total.
        global_hooks: Labels of the hooks registered for every module of the process.
        run_mode: The mode the forward ran in (`"eval"`, `"train"` or `"same"`).
        depth: The default folding depth of the renderings (`None`: every row).
        has_run: Whether a forward ran; without one (no inputs, no forward) shapes and FLOPs are not known.
        notes: What the table cannot tell and why (no forward run, TorchScript, lazy modules, batch_dim), shown
            in the header.
        effective_params: Parameters with pruning masks applied (equals `total_params` without pruning).
        uninitialized: Paths of the modules holding uninitialized lazy parameters (not counted).
        scripted: Paths of the outermost TorchScript modules (what runs inside them is not seen).
        batch_dim: The `batch_dim` the inputs were built with (a batch of one inserted there), or `None`.
        memory: The training-step memory estimate (`with_backward=True` or an `optimizer`), else `None`.
        view: The default columns, widths, extra rows and order of the renderings.
    """

    model: str
    rows: tuple[LayerRow, ...]
    input_shape: Any
    output_shape: Any
    total_params: int
    trainable_params: int
    shared_params: int
    shared_names: tuple[tuple[str, ...], ...]
    param_bytes: int
    buffer_bytes: int
    input_bytes: int
    activation_bytes: int
    total_flops: int
    global_hooks: tuple[str, ...]
    run_mode: str
    depth: int | None = None
    has_run: bool = True
    notes: tuple[str, ...] = ()
    effective_params: int = 0
    uninitialized: tuple[str, ...] = ()
    scripted: tuple[str, ...] = ()
    batch_dim: int | None = None
    memory: TrainingMemory | None = None
    view: TableView = field(default_factory=TableView)

    @property
    def non_trainable_params(self) -> int:
        """Parameters that do not require grad."""
        return self.total_params - self.trainable_params

    @property
    def total_bytes(self) -> int:
        """Estimated memory of one forward: inputs, activations, parameters and buffers."""
        return self.input_bytes + self.activation_bytes + self.param_bytes + self.buffer_bytes

    @property
    def max_depth(self) -> int:
        """The depth of the deepest module."""
        return max(row.depth for row in self.rows)

    def __getitem__(self, path: str) -> LayerRow:
        for row in self.rows:
            if row.path == path:
                return row
        raise KeyError(unknown_name("path", path, (row.path for row in self.rows)))

    def to_dict(self) -> dict[str, Any]:
        """Return the summary as JSON-ready values: model, run mode, shapes, totals, notes and rows."""
        totals = {
            name: getattr(self, name)
            for name in (
                "total_params", "trainable_params", "non_trainable_params", "shared_params", "effective_params",
                "param_bytes", "buffer_bytes", "input_bytes", "activation_bytes", "total_bytes", "total_flops",
            )
        }  # fmt: skip
        return {
            "model": self.model,
            "run_mode": self.run_mode,
            "has_run": self.has_run,
            "notes": list(self.notes),
            "input_shape": as_lists(self.input_shape),
            "output_shape": as_lists(self.output_shape),
            "totals": totals,
            "memory": None if self.memory is None else self.memory.to_dict(),
            "shared_names": [list(names) for names in self.shared_names],
            "uninitialized": list(self.uninitialized),
            "scripted": list(self.scripted),
            "batch_dim": self.batch_dim,
            "global_hooks": list(self.global_hooks),
            "rows": [row.to_dict() for row in self.rows],
        }

    def to_text(
        self,
        depth: int | None = -1,
        ascii_only: bool = False,
        shape_width: int | None = 60,
        *,
        width: int | None = None,
        columns: Any = None,
        widths: Any = None,
        param_rows: bool | None = None,
        depth_index: bool | None = None,
        order: str | None = None,
    ) -> str:
        """Render the table as text, rows deeper than `depth` folded (`-1`: the summary's own `depth`).

        With `ascii_only=True` only ASCII characters are used (for logs and terminals without Unicode). Shape
        cells longer than `shape_width` characters are cut (`None`: never; `to_dict()` always has them whole).
        With `width`, the table fits that many columns: paths, names and shapes shorten, then low-priority
        columns are left out (the footer says which); numbers are never cut. `columns`, `widths`, `param_rows`,
        `depth_index` and `order` override the summary's own (see `summary`).

        Raises:
            ValueError: an option is malformed.
        """
        from ._render import render_text

        if width is not None and (not isinstance(width, int) or isinstance(width, bool) or width < 20):
            raise ValueError(f"width must be None or an int of at least 20 (columns), got {width!r}")
        view = make_view(
            self.view, columns=columns, widths=widths, param_rows=param_rows, depth_index=depth_index, order=order
        )
        chosen = self.depth if depth == -1 else depth
        return render_text(self, chosen, ascii_only=ascii_only, shape_width=shape_width, view=view, width=width)

    def to_rich(
        self,
        depth: int | None = -1,
        *,
        width: int | None = None,
        columns: Any = None,
        widths: Any = None,
        param_rows: bool | None = None,
        depth_index: bool | None = None,
        order: str | None = None,
    ) -> Any:
        """Return a `rich` table fitted to `width` columns (`None`: as wide as it needs), options as `to_text`.

        `console.print(s)` fits the console's width by itself.
        """
        from ._render import render_rich

        view = make_view(
            self.view, columns=columns, widths=widths, param_rows=param_rows, depth_index=depth_index, order=order
        )
        return render_rich(self, self.depth if depth == -1 else depth, view=view, width=width)

    def __rich_console__(self, console: Any, options: Any) -> Any:
        yield self.to_rich(width=options.max_width)

    def __str__(self) -> str:
        return self.to_text()

    def __repr__(self) -> str:
        from ._html import short_repr

        return short_repr(self)

    def _repr_html_(self) -> str:
        """The table in HTML, for notebooks (`IPython.display` calls it)."""
        from ._html import render_html

        return render_html(self, self.depth)
