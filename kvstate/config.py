"""Model geometry and KV-cache capacity planning (pure integer arithmetic).

``ModelConfig`` owns nothing but numbers.  Every size it reports is an exact
integer: bytes per token, tokens and pages that fit in a byte budget, and
SGLang's sizing rules (``mem_fraction_static`` and the default request-row
count).  Fractions are handled with ``fractions.Fraction`` so no float
rounding ever decides a capacity.
"""

from __future__ import annotations

from fractions import Fraction
from numbers import Real

import attrs


def positive_int(name: str, value: object) -> int:
    """``value`` if it is an int > 0 (not a bool), else ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return value


def non_negative_int(name: str, value: object) -> int:
    """``value`` if it is an int >= 0 (not a bool), else ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def _fraction(name: str, value: object) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"{name} must be a number in (0, 1], got {value!r}")
    exact = Fraction(str(value)) if isinstance(value, float) else Fraction(str(value))
    if not 0 < exact <= 1:
        raise ValueError(f"{name} must be in (0, 1], got {value}")
    return exact


@attrs.frozen
class ModelConfig:
    """Per-token KV geometry of a model.

    ``v_head_dim`` defaults to ``head_dim``; ``dtype_bytes`` is the element size
    of the KV cache dtype (2 for fp16/bf16, 1 for fp8).
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int = 2
    v_head_dim: int | None = None

    def __attrs_post_init__(self) -> None:
        positive_int("num_layers", self.num_layers)
        positive_int("num_kv_heads", self.num_kv_heads)
        positive_int("head_dim", self.head_dim)
        positive_int("dtype_bytes", self.dtype_bytes)
        if self.v_head_dim is not None:
            positive_int("v_head_dim", self.v_head_dim)

    @property
    def value_head_dim(self) -> int:
        return self.head_dim if self.v_head_dim is None else self.v_head_dim

    @property
    def bytes_per_token(self) -> int:
        """K plus V bytes of one token over all layers.

        Equals ``layers * heads * head_dim * dtype_bytes * 2`` when K and V
        share a head size.
        """
        per_layer = self.num_kv_heads * (self.head_dim + self.value_head_dim) * self.dtype_bytes
        return self.num_layers * per_layer

    def bytes_per_page(self, page_size: int) -> int:
        return self.bytes_per_token * positive_int("page_size", page_size)

    def max_tokens(self, budget_bytes: int) -> int:
        """Tokens whose KV fits in ``budget_bytes``."""
        return non_negative_int("budget_bytes", budget_bytes) // self.bytes_per_token

    def max_pages(self, budget_bytes: int, page_size: int) -> int:
        """Whole pages of ``page_size`` tokens that fit in ``budget_bytes``."""
        budget = non_negative_int("budget_bytes", budget_bytes)
        return budget // self.bytes_per_page(page_size)

    def static_pool_tokens(
        self, total_bytes: int, available_bytes: int, mem_fraction_static: float
    ) -> int:
        """SGLang's pool size: ``rest = available - total * (1 - fraction)``.

        ``total_bytes`` is device memory before the weights were loaded,
        ``available_bytes`` what is free after.  Returns the tokens that fit in
        ``rest`` (0 when the rest is negative).
        """
        total = non_negative_int("total_bytes", total_bytes)
        available = non_negative_int("available_bytes", available_bytes)
        fraction = _fraction("mem_fraction_static", mem_fraction_static)
        rest = available - total * (1 - fraction)
        if rest <= 0:
            return 0
        return int(rest // self.bytes_per_token)


def align_to_page(token_count: int, page_size: int) -> int:
    """Round ``token_count`` down to whole pages, as SGLang sizes its pool."""
    tokens = non_negative_int("token_count", token_count)
    return tokens // positive_int("page_size", page_size) * page_size


def default_max_num_reqs(max_total_tokens: int, context_len: int) -> int:
    """SGLang's default request-row count: ``min(max(T / ctx * 512, 2048), 4096)``."""
    tokens = non_negative_int("max_total_tokens", max_total_tokens)
    context = positive_int("context_len", context_len)
    scaled = Fraction(tokens, context) * 512
    return int(min(max(scaled, Fraction(2048)), Fraction(4096)))
