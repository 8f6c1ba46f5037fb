"""A model whose forward returns its own loss (`loss = model(x, y); loss.backward()`), as nanoGPT-style and many
research models do. Prints six digits per step."""

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x, y):
        return F.mse_loss(self.net(x), y)


model = Regressor()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
x = torch.randn(8, 32, 5)
y = x @ torch.randn(5, 1)  # a target the model can learn

for step in range(8):
    loss = model(x[step], y[step])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step}: loss {loss.item():.6f}")
