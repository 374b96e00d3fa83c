"""ModelConfig: exact byte sizes, capacity planning and SGLang's sizing rules."""

import pytest

from kvstate import ModelConfig, align_to_page, default_max_num_reqs


def test_bytes_per_token_is_exact():
    config = ModelConfig(num_layers=32, num_kv_heads=8, head_dim=128, dtype_bytes=2)
    assert config.bytes_per_token == 32 * 8 * 128 * 2 * 2 == 131072


def test_v_head_dim_changes_the_value_half_only():
    config = ModelConfig(num_layers=2, num_kv_heads=4, head_dim=192, dtype_bytes=2, v_head_dim=128)
    assert config.bytes_per_token == 2 * 4 * (192 + 128) * 2


def test_capacity_from_a_byte_budget():
    config = ModelConfig(num_layers=32, num_kv_heads=8, head_dim=128)
    budget = 10 * 2**30
    assert config.max_tokens(budget) == budget // 131072 == 81920
    assert config.max_pages(budget, page_size=16) == 5120
    assert config.max_pages(131072 * 16 - 1, page_size=16) == 0


def test_mem_fraction_static_rule():
    config = ModelConfig(num_layers=1, num_kv_heads=1, head_dim=1, dtype_bytes=2)  # 4 bytes/token
    # rest = available - total * (1 - 0.9) = 60 - 10 = 50 bytes -> 12 tokens
    assert config.static_pool_tokens(total_bytes=100, available_bytes=60, mem_fraction_static=0.9) == 12
    assert config.static_pool_tokens(total_bytes=100, available_bytes=5, mem_fraction_static=0.9) == 0
    assert config.static_pool_tokens(total_bytes=100, available_bytes=100, mem_fraction_static=1) == 25


def test_default_max_num_reqs_and_alignment():
    assert default_max_num_reqs(max_total_tokens=100_000, context_len=4096) == 4096
    assert default_max_num_reqs(max_total_tokens=8192, context_len=8192) == 2048
    assert default_max_num_reqs(max_total_tokens=6 * 8192, context_len=8192) == 3072
    assert align_to_page(1000, 16) == 992


@pytest.mark.parametrize("field,value", [
    ("num_layers", 0), ("num_kv_heads", -1), ("head_dim", 1.5), ("dtype_bytes", True),
    ("v_head_dim", 0),
])
def test_bad_values_name_the_field(field, value):
    kwargs = dict(num_layers=2, num_kv_heads=2, head_dim=2, dtype_bytes=2)
    kwargs[field] = value
    with pytest.raises(ValueError, match=field):
        ModelConfig(**kwargs)


@pytest.mark.parametrize("fraction", [0, -0.1, 1.01, "0.5"])
def test_fraction_outside_unit_interval(fraction):
    config = ModelConfig(num_layers=1, num_kv_heads=1, head_dim=1)
    with pytest.raises(ValueError, match="mem_fraction_static"):
        config.static_pool_tokens(100, 100, fraction)
