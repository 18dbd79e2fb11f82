"""The chapters keep to one notation, the one chapters/notation.md writes down.

Each rule below catches one likely drift from that page, in the chapters' markdown or code
(comments and strings included, where shapes and figure titles are written). A justified exception
is allowed in the chapter itself, in the cell's metadata, with its reason:

    {"attnbook": {"allow": {"notation:vocab-V": "quotes the original paper's formula"}}}
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from chapter_rules import rule_test
from test_notebooks import ROOT, allowed


@dataclass(frozen=True)
class Rule:
    name: str
    says: str  # what notation.md says instead
    markdown: str | None = None  # regex over markdown cells
    code: str | None = None  # regex over code cells (comments and strings included)


RULES_OF_NOTATION = [
    Rule("scale-width", "the scale is 1/√D, with D the width of queries and keys (per head once there are heads)",
         markdown=r"\\sqrt\{\s*(?:E|d|n|d_\{?k\}?|d_\{?\\?(?:text|mathrm)?\{?model\}?\}?)\s*\}|√\s*(?:E|d)\b",
         code=r"√\s*(?:E|d)\b|sqrt\(\s*(?:E|d|d_k|d_model)\s*\)"),
    Rule("value-width", "the values' width is D_v (Dv, vdim in code)",
         markdown=r"\bE_\{?v\}?(?![\w])", code=r"\bEv\b"),
    Rule("vocab-V", "V is the values matrix; the vocabulary is 𝒱, its size |𝒱| (vocab_size in code)",
         markdown=r"vocabular\w*[^.$]{0,60}\$V\$|\$V\$[^.$]{0,40}vocabular",
         code=r"\(\s*B\s*,[^()\n]*\bV\s*\)"),
    Rule("length-T", "lengths are L (queries, target) and S (keys, source), never T",
         markdown=r"\by_\{?T\}?\b|\$T\$",
         code=r"\(\s*B\s*,\s*T\s*[,)]"),
    Rule("proj-names", "the package's projections are the nn.Linear layers q_proj, k_proj, v_proj and out_proj; "
         "in_proj_weight and q_proj_weight are PyTorch's names, for nn.MultiheadAttention only",
         markdown=r"\b(?:self|attn|mha|module)\.(?:in_proj_weight|[qkv]_proj_weight)\b",
         code=r"\b(?:self|attn|mha)\.(?:in_proj_weight|[qkv]_proj_weight)\b"),
    Rule("additive-vector", "the additive score's vector is w (AdditiveScore.v in code): tanh(q W_q + k W_k + b) wᵀ",
         markdown=r"\bv\s*\^\s*\{?\\top\}?\s*\\tanh|\bv\s*·\s*tanh|\bv_a\b",
         code=r"\bv\s*@\s*torch\.tanh|\bv\s*·\s*tanh"),
    Rule("additive-bias", "the additive score's bias is b (AdditiveScore.key_proj.bias in code)",
         markdown=r"\\tanh[^$]*?\+\s*c\s*(?:\\big|\\Big)?\)", code=r"tanh\([^\n]*\+\s*c\)"),
    Rule("row-vectors", "vectors are rows and matrices act on the right: q W_q, [q, k] W, never W q",
         markdown=r"W\s*\[\s*q\s*;\s*k\s*\]|W_\{?[qkQK]\}?\s*(?:\\,)?\s*[qksh](?:_[a-z])?(?![\w{])",
         code=r"\bW_?[qk]?\s*@\s*(?:torch\.cat\(\[\s*q|[qk]\b)"),
    Rule("query-key-symbols", "a query is q and a key is k (v is a value)",
         markdown=r"\bu\s*\\cdot\s*v\b|\bkey\s+\$v\$"),
    Rule("width-symbols", "widths are E (model) and D (per head, and of queries and keys); lengths L and S",
         markdown=r"\$d\$|\bd\s*=\s*\d|d_\{?(?:k|q|v|model|\\text\{?\w+\}?)\}?(?![\w])|\bn\s*(?:\\,)?\s*d\^2|\bn\^2\s*(?:\\,)?\s*d\b",
         code=r"^\s*d\s*=\s*\d|\(d\s*=\s*\d"),
    Rule("weight-symbols", "attention weights are α_ij (A for the matrix), not w",
         markdown=r"\bw_(?:\{?ij\}?|\{?j'?\}?|i)(?![\w])"),
    Rule("score-symbols", "scores are e_ij (s is a decoder state)",
         markdown=r"\bs_\{?j'?\}?(?![\w])|s_1,\s*\\dots,\s*s_S"),
]


def rule_cells(nb, kinds: tuple[str, ...] = ("markdown", "code")):
    """(index, cell) of every cell of ``kinds`` that a chapter rule reads: all but removed cells."""
    for index, cell in enumerate(nb.cells):
        if cell.cell_type in kinds and "remove-cell" not in cell.metadata.get("tags", []):
            yield index, cell


def notation_violations(entry: str, nb) -> dict[str, str]:
    """(rule, text) -> message, for every text that breaks a rule outside an allowed cell."""
    found = {}
    for index, cell in rule_cells(nb):
        for rule in RULES_OF_NOTATION:
            pattern = rule.markdown if cell.cell_type == "markdown" else rule.code
            if pattern is None or allowed(cell, f"notation:{rule.name}"):
                continue
            for match in re.finditer(pattern, cell.source, flags=re.M):
                text = match.group(0).strip()
                key = f"{rule.name}: {text}"
                if key not in found:
                    found[key] = f"{rule.name}: {text!r} in cell {index} ({cell.cell_type}); notation.md: {rule.says}"
    return found


RULES = {"notation": notation_violations}


test_chapter_keeps_to_the_notation = rule_test(
    "notation", notation_violations, "The chapter's symbols are those of chapters/notation.md.")


def test_notation_page_states_every_rule():
    """The page the rules enforce names the code of each symbol it decides."""
    page = (ROOT / "chapters" / "notation.md").read_text()
    for needed in ("q_proj", "in_proj_weight", "out_proj", "AdditiveScore.v", "key_proj.bias", "query_proj",
                   "vocab_size", r"\sqrt{D}", "row"):
        assert needed in page, f"chapters/notation.md does not mention {needed!r}"


@pytest.mark.parametrize(
    "rule,text,hit",
    [
        ("scale-width", r"divided by $\sqrt{E}$", True),
        ("scale-width", r"divided by $\sqrt{D}$", False),
        ("scale-width", "# 3. Scaling by √d", True),
        ("value-width", r"v $(\dots, S, E_v)$", True),
        ("value-width", r"v $(\dots, S, D_v)$", False),
        ("vocab-V", "a vocabulary of $V$ tokens", True),
        ("vocab-V", "values $V$ of width $D_v$", False),
        ("length-T", r"$y_1, \dots, y_T$", True),
        ("proj-names", "`attn.in_proj_weight`", True),
        ("proj-names", "`q_proj`, `k_proj`", False),
        ("additive-vector", r"$v^\top \tanh(W_q q + W_k k + c)$", True),
        ("additive-bias", r"\tanh\!\big(W [q; k] + c\big)", True),
        ("additive-bias", r"\tanh(q W_q + k W_k + b)", False),
        ("row-vectors", r"W_q\, q + W_k\, k", True),
        ("row-vectors", r"q W_q + k W_k", False),
        ("query-key-symbols", r"a query $u$ and a key $v$, $u \cdot v$", True),
        ("width-symbols", r"$O(n^2 d)$", True),
        ("width-symbols", r"`Linear(d_k, d_model)`", True),
        ("weight-symbols", r"$w_j = \exp(s_j)$", True),
        ("weight-symbols", r"$w^\top$", False),
        ("score-symbols", r"$w_j = \exp(s_j)$", True),
        ("score-symbols", r"the decoder state $s_t$", False),
    ],
)
def test_rules_catch_the_drifts_they_name(rule, text, hit):
    pattern = next(r for r in RULES_OF_NOTATION if r.name == rule).markdown
    assert bool(re.search(pattern, text, flags=re.M)) is hit


@pytest.mark.parametrize(
    "rule,text,hit",
    [
        ("vocab-V", 'print("logits", tuple(logits.shape), "= (B, T, V)")', True),
        ("length-T", 'print("= (B, T, V)")', True),
        ("scale-width", 'plot(w, ax, "Self-attention weights, scale 1/√E")', True),
        ("additive-vector", "concatenated = v @ torch.tanh(W @ torch.cat([q, k]) + c)", True),
        ("additive-bias", "summed = v @ torch.tanh(W_q @ q + W_k @ k + c)", True),
        ("row-vectors", "summed = v @ torch.tanh(W_q @ q + W_k @ k + c)", True),
        ("width-symbols", "d = 64", True),
        ("proj-names", "w = self.in_proj_weight[:E]", True),
    ],
)
def test_code_rules_catch_the_drifts_they_name(rule, text, hit):
    pattern = next(r for r in RULES_OF_NOTATION if r.name == rule).code
    assert bool(re.search(pattern, text, flags=re.M)) is hit


def test_an_allowed_cell_is_exempt():
    import nbformat

    v4 = nbformat.v4
    quote = v4.new_markdown_cell(r"The paper writes $v^\top \tanh(W [q; k] + c)$.")
    nb = v4.new_notebook(cells=[quote])
    assert any(k.startswith("additive-vector") for k in notation_violations("x", nb))
    quote.metadata["attnbook"] = {"allow": {"notation:additive-vector": "quotes the paper",
                                            "notation:additive-bias": "quotes the paper",
                                            "notation:row-vectors": ""}}  # an empty reason allows nothing
    found = notation_violations("x", nb)
    assert not any(k.startswith(("additive-vector", "additive-bias")) for k in found)
    assert any(k.startswith("row-vectors") for k in found)
