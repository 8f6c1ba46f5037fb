"""Print every child's output shape during a forward (the VerboseExecution pattern)."""

import torch
import torch.nn as nn

import hookscope

model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 10))
with hookscope.scope():
    for path, module in hookscope.select_modules(model, "*"):
        hookscope.hooks.register_module_hook(
            module, "forward", lambda m, args, out, path=path: print(f"{path} ({type(m).__name__}): {tuple(out.shape)}")
        )
    model(torch.randn(2, 1, 8, 8))
