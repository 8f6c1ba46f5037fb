"""`NotebookFigure`: the matplotlib Figure every plot returns, which shows itself as a PNG in a notebook.

A plain Figure made without pyplot shows as `<Figure size ...>` text in Jupyter unless `%matplotlib inline`
registered a formatter for figures; IPython asks an object without one for `_repr_png_`. With a formatter
registered, IPython uses it instead: one image either way, and pyplot, which never sees these figures, does not
draw them again at the end of the cell. This module imports matplotlib: `_base.new_figure` imports it lazily.
"""

from __future__ import annotations

import io

from matplotlib.figure import Figure

__all__ = ["NotebookFigure"]


class NotebookFigure(Figure):
    """A `matplotlib.figure.Figure` that a notebook shows as a PNG when a cell returns it."""

    def _repr_png_(self) -> bytes:
        buffer = io.BytesIO()
        self.savefig(buffer, format="png")
        return buffer.getvalue()
