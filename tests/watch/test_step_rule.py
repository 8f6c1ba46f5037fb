"""What a step is (README, "What a step is"): which forwards belong to it, what is labelled rather than merged,
closure optimizers, threads, optimizers over a single tensor. Checked against oracles computed by hand with plain
torch on the same weights and inputs (lr 0 where the weights must stay put)."""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Any

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from hookscope import Callback, Watch
from hookscope.callbacks import ActivationStats, LoopDriver
from hookscope.callbacks._steps import uncounted
from hookscope.watch import watch


def mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))


def frozen_sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.0)  # steps happen, weights stay: oracles can recompute outputs


def test_no_grad_and_inference_mode_forwards_are_not_merged_into_the_training_step() -> None:
    model = mlp()
    opt = frozen_sgd(model)
    inputs = [torch.randn(5, 3) for _ in range(3)]
    with watch(model, opt, select="0") as w:
        for x in inputs:
            with torch.no_grad():
                model(x * 100)  # a metric pass with the model in train mode
            with torch.inference_mode():
                model(x * 100)  # a prediction pass: no crash, not merged
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
    results = w.results()
    assert results.steps.tolist() == [0, 1, 2]
    with torch.no_grad():
        expected = torch.stack([model[0](x) for x in inputs])
    assert results.activations["0"]["count"].tolist() == [40.0] * 3  # 5 x 8 values of the training forward only
    torch.testing.assert_close(
        results.activations["0"]["mean"], expected.mean(dim=(1, 2)).double(), rtol=1e-5, atol=1e-6
    )
    torch.testing.assert_close(
        results.activations["0"]["max"], expected.amax(dim=(1, 2)).double(), rtol=1e-5, atol=1e-6
    )
    assert results.dropped["no_grad"] == 3 and results.dropped["inference_mode"] == 3


@pytest.mark.slow  # about 5 s (compiles)
def test_no_grad_forwards_of_a_compiled_model_are_not_merged() -> None:
    torch._dynamo.reset()
    model = mlp()
    opt = frozen_sgd(model)
    inputs = [torch.randn(5, 3) for _ in range(2)]
    stats = ActivationStats(modules=["0"])
    with watch(model, opt, select="0") as w, stats.attach(model):
        compiled = torch.compile(model, backend="aot_eager")
        for x in inputs:
            with torch.no_grad():
                compiled(x * 100)  # its traced hooks record nothing
            compiled(x).sum().backward()
            opt.step()
    torch._dynamo.reset()
    with torch.no_grad():
        expected = torch.stack([model[0](x) for x in inputs])
    torch.testing.assert_close(
        w.results().activations["0"]["max"], expected.amax(dim=(1, 2)).double(), rtol=1e-5, atol=1e-6
    )
    assert [row[0]["mean"] for row in stats.stats] == pytest.approx(expected.mean(dim=(1, 2)).tolist(), rel=1e-5)


def test_without_an_optimizer_no_grad_forwards_are_not_steps() -> None:
    model = mlp()
    with watch(model, select="0") as w:
        for _ in range(2):
            model(torch.randn(4, 3)).sum().backward()
            with torch.no_grad():
                model(torch.randn(4, 3))
    assert w.results().steps.tolist() == [0, 1]


def test_inference_mode_forwards_are_recorded_safely_when_eval_forwards_count() -> None:
    model = mlp().eval()
    with watch(model, select="0", train_only=False) as w, torch.inference_mode():
        x = torch.randn(4, 3)
        model(x)
    with torch.no_grad():
        expected = model[0](x)
    assert float(w.results().activations["0"]["mean"][0]) == pytest.approx(float(expected.mean()), rel=1e-5)


class Retry(nn.Module):
    """Raises after its first layer while `fail` is set (an out-of-memory error in the middle of a forward)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(3, 8), nn.Linear(8, 1)
        self.fail = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if self.fail:
            raise RuntimeError("out of memory (planted)")
        return self.b(h)


def train_with_retries(model: Retry, callback: object, opt: torch.optim.Optimizer | None) -> list[torch.Tensor]:
    inputs = []
    for _ in range(2):
        model.fail = True
        try:
            model(torch.randn(64, 3) * 100)  # the big batch fails halfway
        except RuntimeError:
            model.fail = False
            x = torch.randn(4, 3)  # the retry with a small batch, inside the except block
            inputs.append(x)
            model(x).sum().backward()
        if opt is not None:
            opt.step()
            opt.zero_grad()
    return inputs


def test_a_forward_that_raised_is_not_merged_into_the_step() -> None:
    model = Retry()
    opt = frozen_sgd(model)
    with watch(model, opt, select=["a", "b"]) as w:
        inputs = train_with_retries(model, w, opt)
    results = w.results()
    with torch.no_grad():
        expected = torch.stack([model.a(x) for x in inputs])
    assert results.activations["a"]["count"].tolist() == [32.0, 32.0]  # the retries' 4 x 8 values only
    torch.testing.assert_close(
        results.activations["a"]["mean"], expected.mean(dim=(1, 2)).double(), rtol=1e-5, atol=1e-6
    )
    assert results.dropped["raised"] == 2
    without_optimizer = Retry()
    with watch(without_optimizer, select="a") as w:
        train_with_retries(without_optimizer, w, None)
    assert w.results().steps.tolist() == [0, 1]  # a forward that raised is no step either
    assert w.results().activations["a"]["count"].tolist() == [32.0, 32.0]


def run_with_a_retry(model: Retry) -> None:
    """Batch 0; then a forward that raises and its retry (one batch, 1); then batch 2."""
    model(torch.randn(4, 3)).sum().backward()
    model.fail = True
    with pytest.raises(RuntimeError, match="planted"):
        model(torch.randn(4, 3))
    model.fail = False
    model(torch.randn(4, 3)).sum().backward()
    model(torch.randn(4, 3)).sum().backward()


class BatchEvents(Callback):
    """The batch numbers of the events a driver emits, in order: ("start", n) and ("end", n)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []

    def on_batch_start(self, batch: int) -> None:
        self.events.append(("start", batch))

    def on_batch_end(self, batch: int) -> None:
        self.events.append(("end", batch))


@pytest.mark.parametrize("watch_first", [True, False])
def test_every_callback_of_a_driver_sees_the_watchs_batch_numbers(watch_first: bool) -> None:
    torch.manual_seed(0)
    model, events = Retry(), BatchEvents()
    w, stats = Watch(select="a", every=1), ActivationStats(modules=["a"])
    callbacks = [w, events, stats] if watch_first else [events, stats, w]
    with LoopDriver(callbacks, model) as driver:
        run_with_a_retry(model)
        assert driver.batch == 2
    # the oracle: the loop has three batches (the forward that raised is none), numbered 0, 1, 2; the retry takes
    # the number of the forward that raised
    assert events.events == [(kind, n) for n in (0, 1, 1, 2) for kind in ("start", "end")]
    assert w.results().steps.tolist() == [0, 1, 2]  # without an optimizer, each batch is a step
    assert stats.batches == [0, 1, 2]  # the records of the completed forwards, by the same numbers


def test_without_a_watch_the_driver_counts_every_training_forward_it_begins() -> None:
    model, events = Retry(), BatchEvents()
    with LoopDriver([events], model) as driver:
        run_with_a_retry(model)
        assert driver.batch == 3
    # the driver cannot see a forward raise: it is a batch here
    assert events.events == [(kind, n) for n in range(4) for kind in ("start", "end")]


def test_activation_stats_keep_only_completed_training_forwards() -> None:
    model = Retry()
    stats = ActivationStats(modules=["a"])
    with stats.attach(model):
        inputs = train_with_retries(model, stats, None)
        with torch.no_grad():
            model(torch.randn(4, 3) * 100)
    with torch.no_grad():
        expected = [float(model.a(x).mean()) for x in inputs]
    assert [row[0]["mean"] for row in stats.stats] == pytest.approx(expected, rel=1e-5)
    assert stats.dropped_reasons == {"raised": 2, "no_grad": 1}


class Checkpointed(nn.Module):
    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 8))
        self.head = nn.Linear(8, 1)
        self.reentrant = reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(checkpoint(self.block, x, use_reentrant=self.reentrant))


@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpoint_recomputation_is_counted_once(reentrant: bool) -> None:
    model = Checkpointed(reentrant)
    opt = frozen_sgd(model)
    x = torch.randn(5, 3, requires_grad=True)
    with watch(model, opt, select=["block.0", "block.2", "head"]) as w:
        model(x).sum().backward()
        opt.step()
    results = w.results()
    hidden = model.block[0](x)  # oracle: the same forward without checkpointing, its output gradients by autograd
    hidden.retain_grad()
    deep = model.block[2](model.block[1](hidden))
    deep.retain_grad()
    model.head(deep).sum().backward()
    assert results.activations["block.0"]["count"].tolist() == [40.0]  # once, not twice
    assert float(results.activations["block.0"]["mean"][0]) == pytest.approx(float(hidden.detach().mean()), rel=1e-5)
    assert float(results.output_grads["block.0"]["norm"][0]) == pytest.approx(float(hidden.grad.norm()), rel=1e-5)
    assert float(results.output_grads["block.2"]["norm"][0]) == pytest.approx(float(deep.grad.norm()), rel=1e-5)
    assert results.dropped["recompute"] >= 1  # non-reentrant recomputation stops early, after block.0


def test_backward_twice_through_one_forward_is_labelled() -> None:
    model = mlp()
    opt = frozen_sgd(model)
    x = torch.randn(4, 3)
    with watch(model, opt, select=["0", "2"]) as w:
        for _ in range(2):
            loss = model(x).pow(2).sum()
            loss.backward(retain_graph=True)
            loss.backward()
            opt.step()
            opt.zero_grad()
    results = w.results()
    out = model(x)
    (grad_out,) = torch.autograd.grad(out.pow(2).sum(), out, retain_graph=True)
    weight_grad = torch.autograd.grad(out.pow(2).sum(), model[2].weight)[0]
    first = float(grad_out.norm())
    assert results.output_grads["2"]["norm"].tolist() == pytest.approx([first, first], rel=1e-5)  # the first's
    summed = float((2 * weight_grad).norm())  # .grad, as the optimizer used it: both backwards summed
    assert results.param_grads["2.weight"]["norm"].tolist() == pytest.approx([summed, summed], rel=1e-5)
    assert results.meta["step_labels"] == {"retain_graph": [0, 1]}
    assert results.dropped["retain_graph"] == 4  # two modules, one repeat each, two steps


def test_a_closure_optimizer_records_its_step_with_finite_ratios_and_the_closures_gradients() -> None:
    torch.manual_seed(1)
    model = mlp()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=3)
    x, y = torch.randn(16, 3), torch.randn(16, 2)
    calls: list[int] = []
    first_grads: list[float] = []
    ratios: list[float] = []
    with watch(model, opt, select=["0", "2"]) as w:
        for _ in range(3):
            calls.append(0)

            def closure() -> torch.Tensor:
                opt.zero_grad()
                loss = (model(x) - y).pow(2).mean()
                loss.backward()
                if calls[-1] == 0:
                    first_grads.append(float(model[0].weight.grad.norm()))
                calls[-1] += 1
                return loss

            before = model[0].weight.detach().clone()
            opt.step(closure)  # the only training: every forward runs inside step()
            after = model[0].weight.detach()
            ratios.append(float((after - before).norm() / after.norm()))
    results = w.results()
    assert results.steps.tolist() == [0, 1, 2]
    assert results.update_ratios["0.weight"].tolist() == pytest.approx(ratios, rel=1e-4)
    assert results.param_grads["0.weight"]["norm"].tolist() == pytest.approx(first_grads, rel=1e-5)
    assert results.activations["0"]["count"].tolist() == [16.0 * 8 * n for n in calls]  # the closure's forwards


def run_threads(model: nn.Module, inputs: list[list[torch.Tensor]]) -> None:
    errors: list[BaseException] = []

    def work(batches: list[torch.Tensor]) -> None:
        try:
            for x in batches:
                model(x).sum().backward()
        except BaseException as err:
            errors.append(err)

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: inside forwards, hooks and flushes
    try:
        threads = [threading.Thread(target=work, args=(batches,)) for batches in inputs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(switch)
    assert not errors, errors[0]


@pytest.mark.parametrize("with_optimizer", [True, False])
def test_forwards_from_several_threads_are_all_counted(with_optimizer: bool) -> None:
    model = nn.Sequential(nn.Linear(3, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = frozen_sgd(model)
    inputs = [[torch.randn(8, 3) for _ in range(10)] for _ in range(4)]
    with watch(model, opt if with_optimizer else None, select=["0", "2"], buffer_steps=4, every=1) as w:
        run_threads(model, inputs)
        opt.step()
    results = w.results()
    with torch.no_grad():
        expected = torch.cat([model[0](x).reshape(-1) for batches in inputs for x in batches])
    counts, means = results.activations["0"]["count"], results.activations["0"]["mean"]
    assert float(counts.nansum()) == expected.numel()  # 40 forwards, no value lost
    assert float((counts * means).nansum()) == pytest.approx(float(expected.sum()), rel=1e-4)
    assert float(results.activations["0"]["max"].nan_to_num(-1.0).max()) == pytest.approx(float(expected.max()))
    assert not results.dropped.get("outside_step")
    if with_optimizer:
        assert counts.tolist() == [float(expected.numel())]  # one optimizer step: one step


def test_results_read_mid_run_include_the_step_that_just_finished() -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    with watch(model, opt, select="0") as w:
        for _ in range(3):
            loss = model(torch.randn(4, 3)).pow(2).mean()
            w.log_loss(loss)
            loss.backward()
            opt.step()
            opt.zero_grad()
            seen.append(w.results().steps.tolist())
    assert seen == [[0], [0, 1], [0, 1, 2]]
    assert w.results().steps.tolist() == [0, 1, 2] and w.results().losses is not None


def tiny_vit() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    config = transformers.ViTConfig(
        hidden_size=64, num_hidden_layers=1, num_attention_heads=2, intermediate_size=512, image_size=8, patch_size=4
    )
    return Pooled(transformers.ViTModel(config))


class Pooled(nn.Module):
    def __init__(self, vit: nn.Module) -> None:
        super().__init__()
        self.vit = vit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.vit(pixel_values=x).last_hidden_state.mean(dim=1)


CASES = {  # each watches exactly one parameter below 16384 values (the batched path): the case that crashed
    "linear-no-bias": (lambda: nn.Linear(4, 4, bias=False), lambda g: torch.randn(2, 4, generator=g), None),
    "embedding": (lambda: nn.Embedding(10, 4), lambda g: torch.randint(0, 10, (2, 3), generator=g), None),
    "prelu": (
        lambda: nn.Sequential(nn.Linear(256, 256, bias=False), nn.PReLU()),  # the Linear's weight is large
        lambda g: torch.randn(2, 256, generator=g),
        None,
    ),
    "vit-encoder-mlp": (tiny_vit, lambda g: torch.randn(2, 3, 8, 8, generator=g), "vit.layers.0.mlp.fc1"),
}


def train_three_steps(model: nn.Module, make_input: Any, select: Any, watched: bool) -> tuple[list[float], Any]:
    """Three SGD steps, every parameter alone in its group; the last watched parameter's update ratios, measured."""
    opt = torch.optim.SGD([{"params": [p]} for p in model.parameters()], lr=0.1)
    first = list((model if select is None else model.get_submodule(select)).parameters())[-1]
    ratios = []
    w = watch(model, opt, select=select) if watched else None
    with w if w is not None else contextlib.nullcontext():
        for k in range(3):
            before = first.detach().clone()
            model(make_input(torch.Generator().manual_seed(k))).pow(2).sum().backward()
            opt.step()
            opt.zero_grad()
            ratios.append(float((first.detach() - before).norm() / first.detach().norm()))
    return ratios, None if w is None else w.results()


@pytest.mark.parametrize("case", list(CASES))
def test_an_optimizer_over_single_small_tensors_trains_as_without_watch(case: str) -> None:
    make, make_input, select = CASES[case]
    torch.manual_seed(0)
    watched, plain = make(), make()
    plain.load_state_dict(watched.state_dict())
    expected, _ = train_three_steps(plain, make_input, select, watched=False)
    got, results = train_three_steps(watched, make_input, select, watched=True)
    assert got == pytest.approx(expected, rel=1e-6)  # the same training: the watch wrote into no weight
    for mine, theirs in zip(watched.parameters(), plain.parameters(), strict=True):
        assert torch.equal(mine, theirs)
    last = list(results.update_ratios)[-1]
    assert results.update_ratios[last].tolist() == pytest.approx(expected, rel=1e-4)


def test_uncounted_names_why_a_forward_is_not_part_of_a_step() -> None:
    """The rule itself, case by case; `train_only` is on unless turned off (ActivationStats relies on it)."""
    model = nn.Linear(2, 2)
    seen_in_backward: list[str | None] = []
    assert uncounted(model) is None
    with torch.no_grad():
        assert uncounted(model) == "no_grad"
    with torch.inference_mode():
        assert uncounted(model) == "inference_mode"
    model.eval()
    assert uncounted(model) == "eval"
    assert uncounted(model, train_only=False) is None
    model.train()
    x = torch.ones(2, requires_grad=True)
    x.register_hook(lambda grad: seen_in_backward.append(uncounted(model, train_only=False)))
    x.sum().backward()
    assert seen_in_backward == ["recompute"]


class Inplace(nn.Module):
    """A model whose forward returns nothing: it keeps its output in `last` (a forward hook then sees `None`)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 8)
        self.last = torch.zeros(())

    def forward(self, x: torch.Tensor) -> None:
        self.last = self.a(x)


def test_a_forward_returning_none_inside_an_except_block_completes() -> None:
    """The exception being handled when a root forward starts is not the forward's own: a forward that returns
    `None` inside `except` (a retry) has completed and is recorded."""
    model = Inplace()
    opt = frozen_sgd(model)
    inputs = [torch.randn(4, 3) for _ in range(2)]
    with watch(model, opt, select="a") as w:
        for x in inputs:
            try:
                raise RuntimeError("out of memory (planted)")
            except RuntimeError:
                model(x)
                model.last.sum().backward()
            opt.step()
    results = w.results()
    with torch.no_grad():
        expected = torch.stack([model.a(x) for x in inputs])
    assert results.activations["a"]["count"].tolist() == [32.0, 32.0]
    torch.testing.assert_close(
        results.activations["a"]["mean"], expected.mean(dim=(1, 2)).double(), rtol=1e-5, atol=1e-6
    )
    assert not results.dropped.get("raised")


def test_what_a_pre_hook_of_the_root_runs_belongs_to_the_forward_it_precedes() -> None:
    """The frame of a root forward opens before the root's other pre-hooks, even those registered before the
    watch: a submodule a user's pre-hook runs belongs to that forward, and is discarded with it when it raises."""
    model = Retry()

    def warm_up(module: nn.Module, args: tuple[torch.Tensor]) -> None:
        module.a(args[0])  # a submodule run by a hook

    model.register_forward_pre_hook(warm_up)
    opt = frozen_sgd(model)
    with watch(model, opt, select="a") as w:
        inputs = train_with_retries(model, w, opt)
    results = w.results()
    with torch.no_grad():
        expected = torch.stack([model.a(x) for x in inputs])
    assert results.activations["a"]["count"].tolist() == [64.0, 64.0]  # the retry's 4 x 8 values, twice
    torch.testing.assert_close(
        results.activations["a"]["mean"], expected.mean(dim=(1, 2)).double(), rtol=1e-5, atol=1e-6
    )
    assert results.dropped["raised"] == 4  # two observations of "a" in each forward that raised


class SelfTarget(nn.Module):
    """Computes its own target by calling itself under `no_grad` inside its forward (a root forward in a root
    forward, as self-distillation does)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(3, 8), nn.Linear(8, 1)

    def forward(self, x: torch.Tensor, target_pass: bool = False) -> torch.Tensor:
        if target_pass:
            return self.b(self.a(x))
        with torch.no_grad():
            target = self(x * 100, target_pass=True)
        return self.b(self.a(x)) - target


def test_a_root_forward_inside_a_root_forward_follows_the_rule_on_its_own() -> None:
    model = SelfTarget()
    opt = frozen_sgd(model)
    inputs = [torch.randn(4, 3) for _ in range(2)]
    with watch(model, opt, select="a") as w:
        for x in inputs:
            model(x).pow(2).sum().backward()
            opt.step()
    results = w.results()
    with torch.no_grad():
        expected = torch.stack([model.a(x) for x in inputs])
    assert results.activations["a"]["count"].tolist() == [32.0, 32.0]  # the training pass only
    torch.testing.assert_close(results.activations["a"]["max"], expected.amax(dim=(1, 2)).double(), rtol=1e-5, atol=0)
    assert results.dropped["no_grad"] == 2


def test_the_step_rules_hooks_leave_with_their_owner() -> None:
    model = mlp()
    opt = frozen_sgd(model)
    with watch(model, opt, select="0"):
        model(torch.randn(2, 3))
    with ActivationStats(modules=["0"]).attach(model):
        model(torch.randn(2, 3))
    assert not model._forward_pre_hooks and not model._forward_hooks
