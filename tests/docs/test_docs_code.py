"""Every python block of the documentation runs, so the guides cannot rot.

The blocks of one page run in order in one namespace, as a reader would paste them into one session, in a
temporary working folder. A block with `>>>` prompts runs as a doctest (its printed output must match); any
other block runs as a script. A block that must not run is preceded by `<!-- docs-test: skip REASON -->`, and
the reason is required.
"""

from __future__ import annotations

import doctest
import re
import textwrap
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SKIP = re.compile(r"<!--\s*docs-test:\s*skip\b\s*(.*?)\s*-->")
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)[^\n]*$")


@dataclass(frozen=True)
class Block:
    """A fenced code block: its page, first line (1-based), language, code and skip reason (`None`: runs)."""

    page: Path
    line: int
    lang: str
    code: str
    skip: str | None


def blocks(page: Path) -> list[Block]:
    """Return the fenced blocks of `page`, dedented (blocks may sit in admonitions, tabs or grids)."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found, index = [], 0
    while index < len(lines):
        start = FENCE.match(lines[index])
        if not start:
            index += 1
            continue
        end = next(j for j in range(index + 1, len(lines)) if lines[j].strip() == "```")
        before = next((lines[j] for j in range(index - 1, -1, -1) if lines[j].strip()), "")
        skip = SKIP.search(before)
        code = textwrap.dedent("\n".join(lines[index + 1 : end]))
        found.append(Block(page, index + 2, start["lang"], code, skip.group(1) if skip else None))
        index = end + 1
    return found


def pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def runnable_pages() -> list[Path]:
    return [page for page in pages() if any(b.lang == "python" and b.skip is None for b in blocks(page))]


def run_block(block: Block, namespace: dict[str, object]) -> None:
    where = f"{block.page.relative_to(ROOT)}:{block.line}"
    if ">>>" not in block.code:
        padded = "\n" * (block.line - 1) + block.code  # tracebacks point at the page's own lines
        exec(compile(padded, str(block.page), "exec"), namespace)
        return
    test = doctest.DocTestParser().get_doctest(block.code, namespace, where, str(block.page), block.line - 1)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report: list[str] = []
    runner.run(test, out=report.append, clear_globs=False)
    namespace.update(test.globs)
    assert runner.failures == 0, "".join(report)


@pytest.mark.parametrize("page", runnable_pages(), ids=lambda p: str(p.relative_to(DOCS)))
def test_every_python_block_of_the_page_runs(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "__docs__"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the guides show some warnings on purpose (attaching after compile)
        for block in blocks(page):
            if block.lang == "python" and block.skip is None:
                run_block(block, namespace)


def test_every_skipped_block_says_why_and_every_block_names_its_language() -> None:
    for page in pages():
        for block in blocks(page):
            where = f"{page.relative_to(ROOT)}:{block.line}"
            assert block.lang, f"{where}: a fenced block must name its language (python, bash, text ...)"
            assert block.skip is None or len(block.skip) >= 10, f"{where}: a skipped block must say why"


def test_every_page_is_in_the_navigation() -> None:
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)  # tags are not resolved

    def listed(entries: object) -> set[str]:
        if isinstance(entries, str):
            return {entries}
        if isinstance(entries, dict):
            return set().union(*(listed(v) for v in entries.values()))
        if isinstance(entries, list):
            return set().union(*(listed(v) for v in entries))
        return set()

    in_nav = listed(config["nav"])
    assert {str(page.relative_to(DOCS)) for page in pages()} == in_nav


@pytest.mark.parametrize(
    "guide",
    [
        "hooks",
        "monitors",
        "weights",
        "summaries",
        "training",
        "doctor",
        "report",
        "distributed",
        "compile",
        "mixed-precision",
        "steering",
    ],
)
def test_each_area_has_a_guide_with_running_code(guide: str) -> None:
    page = DOCS / "guides" / f"{guide}.md"
    assert any(block.lang == "python" and block.skip is None for block in blocks(page)), page


README = ROOT / "README.md"


@pytest.mark.parametrize(
    "block", [b for b in blocks(README) if b.lang == "python" and b.skip is None], ids=lambda b: f"README.md:{b.line}"
)
def test_every_python_block_of_the_readme_runs_on_its_own(
    block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # each block as a reader pastes it into a fresh session
    run_block(block, {"__name__": "__main__"})
