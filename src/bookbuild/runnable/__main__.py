"""Command line of the runnable edition; see ``bookbuild.runnable``'s docstring."""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys

from bookbuild.runnable import __doc__ as DOC
from bookbuild.runnable.files import (FILLED_DIR, REPO, WORKSPACE_DIR, build_edition, copy_missing, stale_notebooks,
                    write_filled_copies)
from bookbuild.runnable.edition import EDITION_DIR


# The running times the book states were measured on one thread (chapters/intro.md); with the
# default (one thread per core) the training cells of a student's kernel ran 2-3 times slower on a
# shared 2-core machine. A value the student sets is kept.
THREADS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def lab_environment(environ) -> dict[str, str]:
    """The environment of `make lab`'s JupyterLab, which its kernels inherit: one thread unless the
    student chose otherwise."""
    env = dict(environ)
    for name, value in THREADS.items():
        env.setdefault(name, value)
    return env


def lab_command(workspace: pathlib.Path, extra: list[str], euid: int | None = None) -> list[str]:
    """`jupyter lab` on ``workspace`` at 127.0.0.1; as root (a container, some cloud machines) with
    ``--allow-root``, without which JupyterLab refuses to start."""
    euid = os.geteuid() if euid is None and hasattr(os, "geteuid") else euid
    root = ["--allow-root"] if euid == 0 and "--allow-root" not in extra else []
    return [sys.executable, "-m", "jupyterlab", "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.root_dir={workspace}", *root, *extra]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bookbuild.runnable", description=DOC.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=pathlib.Path, default=REPO, help="the book's folder")
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help=f"write the runnable edition into {EDITION_DIR}/")
    build.add_argument("chapters", nargs="*", type=pathlib.Path, help="chapter notebooks (default: _toc.yml's)")
    sub.add_parser("check", help=f"exit 1 if {EDITION_DIR}/ differs from what the chapters generate")
    fill = sub.add_parser("fill", help="filled copies of the edition (exercises answered) for nbval")
    fill.add_argument("--out", type=pathlib.Path, default=None, help=f"default: {FILLED_DIR}")
    lab = sub.add_parser("lab", help="copy the edition into a working folder (missing files only), start JupyterLab")
    lab.add_argument("--dir", type=pathlib.Path, default=None, help=f"default: {WORKSPACE_DIR}")
    lab.add_argument("jupyter_args", nargs=argparse.REMAINDER, help="passed on to `jupyter lab` (after --)")
    args = parser.parse_args(argv)
    root = args.root.resolve()

    if args.command == "build":
        for path in build_edition(root, args.chapters or None):
            print(path.relative_to(root))
    elif args.command == "check":
        stale = stale_notebooks(root)
        if stale:
            print(f"{EDITION_DIR}/ is out of date ({', '.join(stale)}): run `make runnable`", file=sys.stderr)
            return 1
        print(f"{EDITION_DIR}/ is up to date")
    elif args.command == "fill":
        for path in write_filled_copies(root, args.out):
            print(path)
    elif args.command == "lab":
        workspace = (args.dir or root / WORKSPACE_DIR).resolve()
        copied = copy_missing(root / EDITION_DIR, workspace)
        kept = len(list(workspace.glob("*.ipynb"))) - len(copied)
        print(f"{workspace}: {len(copied)} notebook(s) copied from {EDITION_DIR}/, {kept} of yours kept as they are "
              "(delete one to get a fresh copy)")
        extra = [a for a in args.jupyter_args if a != "--"]
        command = lab_command(workspace, extra)
        sys.stdout.flush()
        try:
            return subprocess.call(command, env=lab_environment(os.environ))
        except KeyboardInterrupt:  # Ctrl-C stops JupyterLab, which has already said goodbye
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
