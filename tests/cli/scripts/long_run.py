"""A long run: 1500 optimizer steps of a tiny regression (or `sys.argv[1]`), more than watch()'s default capacity
of 1024 recorded steps. Prints every step's loss with six digits."""

import sys

import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(2, 4), nn.Tanh(), nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
x = torch.randn(32, 2)
y = x[:, :1] * 0.5 - x[:, 1:]
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 1500
for step in range(steps):
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step}: loss {loss.item():.6f}")
