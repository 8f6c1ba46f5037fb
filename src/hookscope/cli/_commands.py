"""The subcommands: what each one does with its parsed arguments; each returns the exit code."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from ._errors import EXIT_MISSING_EXTRA, MissingExtraError, UsageError, is_installed, require_extra

__all__ = ["run_demo_command", "run_report_command", "run_run_command", "run_summary_command"]


def _console(stderr: bool = False) -> Any:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


def run_demo_command(args: argparse.Namespace) -> int:
    """`hookscope demo`: train, print the summary, accuracy and diagnosis, write the report."""
    _check_out(args.out)
    require_extra("cli", "hookscope demo")  # before training, not after it
    from ._demo import run_demo

    return run_demo(Path(args.out), args.epochs, args.fault, _console())


def run_summary_command(args: argparse.Namespace) -> int:
    """`hookscope summary TARGET [--input-shape ...] [--dtype ...]`: print the model's full summary."""
    from ..summary._api import summary
    from ._target import load_target, parse_columns, parse_dtypes, parse_shapes

    shapes = parse_shapes(args.input_shape) if args.input_shape is not None else None
    dtypes = parse_dtypes(args.dtype, len(shapes) if shapes is not None else 0)
    columns = parse_columns(args.columns) if args.columns is not None else None
    model = load_target(args.target, trust=args.trust)
    input_size = None if shapes is None else shapes[0] if len(shapes) == 1 else shapes
    result = summary(model, input_size=input_size, dtypes=dtypes, depth=args.depth, columns=columns)
    console = _console() if is_installed("rich") else None  # plain text in a base install
    if console is not None and console.is_terminal:
        console.print(result)
    else:
        print(result.to_text(shape_width=None))
    return 0


def run_report_command(args: argparse.Namespace) -> int:
    """`hookscope report DIR`: draw the page again from the saved data.

    DIR is a report folder, or the folder `hookscope run` wrote for several models (one report folder each and
    an index page): every page and the index are drawn again.
    """
    from ..report import render_report
    from ..report._write import write_index

    folder = Path(args.dir)
    if not folder.is_dir():
        raise UsageError(f"DIR must be a report folder, got {args.dir!r} (no such folder)")
    models = _model_folders(folder)
    try:
        if models:
            pages = [(name, render_report(sub).relative_to(folder)) for name, sub, _ in models]
            page = write_index(folder, pages, models[0][2])
        else:
            page = render_report(folder)
    except FileNotFoundError as err:
        raise UsageError(str(err)) from err
    print(f"report written to {page}")
    return 0


def _model_folders(folder: Path) -> list[tuple[str, Path, dict[str, Any]]]:
    """The per-model report folders of a `hookscope run` folder, in their order, with each model's name and
    metadata (empty when `folder` is itself a report folder)."""
    from ..report._data import DOCUMENT_FILE, RESULTS_FILE

    if (folder / RESULTS_FILE).is_file():
        return []
    found = []
    for sub in sorted((p.parent for p in folder.glob(f"*/{RESULTS_FILE}")), key=_folder_order):
        try:
            meta = json.loads((sub / DOCUMENT_FILE).read_text(encoding="utf-8")).get("meta") or {}
        except (OSError, ValueError, AttributeError):
            meta = {}
        meta = meta if isinstance(meta, dict) else {}
        found.append((str(meta.get("model") or sub.name), sub, meta))
    return found


def _folder_order(sub: Path) -> tuple[int, str]:
    number, _, rest = sub.name.partition("-")
    return (int(number), rest) if number.isdigit() else (1 << 30, sub.name)


def run_run_command(args: argparse.Namespace) -> int:
    """`hookscope run script.py ...`: run the script watched, write the report however it ends."""
    from ._progress import StatusLine, is_terminal
    from ._report import shown_path, write_run_reports
    from ._script import run_script
    from ._session import RunSession

    script = Path(args.script)
    if not script.is_file():
        raise UsageError(f"script.py must be an existing file, got {args.script!r}")
    _check_out(args.out)
    out = Path(args.out).absolute()  # now: the script may change the working directory
    status = StatusLine(sys.stderr) if is_terminal(sys.stdout, sys.stderr) else None
    progress = status.update if status is not None else None
    session = RunSession(
        every=args.every, select=args.select, capacity=args.capacity, exact=args.exact, progress=progress
    )
    started = time.time()
    session.install()
    if status is not None:
        status.start()
    try:
        end = run_script(script, list(args.script_args))
    finally:
        if status is not None:
            status.stop()
        session.remove()
    if end.status != "completed":
        print(
            f"hookscope: the script {end.status} ({end.error}); writing the report of what was recorded",
            file=sys.stderr,
        )
    command = shlex.join(["hookscope", "run", str(script), *args.script_args])
    meta = {"script": str(script), "command": command, "status": end.status, "exit_code": end.exit_code}
    if end.error:
        meta["error"] = end.error
    meta["seconds"] = round(time.time() - started, 2)
    try:
        page = write_run_reports(out, session, meta)
    except MissingExtraError as err:  # the data is saved; the script's own failure outranks the missing page
        print(f"hookscope: error: {err}", file=sys.stderr)
        return end.exit_code or EXIT_MISSING_EXTRA
    print(f"hookscope: report written to {shown_path(page)}", file=sys.stderr)
    return end.exit_code


def _check_out(out: str) -> None:
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise UsageError(f"--out must be a folder, got the file {out!r}")
