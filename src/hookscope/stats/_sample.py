"""Which values of a large tensor stand for all of them: a systematic sample with a prime period.

The tensor's flat (row-major) positions are cut into periods of `p` values, `p` the smallest prime of at least
`max(11, n / SAMPLE_SIZE)`, and the sample takes the same `q` positions of every period (evenly spread,
`q = 1` unless the tensor has fewer than `11 * SAMPLE_SIZE` values), from a start drawn afresh for every sample.
A period of a prime of 11 or more shares no factor with the dims of real layouts (products of 2, 3, 5 and 7), so
the sample visits every channel of an NCHW tensor and every feature of a (B, T, C) tensor in proportion, up to
one value (a hot channel or an outlier feature gets exactly its share, which a plain random sample gets only on
average), and it never aliases with a periodic layout; the random start makes successive samples independent.
A sample holds about `SAMPLE_SIZE` values (between 0.9 and 1.1 times it for tensors of `SMALL_BELOW` values or
more). The start comes from the sampler's own host RNG: the user's random streams are never touched, nothing
syncs.
"""

from __future__ import annotations

import math
import random

import torch

__all__ = ["SAMPLE_SIZE", "Sampler", "period_for"]

SAMPLE_SIZE = 8192
"""About how many values describe a large tensor."""


class Sampler:
    """Draws the sample positions of large tensors; one per watch or callback.

    Args:
        size: About how many values a sample holds.
        seed: The seed of the random starts.
    """

    def __init__(self, size: int = SAMPLE_SIZE, seed: int = 0) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"size must be a positive int, got {size!r}")
        self.size = size
        self._random = random.Random(seed)
        self._combs: dict[tuple[int, torch.device], tuple[int, torch.Tensor]] = {}

    def index(self, n: int, device: torch.device) -> torch.Tensor:
        """The int64 flat positions of a new sample of a tensor of `n` values (`n` >= 11), on `device`.

        Raises:
            ValueError: `n` is too small to be sampled.
        """
        if n < 11:
            raise ValueError(f"n must be at least 11 to be sampled, got {n}")
        key = (n, device)
        found = self._combs.get(key)
        if found is None:
            if len(self._combs) >= 256:
                self._combs.clear()
            period, offsets = period_for(n, self.size)
            comb = torch.arange(n // period).mul_(period)[:, None] + torch.tensor(offsets)[None, :]
            found = self._combs[key] = (n - period * (n // period), comb.reshape(-1).to(device))
        slack, comb = found
        return comb + self._random.randrange(slack + 1)


def period_for(n: int, size: int) -> tuple[int, list[int]]:
    """The period (a prime >= 11) and the offsets within it of a sample of about `size` of `n` values."""
    period = max(11, math.ceil(n / size))
    while any(period % divisor == 0 for divisor in range(2, math.isqrt(period) + 1)):
        period += 1
    count = min(period, max(1, round(size * period / n)))
    return period, sorted({(j * period) // count for j in range(count)})
