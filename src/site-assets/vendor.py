"""Copy the website's browser assets (MathJax 3, require.js, the ipywidgets embed manager) into `_vendor/`.

The versions are pinned in `package.json` and `package-lock.json` beside this file. `npm ci` installs them
into a cache folder (reused while the lock file is unchanged), and the files the pages load are copied into
`_vendor/`, which `_config.yml` serves through `html_static_path`:

    _vendor/mathjax/tex-mml-chtml.js   (+ the rest of MathJax's es5/ build: fonts, extensions)
    _vendor/widgets/require.js
    _vendor/widgets/paths.js           (from widgets-paths.js here: where require.js finds the manager)
    _vendor/widgets/embed-amd.js       (+ the icon fonts it loads from its own folder), patched: see below
    _vendor/search-maths.js            (from search-maths.js here: typesets maths in search results)

The widget manager typesets widget labels with MathJax 2's API, `MathJax.Hub.Queue(["Typeset",
MathJax.Hub, el])`, which MathJax 3 no longer has (every page with a widget logged "Cannot read
properties of undefined (reading 'Queue')"). The copy served calls MathJax 3's `typesetPromise([el])`
there instead, once MathJax has started, and MathJax 2's API where it exists (see `patch_widget_manager`).

Without npm the script says so and leaves `_vendor/` absent (or as it was): the book then loads these files
from their CDNs (see `offline_assets.py`), which needs a network to show maths and widgets.

Usage: python src/site-assets/vendor.py [--require]   (--require: fail instead of falling back)
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CACHE = ROOT / "_build" / ".site-assets-npm"
VENDOR = ROOT / "_vendor"
STAMP_NAME = ".stamp"

# (source inside node_modules, destination inside _vendor); a folder is copied whole.
COPIES = [
    ("mathjax/es5", "mathjax"),
    ("mathjax/LICENSE", "mathjax/LICENSE"),
    ("requirejs/require.js", "widgets/require.js"),
    (HERE / "widgets-paths.js", "widgets/paths.js"),
    (HERE / "search-maths.js", "search-maths.js"),
    ("@jupyter-widgets/html-manager/dist/embed-amd.js", "widgets/embed-amd.js"),
    ("@jupyter-widgets/html-manager/dist/embed.js.LICENSE.txt", "widgets/embed-amd.js.LICENSE.txt"),
]
# The embed manager loads the icon fonts from its own folder (webpack public path): copy them beside it.
FONT_SUFFIXES = {".woff2", ".woff", ".ttf", ".eot", ".svg"}
# What the pages need: checked after copying.
REQUIRED = [
    "mathjax/tex-mml-chtml.js",
    "widgets/require.js",
    "widgets/paths.js",
    "widgets/embed-amd.js",
    "search-maths.js",
]


# The widget manager's `typeset` helper (three bundled copies of @jupyter-widgets/controls' utils).
MATHJAX2_TYPESET = re.compile(r'MathJax\.Hub\.Queue\(\["Typeset",MathJax\.Hub,(\w+)\]\)')
MATHJAX2_TYPESET_COPIES = 3


def patch_widget_manager(source: str) -> str:
    """Make the embed manager's MathJax 2 calls work under MathJax 3 (and still under MathJax 2)."""
    patched, count = MATHJAX2_TYPESET.subn(
        lambda m: (f'(MathJax.Hub?MathJax.Hub.Queue(["Typeset",MathJax.Hub,{m.group(1)}]):'
                   f'MathJax.typesetPromise&&MathJax.typesetPromise([{m.group(1)}]))'),
        source,
    )
    if count != MATHJAX2_TYPESET_COPIES:
        raise SystemExit(
            f"vendor: expected {MATHJAX2_TYPESET_COPIES} MathJax 2 typeset calls in embed-amd.js, found {count}; "
            "the widget manager changed: check patch_widget_manager against the new version"
        )
    return patched


def digest(*names: str) -> str:
    return hashlib.sha256(b"\0".join((HERE / name).read_bytes() for name in names)).hexdigest()


def npm_ci(npm: str, lock: str) -> Path:
    """Install the pinned packages into CACHE (skipped when the cache matches the lock file)."""
    stamp = CACHE / STAMP_NAME
    modules = CACHE / "node_modules"
    if stamp.is_file() and stamp.read_text().strip() == lock and modules.is_dir():
        return modules
    CACHE.mkdir(parents=True, exist_ok=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copy2(HERE / name, CACHE / name)
    print(f"vendor: npm ci (MathJax 3, require.js, @jupyter-widgets/html-manager) into {CACHE.relative_to(ROOT)}")
    subprocess.run(
        [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--omit=dev", "--loglevel=error"],
        cwd=CACHE,
        check=True,
    )
    stamp.write_text(lock + "\n")
    return modules


def copy_assets(modules: Path, wanted: str) -> None:
    stamp = VENDOR / STAMP_NAME
    if stamp.is_file() and stamp.read_text().strip() == wanted and all((VENDOR / r).is_file() for r in REQUIRED):
        print(f"vendor: {VENDOR.relative_to(ROOT)}/ is up to date")
        return
    tmp = VENDOR.with_name(VENDOR.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    for src, dst in COPIES:
        source, target = modules / src, tmp / dst  # an absolute src (our own file) stays as it is
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, dirs_exist_ok=True)
        else:
            shutil.copy2(source, target)
    manager = tmp / "widgets" / "embed-amd.js"
    manager.write_text(patch_widget_manager(manager.read_text(encoding="utf-8")), encoding="utf-8")
    dist = modules / "@jupyter-widgets/html-manager/dist"
    for font in sorted(dist.iterdir()):
        if font.suffix in FONT_SUFFIXES:
            shutil.copy2(font, tmp / "widgets" / font.name)
    missing = [r for r in REQUIRED if not (tmp / r).is_file()]
    if missing:
        raise SystemExit(f"vendor: the npm packages lack {missing}: check the versions in package.json")
    (tmp / STAMP_NAME).write_text(wanted + "\n")
    shutil.rmtree(VENDOR, ignore_errors=True)
    tmp.rename(VENDOR)
    print(f"vendor: copied MathJax 3 and the widget manager into {VENDOR.relative_to(ROOT)}/")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--require", action="store_true", help="fail instead of falling back to the CDNs")
    args = parser.parse_args(argv)

    npm = shutil.which("npm")
    if npm is None and all((VENDOR / r).is_file() for r in REQUIRED):
        print(f"vendor: npm not found; keeping the copies already in {VENDOR.relative_to(ROOT)}/")
        return 0
    if npm is None:
        message = (
            "vendor: npm not found, so MathJax and the widget manager cannot be served by the site itself.\n"
            "        The book will load them from their CDNs (maths and widgets then need a network).\n"
            "        Install Node.js and npm (Debian: apt-get install -y npm) and build again to work offline."
        )
        print(message, file=sys.stderr)
        return 1 if args.require else 0
    try:
        modules = npm_ci(npm, digest("package.json", "package-lock.json"))
    except subprocess.CalledProcessError as error:
        print(f"vendor: `npm ci` failed ({error}); the book falls back to the CDNs.", file=sys.stderr)
        return 1 if args.require else 0
    copy_assets(
        modules, digest("package.json", "package-lock.json", "widgets-paths.js", "search-maths.js", "vendor.py")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
