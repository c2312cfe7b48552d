"""JSON Merge Patch (RFC 7386) and JSON Patch (RFC 6902), with the API server's error texts.

The server applies JSON Patch with evanphx/json-patch: a failing operation (including ``test``)
is answered 422, an undecodable patch document 400.
"""

from __future__ import annotations

import copy
from typing import Any


class JsonPatchError(Exception):
    """``category`` is ``bad_request`` (400) or ``unprocessable`` (422)."""

    def __init__(self, category: str, message: str) -> None:
        super().__init__(message)
        self.category = category
        self.message = message


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, ``null`` removes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = apply_merge_patch(result.get(key), value)
    return result


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _tokens(pointer: Any) -> list[str]:
    if not isinstance(pointer, str):
        raise JsonPatchError("unprocessable", "operation missing path")
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise JsonPatchError("unprocessable", f"doc is missing path: {pointer}: missing value")
    return [_unescape(t) for t in pointer[1:].split("/")]


def _container(doc: Any, tokens: list[str], pointer: str) -> Any:
    node = doc
    for token in tokens[:-1]:
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            raise JsonPatchError("unprocessable", f'doc is missing path: "{pointer}": missing value')
    return node


def _get(doc: Any, pointer: str) -> Any:
    tokens = _tokens(pointer)
    if not tokens:
        return doc
    parent = _container(doc, tokens, pointer)
    last = tokens[-1]
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent[int(last)]
    raise JsonPatchError("unprocessable", f'doc is missing path: "{pointer}": missing value')


def _add(doc: Any, pointer: str, value: Any) -> Any:
    tokens = _tokens(pointer)
    if not tokens:
        return value
    parent = _container(doc, tokens, pointer)
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-":
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent):
            parent.insert(int(last), value)
        else:
            raise JsonPatchError("unprocessable", f'add operation does not apply: doc is missing path: "{pointer}"')
    else:
        raise JsonPatchError("unprocessable", f'add operation does not apply: doc is missing path: "{pointer}"')
    return doc


def _remove(doc: Any, pointer: str, op: str = "remove") -> Any:
    tokens = _tokens(pointer)
    if not tokens:
        raise JsonPatchError("unprocessable", f'{op} operation does not apply: doc is missing path: "{pointer}"')
    parent = _container(doc, tokens, pointer)
    last = tokens[-1]
    if isinstance(parent, dict) and last in parent:
        return parent.pop(last)
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent.pop(int(last))
    raise JsonPatchError(
        "unprocessable", f"{op} operation does not apply: doc is missing key: {pointer}: missing value"
    )


def apply_json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902 on a copy of ``target``."""
    if not isinstance(operations, list):
        raise JsonPatchError("bad_request", "json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    doc = copy.deepcopy(target)
    for operation in operations:
        if not isinstance(operation, dict):
            raise JsonPatchError("bad_request", "json: cannot unmarshal into Go value of type jsonpatch.Operation")
        op = operation.get("op")
        path = operation.get("path")
        if op in ("add", "replace", "test") and "value" not in operation:
            raise JsonPatchError("unprocessable", f"{op} operation does not apply: missing value")
        if op == "add":
            doc = _add(doc, path, copy.deepcopy(operation["value"]))
        elif op == "remove":
            _remove(doc, path)
        elif op == "replace":
            tokens = _tokens(path)
            if not tokens:
                doc = copy.deepcopy(operation["value"])
                continue
            parent = _container(doc, tokens, path)
            last = tokens[-1]
            exists = (isinstance(parent, dict) and last in parent) or (
                isinstance(parent, list) and last.isdigit() and int(last) < len(parent)
            )
            if not exists:
                raise JsonPatchError(
                    "unprocessable", f"replace operation does not apply: doc is missing key: {path}: missing value"
                )
            parent[int(last) if isinstance(parent, list) else last] = copy.deepcopy(operation["value"])
        elif op == "move":
            value = _remove(doc, operation.get("from"), "move")
            doc = _add(doc, path, value)
        elif op == "copy":
            doc = _add(doc, path, copy.deepcopy(_get(doc, operation.get("from"))))
        elif op == "test":
            try:
                current = _get(doc, path)
            except JsonPatchError:
                current = None
            if current != operation["value"] or _kind(current) != _kind(operation["value"]):
                raise JsonPatchError("unprocessable", f"testing value {path} failed: test failed")
        else:
            raise JsonPatchError("unprocessable", f"Unexpected kind: {op}")
    return doc


def _kind(value: Any) -> str:
    return "bool" if isinstance(value, bool) else "number" if isinstance(value, int | float) else type(value).__name__
