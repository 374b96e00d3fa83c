"""``--model`` values: a named layout, ``custom:key=value,...``, or a JSON file of the same keys.

Syntax (every value a decimal integer)::

    custom:full=8,swa=40,window=1024,kv_heads=8,head_dim=128
    custom:full=12,mamba=36,state_bytes=2146304,kv_heads=2,head_dim=256[,mamba_chunk=64]
    layout.json    {"full": 8, "swa": 40, "window": 1024, "kv_heads": 8, "head_dim": 128}

Keys: ``full`` (>= 1), ``swa`` and ``window`` (together), ``mamba`` and
``state_bytes`` (together; bytes of one request's conv + SSM state of one
Mamba layer), ``kv_heads``, ``head_dim`` (required), ``dtype_bytes`` (1, 2
or 4; default 2), ``mamba_chunk`` (default 64); a JSON file may also give
``name``.  Anything else (an unknown or repeated key, a missing value, a
number out of range) raises ``LayoutError`` with a one-line reason.  Pure:
reads the JSON file named, nothing else.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from kvstate.simulate.models import NAMED, HybridLayout

ALL = "all"
CUSTOM_PREFIX = "custom:"
MAX_JSON_BYTES = 1 << 16

_FIELDS = {"full": "full_layers", "swa": "swa_layers", "window": "window", "mamba": "mamba_layers",
           "kv_heads": "kv_heads", "head_dim": "head_dim", "dtype_bytes": "dtype_bytes",
           "state_bytes": "state_bytes_per_layer", "mamba_chunk": "mamba_chunk"}
_BOUNDS = {"full": (1, 4096), "swa": (0, 4096), "window": (1, 1 << 24), "mamba": (0, 4096),
           "kv_heads": (1, 4096), "head_dim": (1, 1 << 16), "dtype_bytes": (1, 4),
           "state_bytes": (1, 1 << 40), "mamba_chunk": (1, 1 << 16)}
_REQUIRED = ("full", "kv_heads", "head_dim")
_PAIRS = (("swa", "window"), ("mamba", "state_bytes"))
_INTEGER = re.compile(r"^[0-9]{1,15}$")


class LayoutError(ValueError):
    """A ``--model`` value that names no layout or describes none (the message is one line)."""


def model_names() -> list[str]:
    return sorted(NAMED)


def parse_model(text: str) -> HybridLayout:
    """The layout ``text`` names: a ``NAMED`` key, ``custom:...`` or a ``.json`` path."""
    if text in NAMED:
        return NAMED[text]
    if text.startswith(CUSTOM_PREFIX):
        return layout_from_fields(_split_custom(text[len(CUSTOM_PREFIX):]), "custom")
    if text.endswith(".json"):
        return _from_json(Path(text))
    raise LayoutError(f"unknown model {text!r}: use one of {', '.join(model_names())}, {ALL}, "
                      f"{CUSTOM_PREFIX}full=N,swa=N,window=N,kv_heads=N,head_dim=N or a .json file")


def _split_custom(spec: str) -> dict[str, Any]:
    if not spec.strip():
        raise LayoutError("custom: needs key=value pairs, e.g. custom:full=8,kv_heads=8,head_dim=128")
    fields: dict[str, Any] = {}
    for part in spec.split(","):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or not key:
            raise LayoutError(f"custom: {part!r} is not key=value")
        if key in fields:
            raise LayoutError(f"custom: {key} given twice")
        fields[key] = value.strip()
    return fields


def _from_json(path: Path) -> HybridLayout:
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_JSON_BYTES + 1)
    except OSError as error:
        raise LayoutError(f"cannot read {path}: {error.strerror or error}") from None
    if len(raw) > MAX_JSON_BYTES:
        raise LayoutError(f"{path}: larger than {MAX_JSON_BYTES} bytes")
    try:
        document = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise LayoutError(f"{path}: not JSON ({error})") from None
    except RecursionError:
        raise LayoutError(f"{path}: nested too deeply") from None
    if not isinstance(document, dict):
        raise LayoutError(f"{path}: the layout must be a JSON object")
    name = document.pop("name", path.stem)
    if not isinstance(name, str) or not 0 < len(name) <= 64:
        raise LayoutError(f"{path}: name must be a string of 1 to 64 characters")
    return layout_from_fields(document, name, where=str(path))


def layout_from_fields(fields: dict[str, Any], name: str, where: str = "custom") -> HybridLayout:
    """Validate ``fields`` (strings or JSON integers) and build the layout."""
    unknown = sorted(set(fields) - set(_FIELDS))
    if unknown:
        raise LayoutError(f"{where}: unknown key {unknown[0]!r} (keys: {', '.join(_FIELDS)})")
    values = {key: _integer(where, key, value) for key, value in fields.items()}
    for key in _REQUIRED:
        if key not in values:
            raise LayoutError(f"{where}: {key} is required")
    for first, second in _PAIRS:
        present = (values.get(first, 0) > 0, second in values)
        if present[0] != present[1]:
            given, missing = (first, second) if present[0] else (second, first)
            raise LayoutError(f"{where}: {given} needs {missing}")
    arguments: dict[str, Any] = {_FIELDS[key]: value for key, value in values.items()}
    if values.get("swa", 0) == 0:
        arguments.pop("window", None)
    try:
        return HybridLayout(name, source="given on the command line" if where == "custom" else where,
                            **arguments)
    except ValueError as error:
        raise LayoutError(f"{where}: {error}") from None


def _integer(where: str, key: str, value: Any) -> int:
    if isinstance(value, bool):
        raise LayoutError(f"{where}: {key} must be an integer, got {value!r}")
    if isinstance(value, str):
        if value.isascii() and value.isdigit() and len(value) > 15:
            low, high = _BOUNDS[key]
            raise LayoutError(f"{where}: {key} must be in [{low}, {high}], got {value[:20]}...")
        if not _INTEGER.match(value):
            raise LayoutError(f"{where}: {key} must be a decimal integer, got {value!r}")
        value = int(value)
    if not isinstance(value, int):
        raise LayoutError(f"{where}: {key} must be an integer, got {value!r}")
    low, high = _BOUNDS[key]
    if not low <= value <= high:
        raise LayoutError(f"{where}: {key} must be in [{low}, {high}], got {value}")
    if key == "dtype_bytes" and value == 3:
        raise LayoutError(f"{where}: dtype_bytes must be 1, 2 or 4, got 3")
    return value


__all__ = ["ALL", "CUSTOM_PREFIX", "LayoutError", "layout_from_fields", "model_names", "parse_model"]
