"""Real architectures, small and offline: built from `transformers` configs and as torchvision-style modules.

Each `RealModel` builds a fresh model (seeded), draws batches of a tiny learnable synthetic task from a
generator, and computes the training loss. `train(spec, fault=...)` runs the training loop under `watch()`
with AdamW, optionally with one planted fault: a NaN written into one layer's weight (`"nan"`), a block whose
activation is dead from the start (`"dead"`), or a learning rate 100 times too high (`"lr"`). Results of the
healthy runs are cached per process (`healthy`), so the suite and the report tests share them.

Importable by any test as `from realmodels.zoo import ...` (the `tests` folder is on `sys.path`).
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from hookscope.results import WatchResults
from hookscope.watch import watch

from .blocks import LSTMLanguageModel, MobileNetV3Small, ResNetSmall, Seq2SeqTransformer, VisionTransformerSmall

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

STEPS = 20
"""Training steps of a healthy run."""
LR = 1e-3
"""AdamW's learning rate of a healthy run (the `"lr"` fault uses 100 times this)."""
NAN_STEP = 3
"""The step before which the `"nan"` fault writes a NaN into a weight."""
FAULT_STEPS = {"nan": NAN_STEP + 3, "dead": 8, "lr": 4}
"""How many steps each fault's run trains (enough for the doctor to see it, no more)."""
VOCAB, LENGTH, BATCH, IMAGE = 32, 12, 16, 16

Batch = tuple[tuple[Any, ...], dict[str, Any], torch.Tensor]  # (args, kwargs, target)


@dataclass(frozen=True)
class RealModel:
    """One architecture: how to build it, feed it and train it, and where its planted faults sit.

    Attributes:
        name: short id (test ids, report folders).
        build: a fresh model (call under a seed).
        batch: a batch of the task from a generator: (args, kwargs) of the model's forward and the target.
        loss: the training loss of the model's output on a batch's target.
        nan_layer: the module whose weight the `"nan"` fault corrupts: the first layer whose output breaks.
        dead: (module whose bias the `"dead"` fault sets to -10, the activation that then never fires).
    """

    name: str
    build: Callable[[], nn.Module]
    batch: Callable[[torch.Generator], Batch]
    loss: Callable[[Any, torch.Tensor], torch.Tensor]
    nan_layer: str
    dead: tuple[str, str]


@dataclass
class Run:
    """A finished training run: the model, what watch() recorded, the warnings raised, the losses."""

    model: nn.Module
    results: WatchResults
    warnings: list[warnings.WarningMessage]


# ---- tasks -------------------------------------------------------------------------------------------------
def progressions(gen: torch.Generator) -> torch.Tensor:
    """(BATCH, LENGTH) token sequences counting up by 1 or 2 (mod VOCAB) from a random start: learnable."""
    start = torch.randint(0, VOCAB, (BATCH, 1), generator=gen)
    stride = torch.randint(1, 3, (BATCH, 1), generator=gen)
    return (start + stride * torch.arange(LENGTH)) % VOCAB


def quadrants(gen: torch.Generator, size: int = IMAGE) -> tuple[torch.Tensor, torch.Tensor]:
    """(BATCH, 3, size, size) noisy images with one bright quadrant, and its index (4 classes)."""
    labels = torch.randint(0, 4, (BATCH,), generator=gen)
    images = torch.randn(BATCH, 3, size, size, generator=gen) * 0.5
    half = size // 2
    for row, label in enumerate(labels.tolist()):
        top, left = divmod(label, 2)
        images[row, :, top * half : (top + 1) * half, left * half : (left + 1) * half] += 1.5
    return images, labels


def _lm_batch(gen: torch.Generator) -> Batch:
    ids = progressions(gen)
    return (), {"input_ids": ids}, ids


def _image_batch(keyword: str | None) -> Callable[[torch.Generator], Batch]:
    def batch(gen: torch.Generator) -> Batch:
        images, labels = quadrants(gen)
        return ((), {keyword: images}, labels) if keyword else ((images,), {}, labels)

    return batch


def _ids_batch(gen: torch.Generator) -> Batch:
    ids = progressions(gen)
    return (ids,), {}, ids


def _copy_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids.reshape(-1))


def _next_token_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def _logits(output: Any) -> torch.Tensor:
    return output.logits if hasattr(output, "logits") else output


def _classify(output: Any, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(_logits(output), labels)


# ---- transformers models -----------------------------------------------------------------------------------
def _gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=VOCAB, n_positions=LENGTH, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0
    )
    return GPT2LMHeadModel(config)


def _bert() -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=LENGTH,
        num_labels=2,
    )
    return BertForSequenceClassification(config)


def _bert_batch(gen: torch.Generator) -> Batch:
    ids = progressions(gen)
    return (), {"input_ids": ids}, (ids[:, 0] < VOCAB // 2).long()  # is the first token in the lower half?


def _vit() -> nn.Module:
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        image_size=IMAGE,
        patch_size=4,
        num_channels=3,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=4,
    )
    return ViTForImageClassification(config)


def _resnet() -> nn.Module:
    from transformers import ResNetConfig, ResNetForImageClassification

    config = ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic", num_labels=4)
    return ResNetForImageClassification(config)


def _mobilenet_v2(blocks: int = 3) -> nn.Module:
    """transformers' MobileNetV2 at width 0.25, cut after its first `blocks` inverted residual blocks (the config
    has no depth setting): a new 1x1 head convolution and classifier sized for them, initialized as the model
    initializes its own."""
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification
    from transformers.models.mobilenet_v2.modeling_mobilenet_v2 import MobileNetV2ConvLayer

    config = MobileNetV2Config(image_size=IMAGE, depth_multiplier=0.25, num_labels=4, classifier_dropout_prob=0.0)
    model = MobileNetV2ForImageClassification(config)
    body = model.mobilenet_v2
    body.layer = nn.ModuleList(list(body.layer)[:blocks])
    channels = body.layer[-1].reduce_1x1.convolution.out_channels
    body.conv_1x1 = MobileNetV2ConvLayer(config, in_channels=channels, out_channels=64, kernel_size=1)
    model.classifier = nn.Linear(64, config.num_labels)
    for module in (body.conv_1x1, model.classifier):
        module.apply(model._init_weights)
    return model


# ---- the registry ------------------------------------------------------------------------------------------
MODELS: dict[str, RealModel] = {
    spec.name: spec
    for spec in (
        RealModel(
            "gpt2",
            _gpt2,
            _lm_batch,
            lambda out, ids: _next_token_loss(out.logits, ids),  # the model's own loss would shift the same way
            "transformer.h.1.mlp.c_proj",
            ("transformer.h.1.mlp.c_fc", "transformer.h.1.mlp.act"),
        ),
        RealModel(
            "bert",
            _bert,
            _bert_batch,
            _classify,
            "bert.encoder.layer.1.intermediate.dense",
            ("bert.encoder.layer.1.intermediate.dense", "bert.encoder.layer.1.intermediate.intermediate_act_fn"),
        ),
        RealModel(
            "vit",
            _vit,
            _image_batch("pixel_values"),
            _classify,
            "vit.layers.1.mlp.fc2",
            ("vit.layers.1.mlp.fc1", "vit.layers.1.mlp.activation_fn"),
        ),
        RealModel(
            "resnet",
            _resnet,
            _image_batch("pixel_values"),
            _classify,
            "resnet.encoder.stages.1.layers.0.layer.1.convolution",
            (
                "resnet.encoder.stages.1.layers.0.layer.0.normalization",
                "resnet.encoder.stages.1.layers.0.layer.0.activation",
            ),
        ),
        RealModel(
            "mobilenet_v2",
            _mobilenet_v2,
            _image_batch("pixel_values"),
            _classify,
            "mobilenet_v2.layer.2.conv_3x3.convolution",
            ("mobilenet_v2.layer.1.expand_1x1.normalization", "mobilenet_v2.layer.1.expand_1x1.activation"),
        ),
        RealModel("tv_resnet", ResNetSmall, _image_batch(None), _classify, "layer2.0.conv1", ("bn1", "relu")),
        RealModel(
            "tv_mobilenet_v3",
            MobileNetV3Small,
            _image_batch(None),
            _classify,
            "features.2.block.2.0",
            ("features.2.block.0.1", "features.2.block.0.2"),
        ),
        RealModel(
            "tv_vit",
            VisionTransformerSmall,
            _image_batch(None),
            _classify,
            "encoder.layers.encoder_layer_1.mlp.3",
            ("encoder.layers.encoder_layer_1.mlp.0", "encoder.layers.encoder_layer_1.mlp.1"),
        ),
        RealModel("lstm_lm", LSTMLanguageModel, _ids_batch, _next_token_loss, "lstm", ("proj.0", "proj.1")),
        RealModel(
            "transformer",
            Seq2SeqTransformer,
            _ids_batch,
            _copy_loss,
            "transformer.decoder.layers.0.linear2",
            ("transformer.encoder.layers.0.linear1", "transformer.encoder.layers.0.activation"),
        ),
    )
}


# ---- training ----------------------------------------------------------------------------------------------
def build(spec: RealModel, seed: int = 0) -> nn.Module:
    """A fresh model of `spec`, seeded, in training mode."""
    torch.manual_seed(seed)
    return spec.build().train()


def step_loss(spec: RealModel, model: nn.Module, batch: Batch) -> torch.Tensor:
    """The model's loss on one batch."""
    args, kwargs, target = batch
    return spec.loss(model(*args, **kwargs), target)


def plant_dead_block(spec: RealModel, model: nn.Module) -> None:
    """Set the bias feeding `spec.dead[1]` to -10: its inputs stay negative, its units never fire."""
    with torch.no_grad():
        model.get_submodule(spec.dead[0]).bias.fill_(-10.0)


def plant_nan(spec: RealModel, model: nn.Module) -> None:
    """Write a NaN into the first weight of `spec.nan_layer` (a corrupted weight)."""
    layer = model.get_submodule(spec.nan_layer)
    weight = next(p for name, p in layer.named_parameters(recurse=False) if "weight" in name)
    with torch.no_grad():
        weight.view(-1)[0] = float("nan")


def train(spec: RealModel, *, steps: int = STEPS, fault: str | None = None, **watch_options: Any) -> Run:
    """Train a fresh `spec` model for `steps` AdamW steps under `watch()`, with `fault` planted (or none)."""
    model = build(spec)
    if fault == "dead":
        plant_dead_block(spec, model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR * (100 if fault == "lr" else 1))
    gen = torch.Generator().manual_seed(1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with watch(model, optimizer, **{"every": 1, **watch_options}) as watcher:  # every step measured
            for step in range(steps):
                if fault == "nan" and step == NAN_STEP:
                    plant_nan(spec, model)
                loss = step_loss(spec, model, spec.batch(gen))
                watcher.log_loss(loss.detach())
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
    return Run(model, watcher.results(), list(caught))


@functools.cache
def healthy(name: str) -> Run:
    """The healthy run of model `name` (trained once per process, then shared)."""
    return train(MODELS[name])


def expected_layers(model: nn.Module) -> list[str]:
    """Oracle of watch()'s default selection: modules with parameters of their own, except the `out_proj` of an
    nn.MultiheadAttention (its parent never calls it), and activations without children (torch's, or library
    ones whose class name ends with `Activation`), in model order."""
    from hookscope.watch._watch import ACTIVATION_TYPES

    out_proj = {id(m.out_proj) for m in model.modules() if isinstance(m, nn.MultiheadAttention)}
    chosen = []
    for path, module in model.named_modules():
        own = any(True for _ in module.parameters(recurse=False)) and id(module) not in out_proj
        named = type(module).__name__.endswith("Activation") and not list(module.children())
        if own or isinstance(module, ACTIVATION_TYPES) or named:
            chosen.append(path)
    return chosen


@functools.cache
def faulty(name: str, fault: str) -> Run:
    """A run of model `name` with `fault` planted (`"nan"`, `"dead"` or `"lr"`), as short as `FAULT_STEPS` says
    (trained once per process, then shared)."""
    return train(MODELS[name], steps=FAULT_STEPS[fault], fault=fault)
