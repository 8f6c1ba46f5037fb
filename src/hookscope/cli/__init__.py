"""The `hookscope` command (also `python -m hookscope`): demo, summary, run and report.

`main(argv)` parses the arguments (`_parser.py`) and runs one subcommand: `_demo.py` trains the digits demo and
prints it, `_target.py` loads `package.module:factory` or `file.py:factory` for `summary`, `_run.py` runs an
unmodified training script under global module and optimizer hooks and writes its report whatever happens.
User mistakes print one line, `hookscope: error: ...`, on stderr and exit with 2; a missing optional extra
prints one line naming it (`pip install 'hookscope[cli]'`) and exits with 3; other failures exit with 1;
`--verbose` adds the traceback. `run` exits with the script's own exit code (3 when the script succeeded but the
page could not be drawn; its data is saved first).
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Sequence

from ._errors import EXIT_MISSING_EXTRA, EXTRAS, MissingExtraError, UsageError, extra_of_module
from ._parser import build_parser

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `hookscope` command with `argv` (default: `sys.argv[1:]`); return the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    verbose = getattr(args, "verbose", False)  # --verbose may stand before or after the subcommand
    try:
        code: int = args.handler(args)
        return code
    except KeyboardInterrupt:
        print("hookscope: interrupted", file=sys.stderr)
        return 130
    except ModuleNotFoundError as err:  # an optional module imported deep inside: name the extra all the same
        return _fail(_as_missing_extra(err, f"hookscope {args.command}"), verbose)
    except Exception as err:
        return _fail(err, verbose)


def _as_missing_extra(err: ModuleNotFoundError, needed_for: str) -> Exception:
    extra = extra_of_module(err.name)
    if extra is None:
        return err
    return MissingExtraError(needed_for, extra, [EXTRAS[extra][str(err.name).partition(".")[0]]])


def _fail(err: Exception, verbose: bool) -> int:
    """Print `err` as one line (`--verbose`: the traceback before it); return the exit code it stands for."""
    if verbose:
        traceback.print_exc()
    message = " ".join(str(err).split()) or type(err).__name__
    if isinstance(err, MissingExtraError):  # the message says everything: no traceback hint
        print(f"hookscope: error: {message}", file=sys.stderr)
        return EXIT_MISSING_EXTRA
    hint = "" if verbose else " (--verbose shows the traceback)"
    print(f"hookscope: error: {message}{hint}", file=sys.stderr)
    return 2 if isinstance(err, UsageError) else 1
