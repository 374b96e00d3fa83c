"""Hostile logs: CRC-valid but typed wrong, semantically wrong, absurd, deep or huge.

Every hostile input must end in a typed error with exit code 2 (or, for
well-typed events the rules refuse, exit 1 with the state before the event
unchanged), never another exception, and in bounded memory.  The hypothesis
tests run a few dozen examples in CI and thousands under the ``nightly``
profile (``KVSTATE_HYPOTHESIS_PROFILE=nightly``, tests/conftest.py).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/: log_helpers
from hostile import (  # noqa: E402
    BLOCK_GEOMETRY,
    INF,
    NOT_AN_ID,
    RADIX_GEOMETRY,
    array,
    end,
    frame,
    header,
    log,
    nested,
    pack,
    record,
)
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from kvstate.events.codec import CODEC  # noqa: E402
from kvstate.log import LogFormatError, LogReader  # noqa: E402
from kvstate.log.format import BLOCK_PREFIX, MAX_BLOCK_EVENTS, MAX_RECORD_BYTES  # noqa: E402
from kvstate.log.limits import DEFAULT_LIMITS  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
RUNNER = HERE / "run_command.py"
# What one hostile record may add to a command's peak memory: the limit's worst case
# (about 27x a 4 MiB record, docs/log-format.md) and the read buffers, with room.
MEMORY_BOUND_KIB = 192 * 1024


def run_command(tmp_path: Path, *argv: str) -> tuple[int, int, str]:
    """(exit code, peak memory growth in KiB, stderr) of one log command in a fresh process."""
    rss = tmp_path / "rss.txt"
    # KVSTATE_CODE_ROOT runs the commands of another checkout (e.g. a worktree of an old
    # commit, to see these tests fail there).
    env = {**os.environ, "PYTHONPATH": os.environ.get("KVSTATE_CODE_ROOT", str(REPO))}
    done = subprocess.run([sys.executable, str(RUNNER), str(rss), *argv], capture_output=True,
                          text=True, env=env, timeout=300, check=False)
    before, after, code = (int(x) for x in rss.read_text().split())
    assert code == done.returncode
    return code, after - before, done.stderr


def commands_for(path: Path, tmp_path: Path, verify: bool) -> list[list[str]]:
    """The commands that read ``path``; ``verify`` checks only framing and digests, so it
    sees a mistyped event as a well-framed record and is left out for those."""
    argvs = [["replay", str(path)], ["diff", str(path), str(path)],
             ["minimize", str(path), "-o", str(tmp_path / "min.kvlog")]]
    return [*argvs, ["verify", str(path)]] if verify else argvs


def assert_exit_2_in_bounded_memory(data: bytes, tmp_path: Path, fragment: str,
                                    verify: bool = True) -> None:
    path = tmp_path / "hostile.kvlog"
    path.write_bytes(data)
    for argv in commands_for(path, tmp_path, verify):
        code, grew, err = run_command(tmp_path, *argv)
        assert code == 2, (argv, err)
        assert "Traceback" not in err, err
        assert fragment in err, (argv, err)
        assert grew < MEMORY_BOUND_KIB, (argv, grew)


# -- absurd headers -------------------------------------------------------------------
def test_a_113_byte_header_declaring_1e8_pages_exits_2_without_building_anything(tmp_path):
    data = header({"num_pages": 10**8, "num_rows": 10**7}) + end(0)
    assert len(data) < 128
    assert_exit_2_in_bounded_memory(data, tmp_path, "over the limit of")


@pytest.mark.parametrize("geometry, host, option", [
    ({"num_pages": DEFAULT_LIMITS.max_pages + 1}, None, "--max-pages"),
    ({"num_pages": 8, "num_rows": DEFAULT_LIMITS.max_rows + 1}, None, "--max-rows"),
    ({"num_pages": 8}, DEFAULT_LIMITS.max_host_pages + 1, "--max-host-pages"),
])
def test_each_geometry_limit_names_its_option(tmp_path, geometry, host, option):
    extra = {} if host is None else {"initial": "tiered", "host_pages": host}
    path = tmp_path / "big.kvlog"
    path.write_bytes(header(geometry, **extra) + end(0))
    code, _, err = run_command(tmp_path, "replay", str(path))
    assert code == 2 and option in err


def test_raising_the_page_limit_builds_a_big_state_in_flat_memory(tmp_path):
    """Free lists are ranges: 2e7 pages (over the default limit) cost no memory per page in
    any of the four commands (only fingerprinting time)."""
    pages = 2 * 10**7
    path = tmp_path / "big.kvlog"
    path.write_bytes(log([pack(["al", 1, [1, 2], []])], {"num_pages": pages}))
    limit = ["--max-pages", str(pages)]
    for argv, expected in (
            (["replay", str(path), "--check-every", "0", *limit], 1),  # the end fingerprint is 0s
            (["diff", str(path), str(path), *limit], 0),
            (["minimize", str(path), "-o", str(tmp_path / "min.kvlog"), *limit], 0),
            (["verify", str(path), *limit], 0)):
        code, grew, err = run_command(tmp_path, *argv)
        assert code == expected, (argv, err)
        assert grew < 64 * 1024, (argv, grew)


# -- one record's decoded size ----------------------------------------------------------
def test_a_record_over_the_limit_is_refused_before_it_is_read(tmp_path):
    """The reported case: one 16 MiB record of empty maps (it once peaked at 1.5 GiB)."""
    room = (16 << 20) - 64
    body = record("al", [array(room) + b"\x80" * room, b"\x90"])
    assert len(body) > MAX_RECORD_BYTES
    assert_exit_2_in_bounded_memory(log([body]), tmp_path, "exceeds the")


@pytest.mark.parametrize("shape", ["empty_maps", "wrong_count", "valid_strings"])
def test_a_record_at_the_limit_decodes_in_bounded_memory(tmp_path, shape):
    room = MAX_RECORD_BYTES - 64
    if shape == "empty_maps":  # maps where ints belong: refused at the first one
        body = record("ra", [array(room) + b"\x80" * room])
    elif shape == "wrong_count":  # the slow path must not decode it generically either
        body = record("ra", [array(room) + b"\x80" * room, b"\x90"])
    else:  # the worst valid record: 2-character request names, 27x their bytes
        count = room // 3
        body = record("ra", [array(count) + b"\xa2ab" * count])
    path = tmp_path / "big.kvlog"
    path.write_bytes(log([body]))
    code, grew, err = run_command(tmp_path, "replay", str(path), "--check-every", "0")
    assert code in (1, 2) and "Traceback" not in err
    assert grew < MEMORY_BOUND_KIB, grew


@pytest.mark.parametrize("shape", ["most_events", "names_at_the_limit"])
def test_an_event_block_at_its_limits_decodes_in_bounded_memory(tmp_path, shape):
    """A format 3 block holds at most 65,536 events in at most 4 MiB: the most events (tiny
    ``Free``s) or the most bytes of the worst valid shape (2-character request names)."""
    count = MAX_BLOCK_EVENTS
    if shape == "most_events":
        items = (array(3) + pack("fr") + b"\x90\xc2") * count
    else:
        names = ((MAX_RECORD_BYTES - 64) // count - 7) // 3  # item: 7 bytes of headers
        items = (array(2) + pack("ra") + array(names) + b"\xa2ab" * names) * count
    body = BLOCK_PREFIX + array(count) + items
    assert len(body) <= MAX_RECORD_BYTES
    path = tmp_path / "block.kvlog"
    path.write_bytes(header(version=3, event_versions=CODEC.versions) + frame(body) + end(count))
    with LogReader(path) as reader:  # the block decodes (then the format 1 end record fails)
        assert next(iter(reader.records()))[0] > 0
    code, grew, err = run_command(tmp_path, "replay", str(path), "--check-every", "0")
    assert code in (1, 2) and "Traceback" not in err, err
    assert grew < MEMORY_BOUND_KIB, grew


# -- CRC-valid records typed wrong ---------------------------------------------------------
BLOCK_CASES = {
    "inf_holder": record("ba", [INF, pack([1])]),
    "inf_cache_node": record("bc", [b"\x00", array(1) + array(4) + INF + pack([1, 2, 3, 4]) +
                                    b"\xc0\x01", b"\x00"]),
    "inf_uncache_node": record("bu", [pack([1]), array(1) + INF]),
    "deep_extra": record("bc", [b"\x00", array(1) + array(4) + b"\x01" + pack([1, 2, 3, 4]) +
                                nested(600) + b"\x01", b"\x00"]),
    "deep_holder": record("bh", [nested(600), pack([1])]),
    "false_page": record("ba", [pack("r"), array(1) + b"\xc2"]),
    "neg_zero_page": record("ba", [pack("r"), array(1) + NOT_AN_ID["neg_zero"]]),
    "bytes_page": record("ba", [pack("r"), array(1) + pack(b"7")]),
    "bytes_tokens": record("bc", [b"\x00", array(1) + array(4) + b"\x01" + pack(b"abcd") +
                                  b"\xc0\x01", b"\x00"]),
    "false_stored_from": record("bc", [b"\x00", b"\x90", b"\xc2"]),
}


@pytest.mark.parametrize("name", sorted(BLOCK_CASES))
def test_block_mode_fields_are_exactly_typed(tmp_path, name):
    data = log([pack(["ra", 1, ["r"]]), BLOCK_CASES[name]], BLOCK_GEOMETRY)
    assert_exit_2_in_bounded_memory(data, tmp_path, "malformed log at byte", verify=False)


@pytest.mark.parametrize("depth", [100, 1000, 100_000])
def test_nesting_anywhere_is_a_format_error(depth):
    bodies = [record("ra", [nested(depth)]), record("#c", [b"\x00", nested(depth)]),
              nested(depth), record("al", [b"\x90", nested(depth)])]
    for body in bodies:
        with pytest.raises(LogFormatError):
            list(LogReader(io.BytesIO(log([body]))).records())


# -- every field of every event type refuses what is not its type --------------------------
def _leaves(info, path=()):  # noqa: ANN001, ANN202
    """(path, leaf type info) of every scalar position in one example value of ``info``."""
    from msgspec import inspect as mi

    if isinstance(info, mi.TupleType):
        for index, item in enumerate(info.item_types):
            yield from _leaves(item, (*path, index))
    elif isinstance(info, mi.VarTupleType):
        yield from _leaves(info.item_type, (*path, 0))
    elif isinstance(info, mi.UnionType) and any(isinstance(t, mi.NoneType) for t in info.types):
        inner = next(t for t in info.types if not isinstance(t, mi.NoneType))
        yield from _leaves(inner, path)  # Optional[...]: the value given is the inner type
    else:
        yield path, info


def _example(info):  # noqa: ANN001, ANN202
    from msgspec import inspect as mi

    if isinstance(info, mi.TupleType):
        return tuple(_example(t) for t in info.item_types)
    if isinstance(info, mi.VarTupleType):
        return (_example(info.item_type),)
    if isinstance(info, mi.UnionType):
        inner = [t for t in info.types if not isinstance(t, mi.NoneType)]
        return _example(inner[0])
    if isinstance(info, mi.LiteralType):
        return info.values[0]
    if isinstance(info, mi.BoolType):
        return False
    if isinstance(info, mi.StrType):
        return "r"
    return 1


def _packed(value, path, raw: bytes) -> bytes:  # noqa: ANN001
    """msgpack of ``value`` with the element at ``path`` replaced by raw bytes."""
    if not path:
        return raw
    assert isinstance(value, tuple)
    head, *rest = path
    return array(len(value)) + b"".join(
        _packed(item, tuple(rest), raw) if index == head else pack(item)
        for index, item in enumerate(value))


def _bad_values(leaf) -> dict[str, bytes]:  # noqa: ANN001
    """The hostile values that are outside ``leaf``'s type."""
    from msgspec import inspect as mi

    kinds = leaf.types if isinstance(leaf, mi.UnionType) else (leaf,)
    allowed: set[str] = set()
    for kind in kinds:
        if isinstance(kind, mi.IntType) and (kind.ge or 0) < 0:
            allowed.add("minus_one")
        if isinstance(kind, mi.StrType):
            allowed.add("str_7")
        if isinstance(kind, mi.BoolType):
            allowed.update(("false", "true"))
    return {name: raw for name, raw in NOT_AN_ID.items() if name not in allowed}


def _field_cases():  # noqa: ANN202
    from msgspec import inspect as mi

    from kvstate.events import EVENT_TYPES

    for tag, cls in sorted(EVENT_TYPES.items()):
        fields = mi.type_info(cls).fields
        if not fields:
            continue
        values = [_example(f.type) for f in fields]
        for position, field in enumerate(fields):
            for path, leaf in _leaves(field.type):
                if isinstance(leaf, mi.LiteralType):
                    continue  # a literal refuses every other value (tested in test_log_bad_input)
                yield tag, cls.__name__, field.name, values, position, path, leaf


FIELD_CASES = list(_field_cases())


@pytest.mark.parametrize("case", FIELD_CASES,
                         ids=[f"{c[1]}.{c[2]}{list(c[5])}" for c in FIELD_CASES])
def test_every_field_leaf_refuses_every_value_outside_its_type(case):
    tag, name, field, values, position, path, leaf = case
    good = [pack(v) for v in values]
    assert list(LogReader(io.BytesIO(log([record(tag, good)]))).events())  # the example is valid
    for bad_name, raw in _bad_values(leaf).items():
        fields = list(good)
        fields[position] = _packed(values[position], path, raw)
        data = log([record(tag, fields)])
        with pytest.raises(LogFormatError) as info:
            list(LogReader(io.BytesIO(data)).records())
        assert f"{name}" in info.value.reason, (bad_name, info.value.reason)


def test_a_token_list_given_as_bytes_is_refused():
    for tag, fields in (("in", [b"\x00", pack(b"\x01\x02"), pack([1, 2]), b"\x01", b"\x01",
                                b"\x00"]),
                        ("al", [pack(b"\x01\x02"), b"\x90"])):
        with pytest.raises(LogFormatError, match="Expected `array`, got `bytes`"):
            list(LogReader(io.BytesIO(log([record(tag, fields)]))).records())


# -- hypothesis ---------------------------------------------------------------------------
HYPOTHESIS = settings(suppress_health_check=[HealthCheck.too_slow,
                                             HealthCheck.function_scoped_fixture])


@HYPOTHESIS
@given(geometry=st.fixed_dictionaries({}, optional={
    "num_pages": st.one_of(st.integers(-2, 2**64 - 1), st.floats(), st.booleans(), st.text(max_size=3)),
    "num_rows": st.integers(-2, 2**64 - 1), "page_size": st.integers(-2, 2**64 - 1),
    "row_width": st.integers(-2, 2**64 - 1), "mode": st.text(max_size=6)}),
    checkpoint_every=st.one_of(st.integers(-2, 2**64 - 1), st.none(), st.floats()))
def test_absurd_headers_are_a_format_error_or_a_small_state(geometry, checkpoint_every):
    from kvstate.replay import replay

    data = header(geometry, checkpoint_every=checkpoint_every) + end(0)
    try:
        reader = LogReader(io.BytesIO(data))
    except LogFormatError as exc:
        assert exc.offset == 10
        return
    g = reader.header.geometry
    assert g.num_pages <= DEFAULT_LIMITS.max_pages and g.num_rows <= DEFAULT_LIMITS.max_rows
    if g.num_pages * g.page_size <= 1 << 16:  # fingerprinting a big state is slow, not hostile
        result = replay(reader, check_every=0)
        assert result.failure is not None and result.failure.kind == "fingerprint"


@HYPOTHESIS
@given(st.lists(st.tuples(st.sampled_from(sorted(NOT_AN_ID)), st.integers(0, 3)),
                min_size=1, max_size=4))
def test_huge_ints_and_impostors_in_any_allocate_position_are_refused(choices):
    fields = [[1, 2, 3, 4], [[1, [1, 2]]]]
    raw_fields = [pack(f) for f in fields]
    for bad, where in choices:
        if bad == "str_7" and where == 2:
            bad = "bytes_7"  # position 2 is an item's request id, which may be a string
        raw = NOT_AN_ID[bad]
        if where < 2:
            raw_fields[where] = array(2) + raw + pack(2)
        else:
            raw_fields[1] = array(1) + array(2) + (raw if where == 2 else pack(1)) + (
                pack([1]) if where == 2 else array(1) + raw)
    with pytest.raises(LogFormatError):
        list(LogReader(io.BytesIO(log([record("al", raw_fields)]))).records())


@HYPOTHESIS
@given(st.data())
def test_typed_crc_valid_but_semantically_wrong_logs_fail_cleanly(data):
    """Well-typed events in any order: replay either accepts each event or refuses one with
    exit code 1, leaving the fingerprint of the state before it unchanged; both backends agree."""
    from log_helpers import event_strategy

    from kvstate import events as ev
    from kvstate.backends.persistent import apply_all
    from kvstate.log import LogWriter, make_header
    from kvstate.replay import replay
    from kvstate.state import Geometry, initial_state

    kinds = [ev.ReqAlloc, ev.ReqFree, ev.Allocate, ev.Append, ev.Assign, ev.Scatter, ev.Free,
             ev.FreeMapped, ev.Share, ev.Insert, ev.Split, ev.Touch, ev.Lock, ev.Unlock, ev.Evict,
             ev.Truncate]
    events = data.draw(st.lists(event_strategy(kinds, small=9), max_size=12))
    geometry = Geometry(**RADIX_GEOMETRY)
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"hostile-{os.getpid()}.kvlog"
    writer = LogWriter(path, make_header(geometry, checkpoint_every=0), fsync=False)
    writer.write_events(events)
    writer.close(b"\0" * 16)
    outcomes = []
    for backend in ("live", "persistent"):
        with LogReader(path) as reader:
            result = replay(reader, backend=backend)
        failure = result.failure
        assert failure is not None  # the end fingerprint is zeros at the very least
        assert failure.kind in ("invalid_event", "fingerprint", "invariant"), failure
        if failure.kind == "invalid_event":
            before = apply_all(initial_state(geometry), events[: failure.event_index])
            assert result.state.fingerprint() == before.fingerprint()
        outcomes.append((failure.kind, failure.event_index, result.state.fingerprint()))
    assert outcomes[0] == outcomes[1]
    path.unlink()


@HYPOTHESIS
@given(st.lists(st.binary(max_size=40), max_size=6), st.booleans())
def test_well_framed_garbage_in_a_format_2_log_is_a_format_error(bodies, block):
    from kvstate.log.format import FORMAT_VERSION

    data = header(BLOCK_GEOMETRY if block else RADIX_GEOMETRY, version=FORMAT_VERSION) + b"".join(
        frame(b) for b in bodies)
    with pytest.raises(LogFormatError):
        list(LogReader(io.BytesIO(data)).records())
