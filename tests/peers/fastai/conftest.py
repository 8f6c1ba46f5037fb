"""What fastai's notebook tests lean on that is not hookscope: fastcore's test helpers, fastai's `ConvLayer`, and the
scaffolding a fastai `Learner` provided (`synth_learner`, `fit`), driving hookscope's callbacks from a plain loop.

fastcore's `test_eq`, `test_close`, `test_stdout`, `equals` and `L.itemgot` are re-implemented here as fastcore
defines them (fastcore is Apache-2.0, as fastai). `Learner.fit` runs fastai's training loop (SGD with momentum 0.9,
MSE loss, `synth_dbunch`'s data) and emits hookscope's events where fastai's `Learner` emits its own; the Learner
state a fastai callback reads (`self.pred`, `self.y`, `self.training`, `self.learn`) is set on each callback before
`on_batch_end`, and each callback is reachable as `learn.<snake_case name>`, as in fastai.
"""

from __future__ import annotations

import io
import itertools
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import redirect_stdout
from typing import Any

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from hookscope.callbacks import Callback


# ---- fastcore.test / fastcore.basics -----------------------------------------------------------------------------
def _is_iter(o: Any) -> bool:
    return isinstance(o, Iterable) and getattr(o, "ndim", 1)


def _tensor_eq(a: torch.Tensor, b: Any) -> bool:  # fastai's Tensor.__array_eq__
    return torch.equal(a, b) if a.dim() else bool(a == b)


def equals(a: Any, b: Any) -> bool:
    """fastcore's `equals`: sublists, tensors and arrays compared item by item."""
    if isinstance(a, type) or isinstance(b, type):
        return bool(a == b)
    if isinstance(a, torch.Tensor):
        return _tensor_eq(a, b)
    if isinstance(b, torch.Tensor):
        return _tensor_eq(b, a)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return bool(np.array_equal(a, b))
    if isinstance(a, (str, dict, set)) or isinstance(b, (str, dict, set)):
        return bool(a == b)
    if _is_iter(a) or _is_iter(b):
        return _is_iter(b) and all(equals(x, y) for x, y in itertools.zip_longest(a, b))
    return bool(a == b)


def test_eq(a: Any, b: Any) -> None:
    """fastcore's `test_eq`."""
    assert equals(a, b), f"==:\n{a}\n{b}"


def is_close(a: Any, b: Any, eps: float = 1e-5) -> bool:
    """fastcore's `is_close`."""
    if hasattr(a, "__array__") or hasattr(b, "__array__"):
        return bool((abs(a - b) < eps).all())
    if isinstance(a, Iterable) or isinstance(b, Iterable):
        return is_close(np.array(a), np.array(b), eps=eps)
    return bool(abs(a - b) < eps)


def test_close(a: Any, b: Any, eps: float = 1e-5) -> None:
    """fastcore's `test_close`."""
    assert is_close(a, b, eps=eps), f"close:\n{a}\n{b}"


def test_stdout(f: Callable[[], Any], exp: str, regex: bool = False) -> None:
    """fastcore's `test_stdout`: `f` prints `exp` (and a newline) to stdout."""
    s = io.StringIO()
    with redirect_stdout(s):
        f()
    if regex:
        assert re.search(exp, s.getvalue()) is not None
    else:
        test_eq(s.getvalue(), f"{exp}\n" if len(exp) > 0 else "")


for _helper in (test_eq, test_close, test_stdout):
    _helper.__test__ = False  # type: ignore[attr-defined]  # imported into test modules: not tests themselves


class L(list[Any]):
    """The part of fastcore's `L` the notebook uses: `itemgot`."""

    def itemgot(self, key: Any) -> L:
        return L(item[key] for item in self)


# ---- fastai.layers ----------------------------------------------------------------------------------------------
class ConvLayer(nn.Sequential):
    """fastai's `ConvLayer` with its defaults: conv (no bias, `ks // 2` padding), BatchNorm, ReLU."""

    def __init__(self, ni: int, nf: int, ks: int = 3, stride: int = 1) -> None:
        conv = nn.Conv2d(ni, nf, ks, stride=stride, padding=(ks - 1) // 2, bias=False)
        super().__init__(conv, nn.BatchNorm2d(nf), nn.ReLU())


# ---- fastai.test_utils and the Learner ---------------------------------------------------------------------------
class RegModel(nn.Module):
    """fastai's `RegModel`: `a * x + b`."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Parameter(torch.randn(1)), nn.Parameter(torch.randn(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.a + self.b


def synth_data(n: int, bs: int = 16, a: float = 2, b: float = 3) -> TensorDataset:
    """`synth_dbunch`'s data: `bs * n` points of `a * x + b` plus noise."""
    x = torch.randn(bs * n, 1)
    return TensorDataset(x, a * x + b + 0.1 * torch.randn(bs * n, 1))


def _snake(name: str) -> str:
    name = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", re.sub(r"(.)([A-Z][a-z]+)", r"\1_\2", name)).lower()
    return name.removesuffix("_callback")


class Learner:
    """The part of fastai's `Learner` the notebook's callbacks use, over hookscope's events."""

    def __init__(
        self, train: DataLoader[Any], valid: DataLoader[Any], model: nn.Module, cbs: Any = (), lr: float = 1e-3
    ) -> None:
        self.train_dl, self.valid_dl, self.model, self.lr = train, valid, model, lr
        self.cbs: list[Callback] = list(cbs) if isinstance(cbs, (list, tuple)) else [cbs]
        self.loss_func = nn.MSELoss()
        self.training = False
        for cb in self.cbs:
            setattr(self, _snake(type(cb).__name__), cb)

    def _share(self, **state: Any) -> None:
        """What a fastai callback reads from its Learner through `__getattr__`."""
        for name, value in state.items():
            setattr(self, name, value)
            for cb in self.cbs:
                setattr(cb, name, value)

    def fit(self, n_epoch: int) -> None:
        opt = torch.optim.SGD(self.model.parameters(), lr=self.lr, momentum=0.9)
        self._share(learn=self)
        started: list[Callback] = []
        error: BaseException | None = None
        try:
            for cb in self.cbs:
                cb.on_fit_start(self.model, opt)
                started.append(cb)
            train_iter = 0
            for _ in range(n_epoch):
                for xb, yb in self._batches(self.train_dl, training=True):
                    for cb in self.cbs:
                        cb.on_batch_start(train_iter)
                    self._train_step(opt, xb, yb)
                    for cb in self.cbs:
                        cb.on_batch_end(train_iter)
                    train_iter += 1
                for xb, yb in self._batches(self.valid_dl, training=False):
                    with torch.no_grad():
                        self._share(pred=self.model(xb), y=yb)
        except BaseException as err:
            error = err
            raise
        finally:
            for cb in reversed(started):
                cb.on_fit_end(error)

    def _batches(self, loader: DataLoader[Any], training: bool) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self.model.train(training)
        self._share(training=training)
        yield from loader

    def _train_step(self, opt: torch.optim.Optimizer, xb: torch.Tensor, yb: torch.Tensor) -> None:
        pred = self.model(xb)
        loss = self.loss_func(pred.flatten(), yb.flatten())
        self._share(pred=pred, y=yb)
        loss.backward()
        for cb in self.cbs:
            cb.after_backward()
            cb.before_optimizer_step(opt)
        opt.step()
        for cb in self.cbs:
            cb.after_optimizer_step(opt)
        opt.zero_grad()


def synth_learner(n_trn: int = 10, n_val: int = 2, model: nn.Module | None = None, cbs: Any = ()) -> Learner:
    """fastai's `synth_learner`: `RegModel` (or `model`) on `synth_dbunch(n_train=n_trn, n_valid=n_val)`."""
    train = DataLoader(synth_data(n_trn), batch_size=16, shuffle=True)
    valid = DataLoader(synth_data(n_val), batch_size=16)
    return Learner(train, valid, RegModel() if model is None else model, cbs)
