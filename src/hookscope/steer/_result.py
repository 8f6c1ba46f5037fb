"""`PatchResult`: the effects of a patching sweep, with their labels, as a table, a heatmap and notebook HTML."""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from .._text import neutralize

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["PatchResult"]


@dataclass(frozen=True, eq=False)
class PatchResult:
    """The effects of patching each cell (site x position x head), normalised: 1 recovers the clean metric.

    Attributes:
        effects: float64 `[len(sites), cells per site]`; cells run over positions first, then heads.
        sites: The site paths, one per row.
        positions: The positions swept (`None`: every position at once).
        heads: The heads swept (`None`: the whole last dimension at once).
        at: "output" or "input".
        method: "activation" (`patch`) or "attribution" (`attribution_patch`).
        metric_clean: The metric on the clean run.
        metric_corrupted: The metric on the corrupted run.
    """

    effects: torch.Tensor
    sites: list[str]
    positions: list[int] | None
    heads: list[int] | None
    at: str = "output"
    method: str = "activation"
    metric_clean: float = float("nan")
    metric_corrupted: float = float("nan")

    @property
    def cells(self) -> list[tuple[int | None, int | None]]:
        """`(position, head)` of each column of `effects` (`None`: all at once)."""
        positions: list[int | None] = list(self.positions) if self.positions is not None else [None]
        heads: list[int | None] = list(self.heads) if self.heads is not None else [None]
        return [(p, h) for p in positions for h in heads]

    def cell_labels(self) -> list[str]:
        """A short label per column: `pos 3`, `head 1`, `pos 3 head 1` or `all`."""
        labels = []
        for position, head in self.cells:
            parts = ([] if position is None else [f"pos {position}"]) + ([] if head is None else [f"head {head}"])
            labels.append(" ".join(parts) or "all")
        return labels

    def grid(self, site: str) -> torch.Tensor:
        """One site's effects as `[positions or 1, heads or 1]`.

        Raises:
            KeyError: `site` is not one of `sites`.
        """
        if site not in self.sites:
            raise KeyError(f"{site!r} is not a site of this result; the sites are {self.sites!r}")
        row = self.effects[self.sites.index(site)]
        return row.view(len(self.positions or [None]), len(self.heads or [None]))

    def top(self, k: int = 1) -> list[tuple[str, int | None, int | None, float]]:
        """The `k` cells of largest effect, as `(site, position, head, effect)`, largest first (NaN last)."""
        flat = torch.nan_to_num(self.effects, nan=-torch.inf).flatten()
        order = torch.argsort(flat, descending=True, stable=True)[:k].tolist()
        columns = self.effects.shape[1]
        cells = self.cells
        return [(self.sites[i // columns], *cells[i % columns], float(self.effects.flatten()[i])) for i in order]

    def to_dataframe(self) -> Any:
        """A long `pandas.DataFrame`: one row per cell, columns `site`, `position`, `head`, `effect`."""
        import pandas as pd

        rows = [
            {"site": site, "position": position, "head": head, "effect": float(self.effects[row, column])}
            for row, site in enumerate(self.sites)
            for column, (position, head) in enumerate(self.cells)
        ]
        return pd.DataFrame(rows, columns=["site", "position", "head", "effect"])

    def plot(self, *, title: str | None = None) -> Figure:
        """A heatmap: sites down, cells across, effect as colour (diverging, 0 white, +-1 saturated)."""
        from ..plot._base import label, new_figure

        rows, columns = self.effects.shape
        figure, axes = new_figure(figsize=(min(2.0 + 0.45 * columns, 16.0), min(1.5 + 0.35 * rows, 12.0)))
        ax = axes[0, 0]
        bound = max(1.0, float(torch.nan_to_num(self.effects).abs().max()) if self.effects.numel() else 1.0)
        image = ax.imshow(self.effects.numpy(), cmap="RdBu", vmin=-bound, vmax=bound, aspect="auto")
        ax.set_yticks(range(rows), [label(site, 40) for site in self.sites])
        ax.set_xticks(range(columns), self.cell_labels(), rotation=90)
        ax.set_title(title or f"{self.method} patching: recovered fraction of the metric ({self.at})")
        figure.colorbar(image, ax=ax)
        return figure

    def __repr__(self) -> str:
        rows, columns = self.effects.shape
        best = self.top(1)
        where = ""
        if best:
            site, position, head, effect = best[0]
            cell = " ".join(
                ([] if position is None else [f"pos {position}"]) + ([] if head is None else [f"head {head}"])
            )
            where = f", top {site!r}{' ' + cell if cell else ''} = {effect:.3g}"
        return f"PatchResult({self.method}, {rows} sites x {columns} cells, at={self.at!r}{where})"

    def _repr_html_(self) -> str:
        """A heatmap table for notebooks (escaped names; colours from the same scale as `plot`)."""
        header = "".join(f"<th>{html.escape(text)}</th>" for text in self.cell_labels())
        body = []
        for row, site in enumerate(self.sites):
            cells = "".join(_html_cell(float(value)) for value in self.effects[row])
            body.append(f"<tr><th style='text-align:left'>{html.escape(neutralize(site))}</th>{cells}</tr>")
        caption = html.escape(repr(self))
        return (
            f"<table style='border-collapse:collapse;font-size:12px'><caption>{caption}</caption>"
            f"<tr><th></th>{header}</tr>{''.join(body)}</table>"
        )


def _html_cell(value: float) -> str:
    if value != value:  # NaN
        return "<td style='background:#ddd;padding:2px 6px' title='nan'>nan</td>"
    strength = min(abs(value), 1.0)
    other = int(255 * (1 - strength))
    colour = f"rgb({other},{other},255)" if value > 0 else f"rgb(255,{other},{other})"
    return f"<td style='background:{colour};padding:2px 6px;text-align:right' title='{value:.6g}'>{value:.2f}</td>"
