"""Fit a small regression with LBFGS: the only training is `optimizer.step(closure)`; then a prediction pass under
`torch.no_grad()` with the model still in train mode. Prints six digits."""

import torch
import torch.nn as nn

torch.manual_seed(0)
x = torch.randn(32, 3)
y = x @ torch.tensor([[1.0], [-2.0], [0.5]]) + 0.1 * torch.randn(32, 1)
model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))
optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)


def closure():
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    return loss


for step in range(3):
    loss = optimizer.step(closure)
    print(f"step {step}: loss {loss.item():.6f}")
with torch.no_grad():
    print(f"prediction mean {model(x).mean().item():.6f}")
