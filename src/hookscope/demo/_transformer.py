"""A tiny pre-LN decoder and its training loop: the model the transformer instabilities are reproduced on.

`TinyGPT` (d=64, 2 layers, 2 heads, MLP 4d with GELU, no biases, vocabulary 64, 32 positions) learns sequences
whose second half repeats the first (`repeat_batch`): the first half cannot be predicted (ln 64 = 4.16 per
token), the second half can (an induction head copies it), so a run that learns ends near 2.0 and one that
learns nothing stays at 4.16. `train_tiny_gpt` trains it with AdamW (0.9, 0.95), weight decay 1e-4, gradient
clipping at 1 and a 10% warmup then cosine schedule; the faults of the doctor's transformer checks are its
arguments (a learning rate too high without qk-layernorm, a loss scaled far below Adam's epsilon, a learning
rate multiplied mid-run).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = [
    "TinyAttention",
    "TinyBlock",
    "TinyGPT",
    "TinyGPTConfig",
    "repeat_batch",
    "tiny_gpt_optimizer",
    "train_tiny_gpt",
]


@dataclass(frozen=True)
class TinyGPTConfig:
    """The shape of `TinyGPT` and how its attention is computed.

    Attributes:
        vocab: Vocabulary size.
        length: Sequence length (the number of positions).
        width: Model width `d`.
        layers: Number of blocks.
        heads: Attention heads per block.
        qk_layernorm: Normalize queries and keys per head before their product (Dehghani et al. 2023).
        sdpa: Compute attention with `F.scaled_dot_product_attention` (else an explicit softmax).
    """

    vocab: int = 64
    length: int = 32
    width: int = 64
    layers: int = 2
    heads: int = 2
    qk_layernorm: bool = False
    sdpa: bool = False


class TinyAttention(nn.Module):
    """Causal multi-head self-attention, by an explicit softmax or by `F.scaled_dot_product_attention`.

    Shape:
        input (B, T, d) -> output (B, T, d).
    """

    def __init__(self, config: TinyGPTConfig) -> None:
        super().__init__()
        self.heads, self.sdpa = config.heads, config.sdpa
        head_width = config.width // config.heads
        self.qkv = nn.Linear(config.width, 3 * config.width, bias=False)
        self.proj = nn.Linear(config.width, config.width, bias=False)
        self.q_norm = nn.LayerNorm(head_width, bias=False) if config.qk_layernorm else None
        self.k_norm = nn.LayerNorm(head_width, bias=False) if config.qk_layernorm else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2) for t in self.qkv(x).split(width, dim=2))
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True) if self.sdpa else self.attend(q, k) @ v
        return self.proj(y.transpose(1, 2).reshape(batch, length, width))  # type: ignore[no-any-return]

    def attend(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """The attention weights of the explicit path: softmax of the scaled, causally masked logits.

        Shape:
            q, k (B, heads, T, head width) -> (B, heads, T, T).
        """
        weights: torch.Tensor = F.softmax(self.logits(q, k), dim=-1)
        return weights

    @staticmethod
    def logits(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """The scaled logits with the future masked (-inf), as the softmax sees them."""
        length = q.shape[-2]
        causal = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
        scores: torch.Tensor = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        return scores.masked_fill(~causal, -math.inf)


class TinyBlock(nn.Module):
    """A pre-LN block: `x + attn(ln(x))`, then `x + mlp(ln(x))` (MLP 4d with GELU)."""

    def __init__(self, config: TinyGPTConfig) -> None:
        super().__init__()
        width = config.width
        self.ln_attn = nn.LayerNorm(width, bias=False)
        self.attn = TinyAttention(config)
        self.ln_mlp = nn.LayerNorm(width, bias=False)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width, bias=False), nn.GELU(), nn.Linear(4 * width, width, bias=False)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_attn(x))
        return x + self.mlp(self.ln_mlp(x))  # type: ignore[no-any-return]


class TinyGPT(nn.Module):
    """Token and position embeddings, `layers` pre-LN blocks (`blocks.N`), a final LayerNorm and the head.

    Shape:
        input (B, T) token ids -> output (B, T, vocab) logits.
    """

    def __init__(self, config: TinyGPTConfig | None = None) -> None:
        super().__init__()
        config = config or TinyGPTConfig()
        self.config = config
        self.tokens = nn.Embedding(config.vocab, config.width)
        self.positions = nn.Embedding(config.length, config.width)
        self.blocks = nn.ModuleList(TinyBlock(config) for _ in range(config.layers))
        self.ln_out = nn.LayerNorm(config.width, bias=False)
        self.head = nn.Linear(config.width, config.vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_out(x))  # type: ignore[no-any-return]


def repeat_batch(generator: torch.Generator, batch: int = 16, length: int = 32, vocab: int = 64) -> torch.Tensor:
    """Token ids (batch, length) whose second half repeats the first (random tokens)."""
    half = torch.randint(0, vocab, (batch, length // 2), generator=generator)
    return torch.cat([half, half], dim=1)


def tiny_gpt_optimizer(model: nn.Module, lr: float, eps: float = 1e-8) -> torch.optim.AdamW:
    """AdamW (0.9, 0.95), weight decay 1e-4, with peak learning rate `lr` and epsilon `eps`."""
    return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), eps=eps, weight_decay=1e-4)


def train_tiny_gpt(
    model: TinyGPT,
    optimizer: torch.optim.Optimizer,
    *,
    steps: int,
    schedule_steps: int | None = None,
    loss_scale: float = 1.0,
    lr_jump: tuple[int, float] | None = None,
    seed: int = 0,
    on_step: Callable[[int, torch.Tensor], None] | None = None,
) -> list[float]:
    """Train `model` for `steps` steps on `repeat_batch` batches; return the losses (cross-entropy, unscaled).

    Args:
        model: The model.
        optimizer: Its optimizer (`tiny_gpt_optimizer`); its `lr` is the peak of the schedule.
        steps: The steps to run.
        schedule_steps: The length of the warmup + cosine schedule (default: `steps`); a run may stop early.
        loss_scale: The loss is multiplied by this before backward.
        lr_jump: `(step, factor)`: the learning rate is multiplied by `factor` from `step` on.
        seed: The seed of the batches.
        on_step: Called with `(step, loss)` after each backward, before the optimizer step (e.g. `log_loss`).
    """
    total = schedule_steps or steps
    warmup = max(total // 10, 1)
    lr = float(optimizer.defaults["lr"])

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1.0 + math.cos(math.pi * min(step - warmup, total - warmup) / max(total - warmup, 1)))

    generator = torch.Generator().manual_seed(seed)
    config = model.config
    losses: list[float] = []
    for step in range(steps):
        jump = lr_jump[1] if lr_jump is not None and step >= lr_jump[0] else 1.0
        for group in optimizer.param_groups:
            group["lr"] = lr * factor(step) * jump
        ids = repeat_batch(generator, length=config.length, vocab=config.vocab)
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, config.vocab), ids[:, 1:].reshape(-1))
        scaled: torch.Tensor = loss * loss_scale
        scaled.backward()  # type: ignore[no-untyped-call]
        if on_step is not None:
            on_step(step, loss)
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses
