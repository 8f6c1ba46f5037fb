"""The `hookscope` command (also `python -m hookscope`): demo, summary, run and report.

`main(argv)` parses the arguments (`_parser.py`) and runs one subcommand: `_demo.py` trains the digits demo and
prints it, `_target.py` loads `package.module:factory` or `file.py:factory` for `summary`, `_run.py` runs an
unmodified training script under global module and optimizer hooks and writes its report whatever happens.
User mistakes print one line, `hookscope: error: ...`, on stderr and exit with 2; other failures exit with 1;
`--verbose` adds the traceback. `run` exits with the script's own exit code.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Sequence

from ._errors import UsageError
from ._parser import build_parser

__all__ = ["UsageError", "main"]


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
    except Exception as err:  # every failure ends as one line; --verbose shows where it came from
        if verbose:
            traceback.print_exc()
        message = " ".join(str(err).split()) or type(err).__name__
        hint = "" if verbose else " (--verbose shows the traceback)"
        print(f"hookscope: error: {message}{hint}", file=sys.stderr)
        return 2 if isinstance(err, UsageError) else 1
