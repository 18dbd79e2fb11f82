"""The few pieces of MyST syntax the runnable edition reads: fences, options, targets, headings."""

from __future__ import annotations

import re

__all__ = ["EQUATION_LABEL", "FENCE_OPEN", "PLAIN_FENCE", "OPTION", "TARGET", "HEADING", "closing_line", "directive_options",
           "without_code"]

# A MyST target line, `(label)=`, and a Markdown heading.
TARGET = re.compile(r"^\((?P<label>[^()\s]+)\)=\s*$")
HEADING = re.compile(r"^(?P<hashes>#{1,6})\s+(?P<title>.+?)\s*#*\s*$")
# The opening fence of a directive, ```{name} args  or  :::{name} args, and of plain code.
FENCE_OPEN = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|:{3,})\s*\{(?P<name>[\w:+-]+)\}\s*(?P<args>.*?)\s*$")
PLAIN_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?!.*\{)")
# Options of a directive: `:name: value` lines at the top of its body.
OPTION = re.compile(r"^:(?P<key>[\w-]+):\s*(?P<value>.*?)\s*$")
# A labelled display equation: `$$ ... $$ (label)`.
EQUATION_LABEL = re.compile(r"\$\$\s*\((?P<label>[^()\s]+)\)[ \t]*$", re.M)


def closing_line(lines: list[str], start: int, fence: str) -> int:
    """The index of the line that closes the fence opened at ``start`` (the last line if none)."""
    char, width = fence[0], len(fence)
    inner: str | None = None  # a plain code fence inside a colon directive
    for j in range(start + 1, len(lines)):
        stripped = lines[j].strip()
        if char == ":" and inner is None and re.match(r"^(`{3,}|~{3,})", stripped):
            inner = re.match(r"^(`{3,}|~{3,})", stripped).group(1)
            continue
        if inner is not None:
            if stripped.startswith(inner) and not stripped[len(inner):].strip():
                inner = None
            continue
        if stripped and set(stripped) == {char} and len(stripped) >= width:
            return j
    return len(lines) - 1


def directive_options(body: list[str]) -> tuple[dict[str, str], list[str]]:
    """A directive's options (``:key: value`` lines, or a ``---`` YAML block) and its content."""
    options: dict[str, str] = {}
    if body and body[0].strip() == "---":
        import yaml

        end = next((j for j in range(1, len(body)) if body[j].strip() == "---"), None)
        if end is not None:
            loaded = yaml.safe_load("\n".join(body[1:end])) or {}
            return {str(k): str(v) for k, v in loaded.items()}, body[end + 1:]
    i = 0
    while i < len(body):
        match = OPTION.match(body[i].strip())
        if not match:
            break
        options[match["key"]] = match["value"]
        i += 1
    content = body[i:]
    while content and not content[0].strip():
        content = content[1:]
    return options, content


def without_code(lines: list[str]) -> list[str]:
    """The lines outside plain code fences (whose content is code, not MyST); a directive's
    lines are kept whole."""
    out, i = [], 0
    while i < len(lines):
        opening = FENCE_OPEN.match(lines[i])
        plain = PLAIN_FENCE.match(lines[i])
        if opening:
            end = closing_line(lines, i, opening["fence"])
            out.extend(lines[i:end + 1])
            i = end + 1
        elif plain:
            i = closing_line(lines, i, plain["fence"]) + 1
        else:
            out.append(lines[i])
            i += 1
    return out
