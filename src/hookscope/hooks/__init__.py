"""Hook primitives: handles, one registry, scopes, module selection, and the fastai vocabulary.

Every hook hookscope places goes through `REGISTRY` (`_registry.py`) and comes back as a `HookHandle` with an
idempotent `remove()`; `scope()` removes exactly what was registered inside it. `_select.py` is the one selector
language for "which modules" and normalizes paths across DDP/compile/FSDP wrappers. `_module.py`, `_tensor.py`
and `_optim.py` register module, tensor/parameter and optimizer hooks; `_grad.py` observes gradients of module
outputs with tensor hooks (robust to in-place ops and nested outputs); `_fastai.py` builds `Hook`, `Hooks`,
`hook_output(s)` on top; `_listing.py` lists and removes hooks. `_calls.py` wraps every hook registered
(failures of hookscope's own hooks are contained: `HookErrors`, strict); `_copies.py` makes saved, pickled and
deep-copied modules leave hookscope's hooks behind. Everything above this package (monitors, weights, summaries,
callbacks) registers hooks only through these functions.
"""

from .._errors import CompiledModelWarning, HookFailureWarning
from ._fastai import Hook, Hooks, hook_output, hook_outputs
from ._grad import register_output_grad_hook
from ._listing import HookInfo, list_hooks, remove_hooks
from ._module import register_global_module_hook, register_module_hook
from ._optim import register_global_optimizer_hook, register_optimizer_hook
from ._registry import HookHandle, scope
from ._select import named_modules, normalize_path, select_modules
from ._tensor import register_post_accumulate_grad_hook, register_tensor_hook

__all__ = [
    "CompiledModelWarning",
    "Hook",
    "HookFailureWarning",
    "HookHandle",
    "HookInfo",
    "Hooks",
    "hook_output",
    "hook_outputs",
    "list_hooks",
    "named_modules",
    "normalize_path",
    "register_global_module_hook",
    "register_global_optimizer_hook",
    "register_module_hook",
    "register_optimizer_hook",
    "register_output_grad_hook",
    "register_post_accumulate_grad_hook",
    "register_tensor_hook",
    "remove_hooks",
    "scope",
    "select_modules",
]
