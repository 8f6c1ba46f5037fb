"""The argument parser: the subcommands and their flags, exactly as documented."""

from __future__ import annotations

import argparse
import inspect

from .._version import __version__
from ..demo._model import FAULTS
from ..stats._tables import SMALL_BELOW
from ..watch._api import watch

__all__ = ["build_parser"]

DEFAULT_OUT = "hookscope-report"
DEFAULT_CAPACITY: int | None = inspect.signature(watch).parameters["capacity"].default
"""`watch()`'s own default, read from its signature (one home for the number)."""


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive int, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive int, got {text!r}")
    return value


def _natural(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a non-negative int, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative int, got {text!r}")
    return value


def _capacity(text: str) -> int | None:
    if text.strip().lower() == "all":
        return None
    try:
        return _positive(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"must be a positive int or 'all', got {text!r}") from None


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")
    return common


def build_parser() -> argparse.ArgumentParser:
    """Return the `hookscope` parser; each subcommand's `handler(args) -> exit code` is in `args.handler`."""
    from ._commands import run_demo_command, run_report_command, run_run_command, run_summary_command

    common = _common()
    parser = argparse.ArgumentParser(
        prog="hookscope", description="See what happens inside a PyTorch model while it trains.", parents=[common]
    )
    parser.add_argument("--version", action="version", version=f"hookscope {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    faults = "\n".join(f"  {name:<14} {fault.description}" for name, fault in FAULTS.items())
    demo = commands.add_parser(
        "demo",
        parents=[common],
        help="train a small CNN on the bundled digits data with every monitor on, and write the report",
        description="Train a small CNN on scikit-learn's bundled digits (no download) with watch(), "
        "ActivationStats and the weight update monitor on; print the summary, accuracy and diagnosis; write "
        f"the report.\n\nfaults (--fault NAME):\n{faults}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demo.add_argument("--out", default=DEFAULT_OUT, metavar="DIR", help=f"report folder (default: {DEFAULT_OUT})")
    demo.add_argument("--epochs", type=_positive, default=8, metavar="N", help="training epochs (default: 8)")
    demo.add_argument("--fault", choices=list(FAULTS), metavar="NAME", help=f"plant a problem: {', '.join(FAULTS)}")
    demo.set_defaults(handler=run_demo_command)

    summary = commands.add_parser(
        "summary",
        parents=[common],
        help="print the full summary of a model built by a factory",
        description="Print the summary of the model that TARGET builds. TARGET is package.module:factory or "
        "path/to/file.py:factory, a callable returning an nn.Module (or the module itself). Without "
        "--input-shape nothing runs: the table lists the modules and their parameters.",
    )
    summary.add_argument("target", metavar="TARGET", help="package.module:factory or path/to/file.py:factory")
    summary.add_argument(
        "--input-shape", metavar="SHAPE", help="input shape, e.g. 1,3,32,32 (several: 1,10;1,5); none: params only"
    )
    summary.add_argument(
        "--dtype",
        metavar="DTYPE",
        help="dtype of the example inputs, e.g. long or int64 for token ids (several: long;float; default float32)",
    )
    summary.add_argument("--depth", type=_natural, metavar="N", help="show modules down to depth N")
    summary.add_argument(
        "--columns", metavar="NAMES", help="columns after Layer, comma-separated, e.g. output_shape,params,flops"
    )
    summary.add_argument(
        "--trust", action="store_true", help="allow TARGET to be a pickled model or TorchScript file (runs its code)"
    )
    summary.set_defaults(handler=run_summary_command)

    run = commands.add_parser(
        "run",
        parents=[common],
        help="run an unmodified training script with hookscope watching every model it trains",
        description="Run script.py (like python -m cProfile) with hookscope watching each model it trains, "
        "through PyTorch's global module and optimizer hooks: a model is watched when a training-mode forward "
        "with gradients is followed by a backward that reaches it, whether a torch.optim optimizer or "
        "hand-written updates (p.data -= lr * p.grad) change it. The report is written when the script ends, "
        "also when it raises or is interrupted; the exit code is the script's. On a terminal one status line "
        "(steps, last loss, findings so far) updates in place.",
    )
    run.add_argument("--out", default=DEFAULT_OUT, metavar="DIR", help=f"report folder (default: {DEFAULT_OUT})")
    run.add_argument("--every", type=_positive, default=1, metavar="N", help="record one step in N (default: 1)")
    run.add_argument("--select", metavar="GLOB", help="module paths to watch, e.g. 'encoder.**' (default: layers)")
    run.add_argument(
        "--capacity",
        type=_capacity,
        default=DEFAULT_CAPACITY,
        metavar="N",
        help=f"most recorded steps kept; longer runs are thinned (default: {DEFAULT_CAPACITY}; 'all' keeps every step)",
    )
    run.add_argument(
        "--exact",
        action="store_true",
        help=f"describe every value of large outputs (default: statistics of outputs of {SMALL_BELOW} values or "
        "more are estimated from a sample); slower",
    )
    run.add_argument("script", metavar="script.py", help="the training script")
    run.add_argument("script_args", nargs=argparse.REMAINDER, metavar="...", help="its arguments")
    run.set_defaults(handler=run_run_command)

    report = commands.add_parser(
        "report",
        parents=[common],
        help="render the report again from its saved data",
        description="Draw DIR/report.html again from the data saved beside it (results.safetensors, report.json).",
    )
    report.add_argument("dir", metavar="DIR", help="a folder written by demo, run or write_report")
    report.set_defaults(handler=run_report_command)
    return parser
