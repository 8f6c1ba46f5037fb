"""Sampled mutation run: one-token changes of the engine, the step rule and the watch() recorder, each run against
its own folder's tests. On demand (`make mutate`), never part of `make test`.

Every mutant is one small change found on the syntax tree (a comparison flipped, an arithmetic operator swapped, a
number moved by one, `and` for `or`, a `not` or a unary minus dropped, a returned value replaced by `None`, an
index changed) and written into a temporary copy of `src/` and `tests/`: the working tree is never edited. A
mutant is killed when its folder's tests fail or time out. The sample is drawn with a seed from every mutant of
each selected target, so the same tree, seed and size give the same mutants.

A mutant that cannot change any result is marked where it lives, by a comment on its line or in the comment block
just above it, naming the change exactly as this tool prints it, with the reason:

    # equivalent mutant `and -> or`: hists and exponents are only ever set together (_grow)

`(occurrence k)` after the change picks the k-th such change on the line, from the left, where a line has several.
Marked mutants are listed, not run, and left out of the score; so are mutants inside an `if` on a CUDA device
(`device.type == "cuda"`) where CUDA is missing ("needs cuda"). Each mutant's tests run with `-x`; a timeout (3
times the unmutated run, plus 30 s) counts as killed. The exit status is 1 when the targets of issue 30
(`BAR_TARGETS`) kill less than `BAR` of their judged mutants.

Usage:
    python tools/mutate.py                       # 30 mutants of each target, seed 30
    python tools/mutate.py --only stats --only "step rule" --sample 60 --seed 1
    python tools/mutate.py --list                # the sampled mutants, nothing run
    python tools/mutate.py --id stats/_record.py:160:3 --show   # one mutant's diff (and --id ... to run it)
    python tools/mutate.py --id stats/_record.py:160:1 --tests tests/stats/test_engine.py   # a quick check
"""

from __future__ import annotations

import argparse
import ast
import difflib
import io
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tokenize
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

# Target name -> (what is mutated: files or folders of them, the tests its mutants are run against), relative to
# the repository. The one place paths live: a path that moved or vanished (the watch() package is being
# reorganised) is reported and skipped, never fatal.
TARGETS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "stats": (("src/hookscope/stats",), ("tests/stats",)),
    "step rule": (("src/hookscope/callbacks/_steps.py",), ("tests/watch/test_step_rule.py",)),
    "watch recorder": (
        (
            "src/hookscope/watch/_recorder.py",
            "src/hookscope/watch/_step.py",
            "src/hookscope/watch/_stepper.py",
            "src/hookscope/callbacks/_budget.py",
        ),
        ("tests/watch",),
    ),
}
# The targets held to issue 30's bar: this share of their sampled, non-equivalent mutants killed.
BAR_TARGETS = ("stats", "step rule")
BAR = 0.95

ROOT = Path(__file__).resolve().parent.parent
COPIED = ("src", "tests", "pyproject.toml")  # what the temporary copy holds (the tests' rootdir and settings)
PYTEST = ("-x", "-q", "-p", "no:cacheprovider", "--hypothesis-seed=0")
EQUIVALENT = re.compile(r"#\s*equivalent mutant `([^`]+)`(?: \(occurrence (\d+)\))?")

_COMPARE_FLIPS: dict[type[ast.cmpop], tuple[type[ast.cmpop], ...]] = {
    ast.Lt: (ast.LtE, ast.GtE),
    ast.LtE: (ast.Lt, ast.Gt),
    ast.Gt: (ast.GtE, ast.LtE),
    ast.GtE: (ast.Gt, ast.Lt),
    ast.Eq: (ast.NotEq,),
    ast.NotEq: (ast.Eq,),
    ast.Is: (ast.IsNot,),
    ast.IsNot: (ast.Is,),
    ast.In: (ast.NotIn,),
    ast.NotIn: (ast.In,),
}
_ARITHMETIC_SWAPS: dict[type[ast.operator], tuple[type[ast.operator], ...]] = {
    ast.Add: (ast.Sub,),
    ast.Sub: (ast.Add,),
    ast.Mult: (ast.Div,),
    ast.Div: (ast.Mult,),
    ast.FloorDiv: (ast.Div,),
    ast.Mod: (ast.FloorDiv,),
    ast.Pow: (ast.Mult,),
    ast.BitAnd: (ast.BitOr,),
    ast.BitOr: (ast.BitAnd,),
    ast.LShift: (ast.RShift,),
    ast.RShift: (ast.LShift,),
}
_SYMBOLS: dict[type[ast.AST], str] = {
    ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=", ast.Is: "is",
    ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in", ast.Add: "+", ast.Sub: "-", ast.Mult: "*",
    ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**", ast.BitAnd: "&", ast.BitOr: "|",
    ast.LShift: "<<", ast.RShift: ">>", ast.And: "and", ast.Or: "or",
}  # fmt: skip


@dataclass(frozen=True)
class Mutant:
    """One change of one file: node `node` (in `ast.walk` order) of `path` changed by `apply`."""

    path: str  # relative to the repository
    target: str  # the TARGETS key it belongs to
    line: int
    ordinal: int  # its rank among the mutants of its line
    kind: str  # compare, arithmetic, constant, index, boolean, unary, return
    change: str  # as an equivalence comment names it: "* -> /"
    node: int
    apply: Callable[[ast.AST, ast.AST | None], ast.AST | None]  # (node, parent) -> the replacement (None: in place)
    cuda_only: bool  # inside an `if` on a CUDA device: run only where CUDA is available
    text: str  # its line, as the run found it
    occurrence: int  # its rank among the mutants of its line making the same change (from the left)

    @property
    def id(self) -> str:
        return f"{self.path.removeprefix('src/hookscope/')}:{self.line}:{self.ordinal}"


# ---- finding mutants ---------------------------------------------------------------------------------------------
def _skipped(tree: ast.AST) -> set[int]:
    """Ids of nodes never mutated: annotations, `__all__`, `if TYPE_CHECKING:` blocks (strings are never mutated)."""
    roots: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arg | ast.AnnAssign) and node.annotation is not None:
            roots.append(node.annotation)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns is not None:
            roots.append(node.returns)
        elif _is_exports(node) or (isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)):
            roots.append(node)
    return {id(inner) for root in roots for inner in ast.walk(root)}


def _cuda_only(tree: ast.AST) -> set[int]:
    """Ids of the nodes inside the body of an `if` that tests for a CUDA device (`device.type == "cuda"`)."""
    bodies = [n.body for n in ast.walk(tree) if isinstance(n, ast.If) and "cuda" in ast.unparse(n.test)]
    return {id(inner) for body in bodies for statement in body for inner in ast.walk(statement)}


def _is_exports(node: ast.AST) -> bool:
    return isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets)


def _in_index(node: ast.AST, parents: dict[int, ast.AST]) -> bool:
    """Whether `node` is a subscript's index (`x[1]`, `x[-1]`, `x[:, 2]`, `x[1:]`)."""
    parent = parents.get(id(node))
    while isinstance(parent, ast.UnaryOp | ast.Tuple | ast.Slice):
        node, parent = parent, parents.get(id(parent))
    return isinstance(parent, ast.Subscript) and parent.slice is node


def _set(attribute: str, value: Callable[[], object], index: int | None = None) -> Callable[..., None]:
    def apply(node: ast.AST, parent: ast.AST | None) -> None:
        if index is None:
            setattr(node, attribute, value())
        else:
            getattr(node, attribute)[index] = value()

    return apply


def _changes(node: ast.AST, parents: dict[int, ast.AST]) -> Iterator[tuple[str, str, Callable[..., ast.AST | None]]]:
    """(kind, change, apply) of every one-token mutant of `node` itself."""
    if isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            for new in _COMPARE_FLIPS.get(type(op), ()):
                yield "compare", f"{_SYMBOLS[type(op)]} -> {_SYMBOLS[new]}", _set("ops", new, i)
    elif isinstance(node, ast.BinOp | ast.AugAssign):
        suffix = "=" if isinstance(node, ast.AugAssign) else ""
        for new in _ARITHMETIC_SWAPS.get(type(node.op), ()):
            yield "arithmetic", f"{_SYMBOLS[type(node.op)]}{suffix} -> {_SYMBOLS[new]}{suffix}", _set("op", new)
    elif isinstance(node, ast.BoolOp):
        new_op = ast.Or if isinstance(node.op, ast.And) else ast.And
        yield "boolean", f"{_SYMBOLS[type(node.op)]} -> {_SYMBOLS[new_op]}", _set("op", new_op)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not | ast.USub):
        kind = "index" if _in_index(node, parents) else "unary"
        change = "not x -> x" if isinstance(node.op, ast.Not) else "-x -> x"
        yield kind, change, lambda node, parent: node.operand
    elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
        yield "constant", f"{node.value!r} -> {not node.value!r}", _set("value", lambda: not node.value)
    elif isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        kind = "index" if _in_index(node, parents) else "constant"
        for step in (1, -1):
            new = node.value + step
            if new != node.value:
                yield kind, f"{node.value!r} -> {new!r}", _set("value", lambda new=new: new)
    elif isinstance(node, ast.Return) and node.value is not None and not _is_none(node.value):
        yield "return", "return x -> return None", _set("value", lambda: ast.Constant(None))


def _is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _replace(parent: ast.AST, old: ast.AST, new: ast.AST) -> None:
    """Put `new` where `old` sits among `parent`'s fields."""
    for name, value in ast.iter_fields(parent):
        if value is old:
            setattr(parent, name, new)
            return
        if isinstance(value, list) and any(item is old for item in value):
            value[[item is old for item in value].index(True)] = new
            return
    raise LookupError(f"{ast.dump(old)} is not a child of {ast.dump(parent)}")


def _walk(tree: ast.AST) -> tuple[list[ast.AST], dict[int, ast.AST]]:
    nodes = list(ast.walk(tree))
    parents = {id(child): node for node in nodes for child in ast.iter_child_nodes(node)}
    return nodes, parents


def file_mutants(path: str, target: str, source: str) -> list[Mutant]:
    """Every mutant of one file, in a fixed order."""
    tree = ast.parse(source)
    skipped, cuda = _skipped(tree), _cuda_only(tree)
    nodes, parents = _walk(tree)
    found: list[tuple[int, int, str, str, int, Callable[..., ast.AST | None], bool]] = []
    for index, node in enumerate(nodes):
        if id(node) in skipped or not hasattr(node, "lineno"):
            continue
        for kind, change, apply in _changes(node, parents):
            found.append((node.lineno, node.col_offset, kind, change, index, apply, id(node) in cuda))
    found.sort(key=lambda item: (item[0], item[1], item[4]))
    mutants, per_line, lines = [], dict[tuple[int, str], int](), source.splitlines()
    for line, _, kind, change, index, apply, cuda_only in found:
        per_line[line, ""] = per_line.get((line, ""), 0) + 1
        per_line[line, change] = occurrence = per_line.get((line, change), 0) + 1
        text = lines[line - 1].strip()
        mutants.append(
            Mutant(path, target, line, per_line[line, ""], kind, change, index, apply, cuda_only, text, occurrence)
        )
    return mutants


def mutated_source(mutant: Mutant, source: str) -> str:
    """`source` with `mutant` applied, as `ast.unparse` writes it (comments dropped, meaning kept)."""
    tree = ast.parse(source)
    nodes, parents = _walk(tree)
    node = nodes[mutant.node]
    replacement = mutant.apply(node, parents.get(id(node)))
    if replacement is not None:
        _replace(parents[id(node)], node, replacement)
    return ast.unparse(ast.fix_missing_locations(tree))


def equivalent_marks(source: str) -> dict[int, set[str]]:
    """Line -> the changes marked equivalent there (by a comment on the line, or in the comment block above):
    `change`, or `change#k` where the mark names its occurrence on the line (`(occurrence k)` after it)."""
    marks: dict[int, set[str]] = {}
    pending: set[str] = set()
    code_lines: set[int] = set()
    comments: list[tuple[int, str]] = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments.append((token.start[0], token.string))
        elif token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
            code_lines.update(range(token.start[0], token.end[0] + 1))
    by_line = dict(comments)
    for line in range(1, source.count("\n") + 2):
        named = {f"{c}#{k}" if k else c for c, k in EQUIVALENT.findall(by_line.get(line, ""))}
        if line in code_lines:
            marks[line] = pending | named
            pending = set()
        elif line in by_line:
            pending |= named
        else:
            pending = set()  # a blank line ends a comment block
    return {line: changes for line, changes in marks.items() if changes}


def _files(paths: tuple[str, ...]) -> list[str]:
    found = [sorted(p.rglob("*.py")) if p.is_dir() else [p] for p in (ROOT / path for path in paths) if p.exists()]
    return [str(f.relative_to(ROOT)) for files in found for f in files]


def all_mutants(targets: list[str]) -> tuple[dict[str, list[Mutant]], list[str]]:
    """Every mutant of each of `targets`, and a line for each path of theirs that is missing (a target whose tests
    are missing is skipped whole)."""
    mutants: dict[str, list[Mutant]] = {}
    missing = []
    for target in targets:
        paths, tests = TARGETS[target]
        missing += [f"{p} (target {target!r}): not found, skipped" for p in (*paths, *tests) if not (ROOT / p).exists()]
        if all((ROOT / p).exists() for p in tests):
            mutants[target] = [m for p in _files(paths) for m in file_mutants(p, target, (ROOT / p).read_text())]
    return mutants, missing


def sample(mutants: dict[str, list[Mutant]], size: int, seed: int) -> list[Mutant]:
    """`size` mutants of each target (all of them where it has fewer, or when `size` is 0), drawn with `seed`."""
    chosen = []
    for target, found in mutants.items():
        rng = random.Random(f"{seed}:{target}")
        chosen += found if not size or size >= len(found) else rng.sample(found, size)
    return sorted(chosen, key=lambda m: (list(mutants).index(m.target), m.path, m.line, m.ordinal))


# ---- running -----------------------------------------------------------------------------------------------------
def _pytest(copy: Path, tests: tuple[str, ...], timeout: float) -> tuple[str, float]:
    """Run `tests` in the copy: ("passed" | "failed" | "timeout" | "no tests", seconds)."""
    env = dict(os.environ, PYTHONPATH=str(copy / "src"), PYTHONDONTWRITEBYTECODE="1")
    shutil.rmtree(copy / ".hypothesis", ignore_errors=True)  # no example remembered from another mutant
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "pytest", *PYTEST, *tests],
        cwd=copy,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(process)
        return "timeout", time.monotonic() - started
    except BaseException:  # interrupted: leave no pytest behind
        _stop(process)
        raise
    outcome = {0: "passed", 5: "no tests"}.get(code, "failed")
    return outcome, time.monotonic() - started


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Kill `process`'s whole session (pytest and what it started) and reap it."""
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _make_copy() -> Path:
    copy = Path(tempfile.mkdtemp(prefix="hookscope-mutate-"))
    ignore = shutil.ignore_patterns("__pycache__", ".hypothesis", "*.pyc")
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, copy / name, ignore=ignore)
        else:
            shutil.copy2(source, copy / name)
    found = subprocess.run(
        [sys.executable, "-c", "import hookscope; print(hookscope.__file__)"],
        env=dict(os.environ, PYTHONPATH=str(copy / "src")),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not Path(found).is_relative_to(copy):
        raise SystemExit(f"mutate: the copy's hookscope is shadowed by {found}; the mutants would not be tested")
    return copy


def run(
    mutants: list[Mutant], marks: dict[str, dict[int, set[str]]], timeout: float | None, tests: tuple[str, ...] = ()
) -> dict[str, str]:
    """Run each mutant against its target's tests (or `tests`) in a temporary copy; return id -> outcome."""
    copy = _make_copy()
    outcomes: dict[str, str] = {}
    has_cuda = any(m.cuda_only for m in mutants) and _has_cuda()
    try:
        limits: dict[tuple[str, ...], float] = {}
        for group in sorted({tests or TARGETS[m.target][1] for m in mutants}):
            outcome, seconds = _pytest(copy, group, timeout or 1800.0)
            print(f"baseline  {' '.join(group)}: {outcome} in {seconds:.1f} s", flush=True)
            if outcome != "passed":
                raise SystemExit(f"mutate: the unmutated tests {group} do not pass ({outcome}); nothing to measure")
            limits[group] = timeout or 3 * seconds + 30
        for mutant in mutants:
            if _is_marked(mutant, marks[mutant.path]):
                outcomes[mutant.id] = "equivalent"
            elif mutant.cuda_only and not has_cuda:
                outcomes[mutant.id] = "needs cuda"
            else:
                original = (copy / mutant.path).read_text()  # as the run began, whatever happens to the tree since
                (copy / mutant.path).write_text(mutated_source(mutant, original))
                try:
                    group = tests or TARGETS[mutant.target][1]
                    outcome, seconds = _pytest(copy, group, limits[group])
                finally:
                    (copy / mutant.path).write_text(original)
                outcomes[mutant.id] = {"passed": "survived", "no tests": "error"}.get(outcome, f"killed ({outcome})")
            print(f"{outcomes[mutant.id]:<18} {_describe(mutant)}", flush=True)
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    return outcomes


def _is_marked(mutant: Mutant, marks: dict[int, set[str]]) -> bool:
    marked = marks.get(mutant.line, set())
    return mutant.change in marked or f"{mutant.change}#{mutant.occurrence}" in marked


def _has_cuda() -> bool:
    command = [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip() == "True"


def _describe(mutant: Mutant) -> str:
    return f"{mutant.id:<34} {mutant.kind:<10} `{mutant.change}`  | {mutant.text[:90]}"


def report(mutants: list[Mutant], outcomes: dict[str, str]) -> bool:
    """Print the scores and survivors; return whether the bar targets reach the bar."""
    print("\nscore (killed / sampled non-equivalent; equivalent mutants are marked in the source):")
    reached = True
    groups = [(target, [m for m in mutants if m.target == target]) for target in TARGETS]
    bar = [m for m in mutants if m.target in BAR_TARGETS]
    for name, members in [*groups, ("stats/ + step rule (issue 30's bar)", bar), ("all", mutants)]:
        judged = [m for m in members if outcomes.get(m.id) not in (None, "equivalent", "needs cuda", "error")]
        if not members:
            continue
        killed = sum(outcomes[m.id].startswith("killed") for m in judged)
        equivalent = sum(outcomes.get(m.id) == "equivalent" for m in members)
        cuda = sum(outcomes.get(m.id) == "needs cuda" for m in members)
        share = killed / len(judged) if judged else 1.0
        print(
            f"  {name:<36} {killed:>3} / {len(judged):<3} = {share:6.1%}  ({equivalent} equivalent, {cuda} need CUDA)"
        )
        if members is bar:
            reached = share >= BAR
    survivors = [m for m in mutants if outcomes.get(m.id) in ("survived", "error", "needs cuda")]
    print(f"\nsurvivors and mutants not run ({len(survivors)}):" if survivors else "\nno survivors")
    for mutant in survivors:
        print(f"  {outcomes[mutant.id]:<9} {_describe(mutant)}")
    return reached


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sample", type=int, default=30, help="mutants drawn per target (default 30; 0: all)")
    parser.add_argument("--seed", type=int, default=30, help="the sampling seed (default 30)")
    parser.add_argument(
        "--only", action="append", default=[], help="this target only (repeatable): " + ", ".join(TARGETS)
    )
    parser.add_argument("--id", action="append", default=[], help="these mutants only (ids as printed; repeatable)")
    parser.add_argument("--tests", nargs="+", default=[], help="run against these tests instead (a quick check)")
    parser.add_argument("--timeout", type=float, help="seconds per mutant (default: 3 x the unmutated run + 30)")
    parser.add_argument("--list", action="store_true", help="print the sampled mutants, run nothing")
    parser.add_argument("--show", action="store_true", help="print each selected mutant's diff, run nothing")
    options = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `kill`: clean up the copy and the running tests
    unknown = sorted(set(options.only) - set(TARGETS))
    if unknown:
        raise SystemExit(f"mutate: no target {', '.join(map(repr, unknown))}; the targets are {', '.join(TARGETS)}")
    by_target, missing = all_mutants([t for t in TARGETS if not options.only or t in options.only])
    mutants = [m for found in by_target.values() for m in found]
    for line in missing:
        print(f"missing: {line}")
    if options.id:
        chosen = [m for m in mutants if m.id in options.id]
        unknown = sorted(set(options.id) - {m.id for m in chosen})
        if unknown:
            raise SystemExit(f"mutate: no mutant {', '.join(unknown)}; --list prints the ids")
    else:
        chosen = sample(by_target, options.sample, options.seed)
    print(f"{len(chosen)} of {len(mutants)} mutants (seed {options.seed}), targets: {', '.join(by_target)}")
    marks = {path: equivalent_marks((ROOT / path).read_text()) for path in {m.path for m in chosen}}
    if options.list or options.show:
        for mutant in chosen:
            print(_describe(mutant))
            if options.show:
                original = ast.unparse(ast.parse((ROOT / mutant.path).read_text()))
                diff = difflib.unified_diff(
                    original.splitlines(), mutated_source(mutant, original).splitlines(), lineterm="", n=1
                )
                print("\n".join(list(diff)[2:]))
        return 0
    outcomes = run(chosen, marks, options.timeout, tuple(options.tests))
    return 0 if report(chosen, outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
