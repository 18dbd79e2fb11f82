"""What the grading sandbox can import: built here, outside it, before a student's code runs.

Nothing importable inside the sandbox computes the answer being graded:

- **The book's library and tooling** (``attnbook``, ``attnbook_tools``) are there only as a *view*:
  a copy in which the functions and classes an exercise lists in its ``blocks`` (and, while its tests
  run, its ``check_blocks``) are removed at the source: their bodies are replaced by a line that
  raises, in the ``.py`` file and in its compiled ``.pyc``. No copy of the original is in the
  sandbox, so ``importlib.reload``, a fresh loader, ``inspect.getsource`` or reading the file gives
  back only the stub (:func:`library_view`).
- **PyTorch's own attention written in Python**, its FLOP counter's formulas, its masked softmax and
  its causal masks (:data:`TORCH_REMOVED`) are removed the same way from
  the sandbox's view of ``torch`` for every chapter, and its compiled operators that compute what an
  exercise asks for (:data:`TORCH_OPERATORS`) are switched off at PyTorch's dispatcher while that
  chapter is graded (:func:`attnbook_classroom.grading.runner.block_operators`).
- **The grader** is not there: of ``attnbook_classroom``, the sandbox holds only a stand-in
  (:data:`SANDBOX_GRADING`: ``check`` does nothing, the helpers that build an exercise's inputs)
  and the runner's own modules (``runner``, ``wire``, ``seccomp``). The references, the typical
  mistakes, the sealed answers and the harness stay outside.
- **Other packages**: of the virtual environment, only the distributions a chapter's exercises use
  (:data:`SANDBOX_DISTRIBUTIONS` and what they require) are there; the interpreter's own
  ``site-packages`` and the system's are hidden.
"""

from __future__ import annotations

import atexit
import compileall
import functools
import hashlib
import importlib.metadata
import io
import multiprocessing.util
import os
import pathlib
import re
import shutil
import site
import sys
import tempfile
import py_compile
import tokenize
import ast

__all__ = ["LIBRARY_PACKAGES", "TORCH_REMOVED", "TORCH_OPERATORS", "TORCH_HIDDEN", "SANDBOX_DISTRIBUTIONS",
           "strip_source", "library_view", "torch_overlays", "site_packages", "hidden_python_dirs",
           "sandbox_code", "split_blocked", "blocked_message", "work_root"]

LIBRARY_PACKAGES = ("attnbook", "attnbook_tools")

# PyTorch's own implementations of attention in Python, removed from the sandbox's torch for every
# chapter (nothing an exercise notebook runs needs them; the library's modules have their own).
TORCH_REMOVED = {
    # (the docstring of scaled_dot_product_attention spells out an implementation in Python)
    "torch/nn/functional.py": ("multi_head_attention_forward", "scaled_dot_product_attention.__doc__"),
    "torch/nn/modules/activation.py": ("MultiheadAttention",),
    "torch/ao/nn/quantizable/modules/activation.py": ("MultiheadAttention",),
    "torch/_higher_order_ops/flex_attention.py": ("math_attention",),
    "torch/onnx/ops/_impl.py": ("attention_23",),
    # PyTorch's count of FLOPs: the mode that counts, and the formulas of its registry (`flop_registry`),
    # which a dispatch mode of a few lines reads to measure what exercises 8.2 and 9.2 ask to derive
    "torch/utils/flop_counter.py": ("FlopCounterMode", "*_flop", "*_flop_count"),
    # its masked softmax (a softmax over the allowed keys): exercise 7.1 asks for one
    "torch/masked/_ops.py": ("softmax", "log_softmax", "softmin"),
    # its causal masks (top-left and bottom-right, and the square one, which cut to (L, S) is the
    # bottom-right one): exercise 7.2 asks for one; only nn.Transformer's modules, already dead in
    # the sandbox without nn.MultiheadAttention, call them
    "torch/nn/attention/bias.py": ("CausalBias._upper_left", "CausalBias._lower_right"),
    "torch/nn/modules/transformer.py": ("_generate_square_subsequent_mask",),
    # the compiler's patterns of attention (each one written out), which it replaces by sdpa
    "torch/_inductor/fx_passes/fuse_attention.py": ("_sfdp_pattern_*", "_sfdp_replacement_*"),
}
# Folders of torch hidden from the sandbox (none at present: the profiler needs torch._inductor).
TORCH_HIDDEN: tuple[str, ...] = ()
# The names an exercise may block that TORCH_REMOVED covers (documented in the exercises' blocks).
TORCH_REMOVED_NAMES = {
    "torch.nn.functional.multi_head_attention_forward", "torch.nn.MultiheadAttention",
    "torch.nn.modules.activation.MultiheadAttention", "torch.utils.flop_counter.FlopCounterMode",
}
# (torch/masked's softmax is removed for every chapter; the operators that give masked positions
# zero weight, `_masked_softmax` and `_safe_softmax`, are switched off by exercise 7.1's blocks.)

_SDPA = ("scaled_dot_product_attention", "_scaled_dot_product_attention_math",
         "_scaled_dot_product_attention_math_for_mps", "_scaled_dot_product_flash_attention",
         "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_efficient_attention",
         "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_fused_attention_overrideable",
         "_flash_attention_forward", "_efficient_attention_forward", "_cudnn_attention_forward",
         "_native_multi_head_attention", "_triton_multi_head_attention", "_triton_scaled_dot_attention",
         "_transformer_encoder_layer_fwd")
# PyTorch's multi-head attention as compiled operators (the fast path of nn.MultiheadAttention and
# of nn.TransformerEncoderLayer), callable as torch._native_multi_head_attention and the like
_MHA = ("_native_multi_head_attention", "_transformer_encoder_layer_fwd", "_triton_multi_head_attention")
_RMS = ("rms_norm", "_fused_rms_norm")
# Blocked names that are compiled PyTorch operators -> the operators switched off at the dispatcher
# (every route to them: torch.nn.functional, torch.ops.aten, a reloaded module, a decomposition).
TORCH_OPERATORS = {
    "torch.nn.functional.scaled_dot_product_attention": _SDPA,
    "torch.nn.MultiheadAttention": _MHA,
    "torch.nn.functional.multi_head_attention_forward": _MHA,
    "torch.nn.functional.rms_norm": _RMS,
    "torch.nn.RMSNorm": _RMS,
    # a softmax that gives fully-masked rows zero weights is the masked softmax itself; so is the
    # softmax of a sparse tensor holding the allowed scores only (its missing entries get weight 0)
    "attnbook.functional.masked_softmax": ("_safe_softmax", "_masked_softmax", "_sparse_softmax",
                                           "_sparse_log_softmax"),
}

# What a chapter's exercise notebook may import, besides the standard library, the view of the
# library and the stand-in of the grader: the `book` extra of pyproject.toml and what it requires.
SANDBOX_DISTRIBUTIONS = ("torch", "numpy", "matplotlib", "seaborn", "pandas", "ipywidgets", "tqdm")

SANDBOX_GRADING = '''"""The grader as a notebook sees it while it is graded: nothing here grades.

When a class is graded, the test cells are not run in the sandbox: their ``check(...)`` calls are
read and run by the grader outside it. A ``check`` a student's own cell calls here does nothing.
"""

from attnbook_classroom.grading.helpers import causal_mask_choices


class Feedback:
    passed = False
    score, max_score, messages = 0, 0, ["checks run outside the sandbox when the class is graded"]

    def assert_passed(self):
        return self

    def __repr__(self):
        return "check: not run here (the grader checks your answers outside this sandbox)"


def check(*args, **kwargs):
    return Feedback()


__all__ = ["check", "Feedback", "causal_mask_choices"]
'''


def blocked_message(name: str) -> str:
    if name in TORCH_REMOVED_NAMES or name.startswith("torch."):
        return (f"{name} is not available while exercises are graded: PyTorch's own attention, causal "
                "masks, masked softmax and FLOP counts are removed from the grading sandbox.")
    return (f"{name} is not available while this exercise is graded: the exercise asks you to write "
            "it yourself.")


# ------------------------------------------------------------------------------------------------
# Removing a function or class at the source
# ------------------------------------------------------------------------------------------------

def _find(body: list, path: list[str]):
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == path[0]:
            if len(path) == 1:
                return node
            if isinstance(node, ast.ClassDef):
                return _find(node.body, path[1:])
    return None


def _header_end(text_lines: list[str], node) -> tuple[int, int]:
    """(0-based line, column) just after the ':' that ends a def's or a class's header."""
    start = node.lineno - 1
    depth = 0
    reader = io.StringIO("".join(text_lines[start:])).readline
    for tok in tokenize.generate_tokens(reader):
        if tok.type == tokenize.OP:
            if tok.string in "([{":
                depth += 1
            elif tok.string in ")]}":
                depth -= 1
            elif tok.string == ":" and depth == 0:
                return start + tok.end[0] - 1, tok.end[1]
    raise ValueError(f"no header found for {node.name}")


def _functions(node) -> list:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return [node]
    found = []
    for child in node.body:
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found += _functions(child)
    return found


def strip_source(text: str, names: dict[str, str]) -> tuple[str, list[str]]:
    """``text`` (a module's source) with each function or class of ``names`` (qualified name in the
    module -> the message its stub raises) removed: a function's body, or every method of a class,
    becomes ``raise RuntimeError(message)``; a class without an ``__init__`` of its own gets one
    that raises. Returns the new source and the names not found as a def or class."""
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    edits: list[tuple[int, int, str]] = []  # (first line, last line + 1, replacement), 0-based
    missing = []
    for qualname, message in names.items():
        if qualname.endswith(".__doc__"):  # a docstring given by `name = _add_docstr(obj, "...")`
            target = qualname.removesuffix(".__doc__")
            string = next((arg for node in tree.body if isinstance(node, ast.Assign)
                           and any(getattr(t, "id", None) == target for t in node.targets)
                           and isinstance(node.value, ast.Call)
                           for arg in node.value.args[1:]), None)  # the text (a literal, or a sum of them)
            if string is None:
                missing.append(qualname)
            else:
                replacement = repr(f"{target}: its documentation is removed from the grading sandbox.")
                edits.append((string.lineno - 1, string.end_lineno,
                              lines[string.lineno - 1][:string.col_offset] + replacement
                              + lines[string.end_lineno - 1][string.end_col_offset:]))
            continue
        node = _find(tree.body, qualname.split("."))
        if node is None:
            missing.append(qualname)
            continue
        stub = f"raise RuntimeError({message!r})"
        for fn in _functions(node):
            line, col = _header_end(lines, fn)
            rest = lines[line][col:].split("#")[0].strip()
            if rest:  # a one-line def: "def f(x): return x"
                edits.append((line, fn.end_lineno, lines[line][:col] + f" {stub}\n"))
            else:
                indent = " " * fn.body[0].col_offset
                edits.append((line + 1, fn.end_lineno, f"{indent}{stub}\n"))
        if isinstance(node, ast.ClassDef) and not any(
                isinstance(n, ast.FunctionDef) and n.name in ("__init__", "__new__") for n in node.body):
            indent = " " * node.body[0].col_offset
            edits.append((node.end_lineno, node.end_lineno,
                          f"\n{indent}def __init__(self, *args, **kwargs):\n{indent}    {stub}\n"))
    for first, last, replacement in sorted(edits, key=lambda e: e[0], reverse=True):
        lines[first:last] = [replacement]
    return "".join(lines), missing


# ------------------------------------------------------------------------------------------------
# The work folder of this process (views, stripped copies of torch's files, sandbox layouts)
# ------------------------------------------------------------------------------------------------

_ROOT: dict[int, pathlib.Path] = {}


def work_root() -> pathlib.Path:
    """A private folder (0700) of this process, removed when it exits."""
    pid = os.getpid()
    if pid not in _ROOT:
        _ROOT.clear()  # a forked child makes its own
        _ROOT[pid] = pathlib.Path(tempfile.mkdtemp(prefix="attnbook-grading-"))
        atexit.register(_remove_root, pid, _ROOT[pid])
        # a worker of a multiprocessing pool ends with os._exit, which skips atexit; this runs
        multiprocessing.util.Finalize(None, _remove_root, args=(pid, _ROOT[pid]), exitpriority=10)
        _cached_view.cache_clear()
        _torch_overlays.cache_clear()
        _sandbox_code.cache_clear()
    return _ROOT[pid]


def _remove_root(pid: int, path: pathlib.Path) -> None:
    if os.getpid() == pid:
        shutil.rmtree(path, ignore_errors=True)


def _package_dir(name: str) -> pathlib.Path:
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"the package {name} is not installed")
    return pathlib.Path(list(spec.submodule_search_locations)[0]).resolve()


def split_blocked(names) -> tuple[list[str], list[str], list[str]]:
    """Blocked names -> (library names removed at the source, PyTorch operators switched off at the
    dispatcher, names of neither kind)."""
    library, operators, other = [], [], []
    for name in names:
        if name in TORCH_OPERATORS:
            operators += [op for op in TORCH_OPERATORS[name] if op not in operators]
        if name.split(".")[0] in LIBRARY_PACKAGES:
            library.append(name)
        elif name not in TORCH_OPERATORS and name not in TORCH_REMOVED_NAMES:
            other.append(name)
    return sorted(set(library)), operators, other


def _locate(name: str) -> tuple[pathlib.Path, str] | None:
    """A library name -> (its module's file, its qualified name in the module)."""
    parts = name.split(".")
    base = _package_dir(parts[0])
    for i in range(len(parts) - 1, 0, -1):
        inner = parts[1:i]
        candidates = ([base.joinpath(*inner).with_suffix(".py")] if inner else []) + [base.joinpath(*inner, "__init__.py")]
        for candidate in candidates:
            if candidate.is_file():
                return candidate, ".".join(parts[i:])
    return None


def library_view(names) -> pathlib.Path:
    """A folder holding ``attnbook`` and ``attnbook_tools`` with the library names among ``names``
    removed at the source, compiled (made once per set of names in this process). Raises
    ``LookupError`` for a name that is not a def or class of the library."""
    library, _, _ = split_blocked(names)
    return _cached_view(tuple(library))


@functools.lru_cache(maxsize=None)
def _cached_view(library: tuple[str, ...]) -> pathlib.Path:
    by_file: dict[pathlib.Path, dict[str, str]] = {}
    for name in library:
        found = _locate(name)
        if found is None:
            raise LookupError(f"{name}: no such module in the library")
        path, qualname = found
        by_file.setdefault(path, {})[qualname] = blocked_message(name)
    key = hashlib.sha256("\0".join(library).encode()).hexdigest()[:16]
    folder = work_root() / "views" / key
    if folder.exists():
        shutil.rmtree(folder)
    for package in LIBRARY_PACKAGES:
        source = _package_dir(package)
        shutil.copytree(source, folder / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for path, names in by_file.items():
        package = next(p for p in LIBRARY_PACKAGES if _package_dir(p) in path.parents)
        target = folder / package / path.relative_to(_package_dir(package))
        text, missing = strip_source(path.read_text(), names)
        if missing:
            raise LookupError(f"{', '.join(missing)}: not a def or class in {path.name}")
        target.write_text(text)
    compileall.compile_dir(str(folder), quiet=2, workers=1,
                           invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    return folder


# ------------------------------------------------------------------------------------------------
# The sandbox's view of torch and of the other packages
# ------------------------------------------------------------------------------------------------

def _site_dir(package: str) -> pathlib.Path:
    return _package_dir(package).parent


def torch_overlays() -> tuple[list[tuple[str, str]], list[str]]:
    """(host file, path it is mounted over) for torch's stripped files and their hidden .pyc files,
    and torch's folders to hide."""
    return _torch_overlays()


@functools.lru_cache(maxsize=None)
def _torch_overlays():
    site_dir = _site_dir("torch")
    folder = work_root() / "torch"
    empty = work_root() / "empty-file"
    empty.touch()
    overlays = []
    for relative, names in TORCH_REMOVED.items():
        original = site_dir / relative
        if not original.is_file():
            continue
        module = relative.removesuffix(".py").replace("/", ".")
        text = original.read_text()
        defined = [n.name for n in ast.parse(text).body
                   if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        chosen = [d for d in defined if any(d == n or (n.endswith("*") and d.startswith(n[:-1]))
                                            or (n.startswith("*") and d.endswith(n[1:])) for n in names)]
        chosen += [n for n in names if "*" not in n and n not in chosen]  # (and __doc__ entries)
        text, missing = strip_source(text, {n: blocked_message(f"{module}.{n}") for n in chosen})
        if missing:
            raise LookupError(f"{', '.join(missing)}: not found in {original}")
        target = folder / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        overlays.append((str(target), str(original)))
        cache = original.parent / "__pycache__"
        for pyc in sorted(cache.glob(f"{original.stem}.*.pyc")):
            overlays.append((str(empty), str(pyc)))
    hidden = [str(site_dir / d) for d in TORCH_HIDDEN if (site_dir / d).is_dir()]
    return overlays, hidden


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@functools.lru_cache(maxsize=1)
def site_packages() -> list[str]:
    """The paths of the site-packages entries (packages, modules, their metadata) of
    :data:`SANDBOX_DISTRIBUTIONS` and every distribution they require."""
    from packaging.requirements import Requirement

    seen, todo, entries = set(), list(SANDBOX_DISTRIBUTIONS), set()
    while todo:
        name = todo.pop()
        if _normal(name) in seen:
            continue
        seen.add(_normal(name))
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        base = pathlib.Path(dist.locate_file("")).resolve()
        for first in {file.parts[0] for file in dist.files or [] if file.parts}:
            if first in ("..", "bin") or first.endswith(".pth") or first == "__pycache__":
                continue
            entries.add(str(base / first))
        for requirement in dist.requires or []:
            req = Requirement(requirement)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return sorted(e for e in entries if os.path.exists(e))


def hidden_python_dirs() -> list[str]:
    """Folders of Python packages the sandbox must not see (the interpreter's and the system's)."""
    candidates = set(site.getsitepackages([sys.base_prefix]) if hasattr(site, "getsitepackages") else [])
    for pattern in ("/usr/lib/python3*/dist-packages", "/usr/lib/python3*/site-packages",
                    "/usr/local/lib/python3*/dist-packages", "/usr/local/lib/python3*/site-packages",
                    "/usr/lib/python3/dist-packages"):
        candidates.update(str(p) for p in pathlib.Path("/").glob(pattern.lstrip("/")))
    allowed = {str(pathlib.Path(p).parent) for p in site_packages()}
    return sorted(c for c in candidates if os.path.isdir(c) and os.path.realpath(c) not in allowed)


def sandbox_code() -> pathlib.Path:
    """The grader's part of the sandbox: ``attnbook_classroom/grading/`` with the runner's modules,
    the helpers and the stand-in ``__init__`` (:data:`SANDBOX_GRADING`)."""
    return _sandbox_code()


@functools.lru_cache(maxsize=None)
def _sandbox_code() -> pathlib.Path:
    here = pathlib.Path(__file__).resolve().parent
    folder = work_root() / "code"
    grading = folder / "attnbook_classroom" / "grading"
    grading.mkdir(parents=True, exist_ok=True)
    (folder / "attnbook_classroom" / "__init__.py").write_text(
        '"""The attention book\'s classroom, as the grading sandbox sees it: the runner only."""\n')
    (grading / "__init__.py").write_text(SANDBOX_GRADING)
    for name in ("runner.py", "wire.py", "seccomp.py", "helpers.py"):
        shutil.copy(here / name, grading / name)
    compileall.compile_dir(str(folder), quiet=2, workers=1,
                           invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    return folder
