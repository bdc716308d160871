# moetune: `make demo` runs the main job end to end, `make test` runs the suite, `make docs` builds the site.
# Both start from nothing: they create .venv, install moetune, and build llama.cpp (and, for the
# tests, ik_llama.cpp) when missing, cached in ~/.cache/moetune, outside the repository.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: all venv engine engine-ik demo test test-fast fuzz lint docs cli-reference bench clean

all: test

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

engine: $(STAMP)
	$(BIN)/moetune engine install

engine-ik: $(STAMP)
	$(BIN)/moetune engine install --kind ik_llama.cpp

demo: engine
	$(BIN)/python scripts/demo.py

test: engine engine-ik
	$(BIN)/pytest -q

test-fast: $(STAMP)
	$(BIN)/pytest -q -m "not server and not netns and not slow"

# The fuzzers with ten times the examples `make test` gives them (about 8 minutes on 2 cores).
fuzz: $(STAMP)
	MOETUNE_FUZZ=long $(BIN)/pytest -q -m fuzz tests/fuzz

lint: $(STAMP)
	$(BIN)/ruff check src tests scripts benchmarks
	$(BIN)/ruff format --check src tests scripts benchmarks
	$(BIN)/mypy
	$(BIN)/python scripts/code_metrics.py

# The documentation site (docs/, mkdocs.yml) into site/; --strict: a broken link or anchor, or a page
# left out of the nav, fails it. tests/test_docs.py builds it too, and runs or explains every example.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# docs/reference/cli.md from the click commands (tests/test_docs.py fails when it is not current)
cli-reference: $(STAMP)
	$(BIN)/python scripts/gen_cli_reference.py

bench: engine
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis demo-out site
