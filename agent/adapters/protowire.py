"""The protobuf wire format, just what the pod-resources client needs (no ``protobuf`` package: memory).

A message is a sequence of fields, each a key (``field number << 3 | wire type``, a varint) and a
value: wire type 0 a varint, 1 eight bytes, 2 a length (varint) and that many bytes (strings, bytes,
nested messages, packed repeated numbers), 5 four bytes. Groups (3, 4) are long deprecated and
refused. Fields a reader does not know are skipped, as protobuf readers do.
"""

from __future__ import annotations

from collections.abc import Iterator

VARINT, FIXED64, LEN, FIXED32 = 0, 1, 2, 5
MAX_VARINT_BYTES = 10


class WireError(ValueError):
    """The bytes are not a well-formed protobuf message (truncated, a bad key, a group)."""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = 0
    for shift in range(0, 7 * MAX_VARINT_BYTES, 7):
        if pos >= len(data):
            raise WireError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
    raise WireError("varint longer than 10 bytes")


def fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of each field: an int for varints and fixed numbers, the
    bytes for length-delimited values."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise WireError("field number 0")
        if wire == VARINT:
            value, pos = _varint(data, pos)
            yield number, wire, value
        elif wire in (FIXED64, FIXED32):
            size = 8 if wire == FIXED64 else 4
            if pos + size > len(data):
                raise WireError("truncated fixed-size field")
            yield number, wire, int.from_bytes(data[pos : pos + size], "little")
            pos += size
        elif wire == LEN:
            size, pos = _varint(data, pos)
            if pos + size > len(data):
                raise WireError(f"field {number}: length {size} past the end")
            yield number, wire, data[pos : pos + size]
            pos += size
        else:
            raise WireError(f"field {number}: wire type {wire} (groups are not read)")


def text(value: int | bytes, number: int) -> str:
    """A string field's value (UTF-8, as proto3 requires)."""
    if not isinstance(value, bytes):
        raise WireError(f"field {number}: a string is length-delimited")
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as err:
        raise WireError(f"field {number}: not UTF-8") from err


def message(value: int | bytes, number: int) -> bytes:
    """A nested message field's bytes."""
    if not isinstance(value, bytes):
        raise WireError(f"field {number}: a message is length-delimited")
    return value


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_text(number: int, value: str) -> bytes:
    """A string field (empty strings are left out, as proto3 writers do)."""
    if not value:
        return b""
    raw = value.encode("utf-8")
    return _encode_varint(number << 3 | LEN) + _encode_varint(len(raw)) + raw
