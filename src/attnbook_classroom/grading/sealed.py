"""Answers kept out of readable form: salted digests, and messages sealed by the answer they explain.

A conceptual exercise whose answer is a fixed choice (a set of letters, a set of names) cannot hide
the answer in a per-student variant. Its right answers are stored as salted digests of a *key*
(for example ``"situation=BD"``), and the message that explains a wrong choice is sealed with the
key of that choice (``"situation+A"``): only an answer that makes that choice opens it. Reading the
package shows hexadecimal strings, not the answers.

This keeps answers from being read off the installed package or a search of the repository; it does
not stop a student from trying every choice of a small multiple-choice question through ``check``
(the classroom appendix says so).

To seal a new answer or message, print the entry to paste into the chapter's grading module::

    python -m attnbook_classroom.grading.sealed my_exercise "situation=BD"
    python -m attnbook_classroom.grading.sealed my_exercise "situation+A" "mask A lets the future in, ..."
"""

from __future__ import annotations

import argparse
import base64
import hashlib

__all__ = ["Sealed", "digest", "seal", "unseal"]

_SALT = b"attnbook.grading.sealed.v1"  # the salt the sealed answers were made with; unchanged by the move


def _hash(*parts: str | bytes) -> bytes:
    h = hashlib.sha256(_SALT)
    for p in parts:
        h.update(b"\0" + (p.encode() if isinstance(p, str) else p))
    return h.digest()


def digest(exercise_id: str, key: str) -> str:
    """The salted digest that stands for ``key`` in ``exercise_id``'s table."""
    return _hash("digest", exercise_id, key).hex()[:32]


def _stream(exercise_id: str, key: str, n: int) -> bytes:
    blocks = (_hash("stream", exercise_id, key, str(i)) for i in range(n // 32 + 1))
    return b"".join(blocks)[:n]


def seal(exercise_id: str, key: str, message: str) -> str:
    """``message`` sealed with ``key``; :func:`unseal` with the same key opens it."""
    data = message.encode()
    body = bytes(a ^ b for a, b in zip(data, _stream(exercise_id, key, len(data))))
    return base64.b64encode(_hash("mac", exercise_id, key, data)[:8] + body).decode()


def unseal(exercise_id: str, key: str, token: str) -> str | None:
    """The message sealed in ``token`` with ``key``, or None when ``key`` does not open it."""
    raw = base64.b64decode(token)
    mac, body = raw[:8], raw[8:]
    data = bytes(a ^ b for a, b in zip(body, _stream(exercise_id, key, len(body))))
    return data.decode() if _hash("mac", exercise_id, key, data)[:8] == mac else None


class Sealed:
    """An exercise's table: digest of a key -> sealed message ("" for a key that only marks)."""

    def __init__(self, exercise_id: str, entries: dict[str, str]):
        self.exercise_id = exercise_id
        self.entries = dict(entries)

    def holds(self, key: str) -> bool:
        """Whether ``key`` is in the table (e.g. a right answer's key)."""
        return digest(self.exercise_id, key) in self.entries

    def message(self, key: str) -> str | None:
        """The message sealed for ``key``, or None when the table has none."""
        token = self.entries.get(digest(self.exercise_id, key))
        return unseal(self.exercise_id, key, token) if token else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m attnbook_classroom.grading.sealed",
                                     description="Print a sealed table entry for a grading module.")
    parser.add_argument("exercise_id")
    parser.add_argument("key", help='e.g. "situation=BD" (a right answer) or "situation+A" (a choice)')
    parser.add_argument("message", nargs="?", default="", help="the note shown to whoever makes that choice")
    args = parser.parse_args(argv)
    token = seal(args.exercise_id, args.key, args.message) if args.message else ""
    print(f'"{digest(args.exercise_id, args.key)}": "{token}",')


if __name__ == "__main__":
    main()
