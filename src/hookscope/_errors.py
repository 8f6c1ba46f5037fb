"""Exception and warning classes, and the helpers that make error messages teach."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = [
    "CompiledModelWarning",
    "HookFailureWarning",
    "HookscopeWarning",
    "TorchInternalsWarning",
    "UnobservedModuleWarning",
    "UserHookError",
    "closest_names",
    "unknown_name",
]


class HookscopeWarning(UserWarning):
    """Base class of every warning hookscope emits."""


class CompiledModelWarning(HookscopeWarning):
    """Hooks were attached to a model that torch.compile may already have traced without them, or `watch()` cannot
    measure attention in forwards run compiled (counted in `results.dropped["attention_compiled"]`)."""


class HookFailureWarning(HookscopeWarning):
    """One of hookscope's own observing hooks failed; the training went on and the failure was counted."""


class UserHookError(RuntimeError):
    """A callable the user handed to hookscope (a monitor's `filter_` or `map_` ...) raised; `__cause__` is its error.

    Raised into the user's code even from hooks whose own failures hookscope contains.
    """


class MergeWarning(HookscopeWarning):
    """Statistics merged across ranks were approximated or left out (the merged results' meta says which)."""


class TorchInternalsWarning(HookscopeWarning):
    """A private PyTorch API hookscope relies on changed in this torch release; the warning says what stops working."""


class UnobservedModuleWarning(HookscopeWarning):
    """A selected module never fired during a step (its hooks cannot see what it does): said once, after the third
    recorded step (`hookscope.watch._stepper.UNOBSERVED_AFTER`) or at the end of a shorter run."""


def closest_names(name: str, candidates: Iterable[str], n: int = 5) -> list[str]:
    """Return up to `n` candidates closest to `name`, best first."""
    pool = [c for c in candidates if c]
    close = difflib.get_close_matches(name, pool, n=n, cutoff=0.4)
    if len(close) < n:
        prefix = name.split(".")[0]
        close += [c for c in pool if c.startswith(prefix) and c not in close][: n - len(close)]
    return close


def unknown_name(argument: str, name: str, candidates: Iterable[str], what: str = "module path") -> str:
    """Build the message for an unknown name: the argument, the value, the closest names and the fix."""
    pool = [c for c in candidates if c]
    close = closest_names(name, pool)
    if close:
        hint = f" Closest {what}s: {', '.join(repr(c) for c in close)}."
    elif pool:  # nothing close (a glob on other names, short names): show where the names start
        more = f" (first 5 of {len(pool)})" if len(pool) > 5 else ""
        hint = f" The {what}s are {', '.join(repr(c) for c in pool[:5])}{more}."
    else:
        hint = ""
    return (
        f"{argument} must name an existing {what}, got {name!r}.{hint}"
        f" List them with [path for path, _ in hookscope.hooks.named_modules(model)]."
    )
