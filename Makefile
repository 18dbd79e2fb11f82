# The two commands: `make book` builds the website, `make test` runs every test.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

VENV ?= .venv
BIN := $(abspath $(VENV))/bin
PY := $(BIN)/python
STAMP := $(VENV)/.installed
export PATH := $(BIN):$(PATH)
NOTEBOOKS = $(shell $(PY) tests/toc_notebooks.py)

# The numeric profile: chapters store their outputs (`make execute`) and are checked (`make nbval`)
# under these settings, read by PyTorch, oneDNN and MKL when the kernel starts. On x86-64 the
# vector instructions are capped at AVX2, which every x86-64 CPU of the last decade has, and MKL
# runs in its conditional-numerical-reproducibility mode, so Intel and AMD, AVX2 and AVX-512
# machines compute the same bits. One thread: the order of reductions does not depend on the
# core count (and nbval runs two notebooks at a time on two cores). Elsewhere (e.g. Apple
# silicon) the caps do not apply; the comparison by meaning (tests/nbval_meaning.py) carries it.
NUMERIC_PROFILE := PYTHONHASHSEED=0 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
ifeq ($(shell uname -m),x86_64)
NUMERIC_PROFILE += ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_CBWR=COMPATIBLE
endif
# A stand-in for another machine: PyTorch's portable kernels (no AVX2), MKL's native code path and
# two threads (another order of reductions). `make nbval-runnable` checks the runnable edition under
# it, one notebook at a time, so the stored outputs are checked on two numeric paths. Waiting
# threads sleep instead of spinning (no effect on the numbers; spinning made training ten times
# slower on a busy machine).
OTHER_NUMERIC_PATH := env -u MKL_CBWR -u ONEDNN_MAX_CPU_ISA PYTHONHASHSEED=0 ATEN_CPU_CAPABILITY=default \
	OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE
NBVAL := PYTHONPATH=tests $(PY) -m pytest -q -p no:cacheprovider -p nbval_meaning --nbval \
	--nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-current-env

.PHONY: help venv vendor book test unit nbval build browser serve lab execute execute-all bench clean assignments grade
.PHONY: runnable runnable-filled nbval-runnable lab-source grade-bench lab-venv test-library system-packages
.PHONY: release collect feedback nbgrader formgrader student-env

help:
	@echo "make book   - create .venv, install everything, build the website into _build/html"
	@echo "make test   - create or reuse .venv and run every test (unit, nbval, site build, browser)"
	@echo "make serve  - serve the built website on http://127.0.0.1:$(PORT)/ (PORT=... to change)"
	@echo "make bench  - time the attention code against PyTorch (several minutes; _build/bench/results.json)"
	@echo "make lab    - JupyterLab on your own copy of the runnable edition ($(LAB_DIR)/, never overwritten)"
	@echo "make lab-source - JupyterLab on the source chapters (for authors)"
	@echo "make runnable - regenerate the runnable edition (chapters/runnable/) after changing a chapter"
	@echo "make execute NB=chapters/X.ipynb - re-run one chapter top to bottom and store its outputs"
	@echo "make assignments - nbgrader course in $(COURSE): each chapter's exercise notebook in release/"
	@echo "make grade  - grade new or changed $(COURSE)/submitted/<student>/<chapter>/ (sandboxed), grades.csv"
	@echo "             STUDENT=id or CHAPTER=name for one student or one chapter, FORCE=1 to regrade"
	@echo "make release CHAPTER=name / make collect CHAPTER=name / make feedback CHAPTER=name - nbgrader's"
	@echo "             exchange commands in the course folder; make nbgrader ARGS=\"...\" for any other"
	@echo "make formgrader - JupyterLab in $(COURSE) on 127.0.0.1 with nbgrader's formgrader (hand grading);"
	@echo "             as root it needs ALLOW_ROOT=1 (better: a grader account); LAB_ARGS=\"--port=...\""
	@echo "make student-env PREFIX=/opt/attnbook EXCHANGE=/srv/nbgrader/exchange - the students' nbgrader,"
	@echo "             in a folder every account can use (from STUDENT_PYTHON=$(STUDENT_PYTHON))"
	@echo "make grade-bench - time the grading of 100 simulated students x every chapter, and of 10 hostile"
	@echo "             students; RECORD=1 writes data/grade_bench.json (the instructors' page's table)"

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

# The library's tests run twice: with the other unit tests on this machine's own numeric path, and
# alongside them on the other numeric path (OTHER_NUMERIC_PATH, above), so that a test whose verdict
# rounding alone decides fails here rather than on a reader's machine. Their output: LIBRARY_LOG.
LIBRARY_LOG := _build/library-other-path.log
unit: venv
	@mkdir -p $(dir $(LIBRARY_LOG))
	@echo "make unit: the library's tests run on the other numeric path alongside (their output: $(LIBRARY_LOG))"
	@$(OTHER_NUMERIC_PATH) $(PY) -m pytest -q -p no:cacheprovider tests/library >$(LIBRARY_LOG) 2>&1 & other=$$!; \
	unit=0; $(PY) -m pytest -q -n 2 tests --ignore=tests/browser || unit=$$?; \
	library=0; wait $$other || library=$$?; \
	[ $$library -eq 0 ] || { cat $(LIBRARY_LOG); echo "make unit: the library's tests FAILED on the other numeric path"; }; \
	[ $$unit -eq 0 ] && [ $$library -eq 0 ]

# The library's own tests (tests/library/) in an environment of their own, LIBRARY_VENV: the library
# (`pip install -e .`: torch and numpy) with pytest and hypothesis, at the versions requirements.txt pins.
LIBRARY_VENV ?= .venv-library
LIBRARY_PY := $(abspath $(LIBRARY_VENV))/bin/python
$(LIBRARY_VENV)/.installed: requirements.txt pyproject.toml
	@test -x $(LIBRARY_PY) || python3 -m venv $(LIBRARY_VENV)
	$(LIBRARY_PY) -m pip install --quiet --disable-pip-version-check -c requirements.txt -e . pytest hypothesis
	@touch $@

test-library: $(LIBRARY_VENV)/.installed
	$(LIBRARY_PY) -m pytest -q -p no:cacheprovider tests/library

# nbval re-executes every chapter under the profile, two notebooks at a time (the longest first), and compares each
# output with the stored one by meaning (tests/nbval_meaning.py).
nbval: venv
	$(NUMERIC_PROFILE) $(NBVAL) -n 2 --dist loadfile $(shell $(PY) tests/toc_notebooks.py --longest-first)

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

# Not part of `make test`: a full run takes a few minutes (tests/tools/test_bench.py runs --smoke).
# THP_MEM_ALLOC_ENABLE=1 lets PyTorch back large tensors with 2 MiB pages (fewer page faults).
bench: venv
	THP_MEM_ALLOC_ENABLE=1 $(PY) -m attnbook_tools.bench --threads 2

# The site build (one core, Sphinx) and then the browser tests on it run alongside nbval-runnable
# (one notebook at a time), so that neither core waits; their output goes to BUILD_LOG and is shown
# when all are done. A failure of any fails `make test`, saying which.
BUILD_LOG := _build/build.log
test: system-packages venv
	@mkdir -p _build
	@echo "make test: the student's environment for the JupyterLab test ($(LAB_VENV)) is made alongside the unit tests"
	@$(MAKE) --no-print-directory lab-venv >_build/lab-venv.log 2>&1 & lab=$$!; \
	unit=0; $(MAKE) --no-print-directory unit || unit=$$?; \
	labenv=0; wait $$lab || labenv=$$?; \
	[ $$labenv -eq 0 ] || { cat _build/lab-venv.log; echo "make test: making $(LAB_VENV) FAILED"; }; \
	[ $$unit -eq 0 ] && [ $$labenv -eq 0 ]
	$(MAKE) --no-print-directory nbval
	@mkdir -p $(dir $(BUILD_LOG))
	@echo "make test: the site build and then the browser tests run alongside nbval-runnable (their output: $(BUILD_LOG), shown below)"
	@{ built=0; $(MAKE) --no-print-directory build || built=$$?; \
	   [ $$built -eq 0 ] || { echo "make test: build FAILED (exit $$built)"; exit 1; }; \
	   browsed=0; $(MAKE) --no-print-directory browser || browsed=$$?; \
	   [ $$browsed -eq 0 ] || { echo "make test: browser FAILED (exit $$browsed)"; exit 1; }; \
	 } >$(BUILD_LOG) 2>&1 & site=$$!; \
	runnable=0; $(MAKE) --no-print-directory nbval-runnable || runnable=$$?; \
	site_ok=0; wait $$site || site_ok=$$?; \
	echo "--- make build, then make browser (ran alongside nbval-runnable), from $(BUILD_LOG) ---"; cat $(BUILD_LOG); \
	echo "--- end of make build and make browser ---"; \
	[ $$runnable -eq 0 ] || echo "make test: nbval-runnable FAILED (exit $$runnable, its output is above the site's)"; \
	[ $$site_ok -eq 0 ] || echo "make test: the site's build or browser tests FAILED (exit $$site_ok, just above)"; \
	[ $$runnable -eq 0 ] && [ $$site_ok -eq 0 ]
	@echo "make test: all parts passed"

# The system packages `make test` needs, checked before anything is made: bubblewrap and libseccomp2
# (the grading sandbox and its system call filter), Chromium (the browser tests; CHROMIUM=... for
# another path) and npm (the website's offline MathJax and widgets). One message names whatever is missing and how to install it.
system-packages:
	@missing=""; \
	command -v bwrap >/dev/null 2>&1 || missing="$$missing bubblewrap"; \
	/sbin/ldconfig -p 2>/dev/null | grep -q 'libseccomp\.so\.2 ' || missing="$$missing libseccomp2"; \
	[ -x "$${CHROMIUM:-/usr/bin/chromium}" ] || missing="$$missing chromium"; \
	command -v npm >/dev/null 2>&1 || missing="$$missing npm"; \
	[ -z "$$missing" ] || { echo "make test needs these system packages, missing here:$$missing."; \
		echo "Install them (on Debian, as root) with: apt-get install -y$$missing"; exit 1; }

# The runnable edition (chapters/runnable/, committed): the chapters for JupyterLab, Colab and Binder.
# `make lab` copies it into LAB_DIR, adding only the notebooks missing there, and starts JupyterLab
# on 127.0.0.1 (LAB_ARGS are passed on, e.g. LAB_ARGS="--port=9999 --no-browser").
LAB_DIR ?= chapters/workspace
LAB_ARGS ?=
FILLED ?= _build/runnable-filled
# `make nbval-runnable` runs the filled copies (the edition with its exercises answered from the
# chapters' solutions, stored outputs kept) under nbval on the other numeric path, one notebook at
# a time: the edition runs top to bottom in a fresh kernel of the student's environment (LAB_VENV,
# through its kernelspec `attnbook-lab`), and every stored output is checked a second time, on
# kernels other than the ones that stored it. Its checks run strict (ATTNBOOK_STRICT_CHECKS=1): a
# claim that fails fails the test, where a student's notebook prints a note and runs on.

# A student's environment, apart from .venv: the library, the chapters' tooling, what the chapters
# import besides (pytest, transformers) and JupyterLab (pyproject.toml's `lab` extra, at the versions
# requirements.txt pins), without the instructor's nbgrader, the website's build or the tests.
LAB_VENV ?= .venv-lab
LAB_PY := $(abspath $(LAB_VENV))/bin/python
# A kernelspec of LAB_VENV's Python for the tests, in its own folder (found through JUPYTER_PATH;
# JupyterLab's launcher does not list it).
LAB_KERNEL := attnbook-lab
LAB_KERNELS := $(abspath $(LAB_VENV))/test-kernel
NBVAL_STUDENT := ATTNBOOK_STRICT_CHECKS=1 JUPYTER_PATH=$(LAB_KERNELS)/share/jupyter PYTHONPATH=tests \
	$(PY) -m pytest -q -p no:cacheprovider -p nbval_meaning --nbval --nbval-sanitize-with tests/nbval_sanitize.cfg \
	--nbval-kernel-name $(LAB_KERNEL)
$(LAB_VENV)/.installed: requirements.txt pyproject.toml
	@test -x $(LAB_PY) || python3 -m venv $(LAB_VENV)
	$(LAB_PY) -m pip install --quiet --disable-pip-version-check -c requirements.txt setuptools
	$(LAB_PY) -m pip install --quiet --disable-pip-version-check -c requirements.txt --no-build-isolation -e ".[lab]"
	$(LAB_PY) -m ipykernel install --prefix $(LAB_KERNELS) --name $(LAB_KERNEL) \
		--display-name "Python 3 (the book's student environment)" >/dev/null 2>&1
	@touch $@

lab-venv: $(LAB_VENV)/.installed

lab: $(LAB_VENV)/.installed
	$(LAB_PY) -m bookbuild.runnable lab --dir $(LAB_DIR) -- $(LAB_ARGS)

lab-source: venv
	$(BIN)/jupyter lab --ServerApp.ip=127.0.0.1 chapters

runnable: venv
	$(PY) -m bookbuild.runnable build

runnable-filled: venv
	$(PY) -m bookbuild.runnable fill --out $(FILLED)

# NB=name.ipynb (or several) runs only those filled copies.
nbval-runnable: runnable-filled lab-venv
	$(OTHER_NUMERIC_PATH) $(NBVAL_STUDENT) $(if $(NB),$(addprefix $(FILLED)/,$(notdir $(NB))),$(FILLED)/*.ipynb)

execute: venv
	@test -n "$(NB)" || { echo "usage: make execute NB=chapters/X.ipynb"; exit 2; }
	$(NUMERIC_PROFILE) $(BIN)/jupyter nbconvert --to notebook --execute --inplace \
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
	$(PY) -m attnbook_classroom.course assignments --root $(COURSE) --exchange $(EXCHANGE)

grade: venv
	$(PY) -m attnbook_classroom.course grade --root $(COURSE) $(if $(STUDENT),--student $(STUDENT)) \
		$(if $(CHAPTER),--assignment $(CHAPTER)) $(if $(FORCE),--force)

# nbgrader's own commands, run in the course folder with this environment (nbgrader needs the
# venv's scripts on the PATH) and files readable by the instructor only; `make nbgrader ARGS="..."`
# runs any other (e.g. ARGS="autograde 07_masking --student alice --force"); a command nbgrader does
# not have (formgrader among them: see `make formgrader`) is an error.
release: venv
	@test -n "$(CHAPTER)" || { echo "usage: make release CHAPTER=07_masking"; exit 2; }
	$(PY) -m attnbook_classroom.course nbgrader --root $(COURSE) release_assignment $(CHAPTER)

collect: venv
	@test -n "$(CHAPTER)" || { echo "usage: make collect CHAPTER=07_masking [UPDATE=1]"; exit 2; }
	$(PY) -m attnbook_classroom.course nbgrader --root $(COURSE) collect $(CHAPTER) $(if $(UPDATE),--update)

feedback: venv
	@test -n "$(CHAPTER)" || { echo "usage: make feedback CHAPTER=07_masking"; exit 2; }
	$(PY) -m attnbook_classroom.course nbgrader --root $(COURSE) release_feedback $(CHAPTER)

nbgrader: venv
	$(PY) -m attnbook_classroom.course nbgrader --root $(COURSE) $(ARGS)

# Hand grading: nbgrader's formgrader is a Jupyter server extension, not an nbgrader command. JupyterLab
# in the course folder, on 127.0.0.1, opens on its page (/formgrader). As root, JupyterLab needs
# --allow-root: ALLOW_ROOT=1 passes it (a dedicated grader account is better). LAB_ARGS: JupyterLab's.
formgrader: venv
	$(PY) -m attnbook_classroom.course formgrader --root $(COURSE) -- $(if $(ALLOW_ROOT),--allow-root) $(LAB_ARGS)

# The students' environment on a shared server (python -m attnbook_classroom.course student-env): a
# venv in PREFIX made from STUDENT_PYTHON, a Python every account can run (this .venv's may live in
# a private home), with the book's package installed (not linked to this clone), nbgrader and
# JupyterLab at the pinned versions, the course's id and EXCHANGE in its nbgrader configuration, and
# everything readable by every account. Run again to update it after pulling the book.
STUDENT_PYTHON ?= /usr/bin/python3
student-env: venv
	@test -n "$(PREFIX)" || { echo "usage: make student-env PREFIX=/opt/attnbook [EXCHANGE=/srv/nbgrader/exchange]"; exit 2; }
	$(PY) -m attnbook_classroom.course student-env --prefix $(PREFIX) --python $(STUDENT_PYTHON) \
		--exchange $(abspath $(EXCHANGE))

# Not part of `make test` (tests/classroom/test_grade_bench.py runs its code on a tiny class): an honest class
# of 100 students and a hostile class of 10, each handing in every chapter, graded as `make grade`
# grades. RECORD=1 writes the result to data/grade_bench.json, the table the classroom appendix shows.
grade-bench: venv
	$(PY) -m attnbook_classroom.course.bench --students $(or $(STUDENTS),100) --hostile $(or $(HOSTILE),10) \
		$(if $(RECORD),--record)
