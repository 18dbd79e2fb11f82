"""Nothing is used before it is taught.

:data:`TAUGHT_IN` says, for every public name of the package's teaching modules, the chapter that
introduces it; :data:`MODULE_TAUGHT_IN` does the same for a whole module, and names the tool
modules any chapter may use (setup and glue, plots, controls, the grader, timing and memory).
A chapter's code (its teaching code, its checks and its exercises alike) may use a name only if
that name is taught in the chapter or before it, in the reading order of _toc.yml. The map is
reviewed like code: a new public name in a teaching module fails
:func:`test_the_map_names_every_public_name` until someone decides where it is taught.

A justified exception (a deliberate forward look, explained on the page) is allowed in the cell's
metadata: ``{"attnbook": {"allow": {"order:KVCache": "reason"}}}``.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re

import pytest

import attnbook
from chapter_rules import rule_test
from test_notation import rule_cells
from test_notebooks import ENTRIES, allowed, notebook_or_none, parse_cell, public_names

ANYWHERE = "anywhere"

# The tooling and the classroom (attnbook_tools, attnbook_classroom) are usable from the first page
# on: only the library's names are lessons. Library modules whose names are all introduced together:
MODULE_TAUGHT_IN = {
    "attnbook.tasks.reversal": "chapters/01_seq2seq_bottleneck",
    "attnbook.train": "chapters/01_seq2seq_bottleneck",
    "attnbook.tasks.dates": "chapters/08c_cross_attention",
    "attnbook.models.encoder_decoder": "chapters/08c_cross_attention",
    "attnbook.models.attention_only": "chapters/12_induction_heads",
    "attnbook.tasks.induction": "chapters/12_induction_heads",
    "attnbook.linear": "chapters/15_linear_attention",
    "attnbook.interop": "chapters/08_multi_head_attention",  # the copies behind from_torch, from_llama
    "attnbook.latent": "chapters/14_attention_in_2026",
    "attnbook.tasks.text": "chapters/16_real_text",
}

# Names of those modules that are taught after the rest of their module: the trainers of later
# chapters' tasks, which live with the book's one training loop.
LATER_IN = {
    ("attnbook.train", "train_repeat"): "chapters/08_multi_head_attention",
    ("attnbook.train", "train_induction"): "chapters/12_induction_heads",
}

# Every public name of the other modules: where it is introduced (None: no chapter teaches it, so
# no chapter may use it).
TAUGHT_IN = {
    # attnbook.functional
    "attention": "chapters/00_attention_at_a_glance",
    "masked_softmax": "chapters/02_attention_in_seq2seq",
    "fused_attention": "chapters/08_multi_head_attention",  # the sdpa backend
    # attnbook.masks
    "padding_mask": "chapters/02_attention_in_seq2seq",
    "causal_mask": "chapters/07_masking",
    "combine_masks": "chapters/07_masking",
    "expand_key_mask": "chapters/07_masking",
    "apply_mask": "chapters/07_masking",
    "build_mask": "chapters/07_masking",
    # attnbook.models.seq2seq
    "Encoder": "chapters/01_seq2seq_bottleneck",
    "BottleneckDecoder": "chapters/01_seq2seq_bottleneck",
    "Seq2Seq": None,  # what build_model returns; the chapters call build_model
    "build_model": "chapters/01_seq2seq_bottleneck",
    "attention_step": "chapters/02_attention_in_seq2seq",
    "AttentionDecoder": "chapters/02_attention_in_seq2seq",
    "SCORE_NAMES": "chapters/05b_four_scores",
    "make_score": "chapters/05b_four_scores",
    # attnbook.scores, attnbook.attention
    "DotScore": "chapters/02_attention_in_seq2seq",
    "ScaledDotScore": "chapters/03_scaled_dot_product",
    "Attention": "chapters/03_scaled_dot_product",
    "BilinearScore": "chapters/04_bilinear_score",
    "AdditiveScore": "chapters/05_additive_score",
    # attnbook.positions
    "sinusoidal_positions": "chapters/06_queries_keys_values",
    "LearnedPositions": "chapters/06_queries_keys_values",
    "apply_rotary": "chapters/10_rotary_positions",
    "rope_frequencies": "chapters/13_positions_at_length",
    "interleaved_to_half": "chapters/13_positions_at_length",
    # attnbook.multihead: heads are the subject of chapter 8
    "MultiHeadAttention": "chapters/08_multi_head_attention",
    "split_heads": "chapters/08_multi_head_attention",
    "merge_heads": "chapters/08_multi_head_attention",
    "CausalSelfAttention": "chapters/08_multi_head_attention",  # num_kv_heads and window: chapter 11
    # attnbook.block, attnbook.models.transformer: the block's parts (layer norm, the MLP, the
    # residual path) are the subject of chapter 8b, which builds TinyTransformer from them; chapter 8
    # trains a model of attention alone and uses none of them. Cross-attention is chapter 8c's.
    "TinyTransformer": "chapters/08b_transformer_block",
    "TransformerBlock": "chapters/08b_transformer_block",
    "DecoderBlock": "chapters/08c_cross_attention",
    "SwiGLU": "chapters/14_attention_in_2026",
    "repeat_batch": "chapters/08_multi_head_attention",
    "repeat_loss": "chapters/08_multi_head_attention",
    "evaluate_repeat": None,
    # attnbook.tiled, attnbook.kv_cache: tiles and caches are the subject of chapter 9
    "tiled_attention": "chapters/09_attention_at_scale",
    "online_softmax_step": "chapters/09_attention_at_scale",
    "tiled_forward": "chapters/09_attention_at_scale",
    "tiled_backward": "chapters/09_attention_at_scale",
    "attention_tile_backward": "chapters/09_attention_at_scale",
    "TiledAttention": "chapters/09_attention_at_scale",
    "TILE_SCORES": "chapters/09_attention_at_scale",
    "KVCache": "chapters/09_attention_at_scale",
}

# The block's other parts are not names of the library: PyTorch's layer normalisation and GELU (the
# MLP's), and the tooling that builds or draws whole blocks. Chapter 8b teaches them; before it, a
# chapter's code may not use them, under any import or attribute (chapter 8's model is attention
# alone), unless the cell's metadata allows "order:<name>" with a reason.
BLOCK_PARTS_TAUGHT_IN = {
    name: "chapters/08b_transformer_block"
    for name in ("LayerNorm", "layer_norm", "RMSNorm", "rms_norm", "GELU", "gelu",
                 "draw_block", "ablation_model", "AblationBlock")
}


def block_parts_used(tree: ast.AST) -> set[str]:
    """The names of :data:`BLOCK_PARTS_TAUGHT_IN` that the code uses: imported (``from torch.nn import
    LayerNorm``), as an attribute (``nn.LayerNorm``, ``F.gelu``) or as a bare name."""
    used = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            used |= {alias.name for alias in node.names}
        elif isinstance(node, ast.Attribute):
            used.add(node.attr)
        elif isinstance(node, ast.Name):
            used.add(node.id)
    return used & set(BLOCK_PARTS_TAUGHT_IN)


def _modules():
    """The library's modules but the private ones (``attnbook._checks``), which teach nothing."""
    return [importlib.import_module(info.name)
            for info in pkgutil.walk_packages(attnbook.__path__, prefix="attnbook.")
            if not info.name.split(".")[-1].startswith("_")]


def _module_names() -> dict[str, list[str]]:
    """Module -> its public names (its __all__, else what it defines)."""
    found = {}
    for module in _modules():
        names = getattr(module, "__all__", None)
        if names is None:
            names = [n for n, obj in vars(module).items()
                     if not n.startswith("_") and getattr(obj, "__module__", None) == module.__name__]
        found[module.__name__] = list(names)
    return found


def taught_in(name: str, module: str | None) -> str | None | bool:
    """Where ``name`` (of ``module``, when known) is taught: a _toc.yml entry, ANYWHERE, None (never),
    or False when the map does not know it."""
    if module is None or module == "attnbook":  # at the package's top, a re-export of a module's name
        module = public_names().get(name)
    if (module, name) in LATER_IN:
        return LATER_IN[module, name]
    if module in MODULE_TAUGHT_IN:
        return MODULE_TAUGHT_IN[module]
    return TAUGHT_IN.get(name, False)


def used_names(tree: ast.AST) -> list[tuple[str, str | None]]:
    """(name, module) for every package name the code uses: imported from attnbook, or an attribute
    of an attnbook module (``tiled.TILE_SCORES``, ``attnbook.masks.causal_mask``)."""
    submodules = {m.__name__ for m in _modules()}  # every module of the library, by its full name
    module_aliases: dict[str, str] = {}
    used = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "attnbook":
            for alias in node.names:
                if f"{node.module}.{alias.name}" in submodules:  # a module (attnbook.tasks.dates)
                    module_aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                else:
                    used.append((alias.name, node.module))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "attnbook":
                    module_aliases[alias.asname or alias.name] = alias.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            base = ast.unparse(node.value)
            if base in module_aliases and module_aliases[base] != "attnbook":
                used.append((node.attr, module_aliases[base]))
            elif base.startswith("attnbook."):
                used.append((node.attr, base))
    return used


def order_violations(entry: str, nb) -> dict[str, str]:
    """Names used in ``entry`` that are taught later (or never)."""
    position = {e: i for i, e in enumerate(ENTRIES)}
    found = {}
    for index, cell in rule_cells(nb, ("code",)):
        for name, module in used_names(parse_cell(cell)):
            where = taught_in(name, module)
            if where == ANYWHERE or allowed(cell, f"order:{name}"):
                continue
            if where is False:
                found[name] = f"cell {index} uses {module}.{name}, which tests/book/test_reading_order.py does not map"
            elif where is None:
                found[name] = f"cell {index} uses {module}.{name}, which no chapter teaches"
            elif position.get(where, -1) > position[entry]:
                found[name] = f"cell {index} uses {name}, taught later in {where}"
        for name in block_parts_used(parse_cell(cell)):
            where = BLOCK_PARTS_TAUGHT_IN[name]
            if position[where] > position[entry] and not allowed(cell, f"order:{name}"):
                found[name] = f"cell {index} uses {name}, a part of the block taught later in {where}"
    return found


RULES = {"order": order_violations}


test_nothing_is_used_before_it_is_taught = rule_test(
    "order", order_violations, "The chapter's code uses only names taught in it or before it.")


def test_the_map_names_every_public_name():
    """Every public name of a teaching module has a decided place, and the map names nothing else."""
    names = _module_names()
    teaching = {n for module, listed in names.items() if module not in MODULE_TAUGHT_IN
                and module != "attnbook" for n in listed}
    missing = sorted(teaching - set(TAUGHT_IN))
    stale = sorted(set(TAUGHT_IN) - teaching)
    assert not missing, f"public names that TAUGHT_IN does not place (decide where each is taught): {missing}"
    assert not stale, f"TAUGHT_IN names what the package no longer has: {stale}"
    assert set(MODULE_TAUGHT_IN) <= set(names), sorted(set(MODULE_TAUGHT_IN) - set(names))
    assert all(name in names.get(module, ()) for module, name in LATER_IN), LATER_IN
    chapters = set(ENTRIES)
    for where in [*TAUGHT_IN.values(), *MODULE_TAUGHT_IN.values()]:
        assert where in chapters or where in (ANYWHERE, None), f"{where!r} is not a _toc.yml entry"


_INCLUDE = re.compile(
    r"\{literalinclude\}\s*\S*src/(attnbook/[\w/]+)\.py\s*\n(?:\s*:[\w-]+:.*\n)*?\s*:pyobject:\s*([\w.]+)"
)


def shown_objects(markdown: str) -> list[tuple[str, str, str]]:
    """(file, object, source) of every package object a markdown cell shows with
    ``literalinclude`` and ``:pyobject:``."""
    import inspect

    shown = []
    for path, dotted in _INCLUDE.findall(markdown):
        obj = importlib.import_module(path.replace("/", "."))
        for part in dotted.split("."):
            obj = getattr(obj, part)
        shown.append((f"src/{path}.py", dotted, inspect.getsource(obj)))
    return shown


def _mentions(nb, name: str) -> bool:
    for cell in nb.cells:
        if cell.cell_type == "code" and any(n == name for n, _ in used_names(parse_cell(cell))):
            return True
        if cell.cell_type == "markdown" and (
            re.search(rf"`(?:[\w.]+\.)?{re.escape(name)}`|:pyobject:\s*{re.escape(name)}\b", cell.source)
            or any(re.search(rf"\b{re.escape(name)}\b", source) for _, _, source in shown_objects(cell.source))
        ):
            return True
    return False


MAPPED = {**{n: w for n, w in TAUGHT_IN.items() if w}, **{n: w for (_, n), w in LATER_IN.items()}}


@pytest.mark.parametrize("name", sorted(MAPPED))
def test_the_chapter_the_map_names_shows_the_name(name):
    """The introducing chapter uses the name in its code, shows its source or names it."""
    nb = notebook_or_none(MAPPED[name])
    if nb is None:
        pytest.skip(f"{MAPPED[name]} is not a notebook yet")
    assert _mentions(nb, name), f"{MAPPED[name]} is mapped as where {name} is taught, but never shows it"


def test_used_names_finds_every_form_of_use():
    code = (
        "from attnbook.kv_cache import KVCache\n"
        "from attnbook import tiled, Attention\n"
        "import attnbook.masks as masks\n"
        "x = tiled.TILE_SCORES\n"
        "y = masks.causal_mask(3)\n"
        "z = attnbook.multihead.split_heads(q, 2)\n"
    )
    import nbformat

    found = set(used_names(parse_cell(nbformat.v4.new_code_cell(code))))
    assert {("KVCache", "attnbook.kv_cache"), ("Attention", "attnbook"), ("TILE_SCORES", "attnbook.tiled"),
            ("causal_mask", "attnbook.masks"), ("split_heads", "attnbook.multihead")} <= found
    assert ("tiled", "attnbook") not in found  # importing a module uses nothing yet


def test_order_violations_on_a_small_notebook():
    import nbformat

    v4 = nbformat.v4
    first = ENTRIES[[i for i, e in enumerate(ENTRIES) if e.endswith("00_attention_at_a_glance")][0]]
    nb = v4.new_notebook(cells=[
        v4.new_code_cell("from attnbook.functional import attention\nfrom attnbook_tools.notebook import glue"),
        v4.new_code_cell("from attnbook.kv_cache import KVCache"),
        v4.new_code_cell("from attnbook.masks import causal_mask",
                         metadata={"attnbook": {"allow": {"order:causal_mask": "a look ahead, said so"}}}),
        v4.new_code_cell("from attnbook.tasks.repeat import evaluate_repeat"),
    ])
    found = order_violations(first, nb)
    assert set(found) == {"KVCache", "evaluate_repeat"}
    assert "taught later" in found["KVCache"] and "no chapter teaches" in found["evaluate_repeat"]


def test_block_parts_are_not_used_before_chapter_8b():
    """Layer norm, GELU and the block-building tools count as used in every form, and only chapter
    8b and later may use them (chapter 8 trains attention alone)."""
    import nbformat

    v4 = nbformat.v4
    chapter8 = next(e for e in ENTRIES if e.endswith("08_multi_head_attention"))
    block_chapter = next(e for e in ENTRIES if e.endswith("08b_transformer_block"))
    cells = [
        v4.new_code_cell("from torch import nn\nnorm = nn.LayerNorm(8)"),
        v4.new_code_cell("import torch.nn.functional as F\ny = F.gelu(x)"),
        v4.new_code_cell("from attnbook_tools.diagrams import draw_block"),
        v4.new_code_cell("y = torch.nn.functional.layer_norm(x, (8,))",
                         metadata={"attnbook": {"allow": {"order:layer_norm": "a look ahead, said so"}}}),
    ]
    found = order_violations(chapter8, v4.new_notebook(cells=cells))
    assert set(found) == {"LayerNorm", "gelu", "draw_block"}, found
    assert "taught later in chapters/08b_transformer_block" in found["LayerNorm"]
    assert order_violations(block_chapter, v4.new_notebook(cells=cells)) == {}
