"""A class on one shared Linux server: real Unix accounts (made and removed here), nbgrader's real
exchange commands, and a student who attacks the exchange and the course folder.

The instructor (root here) sets the course up and releases an assignment; alice fetches and submits
it with nbgrader; bob hands in under alice's name, with a date in the folder's name earlier than
the truth, with links to alice's notebook, to the course's secret and to ``source/``, with a pipe
in place of his notebook, and finally honestly. ``nbgrader collect`` (the course's SafeCollect)
refuses every attack, collects the rest privately, takes each submission's time from the file
system, and keeps a submission when a newer one is refused; bob can read nothing of the course.
(Links placed in ``submitted/`` by hand, and ``release_feedback`` going on past a student it cannot
hand back to, are tried in tests/classroom/test_nbgrader.py, which grades.)
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import shutil
import stat
import subprocess
import sys

import pytest

from attnbook_classroom.course import build_assignments
from test_nbgrader import NAME, _solve, tiny_notebook

ROOT = pathlib.Path(__file__).resolve().parents[2]
SITE = [p for p in sys.path if p.endswith("site-packages")]


def _student_python() -> str | None:
    """An interpreter another account can run, of this one's version (the venv's may lie in a
    folder only root can enter); it runs nbgrader from this environment's site-packages."""
    for candidate in (sys.executable, f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"):
        path = pathlib.Path(os.path.realpath(candidate))
        if path.exists() and all(os.stat(p).st_mode & 0o001 for p in [path, *path.parents]):
            return str(path)
    return None


PYTHON = _student_python()
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None or PYTHON is None or not shutil.which("bwrap"),
    reason="needs root (to make Unix accounts), useradd, bubblewrap and a Python other accounts can run")


def _now_stamp(delta_days: float = 0.0) -> str:
    when = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=delta_days)
    return when.strftime("%Y-%m-%d %H:%M:%S.%f UTC")


@pytest.fixture(scope="module")
def server():
    """Two student accounts, their homes, a world-reachable exchange and a private course (in a
    folder of /tmp every account can reach: pytest's own are private)."""
    import tempfile

    base = pathlib.Path(tempfile.mkdtemp(prefix="attnbook-server-"))
    base.chmod(0o755)
    tag = f"{os.getpid() % 100000:05d}"
    users = {"alice": f"abka{tag}", "bob": f"abkb{tag}"}
    homes = {}
    for who, login in users.items():
        subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", login], check=True)
        home = base / f"home-{who}"
        home.mkdir(mode=0o700)
        shutil.chown(home, login, login)
        homes[who] = home
    try:
        yield {"base": base, "users": users, "homes": homes, "course": base / "course",
               "exchange": base / "exchange"}
    finally:
        for login in users.values():
            subprocess.run(["userdel", login], check=False, capture_output=True)
        if not os.environ.get("KEEP_SERVER"):
            shutil.rmtree(base, ignore_errors=True)


def as_student(server, who: str, command: list[str], *, env: dict | None = None, check: bool = True,
               cwd: pathlib.Path | None = None):
    """Run ``command`` as the student's own account, in their home."""
    login, home = server["users"][who], server["homes"][who]
    base_env = {"HOME": str(home), "USER": login, "LOGNAME": login, "PATH": "/usr/bin:/bin",
                "PYTHONPATH": os.pathsep.join(SITE + [str(ROOT / "src")])}
    result = subprocess.run(["runuser", "-u", login, "--", "env", "-i",
                             *[f"{k}={v}" for k, v in {**base_env, **(env or {})}.items()], *command],
                            cwd=cwd or home, capture_output=True, text=True, timeout=300)
    assert not check or result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result


def student_nbgrader(server, who: str, *args: str, env: dict | None = None, check: bool = True):
    return as_student(server, who, [PYTHON, "-m", "nbgrader", *args], env=env, check=check)


def write_as(server, who: str, path: pathlib.Path, text: str) -> None:
    path.write_text(text)
    shutil.chown(path, server["users"][who], server["users"][who])


def instructor(server, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "attnbook_classroom.course", "nbgrader", "--root",
                             str(server["course"]), *args], capture_output=True, text=True, timeout=600)
    assert not check or result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def test_a_class_on_a_shared_server(server, tmp_path, capsys):
    course, exchange, users = server["course"], server["exchange"], server["users"]
    alice, bob = users["alice"], users["bob"]
    src = tmp_path / f"{NAME}.ipynb"
    src.write_text(json.dumps(tiny_notebook()))
    course.mkdir(mode=0o755)  # as an instructor might leave it: `make assignments` closes it
    (course / "nbgrader_config_local.py").write_text(
        "c = get_config()\nc.SandboxedGrading.cell_timeout = 5.0\nc.SandboxedGrading.notebook_timeout = 40.0\n"
        "c.CourseDirectory.max_dir_size = 300  # kB: a submission over it is refused\n")
    build_assignments(course, [src], exchange)
    assert "readable by you only" in capsys.readouterr().out
    assert stat.S_IMODE(course.stat().st_mode) == 0o700
    assert stat.S_IMODE((course / "course_secret").stat().st_mode) == 0o600
    inbound = exchange / "attention-book" / "inbound"
    assert stat.S_IMODE(inbound.stat().st_mode) == 0o1733  # write-only for students, sticky
    instructor(server, "release_assignment", NAME)

    # alice: fetch, answer, validate-free submit; a private notebook of hers is bob's target
    for who in ("alice", "bob"):
        (server["homes"][who] / ".jupyter").mkdir()
        write_as(server, who, server["homes"][who] / ".jupyter" / "nbgrader_config.py",
                 f"c = get_config()\nc.CourseDirectory.course_id = 'attention-book'\n"
                 f"c.Exchange.root = {str(exchange)!r}\n")
        shutil.chown(server["homes"][who] / ".jupyter", users[who], users[who])
    student_nbgrader(server, "alice", "fetch_assignment", NAME)
    (server["homes"]["bob"] / NAME).mkdir(exist_ok=True)
    shutil.copy(server["homes"]["alice"] / NAME / f"{NAME}.ipynb", server["homes"]["bob"] / NAME)
    for path in (server["homes"]["bob"] / NAME, server["homes"]["bob"] / NAME / f"{NAME}.ipynb"):
        shutil.chown(path, bob, bob)
    answered = json.dumps(_solve(json.loads((server["homes"]["alice"] / NAME / f"{NAME}.ipynb").read_text()), {}))
    write_as(server, "alice", server["homes"]["alice"] / NAME / f"{NAME}.ipynb", answered)
    student_nbgrader(server, "alice", "submit", NAME)
    private = server["homes"]["alice"] / "private.ipynb"
    write_as(server, "alice", private, answered)
    private.chmod(0o600)

    # bob: every attack on the exchange, then an honest submission of an unanswered notebook
    bob_nb = server["homes"]["bob"] / NAME / f"{NAME}.ipynb"
    student_nbgrader(server, "bob", "submit", NAME, "--student", alice)  # as alice
    attacks = {
        "early": (_now_stamp(-2), f"cp {bob_nb} \"$d/{NAME}.ipynb\""),
        "link_alice": (_now_stamp(), f"ln -s {private} \"$d/{NAME}.ipynb\""),
        "link_secret": (_now_stamp(), f"cp {bob_nb} \"$d/{NAME}.ipynb\"; ln -s {course / 'course_secret'} \"$d/secret\""),
        "pipe": (_now_stamp(), f"mkfifo \"$d/{NAME}.ipynb\""),
    }
    for key, (stamp, make) in attacks.items():
        folder = inbound / f"{bob}+{NAME}+{stamp}+{key}"
        as_student(server, "bob", ["sh", "-c", f"d='{folder}'; mkdir \"$d\" && {make}"])
    as_student(server, "bob", ["ln", "-s", str(course / "source"), str(inbound / f"{bob}+{NAME}+{_now_stamp()}+dirlink")])
    honest = inbound / f"{bob}+{NAME}+{_now_stamp()}+honest"  # as nbgrader submit makes it
    as_student(server, "bob", ["sh", "-c", f"mkdir '{honest}' && cp {bob_nb} '{honest}/{NAME}.ipynb' && "
                                           f"head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n' > '{honest}/submission_secret.txt'"])

    collected = instructor(server, "collect", NAME)
    assert "Refused" in collected.stdout + collected.stderr
    refused = {r["folder"].rsplit("+", 1)[-1] if r["student"] == bob else "as_alice": r["reason"]
               for r in json.loads((course / ".grading" / "refused.json").read_text())}
    assert f"handed in under the name '{alice}' by '{bob}'" in refused.pop("as_alice")
    assert "says it was submitted at" in refused["early"] and "written at" in refused["early"]
    assert "is a symbolic link" in refused["link_alice"] and "is a symbolic link" in refused["link_secret"]
    assert "not a regular file" in refused["pipe"]
    assert "folder is a symbolic link" in refused["dirlink"]
    assert set(refused) == set(attacks) | {"dirlink"}, refused

    # what was collected: each student's own work, private, timed by the file system, no link
    submitted = course / "submitted"
    assert (submitted / alice / NAME / f"{NAME}.ipynb").read_text() == answered
    assert (submitted / bob / NAME / f"{NAME}.ipynb").read_text() == bob_nb.read_text()
    for path in submitted.rglob("*"):
        assert not path.is_symlink(), path
        assert stat.S_IMODE(path.lstat().st_mode) in (0o600, 0o700), (path, oct(path.lstat().st_mode))
    when = datetime.datetime.strptime((submitted / bob / NAME / "timestamp.txt").read_text(), "%Y-%m-%d %H:%M:%S.%f UTC")
    assert abs((datetime.datetime.utcnow() - when).total_seconds()) < 300
    assert not any(p.name == "secret" for p in submitted.rglob("*"))

    # bob can read nothing of the course folder
    for path in (course, course / "course_secret", submitted / alice / NAME / f"{NAME}.ipynb", course / "gradebook.db"):
        assert as_student(server, "bob", ["cat" if path.is_file() else "ls", str(path)], check=False).returncode != 0, path

    # a submission over the size limit is refused by collect --update; the previous one stays
    big = inbound / f"{alice}+{NAME}+{_now_stamp()}+big"
    as_student(server, "alice", ["sh", "-c", f"mkdir '{big}' && cp {server['homes']['alice'] / NAME / (NAME + '.ipynb')} '{big}/' "
                                             f"&& head -c 400000 /dev/zero > '{big}/data.bin'"])
    instructor(server, "collect", "--update", NAME)
    assert (submitted / alice / NAME / f"{NAME}.ipynb").read_text() == answered
    assert not (submitted / alice / NAME / "data.bin").exists()
    assert any("more than 0.3 MB" in r["reason"] for r in json.loads((course / ".grading" / "refused.json").read_text()))
