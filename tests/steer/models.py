"""A 2-layer attention-only transformer with identity modules as named sites, and the repeated-segment task it
learns induction heads on (a random first part, repeated later)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn as nn

VOCAB, HALF, WIDTH, HEADS = 24, 8, 32, 2
SEQ = 2 * HALF + 2


class Attention(nn.Module):
    """Causal multi-head attention; `out_proj`'s input holds the heads as contiguous chunks."""

    def __init__(self, width: int = WIDTH, heads: int = HEADS) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.out_proj = nn.Linear(width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = (t.view(batch, seq, self.heads, -1).transpose(1, 2) for t in self.qkv(x).split(width, -1))
        scores = q @ k.transpose(-1, -2) / math.sqrt(width // self.heads)
        causal = torch.ones(seq, seq, dtype=torch.bool, device=x.device).tril()
        weights = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        z = (weights @ v).transpose(1, 2).reshape(batch, seq, width)  # heads as contiguous chunks
        return self.out_proj(z)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.resid_pre = nn.Identity()
        self.attn = Attention()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.resid_pre(x)
        return x + self.attn(x)


class AttentionOnly(nn.Module):
    """tokens [batch, seq] -> logits [batch, seq, vocab]; sites: `embedded`, `blocks.{0,1}.resid_pre`,
    `blocks.{0,1}.attn.out_proj` (heads at its input), `blocks.{0,1}`."""

    def __init__(self, seq: int = SEQ) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.pos = nn.Embedding(seq, WIDTH)
        self.embedded = nn.Identity()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.unembed = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embedded(self.embed(tokens) + self.pos(positions))
        for block in self.blocks:
            x = block(x)
        return self.unembed(x)


def repeated(batch: int, gen: torch.Generator, length: int = HALF) -> torch.Tensor:
    """`[batch, SEQ]` tokens: a random part of `length` tokens (no repeats inside it), the same part again, then
    random filler."""
    rows = [torch.randperm(VOCAB, generator=gen) for _ in range(batch)]
    filler = torch.randint(0, VOCAB, (batch, SEQ - 2 * length), generator=gen)
    first = torch.stack([row[:length] for row in rows])
    return torch.cat([first, first, filler], dim=1)


def _batch(gen: torch.Generator, batch: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens whose repeated part has a random length per row (so only induction, not a fixed offset, predicts
    the repeat), and the mask of the predictable positions."""
    lengths = torch.randint(4, HALF + 1, (batch,), generator=gen).tolist()
    tokens = torch.cat([repeated(1, gen, length) for length in lengths])
    index = torch.arange(SEQ - 1)
    lengths_t = torch.tensor(lengths).unsqueeze(1)
    predictable = (index >= lengths_t) & (index < 2 * lengths_t - 1)  # position p predicts token p + 1
    return tokens, predictable


def train(model: AttentionOnly, steps: int, seed: int = 0) -> AttentionOnly:
    """Train next-token prediction on the predictable (repeated) positions."""
    gen = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        tokens, predictable = _batch(gen)
        logits = model(tokens)[:, :-1]
        loss = nn.functional.cross_entropy(logits[predictable], tokens[:, 1:][predictable])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def forward_by_hand(
    model: AttentionOnly,
    tokens: torch.Tensor,
    *,
    resid_pre_1: Callable[[torch.Tensor], None] | None = None,
    heads_0: Callable[[torch.Tensor], None] | None = None,
) -> torch.Tensor:
    """`model(tokens)` written out, with in-place edits of the residual stream entering layer 1 and of layer 0's
    heads (`[batch, seq, width]`, heads as contiguous chunks) where given: the reference for interventions."""
    positions = torch.arange(tokens.shape[1])
    x = model.embed(tokens) + model.pos(positions)
    for index, block in enumerate(model.blocks):
        if index == 1 and resid_pre_1 is not None:
            x = x.clone()
            resid_pre_1(x)
        attn = block.attn
        batch, seq, width = x.shape
        q, k, v = (t.view(batch, seq, attn.heads, -1).transpose(1, 2) for t in attn.qkv(x).split(width, -1))
        scores = q @ k.transpose(-1, -2) / math.sqrt(width // attn.heads)
        causal = torch.ones(seq, seq, dtype=torch.bool).tril()
        z = (scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v).transpose(1, 2).reshape(batch, seq, width)
        if index == 0 and heads_0 is not None:
            heads_0(z)
        x = x + attn.out_proj(z)
    return model.unembed(x)


def induction_pair(
    batch: int, seed: int = 1, source: int = 4
) -> tuple[torch.Tensor, torch.Tensor, Callable[[torch.Tensor], torch.Tensor], int]:
    """Clean and corrupted tokens that differ only at `source` (in the first part), the metric (the clean answer's
    logit minus the corrupted token's, at the query: the position after the repeat of `source - 1`), the query."""
    gen = torch.Generator().manual_seed(seed)
    clean = repeated(batch, gen)
    query = HALF + source - 1
    answer = clean[:, source].clone()
    other = (answer + torch.randint(1, VOCAB, answer.shape, generator=gen)) % VOCAB
    corrupted = clean.clone()
    corrupted[:, source] = other
    rows = torch.arange(batch)

    def metric(logits: torch.Tensor) -> torch.Tensor:
        return (logits[rows, query, answer] - logits[rows, query, other]).mean()

    return clean, corrupted, metric, query
