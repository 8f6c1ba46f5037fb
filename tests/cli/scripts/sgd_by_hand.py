"""Fit a polynomial with hand-written SGD updates, in the style of pytorch/examples' regression/main.py: no
optimizer, `param.data.add_(-lr * param.grad)`. Prints six digits."""

import torch
import torch.nn.functional as F

torch.manual_seed(0)
W_target, b_target = torch.randn(4, 1) * 5, torch.randn(1) * 5
fc = torch.nn.Linear(4, 1)


def get_batch(batch_size=16):
    x = torch.randn(batch_size).unsqueeze(1)
    features = torch.cat([x**i for i in range(1, 5)], 1)
    return features, features.mm(W_target) + b_target.item()


for batch_idx in range(4):
    batch_x, batch_y = get_batch()
    fc.zero_grad()
    output = F.smooth_l1_loss(fc(batch_x), batch_y)
    loss = output.item()
    output.backward()
    for param in fc.parameters():
        param.data.add_(-0.01 * param.grad)
    print(f"batch {batch_idx}: loss {loss:.6f}")
