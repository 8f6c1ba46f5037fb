# Two commands do everything on a fresh clone: `make demo` and `make test`.
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# The Python versions the pinned environment (constraints.txt, torch's CPU wheel) is tested on; one place.
PYTHON_VERSIONS := 3.11
# The interpreter that creates .venv: PYTHON if given (`make PYTHON=python3.11`), else the first of
# python3.11, python3 that is one of PYTHON_VERSIONS, else python3 (refused below with a message).
ifeq ($(origin PYTHON),undefined)
PYTHON := $(shell for candidate in $(addprefix python,$(PYTHON_VERSIONS)) python3; do \
	found=$$($$candidate -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) && \
	case " $(PYTHON_VERSIONS) " in (*" $$found "*) echo $$candidate; exit;; esac; done; echo python3)
endif
# An existing .venv is checked instead of PYTHON: it is the interpreter every target runs.
CHECKED := $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))

.PHONY: demo test lint typecheck unit docs bench mutate clean check-python

check-python:
	@command -v $(CHECKED) >/dev/null 2>&1 || { echo "make: no interpreter '$(CHECKED)'; hookscope is tested on CPython $(PYTHON_VERSIONS): choose one with make PYTHON=python$(firstword $(PYTHON_VERSIONS))" >&2; exit 1; }
	@$(CHECKED) -c 'import sys; found = "%d.%d" % sys.version_info[:2]; accepted = "$(PYTHON_VERSIONS)".split(); sys.exit(None if found in accepted else "make: hookscope is tested on CPython " + " or ".join(accepted) + ", but $(CHECKED) is Python " + found + ": choose one with make PYTHON=python" + accepted[0] + (" (and remove $(VENV) first)" if "$(CHECKED)" == "$(BIN)/python" else ""))'

$(STAMP): pyproject.toml constraints.txt | check-python
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/hookscope demo

test: $(STAMP) lint typecheck unit

lint: $(STAMP)
	$(BIN)/ruff check src tests examples bench tools
	$(BIN)/ruff format --check src tests examples bench tools

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 -p no:cacheprovider

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir build/site

bench: $(STAMP)
	$(BIN)/python bench/overhead.py
	$(BIN)/python bench/budget.py
	$(BIN)/python bench/steer.py

# A sampled mutation run (tools/mutate.py), on demand, never part of `make test`; options in MUTATE, for instance
# `make mutate MUTATE='--only stats --only "step rule" --sample 80'`.
mutate: $(STAMP)
	$(BIN)/python tools/mutate.py $(MUTATE)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache hookscope-report build/site
