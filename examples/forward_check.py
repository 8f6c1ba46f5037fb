"""The mean of every child's output in one forward (the ForwardCheck pattern), with `Hooks`."""

import torch
import torch.nn as nn

import hookscope

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
with hookscope.Hooks(model, lambda module, inputs, output: output.mean()) as hooks:
    model(torch.randn(32, 8))
for index, mean in enumerate(hooks.stored):
    print(f"child {index}: mean {mean.item():.6f}")
