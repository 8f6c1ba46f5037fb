"""Which values of a large tensor stand for all of them: a systematic sample at a prime stride.

The sample is the flat (row-major) positions `start + i * stride` for `i < n // stride`, where `stride` is the
smallest prime of at least `max(11, n / SAMPLE_SIZE)` and `start` is drawn afresh for every sample. A prime
stride of 11 or more shares no factor with the dims of real layouts (products of 2, 3, 5 and 7), so the sample
visits every channel of an NCHW tensor and every feature of a (B, T, C) tensor in proportion, up to one value
(a hot channel or an outlier feature gets exactly its share, which a plain random sample gets only on average),
and it never aliases with a periodic layout; the random start makes successive samples independent. A sample
holds between `SAMPLE_SIZE * 4 / 11` values (just above `SAMPLE_ABOVE`) and `SAMPLE_SIZE`. The start comes from
the sampler's own host RNG: the user's random number streams are never touched, and nothing syncs.
"""

from __future__ import annotations

import math
import random

import torch

__all__ = ["SAMPLE_ABOVE", "SAMPLE_SIZE", "Sampler", "stride_for"]

SAMPLE_SIZE = 1 << 15
"""The most values that describe a large tensor."""
SAMPLE_ABOVE = 1 << 17
"""Tensors with more values than this are described from a sample (when sampling is allowed)."""


class Sampler:
    """Draws the sample positions of large tensors; one per watch or callback.

    Args:
        size: The most values a sample holds.
        seed: The seed of the random starts.
    """

    def __init__(self, size: int = SAMPLE_SIZE, seed: int = 0) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"size must be a positive int, got {size!r}")
        self.size = size
        self._random = random.Random(seed)
        self._combs: dict[tuple[int, torch.device], tuple[int, torch.Tensor]] = {}

    def index(self, n: int, device: torch.device) -> torch.Tensor:
        """The int64 flat positions of a new sample of a tensor of `n` values (`n` > 11), on `device`.

        Raises:
            ValueError: `n` is too small to be sampled.
        """
        if n <= 11:
            raise ValueError(f"n must exceed 11 to be sampled, got {n}")
        key = (n, device)
        found = self._combs.get(key)
        if found is None:
            if len(self._combs) >= 256:
                self._combs.clear()
            stride = stride_for(n, self.size)
            found = self._combs[key] = (stride, torch.arange(n // stride, device=device) * stride)
        stride, comb = found
        return comb + self._random.randrange(n - stride * (comb.numel() - 1))


def stride_for(n: int, size: int) -> int:
    """The smallest prime >= max(11, n / size): the stride of a sample of at most `size` of `n` values."""
    candidate = max(11, math.ceil(n / size))
    while any(candidate % divisor == 0 for divisor in range(2, math.isqrt(candidate) + 1)):
        candidate += 1
    return candidate
