"""Train a small MLP with DistributedDataParallel under hookscope's `watch()`, merge every rank's statistics, and
print and save them on rank 0. CPU and gloo:

    torchrun --nproc-per-node 2 examples/ddp_train.py --out ddp_results.hs

Every rank draws the same batches and trains on its share of each (rank r takes rows r, r + world, ...). The
loss is a sum scaled by world / batch, so DDP's average of the ranks' gradients is the whole batch's gradient:
the merged statistics are those of one process training on whole batches (`python examples/ddp_train.py`).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from hookscope import merge_results, watch
from hookscope.distributed import is_main_process


def make_blobs(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Return `n` points around four centres in 2-D and their labels 0-3."""
    centres = torch.tensor([[2.0, 2.0], [-2.0, 2.0], [-2.0, -2.0], [2.0, -2.0]])
    labels = torch.randint(0, 4, (n,), generator=generator)
    return centres[labels] + torch.randn(n, 2, generator=generator), labels


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--out", default=None, help="save the merged results here (rank 0)")
    args = parser.parse_args(argv)

    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1  # set by torchrun
    if distributed:
        dist.init_process_group("gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))
    trained = DistributedDataParallel(model) if distributed else model
    optimizer = torch.optim.SGD(trained.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    generator = torch.Generator().manual_seed(1)
    with watch(trained, optimizer, hist_range=(-6.0, 6.0)) as w:
        for _ in range(args.steps):
            x, y = make_blobs(args.batch, generator)
            loss = loss_fn(trained(x[rank::world]), y[rank::world]) * world / args.batch
            w.log_loss(loss)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()

    merged = merge_results(w.results())  # every rank takes part; each gets the merged results
    if is_main_process():
        print(f"ranks: {world}")
        print(merged.summary())
        print(f"parameter gradients: {merged.meta['grad_reduction']}; {merged.meta['distributed']['param_grads']}")
        if args.out:
            print(f"saved {merged.save(args.out)}")
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
