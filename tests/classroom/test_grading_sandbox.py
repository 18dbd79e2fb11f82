"""The sandbox that records scores: real bubblewrap, hostile submissions, no mocks.

Each submission is a small notebook in the book's exercise format (code cells, then test cells of
``check(...)`` calls); :func:`grade_in_sandbox` runs it in a bubblewrap sandbox and judges the
results outside. The hostile cells try what a student could try: read or write the course folder,
the network, fork, patch the grader or PyTorch's comparisons, use the package's own answer, loop
forever, exhaust memory, flood the grader, exit, kill the grading process.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pathlib

import nbformat
import pytest

from attnbook_classroom.grading.sandbox import Sandbox, SandboxUnavailable, bwrap_command
from attnbook_classroom.grading.submission import Submission, BadTestCell, grade_in_sandbox, parse_test_cell

SECRET = bytes(range(32))
REPO = pathlib.Path(__file__).resolve().parents[2]


def notebook(cells: list[str], tests: dict[str, str]) -> nbformat.NotebookNode:
    """Code cells, then one locked test cell per (grade id, source)."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    for grade_id, src in tests.items():
        cell = nbformat.v4.new_code_cell(src)
        cell.metadata["nbgrader"] = {"grade": True, "grade_id": grade_id, "locked": True, "points": 1,
                                     "schema_version": 3, "solution": False, "task": False}
        nb.cells.append(cell)
    return nb


def submission(nb, student="alice", **limits) -> Submission:
    return Submission(nb, secret=SECRET, student=student, assignment="hw", **{"cell_limit": 3.0,
                                                                                 "total_limit": 40.0, **limits})


def cell_errors(verdicts, nb) -> dict[str, str]:
    """First line of each cell's source -> what went wrong in it."""
    return {nb.cells[i].source.splitlines()[0]: text for i, text in verdicts.cells.items()}


@pytest.fixture(scope="module")
def course_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("course")
    (root / "course_secret").write_text("00" * 32)
    (root / "source").mkdir()
    (root / "source" / "answers.txt").write_text("the instructor's solutions")
    return root


TOKEN = "attnbook-test-token-5c1e"  # in the grading process's environment while the hostile run is graded

# What a cell reads of the grading process (every /proc/<pid>/environ, the supervisor's pipes) or
# writes outside the private /tmp; each raises with what it saw, so the verdict carries it.
SNOOPING = [
    "import glob\nseen = b''\nfor p in glob.glob('/proc/[0-9]*/environ'):\n    try:\n        seen += open(p, 'rb').read()\n"
    "    except OSError as exc:\n        seen += str(exc).encode()\nraise RuntimeError(repr(seen))",
    "import os\nopened = []\nfor fd in os.listdir('/proc/1/fd'):\n    try:\n        os.open('/proc/1/fd/' + fd, os.O_WRONLY)\n"
    "        opened.append(fd)\n    except OSError:\n        pass\nraise RuntimeError(f'opened {opened}')",
    "open('/dev/shm/x', 'wb').write(b'x')",
    "open('/dev/x', 'wb').write(b'x')",
    "open('/x', 'wb').write(b'x')",
    "for i in range(6):\n    open(f'/tmp/fill{i}', 'wb').write(b'x' * (15 << 20))",
    "import os\nos.memfd_create('hidden')",
    "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "raise RuntimeError(f'shmget {libc.shmget(0, 1 << 30, 0o1777)} errno {ctypes.get_errno()}')",
    "import os, signal\nos.kill(1, signal.SIGINT)\nos.kill(1, signal.SIGKILL)",
    "import os\nos.execv('/bin/sh', ['sh', '-c', 'true'])",
]


# Chapter 7's exercises answered by what the sandbox might let a student import: the package's
# function brought back by every import mechanism, PyTorch's own attention, the grader's references,
# sealed answers and harness. Name -> (cell, test cell). None may earn a point.
IMPORT_ATTACKS = {
    "reloaded": ("import importlib, attnbook.masks\ndef reloaded(L, S):\n"
                 "    return importlib.reload(attnbook.masks).causal_mask(L, S)",
                 'check("causal_mask", reloaded, part="square")'),
    "fresh": ("import importlib.util, attnbook.masks\ndef fresh(L, S):\n"
              "    spec = importlib.util.spec_from_file_location('fresh_masks', attnbook.masks.__file__)\n"
              "    module = importlib.util.module_from_spec(spec)\n    spec.loader.exec_module(module)\n"
              "    return module.causal_mask(L, S)", 'check("causal_mask", fresh, part="square")'),
    "source": ("import inspect, attnbook.masks\ndef source(L, S):\n    namespace = {}\n"
               "    exec(inspect.getsource(attnbook.masks), namespace)\n    return namespace['causal_mask'](L, S)",
               'check("causal_mask", source, part="square")'),
    "pyc": ("import importlib.util, marshal, attnbook.masks\ndef pyc(L, S):\n"
            "    data = open(importlib.util.cache_from_source(attnbook.masks.__file__), 'rb').read()\n"
            "    namespace = {'__name__': 'from_pyc'}\n    exec(marshal.loads(data[16:]), namespace)\n"
            "    return namespace['causal_mask'](L, S)", 'check("causal_mask", pyc, part="square")'),
    "memory": ("import gc\ndef memory(L, S):\n    for obj in gc.get_objects():\n"
               "        if callable(obj) and getattr(obj, '__name__', '') == 'causal_mask':\n"
               "            try:\n                return obj(L, S)\n            except Exception:\n                pass",
               'check("causal_mask", memory, part="square")'),
    "grader": ("def grader(L, S):\n    from attnbook_classroom.grading.ch07_masking import causal_mask\n"
               "    return causal_mask(L, S)", 'check("causal_mask", grader, part="square")'),
    "library": ("from attnbook.functional import attention\nfrom attnbook.masks import combine_masks\n"
                "def library(q, k, v, mask, additive):\n"
                "    return attention(q, k, v, mask=combine_masks(additive, mask))[0]",
                'check("masked_attention", library, part="values")'),
    "sdpa": ("import torch.nn.functional as F\ndef sdpa(q, k, v, mask, additive):\n"
             "    return F.scaled_dot_product_attention(q, k, v, attn_mask=additive.masked_fill(~mask, float('-inf')))",
             'check("masked_attention", sdpa, part="values")'),
    "aten": ("import torch\ndef aten(q, k, v, mask, additive):\n    bias = additive.masked_fill(~mask, float('-inf'))\n"
             "    return torch.ops.aten._scaled_dot_product_attention_math.default.decompose(q, k, v, bias)[0]",
             'check("masked_attention", aten, part="values")'),
    "safe_softmax": ("import math, torch\ndef safe_softmax(q, k, v, mask, additive):\n"
                     "    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + additive\n"
                     "    return torch._safe_softmax(scores.masked_fill(~mask, float('-inf')), -1) @ v",
                     'check("masked_attention", safe_softmax, part="empty_row")'),
    "mha": ("import torch\ndef mha(q, k, v, mask, additive):\n"
            "    layer = torch.nn.MultiheadAttention(q.shape[-1], 1, batch_first=True)\n"
            "    return layer(q, k, v, attn_mask=~mask)[0]", 'check("masked_attention", mha, part="values")'),
    "flex": ("from torch._higher_order_ops.flex_attention import math_attention\n"
             "def flex(q, k, v, mask, additive):\n"
             "    return math_attention(q, k, v, lambda s, *i: s, (q.shape[1], k.shape[1]), 1.0, {})[0]",
             'check("masked_attention", flex, part="values")'),
    "docstring": ("import torch.nn.functional as F\ndoc = F.scaled_dot_product_attention.__doc__\n"
                  "def docstring(q, k, v, mask, additive):\n"
                  "    namespace = {}\n    exec('import math, torch\\ndef scaled_dot_product_attention' +"
                  " doc.split('def scaled_dot_product_attention')[1].split('.. warning')[0], namespace)\n"
                  "    return namespace['scaled_dot_product_attention'](q, k, v, additive.masked_fill(~mask, float('-inf')))",
                  'check("masked_attention", docstring, part="values")'),
    "sealed": ("sealed = {}\nfrom attnbook_classroom.grading.ch07_masking import PICK_NOTES\n"
               "for letters in ('A', 'C', 'AC', 'BD', 'CD'):\n    if PICK_NOTES.holds('square=' + letters):\n"
               "        sealed['square'] = letters", 'check("pick_causal_mask", sealed, part="square")'),
    "harness": ("harness = {}\nfrom attnbook_classroom.grading.harness import PendingPart\n"
                "for letters in ('A', 'C', 'AC', 'BD', 'CD'):\n"
                "    if not PendingPart('pick_causal_mask', 'square', 0).finish([{'ok': True, 'value': letters}]):\n"
                "        harness['square'] = letters", 'check("pick_causal_mask", harness, part="square")'),
    "oracle": ("from attnbook_classroom.grading import check as oracle_check\noracle = {'square': 'A'}\n"
               "for letters in ('A', 'C', 'AC', 'BD', 'CD'):\n"
               "    if oracle_check('pick_causal_mask', {'square': letters}, part='square').passed:\n"
               "        oracle['square'] = letters", 'check("pick_causal_mask", oracle, part="square")'),
    "reference": ("from attnbook_classroom.grading.ch07_masking import after_softmax_measures\n"
                  "reference = {'seed': 0, **after_softmax_measures(0)}",
                  'check("mask_after_softmax", reference, part="lost")'),
}
# Markers of what must be nowhere in the sandbox (in any file of code or text): a line of the
# package's causal_mask, names of the grader's references and sealed tables, a line of PyTorch's own
# multi-head attention, of the implementation its documentation spells out.
MARKERS = [b"return j <= i + (S - L)", b"PICK_NOTES", b"after_softmax_measures", b"masked_attention_variants",
           b"attn_output_weights = softmax(attn_output_weights", b"attn_weight = torch.softmax(attn_weight"]
TEXT = (".py", ".pyc", ".pyi", ".json", ".txt", ".md", ".ipynb", ".cfg", ".toml", ".yml", ".yaml", ".csv", ".html")
SEARCH = ("import os\nfound = set()\nfor root, dirs, files in os.walk('/'):\n"
          "    if root in ('/proc', '/sys', '/dev'):\n        dirs[:] = []\n        continue\n"
          "    for name in files:\n        path = os.path.join(root, name)\n"
          f"        if not name.endswith({TEXT!r}):\n            continue  # code and text, where a copy would be\n"
          "        try:\n"
          "            if os.path.isfile(path) and not os.path.islink(path) and os.path.getsize(path) < 8 << 20:\n"
          "                data = open(path, 'rb').read()\n"
          f"                found.update(m.decode() + ' in ' + path for m in {MARKERS!r} if m in data)\n"
          "        except OSError:\n            pass\nraise RuntimeError(f'found {sorted(found)}')")


# Routes to a computation an exercise blocks that reach PyTorch's own implementation of it by another
# door than its name: functorch's transforms (vmap runs a batching rule or a decomposition of its
# own, at dispatch keys of its own), the native multi-head operator, the FLOP counter's formulas
# read by a dispatch mode, torch.masked's softmax, PyTorch's causal masks, and exercise 7.3's helper
# (whose masks include the causal one) called for exercise 7.2. Each is a notebook of its own (graded with its chapter's
# blocks) -> (cells, {grade id: test cell}); none may earn a point.
ROUTE_ATTACKS = {
    "vmap_sdpa": (["import torch, torch.nn.functional as F\n"
                   "def vmapped(q, k, v):\n"
                   "    flat = lambda t: t.reshape(-1, *t.shape[-2:])\n"
                   "    out = torch.func.vmap(F.scaled_dot_product_attention)(flat(q), flat(k), flat(v))\n"
                   "    return out.reshape(*q.shape[:-1], v.shape[-1])"],
                  {"no_mask": 'check("scaled_dot_product_attention", vmapped, part="no_mask")',
                   "heads": 'check("scaled_dot_product_attention", vmapped, part="heads")',
                   "fp16": 'check("scaled_dot_product_attention", vmapped, part="fp16")'}),
    "vmap_gqa": (["import torch, torch.nn.functional as F\n"
                  "def gqa(q, k, v, mask=None):\n"
                  "    sdpa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)\n"
                  "    return torch.func.vmap(sdpa)(q, k, v)"],
                 {"groups": 'check("grouped_query_attention", gqa, part="groups")',
                  "multi_query": 'check("grouped_query_attention", gqa, part="multi_query")',
                  "mask": 'check("grouped_query_attention", gqa, part="mask")'}),
    "grad_sdpa": (["import torch, torch.nn.functional as F\n"
                   "def through_grad(q, k, v):\n"
                   "    out = {}\n"
                   "    def f(q):\n        out['o'] = F.scaled_dot_product_attention(q, k, v)\n        return out['o'].sum()\n"
                   "    torch.func.grad(f)(q.double())\n"
                   "    return out['o'].to(q.dtype)"],
                  {"no_mask": 'check("scaled_dot_product_attention", through_grad, part="no_mask")'}),
    "jvp_sdpa": (["import torch, torch.nn.functional as F\n"
                  "def through_jvp(q, k, v):\n"
                  "    return torch.func.jvp(lambda q: F.scaled_dot_product_attention(q, k, v), (q,), (torch.zeros_like(q),))[0]"],
                 {"no_mask": 'check("scaled_dot_product_attention", through_jvp, part="no_mask")'}),
    "native_mha": (["import torch\n"
                    "def native(query, key, value, W_q, W_k, W_v, W_o, num_heads, mask=None):\n"
                    "    E = query.shape[-1]\n"
                    "    L, S = query.shape[1], key.shape[1]  # the operator wants L = S: pad the queries\n"
                    "    padded = torch.cat([query, query.new_zeros(query.shape[0], S - L, E)], 1) if S > L else query\n"
                    "    m = None if mask is None else ~torch.cat([mask, mask.new_ones(mask.shape[0], S - L, S)], 1)[:, None]\n"
                    "    m = None if m is None else m.expand(-1, num_heads, -1, -1).contiguous()\n"
                    "    return torch._native_multi_head_attention(padded, key, value, E, num_heads,\n"
                    "        torch.cat([W_q, W_k, W_v]), torch.zeros(3 * E), W_o, torch.zeros(E), m, False)[0][:, :L].nan_to_num(0.0)"],
                   {"values": 'check("multi_head_forward", native, part="values")',
                    "mask": 'check("multi_head_forward", native, part="mask")',
                    "structure": 'check("multi_head_forward", native, part="structure")'}),
    "flop_registry": (["import torch\nfrom torch.utils._python_dispatch import TorchDispatchMode\n"
                       "from torch.utils.flop_counter import flop_registry\nfrom torch.utils._pytree import tree_map\n"
                       "class Count(TorchDispatchMode):\n"
                       "    total = 0\n"
                       "    def __torch_dispatch__(self, func, types, args=(), kwargs=None):\n"
                       "        out = func(*args, **(kwargs or {}))\n"
                       "        if func._overloadpacket in flop_registry:\n"
                       "            Count.total += flop_registry[func._overloadpacket](*args, **(kwargs or {}), out_val=out)\n"
                       "        return out\n"
                       "def measured(B, L, S, E, num_heads):\n"
                       "    from attnbook.multihead import MultiHeadAttention\n"
                       "    module = MultiHeadAttention(E, num_heads).eval()\n"
                       "    Count.total = 0\n"
                       "    with torch.no_grad(), Count():\n"
                       "        module(torch.zeros(B, L, E), torch.zeros(B, S, E), torch.zeros(B, S, E))\n"
                       "    return Count.total"],
                      {"self_attention": 'check("multi_head_flops", measured, part="self_attention")',
                       "cross_attention": 'check("multi_head_flops", measured, part="cross_attention")'}),
    "torch_masked": (["import torch\n"
                      "def via_masked(scores, mask):\n"
                      "    return torch.masked.softmax(scores, -1, mask=mask.expand_as(scores)).nan_to_num(0.0).to(scores.dtype)"],
                     {p: f'check("masked_softmax", via_masked, part="{p}")'
                      for p in ("values", "fully_masked", "broadcast", "fp16", "large_scores")}),
    "masked_tensor": (["import torch\nfrom torch.masked import masked_tensor\n"
                       "def via_masked_tensor(scores, mask):\n"
                       "    mt = masked_tensor(scores, mask.expand_as(scores).contiguous())\n"
                       "    return mt.softmax(-1).get_data().masked_fill(~mask, 0).nan_to_num(0.0)"],
                      {"values": 'check("masked_softmax", via_masked_tensor, part="values")'}),
    "sparse_softmax": (["import torch\n"
                        "def via_sparse(scores, mask):  # a sparse tensor of the allowed scores: the rest get 0\n"
                        "    mask = mask.expand_as(scores)\n"
                        "    allowed = torch.sparse_coo_tensor(mask.nonzero().T, scores[mask].float(), scores.shape)\n"
                        "    return torch.sparse.softmax(allowed, -1).to_dense().to(scores.dtype)"],
                       {p: f'check("masked_softmax", via_sparse, part="{p}")'
                        for p in ("values", "fully_masked", "broadcast", "fp16", "large_scores")}),
    "causal_bias": (["from torch.nn.attention.bias import causal_lower_right\n"
                     "def lower_right(L, S):\n    return causal_lower_right(L, S)._materialize()"],
                    {p: f'check("causal_mask", lower_right, part="{p}")'
                     for p in ("square", "more_keys", "one_query", "fewer_keys")}),
    "square_mask": (["import torch\n"
                     "def cut(L, S):  # the square causal mask of the longer side, its last L rows and S columns\n"
                     "    return ~torch.nn.Transformer.generate_square_subsequent_mask(max(L, S))[-L:, -S:].isinf()"],
                    {p: f'check("causal_mask", cut, part="{p}")'
                     for p in ("square", "more_keys", "one_query", "fewer_keys")}),
    # OPEN: the profiler's own FLOP estimates (computed in C++ when with_flops=True, also written into
    # an exported trace) measure what exercise 8.2 asks to derive; marked xfail below until closed
    "profiler_flops": (["import torch\n"
                        "def profiled(B, L, S, E, num_heads):\n"
                        "    from attnbook.multihead import MultiHeadAttention\n"
                        "    module = MultiHeadAttention(E, num_heads).eval()\n"
                        "    with torch.no_grad(), torch.profiler.profile(with_flops=True) as p:\n"
                        "        module(torch.zeros(B, L, E), torch.zeros(B, S, E), torch.zeros(B, S, E))\n"
                        "    return int(sum(e.flops for e in p.events() if e.flops and e.name != 'aten::mul'))"],
                       {"self_attention": 'check("multi_head_flops", profiled, part="self_attention")',
                        "cross_attention": 'check("multi_head_flops", profiled, part="cross_attention")'}),
    "mask_choices": (["from attnbook_classroom.grading import causal_mask_choices\n"
                      "def borrowed(L, S):\n    return causal_mask_choices(L, S)['C']"],
                     {p: f'check("causal_mask", borrowed, part="{p}")'
                      for p in ("square", "more_keys", "one_query", "fewer_keys")}),
}

# What each route's tests must say: the operator, function or helper that refused.
ROUTE_REFUSALS = {
    "vmap_sdpa": "torch's scaled_dot_product_attention is not available while this exercise is graded",
    "vmap_gqa": "torch's scaled_dot_product_attention is not available while this exercise is graded",
    "grad_sdpa": "torch's scaled_dot_product_attention is not available while this exercise is graded",
    "jvp_sdpa": "torch's scaled_dot_product_attention is not available while this exercise is graded",
    "native_mha": "torch's _native_multi_head_attention is not available while this exercise is graded",
    "flop_registry": "torch.utils.flop_counter.addmm_flop is not available while exercises are graded",
    "torch_masked": "torch.masked._ops.softmax is not available while exercises are graded",
    "masked_tensor": "torch's _masked_softmax is not available while this exercise is graded",
    "sparse_softmax": "torch's _sparse_softmax is not available while this exercise is graded",
    "causal_bias": "torch.nn.attention.bias.CausalBias._lower_right is not available while exercises are graded",
    "square_mask": ("torch.nn.modules.transformer._generate_square_subsequent_mask is not available while "
                    "exercises are graded"),
    "profiler_flops": "not available while",
    "mask_choices": "causal_mask_choices: (L, S) must be one of exercise 7.3's situations",
}


@pytest.fixture(scope="module")
def route_run():
    subs = [Submission(notebook(*ROUTE_ATTACKS[name]), secret=SECRET, student="mallory", assignment=name,
                       cell_limit=20.0, total_limit=120.0) for name in ROUTE_ATTACKS]
    with Sandbox([]) as sandbox:
        return dict(zip(ROUTE_ATTACKS, grade_in_sandbox(subs, sandbox=sandbox)))


OPEN_ROUTES = {"profiler_flops": "torch.profiler's FLOP estimates (with_flops=True) still answer exercise 8.2"}


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.xfail(reason=OPEN_ROUTES[name], strict=True))
                                  if name in OPEN_ROUTES else name for name in ROUTE_ATTACKS])
def test_no_route_around_a_blocked_computation_scores(route_run, name):
    """Each route (the issue's attacks, which scored before: vmap of F.scaled_dot_product_attention
    on exercises 0.2 and 11.1, torch._native_multi_head_attention on 8.3/8.4, the FLOP registry on
    8.2, torch.masked.softmax on 7.1, causal_mask_choices and PyTorch's causal masks on 7.2) runs
    without error in its cells and earns no point: its tests fail with the refusal of what it reached."""
    verdicts = route_run[name]
    assert not verdicts.cells, verdicts.cells
    for grade_id, test in verdicts.tests.items():
        assert not test["passed"], (grade_id, test)
        assert ROUTE_REFUSALS[name] in "\n".join(test["messages"]), (grade_id, test["messages"])


# Chapter 0: `attention` is blocked only while the tests run (exercise 0.4's experiment uses it in
# its cell). Saved, copied from its code, or stashed as source in /tmp while the cells run, it still
# fails the tests, which run in a second pass whose view never had it (and whose /tmp is new).
SAVING = [
    "import inspect, os, types\nimport attnbook.functional as functional\nfrom attnbook.functional import attention\n"
    "saved = attention\ncopied = types.FunctionType(attention.__code__, attention.__globals__, 'copied', attention.__defaults__)\n"
    "copied.__kwdefaults__ = attention.__kwdefaults__\n"
    "if not os.path.exists('/tmp/stash.py'):\n    open('/tmp/stash.py', 'w').write(inspect.getsource(functional))",
    "def via_saved(q, k, v, mask=None):\n    return saved(q, k, v, mask)[0]",
    "def via_copy(q, k, v, mask=None):\n    return copied(q, k, v, mask)[0]",
    "def via_stash(q, k, v, mask=None):\n    namespace = {'__name__': 'stash'}\n"
    "    exec(open('/tmp/stash.py').read(), namespace)\n    return namespace['attention'](q, k, v, mask)[0]",
    "def shapes(B, H, L, S, D, Dv):  # a prediction read off the package's attention\n"
    "    import torch\n    out, weights = attention(torch.zeros(B, H, L, D), torch.zeros(B, H, S, D), torch.zeros(B, H, S, Dv))\n"
    "    return tuple(weights.shape), tuple(out.shape)",
    "import math, torch\ndef mine(q, k, v, mask=None):\n    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])\n"
    "    if mask is not None:\n        scores = scores.masked_fill(~mask, float('-inf'))\n"
    "    return torch.softmax(scores, -1).nan_to_num(0.0) @ v",
]


def _sharp_scale_solution() -> str:
    """Exercise 0.4's solution cell (its experiment calls the package's attention)."""
    from attnbook_classroom.course.notebooks import exercise_notebook

    nb = exercise_notebook(REPO / "chapters" / "00_attention_at_a_glance.ipynb")
    return next(c.source for c in nb.cells if c.cell_type == "code" and "answer" in c.source
                and "BEGIN SOLUTION" in c.source and "attention" in c.source)


@pytest.fixture(scope="module")
def hostile_run(course_folder):
    root = str(course_folder)
    cells = SNOOPING + [
        "import os, socket, torch",
        f"secret = open({root + '/course_secret'!r}).read()",
        f"open({root + '/pwned.txt'!r}, 'w').write('x')",
        "open('/tmp/scratch.txt', 'w').write('a private /tmp works')",
        f"seen = os.listdir({str(REPO)!r})\nassert not {{'chapters', 'tests', '_build', 'README.md'}} & set(seen), seen",
        "os.fork()",
        "socket.create_connection(('1.1.1.1', 53), timeout=2)",
        # patching the comparisons, the grader and its feedback
        "torch.allclose = lambda *a, **k: True\ntorch.equal = lambda *a, **k: True\n"
        "import attnbook_classroom.grading as g, attnbook_classroom.grading.compare as c\n"
        "g.Feedback.assert_passed = lambda self: self\nc.same = lambda *a, **k: True",
        "def wrong_mask(L, S):\n    return torch.zeros(L, S, dtype=torch.bool)",
        "def sneaky(L, S):\n    import attnbook_classroom.grading.harness as h\n"
        "    h.PendingPart.finish = lambda self, raws: []\n    return torch.zeros(L, S, dtype=torch.bool)",
        "from attnbook.masks import causal_mask\nborrowed = causal_mask",
        "def good(L, S):\n    return torch.ones(L, S, dtype=torch.bool).tril(S - L)",
        "def table(L, S):  # right on the visible sizes only\n"
        "    if (L, S) in ((5, 5), (3, 7), (1, 6), (5, 3)):\n        return good(L, S)\n"
        "    return torch.ones(L, S, dtype=torch.bool)",
        "os._exit(3)",
        "def looping(L, S):\n    while True:\n        pass",
        "def huge(L, S):\n    return torch.zeros(20_000_000)",
        "def hog(L, S):\n    return torch.empty(10**10)",
        "while True:\n    pass",
    ]
    tests = {
        "t-wrong": 'check("causal_mask", wrong_mask, part="square")',
        "t-sneaky": 'check("causal_mask", sneaky, part="square")',
        "t-borrowed": 'check("causal_mask", borrowed, part="square")',
        "t-good": 'check("causal_mask", good, part="square")\n### BEGIN HIDDEN TESTS\n'
                  'check("causal_mask", good, part="square", seed=1)\n### END HIDDEN TESTS',
        "t-table": 'check("causal_mask", table, part="more_keys")\n### BEGIN HIDDEN TESTS\n'
                   'check("causal_mask", table, part="more_keys", seed=1)\n### END HIDDEN TESTS',
        "t-looping": 'check("causal_mask", looping, part="square")\ncheck("causal_mask", looping, part="one_query")',
        "t-huge": 'check("causal_mask", huge, part="square")',
        "t-hog": 'check("causal_mask", hog, part="square")',
        "t-after": 'check("causal_mask", good, part="fewer_keys")',
    }
    hostile = notebook(cells, tests)
    killer = notebook(["import os, torch", "def killer(L, S):\n    os.kill(os.getppid(), 9)",
                       "def good(L, S):\n    return torch.ones(L, S, dtype=torch.bool).tril(S - L)"],
                      {"k1": 'check("causal_mask", killer, part="square")',
                       "k2": 'check("causal_mask", good, part="square")'})
    after = notebook(["import torch\ndef good(L, S):\n    return torch.ones(L, S, dtype=torch.bool).tril(S - L)"],
                     {"a1": 'check("causal_mask", good, part="square")'})
    attacks = notebook([cell for cell, _ in IMPORT_ATTACKS.values()], {name: test for name, (_, test) in IMPORT_ATTACKS.items()})
    search = notebook([SEARCH], {"s": 'check("causal_mask", good, part="square")'})
    saved = notebook(SAVING + [_sharp_scale_solution()], {
        "saved": 'check("scaled_dot_product_attention", via_saved, part="heads")',
        "copied": 'check("scaled_dot_product_attention", via_copy, part="heads")',
        "stashed": 'check("scaled_dot_product_attention", via_stash, part="heads")',
        "mine": 'check("scaled_dot_product_attention", mine, part="heads")',
        "shapes": 'check("weights_shape", shapes, part="weights")',
        "sharp": 'check("sharp_scale", answer, part="value")'})
    subs = [submission(hostile), submission(killer), submission(after), submission(attacks),
            submission(search, cell_limit=120.0, total_limit=150.0), submission(saved)]
    sleepy = submission(notebook(["import time", "time.sleep(60)", "time.sleep(60)", SAVING[-1]],
                                 {"z": 'check("scaled_dot_product_attention", mine, part="heads")'}))
    os.environ["ATTNBOOK_TEST_TOKEN"] = TOKEN
    try:
        with Sandbox([course_folder]) as sandbox:
            verdicts = grade_in_sandbox(subs, sandbox=sandbox)
            verdicts.append(sleepy.judge(sleepy.run(sandbox, budget=4.0)))  # 4 s left of the student's time
    finally:
        del os.environ["ATTNBOOK_TEST_TOKEN"]
    return hostile, verdicts


def test_nothing_of_the_grading_process_is_reachable_and_only_tmp_is_writable(hostile_run):
    """The environment of the grading process (and of bubblewrap) never reaches the sandbox; the
    sandbox's process 1 is the runner, whose pipes a worker cannot open and which ignores its
    signals; /dev/shm, /dev and / are read-only; /tmp is capped; memory no limit counts (memfd,
    System V shared memory) and exec are refused."""
    nb, (verdicts, *_) = hostile_run
    errors = [verdicts.cells.get(i) for i in range(len(SNOOPING))]
    environ, pipes, shm, dev, root, fill, memfd, shmget, signals, execv = errors
    assert TOKEN not in environ and "PATH=/usr/bin:/bin" in environ, environ  # the runner's own, set here
    assert "Permission denied: '/proc/1/environ'" in environ  # process 1 is the runner, not dumpable
    assert pipes == "RuntimeError: opened []", pipes
    for error in (shm, dev, root):
        assert error.startswith("OSError") and "Read-only file system" in error, error
    assert "No space left on device" in fill, fill
    assert memfd.startswith("PermissionError") and execv.startswith("PermissionError"), (memfd, execv)
    assert shmget == "RuntimeError: shmget -1 errno 1", shmget
    assert signals is None or "ProcessEnded" not in signals  # the runner survived SIGINT and SIGKILL
    assert not any(TOKEN in text for text in verdicts.cells.values())


def test_hostile_cells_cannot_reach_the_course_the_network_or_new_processes(hostile_run, course_folder):
    nb, (verdicts, *_) = hostile_run
    errors = cell_errors(verdicts, nb)
    assert errors["secret = open(" + repr(str(course_folder) + "/course_secret") + ").read()"].startswith(
        "FileNotFoundError")
    assert errors[f"open({str(course_folder) + '/pwned.txt'!r}, 'w').write('x')"].startswith(
        ("FileNotFoundError", "OSError"))
    assert not (course_folder / "pwned.txt").exists()
    assert "open('/tmp/scratch.txt', 'w').write('a private /tmp works')" not in errors
    assert f"seen = os.listdir({str(REPO)!r})" not in errors  # only Python, the package and data/ are there
    assert errors["os.fork()"].startswith("PermissionError")
    assert errors["socket.create_connection(('1.1.1.1', 53), timeout=2)"].startswith("OSError")
    assert "ProcessEnded" in errors["os._exit(3)"] and "exited with code 3" in errors["os._exit(3)"]
    assert "CellTimeoutError" in errors["while True:"]


def test_patching_the_grader_or_torch_changes_no_verdict(hostile_run):
    _, (verdicts, *_) = hostile_run
    assert not verdicts.tests["t-wrong"]["passed"]
    assert "differs from the expected one" in verdicts.tests["t-wrong"]["messages"][0]
    assert not verdicts.tests["t-sneaky"]["passed"]


def test_the_package_answer_is_unavailable_and_a_table_of_visible_answers_fails(hostile_run):
    _, (verdicts, *_) = hostile_run
    borrowed = verdicts.tests["t-borrowed"]
    assert not borrowed["passed"] and "not available while this exercise is graded" in borrowed["messages"][0]
    table = verdicts.tests["t-table"]
    assert not table["passed"] and len(table["messages"]) == 1 and "hidden test" in table["messages"][0]
    assert verdicts.tests["t-good"]["passed"] and verdicts.tests["t-after"]["passed"]


def test_endless_loops_huge_results_and_memory_bombs_lose_only_their_own_tests(hostile_run):
    _, (verdicts, *_) = hostile_run
    looping = verdicts.tests["t-looping"]
    assert not looping["passed"] and "Too slow" in looping["messages"][0] and len(looping["messages"]) == 2
    huge = verdicts.tests["t-huge"]
    assert not huge["passed"] and "MiB, more than the 32.0 MiB the grader accepts" in huge["messages"][0]
    assert "channel" not in huge["messages"][0]
    hog = verdicts.tests["t-hog"]
    assert not hog["passed"] and "allocate" in hog["messages"][0]
    assert any("timeout" in m for m in verdicts.failures())


def test_killing_the_grading_process_changes_nothing(hostile_run):
    """The runner is the sandbox's process 1: a signal from a worker is ignored."""
    _, (_, killed, after, *_) = hostile_run
    assert not killed.tests["k1"]["passed"] and killed.tests["k2"]["passed"]
    assert after.tests["a1"]["passed"]


def test_nothing_importable_in_the_sandbox_answers_the_exercise(hostile_run):
    """The package's function is removed at the source: reloaded, loaded afresh, rebuilt from its
    source or its .pyc, found in memory, it raises. PyTorch's attention (functional, operator,
    decomposition, module, flex, its documented implementation) and the softmax that zeroes empty rows
    are off; the grader's references, sealed answers and harness are not there; ``check`` in the
    sandbox answers nothing."""
    _, (_, _, _, verdicts, *_) = hostile_run
    for name, test in verdicts.tests.items():
        assert not test["passed"], (name, test)
    text = {name: "\n".join(test["messages"]) for name, test in verdicts.tests.items()}
    for name in ("reloaded", "fresh", "source", "pyc"):
        assert "attnbook.masks.causal_mask is not available while this exercise is graded" in text[name], text[name]
    assert "returned None" in text["memory"], text["memory"]
    assert "No module named 'attnbook_classroom.grading.ch07_masking'" in text["grader"], text["grader"]
    assert "is not available while this exercise is graded" in text["library"], text["library"]
    for name in ("sdpa", "aten", "safe_softmax"):
        assert "is not available while this exercise is graded" in text[name], (name, text[name])
    for name in ("mha", "flex"):
        assert "removed from the grading sandbox" in text[name], (name, text[name])
    assert "IndexError" in text["docstring"], text["docstring"]  # the documentation has no code left
    cells = {name: verdicts.cells.get(i, "") for i, name in enumerate(IMPORT_ATTACKS)}
    for name, module in (("sealed", "ch07_masking"), ("harness", "harness"), ("reference", "ch07_masking")):
        assert f"No module named 'attnbook_classroom.grading.{module}'" in cells[name], (name, cells[name])
    assert "choice A is not right" in text["oracle"], text["oracle"]  # the stand-in check passes nothing


def test_a_function_blocked_while_the_tests_run_cannot_be_kept_from_the_cells(hostile_run):
    """What a cell saved of chapter 0's `attention` (the function, a copy of its code, its source in
    /tmp) fails the tests, as does a prediction that calls it; the experiment that used it in its
    cell keeps its point."""
    *_, verdicts, _ = hostile_run[1]
    tests = verdicts.tests
    for name in ("saved", "copied", "stashed", "shapes"):
        assert not tests[name]["passed"], (name, tests[name])
        assert "attnbook.functional.attention is not available" in tests[name]["messages"][0], tests[name]
    assert tests["mine"]["passed"] and tests["sharp"]["passed"], (tests["mine"], tests["sharp"])
    assert not verdicts.cells, verdicts.cells


def test_no_copy_of_a_removed_function_or_of_the_grader_is_anywhere_in_the_sandbox(hostile_run):
    """A walk of the sandbox's whole file system finds no line of the package's causal_mask, of the
    grader's references and sealed tables, or of PyTorch's own attention."""
    nb, (*_, verdicts, _, _) = hostile_run
    assert verdicts.cells[0] == "RuntimeError: found []", verdicts.cells[0]


def test_a_student_whose_code_uses_up_their_time_loses_only_what_did_not_run(hostile_run):
    """Each student has a budget of grading time in a run of make grade (seconds across all their
    notebooks): once it is used up, what is left of the notebook is not run, and says why."""
    *_, verdicts = hostile_run[1]
    first, second = verdicts.cells.get(1), verdicts.cells.get(2)
    assert first.startswith("CellTimeoutError: this cell did not finish within 3 s"), first
    assert "used up the grading time a student gets in one run" in second, second
    assert "used up the grading time a student gets" in verdicts.tests["z"]["messages"][0], verdicts.tests["z"]


# What a student could leave in /tmp for a later pass or a later notebook: chapter 0's `attention`
# (blocked only while the tests run), its source written at the bottom of a chain of folders deeper
# than PATH_MAX, which no walk by path can empty. Each job's /tmp is a new file system, so neither
# the second pass of the notebook nor the student's next notebook finds it.
DEEP = (
    "import inspect, os\nimport attnbook.functional as functional\n"
    "def bottom(create=False):  # 24 folders of 200 letters: 4824 bytes of path, made and walked step by step\n"
    "    fd = os.open('/tmp', os.O_RDONLY | os.O_DIRECTORY)\n    for _ in range(24):\n"
    "        if create:\n            os.mkdir('d' * 200, dir_fd=fd)\n"
    "        below = os.open('d' * 200, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)\n"
    "        os.close(fd)\n        fd = below\n    return fd\n"
    "def via_deep(q, k, v, mask=None):\n    stash = os.open('stash.py', os.O_RDONLY, dir_fd=bottom())\n"
    "    namespace = {'__name__': 'stash'}\n    exec(os.read(stash, 1 << 20).decode(), namespace)\n"
    "    return namespace['attention'](q, k, v, mask)[0]")
STASH = ("try:\n    os.close(bottom())\nexcept FileNotFoundError:  # the first pass, where the package's attention is\n"
         "    stash = os.open('stash.py', os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=bottom(create=True))\n"
         "    os.write(stash, inspect.getsource(functional).encode())\n    os.close(stash)")
# A System V semaphore outlives the process that made it: a value set in one notebook would be read
# in the next. And the process that runs a student's code has no capability (it cannot take the
# new /tmp off to reach the one below).
SEMAPHORE = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nmade = libc.semget(0x5eed, 1, 0o1600)\n"
             "raise RuntimeError(f'semget {made} errno {ctypes.get_errno()} set {libc.semctl(made, 0, 16, 1234)}')")
FOUND = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nfound = libc.semget(0x5eed, 0, 0)\n"
         "raise RuntimeError(f'semget {found} errno {ctypes.get_errno()} value {libc.semctl(found, 0, 12)}')")
CAPABILITIES = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                "status = [line for line in open('/proc/self/status') if line.startswith(('CapPrm', 'CapEff', 'CapAmb'))]\n"
                "raise RuntimeError(f\"{' '.join(''.join(status).split())} umount {libc.umount2(b'/tmp', 2)} \"\n"
                "                   f\"errno {ctypes.get_errno()}\")")


@pytest.fixture(scope="module", params=["mounted", "sandbox per job"])
def stash_run(course_folder, request):
    """One student's two notebooks in one sandbox: the first stashes deep in /tmp in its first pass
    and reads the stash in its second; the next one reads it too. Either the runner mounts each
    job's /tmp, or (where bubblewrap's sandbox is given no capability, as under Ubuntu's stricter
    AppArmor profile; here bubblewrap is not asked for it) each job gets a new sandbox."""
    import attnbook_classroom.grading.sandbox as sandbox_module

    test = 'check("scaled_dot_product_attention", via_deep, part="heads")'
    first = notebook([DEEP, STASH, SEMAPHORE, CAPABILITIES], {"deep": test})
    later = notebook([DEEP, FOUND], {"later": test})
    command = sandbox_module.bwrap_command
    if request.param == "sandbox per job":
        def without_capability(*args, **kwargs):
            words = command(*args, **kwargs)
            at = words.index("--cap-add")
            return words[:at] + words[at + 2:]

        sandbox_module.bwrap_command = without_capability
    try:
        with Sandbox([course_folder]) as sandbox:
            verdicts = grade_in_sandbox([submission(first), submission(later)], sandbox=sandbox)
            assert sandbox.renews_tmp == (request.param == "mounted")
            return verdicts
    finally:
        sandbox_module.bwrap_command = command


def test_nothing_in_tmp_reaches_the_next_pass(stash_run):
    """The second pass, whose view never had `attention`, finds no stash: its /tmp is new (and its
    cell, finding no stash, writes the source it sees, without the function)."""
    first, _ = stash_run
    assert 1 not in first.cells, first.cells  # the chain was made in the first pass
    assert first.cells[3] == ("RuntimeError: CapPrm: 0000000000000000 CapEff: 0000000000000000 "
                              "CapAmb: 0000000000000000 umount -1 errno 1"), first.cells[3]
    deep = first.tests["deep"]
    assert not deep["passed"] and "attnbook.functional.attention is not available" in deep["messages"][0], deep


def test_nothing_in_tmp_reaches_the_students_next_notebook(stash_run):
    """Neither the stash deep in /tmp nor a System V semaphore reaches the student's next notebook."""
    first, later = stash_run
    assert first.cells[2] == "RuntimeError: semget -1 errno 1 set -1", first.cells[2]
    assert later.cells[1] == "RuntimeError: semget -1 errno 1 value -1", later.cells[1]
    test = later.tests["later"]
    assert not test["passed"] and "FileNotFoundError" in test["messages"][0], test


# The kernel's numbers of the system calls the sandbox refuses (Linux's asm/unistd_64.h for x86-64,
# asm-generic/unistd.h for ARM64, which has no fork or vfork), written out here so that the test
# does not take them from libseccomp, which builds the filter from the names.
KERNEL_NUMBERS = {
    "x86_64": {"fork": 57, "vfork": 58, "execve": 59, "execveat": 322, "ptrace": 101,
               "process_vm_readv": 310, "process_vm_writev": 311, "pidfd_open": 434, "pidfd_getfd": 438,
               "kcmp": 312, "shmget": 29, "shmat": 30, "msgget": 68, "semget": 64, "mq_open": 240,
               "memfd_create": 319, "memfd_secret": 447, "io_uring_setup": 425, "userfaultfd": 323,
               "add_key": 248, "request_key": 249, "keyctl": 250, "bpf": 321, "perf_event_open": 298,
               "unshare": 272, "setns": 308, "mount": 165, "clone": 56, "clone3": 435},
    "aarch64": {"execve": 221, "execveat": 281, "ptrace": 117, "process_vm_readv": 270,
                "process_vm_writev": 271, "pidfd_open": 434, "pidfd_getfd": 438, "kcmp": 272,
                "shmget": 194, "shmat": 196, "msgget": 186, "semget": 190, "mq_open": 180,
                "memfd_create": 279, "memfd_secret": 447, "io_uring_setup": 425, "userfaultfd": 282,
                "add_key": 217, "request_key": 218, "keyctl": 219, "bpf": 280, "perf_event_open": 241,
                "unshare": 97, "setns": 268, "mount": 40, "clone": 220, "clone3": 435},
}

# Run in the sandbox, after the filter: each refused call by its number, all arguments zero (unrefused,
# fork and unshare(0) would succeed, execve(NULL) fail with EFAULT); a clone of a process (flags
# SIGCHLD); clone3; on x86-64 getpid through the x32 calling convention; then a thread, which must run.
REFUSALS = """import ctypes, errno, os, threading
libc = ctypes.CDLL(None, use_errno=True)
def call(nr, *args):
    ctypes.set_errno(0)
    result = libc.syscall(nr, *args, *[0] * (6 - len(args)))
    return f"{{result}} {{errno.errorcode.get(ctypes.get_errno(), 'no error')}}"
numbers = {numbers!r}
wrong = [(name, call(nr)) for name, nr in numbers.items() if name not in ("clone", "clone3")]
wrong = [(name, seen) for name, seen in wrong if seen != "-1 EPERM"]
ran = []
thread = threading.Thread(target=lambda: ran.append(1))
thread.start()
thread.join()
status = [line.split()[1] for line in open('/proc/self/status') if line.startswith('Seccomp:')]
raise RuntimeError(f"not refused {{wrong}}; clone of a process {{call(numbers['clone'], 17)}}; "
                   f"clone3 {{call(numbers['clone3'])}}; x32 {{call(0x40000000 | 39) if {x86!r} else '-1 EPERM'}}; "
                   f"thread ran {{bool(ran)}}; seccomp mode {{status}}")
"""


def test_each_refused_system_call_is_refused_in_the_sandbox():
    """Every system call of the filter's list, called by the kernel's number in the real sandbox, fails
    with EPERM; so do a clone that makes a process and a call of another calling convention; clone3
    answers ENOSYS; a thread still starts."""
    from attnbook_classroom.grading.seccomp import DENIED
    import platform

    machine = platform.machine()
    if machine not in KERNEL_NUMBERS:
        pytest.skip(f"no table of the kernel's system call numbers for {machine} here")
    numbers = KERNEL_NUMBERS[machine]
    assert set(DENIED) - set(numbers) <= {"fork", "vfork"} and set(numbers) - set(DENIED) == {"clone", "clone3"}
    nb = notebook([REFUSALS.format(numbers=numbers, x86=machine == "x86_64")], {})
    (verdicts,) = grade_in_sandbox([submission(nb, cell_limit=30.0, total_limit=60.0)])
    assert verdicts.cells[0] == ("RuntimeError: not refused []; clone of a process -1 EPERM; clone3 -1 ENOSYS; "
                                 "x32 -1 EPERM; thread ran True; seccomp mode ['2']"), verdicts.cells[0]


def test_hidden_checks_are_seeded_per_student():
    nb = notebook(["def f(L, S):\n    pass"], {"t": 'check("causal_mask", f, part="square")\n'
                                                    '### BEGIN HIDDEN TESTS\ncheck("causal_mask", f, '
                                                    'part="square", seed=1)\n### END HIDDEN TESTS'})
    seeds = {s: [c.seed for _, c in submission(nb, student=s).checks] for s in ("alice", "bob")}
    assert seeds["alice"][0] == seeds["bob"][0] == 0
    assert seeds["alice"][1] not in (0, 1) and seeds["alice"][1] != seeds["bob"][1]
    alice, bob = (submission(nb, student=s).pending[1].specs for s in ("alice", "bob"))
    assert alice != bob  # different sizes, not only different values


def test_test_cells_must_be_lists_of_checks():
    assert [c.part for c in parse_test_cell('check("causal_mask", f, part=None)')] == [
        "square", "more_keys", "one_query", "fewer_keys"]
    for bad in ("assert f(2) == 4", 'check(name, f, part="square")', 'check("causal_mask", f, part="nope")'):
        with pytest.raises(BadTestCell):
            parse_test_cell(bad, "cell-1")


def test_a_course_folder_the_sandbox_could_read_is_refused():
    with pytest.raises(SandboxUnavailable, match="lies inside"):
        bwrap_command([os.path.join(sys.base_prefix, "course")])


def test_grading_refuses_without_bubblewrap(tmp_path):
    (tmp_path / "submitted").mkdir()
    env = {**os.environ, "PATH": os.path.dirname(sys.executable)}  # no /usr/bin: no bwrap
    result = subprocess.run([sys.executable, "-m", "attnbook_classroom.course", "grade", "--root", str(tmp_path)],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode != 0
    assert "Not grading" in result.stderr and "bubblewrap" in result.stderr
    assert not (tmp_path / "grades.csv").exists()


def test_every_chapters_solutions_pass_every_test_in_the_sandbox():
    """Each chapter's exercise notebook, answered with its own solutions (hidden tests in), graded
    as a class's would be: every test cell passes and no cell fails. (An exercise that blocks a
    name another exercise's experiment needs, or a solution too slow for the cell limit, fails here.)"""
    from attnbook_classroom.course.notebooks import exercise_notebook
    from bookbuild.notebooks import toc_chapters

    chapters = toc_chapters()
    subs = [Submission(exercise_notebook(chapter), secret=SECRET, student="solver", assignment=chapter.stem)
            for chapter in chapters]
    with Sandbox([]) as sandbox:
        verdicts = grade_in_sandbox(subs, sandbox=sandbox)
    failed = {(chapter.stem, grade_id): test["messages"] for chapter, v in zip(chapters, verdicts)
              for grade_id, test in v.tests.items() if not test["passed"]}
    broken = {(chapter.stem, index): text for chapter, v in zip(chapters, verdicts) for index, text in v.cells.items()}
    assert not failed and not broken, (failed, broken)
    assert all(v.tests for v in verdicts)


# Functions of the sandbox's packages that compute both a softmax and a matrix product, and why
# each is no attention a student could call.
HARMLESS = {
    ("torch/overrides.py", "get_testing_overrides"),  # lambdas giving the signatures of torch's API
    ("torch/_decomp/__init__.py", "_core_aten_decompositions_post_autograd"),  # a list of operators
    ("torch/testing/_internal/autocast_test_lists.py", "__init__"),  # sample inputs of operators
}


def test_no_function_left_in_the_sandboxs_packages_computes_attention():
    """Every function of the packages the sandbox holds (as it holds them: PyTorch with its own
    attention removed) that calls a softmax and a matrix product is listed as harmless: a new
    release of PyTorch that adds one fails here until it is removed or explained."""
    import ast

    from attnbook_classroom.grading import views

    overlays = {target: host for host, target in views.torch_overlays()[0]}
    hits = set()
    for entry in views.site_packages():
        entry = pathlib.Path(entry)
        for path in ([entry] if entry.suffix == ".py" else entry.rglob("*.py") if entry.is_dir() else []):
            text = pathlib.Path(overlays.get(str(path), path)).read_text(errors="replace")
            if "softmax" not in text or not any(k in text for k in ("matmul", "bmm", " @ ", "einsum")):
                continue
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    dump = ast.dump(node)
                    if ("softmax'" in dump and any(k in dump for k in ("'matmul'", "'bmm'", "MatMult()", "'baddbmm'", "'einsum'"))):
                        hits.add((str(path.relative_to(entry.parent)), node.name))
    assert hits == HARMLESS, hits - HARMLESS
