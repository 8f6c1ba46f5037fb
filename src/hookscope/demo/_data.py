"""The demo's data: scikit-learn's bundled handwritten digits (1 797 8x8 images, no download)."""

from __future__ import annotations

import torch

__all__ = ["DigitsSplit", "load_digits_split"]

DigitsSplit = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def load_digits_split(test_fraction: float = 0.2, seed: int = 0) -> DigitsSplit:
    """Return `(x_train, y_train, x_test, y_test)` from `sklearn.datasets.load_digits`, shuffled with `seed`.

    Shape:
        x: (N, 1, 8, 8) float32 in [0, 1] (pixel values / 16); y: (N,) int64 class labels 0-9.

    Raises:
        ValueError: `test_fraction` is not in (0, 1).
        ImportError: scikit-learn is not installed (`pip install 'hookscope[cli]'`).
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:
        raise ImportError("the demo needs scikit-learn: pip install 'hookscope[cli]'") from err
    digits = load_digits()
    images = torch.as_tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.as_tensor(digits.target, dtype=torch.int64)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    test = round(len(labels) * test_fraction)
    test_idx, train_idx = order[:test], order[test:]
    return images[train_idx], labels[train_idx], images[test_idx], labels[test_idx]
