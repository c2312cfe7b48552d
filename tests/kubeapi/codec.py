"""Decode a JSON body the way the API server's typed decoder does.

* ``null`` values become Go zero values, which are omitted on output (we drop them);
* ``metav1.Time`` / ``MicroTime`` strings are parsed strictly and re-printed canonically;
* a JSON type that does not fit the Go field type is an error;
* unknown fields are dropped and reported as warnings (``fieldValidation=Warn``, the default), or
  rejected with ``fieldValidation=Strict``.
"""

from __future__ import annotations

from typing import Any

from .gotime import TimeParseError, format_micro_time, format_time, parse_micro_time, parse_time
from .schema import SchemaNode

_DROP = object()


class DecodeError(ValueError):
    """The body cannot be decoded into the Go type."""


class StrictDecodingError(DecodeError):
    """Unknown fields with ``fieldValidation=Strict`` (always answered 400)."""


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "null"


class _Decoder:
    def __init__(self, strict: bool) -> None:
        self.strict = strict
        self.warnings: list[str] = []

    def mismatch(self, value: Any, node: SchemaNode, path: list[str], owner: str) -> DecodeError:
        where = ".".join(path)
        detail = f"number {value}" if _json_type(value) == "number" and node.kind == "integer" else _json_type(value)
        return DecodeError(
            f"json: cannot unmarshal {detail} into Go struct field {owner}.{where} of type {node.go_type()}"
        )

    def value(self, value: Any, node: SchemaNode | None, path: list[str], owner: str) -> Any:
        if value is None:
            return _DROP
        if node is None:
            return value
        kind = node.kind
        if kind in ("time", "microtime"):
            if not isinstance(value, str):
                raise DecodeError(f"json: cannot unmarshal {_json_type(value)} into Go value of type string")
            try:
                if kind == "time":
                    return format_time(parse_time(value))
                return format_micro_time(parse_micro_time(value))
            except TimeParseError as exc:
                raise DecodeError(str(exc)) from exc
        if kind == "intorstring":
            if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
                return value
            raise DecodeError(f"json: cannot unmarshal {_json_type(value)} into Go value of type intstr.IntOrString")
        if kind == "quantity":
            if isinstance(value, str):
                return value
            if isinstance(value, int | float) and not isinstance(value, bool):
                return str(int(value)) if float(value).is_integer() else repr(value)
            raise DecodeError(
                "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
            )
        if kind == "object":
            if not isinstance(value, dict):
                raise self.mismatch(value, node, path, owner)
            return self.object(value, node, path)
        if kind == "map":
            if not isinstance(value, dict):
                raise self.mismatch(value, node, path, owner)
            values = node.values()
            out = {}
            for key, item in value.items():
                decoded = self.value(item, values, [*path, key], owner)
                if decoded is not _DROP:
                    out[key] = decoded
            return out
        if kind == "array":
            if not isinstance(value, list):
                raise self.mismatch(value, node, path, owner)
            items = node.items()
            decoded_items = [self.value(item, items, path, owner) for item in value]
            return [item for item in decoded_items if item is not _DROP]
        if kind == "string" and not isinstance(value, str):
            raise self.mismatch(value, node, path, owner)
        if kind == "integer" and (isinstance(value, bool) or not isinstance(value, int)):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise self.mismatch(value, node, path, owner)
        if kind == "number" and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise self.mismatch(value, node, path, owner)
        if kind == "boolean" and not isinstance(value, bool):
            raise self.mismatch(value, node, path, owner)
        return value

    def object(self, value: dict[str, Any], node: SchemaNode, path: list[str]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, item in value.items():
            child = node.property(key)
            if child is None:
                where = ".".join([*path, key])
                self.warnings.append(f'unknown field "{where}"')
                continue
            decoded = self.value(item, child, [*path, key], node.short_name)
            if decoded is not _DROP:
                out[key] = decoded
        return out


def decode(body: Any, node: SchemaNode, *, strict: bool = False) -> tuple[dict[str, Any], list[str]]:
    """Return the normalised object and the unknown-field warnings.

    Raises :class:`DecodeError` for a body the API server could not decode (and, with
    ``strict``, for unknown fields: ``strict decoding error: unknown field "spec.foo"``).
    """
    if not isinstance(body, dict):
        raise DecodeError(f"json: cannot unmarshal {_json_type(body)} into Go value of type struct")
    decoder = _Decoder(strict)
    result = decoder.object(body, node, [])
    if strict and decoder.warnings:
        raise StrictDecodingError("strict decoding error: " + ", ".join(decoder.warnings))
    return result, decoder.warnings
