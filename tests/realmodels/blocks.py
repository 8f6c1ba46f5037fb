"""Hand-written models in torchvision's style (its wheel cannot be installed here), small, with its module names.

ResNet (BasicBlock with one in-place ReLU called twice, a downsampling shortcut), MobileNetV3 (Conv2dNormActivation
containers, depthwise-separable convolutions, squeeze-excitation, Hardswish), ViT (nn.MultiheadAttention, ln_1,
a zero-initialized head, parameters on the root), an LSTM language model and an nn.Transformer seq2seq model.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any

import torch
import torch.nn as nn

VOCAB, LENGTH, IMAGE, CLASSES = 32, 12, 16, 4


# ---- ResNet ------------------------------------------------------------------------------------------------
class BasicBlock(nn.Module):
    """torchvision's BasicBlock: conv-bn-relu-conv-bn, plus the (downsampled) input, then the same ReLU again."""

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        result: torch.Tensor = self.relu(out)
        return result


class ResNetSmall(nn.Module):
    """A two-stage ResNet with torchvision's names (conv1, bn1, relu, maxpool, layer1, layer2, avgpool, fc)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(2)
        self.layer1 = nn.Sequential(BasicBlock(16, 16))
        downsample = nn.Sequential(nn.Conv2d(16, 32, 1, 2, bias=False), nn.BatchNorm2d(32))
        self.layer2 = nn.Sequential(BasicBlock(16, 32, 2, downsample))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, CLASSES)
        for module in self.modules():  # torchvision's initialization
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer2(self.layer1(x))
        logits: torch.Tensor = self.fc(torch.flatten(self.avgpool(x), 1))
        return logits


# ---- MobileNetV3 -------------------------------------------------------------------------------------------
class Conv2dNormActivation(nn.Sequential):
    """torchvision's container: convolution, batch norm and (optionally) an in-place activation."""

    def __init__(
        self, inputs: int, outputs: int, kernel: int = 3, stride: int = 1, groups: int = 1, activation: Any = None
    ) -> None:
        layers: list[nn.Module] = [
            nn.Conv2d(inputs, outputs, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
            nn.BatchNorm2d(outputs, eps=0.001, momentum=0.01),
        ]
        if activation is not None:
            layers.append(activation(inplace=True))
        super().__init__(*layers)


class SqueezeExcitation(nn.Module):
    """torchvision's SE block: pool, 1x1 squeeze, ReLU, 1x1 excite, Hardsigmoid, scale the input."""

    def __init__(self, channels: int, squeezed: int) -> None:
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeezed, 1)
        self.fc2 = nn.Conv2d(squeezed, channels, 1)
        self.activation = nn.ReLU()
        self.scale_activation = nn.Hardsigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x)))))
        return scale * x


class InvertedResidual(nn.Module):
    """torchvision's MobileNetV3 block: 1x1 expand, depthwise conv, optional SE, 1x1 project (+ input)."""

    def __init__(
        self, inputs: int, expanded: int, outputs: int, kernel: int, stride: int, use_se: bool, activation: Any
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        if expanded != inputs:
            layers.append(Conv2dNormActivation(inputs, expanded, 1, activation=activation))
        layers.append(Conv2dNormActivation(expanded, expanded, kernel, stride, expanded, activation))
        if use_se:
            layers.append(SqueezeExcitation(expanded, max(8, expanded // 4)))
        layers.append(Conv2dNormActivation(expanded, outputs, 1))
        self.block = nn.Sequential(*layers)
        self.use_res_connect = stride == 1 and inputs == outputs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result: torch.Tensor = self.block(x)
        return result + x if self.use_res_connect else result


class MobileNetV3Small(nn.Module):
    """A cut-down MobileNetV3-small with torchvision's layout (features, avgpool, classifier)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            Conv2dNormActivation(3, 16, 3, 2, activation=nn.Hardswish),
            InvertedResidual(16, 16, 16, 3, 2, True, nn.ReLU),
            InvertedResidual(16, 48, 24, 3, 1, False, nn.ReLU),
            InvertedResidual(24, 64, 24, 5, 1, True, nn.Hardswish),
            Conv2dNormActivation(24, 64, 1, activation=nn.Hardswish),
        )
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(
            nn.Linear(64, 64), nn.Hardswish(inplace=True), nn.Dropout(0.2, inplace=True), nn.Linear(64, CLASSES)
        )
        for module in self.modules():  # torchvision's initialization
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out")
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, 0, 0.01)
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))
        return logits


# ---- ViT ---------------------------------------------------------------------------------------------------
class MLPBlock(nn.Sequential):
    """torchvision's ViT MLP: Linear, GELU, Dropout, Linear, Dropout (Xavier weights, near-zero biases)."""

    def __init__(self, width: int, hidden: int) -> None:
        layers = (nn.Linear(width, hidden), nn.GELU(), nn.Dropout(0.0), nn.Linear(hidden, width), nn.Dropout(0.0))
        super().__init__(*layers)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.normal_(module.bias, std=1e-6)


class EncoderBlock(nn.Module):
    """torchvision's ViT encoder block: ln_1, self_attention (nn.MultiheadAttention), ln_2, mlp; pre-norm."""

    def __init__(self, width: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(width, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(width, heads, batch_first=True)
        self.dropout = nn.Dropout(0.0)
        self.ln_2 = nn.LayerNorm(width, eps=1e-6)
        self.mlp = MLPBlock(width, hidden)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        x = self.ln_1(inputs)
        x, _ = self.self_attention(x, x, x, need_weights=False)
        x = self.dropout(x) + inputs
        return x + self.mlp(self.ln_2(x))


class Encoder(nn.Module):
    """torchvision's ViT encoder: position embedding (a parameter of its own), blocks, final LayerNorm."""

    def __init__(self, length: int, layers: int, width: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.pos_embedding = nn.Parameter(torch.empty(1, length, width).normal_(std=0.02))
        self.dropout = nn.Dropout(0.0)
        blocks = OrderedDict((f"encoder_layer_{i}", EncoderBlock(width, heads, hidden)) for i in range(layers))
        self.layers = nn.Sequential(blocks)
        self.ln = nn.LayerNorm(width, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result: torch.Tensor = self.ln(self.layers(self.dropout(x + self.pos_embedding)))
        return result


class VisionTransformerSmall(nn.Module):
    """torchvision's VisionTransformer, small: conv_proj patches, a class token on the root, a zero-init head."""

    def __init__(self, patch: int = 4, width: int = 32, layers: int = 2, heads: int = 2, hidden: int = 64) -> None:
        super().__init__()
        self.patch = patch
        self.conv_proj = nn.Conv2d(3, width, patch, patch)
        self.class_token = nn.Parameter(torch.zeros(1, 1, width))
        self.encoder = Encoder((IMAGE // patch) ** 2 + 1, layers, width, heads, hidden)
        self.heads = nn.Sequential(OrderedDict(head=nn.Linear(width, CLASSES)))
        nn.init.trunc_normal_(self.conv_proj.weight, std=math.sqrt(1 / (3 * patch * patch)))
        nn.init.zeros_(self.conv_proj.bias)
        nn.init.zeros_(self.heads.head.weight)  # torchvision starts the head at zero
        nn.init.zeros_(self.heads.head.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_proj(x).flatten(2).transpose(1, 2)  # (B, patches, width)
        x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], dim=1)
        logits: torch.Tensor = self.heads(self.encoder(x)[:, 0])
        return logits


# ---- sequence models ---------------------------------------------------------------------------------------
class LSTMLanguageModel(nn.Module):
    """Embedding, one LSTM layer, a ReLU projection and a decoder to next-token logits."""

    def __init__(self, width: int = 32, hidden: int = 48) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, width)
        self.lstm = nn.LSTM(width, hidden, batch_first=True)
        self.proj = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU())
        self.decoder = nn.Linear(hidden, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.lstm(self.embedding(ids))
        logits: torch.Tensor = self.decoder(self.proj(hidden))
        return logits


class Seq2SeqTransformer(nn.Module):
    """nn.Transformer learning to copy its source: shared token embedding, learned positions (a parameter of the
    root), a causal decoder. The encoder is given as `custom_encoder` with an `nn.ReLU()` module as activation so
    that its units can be watched; the decoder keeps the functional default, because a module given as
    `nn.Transformer(activation=...)` is never called in the decoder: deep-copying a TransformerDecoderLayer
    shadows it with `F.relu` (its `__setstate__`), and `watch()` rightly reports it unobserved."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.position = nn.Parameter(torch.randn(1, LENGTH, width) * 0.02)
        layer = nn.TransformerEncoderLayer(width, 2, 64, dropout=0.0, activation=nn.ReLU(), batch_first=True)
        encoder = nn.TransformerEncoder(layer, 1, norm=nn.LayerNorm(width), enable_nested_tensor=False)
        self.transformer = nn.Transformer(width, 2, 1, 1, 64, dropout=0.0, custom_encoder=encoder, batch_first=True)
        self.generator = nn.Linear(width, VOCAB)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(LENGTH), persistent=False)

    def forward(self, source: torch.Tensor) -> torch.Tensor:
        target = torch.cat([torch.zeros_like(source[:, :1]), source[:, :-1]], dim=1)  # shifted right, 0 = start
        src, tgt = self.embed(source) + self.position, self.embed(target) + self.position
        out = self.transformer(src, tgt, tgt_mask=self.mask, tgt_is_causal=True)
        logits: torch.Tensor = self.generator(out)
        return logits
