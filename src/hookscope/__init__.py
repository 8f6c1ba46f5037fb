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
from .summary import (
    ModelSummary,
    dummy_eval,
    has_params,
    layer_info,
    model_sizes,
    module_summary,
    num_features_model,
    summary,
    total_params,
)

__version__ = "0.1.0"

__all__ = [
    "CompiledModelWarning",
    "Hook",
    "HookHandle",
    "HookInfo",
    "Hooks",
    "HookscopeWarning",
    "ModelSummary",
    "UnobservedModuleWarning",
    "__version__",
    "dummy_eval",
    "has_params",
    "hook_output",
    "hook_outputs",
    "layer_info",
    "list_hooks",
    "model_sizes",
    "module_summary",
    "named_modules",
    "normalize_path",
    "num_features_model",
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
    "summary",
    "total_params",
]
