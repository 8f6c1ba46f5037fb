"""What the package declares is what is tested: Python versions, lower bounds, pins, extras, licence, CI script."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import torch
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from hookscope.cli._errors import EXTRAS

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]


def floor(requirement: str) -> str:
    """Return the version after `>=` in a requirement such as `torch>=2.13` (the declared lower bound)."""
    found = re.search(r">=\s*([\w.]+)", requirement)
    assert found, f"{requirement!r} declares no lower bound"
    return found.group(1)


def dependency(name: str, extra: str | None = None) -> str:
    requirements = PROJECT["optional-dependencies"][extra] if extra else PROJECT["dependencies"]
    return next(r for r in requirements if canonicalize_name(Requirement(r).name) == canonicalize_name(name))


def pins() -> dict[str, str]:
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    return {canonicalize_name(n): v for n, _, v in (line.partition("==") for line in lines if line.strip())}


def make_variable(name: str) -> str:
    found = re.search(rf"^{name} := (.+)$", (ROOT / "Makefile").read_text(), flags=re.M)
    assert found, f"Makefile defines no {name}"
    return found.group(1).strip()


def test_the_lowest_python_declared_is_the_one_tested_typechecked_and_linted() -> None:
    lowest = floor(PROJECT["requires-python"])
    assert lowest == "3.11"  # constraints.txt pins numpy 2.4, pandas 3, scikit-learn 1.9: none installs on 3.10
    assert PYPROJECT["tool"]["mypy"]["python_version"] == lowest
    assert PYPROJECT["tool"]["ruff"]["target-version"] == "py" + lowest.replace(".", "")
    tested = make_variable("PYTHON_VERSIONS").split()
    assert tested[0] == lowest and f"{sys.version_info.major}.{sys.version_info.minor}" in tested


def make(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}  # not the caller's
    return subprocess.run(["make", "-s", "-C", str(ROOT), *args], env=env, capture_output=True, text=True, timeout=60)


def test_make_accepts_a_tested_python_and_refuses_another_in_one_line(tmp_path: Path) -> None:
    venv = f"VENV={tmp_path / 'none'}"  # no .venv there: the interpreter that would create it is checked
    assert make("check-python", venv, f"PYTHON={sys.executable}").returncode == 0
    assert make("check-python", venv).returncode == 0  # picked on its own: python3.11 or python3
    refused = make("check-python", venv, f"PYTHON={sys.executable}", "PYTHON_VERSIONS=3.98 3.99")
    assert refused.returncode != 0
    ours = [line for line in refused.stderr.splitlines() if not line.startswith("make: ***")]
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert ours == [
        f"make: hookscope is tested on CPython 3.98 or 3.99, but {sys.executable} is Python {version}: "
        "choose one with make PYTHON=python3.98"
    ]
    missing = make("check-python", venv, "PYTHON=no-such-python3")
    assert missing.returncode != 0
    assert "make: no interpreter 'no-such-python3'; hookscope is tested on CPython 3.11" in missing.stderr


def test_ci_run_sets_ci_itself_and_builds_the_docs_after_the_tests(tmp_path: Path) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    log = tmp_path / "make.log"
    (fake / "make").write_text(f'#!/bin/sh\necho "CI=${{CI:-unset}} $*" >> {log}\n')
    (fake / "chromium").write_text("#!/bin/sh\n")  # present: .ci/run installs nothing
    for tool in fake.iterdir():
        tool.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "CI"} | {"PATH": f"{fake}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", str(ROOT / ".ci" / "run")], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert log.read_text().splitlines() == ["CI=true test", "CI=true docs"]


def test_declared_lower_bounds_are_the_tested_versions() -> None:
    # No torch older than the CPU wheel this project installs can be had here without a multi-GB CUDA download
    # (pip download torch==2.6.0: 766.7 MB, plus the nvidia-* wheels), so the bound is the tested version.
    torch_version = torch.__version__.split("+")[0]
    assert floor(dependency("torch")) == ".".join(torch_version.split(".")[:2])
    # numpy and safetensors: tests/package/test_base_install.py installs exactly these lines.
    assert floor(dependency("numpy")) == "1.24" and floor(dependency("safetensors")) == "0.4"
    # plot/_base.py calls Axes.get_figure(root=True), new in matplotlib 3.10.
    assert floor(dependency("matplotlib", "plot")) == floor(dependency("matplotlib", "cli")) == "3.10"


def test_the_extras_the_cli_names_install_what_it_imports() -> None:
    providers = metadata.packages_distributions()
    for extra, modules in EXTRAS.items():
        declared = {canonicalize_name(Requirement(r).name) for r in PROJECT["optional-dependencies"][extra]}
        assert {canonicalize_name(dist) for dist in modules.values()} <= declared, extra
        for module, dist in modules.items():  # each distribution provides the module the CLI imports
            top_level = providers.get(module, [])
            assert canonicalize_name(dist) in {canonicalize_name(d) for d in top_level}, (module, dist)


def requirement_closure(name: str, extras: set[str]) -> set[str]:
    """Every distribution `name[extras]` needs, transitively, under this interpreter's markers."""
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [(name, frozenset(extras))]
    while todo:
        dist, wanted = todo.pop()
        if (canonicalize_name(dist), wanted) in seen:
            continue
        seen.add((canonicalize_name(dist), wanted))
        for text in metadata.requires(dist) or []:
            requirement = Requirement(text)
            marker = requirement.marker or Marker("python_version >= '0'")
            if any(marker.evaluate({"extra": extra}) for extra in (wanted or {""})):
                todo.append((requirement.name, frozenset(requirement.extras)))
    return {dist for dist, _ in seen}


def test_the_dev_install_gets_nothing_unpinned() -> None:
    needed = requirement_closure("hookscope", {"dev"}) - {"hookscope"}
    pinned = pins()
    assert sorted(needed - set(pinned)) == []
    for dist in sorted(needed):  # and the environment holds exactly the pins (what CI installs)
        assert metadata.version(dist).split("+")[0] == pinned[dist].split("+")[0], dist


def test_the_licence_is_mit_as_declared() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert PROJECT["license"] == "MIT"
    assert text.startswith("MIT License\n\nCopyright (c) 2026 the hookscope authors\n")
    assert 'THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND' in text


@pytest.mark.parametrize("command", ["make docs", "make test", "make demo"])
def test_the_readme_lists_the_commands(command: str) -> None:
    assert command in (ROOT / "README.md").read_text()
