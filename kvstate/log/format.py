"""The kvstate log format: constants, framing, header, and record (de)coding.

Layout of a log file (all integers little-endian)::

    offset 0   magic        8 bytes  b"\\x89KVS\\r\\n\\x1a\\n"
    offset 8   format       u16      FORMAT_VERSION of the writer
    offset 10  header       frame    msgpack map (geometry, checkpoint interval, meta)
    then       records      frame*   event blocks (or single events), checkpoints, the end

    frame := u32 length | u32 crc32(length bytes + body) | body (length bytes of msgpack)

Record bodies are msgpack arrays ``[tag, version, ...]``: a single event is
``[tag, version, *fields]`` with its two-letter tag, encoded and validated
by ``kvstate.events.codec``; the other records use tags that start with
``#`` so they can never collide with an event tag::

    ["#b", 1, [[tag, *fields], ...]]       event block (format 3): events in order, each at
                                           the version the header's event_versions gives
    ["#c", 2, seq, fingerprint, digest]    checkpoint: state fingerprint after ``seq`` events
    ["#e", 2, count, fingerprint, digest]  end: total events and the final fingerprint

``digest`` (formats 2 and 3) is blake2b-128 of every byte of the file before the
record: the preamble, the header frame and every earlier frame.  Format 1
logs carry ``["#c", 1, seq, fingerprint]`` / ``["#e", 1, count, fingerprint]``
and cannot be verified.  This module is pure byte arithmetic: it owns no
file handles and never mutates its inputs.  The header is the only body
decoded without a type (:func:`unpack_body`, every msgpack size limit set,
64 KiB at most); framing records are decoded typed (:func:`decode_framing`);
pickle is never used.  Owned by the log layer.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from typing import Any

import attrs
import msgpack
import msgspec

from kvstate.log.limits import DEFAULT_LIMITS, Limits, check_limits, meta_problem
from kvstate.msgpack_raw import array_count
from kvstate.state import Geometry

MAGIC = b"\x89KVS\r\n\x1a\n"
# 2: checkpoints and the end record carry a digest of the bytes before them;
# 3: event blocks, many events in one frame (one CRC and one C decode for all of them)
FORMAT_VERSION = 3
FRAMING_VERSION = {1: 1, 2: 2, 3: 2}  # format version -> version of its "#c"/"#e" records
BLOCK_TAG = "#b"
BLOCK_PREFIX = b"\x93\xa2#b\x01"  # [ "#b", 1, then the event array
MIN_BLOCK_FORMAT = 3
BLOCK_EVENTS = 1024  # the writer seals a block at this many events (and at every checkpoint)
MAX_BLOCK_EVENTS = 1 << 16  # a reader refuses a block declaring more, before decoding it
FRAME = struct.Struct("<II")  # length, crc32
LENGTH = struct.Struct("<I")
VERSION_FIELD = struct.Struct("<H")
PREAMBLE_SIZE = len(MAGIC) + VERSION_FIELD.size  # 10: where the header frame starts
MAX_HEADER_BYTES = 1 << 16
# A record longer than this is refused before it is read.  4 MiB holds a 500k-token
# prefill's Allocate several times over; the worst decoded size of a 4 MiB record is
# about 20x its bytes (docs/log-format.md, "Memory").
MAX_RECORD_BYTES = 1 << 22
MAX_FRAMING_BYTES = 64  # a checkpoint or end record is about 45 bytes
DEFAULT_CHECKPOINT_EVERY = 4096  # the least interval the recorder picks by itself


def auto_checkpoint_every(geometry: Geometry) -> int:
    """A checkpoint interval that keeps fingerprinting cheap per event.

    A fingerprint costs time roughly linear in the number of pages (3 to 5 ms
    at 1k pages of 16 slots or 4k pages of one slot on the reference machine,
    measured on half-full states), so the interval grows with the pool: the
    next power of two >= 64 * num_pages, at least 4096.  That keeps the
    amortised cost under a tenth of a microsecond per event (at 16 x num_pages
    it was a third of one, a third of the whole recording budget).
    """
    return max(DEFAULT_CHECKPOINT_EVERY, 1 << (64 * geometry.num_pages - 1).bit_length())


CHECKPOINT_TAG = "#c"
TIERED_INITIAL = "tiered"  # header "initial" of a log whose state has a host tier
END_TAG = "#e"
FINGERPRINT_BYTES = 16
DIGEST_BYTES = 16


def new_digest() -> Any:
    """The running digest a writer and a reader keep over a log's bytes."""
    return hashlib.blake2b(digest_size=DIGEST_BYTES)


class LogFormatError(ValueError):
    """A log is malformed at ``offset`` (bytes from the start of the file) for ``reason``.

    ``record_index`` is the number of records (events, checkpoints) read
    before the bad one, when known.  Raised for every malformed input: the
    reader never lets another exception type escape for bad bytes.
    """

    def __init__(self, offset: int, reason: str, record_index: int | None = None) -> None:
        self.offset = offset
        self.reason = reason
        self.record_index = record_index
        super().__init__(f"malformed log at byte {offset}: {reason}")


class LogLimitError(LogFormatError):
    """A well-formed log declares more than a reader's ``Limits`` allow (exit 2 too)."""


@attrs.frozen
class LogHeader:
    """What a reader needs to rebuild the initial state and check the log.

    The initial state is ``kvstate.state.initial_state(geometry)``;
    ``initial_fingerprint`` pins it.  ``meta`` holds free-form, msgpack-plain
    facts about the run (workload, seed, front end, expected outcome).
    """

    geometry: Geometry
    format_version: int = FORMAT_VERSION
    kvstate_version: str = ""
    checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY
    initial_fingerprint: bytes = b""
    event_versions: dict[str, int] = attrs.field(factory=dict)
    meta: dict[str, Any] = attrs.field(factory=dict)
    host_pages: int = 0  # > 0: the run has a host tier of that many pages (``State.host``)
    swa_pages: int = 0  # > 0: the run has an SWA pool of that many pages (``State.swa``)
    mamba_slots: int = 0  # > 0: the run has a Mamba pool of that many slots (``State.mamba``)

    def to_map(self) -> dict[str, Any]:
        out = {
            "format": self.format_version,
            "kvstate_version": self.kvstate_version,
            "geometry": geometry_map(self.geometry),
            "initial": "empty",
            "initial_fingerprint": self.initial_fingerprint,
            "checkpoint_every": self.checkpoint_every,
            "event_versions": dict(sorted(self.event_versions.items())),
            "meta": self.meta,
        }
        if self.host_pages:
            # A reader that predates the host tier refuses "tiered" as an unknown
            # initial state, instead of replaying a tiered log without its host pool.
            out["initial"] = TIERED_INITIAL
            out["host_pages"] = self.host_pages
        if self.swa_pages:
            # A reader that predates the SWA pool rebuilds an initial state without it,
            # whose fingerprint differs from ``initial_fingerprint``: it refuses the log.
            out["swa_pages"] = self.swa_pages
        if self.mamba_slots:
            # Likewise: an older reader's initial state has no Mamba pool and refuses the log.
            out["mamba_slots"] = self.mamba_slots
        return out


def geometry_map(geometry: Geometry) -> dict[str, Any]:
    """Every ``Geometry`` field by name (all plain ints and strings)."""
    return {field.name: getattr(geometry, field.name) for field in attrs.fields(Geometry)}


@attrs.frozen
class Checkpoint:
    """The state fingerprint after ``seq`` events of the log (``digest``: None in format 1)."""

    seq: int
    fingerprint: bytes
    digest: bytes | None = None


@attrs.frozen
class EndRecord:
    """The last record: ``count`` events in all, and the final state's fingerprint."""

    count: int
    fingerprint: bytes
    digest: bytes | None = None


# -- framing --------------------------------------------------------------------
def frame(body: bytes) -> bytes:
    """``length | crc32(length + body) | body``."""
    length = LENGTH.pack(len(body))
    return FRAME.pack(len(body), zlib.crc32(body, zlib.crc32(length))) + body


def body_crc(length: int, body: bytes | memoryview) -> int:
    return zlib.crc32(body, zlib.crc32(LENGTH.pack(length)))


def unpack_body(body: bytes | memoryview, offset: int) -> Any:
    """Msgpack-decode one record body with every size limit bound to its length.

    Arrays decode as tuples.  Any decoding failure becomes ``LogFormatError``.
    """
    size = len(body)
    try:
        return msgpack.unpackb(
            body, use_list=False, raw=False, strict_map_key=True,
            max_str_len=size, max_bin_len=size,
            max_array_len=size, max_map_len=size, max_ext_len=size,
        )
    except Exception as exc:  # msgpack raises several unrelated types for bad bytes
        raise LogFormatError(offset, f"record body is not valid msgpack ({type(exc).__name__}: "
                                     f"{exc})") from None


def block_count(body: bytes | memoryview) -> int | None:
    """The event count an event block's array header declares (None: not a block's shape).

    Read from the bytes alone, so ``verify`` counts events without decoding them and a
    reader refuses an absurd count before decoding anything."""
    if len(body) < 6 or body[:5] != BLOCK_PREFIX:
        return None
    return array_count(body[5:])


# -- encoding -------------------------------------------------------------------
def checkpoint_body(packer: msgpack.Packer, seq: int, fingerprint: bytes, digest: bytes) -> bytes:
    return packer.pack((CHECKPOINT_TAG, 2, seq, fingerprint, digest))


def end_body(packer: msgpack.Packer, count: int, fingerprint: bytes, digest: bytes) -> bytes:
    return packer.pack((END_TAG, 2, count, fingerprint, digest))


# Typed decoders: a framing record is never decoded generically (see the module docstring).
_FRAMING_V1 = msgspec.msgpack.Decoder(tuple[str, int, int, bytes])
_FRAMING_V2 = msgspec.msgpack.Decoder(tuple[str, int, int, bytes, bytes])


def decode_framing(body: bytes, offset: int, format_version: int) -> Checkpoint | EndRecord:
    """A checkpoint or end record of a log of ``format_version``; ``LogFormatError`` otherwise."""
    what = "checkpoint" if body[2:4] == CHECKPOINT_TAG.encode() else "end record"
    version = FRAMING_VERSION[format_version]
    shape = "[tag, 1, count, fingerprint]" if version == 1 else "[tag, 2, count, fingerprint, digest]"
    if len(body) > MAX_FRAMING_BYTES:
        raise LogFormatError(offset, f"{what} is {len(body)} bytes, over {MAX_FRAMING_BYTES}")
    try:
        raw: tuple[Any, ...] = (_FRAMING_V1 if version == 1 else _FRAMING_V2).decode(body)
    except (msgspec.ValidationError, msgspec.DecodeError):
        raise LogFormatError(offset, f"{what} must be {shape} in a format {format_version} "
                                     "log") from None
    if raw[1] != version:
        raise LogFormatError(offset, f"{what} must be {shape} in a format {format_version} log")
    count, fingerprint = raw[2], raw[3]
    if count < 0:
        raise LogFormatError(offset, f"{what} count {count!r} is not a non-negative int")
    if len(fingerprint) != FINGERPRINT_BYTES:
        raise LogFormatError(offset, f"{what} fingerprint is not {FINGERPRINT_BYTES} bytes")
    digest = raw[4] if version == 2 else None
    if digest is not None and len(digest) != DIGEST_BYTES:
        raise LogFormatError(offset, f"{what} digest is not {DIGEST_BYTES} bytes")
    if raw[0] == CHECKPOINT_TAG:
        return Checkpoint(count, fingerprint, digest)
    return EndRecord(count, fingerprint, digest)


def new_packer() -> msgpack.Packer:
    return msgpack.Packer(use_bin_type=True, autoreset=True)


def preamble(header: LogHeader) -> bytes:
    """Magic, format version and the framed header map."""
    body = new_packer().pack(header.to_map())
    if len(body) > MAX_HEADER_BYTES:
        raise ValueError(f"header is {len(body)} bytes, over the {MAX_HEADER_BYTES} limit")
    return MAGIC + VERSION_FIELD.pack(header.format_version) + frame(body)


# -- header decoding ------------------------------------------------------------
def _require(value: Any, kind: type | tuple[type, ...], what: str, offset: int) -> Any:
    if isinstance(value, bool) or not isinstance(value, kind):
        raise LogFormatError(offset, f"header field {what} has type {type(value).__name__}")
    return value


def parse_header(raw: Any, format_version: int, offset: int,
                 limits: Limits = DEFAULT_LIMITS) -> LogHeader:
    """Validate the decoded header map and build a ``LogHeader`` (``LogLimitError`` when its
    geometry is beyond ``limits``)."""
    if not isinstance(raw, dict):
        raise LogFormatError(offset, f"header is a {type(raw).__name__}, not a map")
    missing = {"geometry", "checkpoint_every"} - raw.keys()
    if missing:
        raise LogFormatError(offset, f"header lacks {sorted(missing)}")
    if raw.get("format", format_version) != format_version:
        raise LogFormatError(offset, f"header says format {raw.get('format')!r}, "
                                     f"preamble says {format_version}")
    initial = raw.get("initial", "empty")
    if initial not in ("empty", TIERED_INITIAL):
        raise LogFormatError(offset, f"unsupported initial state {initial!r}")
    host_pages = 0
    if initial == TIERED_INITIAL:
        host_pages = _require(raw.get("host_pages"), int, "host_pages", offset)
        if host_pages <= 0:
            raise LogFormatError(offset, f"a tiered log needs host_pages > 0, got {host_pages}")
    elif "host_pages" in raw:
        raise LogFormatError(offset, "host_pages given but the initial state is not tiered")
    swa_pages = _require(raw.get("swa_pages", 0), int, "swa_pages", offset)
    if swa_pages < 0 or ("swa_pages" in raw and swa_pages == 0):
        raise LogFormatError(offset, f"an SWA log needs swa_pages > 0, got {swa_pages}")
    mamba_slots = _require(raw.get("mamba_slots", 0), int, "mamba_slots", offset)
    if mamba_slots < 0 or ("mamba_slots" in raw and mamba_slots == 0):
        raise LogFormatError(offset, f"a Mamba log needs mamba_slots > 0, got {mamba_slots}")
    geo = _require(raw["geometry"], dict, "geometry", offset)
    known = {field.name for field in attrs.fields(Geometry)}
    unknown = sorted(set(geo) - known)
    if unknown:
        raise LogFormatError(offset, f"geometry has fields this kvstate does not know: {unknown}")
    fields = {name: _require(value, (int, str), f"geometry.{name}", offset)
              for name, value in geo.items()}
    try:
        geometry = Geometry(**fields)
    except (TypeError, ValueError) as exc:
        raise LogFormatError(offset, f"bad geometry: {exc}") from None
    every = _require(raw["checkpoint_every"], int, "checkpoint_every", offset)
    if every < 0:
        raise LogFormatError(offset, f"checkpoint_every {every} is negative")
    fingerprint = _require(raw.get("initial_fingerprint", b""), bytes, "initial_fingerprint", offset)
    versions = _require(raw.get("event_versions", {}), dict, "event_versions", offset)
    if format_version >= MIN_BLOCK_FORMAT:  # normative from format 3: block events use them
        for tag, value in versions.items():
            if type(tag) is not str or type(value) is not int or not 0 <= value < 1 << 16:
                raise LogFormatError(offset, f"header event_versions maps {tag!r} to {value!r}, "
                                             "not a version")
    meta = _require(raw.get("meta", {}), dict, "meta", offset)
    version_text = _require(raw.get("kvstate_version", ""), str, "kvstate_version", offset)
    problem = meta_problem(meta)
    if problem is not None:
        raise LogFormatError(offset, problem)
    problem = check_limits(geometry, host_pages, limits)
    if problem is not None:
        raise LogLimitError(offset, problem)
    return LogHeader(geometry, format_version, version_text, every, fingerprint,
                     dict(versions), dict(meta), host_pages, swa_pages, mamba_slots)
