"""Trace readers: parsing, exact prefix structure, errors that name file and line, streaming."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstate.traces import (
    TraceFormatError,
    TraceRequest,
    detect_format,
    read_azure,
    read_kvcache_tester,
    read_mooncake,
    read_trace,
)
from kvstate.traces.mooncake import parse_mooncake_line
from kvstate.traces.tokens import prompt_tokens
from tests.trace_fixtures import reference_simulator

SHARED_TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    count = 0
    for left, right in zip(a, b, strict=False):
        if left != right:
            break
        count += 1
    return count


def write_jsonl(path: Path, records: list[object]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path


def mooncake(ts: int, length: int, hashes: list[int], out: int = 7) -> dict[str, object]:
    return {"timestamp": ts, "input_length": length, "output_length": out, "hash_ids": hashes}


# --- Mooncake -------------------------------------------------------------------------------


def test_mooncake_fields_and_prefix_structure(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "m.jsonl",
        [
            mooncake(0, 1100, [0, 1, 2]),  # 512 + 512 + 76
            mooncake(0, 1500, [0, 1, 3]),  # shares two full blocks
            mooncake(5, 600, [0, 4]),  # shares one block
            mooncake(9, 1100, [0, 1, 2], out=3),  # identical prompt to the first
        ],
    )
    requests = list(read_mooncake(path))
    assert [r.sequence for r in requests] == [0, 1, 2, 3]
    assert [r.arrival_s for r in requests] == [0.0, 0.0, 0.005, 0.009]
    assert [r.prompt_length for r in requests] == [1100, 1500, 600, 1100]
    assert [r.output_length for r in requests] == [7, 7, 7, 3]
    assert requests[0].request_id == "m.jsonl#1"
    assert requests[0].block_token_counts == (512, 512, 76)
    assert requests[1].block_keys == (0, 1, 3)
    assert requests[0].block_size == 512
    first, second, third, fourth = (r.prompt_token_ids for r in requests)
    assert common_prefix(first, second) == 1024
    assert common_prefix(first, third) == 512
    assert common_prefix(second, third) == 512
    assert first == fourth


def test_partial_last_block_does_not_share_with_a_longer_block_of_the_same_id(tmp_path: Path) -> None:
    # Block 1 appears once as a 100-token tail and once as a full block: they must not share tokens.
    path = write_jsonl(
        tmp_path / "m.jsonl",
        [mooncake(0, 612, [0, 1]), mooncake(1, 1124, [0, 1, 2]), mooncake(2, 612, [0, 1])],
    )
    short, long, same = (r.prompt_token_ids for r in read_mooncake(path))
    assert common_prefix(short, long) == 512
    assert short == same


def test_tokens_are_distinct_within_a_prompt(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "m.jsonl", [mooncake(0, 1300, [7, 8, 9])])
    (request,) = read_mooncake(path)
    assert len(set(request.prompt_token_ids)) == 1300
    assert min(request.prompt_token_ids) >= 0


def test_mooncake_ties_keep_file_order_and_blank_lines_count(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    lines = [json.dumps(mooncake(3, 10, [i])) for i in (5, 1, 9)]
    path.write_text(lines[0] + "\n\n" + lines[1] + "\n" + lines[2] + "\n", encoding="utf-8")
    requests = list(read_mooncake(path))
    assert [r.block_keys[0] for r in requests] == [5, 1, 9]
    assert [r.request_id for r in requests] == ["m.jsonl#1", "m.jsonl#3", "m.jsonl#4"]


@pytest.mark.parametrize(
    ("bad_line", "reason"),
    [
        ("{not json", "invalid JSON"),
        ("[1, 2]", "expected a JSON object"),
        (json.dumps(mooncake(0, 1100, [0, 1])), "2 hash ids for input_length 1100"),
        (json.dumps({"timestamp": 0, "input_length": 10, "hash_ids": [0]}), "'output_length'"),
        (json.dumps(mooncake(0, 10, [-1])), "hash id -1"),
        (json.dumps(mooncake(0, 10, ["a"])), "hash id 'a'"),
        (json.dumps({**mooncake(0, 10, [0]), "timestamp": "x"}), "'timestamp'"),
        (json.dumps(mooncake(0, 0, [])), "'input_length' must be >= 1"),
    ],
)
def test_mooncake_malformed_line_names_file_and_line(tmp_path: Path, bad_line: str, reason: str) -> None:
    path = tmp_path / "bad.jsonl"
    good = json.dumps(mooncake(0, 10, [0]))
    path.write_text(f"{good}\n{good}\n{bad_line}\n{good}\n", encoding="utf-8")
    stream = read_mooncake(path)
    assert next(stream).sequence == 0
    assert next(stream).sequence == 1
    with pytest.raises(TraceFormatError) as caught:
        next(stream)
    assert caught.value.line_number == 3
    assert caught.value.path == str(path)
    assert f"{path}:3: " in str(caught.value)
    assert reason in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_mooncake_reader_is_lazy(tmp_path: Path) -> None:
    # Only the first line is valid: a reader that parsed the whole file up front would fail at once.
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps(mooncake(0, 10, [0])) + "\n" + "garbage\n" * 1000, encoding="utf-8")
    stream = read_mooncake(path)
    assert next(stream).block_keys == (0,)
    assert list(read_mooncake(path, limit=1))[0].prompt_length == 10


def test_mooncake_custom_block_size(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "s.jsonl", [mooncake(0, 40, [0, 1, 2]), mooncake(0, 33, [0, 1, 3])])
    a, b = read_mooncake(path, block_size=16)
    assert a.block_token_counts == (16, 16, 8)
    assert common_prefix(a.prompt_token_ids, b.prompt_token_ids) == 32


# --- prefix-structure property -----------------------------------------------------------------

paths = st.lists(st.integers(min_value=0, max_value=2), min_size=1, max_size=6)


@settings(max_examples=200, deadline=None)
@given(left=paths, right=paths, left_tail=st.integers(1, 8), right_tail=st.integers(1, 8))
def test_token_prefix_equals_block_prefix(
    left: list[int], right: list[int], left_tail: int, right_tail: int
) -> None:
    """Prefix-chained keys from a tree of branching 3; the last block is partial."""
    block_size = 8

    def keys(path: list[int]) -> list[int]:
        node, out = 0, []
        for step in path:
            node = node * 3 + step + 1
            out.append(node)
        return out

    def counts(path: list[int], tail: int) -> list[int]:
        return [block_size] * (len(path) - 1) + [tail]

    left_keys, right_keys = keys(left), keys(right)
    left_counts, right_counts = counts(left, left_tail), counts(right, right_tail)
    a = prompt_tokens(left_keys, left_counts, block_size, 0)
    b = prompt_tokens(right_keys, right_counts, block_size, 1)
    shared_blocks = 0
    while (
        shared_blocks < min(len(left_keys), len(right_keys))
        and left_keys[shared_blocks] == right_keys[shared_blocks]
        and left_counts[shared_blocks] == right_counts[shared_blocks]
    ):
        shared_blocks += 1
    expected = sum(left_counts[:shared_blocks])
    if shared_blocks < min(len(left_keys), len(right_keys)) and (
        left_keys[shared_blocks] == right_keys[shared_blocks]
    ):
        # Same key, one copy partial: the blocks must not share a single token.
        assert left_counts[shared_blocks] != right_counts[shared_blocks]
    assert common_prefix(a, b) == expected


# --- kv-cache-tester ------------------------------------------------------------------------


def conversation(trace_id: str, requests: list[dict[str, object]]) -> dict[str, object]:
    return {"id": trace_id, "block_size": 4, "hash_id_scope": "local", "requests": requests}


def turn(t: float, prompt: int, hashes: list[int], out: int = 5) -> dict[str, object]:
    return {"t": t, "type": "n", "in": prompt, "out": out, "hash_ids": hashes}


def write_archive(path: Path, documents: dict[str, bytes]) -> Path:
    with tarfile.open(path, mode="w:xz") as archive:
        folder = tarfile.TarInfo("traces")
        folder.type = tarfile.DIRTYPE
        archive.addfile(folder)  # the shipped archive has a directory member too
        for name, raw in documents.items():
            info = tarfile.TarInfo(f"traces/{name}")
            info.size = len(raw)
            archive.addfile(info, io.BytesIO(raw))
    return path


def two_conversations() -> dict[str, bytes]:
    first = conversation(
        "trace_a",
        [
            turn(0.0, 10, [1, 2]),  # 8 hashed tokens + 2-token private tail
            {
                "t": 1.0,
                "type": "subagent",
                "agent_id": "agent_001",
                "requests": [turn(0.0, 8, [1, 9]), turn(5.0, 12, [1, 9, 10])],
            },
            turn(3.0, 14, [1, 2, 3]),
        ],
    )
    second = conversation("trace_b", [turn(0.0, 8, [1, 2]), turn(2.5, 8, [1, 2])])
    return {"trace_0001.json": json.dumps(first).encode(), "trace_0002.json": json.dumps(second).encode()}


def test_kvcache_tester_archive_flattens_subagents_and_namespaces_ids(tmp_path: Path) -> None:
    archive = write_archive(tmp_path / "t.tar.xz", two_conversations())
    requests = list(read_kvcache_tester(archive))
    assert [r.request_id for r in requests] == [
        "trace_a/requests[0]",
        "trace_a/requests[1].requests[0]",
        "trace_a/requests[2]",
        "trace_a/requests[1].requests[1]",
        "trace_b/requests[0]",
        "trace_b/requests[1]",
    ]
    # Subagent times count from the subagent entry; conversation b starts at a's last arrival (6.0).
    assert [r.arrival_s for r in requests] == [0.0, 1.0, 3.0, 6.0, 6.0, 8.5]
    assert [r.conversation for r in requests] == ["trace_a"] * 4 + ["trace_b"] * 2
    assert [r.prompt_length for r in requests] == [10, 8, 14, 12, 8, 8]
    assert all(r.block_size == 4 for r in requests)
    a0, sub0, a2, sub1, b0, b1 = (r.prompt_token_ids for r in requests)
    assert common_prefix(a0, a2) == 8  # blocks 1,2 shared; a0's private tail is not
    assert common_prefix(a0, sub0) == 4  # subagent shares the parent's id namespace
    assert common_prefix(sub0, sub1) == 8
    assert common_prefix(a0, b0) == 0  # same local ids, different conversations
    assert b0 == b1


def test_kvcache_tester_zero_start_and_directory_and_single_file(tmp_path: Path) -> None:
    documents = two_conversations()
    archive = write_archive(tmp_path / "t.tar.xz", documents)
    zero = [r.arrival_s for r in read_kvcache_tester(archive, conversation_start="zero")]
    assert zero == [0.0, 1.0, 3.0, 6.0, 0.0, 2.5]
    folder = tmp_path / "traces"
    folder.mkdir()
    for name, raw in documents.items():
        (folder / name).write_bytes(raw)
    from_dir = list(read_kvcache_tester(folder))
    from_archive = list(read_kvcache_tester(archive))
    assert [r.prompt_token_ids for r in from_dir] == [r.prompt_token_ids for r in from_archive]
    single = list(read_kvcache_tester(folder / "trace_0002.json"))
    assert [r.request_id for r in single] == ["trace_b/requests[0]", "trace_b/requests[1]"]
    only_b = list(read_kvcache_tester(archive, conversations=["trace_b"]))
    assert [r.prompt_token_ids for r in only_b] == [r.prompt_token_ids for r in from_archive[4:]]


def test_kvcache_tester_malformed_member_is_named(tmp_path: Path) -> None:
    documents = two_conversations()
    documents["trace_0002.json"] = b'{"id": "trace_b",\n "requests": [\n oops]}'
    archive = write_archive(tmp_path / "t.tar.xz", documents)
    stream = read_kvcache_tester(archive)
    assert next(stream).conversation == "trace_a"  # the first conversation streams before the error
    with pytest.raises(TraceFormatError) as caught:
        list(stream)
    assert caught.value.path == f"{archive}[traces/trace_0002.json]"
    assert caught.value.line_number == 3
    assert "invalid JSON" in str(caught.value)


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        (turn(0.0, 10, [1]), "1 hash ids for in=10; expected 2"),
        ({"t": 0.0, "type": "n", "out": 1, "hash_ids": []}, "requests[0]: field 'in'"),
        (turn(-1.0, 4, [1]), "field 't'"),
        (turn(0.0, 4, [1 << 40]), "not a 32-bit id"),
        ({"t": 0.0, "type": "subagent", "requests": {}}, "requests[0].: 'requests' must be a list"),
    ],
)
def test_kvcache_tester_bad_request_names_location(
    tmp_path: Path, entry: dict[str, object], reason: str
) -> None:
    path = tmp_path / "trace_x.json"
    path.write_text(json.dumps(conversation("trace_x", [entry])), encoding="utf-8")
    with pytest.raises(TraceFormatError, match="trace_x.json") as caught:
        list(read_kvcache_tester(path))
    assert reason in str(caught.value)


def test_kvcache_tester_corrupt_archive(tmp_path: Path) -> None:
    path = tmp_path / "broken.tar.xz"
    path.write_bytes(b"\xfd7zXZ\x00 not really xz")
    with pytest.raises(TraceFormatError, match="unreadable archive"):
        list(read_kvcache_tester(path))


# --- Azure ----------------------------------------------------------------------------------

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def test_azure_rows_have_relative_arrivals_and_no_sharing(tmp_path: Path) -> None:
    path = tmp_path / "az.csv"
    path.write_text(
        AZURE_HEADER
        + "2023-11-16 23:59:59.5000000,5,2\n"
        + "2023-11-17 00:00:00.7500000,5,0\n"
        + "2023-11-17 00:00:00.7500000,3,9\n",
        encoding="utf-8",
    )
    requests = list(read_azure(path))
    assert [r.arrival_s for r in requests] == pytest.approx([0.0, 1.25, 1.25])
    assert [r.prompt_length for r in requests] == [5, 5, 3]
    assert [r.output_length for r in requests] == [2, 0, 9]
    assert [r.request_id for r in requests] == ["az.csv#2", "az.csv#3", "az.csv#4"]
    tokens = [set(r.prompt_token_ids) for r in requests]
    assert not tokens[0] & tokens[1] and not tokens[1] & tokens[2] and not tokens[0] & tokens[2]
    assert requests[0].block_keys == () and requests[0].block_size == 0


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ("2023-11-16 18:00:00.1,abc,3", "ContextTokens is not an integer"),
        ("2023-11-16 18:00:00.1,0,3", "ContextTokens must be >= 1"),
        ("2023-11-16 18:00:00.1,4,-1", "GeneratedTokens must be >= 0"),
        ("2023-11-16 25:00:00.1,4,1", "bad TIMESTAMP"),
        ("yesterday,4,1", "bad TIMESTAMP"),
        ("2023-11-16 18:00:00.1,4", "expected 3 columns"),
    ],
)
def test_azure_malformed_row_names_file_and_line(tmp_path: Path, row: str, reason: str) -> None:
    path = tmp_path / "az.csv"
    path.write_text(AZURE_HEADER + "2023-11-16 18:00:00.0,4,1\n" + row + "\n", encoding="utf-8")
    stream = read_azure(path)
    assert next(stream).prompt_length == 4
    with pytest.raises(TraceFormatError) as caught:
        next(stream)
    assert caught.value.line_number == 3
    assert reason in str(caught.value)


def test_azure_bad_header(tmp_path: Path) -> None:
    path = tmp_path / "az.csv"
    path.write_text("time,in,out\n", encoding="utf-8")
    with pytest.raises(TraceFormatError, match=r"az.csv:1: expected header"):
        list(read_azure(path))


# --- dispatch and the shipped traces ---------------------------------------------------------


def test_detect_format_and_read_trace(tmp_path: Path) -> None:
    assert detect_format("x/conversation_trace.jsonl") == "mooncake"
    assert detect_format("x/AzureLLMInferenceTrace_conv.csv") == "azure"
    assert detect_format("x/traces.tar.xz") == "kvcache-tester"
    assert detect_format(tmp_path) == "kvcache-tester"
    with pytest.raises(TraceFormatError, match="cannot tell"):
        detect_format("trace.bin")
    path = write_jsonl(tmp_path / "m.jsonl", [mooncake(0, 20, [0, 1])])
    (request,) = read_trace(path, block_size=16)
    assert isinstance(request, TraceRequest)
    assert request.block_token_counts == (16, 4)


def test_parse_single_line_keeps_given_sequence() -> None:
    request = parse_mooncake_line(json.dumps(mooncake(1500, 3, [4])), "f.jsonl", 9, 41, 512)
    assert (request.sequence, request.arrival_s, request.request_id) == (41, 1.5, "f.jsonl#9")


@pytest.mark.skipif(not (SHARED_TRACES / "conversation_trace.jsonl").exists(), reason="shared traces absent")
def test_shipped_mooncake_head_shares_the_system_prompt_block() -> None:
    requests = list(read_mooncake(SHARED_TRACES / "conversation_trace.jsonl", limit=200))
    assert len(requests) == 200
    assert requests[0].prompt_length == 6758 and requests[0].output_length == 500
    assert all(r.block_keys[0] == 0 for r in requests)
    first = requests[0].prompt_token_ids
    assert all(common_prefix(first, r.prompt_token_ids) >= min(512, r.prompt_length) for r in requests)


# --- token materialisation ------------------------------------------------------------------


def test_without_tokens_the_ids_are_computed_on_demand_and_identical(tmp_path: Path) -> None:
    moon = write_jsonl(tmp_path / "m.jsonl", [mooncake(0, 1100, [0, 1, 2]), mooncake(1, 600, [0, 4])])
    archive = write_archive(tmp_path / "t.tar.xz", two_conversations())
    azure = tmp_path / "az.csv"
    azure.write_text(AZURE_HEADER + "2023-11-16 18:00:00.0,4,1\n", encoding="utf-8")
    for path in (moon, archive, azure):
        stored = list(read_trace(path))
        lazy = list(read_trace(path, with_tokens=False))
        assert [r.prompt_token_ids for r in lazy] == [()] * len(stored)
        assert [r.token_ids() for r in lazy] == [r.prompt_token_ids for r in stored]
        assert [r.with_token_ids() for r in lazy] == stored
        assert [r.prompt_length for r in lazy] == [len(r.prompt_token_ids) for r in stored]


def test_trace_request_rejects_inconsistent_lengths() -> None:
    with pytest.raises(ValueError, match="3 token ids for prompt_length 4"):
        TraceRequest("r", 0, 0.0, 4, 1, "s", private_tail=4, prompt_token_ids=(1, 2, 3))
    with pytest.raises(ValueError, match="blocks cover 6 tokens, prompt_length is 5"):
        TraceRequest("r", 0, 0.0, 5, 1, "s", block_size=4, block_keys=(1, 2), block_token_counts=(4, 2))


# --- the independent reference simulator in tools/ ------------------------------------------


def test_reference_simulator_hand_computed_policies() -> None:
    sim = reference_simulator()
    trace = sim.BlockTrace()
    for hashes in ([1, 2], [1, 3], [1, 2]):
        trace.add(hashes, [10, 10])
    everything = sim.infinite(trace)
    assert (everything.hit_tokens, everything.total_tokens, everything.hit_blocks) == (30, 60, 3)
    # Leaf LRU, 2 blocks: B evicts leaf 2 (never the shared parent 1); C hits 1 only.
    lru = sim.leaf_lru(trace, 2)
    assert (lru.hit_tokens, lru.evicted_blocks) == (20, 2)
    # FIFO, 2 blocks: B's insert evicts the oldest block, the shared parent 1, so C misses.
    first_in = sim.fifo(trace, 2)
    assert (first_in.hit_tokens, first_in.evicted_blocks) == (10, 3)
    # Warmup 0.5 measures only the last two requests (floor(3 * 0.5) = 1 warmed).
    assert sim.infinite(trace, 0.5).total_tokens == 40
    assert sim.leaf_lru(trace, 50, 0.5, require_full=True).underfilled


def test_reference_simulator_same_id_under_different_parents_is_a_different_block() -> None:
    sim = reference_simulator()
    trace = sim.BlockTrace()
    trace.add([1, 5], [4, 4])
    trace.add([2, 5], [4, 4])
    assert sim.infinite(trace).hit_tokens == 0
    assert len(trace.parent) == 5  # root + 4 distinct trie nodes
