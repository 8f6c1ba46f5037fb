"""Which values of a large tensor stand for all of them: a systematic sample with a prime period.

The tensor's flat (row-major) positions are cut into periods of `p` values, `p` a prime of at least
`max(11, n / size)`, and the sample takes the same `q` positions of every period (evenly spread), from a start
drawn afresh for every sample. `p` and `q` are chosen among the first primes so that the sample is as large as
possible without exceeding `size` values (0.94 to 1 times it from 16384 values up, at the default size). A period
of a prime of 11 or more shares no factor with the dims of real layouts (products of 2, 3, 5 and 7), so the sample
visits every channel of an NCHW tensor and every feature of a (B, T, C) tensor in proportion, up to one value (a
hot channel or an outlier feature gets exactly its share, which a plain random sample gets only on average), and
it never aliases with a periodic layout; the random start makes successive samples independent.

Every sample has the same width, `size` positions: the sample, then padding (copies of its first position, not
part of it), so that the samples of many tensors are described together as the rows of one matrix. The start
comes from the sampler's own host RNG: the user's random streams are never touched, nothing syncs.
"""

from __future__ import annotations

import math
import random

import torch

from .._transfer import to_device

__all__ = ["SAMPLE_SIZE", "Sampler", "period_for"]

SAMPLE_SIZE = 8192
"""The width of a sample: at most how many values describe a large tensor."""


class Sampler:
    """Draws the sample positions of large tensors; one per watch or callback.

    Args:
        size: The width of a sample (at most how many values it holds).
        seed: The seed of the random starts.
    """

    def __init__(self, size: int = SAMPLE_SIZE, seed: int = 0) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 11:
            raise ValueError(f"size must be an int of at least 11, got {size!r}")
        self.size = size
        self._random = random.Random(seed)
        self._combs: dict[tuple[int, torch.device], tuple[torch.Tensor, int, int]] = {}

    def positions(self, n: int, device: torch.device) -> tuple[torch.Tensor, int, int]:
        """The sample positions of a tensor of `n` values (`n >= size`) before the random start: `(size,)` int64
        flat positions on `device` whose first `count` are the sample (the rest repeats the first), `count`, and
        the largest start (`draw(slack)` draws one). Built once per size and device.

        Raises:
            ValueError: `n` is below the sample's width.
        """
        if n < self.size:
            raise ValueError(f"n must be at least the sample size {self.size} to be sampled, got {n}")
        key = (n, device)
        found = self._combs.get(key)
        if found is None:
            # equivalent mutant `256 -> 257`: the cache's bound (positions are rebuilt the same after a clear)
            if len(self._combs) >= 256:
                self._combs.clear()
            period, offsets = period_for(n, self.size)
            comb = (torch.arange(n // period).mul_(period)[:, None] + torch.tensor(offsets)[None, :]).reshape(-1)
            count = comb.numel()
            padded = torch.cat([comb, torch.zeros(self.size - count, dtype=torch.int64)])
            found = self._combs[key] = (to_device(padded, device), count, n - period * (n // period))
        return found

    def draw(self, slack: int) -> int:
        """A random start in `[0, slack]` (from the sampler's own RNG)."""
        return self._random.randrange(slack + 1)

    def draw_positions(self, n: int, device: torch.device) -> tuple[torch.Tensor, int, int]:
        """A new sample of a tensor of `n` values (`n >= size`): its positions before the start and `count` (as
        `positions` gives them) and a random start (`draw`); its flat positions are `comb + start`.

        Raises:
            ValueError: `n` is below the sample's width.
        """
        comb, count, slack = self.positions(n, device)
        return comb, count, self.draw(slack)

    def index(self, n: int, device: torch.device) -> tuple[torch.Tensor, int]:
        """The positions of a new sample of a tensor of `n` values (`n >= size`): `(size,)` int64 flat positions
        on `device`, of which the first `count` are the sample (the rest is padding), and `count`.

        Raises:
            ValueError: `n` is below the sample's width.
        """
        comb, count, start = self.draw_positions(n, device)
        return comb + start, count


def period_for(n: int, size: int) -> tuple[int, list[int]]:
    """The period (a prime >= 11) and the offsets within it of the largest sample of at most `size` of `n`
    values (`n >= size`), among the first 64 primes from `max(11, n / size)` up to three times that."""
    first = max(11, math.ceil(n / size))
    best, tried = (0, first, 1), 0
    for period in range(first, 3 * first + 1):
        if tried == 64:
            break
        if any(period % divisor == 0 for divisor in range(2, math.isqrt(period) + 1)):
            continue
        tried += 1
        offsets = min(period, size * period // n)  # (n // period) * offsets <= size
        count = (n // period) * offsets
        if count > best[0]:
            best = (count, period, offsets)
    _, period, count = best
    return period, sorted({(j * period) // count for j in range(count)})
