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

.PHONY: help venv vendor book test unit nbval build browser serve lab execute execute-all bench clean assignments grade grade-bench

help:
	@echo "make book   - create .venv, install everything, build the website into _build/html"
	@echo "make test   - create or reuse .venv and run every test (unit, nbval, site build, browser)"
	@echo "make serve  - serve the built website on http://127.0.0.1:$(PORT)/ (PORT=... to change)"
	@echo "make bench  - time the attention code against PyTorch (several minutes; _build/bench/results.json)"
	@echo "make lab    - JupyterLab on the chapters"
	@echo "make execute NB=chapters/X.ipynb - re-run one chapter top to bottom and store its outputs"
	@echo "make assignments - nbgrader course in $(COURSE): each chapter's exercise notebook in release/"
	@echo "make grade  - grade new or changed $(COURSE)/submitted/<student>/<chapter>/ (sandboxed), grades.csv"
	@echo "             STUDENT=id or CHAPTER=name for one student or one chapter, FORCE=1 to regrade"
	@echo "make grade-bench - time the grading of a simulated class (100 students x every chapter)"

$(STAMP): requirements.txt pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	@touch $@

venv: $(STAMP)

# MathJax 3 and the ipywidgets embed manager, pinned in src/site-assets/package-lock.json, are
# copied into _vendor/ so that the website works offline; without npm the book uses their CDNs.
# Under CI=true a failure to vendor them is an error.
vendor: venv
	$(PY) src/site-assets/vendor.py $(if $(filter true,$(CI)),--require)

book: venv vendor
	$(BIN)/jupyter-book build .
	@echo
	@echo "The book is built. Open: file://$(abspath _build/html/index.html) or run: make serve"

unit: venv
	$(PY) -m pytest -q -n 2 tests --ignore=tests/browser

nbval: venv
	$(NB_ENV) PYTHONPATH=tests $(PY) -m pytest -q -n 2 --dist loadfile -p no:cacheprovider -p nbval_glue \
		--nbval --nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-current-env \
		$(NOTEBOOKS)

build: venv vendor
	rm -rf _build/html _build/.doctrees _build/jupyter_execute
	$(BIN)/jupyter-book build --all -W -n --keep-going .

# Every page of the built site in headless Chromium (Debian's /usr/bin/chromium), served on 127.0.0.1.
browser: venv
	$(PY) -m pytest -q -p no:cacheprovider --confcutdir=tests/browser tests/browser

PORT ?= 8000
serve: venv
	@test -f _build/html/index.html || $(MAKE) --no-print-directory book
	@echo "Serving the book at http://127.0.0.1:$(PORT)/ (Ctrl-C to stop)"
	$(PY) -m http.server $(PORT) --bind 127.0.0.1 --directory _build/html

# Not part of `make test`: a full run takes a few minutes (tests/test_bench.py runs --smoke).
# THP_MEM_ALLOC_ENABLE=1 lets PyTorch back large tensors with 2 MiB pages (fewer page faults).
bench: venv
	THP_MEM_ALLOC_ENABLE=1 $(PY) -m attnbook.bench --threads 2

test: venv
	$(MAKE) --no-print-directory unit
	$(MAKE) --no-print-directory nbval
	$(MAKE) --no-print-directory build
	$(MAKE) --no-print-directory browser
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
	rm -rf _build _vendor

# Classroom exercises (nbgrader). nbgrader runs `alembic`, found through the PATH exported above.
# Grading runs each student's code in a bubblewrap sandbox (Debian's `bubblewrap`; .ci/run installs it).
COURSE ?= _build/course
EXCHANGE ?= $(dir $(COURSE))exchange

assignments: venv
	$(PY) -m attnbook.course assignments --root $(COURSE) --exchange $(EXCHANGE)

grade: venv
	$(PY) -m attnbook.course grade --root $(COURSE) $(if $(STUDENT),--student $(STUDENT)) \
		$(if $(CHAPTER),--assignment $(CHAPTER)) $(if $(FORCE),--force)

# Not part of `make test` (about ten minutes): 100 simulated students x every chapter.
grade-bench: venv
	$(PY) -m attnbook.course.bench --students $(or $(STUDENTS),100)
