"""Tiny models shared by the summary tests: MLP, CNN with BatchNorm, LSTM, transformer encoder, shared module."""

from __future__ import annotations

import torch
import torch.nn as nn

from realmodels.blocks import BasicBlock


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 4))


class ConvBlock(nn.Sequential):
    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())


class SmallCNN(nn.Module):
    """Two conv-BN-ReLU blocks, the first BatchNorm frozen and in eval mode (as when fine-tuning)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(ConvBlock(3, 8), ConvBlock(8, 16, stride=2))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(16, 10)
        self.features[0][1].requires_grad_(False)
        self.features[0][1].eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(self.features(x)).flatten(1))


class LSTMTagger(nn.Module):
    """Embedding -> 2-layer LSTM -> Linear; returns (logits, (h, c))."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 12)
        self.lstm = nn.LSTM(12, 20, num_layers=2, batch_first=True)
        self.head = nn.Linear(20, 5)

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        out, state = self.lstm(self.embed(tokens))
        return self.head(out), state


class Encoder(nn.Module):
    """Token embedding + 2-layer transformer encoder; returns {'logits', 'hidden'}."""

    def __init__(self, d_model: int = 16, heads: int = 2, ff: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(30, d_model)
        layer = nn.TransformerEncoderLayer(d_model, heads, ff, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, 3)

    def forward(self, tokens: torch.Tensor, scale: float = 1.0) -> dict[str, torch.Tensor]:
        hidden = self.encoder(self.embed(tokens) * scale)
        return {"logits": self.head(hidden[:, 0]), "hidden": hidden}


class Shared(nn.Module):
    """Tied input/output embedding, one block registered twice and called twice."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.block = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
        self.stack = nn.Sequential(self.block, nn.LayerNorm(8), self.block)
        self.out = nn.Linear(8, 20, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(self.stack(self.embed(tokens)))


class ResNet18(nn.Module):
    """ResNet-18 as torchvision builds it: 11,689,512 parameters for 1000 classes."""

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        widths = [(64, 64, 1), (64, 128, 2), (128, 256, 2), (256, 512, 2)]
        for index, (cin, cout, stride) in enumerate(widths, start=1):
            downsample = None
            if stride != 1 or cin != cout:
                downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            setattr(
                self, f"layer{index}", nn.Sequential(BasicBlock(cin, cout, stride, downsample), BasicBlock(cout, cout))
            )
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for index in range(1, 5):
            x = getattr(self, f"layer{index}")(x)
        return self.fc(self.avgpool(x).flatten(1))
