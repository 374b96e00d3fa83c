"""Argument checks of the seed-002 API (pure; raise ``TypeError``/``ValueError``, change nothing).

Ints are anything with ``__index__`` (``int``, numpy ints) except ``bool``;
request ids and prefix hashes are ``str``.  A request id must fit in the
core's request names (``MAX_NAME_CHARS`` with its ``L<layer>/`` prefix) and
be encodable as UTF-8, so that every event the manager commits can be
written to a log and read back.
"""

from __future__ import annotations

import operator
from typing import Any

from kvstate.config import ModelConfig
from kvstate.events import MAX_NAME_CHARS
from kvstate.planner.kv_layout import layer_name


def _integer(name: str, value: Any) -> int:
    """``value`` as an int (``TypeError`` for a bool, a float or a non-number)."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got bool {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}") from None


def check_count(name: str, value: object) -> int:
    """A non-negative int (``TypeError`` for a bool, a float or a non-number)."""
    number = _integer(name, value)
    if number < 0:
        raise ValueError(f"{name} must be >= 0, got {number}")
    return number


def check_text(name: str, value: object) -> str:
    """A ``str`` that UTF-8 can encode (``TypeError`` / ``ValueError`` otherwise)."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{name} {value!r} is not valid Unicode text: {exc.reason}") from None
    return value


def check_new_id(request_id: object, num_layers: int) -> str:
    """An id for a new request: a str whose core names fit the event format."""
    text = check_text("request_id", request_id)
    longest = len(layer_name(text, num_layers - 1))
    if longest > MAX_NAME_CHARS:
        raise ValueError(f"request_id has {len(text)} characters; at most "
                         f"{len(text) - longest + MAX_NAME_CHARS} fit in a core request name")
    return text


def check_id(request_id: object) -> str:
    """An id of a call on an existing request: a str (whether it is active is checked later)."""
    if not isinstance(request_id, str):
        raise TypeError(f"request_id must be a str, got {type(request_id).__name__}")
    return request_id


def model_config(config: Any) -> ModelConfig:
    """``config`` as a ``ModelConfig`` (a seed-style dataclass with the same fields converts)."""
    if isinstance(config, ModelConfig):
        return config
    try:
        return ModelConfig(config.num_layers, config.num_kv_heads, config.head_dim,
                           getattr(config, "dtype_bytes", 2), getattr(config, "v_head_dim", None))
    except AttributeError as exc:
        raise TypeError(f"config must be a kvstate.ModelConfig, got {type(config).__name__}") from exc


def check_layer(layer: object, num_layers: int) -> int:
    """A layer index in ``0..num_layers - 1`` (bool is not an int here)."""
    index = _integer("layer", layer)
    if not 0 <= index < num_layers:
        raise ValueError(f"layer {index} is outside 0..{num_layers - 1}")
    return index
