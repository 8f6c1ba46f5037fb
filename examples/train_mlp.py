"""Train a small MLP with plain PyTorch: no hookscope inside. `hookscope run examples/train_mlp.py` watches it.

Four Gaussian blobs in 2-D, a 3-layer MLP, SGD with momentum and `nn.CrossEntropyLoss`. `--crash-at STEP`
raises at that step, to see that `hookscope run` still writes the report (and exits with the script's code).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn


def make_blobs(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Return `n` points around four centres and their labels 0-3."""
    centres = torch.tensor([[2.0, 2.0], [-2.0, 2.0], [-2.0, -2.0], [2.0, -2.0]])
    labels = torch.randint(0, 4, (n,), generator=generator)
    return centres[labels] + torch.randn(n, 2, generator=generator), labels


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--crash-at", type=int, default=-1, help="raise a RuntimeError at this step")
    args = parser.parse_args(argv)

    generator = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    x, y = make_blobs(2048, generator)
    model = nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    for step in range(args.steps):
        if step == args.crash_at:
            raise RuntimeError(f"planted crash at step {step}")
        batch = torch.randint(0, len(y), (64,), generator=generator)
        loss = loss_fn(model(x[batch]), y[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        accuracy = (model(x).argmax(dim=1) == y).float().mean().item()
    print(f"trained {args.steps} steps: last loss {loss.item():.4f}, accuracy {accuracy:.1%}")


if __name__ == "__main__":
    main()
