"""A script that changes its working directory (as Hydra-style and many research scripts do), then reads a file
that sits next to it through `__file__`. Prints whether `__file__` is absolute and the file's first line; with
`--crash`, raises after training (its traceback names the script by its absolute path, as Python's does)."""

import os
import sys

import torch
import torch.nn as nn

os.makedirs(os.path.join("outputs", "run-1"), exist_ok=True)
os.chdir(os.path.join("outputs", "run-1"))
with open(os.path.join(os.path.dirname(__file__), "labels.txt")) as labels:
    print(f"labels: {labels.readline().strip()}")
print(f"__file__ is absolute: {os.path.isabs(__file__)}")

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(16, 3), torch.randn(16, 1)
for step in range(3):
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step}: loss {loss.item():.6f}")
if "--crash" in sys.argv:
    raise RuntimeError("planted crash after the chdir")
