"""Tiny models shared by the summary tests: MLP, CNN with BatchNorm, LSTM, transformer encoder, shared module."""

from __future__ import annotations

import torch
import torch.nn as nn


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
