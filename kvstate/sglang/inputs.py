"""Argument checks for the SGLang front end: every call checks its input before it changes anything.

What SGLang passes (Python ints, ``array('q')``, integer tensors, numpy
integers) is accepted; a float, a bool, ``None`` or an id outside
``0..2**63-1`` (int64, the events' range) is refused with a ``TypeError`` or
``ValueError`` that names the argument.  The fast paths matter: a decode
step converts one tensor per call, an admission one prompt.
"""

from __future__ import annotations

import functools
import inspect
import operator
from array import array
from collections.abc import Callable, Sequence
from typing import Any

import torch

from kvstate.events import MAX_ID

_INT_DTYPES = frozenset({torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8})
_INT_TYPECODES = frozenset("bBhHiIlLqQ")


def as_int(value: Any, what: str, *, low: int = 0, high: int = MAX_ID) -> int:
    """One int in ``low..high``: a Python or numpy int or a 0-d integer tensor."""
    if isinstance(value, torch.Tensor):
        if value.dim() != 0 or value.dtype not in _INT_DTYPES:
            raise TypeError(f"{what} must be an int, got a {value.dtype} tensor of shape "
                            f"{tuple(value.shape)}")
        value = int(value.item())
    elif isinstance(value, bool) or value is None:
        raise TypeError(f"{what} must be an int, got {value!r}")
    else:
        try:
            value = operator.index(value)
        except TypeError:
            raise TypeError(f"{what} must be an int, got {value!r}") from None
    if not low <= value <= high:
        raise ValueError(f"{what} {value} is outside {low}..{high}")
    return int(value)


def int_list(values: Any, what: str, *, low: int = 0, high: int = MAX_ID) -> list[int]:
    """Ints in ``low..high`` from a tensor, an ``array``, a sequence or a single int (a new list)."""
    out = int_seq(values, what, low=low, high=high)
    return list(out) if out is values or type(out) is not list else out


def int_seq(values: Any, what: str, *, low: int = 0, high: int = MAX_ID) -> Sequence[int]:
    """As ``int_list``, but a list or tuple of Python ints comes back as itself (no copy)."""
    out: Sequence[int]
    if isinstance(values, torch.Tensor):
        if values.dtype not in _INT_DTYPES:
            raise TypeError(f"{what} must hold integers, got a {values.dtype} tensor")
        out = (values if values.dim() == 1 else values.reshape(-1)).tolist()
    elif isinstance(values, array):
        if values.typecode not in _INT_TYPECODES:
            raise TypeError(f"{what} must hold integers, got array typecode {values.typecode!r}")
        out = values.tolist()
        if values.typecode == "q" and high == MAX_ID:  # SGLang's key type: int64 already
            if out and min(out) < low:
                raise ValueError(f"{what}: {min(out)} is outside {low}..{high}")
            return out
    elif values is None or isinstance(values, (bool, str, bytes, float)):
        raise TypeError(f"{what} must be integers, got {values!r}")
    elif hasattr(values, "__index__") and not hasattr(values, "__len__"):  # one (numpy) int
        return [as_int(values, what, low=low, high=high)]
    else:
        if type(values) is list or type(values) is tuple:
            out = values
        else:
            try:
                out = list(values)
            except TypeError:
                raise TypeError(f"{what} must be integers, got {type(values).__name__}") from None
        if set(map(type, out)) - {int}:  # numpy ints are fine; floats and bools are not
            out = [as_int(v, what, low=low, high=high) for v in out]
    if out and (min(out) < low or max(out) > high):
        bad = next(v for v in out if not low <= v <= high)
        raise ValueError(f"{what}: {bad} is outside {low}..{high}")
    return out


def int64_tensor(values: Sequence[int]) -> torch.Tensor:
    """A new CPU int64 tensor of ``values`` (ints in int64's range), built from an ``array``
    buffer: a few times cheaper than ``torch.tensor(list)``, which infers the type of every
    element."""
    if not values:
        return torch.empty((0,), dtype=torch.int64)
    return torch.frombuffer(array("q", values), dtype=torch.int64)


def cpu_array(tensor: torch.Tensor) -> Any:
    """A numpy view sharing a CPU tensor's memory (``None`` on another device or without
    numpy): mirrors write single entries through it, at a small fraction of a tensor
    element write's cost, and the tensor sees them at once."""
    if tensor.device.type != "cpu" or tensor.requires_grad:
        return None
    try:
        return tensor.numpy()
    except (RuntimeError, TypeError):  # numpy missing, or a dtype numpy lacks
        return None


def token_ids(key: Any) -> tuple[int, ...]:
    """The token ids of a key: a sequence, tensor, ``array`` or ``RadixKey`` (honouring ``limit``)."""
    if hasattr(key, "token_ids"):
        if getattr(key, "extra_key", None) is not None or getattr(key, "cache_salt", None):
            raise ValueError("kvstate's radix tree has one namespace: extra_key and cache_salt "
                             "must be None")
        if getattr(key, "is_bigram", False):
            raise ValueError("EAGLE bigram keys are not supported by kvstate's radix tree")
        limit = getattr(key, "limit", None)
        tokens = key.token_ids
        if limit is not None:  # checked first: a limit that is not an int is named as such
            limit = as_int(limit, "RadixKey.limit", low=-MAX_ID)
            if limit < len(tokens):
                tokens = tokens[: max(limit, 0)]
        return tuple(int_seq(tokens, "token ids"))
    return tuple(int_seq(key, "token ids"))


def is_params(value: Any, field: str) -> bool:
    """True for a parameter object (ours or SGLang's own) carrying ``field``."""
    return hasattr(value, field) and not isinstance(value, (torch.Tensor, array, list, tuple))


def bind_forms(name: str, args: tuple[Any, ...], kwargs: dict[str, Any],
               *forms: Callable[..., None]) -> dict[str, Any]:
    """The arguments of the first call form (a signature-only function) they fit."""
    for form in forms:
        try:
            bound = _signature(form).bind(*args, **kwargs)
        except TypeError:
            continue
        bound.apply_defaults()
        return dict(bound.arguments)
    shapes = " or ".join(f"{name}{inspect.signature(form)}" for form in forms)
    raise TypeError(f"{name} takes {shapes}")


@functools.cache
def _signature(form: Callable[..., None]) -> inspect.Signature:
    return inspect.signature(form)


# The call forms of the paged allocator (signatures only): seed 000's, and 0.5.23's with the
# CPU copies of the lengths (kvstate reads only one copy; they hold the same values).
def extend_form_0523(prefix_lens: Any, prefix_lens_cpu: Any, seq_lens: Any, seq_lens_cpu: Any,
                     last_loc: Any, extend_num_tokens: Any, num_new_pages: Any = None) -> None:
    """``alloc_extend`` as SGLang 0.5.23 calls it."""


def extend_form(prefix_lens: Any, seq_lens: Any, last_loc: Any,
                extend_num_tokens: Any = None) -> None:
    """``alloc_extend`` in the plain form."""


def decode_form_0523(seq_lens: Any, seq_lens_cpu: Any, last_loc: Any) -> None:
    """``alloc_decode`` as SGLang 0.5.23 calls it."""


def decode_form(seq_lens: Any, last_loc: Any) -> None:
    """``alloc_decode`` in the plain form."""


def decode_args(args: tuple[Any, ...], kwargs: dict[str, Any], page_size: int,
                num_pages: int) -> tuple[list[int], list[int]]:
    """``alloc_decode``'s ``(seq_lens, last_loc)`` in either call form, checked: one
    entry per request, each ``last_loc`` a slot of the pool's ``num_pages`` pages (or
    -1) at position ``seq_len - 2`` of its page."""
    bound = bind_forms("alloc_decode", args, kwargs, decode_form_0523, decode_form)
    seqs = int_list(bound["seq_lens"], "seq_lens", low=1)
    lasts = int_list(bound["last_loc"], "last_loc", low=-1,
                     high=(num_pages + 1) * page_size - 1)
    if len(seqs) != len(lasts):
        raise ValueError("seq_lens and last_loc must have one entry per request")
    for seq, last in zip(seqs, lasts, strict=True):
        if (last + 2) % page_size != seq % page_size:
            raise ValueError(f"last_loc {last} does not sit at position {seq - 2} of a page")
    return seqs, lasts


def row_ranges(ranges: Any, allocated: int) -> list[tuple[int, int]]:
    """``free_kv_row``'s ranges, checked (ascending, disjoint, inside the row's
    ``allocated`` entries) and with touching ranges joined, so a page split
    between two of them is freed once."""
    merged: list[list[int]] = []
    for start, end in ranges:
        start, end = as_int(start, "range start"), as_int(end, "range end")
        if not start <= end <= allocated or (merged and start < merged[-1][1]):
            raise ValueError(f"range [{start}, {end}) is outside the row or out of order")
        if merged and start == merged[-1][1]:
            merged[-1][1] = end
        else:
            merged.append([start, end])
    return [(start, end) for start, end in merged]


__all__ = ["as_int", "bind_forms", "cpu_array", "decode_args", "decode_form", "decode_form_0523",
           "extend_form", "extend_form_0523", "int64_tensor", "int_list", "int_seq", "is_params",
           "row_ranges", "token_ids"]
