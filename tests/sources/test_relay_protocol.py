"""The relay wire protocol (version 2): the hello, chunk frames, and how the relay cuts what it reads into
chunks (see agent/sources/relay_protocol.py and agent/sources/relay_server.py). Unit tests: no sockets."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agent.sources.relay_protocol import (
    CHUNK,
    HEADER,
    MAX_BOOT_TIME,
    MAX_FRAME,
    PROTO,
    Chunk,
    Hello,
    ProtocolError,
    current_hello,
    encode_frame,
    record_seq,
)
from agent.sources.relay_server import complete_end, device_chunk, file_chunk, read_device, source_kind
from agent.sources.unixsocket import AccessPolicy, PeerCredentials


def hello_bytes(boot_time: str, *, proto: str = "2", boot_id: str = '"boot-a"', source: str = '"file"') -> bytes:
    """A hello payload written by hand: JSON from Python may contain NaN and Infinity."""
    return f'{{"proto": {proto}, "boot_time": {boot_time}, "boot_id": {boot_id}, "source": {source}}}'.encode()


def test_a_good_hello_round_trips() -> None:
    hello = Hello(proto=PROTO, boot_time=1_700_000_000.25, boot_id="boot-a", source="kernel-device")
    assert Hello.decode(hello.encode()) == hello
    assert Hello.decode(hello_bytes("0", boot_id="null")) == Hello(proto=2, boot_time=0.0, boot_id=None, source="file")
    assert Hello.decode(hello_bytes(str(2**40))).boot_time == MAX_BOOT_TIME


def test_the_relay_sends_an_acceptable_hello(tmp_path: Path) -> None:
    hello = current_hello("other-device")
    assert Hello.decode(hello.encode()) == hello
    assert current_hello("file", boot_id_path=tmp_path / "absent").boot_id is None


@pytest.mark.parametrize(
    ("boot_time", "shown"),
    [
        ("NaN", "nan"),
        ("Infinity", "inf"),
        ("-Infinity", "-inf"),
        ("-1", "-1"),
        ("-0.5", "-0.5"),
        (str(2**40 + 1), str(2**40 + 1)),
        ("1e300", "1e+300"),
        ("1" + "0" * 400, "1" + "0" * 79 + " is not"),  # an int too large for a float (shown cut short)
    ],
)
def test_an_impossible_boot_time_is_a_protocol_error_naming_it(boot_time: str, shown: str) -> None:
    with pytest.raises(ProtocolError, match="boot_time") as caught:
        Hello.decode(hello_bytes(boot_time))
    assert shown in str(caught.value)


@pytest.mark.parametrize(
    ("payload", "complaint"),
    [
        (hello_bytes('"1700000000"'), "no numeric boot_time"),
        (hello_bytes("true"), "no numeric boot_time"),
        (b'{"proto": 2}', "no numeric boot_time"),
        (hello_bytes("1", proto="true"), "unsupported relay protocol True"),
        (hello_bytes("1", proto="1"), r"unsupported relay protocol 1 .*same image"),  # version 1: refused, said why
        (hello_bytes("1", proto="3"), "unsupported relay protocol 3"),
        (hello_bytes("1", boot_id="7"), "boot_id is not a string"),
        (hello_bytes("1", source='"socket"'), "source 'socket' is not one of"),
        (hello_bytes("1", source="null"), "source None is not one of"),
        (b"[1, 2]", "not a JSON object"),
        (b"\xff", "not UTF-8 JSON"),
    ],
)
def test_other_malformed_hellos(payload: bytes, complaint: str) -> None:
    with pytest.raises(ProtocolError, match=complaint):
        Hello.decode(payload)


def test_frames() -> None:
    assert encode_frame(b"") == b"\0\0\0\0"
    assert encode_frame(b"abc") == b"\0\0\0\3abc"
    with pytest.raises(ValueError, match="exceeds MAX_FRAME"):
        encode_frame(b"x" * (MAX_FRAME + 1))
    assert json.loads(Hello(proto=PROTO, boot_time=1.5, boot_id=None).encode()) == {
        "proto": 2,
        "boot_time": 1.5,
        "boot_id": None,
        "source": "kernel-device",
    }


@pytest.mark.parametrize(
    "chunk",
    [
        Chunk(data=b"6,1,10,-;a\n6,2,20,-;b\n", first_seq=1, last_seq=2),
        Chunk(data=b"6,7,10,-;a\n", first_seq=7, last_seq=7, answered=1),
        Chunk(data=b"", answered=3),  # an answer to catch-up requests with nothing new
        Chunk(data=b"x", first_seq=2**64 - 1, last_seq=2**64 - 1),
    ],
)
def test_a_chunk_frame_round_trips(chunk: Chunk) -> None:
    frame = chunk.encode()
    (length,) = HEADER.unpack_from(frame)
    assert length == len(frame) - HEADER.size == CHUNK.size + 8 * chunk.sync + len(chunk.data)
    assert Chunk.decode(frame[HEADER.size :]) == chunk


@pytest.mark.parametrize(
    ("payload", "complaint"),
    [
        (b"C" + b"\0" * 15, "too short"),
        (b"S" + b"\0" * 23, "sync frame of 24 bytes is too short"),
        (b"X" + b"\0" * 16, "unknown frame kind"),
    ],
)
def test_a_malformed_chunk_frame_is_a_protocol_error(payload: bytes, complaint: str) -> None:
    with pytest.raises(ProtocolError, match=complaint):
        Chunk.decode(payload)


def test_a_chunk_too_large_for_a_frame_is_refused() -> None:
    with pytest.raises(ValueError, match="exceeds MAX_FRAME"):
        Chunk(data=b"x" * MAX_FRAME).encode()


@pytest.mark.parametrize(
    ("record", "seq"),
    [(b"6,42,10,-;m\n", 42), (b"6,42;m\n", 0), (b"garbage\n", 0), (b"6,x,1,-;m\n", 0), (b"6,%d,1,-;m" % 2**64, 0)],
)
def test_record_seq(record: bytes, seq: int) -> None:
    assert record_seq(record) == seq


@pytest.mark.parametrize(
    ("reads", "data", "first", "last"),
    [
        ([b"6,5,1,-;a\n", b"6,6,2,-;b\n SUBSYSTEM=pci\n"], b"6,5,1,-;a\n6,6,2,-;b\n SUBSYSTEM=pci\n", 5, 6),
        ([b"6,5,1,-;a", b"6,6,2,-;b\n"], b"6,5,1,-;a\n6,6,2,-;b\n", 5, 6),  # another device's read without \n
        ([b"junk\n"], b"junk\n", 0, 0),  # the relay parses nothing more: the client decides
    ],
)
def test_a_devices_reads_become_one_chunk(reads: list[bytes], data: bytes, first: int, last: int) -> None:
    assert device_chunk(reads) == Chunk(data=data, first_seq=first, last_seq=last)


def test_no_reads_no_chunk() -> None:
    assert device_chunk([]) is None and file_chunk(b"") is None


@pytest.mark.parametrize(
    ("buf", "end"),
    [
        (b"6,1,1,-;a\n6,2,2,-;b\n", 10),  # complete lines, but the last record may still get dictionary lines ...
        (b"6,1,1,-;a\n6,2,2,-;b\n SUB=x\n", 10),  # ... so it stays pending
        (b"6,1,1,-;a\n6,2,2,-;b", 10),  # a half line
        (b"6,1,1,-;a\n6,2", 10),
        (b"6,1,1", 0),
    ],
)
def test_complete_end_of_a_files_records(buf: bytes, end: int) -> None:
    assert complete_end(buf) == end


def test_a_files_chunk_has_the_range_of_its_first_and_last_record() -> None:
    data = b"6,3,1,-;a\n SUB=x\n6,9,2,-;b\n SUB=y\n DEV=z\n"
    assert file_chunk(data) == Chunk(data=data, first_seq=3, last_seq=9)


def test_the_source_kind_is_the_kernels_device_only_for_1_11(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"")
    assert source_kind(os.stat(tmp_path / "f")) == "file"
    assert source_kind(os.stat("/dev/null")) == "other-device"  # 1:3
    if os.path.exists("/dev/kmsg"):
        assert source_kind(os.stat("/dev/kmsg")) == "kernel-device"


def test_read_device_reads_what_is_ready_and_counts_overruns() -> None:
    reads = iter([b"6,1,1,-;a\n", BrokenPipeError(), b"6,5,2,-;b\n", BlockingIOError()])

    def read(fd: int, size: int) -> bytes:
        item = next(reads)
        if isinstance(item, BaseException):
            raise item
        return item

    assert read_device(3, read=read) == ([b"6,1,1,-;a\n", b"6,5,2,-;b\n"], 1, False)
    many = iter([b"x" * 100] * 10)
    assert read_device(3, limit=250, read=lambda fd, size: next(many)) == ([b"x" * 100] * 3, 0, True)


@pytest.mark.parametrize(
    ("make", "other"),
    [
        (lambda: Hello(proto=2, boot_time=1.0, boot_id="b"), lambda: Hello(proto=2, boot_time=1.0, boot_id="c")),
        (lambda: Chunk(data=b"x", last_seq=1), lambda: Chunk(data=b"x", last_seq=1, answered=0)),
        (lambda: PeerCredentials(pid=1, uid=2, gid=3), lambda: PeerCredentials(pid=1, uid=2, gid=4)),
        (lambda: AccessPolicy(uid=7), lambda: AccessPolicy(uid=7, gid=7)),
    ],
    ids=["Hello", "Chunk", "PeerCredentials", "AccessPolicy"],
)
def test_the_relays_values_are_frozen_and_compared_by_their_fields(make, other) -> None:
    """Frozen dataclasses in all but name (the relay does not import dataclasses: see agent/sources/unixsocket.py)."""
    value = make()
    assert value == make() and hash(value) == hash(make()) and value != other() and value != object()
    assert repr(value).startswith(type(value).__name__ + "(")
    name = type(value).__slots__[0]
    with pytest.raises(AttributeError, match="frozen"):
        setattr(value, name, None)
    with pytest.raises(AttributeError, match="frozen"):
        delattr(value, name)
    with pytest.raises(AttributeError):
        value.not_a_field = 1


@pytest.mark.parametrize("boot_id", ["4f1c-9a", 'quote" and \\ backslash', "é\n\x00", "\U0001f600", None])
def test_the_hello_the_relay_writes_without_json_is_json(boot_id: str | None) -> None:
    hello = Hello(proto=PROTO, boot_time=1_700_000_000.123456, boot_id=boot_id or None, source="other-device")
    assert json.loads(hello.encode())["boot_id"] == boot_id
    assert Hello.decode(hello.encode()) == hello
