"""The students' environment on a shared server: ``make student-env PREFIX=/opt/attnbook``.

A virtual environment is not a copy of Python: its ``bin/python`` links to (or, made with
``--copies``, is a copy of) the Python it was made from, and that Python's standard library and
shared library stay where they are. An environment made from a Python in a private home (pyenv's
under ``/root``, mode 0700) therefore fails for every other account, copied or not. This one is made
from a Python that every account can run (Debian's ``/usr/bin/python3`` by default), in a folder
outside any private home, with the book's package installed into it (not linked to the clone,
which may be private too) together with nbgrader and JupyterLab at the versions requirements.txt
pins; everything in it is made readable (and, where executable, runnable) by every account.

Its ``etc/jupyter/nbgrader_config.py`` names the course and its exchange, so a student who runs
``PREFIX/bin/nbgrader`` needs no configuration of their own. When run as root, the command ends by
running ``PREFIX/bin/nbgrader --version`` as the account ``nobody``, which proves the point.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import stat
import subprocess
import tempfile

from attnbook_classroom.course.folder import COURSE_ID

__all__ = ["DEFAULT_PYTHON", "private_part", "make_student_env"]

DEFAULT_PYTHON = "/usr/bin/python3"
CONFIG_MARK = "# Written by `make student-env` (python -m attnbook_classroom.course student-env)"
_ABOUT = ("import json, sys, sysconfig; print(json.dumps({'executable': sys.executable, "
          "'version': list(sys.version_info[:2]), 'stdlib': sysconfig.get_path('stdlib'), "
          "'libdir': sysconfig.get_config_var('LIBDIR'), 'ldlibrary': sysconfig.get_config_var('LDLIBRARY'), "
          "'shared': bool(sysconfig.get_config_var('Py_ENABLE_SHARED')), 'in_venv': sys.prefix != sys.base_prefix}))")


def private_part(path: pathlib.Path | str) -> str | None:
    """Why another account cannot reach ``path`` (a folder on the way it cannot enter, or the file
    itself it cannot read), or None when every account can."""
    path = pathlib.Path(os.path.realpath(path))
    for folder in reversed(path.parents):
        mode = os.stat(folder).st_mode
        if not mode & stat.S_IXOTH:
            return f"{folder} (mode {stat.S_IMODE(mode):04o}) cannot be entered by other accounts"
    mode = os.stat(path).st_mode
    need = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(mode) or mode & stat.S_IXUSR else 0)
    if mode & need != need:
        return f"{path} (mode {stat.S_IMODE(mode):04o}) cannot be read by other accounts"
    return None


def _about(python: str) -> dict:
    found = shutil.which(python)
    if found is None:
        raise SystemExit(f"student-env: --python {python!r} is not a Python found here; give the path of "
                         f"one every account can run (STUDENT_PYTHON=..., default {DEFAULT_PYTHON})")
    result = subprocess.run([found, "-c", _ABOUT], capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"student-env: --python {python!r} did not run: {result.stderr.strip()[-500:]}")
    return json.loads(result.stdout)


def _check_python(python: str) -> dict:
    """The base Python's facts, after checking that every account can run it."""
    about = _about(python)
    if about["in_venv"]:
        raise SystemExit(f"student-env: --python {python!r} is a virtual environment's Python; give the "
                         f"Python it was made from, or another every account can run (default {DEFAULT_PYTHON})")
    if tuple(about["version"]) < (3, 10):
        raise SystemExit(f"student-env: --python {python!r} is Python {about['version'][0]}.{about['version'][1]}; "
                         "the book needs 3.10 or later")
    parts = [pathlib.Path(about["executable"]), pathlib.Path(about["stdlib"]) / "os.py"]
    if about["shared"] and about["libdir"] and about["ldlibrary"]:
        library = pathlib.Path(about["libdir"]) / about["ldlibrary"]
        if library.exists():
            parts.append(library)
    for part in parts:
        why = private_part(part)
        if why:
            raise SystemExit(
                f"student-env: --python {python!r} cannot be run by other accounts: {why}. A virtual "
                "environment made from it (even with --copies) still needs its standard library there. "
                f"Give a Python outside any private home, e.g. STUDENT_PYTHON={DEFAULT_PYTHON} "
                "(Debian: apt-get install python3-venv)")
    return about


def _has_account(login: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(login)
    except KeyError:
        return False
    return True


def _open_up(prefix: pathlib.Path) -> None:
    """Everything under ``prefix`` readable by every account; folders and executables runnable."""
    for folder, dirs, files in os.walk(prefix):
        for name in [folder, *(os.path.join(folder, f) for f in files)]:
            st = os.lstat(name)
            if stat.S_ISLNK(st.st_mode):
                continue
            mode = st.st_mode | stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH
            if stat.S_ISDIR(st.st_mode) or st.st_mode & stat.S_IXUSR:
                mode |= stat.S_IXGRP | stat.S_IXOTH
            if mode != st.st_mode:
                os.chmod(name, stat.S_IMODE(mode))


def write_student_config(prefix: pathlib.Path, exchange: pathlib.Path | None) -> pathlib.Path:
    """``PREFIX/etc/jupyter/nbgrader_config.py``: the course's id and exchange, for every student."""
    path = prefix / "etc" / "jupyter" / "nbgrader_config.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [CONFIG_MARK, "# (a student's own ~/.jupyter/nbgrader_config.py, read after it, may change them)",
             "c = get_config()  # noqa: F821", f"c.CourseDirectory.course_id = {COURSE_ID!r}"]
    if exchange is not None:
        lines.append(f"c.Exchange.root = {str(exchange)!r}")
    path.write_text("\n".join(lines) + "\n")
    return path


def make_student_env(prefix: pathlib.Path, python: str = DEFAULT_PYTHON, exchange: pathlib.Path | None = None,
                     source: pathlib.Path | None = None, requirements: pathlib.Path | None = None,
                     packages: list[str] | None = None) -> pathlib.Path:
    """Make (or update) the students' environment in ``prefix``; returns its ``bin/nbgrader``.

    ``packages`` defaults to the book's package from ``source`` (the clone) with its ``lab`` and
    ``classroom`` extras, installed (not linked), constrained by ``requirements``."""
    prefix = pathlib.Path(os.path.abspath(prefix))
    if exchange is not None:
        exchange = pathlib.Path(os.path.abspath(exchange))
    source = pathlib.Path(source or pathlib.Path(__file__).resolve().parents[3])
    requirements = pathlib.Path(requirements or source / "requirements.txt")
    if prefix.exists() and any(prefix.iterdir()) and not (prefix / "pyvenv.cfg").is_file():
        raise SystemExit(f"student-env: PREFIX={prefix} exists and is not a virtual environment; "
                         "give a new or empty folder (or one this command made)")
    about = _check_python(python)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    old_umask = os.umask(0o022)
    try:
        with tempfile.TemporaryDirectory(prefix="attnbook-student-env-") as build:
            if packages is None:  # built from a copy, so that nothing is written into the clone
                copy = pathlib.Path(build) / "attnbook"
                shutil.copytree(source / "src", copy / "src", ignore=shutil.ignore_patterns(
                    "__pycache__", "*.egg-info", "site-assets"))  # bookbuild: the course reads chapters through it
                for name in ("pyproject.toml", "README.md"):
                    shutil.copy2(source / name, copy / name)
                packages = ["--no-build-isolation", f"{copy}[lab,classroom]"]
            if not (prefix / "pyvenv.cfg").is_file():
                subprocess.run([about["executable"], "-m", "venv", str(prefix)], check=True, env=env)
            pip = [str(prefix / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                   "-c", str(requirements)]
            subprocess.run([*pip, "setuptools"], check=True, env=env, cwd=build)
            subprocess.run([*pip, *packages], check=True, env=env, cwd=build)
        write_student_config(prefix, exchange)
    finally:
        os.umask(old_umask)
    _open_up(prefix)
    nbgrader = prefix / "bin" / "nbgrader"
    why = private_part(nbgrader) or private_part(prefix / "lib")
    if why:
        raise SystemExit(f"student-env: the environment in PREFIX={prefix} is not usable by other accounts: {why}. "
                         "Choose a PREFIX outside any private home (e.g. /opt/attnbook)")
    version = subprocess.run([str(nbgrader), "--version"], capture_output=True, text=True, check=True, env=env)
    said = (version.stdout.strip().splitlines() or ["nbgrader"])[-1]  # "nbgrader version 0.9.6"
    print(f"student-env: {prefix} is ready ({said}, Python "
          f"{about['version'][0]}.{about['version'][1]} from {about['executable']})")
    if os.geteuid() == 0 and shutil.which("runuser") and _has_account("nobody"):
        check = subprocess.run(["runuser", "-u", "nobody", "--", "env", "-i", "HOME=/tmp", "PATH=/usr/bin:/bin",
                                str(nbgrader), "--version"], capture_output=True, text=True)
        if check.returncode != 0:
            raise SystemExit(f"student-env: the account nobody cannot run {nbgrader}: "
                             f"{(check.stderr or check.stdout).strip()[-800:]}")
        print(f"student-env: checked as the account nobody: {nbgrader} --version runs")
    print(f"Students run {nbgrader} (or put {prefix / 'bin'} first on their PATH); course "
          f"{COURSE_ID!r}" + (f", exchange {exchange}" if exchange else "")
          + f", set in {prefix / 'etc' / 'jupyter' / 'nbgrader_config.py'}")
    return nbgrader
