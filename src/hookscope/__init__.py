"""hookscope: see and steer what happens inside a PyTorch model while it trains.

The public surface is flat: every name below is re-exported from its subpackage.
"""

from ._errors import CompiledModelWarning, HookscopeWarning, UnobservedModuleWarning
from .hooks import (
    Hook,
    HookHandle,
    HookInfo,
    Hooks,
    hook_output,
    hook_outputs,
    list_hooks,
    named_modules,
    normalize_path,
    register_global_module_hook,
    register_global_optimizer_hook,
    register_module_hook,
    register_optimizer_hook,
    register_output_grad_hook,
    register_post_accumulate_grad_hook,
    register_tensor_hook,
    remove_hooks,
    scope,
    select_modules,
)

__version__ = "0.1.0"

__all__ = [
    "CompiledModelWarning",
    "Hook",
    "HookHandle",
    "HookInfo",
    "Hooks",
    "HookscopeWarning",
    "UnobservedModuleWarning",
    "__version__",
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
