"""Gradient accumulation over 4 micro-batches (the loss divided by 4, as people write it), 10 micro-batches in all:
two optimizer steps, then the run ends mid-accumulation with two micro-batches backwarded but no step. Prints each
step's loss (the sum of its micro-batch losses) with six digits, and the unfinished step's."""

import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.02)
accumulation = 4
data = torch.randn(10, 16, 4)
targets = data.sum(-1, keepdim=True)

total = 0.0
for micro, (x, y) in enumerate(zip(data, targets, strict=True)):
    loss = nn.functional.mse_loss(model(x), y) / accumulation
    loss.backward()
    total += loss.item()
    if (micro + 1) % accumulation == 0:
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {micro // accumulation}: loss {total:.6f}")
        total = 0.0
print(f"unfinished step: loss {total:.6f}")
