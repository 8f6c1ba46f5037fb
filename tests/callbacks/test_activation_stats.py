"""ActivationStats against a naive computation on the same hooked outputs; fastai counts and semantics."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn as nn

from hookscope.callbacks import ActivationStats, Callback, HookCallback, LoopDriver, RecordsDroppedWarning
from stats_oracle import auto_exponent, auto_histogram, expected, fixed_histogram, values_of
from stretches import record_stretches


class Capture(HookCallback):
    """Keeps CPU copies of every output of every hooked module, per training batch (the oracle's input)."""

    def __init__(self) -> None:
        super().__init__(cpu=True)
        self.batches: list[list[list[torch.Tensor]]] = []
        self.in_batch = False

    def on_batch_start(self, batch: int) -> None:
        self.batches.append([[] for _ in self.paths])
        self.in_batch = True

    def on_batch_end(self, batch: int) -> None:
        self.in_batch = False

    def hook(self, m: nn.Module, i: Any, o: Any) -> Any:
        if self.in_batch:
            self.batches[-1][self.hooked_modules.index(m)].append(o.float().reshape(-1))


def mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 2))


def train(model: nn.Module, callbacks: list[Any], batches: int, size: int = 32) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with LoopDriver(callbacks, model, opt):
        for _ in range(batches):
            model(torch.randn(size, 3)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()


def check_entry(entry: dict[str, Any], outputs: list[torch.Tensor]) -> None:
    """One record of one module against the oracle: fastai's signed near-zero rule, Bessel's std."""
    want = expected(values_of(*outputs), near_zero=0.05, signed=True)
    assert entry["mean"] == pytest.approx(want.mean, rel=1e-5, abs=1e-7)
    assert entry["std"] == pytest.approx(want.std, rel=1e-5, abs=1e-7)
    assert entry["near_zero"] == pytest.approx(want.near_zero, abs=1e-7)
    assert entry["sampled"] == 0.0


def test_every_statistic_matches_a_naive_computation_on_the_same_outputs() -> None:
    model, capture = mlp(), Capture()
    stats = ActivationStats(with_hist=True, hist_range=(-2.0, 2.0), hist_bins=20)
    train(model, [capture, stats], batches=4)
    assert len(stats.stats) == 4 and len(stats.stats[0]) == 3
    for k, record in enumerate(stats.stats):
        for j, entry in enumerate(record):
            check_entry(entry, capture.batches[k][j])
            counts, below, above = fixed_histogram(values_of(*capture.batches[k][j]), 20, (-2.0, 2.0))
            assert entry["hist"].tolist() == counts.tolist()
            assert stats.hist_counts(j)[k, 20:].tolist() == [below, above]  # outside the range: counted, not clamped


def test_histogram_range_follows_the_data_and_counts_every_value() -> None:
    model, capture = mlp(), Capture()
    stats = ActivationStats(with_hist=True)
    train(model, [capture, stats], batches=3)
    for j in range(3):
        records = [values_of(*capture.batches[k][j]) for k in range(3)]
        exponent = auto_exponent(np.concatenate(records))
        assert exponent is not None
        edges = stats.hist_edges(j)
        assert float(edges[-1]) == -float(edges[0]) == 2.0**exponent  # wide enough for every record
        for k in range(3):
            assert stats.stats[k][j]["hist"].tolist() == auto_histogram(records[k], 40, exponent).tolist()


def test_a_module_called_twice_is_described_by_all_its_outputs() -> None:
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.shared = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.shared(torch.relu(self.shared(x)) * 3)

    model, capture, stats = Twice(), Capture(), ActivationStats()
    train_inputs = [torch.randn(8, 4) for _ in range(2)]
    with LoopDriver([capture, stats], model):
        for x in train_inputs:
            model(x)
    for k in range(2):
        assert len(capture.batches[k][0]) == 2
        check_entry(stats.stats[k][0], capture.batches[k][0])


def test_small_outputs_described_many_records_at_once_match_the_oracle_record_by_record() -> None:
    """Past FLUSH_RECORDS records, with batch sizes that change (new layouts), statistics read mid-run (an early
    flush), and a module whose outputs are small in one call and large in another within the same record."""

    class SmallAndLarge(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.shared = nn.Linear(3, 64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            big = self.shared(torch.randn(600, 3)) if x.shape[0] == 7 else None  # 38400 values: large
            out = self.shared(x)
            return out if big is None else out + big.mean()

    torch.manual_seed(0)
    model, capture = SmallAndLarge(), Capture()
    stats = ActivationStats(with_hist=True, hist_range=(-2.0, 2.0), hist_bins=16, exact=True, budget=None)
    sizes = [5 + (k % 3) for k in range(150)]  # 5, 6, 7 (7: also a large output)
    with LoopDriver([capture, stats], model):
        for k, size in enumerate(sizes):
            model(torch.randn(size, 3))
            if k == 70:
                assert len(stats.stats) == 71  # a read describes what is pending
    assert len(stats.stats) == 150
    for k in range(150):
        entry = stats.stats[k][0]
        check_entry(entry, capture.batches[k][0])
        counts, below, above = fixed_histogram(values_of(*capture.batches[k][0]), 16, (-2.0, 2.0))
        assert entry["hist"].tolist() == counts.tolist(), k
        assert stats.hist_counts(0)[k, 16:].tolist() == [below, above], k


@pytest.mark.parametrize("n", [11, 12, 13])
@pytest.mark.parametrize("every", [None, 1, 4])
def test_number_of_records_follows_every(n: int, every: int | None) -> None:
    stats = ActivationStats(every=every)
    model = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    with stats.attach(model):
        for _ in range(n):
            model(torch.randn(4, 2))
    assert len(stats.stats) == math.ceil(n / (every or 1))


def test_eval_forwards_are_not_recorded_and_hooks_are_gone_after_the_loop() -> None:
    model, stats = mlp(), ActivationStats()
    with stats.attach(model):
        model(torch.randn(4, 3))
        model.eval()
        with torch.no_grad():
            model(torch.full((4, 3), 100.0))
        model.train()
    assert len(stats.stats) == 1 and stats.stats[0][0]["mean"] < 50
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_hooks_are_gone_after_an_exception() -> None:
    model, stats = mlp(), ActivationStats(every=3)
    with pytest.raises(ZeroDivisionError), stats.attach(model):
        model(torch.randn(4, 3))
        _ = 1 / 0
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_layer_stats_and_hist_shapes() -> None:
    model, stats = mlp(), ActivationStats(with_hist=True, hist_bins=10)
    train(model, [stats], batches=5)
    means, stds, near_zeros = stats.layer_stats(1)
    assert means.shape == stds.shape == near_zeros.shape == (5,)
    assert means.tolist() == pytest.approx([record[1]["mean"] for record in stats.stats])
    hist = stats.hist(-1)
    assert hist.shape == (10, 5)
    torch.testing.assert_close(hist[:, 2], stats.stats[2][2]["hist"].log1p().float())


def test_capacity_keeps_the_first_records_and_counts_the_rest() -> None:
    model, stats = mlp(), ActivationStats(capacity=3)
    with pytest.warns(RecordsDroppedWarning, match="capacity=3"):
        train(model, [stats], batches=5)
    assert len(stats.stats) == 3 and stats.dropped == 2


def test_one_value_has_zero_std_and_a_module_not_called_has_nan() -> None:
    class Branch(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(2, 1), nn.Linear(2, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.a(x)

    model, stats = Branch(), ActivationStats()
    with stats.attach(model):
        model(torch.randn(1, 2))
    assert stats.stats[0][0]["std"] == 0.0
    assert all(math.isnan(v) for v in stats.stats[0][1].values())


def test_no_host_sync_while_recording(monkeypatch: pytest.MonkeyPatch) -> None:
    model, stats = mlp(), ActivationStats(with_hist=True)
    with stats.attach(model):
        model(torch.randn(4, 3))  # the first record: every buffer allocated
        for name in ("item", "tolist", "cpu", "__bool__", "__float__"):
            monkeypatch.setattr(torch.Tensor, name, _forbidden(name))
        for _ in range(5):
            model(torch.randn(4, 3)).sum().backward()
        monkeypatch.undo()
    assert len(stats.stats) == 6


def _forbidden(name: str) -> Any:
    def raise_(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"host sync through Tensor.{name} while recording")

    return raise_


def test_state_dict_round_trip() -> None:
    model, stats = mlp(), ActivationStats(with_hist=True)
    train(model, [stats], batches=3)
    restored = ActivationStats(with_hist=True)
    restored.load_state_dict(stats.state_dict())
    assert restored.stats[2][1]["mean"] == stats.stats[2][1]["mean"]
    torch.testing.assert_close(restored.hist(0), stats.hist(0))
    with pytest.raises(ValueError, match="state must be for modules"):
        other = ActivationStats()
        other.paths = ["x"]
        other.load_state_dict(stats.state_dict())


def test_argument_errors() -> None:
    with pytest.raises(ValueError, match="hist_bins must be a positive even int .*, got 0"):
        ActivationStats(hist_bins=0)
    with pytest.raises(ValueError, match="hist_bins must be a positive even int .*, got 7"):
        ActivationStats(hist_bins=7)
    with pytest.raises(ValueError, match=r"hist_range must be a pair \(low, high\) of finite numbers with low < high"):
        ActivationStats(hist_range=(1.0, -1.0))
    with pytest.raises(ValueError, match="capacity must be a positive int, got -1"):
        ActivationStats(capacity=-1)
    stats = ActivationStats()
    train(mlp(), [stats], batches=1)
    with pytest.raises(ValueError, match="hist needs histograms"):
        stats.hist(0)
    with pytest.raises(ValueError, match=r"idx must be an int in \[-3, 3\)"):
        stats.layer_stats(3)


def test_plots_return_figures() -> None:
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    stats = ActivationStats(with_hist=True)
    train(mlp(), [stats], batches=3)
    assert isinstance(stats.color_dim(0), Figure)
    assert isinstance(stats.plot_layer_stats(0), Figure)


# ---- the overhead budget (the default): which batches are observed ---------------------------------------------


def test_under_the_budget_the_batches_left_alone_run_without_its_hooks(monkeypatch: pytest.MonkeyPatch) -> None:
    from hookscope._torch import module_hooks
    from hookscope.callbacks._budget import Budget
    from hookscope.hooks._calls import CalledHook

    observed = {0, 1, 5, 6, 11}
    monkeypatch.setattr(Budget, "_rule", lambda self, step, credit: step in observed)  # its decisions, not its clock
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2))
    seen: list[tuple[bool, torch.Tensor]] = []  # (its hook on model[2] during the forward, model[0]'s output)

    def ours(module: nn.Module) -> bool:
        return any(isinstance(h, CalledHook) for table in module_hooks(module).values() for h in table.values())

    model[0].register_forward_hook(lambda m, a, out: seen.append((ours(model[2]), out.detach().clone())))
    stats = ActivationStats()
    assert stats.budget == 0.03
    with stats.attach(model):
        for _ in range(12):
            model(torch.randn(4, 3)).sum().backward()
    assert stats.batches == sorted(observed)
    assert [k for k, (hooked, _) in enumerate(seen) if hooked] == sorted(observed)
    oracle = [seen[k][1] for k in sorted(observed)]
    assert len(stats.stats) == len(oracle)
    for record, output in zip(stats.stats, oracle, strict=True):
        assert record[0]["mean"] == pytest.approx(output.double().mean().item(), rel=1e-6, abs=1e-9)
        assert record[0]["std"] == pytest.approx(output.double().std().item(), rel=1e-6)
    restored = ActivationStats()
    restored.load_state_dict(stats.state_dict())
    assert restored.batches == sorted(observed)


def test_a_stretch_of_batches_left_alone_runs_with_the_batch_counting_hook_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hookscope._torch import module_hooks
    from hookscope.callbacks._budget import Budget
    from hookscope.hooks._calls import CalledHook

    observed = {0, 1, 12, 13, 14}
    monkeypatch.setattr(Budget, "_rule", lambda self, step, credit: step in observed)  # its decisions, not its clock
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2))
    roots: list[int] = []  # its hooks on the root while each forward runs (read in a child's hook)
    outputs: list[torch.Tensor] = []

    def ours(module: nn.Module) -> int:
        return sum(isinstance(h, CalledHook) for table in module_hooks(module).values() for h in table.values())

    def child(module: nn.Module, args: Any, output: torch.Tensor) -> None:
        roots.append(ours(model))
        outputs.append(output.detach().clone())

    model[0].register_forward_hook(child)
    stats = ActivationStats()
    left_open = []  # after each batch, the root forward its root hooks think is running (none: no frame left behind)
    with stats.attach(model):
        for batch in range(15):
            if batch == 13:  # a forward that raises right after the stretch (batch 13): its record taken back
                with pytest.raises(RuntimeError):
                    model(torch.randn(4, 5))
            model(torch.randn(4, 3)).sum().backward()
            left_open.append(stats._frames.current() if stats._frames is not None else "no frames")
    assert left_open == [None] * 15
    # batch 2 pauses the module hooks, batch 3 foresees the stretch 4..11 (batch 12 is measured): the loop driver's
    # forward pre-hook alone on the root from its first batch, its two root hooks back from its last
    assert roots[:4] == [3, 3, 3, 3] and roots[4:11] == [1] * 7 and roots[11:] == [3] * (len(roots) - 11)
    assert stats.batches == [0, 1, 12, 14]  # the forward that raised was batch 13 (no output: its layer raised)
    kept = [outputs[k] for k in (0, 1, 12, 13)]
    assert len(stats.stats) == len(kept)
    for record, output in zip(stats.stats, kept, strict=True):
        assert record[0]["mean"] == pytest.approx(output.double().mean().item(), rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("own_driver", [True, False])
def test_the_later_half_of_a_stretch_is_timed_apart_and_its_slower_first_steps_are_charged(
    monkeypatch: pytest.MonkeyPatch, own_driver: bool
) -> None:
    """With its own driver (`attach`), the stretch's middle batches pass the driver without an event and the
    driver marks where its later half begins; driven with another callback, it sees every batch and marks it."""
    from hookscope.callbacks import _activation_stats, _budget
    from hookscope.callbacks._budget import Budget

    observed = {0, 1, 12}
    monkeypatch.setattr(Budget, "_rule", lambda self, step, credit: step in observed)  # its decisions, not its clock
    now = [0.0]
    monkeypatch.setattr(_budget.time, "perf_counter", lambda: now[0])  # (the one `time` module: the driver's too)
    ended = record_stretches(monkeypatch)
    model = nn.Sequential(nn.Linear(3, 2))
    stats = ActivationStats()
    took = {4: 1.5, 5: 1.5, 11: 1.25}  # the stretch's first two batches (after a measured one) and its last are slower
    with stats.attach(model) if own_driver else LoopDriver([stats, Callback()], model):
        for batch in range(13):
            now[0] += took.get(batch - 1, 1.0)  # the time of the batch before this one
            model(torch.randn(4, 3)).sum().backward()
    timer = stats._timer
    assert timer is not None
    assert _activation_stats.later_part(8) == 4
    # batch 2 follows the measured batch 1 (no typical step time yet), batch 3 foresees the stretch 4..11; its later
    # half is timed from batch 7's start to batch 11's: 4 batches of 1 s; the stretch took 9.25 s, 1.25 s beyond 8
    # such batches (timing the middle, 5..11, would have charged 0.58 s: the slow batch 5 taken for a typical one)
    assert ended == [(4, 8, (4.0, 4))]
    assert timer._typical == pytest.approx(1.0)  # learned from the later half
    assert timer.own == pytest.approx(1.25)  # its slower first steps and its ends (the hooks take no time here)


def test_closing_a_record_is_counted_as_its_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    from hookscope.callbacks import _budget

    now = [0.0]
    monkeypatch.setattr(_budget.time, "perf_counter", lambda: now[0])
    original = ActivationStats._close

    def slow_close(self: ActivationStats) -> None:
        if self._row >= 0:
            now[0] += 1.0  # closing an observed batch's record (and describing the waiting ones) takes 1 s
        original(self)

    monkeypatch.setattr(ActivationStats, "_close", slow_close)
    model = nn.Sequential(nn.Linear(3, 2))
    stats = ActivationStats()
    with stats.attach(model):
        for _ in range(4):
            now[0] += 0.01
            model(torch.randn(4, 3)).sum().backward()
    timer = stats._timer
    assert timer is not None and len(stats.batches) == 4  # the warm-up: every batch observed
    assert timer.own == pytest.approx(3.0)  # the three records closed by the next batch: its own time


def test_without_a_budget_every_batch_is_observed_as_fastai() -> None:
    model = nn.Sequential(nn.Linear(3, 2))
    stats = ActivationStats(budget=None)
    with stats.attach(model):
        for _ in range(40):
            model(torch.randn(4, 3))
    assert stats.batches == list(range(40)) and len(stats.stats) == 40


def test_measured_counts_every_batch_begun_and_the_records_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """`measured` counts the batches that began, those a stretch left alone passed without an event too (read in
    the middle of one and after the fit), and the records kept; with `every` or without a budget, nothing is
    timed."""
    from hookscope.callbacks._budget import Budget

    observed = {0, 1, 20, 21}
    monkeypatch.setattr(Budget, "_rule", lambda self, step, credit: step in observed)  # its decisions, not its clock
    model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2))
    budgeted, middle = ActivationStats(), {}
    with budgeted.attach(model):
        for batch in range(30):
            model(torch.randn(4, 3)).sum().backward()
            if batch == 9:  # batches 4 to 19 are a stretch: its driver counts them, no event reaches the callback
                middle = budgeted.measured
    assert (middle["steps"], middle["recorded"], middle["budget"]) == (10, 2, 0.03)
    after = budgeted.measured
    assert (after["steps"], after["recorded"], budgeted.batches) == (30, 4, sorted(observed))
    assert isinstance(after["cost"], float) and after["cost"] >= 0
    for stats, every in ((ActivationStats(every=3), 3), (ActivationStats(budget=None), 1)):
        with stats.attach(model):
            for _ in range(10):
                model(torch.randn(4, 3)).sum().backward()
        assert stats.measured == {"steps": 10, "every": every, "cost": None, "recorded": len(range(0, 10, every))}


@pytest.mark.parametrize("budget", [0.0, 1.0, -0.1])
def test_a_budget_out_of_range_is_refused(budget: float) -> None:
    with pytest.raises(ValueError, match=r"budget must be a fraction of the step time in \(0, 1\), such as 0.03"):
        ActivationStats(budget=budget)


@pytest.mark.parametrize("budget", [True, "3%"])
def test_a_budget_that_is_not_a_number_is_refused(budget: object) -> None:
    with pytest.raises(TypeError, match="budget must be a number or None, got"):
        ActivationStats(budget=budget)  # type: ignore[arg-type]
