"""The files shipped in ``data/``: a manifest of their digests, checked before anything is loaded.

Every file in ``data/`` (checkpoints, results) is listed in ``data/manifest.json`` with its size and
SHA-256 digest. :func:`verified` refuses a file that is missing, empty, unlisted, or whose bytes
differ from the manifest (a flipped byte, a truncated copy, one seed's file saved under another
seed's name), with a message that names the file. :func:`load_checkpoint_file` then loads a
checkpoint with ``torch.load(weights_only=True)`` (no code runs while loading), checks that its
configuration is what the caller asked for and that every tensor is finite. The commands that
write files into ``data/`` call :func:`record` afterwards.

Shapes:
    no tensors of their own: checkpoints hold each tensor with its own shape.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
from collections.abc import Iterable, Mapping

import torch

__all__ = ["DATA_DIR", "MANIFEST", "DataFileError", "sha256", "record", "write_results", "verified",
           "load_checkpoint_file", "load_json_file"]

DATA_DIR = pathlib.Path(__file__).resolve().parents[2] / "data"
MANIFEST = "manifest.json"


class DataFileError(ValueError):
    """A file in ``data/`` is missing, damaged, unlisted, or not what the caller asked for.

    Shapes:
        no tensors
    """


def sha256(path: str | pathlib.Path) -> str:
    """The SHA-256 digest of a file's bytes, as 64 hex digits.

    Shapes:
        no tensors
    """
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _manifest_path(data_dir: pathlib.Path) -> pathlib.Path:
    return data_dir / MANIFEST


def _read_manifest(data_dir: pathlib.Path) -> dict[str, dict]:
    path = _manifest_path(data_dir)
    if not path.is_file():
        return {}
    try:
        files = dict(json.loads(path.read_text())["files"])
        for entry in files.values():
            if not (isinstance(entry["bytes"], int) and isinstance(entry["sha256"], str)):
                raise TypeError("an entry without an int 'bytes' and a str 'sha256'")
    except (ValueError, KeyError, TypeError) as exc:
        raise DataFileError(f"the manifest {str(path)!r} is not readable: {exc}") from exc
    return files


def record(paths: Iterable[str | pathlib.Path], data_dir: str | pathlib.Path = DATA_DIR) -> None:
    """Add or update the manifest entries (size and digest) of files written into ``data_dir``.

    Shapes:
        no tensors
    """
    data_dir = pathlib.Path(data_dir)
    files = _read_manifest(data_dir)
    for path in paths:
        path = pathlib.Path(path)
        if path.resolve().parent != data_dir.resolve() or path.name == MANIFEST:
            raise DataFileError(f"record: {str(path)!r} is not a data file directly inside {str(data_dir)!r}")
        files[path.name] = {"bytes": path.stat().st_size, "sha256": sha256(path)}
    text = json.dumps({"files": dict(sorted(files.items()))}, indent=1) + "\n"
    tmp = _manifest_path(data_dir).with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(_manifest_path(data_dir))


def write_results(path: str | pathlib.Path, results: Mapping, written: Iterable[str | pathlib.Path] = ()) -> None:
    """Write a study's results JSON (sorted keys, one space of indent) in one step, through a
    temporary file, and record it and the files ``written`` with it in its folder's manifest.

    Shapes:
        no tensors
    """
    path = pathlib.Path(path)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)
    record([*written, path], data_dir=path.parent)


def verified(path: str | pathlib.Path) -> pathlib.Path:
    """Return ``path`` if its bytes are exactly those listed in its folder's manifest.

    Raises:
        FileNotFoundError: the file does not exist.
        DataFileError: the file is empty, not in the manifest, or its size or digest differs.

    Shapes:
        no tensors
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no data file at {str(path)!r}")
    size = path.stat().st_size
    if size == 0:
        raise DataFileError(f"the data file {str(path)!r} is empty")
    entry = _read_manifest(path.parent).get(path.name)
    if entry is None:
        raise DataFileError(
            f"the data file {str(path)!r} is not listed in {str(_manifest_path(path.parent))!r}; "
            f"files written by the experiments commands are recorded there"
        )
    if size != entry["bytes"]:
        raise DataFileError(
            f"the data file {str(path)!r} has {size} bytes; the manifest lists {entry['bytes']} "
            f"(a truncated or replaced file)"
        )
    if sha256(path) != entry["sha256"]:
        raise DataFileError(
            f"the data file {str(path)!r} does not match its digest in the manifest "
            f"(its bytes were changed, or another file was saved under its name)"
        )
    return path


def load_checkpoint_file(path: str | pathlib.Path, expected: Mapping[str, object] | None = None) -> dict:
    """Load a verified checkpoint ``{"config": dict, "state_dict": {name: tensor}}``.

    Args:
        path: a file in a folder with a manifest.
        expected: entries its ``config`` must hold (for example ``{"score": "dot", "seed": 1}``).

    Raises:
        DataFileError: the file fails :func:`verified`, cannot be read, has another layout, a config
            that differs from ``expected``, or a tensor with a NaN or an infinity.

    Shapes:
        each tensor of the state_dict with its own shape
    """
    path = verified(path)
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a zip error, an unpickling refusal, a truncated stream
        raise DataFileError(f"the checkpoint {str(path)!r} cannot be read: {type(exc).__name__}: {exc}") from exc
    if not (isinstance(saved, dict) and isinstance(saved.get("config"), dict)
            and isinstance(saved.get("state_dict"), dict)):
        raise DataFileError(f"the checkpoint {str(path)!r} does not hold a 'config' and a 'state_dict'")
    config = saved["config"]
    for key, value in (expected or {}).items():
        if config.get(key) != value:
            raise DataFileError(
                f"the checkpoint {str(path)!r} was saved with {key}={config.get(key)!r}, "
                f"but {key}={value!r} was asked for"
            )
    for name, tensor in saved["state_dict"].items():
        if not isinstance(tensor, torch.Tensor):
            raise DataFileError(f"the checkpoint {str(path)!r} holds a {type(tensor).__name__} at {name!r}")
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise DataFileError(f"the checkpoint {str(path)!r} has a NaN or an infinity in {name!r}")
    return saved


def load_json_file(path: str | pathlib.Path) -> dict:
    """Load a verified JSON file of ``data/`` (results written by the experiments commands).

    Shapes:
        no tensors
    """
    path = verified(path)
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise DataFileError(f"the results file {str(path)!r} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise DataFileError(f"the results file {str(path)!r} does not hold a JSON object")
    return data

