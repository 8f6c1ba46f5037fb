"""The statistics engine: every statistic hookscope reports is defined here, once.

Everything that describes tensors sits on this package: the reducers (`StatsReducer`, `HistogramReducer`), the
callbacks (`ActivationStats`), `watch()`, the weight tools and the distributed merges. It depends on torch only.

- `_record.py`: the moments record (count, mean, deviation, min, max, non-finite, near-zero, saturated, sampled
  counts), `combine` (Chan's formulas, scaled: never overflows) and `finalize` (the statistics users read).
- `_spec.py`: what a description counts (the near-zero rule, a saturating module's bounds); accumulation dtypes.
- `_describe.py`: one tensor, exactly (`describe`, the reference) or from a sample (`describe_large`).
- `_sample.py`: which values describe a large tensor (a systematic sample at a prime stride).
- `_batched.py`: many small tensors at once, by segment reductions.
- `_rows.py`: the samples of many large tensors at once, as the rows of one float32 matrix (thresholds rounded
  exactly to float32, results float64), in reused buffers.
- `_histogram.py`: the one histogram kernel and its range policy (power-of-two ranges that follow the data and
  re-bin exactly; fixed ranges count what falls outside).
- `_norms.py`: norms of gradients, updates and weights, and the update-to-weight ratio.
- `_units.py`: unit activity.
- `_dtensor.py`: the one test of a DTensor (FSDP2) and this rank's part of one.
- `_attention.py`: per-head attention statistics (max logit, entropy, sink) and the residual stream's largest
  magnitude, its channel and token.
- `_tables.py`: tables of records filled by observations (small tensors copied and batched, large ones read at
  once as their sums and a sample), `RecordTable` and `NormTable`: the machinery `ActivationStats` and `watch()`
  share. A value's path through the engine: `_tables.py` (copied, then described at the flush by `_batched.py`,
  combined into its cell by `_record.py`'s `combine_segments`) -> `_record.py`'s `finalize`.

The engine is internal: it exports nothing (`__all__` is empty). hookscope's modules import each piece from the
module that defines it; users read its statistics through `StatsReducer`, `ActivationStats` and `watch()`.
"""

__all__: list[str] = []
