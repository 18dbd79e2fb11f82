"""nbgrader's exchange, made safe for a class on a shared server (the course's configuration plugs
these classes into ``nbgrader collect`` and ``nbgrader release_feedback``).

:class:`SafeCollect` replaces nbgrader's collection, which copies what a student's exchange
folder holds with the instructor's rights, follows symbolic links, and believes the student id
and the time written in the folder's name. Here, for every folder of the assignment in the
exchange's ``inbound/``:

- nothing is followed: the folder, its sub-folders and files are opened relative to their parent
  with ``O_NOFOLLOW``; a symbolic link, a hard link, a pipe, a socket or a device anywhere in it, an
  entry owned by another account, or more than the size and file-count limits, refuses the whole
  submission;
- the student is the folder's owner: a folder whose name claims another student (or a name that is
  not a plain student id) is refused;
- the time is the file system's: the last status change (``ctime``, which no user can set back) of
  the folder and everything in it; a name whose time differs from it by more than
  ``time_tolerance`` seconds is refused. The submission's ``timestamp.txt`` is written from it.

Each refusal is logged and recorded in ``ROOT/.grading/refused.json`` (``make grade`` lists them in
``summary.txt``); one student's folder never stops the collection of the others. The accepted
submission is copied to a private folder next to its destination and only then swapped in, so
the previous submission stays until a new one is complete.

:class:`RobustReleaseFeedback` is nbgrader's ``release_feedback`` that skips, and reports, a
student whose feedback cannot be released (no ``submission_secret.txt``, say) instead of stopping.
"""

from __future__ import annotations

import datetime
import errno
import glob
import json
import os
import pathlib
import re
import secrets
import shutil
import stat
from fnmatch import fnmatch

from nbgrader.exchange.default.collect import ExchangeCollect
from nbgrader.exchange.default.release_feedback import ExchangeReleaseFeedback
from nbgrader.utils import notebook_hash, parse_utc
from traitlets import Float, Integer

__all__ = ["SafeCollect", "RobustReleaseFeedback", "STUDENT_ID", "Refused", "load_refused"]

STUDENT_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._@-]{0,63}$")  # a login name; never "..", never a path
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
TIMESTAMP = "%Y-%m-%d %H:%M:%S.%f UTC"


class Refused(Exception):
    """A submission that is not collected; the message says why."""


def _owner(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"the account with uid {uid}"


def _utc(seconds: float) -> datetime.datetime:
    """A time as nbgrader keeps it: UTC, without a time zone."""
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).replace(tzinfo=None)


class _Walk:
    """What a submission folder holds, read without following anything."""

    def __init__(self, uid: int, ignore: list[str], max_bytes: int, max_files: int, max_file_bytes: int):
        self.uid, self.ignore = uid, ignore
        self.max_bytes, self.max_files, self.max_file_bytes = max_bytes, max_files, max_file_bytes
        self.files: list[tuple[str, int, int, int]] = []  # (relative path, size, inode, device)
        self.folders: list[str] = []
        self.bytes = 0
        self.latest = 0.0

    def scan(self, fd: int, relative: str = "") -> None:
        st = os.fstat(fd)
        self.latest = max(self.latest, st.st_ctime)
        for name in sorted(os.listdir(fd)):
            path = f"{relative}{name}"
            if any(fnmatch(name, pattern) for pattern in self.ignore):
                continue
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                raise Refused(f"{path} is a symbolic link")
            if st.st_uid != self.uid:
                raise Refused(f"{path} belongs to {_owner(st.st_uid)}, not to the folder's owner")
            self.latest = max(self.latest, st.st_ctime)
            if stat.S_ISDIR(st.st_mode):
                self.folders.append(path)
                sub = os.open(name, _DIR, dir_fd=fd)
                try:
                    self.scan(sub, path + "/")
                finally:
                    os.close(sub)
            elif stat.S_ISREG(st.st_mode):
                if st.st_nlink > 1:
                    raise Refused(f"{path} is a hard link (it has {st.st_nlink} names)")
                if st.st_size > self.max_file_bytes:
                    raise Refused(f"{path} is {st.st_size / 1e6:.1f} MB, over the limit of "
                                  f"{self.max_file_bytes / 1e6:.1f} MB a file")
                self.files.append((path, st.st_size, st.st_ino, st.st_dev))
                self.bytes += st.st_size
            else:
                raise Refused(f"{path} is not a regular file (a pipe, a socket or a device)")
            if self.bytes > self.max_bytes:
                raise Refused(f"the folder holds more than {self.max_bytes / 1e6:.1f} MB")
            if len(self.files) + len(self.folders) > self.max_files:
                raise Refused(f"the folder holds more than {self.max_files} files")


def _copy(source_fd: int, walk: _Walk, target: pathlib.Path) -> None:
    """Copy the files ``walk`` found below ``source_fd`` into ``target`` (private), opening each
    path component without following links and checking that each file is the one scanned."""
    target.mkdir(mode=0o700)
    for folder in walk.folders:
        (target / folder).mkdir(mode=0o700)
    for path, size, inode, device in walk.files:
        parts = path.split("/")
        fds = [source_fd]
        try:
            for part in parts[:-1]:
                fds.append(os.open(part, _DIR, dir_fd=fds[-1]))
            fd = os.open(parts[-1], _FILE, dir_fd=fds[-1])
        except OSError as exc:
            raise Refused(f"{path} changed while it was collected ({os.strerror(exc.errno)})") from None
        finally:
            for opened in fds[1:]:
                os.close(opened)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or (st.st_ino, st.st_dev) != (inode, device) or st.st_nlink > 1:
                raise Refused(f"{path} changed while it was collected")
            out = os.open(target / path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            try:
                left = size
                while True:
                    chunk = os.read(fd, min(1 << 20, left + 1))
                    if not chunk:
                        break
                    left -= len(chunk)
                    if left < 0:
                        raise Refused(f"{path} grew while it was collected")
                    os.write(out, chunk)
            finally:
                os.close(out)
        finally:
            os.close(fd)


def _record_refusals(root: pathlib.Path, assignment: str, refused: list[dict]) -> None:
    path = root / ".grading" / "refused.json"
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    known = load_refused(root)
    known = [r for r in known if r.get("assignment") != assignment] + refused
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(known, indent=1))
    tmp.replace(path)


def load_refused(root: pathlib.Path) -> list[dict]:
    """The submissions the last collection of each assignment refused (folder, student, reason)."""
    path = pathlib.Path(root) / ".grading" / "refused.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return []


class SafeCollect(ExchangeCollect):
    """``nbgrader collect`` without following links or trusting names (see the module)."""

    time_tolerance = Float(300.0, help="Seconds by which the time in a submission folder's name may "
                           "differ from the time its files were last written.").tag(config=True)
    max_files = Integer(1000, help="Files (and folders) a submission may hold.").tag(config=True)

    def init_src(self):
        if self.coursedir.course_id == "":
            self.fail("No course id specified. Re-run with --course flag.")
        self.course_path = os.path.join(self.root, self.coursedir.course_id)
        self.inbound_path = os.path.join(self.course_path, "inbound")
        try:
            self.inbound_fd = os.open(self.inbound_path, _DIR)
        except OSError as exc:
            self.fail(f"Course not found or not readable: {self.inbound_path} ({os.strerror(exc.errno)})")
        assignment, wanted = self.coursedir.assignment_id, self.coursedir.student_id
        self.refused: list[dict] = []
        accepted: dict[str, list[dict]] = {}
        for name in sorted(os.listdir(self.inbound_fd)):
            parts = name.rsplit("+", 3)
            if len(parts) != 4 or parts[1] != assignment:
                continue
            student, _, stamp, _ = parts
            if wanted not in ("", "*") and student != wanted:
                continue
            try:
                record = self._check(name, student, stamp)
            except Refused as exc:
                self.refused.append({"folder": name, "student": student, "assignment": assignment,
                                     "reason": str(exc)})
                self.log.error("Refused %s: %s", name, exc)
                continue
            accepted.setdefault(student, []).append(record)
        from nbgrader.api import Gradebook, MissingEntry

        with Gradebook(self.coursedir.db_url, self.coursedir.course_id) as gb:
            try:
                self.duedate = gb.find_assignment(assignment).duedate
            except MissingEntry:
                self.duedate = None
        self.src_records = []
        for records in accepted.values():
            records.sort(key=lambda r: r["timestamp"], reverse=True)
            if self.before_duedate and self.duedate is not None:
                early = [r for r in records if r["timestamp"] <= parse_utc(self.duedate)]
                self.src_records.append(early[0] if early else records[0])
            else:
                self.src_records.append(records[0])

    def _check(self, name: str, student: str, stamp: str) -> dict:
        if not STUDENT_ID.match(student):
            raise Refused(f"{student!r} is not a student id (letters, digits, '.', '_', '-', '@')")
        st = os.stat(name, dir_fd=self.inbound_fd, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            raise Refused("the submission folder is a symbolic link")
        if not stat.S_ISDIR(st.st_mode):
            raise Refused("the submission is not a folder")
        owner = _owner(st.st_uid)
        if self.check_owner and owner != student:
            raise Refused(f"handed in under the name {student!r} by {owner!r}")
        try:
            claimed = parse_utc(stamp)
        except Exception:
            raise Refused(f"the time in the folder's name ({stamp!r}) cannot be read") from None
        course = self.coursedir
        walk = _Walk(st.st_uid, list(course.ignore), 1000 * course.max_dir_size, self.max_files,
                     1000 * course.max_file_size)
        fd = os.open(name, _DIR, dir_fd=self.inbound_fd)
        try:
            if os.fstat(fd).st_ino != st.st_ino:
                raise Refused("the submission folder changed while it was collected")
            walk.scan(fd)
        except OSError as exc:
            raise Refused(f"the folder could not be read ({os.strerror(exc.errno or errno.EIO)})") from None
        finally:
            os.close(fd)
        written = _utc(walk.latest)
        if abs((written - claimed).total_seconds()) > self.time_tolerance:
            raise Refused(f"the folder's name says it was submitted at {claimed:%Y-%m-%d %H:%M:%S} UTC, "
                          f"but its files were written at {written:%Y-%m-%d %H:%M:%S} UTC")
        return {"username": student, "filename": name, "timestamp": written, "walk": walk,
                "inode": st.st_ino}

    def copy_files(self):
        assignment = self.coursedir.assignment_id
        root = pathlib.Path(self.coursedir.root)
        if not self.src_records:
            self.log.warning("No submissions of '%s' for course '%s' to collect", assignment,
                             self.coursedir.course_id)
        else:
            self.log.info("Processing %d submissions of '%s' for course '%s'", len(self.src_records),
                          assignment, self.coursedir.course_id)
        for rec in self.src_records:
            student = rec["username"]
            try:
                self._collect(rec, root)
            except Refused as exc:
                self.refused.append({"folder": rec["filename"], "student": student, "assignment": assignment,
                                     "reason": str(exc)})
                self.log.error("Refused %s: %s", rec["filename"], exc)
            except OSError as exc:
                self.refused.append({"folder": rec["filename"], "student": student, "assignment": assignment,
                                     "reason": f"could not be copied: {exc}"})
                self.log.error("Could not collect %s: %s", rec["filename"], exc)
        os.close(self.inbound_fd)
        _record_refusals(root, assignment, self.refused)
        if self.refused:
            self.log.error("%d submission folders were refused (listed in %s)", len(self.refused),
                           root / ".grading" / "refused.json")

    def _collect(self, rec: dict, root: pathlib.Path) -> None:
        student, assignment = rec["username"], self.coursedir.assignment_id
        dest = pathlib.Path(self.coursedir.format_path(self.coursedir.submitted_directory, student, assignment))
        parent = dest.parent
        for folder in (parent.parent, parent):
            if folder.is_symlink():
                raise Refused(f"{folder} is a symbolic link in the course folder; not collected")
            folder.mkdir(mode=0o700, exist_ok=True)
        if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
            raise Refused(f"{dest} is not a folder; not collected")
        new = rec["timestamp"]
        if dest.is_dir():  # as nbgrader decides, from the times of the file system
            existing = self.coursedir.get_existing_timestamp(str(dest))
            if not ((self.update and (existing is None or new > existing))
                    or (self.before_duedate and existing != new)):
                self.log.info("%s: %s %s", "No newer submission to collect" if self.update else
                              "Submission already exists, use --update to update", student, assignment)
                return
        staging = parent / f".incoming-{assignment}-{secrets.token_hex(6)}"
        fd = os.open(rec["filename"], _DIR, dir_fd=self.inbound_fd)
        try:
            if os.fstat(fd).st_ino != rec["inode"]:
                raise Refused("the submission folder changed while it was collected")
            _copy(fd, rec["walk"], staging)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        finally:
            os.close(fd)
        stamp = staging / "timestamp.txt"
        stamp.unlink(missing_ok=True)
        fd = os.open(stamp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, new.strftime(TIMESTAMP).encode())
        os.close(fd)
        old = None
        if dest.exists():
            old = parent / f".previous-{assignment}-{secrets.token_hex(6)}"
            dest.rename(old)
        staging.rename(dest)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        self.log.info("%s submission: %s %s (written %s)", "Updated" if old else "Collected", student,
                      assignment, new.strftime(TIMESTAMP))


class RobustReleaseFeedback(ExchangeReleaseFeedback):
    """``nbgrader release_feedback`` that skips (and reports) what it cannot release."""

    def copy_files(self):
        exclude = set(self.coursedir.student_id_exclude.split(",")) if self.coursedir.student_id_exclude else set()
        released = failed = 0
        for html_file in sorted(glob.glob(os.path.join(self.src_path, "*.html"))):
            regexp = re.escape(os.path.sep).join([
                self.coursedir.format_path(self.coursedir.feedback_directory, "(?P<student_id>.*)",
                                           self.coursedir.assignment_id, escape=True),
                "(?P<notebook_id>.*).html"])
            m = re.match(regexp, html_file)
            if m is None:
                self.log.error("Could not match '%s' with regexp '%s'", html_file, regexp)
                continue
            student_id, notebook_id = m.group("student_id"), m.group("notebook_id")
            if student_id in exclude:
                continue
            feedback_dir = os.path.dirname(html_file)
            try:
                for path in (html_file, os.path.join(feedback_dir, "submission_secret.txt")):
                    if os.path.islink(path) or not os.path.isfile(path):
                        raise FileNotFoundError(f"{os.path.basename(path)} is missing or not a regular file")
                with open(os.path.join(feedback_dir, "submission_secret.txt")) as fh:
                    secret = fh.read()
                checksum = notebook_hash(secret=secret, notebook_id=notebook_id)
                tmp = os.path.join(self.dest_path, f"{checksum}-tmp.html")
                shutil.copy(html_file, tmp)
                os.chmod(tmp, 0o644)
                shutil.move(tmp, os.path.join(self.dest_path, f"{checksum}.html"))
                released += 1
                self.log.info("Released feedback for '%s' on '%s/%s'", student_id,
                              self.coursedir.assignment_id, notebook_id)
            except OSError as exc:
                failed += 1
                self.log.error("Feedback for '%s' on '%s/%s' not released: %s (a submission placed by hand, "
                               "not through the exchange, has no submission_secret.txt: send its page "
                               "from feedback/ yourself)", student_id, self.coursedir.assignment_id,
                               notebook_id, exc)
        self.log.info("Released %d feedback pages; %d could not be released", released, failed)
