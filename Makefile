# The two commands: `make book` builds the website, `make test` runs every test.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

VENV ?= .venv
BIN := $(abspath $(VENV))/bin
PY := $(BIN)/python
STAMP := $(VENV)/.installed
export PATH := $(BIN):$(PATH)
# One thread per kernel: notebooks run two at a time under nbval, and outputs are stored with
# the same setting they are checked with.
NB_ENV := OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONHASHSEED=0
NOTEBOOKS = $(shell $(PY) tests/toc_notebooks.py)

.PHONY: help venv book test unit nbval build lab execute execute-all clean

help:
	@echo "make book   - create .venv, install everything, build the website into _build/html"
	@echo "make test   - create or reuse .venv and run every test (unit, nbval, site build)"
	@echo "make lab    - JupyterLab on the chapters"
	@echo "make execute NB=chapters/X.ipynb - re-run one chapter top to bottom and store its outputs"

$(STAMP): requirements.txt pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	@touch $@

venv: $(STAMP)

book: venv
	$(BIN)/jupyter-book build .
	@echo
	@echo "The book is built. Open: file://$(abspath _build/html/index.html)"

unit: venv
	$(PY) -m pytest -q -n 2 tests --ignore=tests/browser

nbval: venv
	$(NB_ENV) PYTHONPATH=tests $(PY) -m pytest -q -n 2 --dist loadfile -p no:cacheprovider -p nbval_glue \
		--nbval --nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-current-env \
		$(NOTEBOOKS)

build: venv
	rm -rf _build/html _build/.doctrees _build/jupyter_execute
	$(BIN)/jupyter-book build --all -W -n --keep-going .

test: venv
	$(MAKE) --no-print-directory unit
	$(MAKE) --no-print-directory nbval
	$(MAKE) --no-print-directory build
	@echo "make test: all parts passed"

lab: venv
	$(BIN)/jupyter lab chapters

execute: venv
	@test -n "$(NB)" || { echo "usage: make execute NB=chapters/X.ipynb"; exit 2; }
	$(NB_ENV) $(BIN)/jupyter nbconvert --to notebook --execute --inplace \
		--ExecutePreprocessor.record_timing=False --ExecutePreprocessor.timeout=900 \
		--ExecutePreprocessor.kernel_name=python3 $(NB)

execute-all: venv
	for nb in $(NOTEBOOKS); do $(MAKE) --no-print-directory execute NB=$$nb; done

clean:
	rm -rf _build
