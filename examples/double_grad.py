"""A tensor hook that doubles a gradient (PyTorch's hook tutorial, with hookscope's registry)."""

import torch

import hookscope

x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
with hookscope.hooks.register_tensor_hook(x, lambda grad: grad * 2):
    (x**2).sum().backward()
print("gradient:", x.grad.tolist())  # d(x^2)/dx = 2x, doubled: 4x
