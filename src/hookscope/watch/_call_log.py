"""Which call of a module called several times in a step first output a non-finite value.

The statistics of a step merge the calls of a module (torchvision's `BasicBlock` calls its `relu` twice), so the
first module to output a non-finite value cannot be told from them when a shared module's later call is the first
bad one: a NaN made by `conv2`, between the two calls of `relu`, would be blamed on `relu`. `CallLog` learns the
order of the calls in one step (the first recorded one: modules, repeats included) and keeps, for the recorded
steps, whether each call of a shared module (one called more often in that step than the modules called fewest: a
step of several forwards calls each module several times) output a non-finite value
(`RecordTable.holds_nonfinite`: read from what the hook read anyway, no sync), read at the flush.
`first_nonfinite` then ranks a shared module by its first bad call. Other modules cost a counter per call; the
first recorded step keeps the evidence of every call. Steps that are only checked (`every=N`: one min/max per
call, folded into the first non-finite step of each module on the device) place each module's first non-finite
call there too (`place`).
"""

from __future__ import annotations

import torch

__all__ = ["CallLog", "Evidence", "checked"]

Evidence = tuple[int, int, torch.Tensor]
"""(module, which of its calls in the step, from 0; whether that call's output held a non-finite value (0-d bool))."""


class CallLog:
    """The call order of a step and the evidence of the calls of shared modules, per recorded row.

    Args:
        modules: The number of watched modules.
    """

    def __init__(self, modules: int) -> None:
        self.sequence: list[int] = []  # the modules in call order in the learned step, repeats included
        self.shared: frozenset[int] | None = None  # the modules called more than once a forward (None: learning)
        self._places: dict[tuple[int, int], int] = {}  # (module, call in a forward) -> its place in the first forward
        self._per_forward: dict[int, int] = {}  # module -> its calls a forward
        self._learning = -1  # the row id being learned
        self._row = -1  # the row id whose calls are being counted
        self._counts = [0] * modules  # calls of each module so far in that row
        self._evidence: dict[int, list[Evidence]] = {}  # row id -> the evidence kept for it

    def call(self, row: int, index: int) -> int | None:
        """Count a call of module `index` in row id `row` (a step only checked, not recorded, is named by a key
        below -1: `checked(step)`): its ordinal among the module's calls in that step when its evidence is wanted
        (a shared module, or any while the order is learned), else `None`."""
        if row != self._row:
            self._row, self._counts = row, [0] * len(self._counts)
        ordinal = self._counts[index]
        self._counts[index] = ordinal + 1
        if self.shared is None:
            if self._learning < 0:
                self._learning = row
            if row == self._learning:
                self.sequence.append(index)
                return ordinal
            self._finish_learning()
        return ordinal if index in (self.shared or ()) else None

    def _finish_learning(self) -> None:
        """The learned step is complete: which modules are shared, and where each call of a forward takes place.

        A step of k forwards (gradient accumulation) calls every module at least k times; the modules called
        fewest are called once a forward, the others (`shared`) several times. A call's place is taken in the
        first forward (its ordinal modulo the module's calls a forward): the forwards of a step run alike, and a
        NaN made in one stays in it."""
        counts: dict[int, int] = {}
        for place, index in enumerate(self.sequence):
            self._places[(index, counts.get(index, 0))] = place
            counts[index] = counts.get(index, 0) + 1
        forwards = min(counts.values(), default=1)
        if any(count % forwards for count in counts.values()):  # forwards that differ: no places
            self._places, counts = {}, {}
        self._per_forward = {index: count // forwards for index, count in counts.items()}
        self.shared = frozenset(index for index, count in counts.items() if count > forwards)

    def place(self, index: int, ordinal: int | None = None) -> int | None:
        """Where call `ordinal` of module `index` in its step (`None`: its first) takes place in a forward
        (`_finish_learning`); `None` before the order is learned, or for a module not in it."""
        per_forward = self._per_forward.get(index)
        return None if per_forward is None else self._places.get((index, (ordinal or 0) % per_forward))

    def keep(self, row: int, evidence: list[Evidence]) -> None:
        """Keep `evidence` of calls in row id `row` (of a forward that completed)."""
        if evidence:
            self._evidence.setdefault(row, []).extend(evidence)

    def take(self, rows: range) -> list[dict[int, int]]:
        """Per row id of `rows` (taken to the host at the flush, where reading the device is allowed): the place in
        a forward (`_finish_learning`) of each module's first call whose output held a non-finite value, or of its first
        call where none seen did; empty before the order is learned. Forget them."""
        if self.shared is None and self._learning in rows:
            self._finish_learning()
        found = [self._evidence.pop(row, []) for row in rows]
        bad = iter(_on_host([flag for evidence in found for _, _, flag in evidence]))
        first = {index: place for index in self._per_forward if (place := self.place(index)) is not None}
        places = []
        for evidence in found:
            calls = dict(first)
            earliest: dict[int, int] = {}
            for (index, ordinal, _), held in zip(evidence, bad, strict=False):
                if held and (index not in earliest or ordinal < earliest[index]):
                    earliest[index] = ordinal
            for index, ordinal in earliest.items():
                place = self.place(index, ordinal)
                if place is not None:
                    calls[index] = place
            places.append(calls)
        return places


def checked(step: int) -> int:
    """The key that names step `step`, only checked (not recorded), in `CallLog.call`: below every row id."""
    return -2 - step


def _on_host(flags: list[torch.Tensor]) -> list[bool]:
    """The 0-d bool tensors `flags` as host bools, in one transfer (gathered on the first one's device)."""
    values: list[bool] = torch.stack([flag.to(flags[0].device) for flag in flags]).tolist() if flags else []
    return values
