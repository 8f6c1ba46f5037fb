"""The mean gradient of every parameter after backward (the GradientCheck pattern), with post-accumulate hooks."""

import torch
import torch.nn as nn

import hookscope

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
means: dict[str, torch.Tensor] = {}
with hookscope.scope():
    for name, parameter in model.named_parameters():
        hookscope.hooks.register_post_accumulate_grad_hook(
            parameter, lambda p, name=name: means.__setitem__(name, p.grad.mean()), path=name
        )
    model(torch.randn(32, 8)).pow(2).mean().backward()
for name, mean in means.items():
    print(f"{name}: mean gradient {mean.item():.6f}")
