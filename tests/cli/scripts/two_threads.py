"""Two models, each trained by its own thread with its own optimizer; the losses are printed once both finish."""

import threading

import torch
import torch.nn as nn

torch.manual_seed(0)
models = {"left": nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1)), "right": nn.Linear(5, 1)}
inputs = {"left": torch.randn(4, 16, 3), "right": torch.randn(4, 16, 5)}
losses = {name: [] for name in models}


def train(name):
    model = models[name]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for x in inputs[name]:
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses[name].append(loss.item())


threads = [threading.Thread(target=train, args=(name,)) for name in models]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
for name, values in losses.items():
    print(name, " ".join(f"{v:.6f}" for v in values))
