"""The Lightning callback, end to end: a real `Trainer.fit` on a tiny model, on the CPU."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn as nn

pl = pytest.importorskip("lightning.pytorch")
pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*is deprecated")

from hookscope.callbacks import ActivationStats  # noqa: E402
from hookscope.integrations.lightning import HookscopeLightningCallback  # noqa: E402
from hookscope.watch import watch  # noqa: E402


class Regressor(pl.LightningModule):  # type: ignore[misc]
    def __init__(self, fail_at: int | None = None) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        self.fail_at = fail_at
        self.losses: list[float] = []  # oracle: each training batch's loss, as training_step returns it

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        if self.fail_at is not None and self.global_step == self.fail_at:
            raise RuntimeError("failing training step")
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)  # the LightningModule's own forward is never called
        self.losses.append(float(loss.detach()))
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self.net(batch[0] * 1e3)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def fit(module: Regressor, callback: HookscopeLightningCallback, tmp_path: Path, accumulate: int = 1) -> None:
    data = torch.utils.data.TensorDataset(torch.randn(24, 4), torch.randn(24, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8 // accumulate)
    trainer = pl.Trainer(
        max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=tmp_path, accelerator="cpu", limit_val_batches=1,
        num_sanity_val_steps=0, callbacks=[callback], accumulate_grad_batches=accumulate,
    )  # fmt: skip
    trainer.fit(module, loader, loader)


def no_hooks(model: nn.Module) -> bool:
    return all(not (m._forward_hooks or m._forward_pre_hooks) for m in model.modules())


def test_watch_and_activation_stats_record_a_real_fit(tmp_path: Path) -> None:
    module = Regressor()
    w, stats = watch(module), ActivationStats(every=2)
    fit(module, HookscopeLightningCallback(w, stats), tmp_path)
    results = w.results()
    assert results.steps.tolist() == list(range(6))  # 3 batches x 2 epochs, counted over the fit
    assert list(results.layers) == ["net.0", "net.1", "net.2"]
    assert float(results.activations["net.0"]["max"].max()) < 100  # validation (x 1000) never recorded
    assert results.losses is not None
    torch.testing.assert_close(results.losses, torch.tensor(module.losses, dtype=torch.float64), rtol=1e-5, atol=1e-7)
    assert torch.isfinite(results.update_ratios["net.0.weight"]).all()
    assert torch.isfinite(results.param_grads["net.2.bias"]["norm"]).all()
    assert results.dropped.get("eval", 0) > 0
    assert len(stats.stats) == math.ceil(6 / 2)
    assert no_hooks(module)


def test_accumulated_batches_log_the_full_loss_of_each_step(tmp_path: Path) -> None:
    module = Regressor()
    w = watch(module)
    fit(module, HookscopeLightningCallback(w), tmp_path, accumulate=2)
    results = w.results()
    assert results.steps.tolist() == list(range(6))  # 6 batches of 4 per epoch, 2 per optimizer step
    assert results.losses is not None  # Lightning backwards loss / 2 per batch: a step's loss is the pair's mean
    expected = torch.tensor(module.losses, dtype=torch.float64).view(6, 2).mean(dim=1)
    torch.testing.assert_close(results.losses, expected, rtol=1e-5, atol=1e-7)


def test_hooks_are_removed_when_the_fit_raises(tmp_path: Path) -> None:
    module = Regressor(fail_at=2)
    w = watch(module)
    with pytest.raises(RuntimeError, match="failing training step"):
        fit(module, HookscopeLightningCallback(w), tmp_path)
    assert no_hooks(module)
    assert w.results().steps.tolist() == [0, 1, 2]


def test_the_callback_needs_hookscope_callbacks() -> None:
    with pytest.raises(TypeError, match="needs at least one hookscope callback"):
        HookscopeLightningCallback()
    with pytest.raises(TypeError, match="callbacks must be .*hookscope Callback objects"):
        HookscopeLightningCallback(object())  # type: ignore[arg-type]
