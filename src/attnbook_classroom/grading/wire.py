"""What crosses between the grader and the process that runs a student's code.

The grader describes each call of the student's function as plain data (a *spec*); the process
that runs the student's code executes it with :func:`execute` and sends back plain data (a *raw
result*). Both directions hold only ``None``, ``bool``, ``int``, ``float``, ``str``, lists, dicts
with string keys and plain tensors, written with ``torch.save`` and read with
``torch.load(weights_only=True)`` (:func:`dumps`, :func:`loads`): nothing is unpickled, and
:func:`loads` refuses data over a size cap before reading it.

Python values are tagged on the way (:func:`encode`, :func:`decode`) so that a tuple stays a tuple,
a set a set and a dtype a dtype; any other object the student's code returns comes back as a
:class:`Foreign` that names its type.
"""

from __future__ import annotations

import io
import warnings
import zipfile
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode

MAX_BYTES = 32 << 20  # one part's results
_MAX_ITEMS = 4096
_MAX_DEPTH = 8
_MAX_TEXT = 2000


@dataclass(frozen=True)
class Foreign:
    """An object of a type that does not cross: its type (``numpy.ndarray``) and a short repr."""

    kind: str
    text: str = ""


@dataclass(frozen=True)
class ErrorInfo:
    """An exception raised by the student's code: its type, message and base classes' names."""

    type: str
    message: str
    bases: tuple[str, ...] = ()

    def is_a(self, name: str) -> bool:
        return name == self.type or name in self.bases

    def __str__(self) -> str:
        return self.message


# ------------------------------------------------------------------------------------------------
# Encoding
# ------------------------------------------------------------------------------------------------

def _type_name(obj) -> str:
    cls = type(obj)
    return f"{cls.__module__.split('.')[0]}.{cls.__name__}"


def _plain_tensor(t: Tensor) -> Tensor:
    t = t.detach()
    out = torch.empty(tuple(t.shape), dtype=t.dtype)
    out.copy_(t)
    return out


def encode(obj, _depth: int = 0):
    """``obj`` as plain data (tagged dicts for tuples, sets, dtypes and foreign objects)."""
    if _depth > _MAX_DEPTH:
        return {"$": "foreign", "kind": _type_name(obj), "text": "nested too deeply"}
    if obj is None or isinstance(obj, bool):
        return obj
    if type(obj) is int:
        return obj if abs(obj) < 1 << 62 else {"$": "bigint", "v": str(obj)}
    if type(obj) is float:
        return obj
    if type(obj) is str:
        return obj[:_MAX_TEXT]
    if isinstance(obj, Tensor):
        try:
            if obj.dim() > 1 and not obj.is_contiguous():  # keep the memory order (a transposed input)
                order = sorted(range(obj.dim()), key=lambda d: -obj.stride(d))
                return {"$": "tensor", "v": _plain_tensor(obj.permute(order)), "order": order}
            return {"$": "tensor", "v": _plain_tensor(obj)}
        except Exception as exc:  # sparse, meta, ... tensors
            return {"$": "foreign", "kind": "torch.Tensor", "text": f"a tensor that cannot be copied ({exc})"[:200]}
    if isinstance(obj, torch.dtype):
        return {"$": "dtype", "v": str(obj).removeprefix("torch.")}
    if isinstance(obj, (tuple, list, set, frozenset, torch.Size)) and len(obj) <= _MAX_ITEMS:
        tag = {tuple: "tuple", torch.Size: "tuple", list: "list", set: "set", frozenset: "set"}.get(type(obj))
        if tag is not None:
            return {"$": tag, "v": [encode(x, _depth + 1) for x in obj]}
    if type(obj) is dict and len(obj) <= _MAX_ITEMS:
        return {"$": "dict", "k": [encode(k, _depth + 1) for k in obj],
                "v": [encode(v, _depth + 1) for v in obj.values()]}
    try:
        text = repr(obj)[:200]
    except Exception:
        text = ""
    return {"$": "foreign", "kind": _type_name(obj), "text": text}


def decode(data):
    """The Python value that :func:`encode` described; raises ``ValueError`` on anything else."""
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if isinstance(data, Tensor):  # inside the tagged dict only
        raise ValueError("untagged tensor")
    if not isinstance(data, dict) or not isinstance(data.get("$"), str):
        raise ValueError(f"unexpected {type(data).__name__} in a result")
    tag = data["$"]
    if tag == "tensor" and isinstance(data.get("v"), Tensor):
        order = data.get("order")
        if order is None:
            return data["v"]
        if sorted(order) != list(range(data["v"].dim())):
            raise ValueError("bad dimension order")
        return data["v"].permute([order.index(d) for d in range(len(order))])
    if tag == "dtype" and isinstance(getattr(torch, str(data.get("v")), None), torch.dtype):
        return getattr(torch, data["v"])
    if tag == "bigint":
        return int(data["v"])
    if tag in ("tuple", "list", "set") and isinstance(data.get("v"), list):
        items = [decode(x) for x in data["v"]]
        if tag == "set":
            try:
                return set(items)
            except TypeError:
                return Foreign("builtins.set", "a set of unhashable items")
        return tuple(items) if tag == "tuple" else items
    if tag == "dict" and isinstance(data.get("k"), list) and isinstance(data.get("v"), list):
        try:
            return dict(zip((decode(k) for k in data["k"]), (decode(v) for v in data["v"])))
        except TypeError:
            return Foreign("builtins.dict", "a dict with unhashable keys")
    if tag == "foreign":
        return Foreign(str(data.get("kind", "?"))[:100], str(data.get("text", ""))[:200])
    raise ValueError(f"unknown tag {tag!r} in a result")


def dumps(data) -> bytes:
    buffer = io.BytesIO()
    torch.save(data, buffer)
    return buffer.getvalue()


def dumps_results(raws: list, limit: int = MAX_BYTES) -> bytes:
    """The raw results of one part, written; when they exceed ``limit`` bytes, a small stand-in for
    each call instead, ``{"ok": False, "too_large": size, "limit": limit}`` (``size`` the bytes of the
    whole part's results), so that an honest but huge result is reported as such rather than lost."""
    blob = dumps(raws)
    if len(blob) <= limit:
        return blob
    return dumps([{"ok": False, "too_large": len(blob), "limit": limit, "warnings": []} for _ in raws])


def loads(blob: bytes, limit: int = MAX_BYTES):
    """Read what :func:`dumps` wrote, refusing more than ``limit`` bytes (packed or unpacked)."""
    if len(blob) > limit:
        raise ValueError(f"{len(blob)} bytes, more than the {limit} allowed")
    try:
        with zipfile.ZipFile(io.BytesIO(blob)) as archive:
            unpacked = sum(info.file_size for info in archive.infolist())
    except zipfile.BadZipFile as exc:
        raise ValueError(f"not a torch archive ({exc})") from None
    if unpacked > limit:
        raise ValueError(f"{unpacked} bytes once unpacked, more than the {limit} allowed")
    return torch.load(io.BytesIO(blob), weights_only=True, map_location="cpu")


# ------------------------------------------------------------------------------------------------
# Executing a spec (this runs where the student's code runs)
# ------------------------------------------------------------------------------------------------

def exception_info(exc: BaseException) -> dict:
    """An exception as plain data: its type, message and the names of its base classes."""
    try:
        message = str(exc)
    except Exception:
        message = ""
    bases = [c.__name__ for c in type(exc).__mro__[1:]]
    return {"type": type(exc).__name__[:100], "message": message[:_MAX_TEXT], "bases": bases[:20]}


def _is_module_class(fn) -> bool:
    return isinstance(fn, type) and issubclass(fn, nn.Module)


def plain_lists(module: nn.Module) -> list[str]:
    """Attributes of ``module`` that hold sub-modules in a plain list, tuple or dict."""
    found = []
    for name, value in vars(module).items():
        if name.startswith("_"):  # nn.Module's own bookkeeping (_modules, _parameters, ...)
            continue
        if isinstance(value, (list, tuple)) and any(isinstance(v, nn.Module) for v in value):
            found.append(name)
        if isinstance(value, dict) and any(isinstance(v, nn.Module) for v in value.values()):
            found.append(name)
    return found


def _projection_weights(module: nn.Module, E: int) -> list[Tensor] | None:
    """Four (E, E) weights q, k, v, out, or a fused (3E, E) q/k/v weight and an (E, E) one."""
    weights = [p for p in module.parameters() if p.dim() == 2]
    shapes = [tuple(p.shape) for p in weights]
    if shapes == [(E, E)] * 4 or shapes == [(3 * E, E), (E, E)]:
        return weights
    return None


def _module_run(cls, spec: dict) -> dict:
    """Build ``cls(*init)``, describe it and, if asked and possible, load weights and call it."""
    module = cls(*decode(spec["init"]))
    if not isinstance(module, nn.Module):
        return {"built": False, "name": str(getattr(cls, "__name__", "?"))[:100]}
    shapes = [list(p.shape) for p in module.parameters() if p.dim() == 2]
    report = {"built": True, "lists": plain_lists(module), "shapes": shapes,
              "n_params": int(sum(p.numel() for p in module.parameters())), "loaded": False}
    weights = decode(spec["weights"]) if spec.get("weights") is not None else None
    if weights is None or report["lists"]:
        return report
    E = int(weights[0].shape[0])
    mine = _projection_weights(module, E)
    if mine is None:
        return report
    with torch.no_grad():
        if len(mine) == 4:
            for weight, W in zip(mine, weights):
                weight.copy_(W)
        else:
            mine[0].copy_(torch.cat(weights[:3], dim=0))  # (3E, E): rows q, k, v
            mine[1].copy_(weights[3])
        for p in module.parameters():
            if p.dim() == 1:
                p.zero_()  # biases
    module.eval()
    with torch.no_grad():
        out = module(*decode(spec["args"]), **decode(spec["kwargs"]))
    if isinstance(out, tuple) and out and isinstance(out[0], Tensor):
        out = out[0]  # (output, weights) is accepted from a module, as nn.MultiheadAttention does
    report["loaded"] = True
    report["value"] = encode(out)
    return report


def execute(fn, spec: dict) -> dict:
    """Run one spec against the student's answer ``fn``; never raises for the student's errors.

    Spec ops: ``call`` (``fn(*args, **kwargs)``; with ``"largest": True`` the result also holds the
    shape of the largest tensor any operation made during the call), ``answer`` (``fn`` itself, e.g. a dict), and
    ``either`` (its ``module`` spec when ``fn`` is an ``nn.Module`` class, else its ``call`` spec;
    a missing one is skipped).
    """
    op = spec["op"]
    if op == "answer":
        return {"ok": True, "value": encode(fn)}
    if op == "either":
        kind = "module" if _is_module_class(fn) else "function"
        chosen = spec.get(kind if kind == "module" else "call")
        if chosen is None:
            result = {"ok": True, "value": None, "skipped": True}
        elif kind == "module":
            result = _guarded(lambda: _module_run(fn, chosen))
        else:
            result = execute(fn, chosen)
        result["kind"] = kind
        return result
    if not callable(fn):
        return {"ok": False, "not_callable": type(fn).__name__[:100], "text": _safe_repr(fn)}
    args, kwargs = decode(spec["args"]), decode(spec["kwargs"])
    if not spec.get("largest"):
        return _guarded(lambda: {"value": encode(fn(*args, **kwargs))})

    def watched():
        with _Largest() as largest:
            value = fn(*args, **kwargs)
        return {"value": encode(value), "largest": list(largest.shape)}
    return _guarded(watched)


class _Largest(TorchDispatchMode):
    """Records the shape of the largest tensor (by number of elements) that any operation returns."""

    def __init__(self):
        super().__init__()
        self.shape, self._numel = (), -1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, Tensor) and t.numel() > self._numel:
                self.shape, self._numel = tuple(t.shape), t.numel()
        return out


def _safe_repr(obj) -> str:
    try:
        return repr(obj)[:80]
    except Exception:
        return ""


def _guarded(run) -> dict:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = run()
            result["ok"] = True
        except BaseException as exc:  # SystemExit, KeyboardInterrupt and friends too
            result = {"ok": False, "error": exception_info(exc)}
    result["warnings"] = [str(w.message)[:300] for w in caught[:20]]
    return result
