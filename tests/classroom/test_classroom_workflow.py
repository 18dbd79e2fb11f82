"""The instructors' page's workflow as written: `make nbgrader ARGS=formgrader` fails and points to
`make formgrader`, which serves nbgrader's formgrader for the course on 127.0.0.1; `make
student-env` makes an environment that another account can run while the maker's home is private.

The students' environment is tried here on a tiny package standing in for the book's (a script named
``nbgrader``), so that the test makes no second copy of torch: it checks where the environment's
Python comes from, the modes, the configuration and the run as another account. The real one (the
book's package, nbgrader and JupyterLab at the pinned versions, a few minutes and 1.7 GB) is made
and run as another account when ATTNBOOK_STUDENT_ENV_FULL=1.
"""

from __future__ import annotations

import json
import os
import pathlib
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
import urllib.request

import pytest

from attnbook_classroom.course import build_assignments
from attnbook_classroom.course.assign import prepare_exchange
from attnbook_classroom.course.folder import run_nbgrader
from attnbook_classroom.course.student_env import DEFAULT_PYTHON, make_student_env, private_part
from browser.jupyter_serving import free_port, serving
from test_nbgrader import NAME, tiny_notebook

ROOT = pathlib.Path(__file__).resolve().parents[2]
MAKE = ["make", "--no-print-directory", "-C", str(ROOT), "-o", ".venv/.installed"]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
IS_ROOT = os.geteuid() == 0


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    base = tmp_path_factory.mktemp("workflow")
    src = base / f"{NAME}.ipynb"
    src.write_text(json.dumps(tiny_notebook()))
    build_assignments(base / "course", [src], base / "exchange")
    return base / "course"


def _make(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*MAKE, *args], capture_output=True, text=True, env=ENV, timeout=timeout)


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_nbgrader_formgrader_fails_and_names_make_formgrader(course):
    result = _make("nbgrader", f"COURSE={course}", "ARGS=formgrader")
    assert result.returncode != 0
    assert "make formgrader" in result.stderr, result.stderr
    with pytest.raises(SystemExit, match="nbgrader has no command 'frobnicate'"):  # nbgrader: exit 0
        run_nbgrader(course, ["frobnicate", "07_masking"])


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_formgrader_serves_the_course(course, tmp_path):
    port, token = free_port(), secrets.token_hex(16)
    lab_args = f"LAB_ARGS=--port={port} --no-browser --IdentityProvider.token={token}"
    if IS_ROOT:  # as root it refuses, naming the two ways out
        refused = _make("formgrader", f"COURSE={course}", lab_args)
        assert refused.returncode != 0 and "ALLOW_ROOT=1" in refused.stderr, refused.stderr
        assert "grader account" in refused.stderr
    env = dict(ENV, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), JUPYTER_DATA_DIR=str(tmp_path / "data"))
    command = [*MAKE, "formgrader", f"COURSE={course}", lab_args, *(["ALLOW_ROOT=1"] if IS_ROOT else [])]
    with serving(command, port=port, token=token, log=tmp_path / "server.log", what="make formgrader", timeout=90,
                 env=env) as base:
        with urllib.request.urlopen(f"{base}/formgrader/manage_assignments?token={token}", timeout=20) as response:
            assert response.status == 200
            assert "Manage Assignments" in response.read().decode()
        # the course's own gradebook: its assignment is listed
        with urllib.request.urlopen(f"{base}/formgrader/api/assignments?token={token}", timeout=20) as response:
            assert response.status == 200
            assert NAME in [a["name"] for a in json.loads(response.read())]
    assert "127.0.0.1" in (tmp_path / "server.log").read_text()


def test_private_part_names_the_folder_others_cannot_enter():
    base = pathlib.Path(tempfile.mkdtemp(prefix="attnbook-private-"))  # pytest's tmp_path is private itself
    try:
        base.chmod(0o755)
        (base / "home").mkdir(mode=0o700)
        (base / "home" / "python").write_text("")
        (base / "python").write_text("")
        (base / "python").chmod(0o640)
        why = private_part(base / "home" / "python")
        assert why == f"{base / 'home'} (mode 0700) cannot be entered by other accounts"
        assert private_part(base / "python") == f"{base / 'python'} (mode 0640) cannot be read by other accounts"
        (base / "python").chmod(0o644)
        assert private_part(base / "python") is None
    finally:
        shutil.rmtree(base)


def test_student_env_refuses_a_python_of_a_venv():
    with pytest.raises(SystemExit, match="virtual environment's Python"):
        make_student_env(pathlib.Path(tempfile.gettempdir()) / "attnbook-never-made", sys.executable)


def _account():
    """A throwaway Unix account (removed by the caller) and a folder every account can enter."""
    login = f"abkw{os.getpid() % 100000:05d}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", login], check=True)
    return login


def _as(login: str, *command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", login, "--", "env", "-i", "HOME=/tmp", "PATH=/usr/bin:/bin", *command],
                          capture_output=True, text=True, timeout=300)


needs_accounts = pytest.mark.skipif(
    not IS_ROOT or shutil.which("useradd") is None or shutil.which("runuser") is None
    or not os.path.exists(DEFAULT_PYTHON) or private_part(DEFAULT_PYTHON) is not None,
    reason=f"needs root (to make an account), useradd, runuser and {DEFAULT_PYTHON}")


@needs_accounts
def test_student_env_runs_as_another_account(capsys):
    """A tiny package stands in for the book's; the environment's maker is root, whose home is
    private here when it is mode 0700."""
    base = pathlib.Path(tempfile.mkdtemp(prefix="attnbook-student-env-"))
    base.chmod(0o755)
    stub = base / "stub"
    (stub / "stubnb").mkdir(parents=True)
    (stub / "stubnb" / "__init__.py").write_text("def main():\n    print('0.9.6-stand-in')\n")
    (stub / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "stubnb"\nversion = "0"\n[project.scripts]\nnbgrader = "stubnb:main"\n')
    prefix, exchange = base / "opt" / "attnbook", base / "exchange"
    login = _account()
    old = os.umask(0o077)  # an instructor's private umask: the environment is opened all the same
    try:
        nbgrader = make_student_env(prefix, DEFAULT_PYTHON, exchange,
                                    packages=["--no-build-isolation", str(stub)])
        assert "checked as the account nobody" in capsys.readouterr().out
        assert pathlib.Path(os.path.realpath(prefix / "bin" / "python")).is_relative_to("/usr")
        assert private_part(nbgrader) is None and private_part(prefix / "lib") is None
        run = _as(login, str(nbgrader))
        assert run.returncode == 0 and run.stdout.strip() == "0.9.6-stand-in", run.stderr
        config = prefix / "etc" / "jupyter" / "nbgrader_config.py"
        assert stat.S_IMODE(config.stat().st_mode) & 0o004
        assert f"c.Exchange.root = {str(exchange)!r}" in config.read_text()
        run = _as(login, str(prefix / "bin" / "python"), "-c", "import stubnb, json, sys; print(sys.prefix)")
        assert run.returncode == 0 and run.stdout.strip() == str(prefix), run.stderr
    finally:
        os.umask(old)
        subprocess.run(["userdel", login], check=False, capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


@needs_accounts
@pytest.mark.skipif(not os.environ.get("ATTNBOOK_STUDENT_ENV_FULL"),
                    reason="makes the whole students' environment (minutes, 1.7 GB): ATTNBOOK_STUDENT_ENV_FULL=1")
def test_the_whole_student_env_runs_nbgrader_as_another_account():
    base = pathlib.Path(tempfile.mkdtemp(prefix="attnbook-student-env-"))
    base.chmod(0o755)
    prefix, exchange = base / "attnbook", base / "exchange"
    prepare_exchange(exchange)  # as `make assignments` lays it out, with one assignment released
    (exchange / "attention-book" / "outbound" / NAME).mkdir(mode=0o755)
    (exchange / "attention-book" / "outbound" / NAME / f"{NAME}.ipynb").write_text("{}")
    (exchange / "attention-book" / "outbound" / NAME / f"{NAME}.ipynb").chmod(0o644)
    login = _account()
    try:
        result = _make("student-env", f"PREFIX={prefix}", f"EXCHANGE={exchange}", timeout=1800)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        run = _as(login, str(prefix / "bin" / "nbgrader"), "--version")
        assert run.returncode == 0 and "0.9.6" in run.stdout + run.stderr, run.stderr
        run = _as(login, str(prefix / "bin" / "nbgrader"), "list")  # the course and exchange of its config
        # (HOME=/tmp: the student has no nbgrader configuration of their own)
        assert run.returncode == 0 and f"attention-book {NAME}" in run.stdout + run.stderr, run.stderr
        run = _as(login, str(prefix / "bin" / "python"), "-c", "import attnbook, torch, nbgrader, jupyterlab")
        assert run.returncode == 0, run.stderr
    finally:
        subprocess.run(["userdel", login], check=False, capture_output=True)
        shutil.rmtree(base, ignore_errors=True)
