"""fastai's own tests of its hook vocabulary, run against hookscope (issue 26).

Ported from fastai/fastai, `nbs/15_callback.hook.ipynb` (https://github.com/fastai/fastai), the test cells that
exercise a name hookscope keeps from fastai (`Hook`, `Hooks`, `hook_output(s)`, `model_sizes`,
`num_features_model`, `has_params`, `HookCallback`, `total_params`, `layer_info`, `module_summary`,
`ActivationStats`). Copyright the fastai authors (fast.ai, Inc.), licensed under the Apache License, Version 2.0
(`LICENSE-Apache-2.0.txt` beside this file). Changes: the imports; each notebook cell is a test function; what a
fastai `Learner` provided is replaced by the scaffolding in `conftest.py` (`synth_learner(...).fit(1)` drives
hookscope's events from a plain loop; `layer_info`/`module_summary` take the model where fastai's take the Learner,
and the `learn.summary()` cells compare `module_summary`'s part of the text, the Learner adds the optimizer and
callback lines); `L(...)` wraps a list where fastai's values were already an `L`. The expected values are fastai's.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader

from hookscope import (
    ActivationStats,
    Hook,
    HookCallback,
    Hooks,
    has_params,
    hook_output,
    hook_outputs,
    layer_info,
    model_sizes,
    module_summary,
    num_features_model,
    total_params,
)

from .conftest import ConvLayer, L, Learner, synth_learner, test_close, test_eq, test_stdout

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="a #cuda cell: needs a GPU")


def example_forward_hook(m, i, o):  # type: ignore[no-untyped-def]
    print(m, i, o)


@pytest.fixture
def x() -> torch.Tensor:
    return torch.randn(4, 5)


# ---- Hook ---------------------------------------------------------------------------------------------------------
def test_hook_stores_what_hook_func_returns(x: torch.Tensor) -> None:
    tst_model = nn.Linear(5, 3)
    hook = Hook(tst_model, lambda m, i, o: o)
    y = tst_model(x)
    test_eq(hook.stored, y)


def test_hook_remove() -> None:
    tst_model = nn.Linear(5, 10)
    x = torch.randn(4, 5)
    y = tst_model(x)
    hook = Hook(tst_model, example_forward_hook)
    test_stdout(lambda: tst_model(x), f"{tst_model} ({x},) {y.detach()}")
    hook.remove()
    test_stdout(lambda: tst_model(x), "")


def test_hook_context_manager() -> None:
    tst_model = nn.Linear(5, 10)
    x = torch.randn(4, 5)
    y = tst_model(x)
    with Hook(tst_model, example_forward_hook) as h:  # noqa: F841
        test_stdout(lambda: tst_model(x), f"{tst_model} ({x},) {y.detach()}")
    test_stdout(lambda: tst_model(x), "")


def test_hook_output() -> None:
    tst_model = nn.Linear(5, 10)
    x = torch.randn(4, 5)
    with hook_output(tst_model) as h:
        y = tst_model(x)
        test_eq(y, h.stored)
        assert not h.stored.requires_grad

    with hook_output(tst_model, grad=True) as h:
        y = tst_model(x)
        loss = y.pow(2).mean()
        loss.backward()
        test_close(2 * y / y.numel(), h.stored[0])


@cuda
def test_hook_output_cpu() -> None:
    tst_model = nn.Linear(5, 10)
    x = torch.randn(4, 5)
    with hook_output(tst_model, cpu=True) as h:
        y = tst_model.cuda()(x.cuda())  # noqa: F841
        test_eq(h.stored.device, torch.device("cpu"))


# ---- Hooks --------------------------------------------------------------------------------------------------------
def test_hooks(x: torch.Tensor) -> None:
    layers = [nn.Linear(5, 10), nn.ReLU(), nn.Linear(10, 3)]
    tst_model = nn.Sequential(*layers)
    hooks = Hooks(tst_model, lambda m, i, o: o)
    y = tst_model(x)
    test_eq(hooks.stored[0], layers[0](x))
    test_eq(hooks.stored[1], F.relu(layers[0](x)))
    test_eq(hooks.stored[2], y)
    hooks.remove()


def test_hooks_context_manager(x: torch.Tensor) -> None:
    layers = [nn.Linear(5, 10), nn.ReLU(), nn.Linear(10, 3)]
    tst_model = nn.Sequential(*layers)
    with Hooks(layers, lambda m, i, o: o) as h:
        y = tst_model(x)
        test_eq(h.stored[0], layers[0](x))
        test_eq(h.stored[1], F.relu(layers[0](x)))
        test_eq(h.stored[2], y)


def test_hook_outputs() -> None:
    layers = [nn.Linear(5, 10), nn.ReLU(), nn.Linear(10, 3)]
    tst_model = nn.Sequential(*layers)
    x = torch.randn(4, 5)
    with hook_outputs(layers) as h:
        y = tst_model(x)
        test_eq(h.stored[0], layers[0](x))
        test_eq(h.stored[1], F.relu(layers[0](x)))
        test_eq(h.stored[2], y)
        for s in h.stored:
            assert not s.requires_grad

    with hook_outputs(layers, grad=True) as h:
        y = tst_model(x)
        loss = y.pow(2).mean()
        loss.backward()
        g = 2 * y / y.numel()
        test_close(g, h.stored[2][0])
        g = g @ layers[2].weight.data
        test_close(g, h.stored[1][0])
        g = g * (layers[0](x) > 0).float()
        test_close(g, h.stored[0][0])


@cuda
def test_hook_outputs_cpu() -> None:
    layers = [nn.Linear(5, 10), nn.ReLU(), nn.Linear(10, 3)]
    tst_model = nn.Sequential(*layers)
    x = torch.randn(4, 5)
    with hook_outputs(tst_model, cpu=True) as h:
        y = tst_model.cuda()(x.cuda())  # noqa: F841
        for s in h.stored:
            test_eq(s.device, torch.device("cpu"))


# ---- model_sizes, num_features_model, has_params -----------------------------------------------------------------
def test_model_sizes() -> None:
    m = nn.Sequential(ConvLayer(3, 16), ConvLayer(16, 32, stride=2), ConvLayer(32, 32))
    test_eq(model_sizes(m), [[1, 16, 64, 64], [1, 32, 32, 32], [1, 32, 32, 32]])


def test_num_features_model() -> None:
    m = nn.Sequential(nn.Conv2d(5, 4, 3), nn.Conv2d(4, 3, 3))
    test_eq(num_features_model(m), 3)
    m = nn.Sequential(ConvLayer(3, 16), ConvLayer(16, 32, stride=2), ConvLayer(32, 32))
    test_eq(num_features_model(m), 32)


def test_has_params() -> None:
    assert has_params(nn.Linear(3, 4))
    assert has_params(nn.LSTM(4, 5, 2))
    assert not has_params(nn.ReLU())


# ---- HookCallback -------------------------------------------------------------------------------------------------
def test_hook_callback_forward() -> None:
    class TstCallback(HookCallback):
        def hook(self, m, i, o):  # type: ignore[no-untyped-def]
            return o

        def after_batch(self):  # type: ignore[no-untyped-def]
            test_eq(self.hooks.stored[0], self.pred)

    learn = synth_learner(n_trn=5, cbs=TstCallback())
    learn.fit(1)


def test_hook_callback_backward() -> None:
    class TstCallback(HookCallback):
        def __init__(self, modules=None, remove_end=True, detach=True, cpu=False):  # type: ignore[no-untyped-def]
            super().__init__(modules, None, remove_end, False, detach, cpu)

        def hook(self, m, i, o):  # type: ignore[no-untyped-def]
            return o

        def after_batch(self):  # type: ignore[no-untyped-def]
            if self.training:
                test_eq(self.hooks.stored[0][0], 2 * (self.pred - self.y) / self.pred.shape[0])

    learn = synth_learner(n_trn=5, cbs=TstCallback())
    learn.fit(1)


# ---- Model summary ------------------------------------------------------------------------------------------------
def test_total_params() -> None:
    test_eq(total_params(nn.Linear(10, 32)), (32 * 10 + 32, True))
    test_eq(total_params(nn.Linear(10, 32, bias=False)), (32 * 10, True))
    test_eq(total_params(nn.BatchNorm2d(20)), (20 * 2, True))
    test_eq(total_params(nn.BatchNorm2d(20, affine=False)), (0, False))
    test_eq(total_params(nn.Conv2d(16, 32, 3)), (16 * 32 * 3 * 3 + 32, True))
    test_eq(total_params(nn.Conv2d(16, 32, 3, bias=False)), (16 * 32 * 3 * 3, True))
    # First ih layer 20--10, all else 10--10. *4 for the four gates
    test_eq(total_params(nn.LSTM(20, 10, 2)), (4 * (20 * 10 + 10) + 3 * 4 * (10 * 10 + 10), True))


def _m() -> nn.Sequential:
    return nn.Sequential(nn.Linear(1, 50), nn.ReLU(), nn.BatchNorm1d(50), nn.Linear(50, 1))


def test_layer_info() -> None:
    sample_input = torch.randn((16, 1))
    test_eq(
        layer_info(synth_learner(model=_m()).model, sample_input),
        [
            ("Linear", 100, True, [1, 50], False),
            ("ReLU", "", "", [1, 50], True),
            ("BatchNorm1d", 100, True, [1, 50], True),
            ("Linear", 51, True, [1, 1], False),
        ],
    )


def test_layer_info_flatten() -> None:
    # Test for Flatten
    def _tst_m() -> nn.Sequential:
        return nn.Sequential(
            nn.Conv2d(1, 2, kernel_size=3, padding=1, stride=2),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(8, 50),
            nn.ReLU(),
            nn.BatchNorm1d(50),
            nn.Linear(50, 1),
        )

    sample_input = torch.randn((1, 1, 4, 4))
    test_eq(
        layer_info(synth_learner(model=_tst_m()).model, sample_input),
        [
            ("Conv2d", 20, True, [1, 2, 2, 2], False),
            ("ReLU", "", "", [1, 2, 2, 2], True),
            ("Flatten", "", "", [1, 8], False),
            ("Linear", 450, True, [1, 50], False),
            ("ReLU", "", "", [1, 50], True),
            ("BatchNorm1d", 100, True, [1, 50], True),
            ("Linear", 51, True, [1, 1], False),
        ],
    )


def test_layer_info_multiple_inputs() -> None:
    # Test for multiple inputs model
    class _2InpModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.seq = nn.Sequential(nn.Linear(2, 50), nn.ReLU(), nn.BatchNorm1d(50), nn.Linear(50, 1))

        def forward(self, *inps):  # type: ignore[no-untyped-def]
            outputs = torch.cat(inps, dim=-1)
            return self.seq(outputs)

    sample_inputs = (torch.randn(16, 1), torch.randn(16, 1))
    learn = synth_learner(model=_2InpModel())
    test_eq(
        layer_info(learn.model, *sample_inputs),
        [
            ("Linear", 150, True, [1, 50], False),
            ("ReLU", "", "", [1, 50], True),
            ("BatchNorm1d", 100, True, [1, 50], True),
            ("Linear", 51, True, [1, 1], False),
        ],
    )


def _summary(learn: Learner) -> str:
    """The part of fastai's `learn.summary()` that `module_summary` writes, on one training batch."""
    xb = next(iter(learn.train_dl))[:1]
    return module_summary(learn.model, *xb)


SUMMARY = """Sequential (Input shape: 16 x 1)
============================================================================
Layer (type)         Output Shape         Param #    Trainable 
============================================================================
                     16 x 50             
Linear                                    100        True      
ReLU                                                           
BatchNorm1d                               100        True      
____________________________________________________________________________
                     16 x 1              
Linear                                    51         True      
____________________________________________________________________________

Total params: 251
Total trainable params: 251
Total non-trainable params: 0

"""  # noqa: W291


def test_summary() -> None:
    learn = synth_learner(model=_m())
    assert _summary(learn) == SUMMARY


@cuda
def test_summary_cuda() -> None:
    learn = synth_learner(model=_m().cuda())
    xb = next(iter(learn.train_dl))[:1]
    assert module_summary(learn.model, *(x.cuda() for x in xb)) == SUMMARY


def test_summary_multiple_outputs() -> None:
    # Test for multiple output
    class _NOutModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(5, 6)

        def forward(self, x1):  # type: ignore[no-untyped-def]
            x = torch.randn((10, 5))
            return x, self.lin(x)

    learn = synth_learner(model=_NOutModel())
    assert (
        _summary(learn)
        == """_NOutModel (Input shape: 16 x 1)
============================================================================
Layer (type)         Output Shape         Param #    Trainable 
============================================================================
                     16 x 6              
Linear                                    36         True      
____________________________________________________________________________

Total params: 36
Total trainable params: 36
Total non-trainable params: 0

"""  # noqa: W291
    )


def test_summary_of_a_list_dataset() -> None:
    # Test for the case (as in Book) when learn.dls.train_ds is a list not fastai.data.core.Datasets
    train_x = torch.rand((100, 4))
    train_y = torch.rand((100, 1))

    valid_x = torch.rand((100, 4))
    valid_y = torch.rand((100, 1))

    dset = list(zip(train_x, train_y, strict=True))
    valid_dset = list(zip(valid_x, valid_y, strict=True))

    dl = DataLoader(dset, batch_size=16)
    val_dl = DataLoader(valid_dset, batch_size=16)

    simple_net = nn.Sequential(nn.Linear(4, 2), nn.ReLU(), nn.Linear(2, 1))
    learn = Learner(dl, val_dl, simple_net)
    assert (
        _summary(learn)
        == """Sequential (Input shape: 16 x 4)
============================================================================
Layer (type)         Output Shape         Param #    Trainable 
============================================================================
                     16 x 2              
Linear                                    10         True      
ReLU                                                           
____________________________________________________________________________
                     16 x 1              
Linear                                    3          True      
____________________________________________________________________________

Total params: 13
Total trainable params: 13
Total non-trainable params: 0

"""  # noqa: W291
    )


# ---- Activation graphs --------------------------------------------------------------------------------------------
def test_activation_stats() -> None:
    learn = synth_learner(n_trn=5, cbs=ActivationStats(every=4))
    learn.fit(1)
    # the notebook shows `learn.activation_stats.stats`: two records of one module, with fastai's keys
    stats = learn.activation_stats.stats
    test_eq(len(stats), 2)
    for record in stats:
        test_eq(len(record), 1)
        assert {"mean", "std", "near_zero"} <= set(record[0])


@pytest.mark.parametrize("include_paramless", [True, False])
def test_activation_stats_include_paramless(include_paramless: bool) -> None:
    "create a learner, fit, then check number of layers"
    modl = nn.Sequential(nn.Linear(1, 50), nn.ReLU(), nn.BatchNorm1d(50), nn.Linear(50, 1), nn.Flatten())

    learn = synth_learner(model=modl, cbs=ActivationStats(every=4, include_paramless=include_paramless))
    learn.fit(1)

    expected_stats_len = 3
    if include_paramless:
        expected_stats_len = 5  # includes Relu & Flatten
    test_eq(expected_stats_len, len(learn.activation_stats.modules))


@pytest.mark.parametrize("n_tr", [11, 12, 13])
def test_every(n_tr: int) -> None:
    def test_every(n_tr: int, every: int) -> None:
        "create a learner, fit, then check number of stats collected"
        learn = synth_learner(n_trn=n_tr, cbs=ActivationStats(every=every))
        learn.fit(1)
        expected_stats_len = math.ceil(n_tr / every)
        test_eq(expected_stats_len, len(learn.activation_stats.stats))

    test_every(n_tr, 4)
    test_every(n_tr, 1)


class TstCallback(HookCallback):
    def hook(self, m, i, o):  # type: ignore[no-untyped-def]
        return o

    def before_fit(self):  # type: ignore[no-untyped-def]
        super().before_fit()
        self.means, self.stds = [], []

    def after_batch(self):  # type: ignore[no-untyped-def]
        if self.training:
            self.means.append(self.hooks.stored[0].mean().item())
            self.stds.append(self.hooks.stored[0].std().item())


@pytest.mark.xfail(
    strict=True,
    reason="fastai bug: ActivationStats computes each mean and std in float32 (o.float().mean().item()), so it "
    "equals a float32 .mean().item() bit for bit; hookscope's statistics are accumulated in float64 and read out "
    "as float64, and differ from the float32 value in its last bits (docs/coming-from.md)",
)
def test_activation_stats_match_a_hook_callback() -> None:
    class TstCallback(HookCallback):
        def hook(self, m, i, o):  # type: ignore[no-untyped-def]
            return o

        def before_fit(self):  # type: ignore[no-untyped-def]
            super().before_fit()
            self.means, self.stds = [], []

        def after_batch(self):  # type: ignore[no-untyped-def]
            if self.training:
                self.means.append(self.hooks.stored[0].mean().item())
                self.stds.append(self.hooks.stored[0].std().item())

    learn = synth_learner(n_trn=5, cbs=[TstCallback(), ActivationStats()])
    learn.fit(1)
    test_eq(L(learn.activation_stats.stats).itemgot(0).itemgot("mean"), learn.tst.means)
    test_eq(L(learn.activation_stats.stats).itemgot(0).itemgot("std"), learn.tst.stds)


def test_activation_stats_match_a_hook_callback_to_float32_precision() -> None:
    """Not in fastai: the check above, with the tolerance of float32 values (hookscope's are float64)."""
    learn = synth_learner(n_trn=5, cbs=[TstCallback(), ActivationStats()])
    learn.fit(1)
    tst = learn.tst
    assert len(tst.means) == 5
    for name, expected in (("mean", tst.means), ("std", tst.stds)):
        got = L(learn.activation_stats.stats).itemgot(0).itemgot(name)
        torch.testing.assert_close(
            torch.tensor(got, dtype=torch.float64), torch.tensor(expected, dtype=torch.float64), rtol=1e-6, atol=1e-7
        )
