"""The relay wire protocol's hello: what the client accepts (see agent/sources/relay_protocol.py)."""

from __future__ import annotations

import json

import pytest

from agent.sources.relay_protocol import (
    MAX_BOOT_TIME,
    MAX_FRAME,
    PROTO,
    Hello,
    ProtocolError,
    current_hello,
    encode_frame,
)


def hello_bytes(boot_time: str, *, proto: str = "1", boot_id: str = '"boot-a"') -> bytes:
    """A hello payload written by hand: JSON from Python may contain NaN and Infinity."""
    return f'{{"proto": {proto}, "boot_time": {boot_time}, "boot_id": {boot_id}}}'.encode()


def test_a_good_hello_round_trips() -> None:
    hello = Hello(proto=PROTO, boot_time=1_700_000_000.25, boot_id="boot-a")
    assert Hello.decode(hello.encode()) == hello
    assert Hello.decode(hello_bytes("0", boot_id="null")) == Hello(proto=PROTO, boot_time=0.0, boot_id=None)
    assert Hello.decode(hello_bytes(str(2**40))).boot_time == MAX_BOOT_TIME


def test_the_relay_sends_an_acceptable_hello() -> None:
    hello = current_hello()
    assert Hello.decode(hello.encode()) == hello


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
        (b'{"proto": 1}', "no numeric boot_time"),
        (hello_bytes("1", proto="true"), "unsupported relay protocol True"),
        (hello_bytes("1", proto="2"), "unsupported relay protocol 2"),
        (hello_bytes("1", boot_id="7"), "boot_id is not a string"),
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
        "proto": 1,
        "boot_time": 1.5,
        "boot_id": None,
    }
