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

# `name as name`: a name of the top level, whose one home is `hookscope` (see its `__init__`); it imports from
# here too, as it always has, and this package's `__all__` does not list it again.
from .._errors import CompiledModelWarning, HookFailureWarning
from ._fastai import Hook as Hook
from ._fastai import Hooks as Hooks
from ._fastai import hook_output as hook_output
from ._fastai import hook_outputs as hook_outputs
from ._grad import register_output_grad_hook
from ._listing import HookInfo
from ._listing import list_hooks as list_hooks
from ._listing import remove_hooks as remove_hooks
from ._module import register_global_module_hook, register_module_hook
from ._optim import register_global_optimizer_hook, register_optimizer_hook
from ._registry import HookHandle
from ._registry import scope as scope
from ._select import named_modules, normalize_path
from ._select import select_modules as select_modules
from ._tensor import register_post_accumulate_grad_hook, register_tensor_hook

__all__ = [
    "CompiledModelWarning",
    "HookFailureWarning",
    "HookHandle",
    "HookInfo",
    "named_modules",
    "normalize_path",
    "register_global_module_hook",
    "register_global_optimizer_hook",
    "register_module_hook",
    "register_optimizer_hook",
    "register_output_grad_hook",
    "register_post_accumulate_grad_hook",
    "register_tensor_hook",
]
