"""Hostile trace input: every reader answers with a ``TraceFormatError`` naming the line.

Each case was a traceback (or a hang) before the bounds in ``kvstate.traces.limits``:
non-UTF-8 bytes, JSON nested past the recursion limit, integers longer than
Python's 4300-digit conversion limit, and lengths so large that simulating
them would exhaust memory or overflow a 64-bit token id.  The CLI turns each
into exit 1 and one line on stderr.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvstate.cli import main
from kvstate.traces import TraceFormatError, read_azure, read_kvcache_tester, read_mooncake
from kvstate.traces.limits import MAX_LINE_BYTES, MAX_REQUEST_TOKENS

GOOD_LINE = b'{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}\n'
AZURE_HEADER = b"TIMESTAMP,ContextTokens,GeneratedTokens\n"
AZURE_ROW = b"2023-11-16 18:15:46.6805900,374,44\n"
DIGITS = b"9" * 5000


def mooncake_line(**fields: object) -> bytes:
    record = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1], **fields}
    return json.dumps(record).encode() + b"\n"


MOONCAKE_CASES = {
    "non-utf8": (b'{"timestamp": 1, "input_length": 6\xff\xfe0}\n', "not UTF-8"),
    "deep": (b"[" * 100_000 + b"]" * 100_000 + b"\n", "nested too deeply"),
    "5000 digits": (b'{"timestamp": 0, "input_length": ' + DIGITS + b', "hash_ids": [0]}\n', "too long"),
    "huge output": (mooncake_line(output_length=10**12), "'output_length'"),
    "huge prompt": (mooncake_line(input_length=10**12, hash_ids=[0]), "'input_length'"),
    "huge timestamp": (mooncake_line(timestamp=10**400), "'timestamp'"),
    "hash id past 64-bit tokens": (mooncake_line(hash_ids=[1 << 62, 1]), "hash id"),
    "overlong line": (b'{"timestamp": 0, "pad": "' + b"x" * MAX_LINE_BYTES + b'"}\n', "longer than"),
}


@pytest.mark.parametrize("case", sorted(MOONCAKE_CASES))
def test_mooncake_rejects_hostile_lines_with_the_line_number(tmp_path: Path, case: str) -> None:
    line, reason = MOONCAKE_CASES[case]
    path = tmp_path / "bad.jsonl"
    path.write_bytes(GOOD_LINE + b"\n" + line + GOOD_LINE)
    stream = read_mooncake(path)
    assert next(stream).sequence == 0
    with pytest.raises(TraceFormatError) as caught:
        next(stream)
    assert caught.value.line_number == 3
    assert reason in caught.value.reason
    assert len(str(caught.value)) < 300  # the offending value is shortened, not echoed whole


AZURE_CASES = {
    "non-utf8": (b"2023-11-16 18:15:46.6805900,3\xff4,44\n", "not UTF-8"),
    "5000 digits": (b"2023-11-16 18:15:46.6805900,374," + DIGITS + b"\n", "GeneratedTokens"),
    "huge output": (b"2023-11-16 18:15:46.6805900,374,1000000000000\n", "GeneratedTokens"),
    "underscore digits": (b"2023-11-16 18:15:46.6805900,3_74,4\n", "ContextTokens"),
    "overlong line": (b"2023-11-16 18:15:46.6805900,374," + b"4" * MAX_LINE_BYTES + b"\n", "longer than"),
}


@pytest.mark.parametrize("case", sorted(AZURE_CASES))
def test_azure_rejects_hostile_rows_with_the_line_number(tmp_path: Path, case: str) -> None:
    row, reason = AZURE_CASES[case]
    path = tmp_path / "az.csv"
    path.write_bytes(AZURE_HEADER + AZURE_ROW + row + AZURE_ROW)
    stream = read_azure(path)
    assert next(stream).prompt_length == 374
    with pytest.raises(TraceFormatError) as caught:
        next(stream)
    assert caught.value.line_number == 3
    assert reason in caught.value.reason
    assert len(str(caught.value)) < 300


def conversation_bytes(out: str = "5", extra: str = "") -> bytes:
    request = f'{{"t": 0, "type": "n", "in": 10, "out": {out}, "hash_ids": []}}'
    return f'{{"id": "c",\n"requests": [\n{request}{extra}\n]}}'.encode()


def nested_subagents(depth: int) -> bytes:
    inner: dict[str, object] = {"t": 0, "type": "n", "in": 4, "out": 1, "hash_ids": []}
    for _ in range(depth):
        inner = {"t": 0, "type": "subagent", "requests": [inner]}
    return json.dumps({"id": "c", "requests": [inner]}).encode()


KVCACHE_CASES = {
    "non-utf8": (conversation_bytes().replace(b'"out": 5', b'"out": \xff5'), "not UTF-8", 3),
    "deep": (b'{"id": "c", "requests": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply", 1),
    "5000 digits": (conversation_bytes(out=DIGITS.decode()), "too long", 3),
    "huge output": (conversation_bytes(out=str(10**12)), "'out'", None),
    "infinite t": (conversation_bytes(extra=', {"t": 1e400, "type": "n", "in": 4, "out": 1, "hash_ids": []}'),
                   "'t'", None),
    "deep subagents": (nested_subagents(200), "subagents nested", None),
}


@pytest.mark.parametrize("case", sorted(KVCACHE_CASES))
def test_kvcache_tester_rejects_hostile_documents(tmp_path: Path, case: str) -> None:
    document, reason, line = KVCACHE_CASES[case]
    path = tmp_path / "trace_c.json"
    path.write_bytes(document)
    with pytest.raises(TraceFormatError) as caught:
        list(read_kvcache_tester(path))
    assert caught.value.line_number == line
    assert reason in caught.value.reason
    assert len(str(caught.value)) < 300


def test_a_request_of_exactly_the_token_bound_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "edge.csv"
    path.write_bytes(AZURE_HEADER + b"2023-11-16 18:15:46.6805900,%d,0\n" % MAX_REQUEST_TOKENS)
    (request,) = read_azure(path, with_tokens=False)
    assert request.prompt_length == MAX_REQUEST_TOKENS
    path.write_bytes(AZURE_HEADER + b"2023-11-16 18:15:46.6805900,%d,1\n" % MAX_REQUEST_TOKENS)
    with pytest.raises(TraceFormatError, match="prompt plus output"):
        list(read_azure(path, with_tokens=False))


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("nonutf8.jsonl", GOOD_LINE + MOONCAKE_CASES["non-utf8"][0]),
        ("deep.jsonl", GOOD_LINE + MOONCAKE_CASES["deep"][0]),
        ("digits.jsonl", GOOD_LINE + MOONCAKE_CASES["5000 digits"][0]),
        ("huge.jsonl", GOOD_LINE + MOONCAKE_CASES["huge output"][0]),
        ("nonutf8.csv", AZURE_HEADER + AZURE_ROW + AZURE_CASES["non-utf8"][0]),
        ("huge.csv", AZURE_HEADER + AZURE_ROW + AZURE_CASES["huge output"][0]),
        ("deep.json", KVCACHE_CASES["deep"][0]),
        ("digits.json", KVCACHE_CASES["5000 digits"][0]),
    ],
)
def test_cli_exits_1_with_one_line_naming_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, content: bytes
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    assert main(["simulate", str(path), "--capacity", "1M"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0]
    assert err[0].startswith(f"kvstate simulate: {path}:")
