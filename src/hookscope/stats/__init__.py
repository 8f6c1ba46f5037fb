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
- `_pending.py`, `_record_table.py`, `_norm_table.py`: tables of records filled by observations (small tensors
  copied and batched, large ones read at once as their sums and a sample): the machinery `ActivationStats` and
  `watch()` share.
"""

from ._attention import (
    ATTENTION_FIELDS,
    ATTENTION_VALUES,
    RESIDUAL_SAMPLE,
    attention_scores,
    attention_slice,
    describe_attention,
    describe_residual,
    finish_attention,
)
from ._batched import Segments, describe_segments, norm_segments
from ._describe import RAW, Described, Sample, describe, describe_large, estimate, take_sample
from ._dtensor import is_dtensor, is_sharded, local_part
from ._histogram import (
    EXPONENT_NONE,
    OVERFLOW,
    UNDERFLOW,
    auto_edges,
    check_bins,
    check_range,
    counts,
    exponent_of,
    exponent_of_edges,
    fixed_edges,
    on_widest_range,
    range_exponent,
    rebin,
    segment_counts,
    widest_exponent,
)
from ._norm_table import NormTable
from ._norms import (
    NORM,
    combine_norm_segments,
    combine_norms,
    estimate_norms,
    norm_of,
    ratio_of_norms,
    real_view,
    root_sum_squares,
)
from ._pending import SMALL_BELOW
from ._record import RECORD, STATISTICS, Column, combine, combine_segments, empty, finalize, from_statistics
from ._record_table import RecordTable
from ._sample import SAMPLE_SIZE, Sampler
from ._spec import NEAR_ZERO, Spec, accumulate_dtype, wide_dtype
from ._units import UnitCounts, active, unit_counts, unit_dims

__all__ = [
    "ATTENTION_FIELDS",
    "ATTENTION_VALUES",
    "EXPONENT_NONE",
    "NEAR_ZERO",
    "NORM",
    "OVERFLOW",
    "RAW",
    "RECORD",
    "RESIDUAL_SAMPLE",
    "SAMPLE_SIZE",
    "SMALL_BELOW",
    "STATISTICS",
    "UNDERFLOW",
    "Column",
    "Described",
    "NormTable",
    "RecordTable",
    "Sample",
    "Sampler",
    "Segments",
    "Spec",
    "UnitCounts",
    "accumulate_dtype",
    "active",
    "attention_scores",
    "attention_slice",
    "auto_edges",
    "check_bins",
    "check_range",
    "combine",
    "combine_norm_segments",
    "combine_norms",
    "combine_segments",
    "counts",
    "describe",
    "describe_attention",
    "describe_large",
    "describe_residual",
    "describe_segments",
    "empty",
    "estimate",
    "estimate_norms",
    "exponent_of",
    "exponent_of_edges",
    "finalize",
    "finish_attention",
    "fixed_edges",
    "from_statistics",
    "is_dtensor",
    "is_sharded",
    "local_part",
    "norm_of",
    "norm_segments",
    "on_widest_range",
    "range_exponent",
    "ratio_of_norms",
    "real_view",
    "rebin",
    "root_sum_squares",
    "segment_counts",
    "take_sample",
    "unit_counts",
    "unit_dims",
    "wide_dtype",
    "widest_exponent",
]
