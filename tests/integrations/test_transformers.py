"""The Hugging Face callback: a real `Trainer.train` (needs accelerate), and the real `CallbackHandler` driving a
tiny BERT built from a config in the Trainer's event order (no download, CPU)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch
import torch.nn as nn

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from transformers.trainer_callback import CallbackHandler, TrainerControl, TrainerState  # noqa: E402

from hookscope.callbacks import ActivationStats  # noqa: E402
from hookscope.integrations.transformers import HookscopeTrainerCallback  # noqa: E402
from hookscope.watch import watch  # noqa: E402


def tiny_bert() -> nn.Module:
    config = transformers.BertConfig(
        vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=16, num_labels=2,
    )  # fmt: skip
    return transformers.BertForSequenceClassification(config)


class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(index)
        return {"input_ids": torch.randint(0, 40, (8,), generator=generator), "labels": torch.tensor(index % 2)}


def no_hooks(model: nn.Module) -> bool:
    return all(not (m._forward_hooks or m._forward_pre_hooks) for m in model.modules())


def test_callback_handler_drives_watch_through_the_trainer_event_order() -> None:
    model = tiny_bert().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    w, stats = watch(model), ActivationStats()
    # without TrainingArguments (they need accelerate), so without the DefaultFlowCallback that reads them
    handler = CallbackHandler([HookscopeTrainerCallback(w, stats)], model, None, optimizer, None)
    state, control = TrainerState(), TrainerControl()
    batches = iter(torch.utils.data.DataLoader(Tokens(), batch_size=3))
    handler.on_train_begin(None, state, control)
    for _ in range(2):  # the Trainer's loop: two micro-batches of gradient accumulation per optimizer step
        handler.on_step_begin(None, state, control)
        for micro in range(2):
            (model(**next(batches)).loss / 2).backward()
            if micro == 0:
                handler.on_substep_end(None, state, control)
        handler.on_pre_optimizer_step(None, state, control)
        optimizer.step()
        handler.on_optimizer_step(None, state, control)
        model.zero_grad()
        state.global_step += 1
        handler.on_step_end(None, state, control)
    model.eval()
    model(**next(batches))  # evaluation: not a training step
    handler.on_train_end(None, state, control)
    results = w.results()
    assert results.steps.tolist() == [0, 1]
    assert "bert.encoder.layer.0.attention.self.query" in results.layers
    assert "classifier" in results.layers and "bert.encoder.layer.0.intermediate.intermediate_act_fn" in results.layers
    assert torch.isfinite(results.update_ratios["classifier.weight"]).all()
    assert torch.isfinite(results.param_grads["classifier.weight"]["norm"]).all()
    assert results.dropped.get("eval", 0) > 0 and results.unobserved == {}
    assert len(stats.stats) == 2 and math.isfinite(stats.stats[1][0]["mean"])
    assert no_hooks(model)


def test_a_real_trainer_run(tmp_path: Path) -> None:
    pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate (not installed here)")
    backwarded: list[float] = []  # oracle: what each training_step backwarded (scaled by the Trainer for accumulation)

    class Trainer(transformers.Trainer):  # type: ignore[misc]
        def training_step(self, *args: object, **kwargs: object) -> torch.Tensor:
            loss: torch.Tensor = super().training_step(*args, **kwargs)
            backwarded.append(float(loss))
            return loss

    model = tiny_bert()
    w = watch(model)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=3, gradient_accumulation_steps=2,
        report_to=[], save_strategy="no", logging_strategy="no", use_cpu=True, disable_tqdm=True,
    )  # fmt: skip
    Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[HookscopeTrainerCallback(w)]).train()
    results = w.results()
    assert results.steps.tolist() == [0, 1, 2]
    assert torch.isfinite(results.update_ratios["classifier.weight"]).all()
    assert results.losses is not None and len(backwarded) == 6  # each step's loss: what its micro-batches backwarded
    torch.testing.assert_close(
        results.losses, torch.tensor(backwarded, dtype=torch.float64).view(3, 2).sum(dim=1), rtol=1e-5, atol=1e-6
    )
    assert no_hooks(model)


def test_close_removes_hooks_after_a_failed_train() -> None:
    model = tiny_bert()
    w = watch(model)
    callback = HookscopeTrainerCallback(w)
    with pytest.raises(RuntimeError, match="train failed"), callback:
        callback.on_train_begin(None, TrainerState(), TrainerControl(), model=model, optimizer=None)
        assert not no_hooks(model)
        raise RuntimeError("train failed")
    assert no_hooks(model)
