"""Reading `ActivationStats`: its records as fastai's per-batch dicts, per-module series, histograms and plots.

`ActivationReading` is the part of `ActivationStats` that reads the engine's table back (one transfer per read,
cached until the next record).
"""

from __future__ import annotations

from typing import Any

import torch

from ..stats import EXPONENT_NONE, RECORD, STATISTICS, RecordTable, auto_edges, finalize, fixed_edges, rebin

__all__ = ["NEAR", "ActivationReading"]

NEAR = "near_zero"
"""The key of fastai's signed near-zero fraction (`x <= near_zero`)."""


class ActivationReading:
    """The reading half of `ActivationStats` (its records are written by the other half)."""

    paths: list[str]
    with_hist: bool
    near_zero: float
    hist_bins: int
    hist_range: tuple[float, float] | None
    _records: int
    _table: RecordTable | None
    _cache: list[list[dict[str, Any]]] | None

    def _settle(self) -> None:
        raise NotImplementedError

    @property
    def stats(self) -> list[list[dict[str, Any]]]:
        """Per observed batch, per observed module (model order): `{'mean', 'std', 'near_zero', 'sampled'
        (, 'hist')}` as floats (`'hist'`: a (bins,) tensor on the module's common range, `hist_edges(idx)`)."""
        if self._cache is None:
            self._cache = self._materialize()
        return self._cache

    def _statistics(self) -> torch.Tensor:
        """(records, modules, len(STATISTICS)) float64 on the CPU; NaN where a module was not observed."""
        self._settle()
        table, shape = self._table, (self._records, len(self.paths))
        if table is None or table.records is None:
            return finalize(torch.zeros(*shape, len(RECORD), dtype=torch.float64))
        return finalize(table.records[: self._records].cpu())

    def _materialize(self) -> list[list[dict[str, Any]]]:
        values = self._statistics()
        # float64 to Python floats, exactly: a std of finite float32 or bf16 values can exceed the float32 maximum
        columns = {name: values[..., STATISTICS.index(name)].tolist() for name in ("mean", "std", "sampled")}
        columns[NEAR] = values[..., STATISTICS.index("near_zero")].tolist()
        hists = self._hist_table() if self.with_hist else None
        out = []
        for k in range(self._records):
            row = []
            for j in range(len(self.paths)):
                entry: dict[str, Any] = {name: column[k][j] for name, column in columns.items()}
                if hists is not None:
                    entry["hist"] = hists[j][0][k, : self.hist_bins]
                row.append(entry)
            out.append(row)
        return out

    def _hist_table(self) -> list[tuple[torch.Tensor, int]]:
        """Per module: its (records, bins + 2) float64 counts on its common range, and that range's exponent."""
        self._settle()
        table, width = self._table, self.hist_bins + 2
        if table is None or table.hists is None or table.exponents is None:
            return [(torch.zeros(self._records, width, dtype=torch.float64), EXPONENT_NONE) for _ in self.paths]
        hists, exponents = table.hists[: self._records].cpu(), table.exponents[: self._records].cpu()
        out = []
        for j in range(len(self.paths)):
            target = exponents[:, j].amax() if self._records else torch.tensor(EXPONENT_NONE)
            counts = hists[:, j] if self.hist_range is not None else rebin(hists[:, j], exponents[:, j], target)
            out.append((counts, int(target)))
        return out

    def _index(self, idx: int) -> int:
        modules = len(self.paths)
        if isinstance(idx, bool) or not isinstance(idx, int) or not -modules <= idx < modules:
            raise ValueError(f"idx must be an int in [-{modules}, {modules}) (one per observed module), got {idx!r}")
        return idx % modules

    def layer_stats(self, idx: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Return `(means, stds, near_zeros)` of module `idx` over the records, each (records,) float64.

        Raises:
            ValueError: `idx` is not the index of an observed module.
        """
        j = self._index(idx)
        values = self._statistics()[:, j]
        return tuple(values[:, STATISTICS.index(name)] for name in ("mean", "std", "near_zero"))  # type: ignore[return-value]

    def hist_counts(self, idx: int) -> torch.Tensor:
        """Return the (records, bins + 2) float64 histogram counts of module `idx` on its common range (`hist_edges`):
        the bins, then the values below and above a fixed `hist_range` (always 0 for a range that follows the data).

        Raises:
            ValueError: `with_hist` is off, or `idx` is not the index of an observed module.
        """
        j = self._index(idx)
        if not self.with_hist:
            raise ValueError("hist needs histograms: create ActivationStats(with_hist=True)")
        return self._hist_table()[j][0]

    def hist(self, idx: int) -> torch.Tensor:
        """Return `log1p` of the histogram counts of module `idx`, shape (bins, records), on `hist_edges(idx)`.

        Raises:
            ValueError: `with_hist` is off, or `idx` is not the index of an observed module.
        """
        return self.hist_counts(idx)[:, : self.hist_bins].t().float().log1p()

    def hist_edges(self, idx: int) -> torch.Tensor:
        """Return the (bins + 1,) float64 bin edges of module `idx` (its common range over the records).

        Raises:
            ValueError: `idx` is not the index of an observed module.
        """
        j = self._index(idx)
        if self.hist_range is not None:
            return fixed_edges(self.hist_range, self.hist_bins)
        exponent = self._hist_table()[j][1] if self.with_hist else EXPONENT_NONE
        return auto_edges(exponent, self.hist_bins)

    def color_dim(self, idx: int, figsize: tuple[float, float] = (10, 5), ax: Any = None) -> Any:
        """Draw the "colorful dimension" plot of module `idx` (histograms over records); return the Figure."""
        from ..plot import color_dim

        return color_dim(self.hist(idx), figsize=figsize, ax=ax)

    def plot_layer_stats(self, idx: int) -> Any:
        """Plot mean, std and % at most near zero of module `idx` over the records; return the Figure."""
        from ..plot import layer_stats

        return layer_stats(*self.layer_stats(idx), near_zero=self.near_zero)
