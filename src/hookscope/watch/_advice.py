"""Why a selected module was never observed, and what to watch instead."""

from __future__ import annotations

import torch.nn as nn

__all__ = ["unobserved_reason"]


def unobserved_reason(path: str, module: nn.Module | None, parent: nn.Module | None) -> str:
    """Explain why the forward hook of `module` (at `path`, inside `parent`) never fired, with advice."""
    parent_path = path.rpartition(".")[0]
    if isinstance(parent, nn.MultiheadAttention) and path.endswith("out_proj"):
        return (
            "nn.MultiheadAttention never calls its out_proj: it passes out_proj.weight to "
            "F.multi_head_attention_forward, so hooks on out_proj never fire. Observe the attention at its "
            f"output instead: select {parent_path!r}."
        )
    if module is None:
        return "the module no longer exists."
    where = f" (its parent is {parent_path!r})" if parent_path else ""
    return (
        f"its forward never ran during a recorded training step{where}. Either the parent uses its weights "
        "directly (F.linear(x, m.weight)), calls m.forward(...) (which skips hooks), or the module is unused in "
        "training; select the module whose output carries the computation instead."
    )
