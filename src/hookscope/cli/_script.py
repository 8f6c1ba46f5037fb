"""Run a Python script as `python script.py args` would, inside this process, and say how it ended."""

from __future__ import annotations

import contextlib
import os
import runpy
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

from .._text import strip_terminal_codes

__all__ = ["ScriptEnd", "run_script"]


@dataclass(frozen=True)
class ScriptEnd:
    """How a script ended: `status` is `completed`, `exited` (non-zero `sys.exit`), `raised` or `interrupted`."""

    status: str
    exit_code: int
    error: str | None = None


def run_script(script: Path, args: list[str]) -> ScriptEnd:
    """Run `script` as `__main__` with `sys.argv = [script, *args]` and its folder first on `sys.path`.

    As `python script.py` does (3.9+), the script's `__file__` (and so its tracebacks) is the absolute path, made
    from the working directory at the start, so a script that changes directory still finds the files beside it.
    The working directory is restored when the script ends (in this process, what comes after runs where the
    command was started). The script's exception is printed as Python prints it (from the script's own frames
    on), and its exit code is the one Python would give: 0, its `sys.exit` code, 1 for an exception, 130 for Ctrl-C.
    """
    saved_argv, saved_path, saved_cwd = sys.argv[:], sys.path[:], os.getcwd()
    sys.argv = [str(script), *args]
    sys.path.insert(0, str(script.resolve().parent))
    try:
        runpy.run_path(os.path.abspath(script), run_name="__main__")
        return ScriptEnd("completed", 0)
    except SystemExit as stop:
        return _exit(stop.code)
    except KeyboardInterrupt:
        print("KeyboardInterrupt", file=sys.stderr)
        return ScriptEnd("interrupted", 130, "KeyboardInterrupt")
    except Exception as err:
        _print_script_traceback(err, script)
        return ScriptEnd("raised", 1, strip_terminal_codes(f"{type(err).__name__}: {err}"))
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path
        _return_to(saved_cwd)


def _return_to(folder: str) -> None:
    """Go back to `folder` (the script may have removed it: then stay where the script left us)."""
    with contextlib.suppress(OSError):
        os.chdir(folder)


def _exit(code: object) -> ScriptEnd:
    if code is None or code == 0:
        return ScriptEnd("completed", 0)
    if isinstance(code, int):
        return ScriptEnd("exited", code, f"sys.exit({code})")
    print(code, file=sys.stderr)  # as Python does for sys.exit("message")
    return ScriptEnd("exited", 1, f"sys.exit({code!r})")


def _print_script_traceback(err: BaseException, script: Path) -> None:
    """Print the traceback from the script's first frame on (runpy's and hookscope's frames left out)."""
    tb = err.__traceback__
    target = str(script.resolve())
    while tb is not None and str(Path(tb.tb_frame.f_code.co_filename).resolve()) != target:
        tb = tb.tb_next
    traceback.print_exception(type(err), err, tb or err.__traceback__)
