"""Strategic merge patch, applied the way the API server applies it.

Semantics follow ``k8s.io/apimachinery/pkg/util/strategicpatch`` (server side: parallel lists are
merged, unmatched ``null`` values are dropped):

* maps merge recursively; ``null`` deletes a key; ``{"$patch": "replace"}`` replaces a map and
  ``{"$patch": "delete"}`` empties it; a map field whose strategy is ``replace`` is replaced;
* a list field with strategy ``merge`` and a merge key merges item by item: a patch item updates
  the live item with the same key (recursively), unknown keys are added; ``{"$patch": "delete",
  <key>: v}`` removes items; ``{"$patch": "replace"}`` as an item replaces the whole list;
* a list of primitives with strategy ``merge`` is a set union; ``$deleteFromPrimitiveList/<field>``
  removes values;
* ``$setElementOrder/<field>`` fixes the order of the items it names;
* ``$retainKeys`` clears the live keys it does not list (and the patch may only set listed keys);
* every other list is replaced.

Order of merged lists: items named by the patch keep the patch's order, live-only items keep their
live order, and the two are interleaved by live position; an item the live list does not know is
placed before the remaining live-only items (which is why NPD's conditions show up before
kubelet's on real nodes).  Merge keys and strategies come from the OpenAPI schema
(:mod:`.schema`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from .schema import PatchMeta, SchemaNode

DIRECTIVE = "$patch"
RETAIN_KEYS = "$retainKeys"
SET_ELEMENT_ORDER = "$setElementOrder"
DELETE_FROM_PRIMITIVE_LIST = "$deleteFromPrimitiveList"


class SmpError(Exception):
    """A patch the API server rejects.

    ``category`` is ``bad_request`` (400), ``unprocessable`` (422) or ``internal`` (500 with
    reason ``Unknown``: errors the server passes through unclassified, such as a missing merge key).
    """

    def __init__(self, category: str, message: str) -> None:
        super().__init__(message)
        self.category = category
        self.message = message


def go_format(value: Any) -> str:
    """Render like Go's ``%v`` for decoded JSON (maps print with sorted keys)."""
    if isinstance(value, dict):
        return "map[" + " ".join(f"{k}:{go_format(value[k])}" for k in sorted(value)) + "]"
    if isinstance(value, list):
        return "[" + " ".join(go_format(v) for v in value) + "]"
    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _no_merge_key(item: Any, key: str) -> SmpError:
    return SmpError("internal", f"map: {go_format(item)} does not contain declared merge key: {key}")


def _bad_arg(expected: str, value: Any) -> SmpError:
    got = {dict: "map[string]interface {}", list: "[]interface {}", str: "string"}.get(type(value), "float64")
    return SmpError("internal", f"expected a {expected}, but received a {got}")


def _category(value: Any) -> str:
    if isinstance(value, dict):
        return "map"
    if isinstance(value, list):
        return "slice"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "float64"
    if isinstance(value, str):
        return "string"
    return "nil"


def _discard_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _discard_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_discard_nulls(v) for v in value]
    return value


def apply_strategic_merge_patch(original: dict[str, Any], patch: dict[str, Any], node: SchemaNode | None) -> dict:
    """Return ``original`` with ``patch`` applied; neither argument is modified."""
    if not isinstance(patch, dict):
        raise SmpError("bad_request", "invalid JSON document")
    return _Merger().merge_map(copy.deepcopy(original), copy.deepcopy(patch), node)


class _Merger:
    def merge_map(self, original: dict | None, patch: dict, node: SchemaNode | None) -> dict:
        if DIRECTIVE in patch:
            directive = patch[DIRECTIVE]
            if directive == "replace":
                del patch[DIRECTIVE]
                return patch
            if directive == "delete":
                return {}
            raise SmpError("internal", f"unknown patch type: {go_format(directive)} in map: {go_format(patch)}")
        if original is None:
            original = {}
        self._retain_keys(original, patch)
        self._set_element_order(original, patch, node)
        for key in list(patch):
            value = patch[key]
            is_delete_list = False
            if key.startswith(DELETE_FROM_PRIMITIVE_LIST):
                key = _extract_key(key, DELETE_FROM_PRIMITIVE_LIST)
                is_delete_list = True
            if value is None:
                original.pop(key, None)
                continue
            if key not in original:
                if not is_delete_list:
                    original[key] = _discard_nulls(value)
                continue
            current = original[key]
            if _category(current) != _category(value) or not isinstance(current, dict | list):
                if not is_delete_list:
                    original[key] = _discard_nulls(value)
                continue
            meta = node.patch_meta(key) if node is not None else PatchMeta()
            child = node.child(key) if node is not None else None
            if isinstance(current, dict):
                original[key] = value if meta.strategy == "replace" else self.merge_map(current, value, child)
            else:
                items = child.items() if child is not None else None
                original[key] = self.merge_slice_handler(current, value, items, meta, is_delete_list)
        return original

    def _retain_keys(self, original: dict, patch: dict) -> None:
        if RETAIN_KEYS not in patch:
            return
        retain = patch.pop(RETAIN_KEYS)
        if not isinstance(retain, list):
            raise SmpError("bad_request", "invalid patch format of retainKeys")
        for key, value in patch.items():
            if value is None or key.startswith((DELETE_FROM_PRIMITIVE_LIST, SET_ELEMENT_ORDER)):
                continue
            if key not in retain:
                raise SmpError("bad_request", "invalid patch format of retainKeys")
        for key in list(original):
            if key not in retain:
                del original[key]

    def _set_element_order(self, original: dict, patch: dict, node: SchemaNode | None) -> None:
        for directive_key in [k for k in patch if k.startswith(SET_ELEMENT_ORDER)]:
            order = patch.pop(directive_key)
            if not isinstance(order, list):
                raise _bad_arg("[]interface {}", order)
            key = _extract_key(directive_key, SET_ELEMENT_ORDER)
            found_original, found_patch = key in original, key in patch
            original_list = original.get(key) if found_original else []
            patch_list = patch.get(key) if found_patch else []
            if not isinstance(original_list, list):
                raise _bad_arg("[]interface {}", original_list)
            if not isinstance(patch_list, list):
                raise _bad_arg("[]interface {}", patch_list)
            meta = node.patch_meta(key) if node is not None else PatchMeta()
            child = node.child(key) if node is not None else None
            items = child.items() if child is not None else None
            merge_key = meta.merge_key or ""
            _validate_order(patch_list, order, merge_key)
            if found_original and found_patch:
                merged = self.merge_slice_handler(original_list, patch_list, items, meta, False)
            elif found_patch:
                merged = patch_list
            elif found_original:
                merged = original_list
            else:
                continue
            if not original_list and not patch_list:
                original[key] = merged
                patch.pop(key, None)
                continue
            is_map = _element_category(original_list, patch_list) == "map"
            patch_items, server_only = _partition(merged, order, merge_key, is_map)
            original[key] = _normalize_element_order(patch_items, server_only, order, original_list, merge_key, is_map)
            patch.pop(key, None)

    def merge_slice_handler(
        self, original: Any, patch: Any, items: SchemaNode | None, meta: PatchMeta, is_delete_list: bool
    ) -> list:
        if not isinstance(original, list):
            raise _bad_arg("[]interface {}", original)
        if not isinstance(patch, list):
            raise _bad_arg("[]interface {}", patch)
        if meta.strategy == "merge" or is_delete_list:
            return self.merge_slice(original, patch, items, meta.merge_key or "", is_delete_list)
        return patch

    def merge_slice(
        self, original: list, patch: list, items: SchemaNode | None, merge_key: str, is_delete_list: bool
    ) -> list:
        if not original and not patch:
            return original
        is_map = _element_category(original, patch) == "map"
        if not is_map:
            if is_delete_list:
                return [v for v in original if v not in patch]
            merged: list = []
            for value in original + patch:
                if value not in merged:
                    merged.append(value)
        else:
            if not merge_key:
                raise SmpError("internal", "cannot merge lists without merge key for type map")
            original, patch = _apply_special_elements(original, patch, merge_key)
            merged = list(original)
            for item in patch:
                if merge_key not in item:
                    raise _no_merge_key(item, merge_key)
                position = _index(merged, item, merge_key, True)
                if position >= 0:
                    merged[position] = self.merge_map(merged[position], item, items)
                else:
                    merged.append(item)
        patch_items, server_only = _partition(merged, patch, merge_key, is_map)
        return _normalize_element_order(patch_items, server_only, patch, original, merge_key, is_map)


def _extract_key(key: str, prefix: str) -> str:
    head, _, tail = key.partition("/")
    if not tail or head != prefix:
        which = "primitive list" if prefix == DELETE_FROM_PRIMITIVE_LIST else "setElementOrder list"
        raise SmpError("bad_request", f"invalid patch format of {which}")
    return tail


def _element_category(*lists: list) -> str:
    seen: str | None = None
    for values in lists:
        for value in values:
            category = _category(value)
            if category == "slice":
                raise SmpError("unprocessable", "lists of lists are not supported")
            if seen is None:
                seen = category
            elif seen != category:
                raise SmpError("internal", f"list element types are not identical: {go_format(list(lists))}")
    if seen is None:
        raise SmpError("internal", "no elements in any of the given slices")
    return seen


def _apply_special_elements(original: list, patch: list, merge_key: str) -> tuple[list, list]:
    plain: list = []
    replace = False
    original = list(original)
    for item in patch:
        if DIRECTIVE not in item:
            plain.append(item)
            continue
        directive = item[DIRECTIVE]
        if directive == "delete":
            if merge_key not in item:
                raise _no_merge_key(item, merge_key)
            original = [
                o
                for o in original
                if not (isinstance(o, dict) and o.get(merge_key) == item[merge_key] and merge_key in o)
            ]
        elif directive == "replace":
            replace = True
        elif directive == "merge":
            raise SmpError("internal", "merging lists cannot yet be specified in the patch")
        else:
            raise SmpError("internal", f"unknown patch type: {go_format(directive)} in map: {go_format(item)}")
    if replace:
        return plain, []
    return original, plain


def _index(values: list, item: Any, merge_key: str, is_map: bool) -> int:
    for position, value in enumerate(values):
        if is_map:
            if (
                isinstance(value, dict)
                and isinstance(item, dict)
                and merge_key in value
                and merge_key in item
                and value[merge_key] == item[merge_key]
            ):
                return position
        elif value == item:
            return position
    return -1


def _partition(merged: list, by: list, merge_key: str, is_map: bool) -> tuple[list, list]:
    inside: list = []
    outside: list = []
    for value in merged:
        if is_map and merge_key not in value:
            raise _no_merge_key(value, merge_key)
        (inside if _index(by, value, merge_key, is_map) >= 0 else outside).append(value)
    return inside, outside


def _insertion_sort(values: list, less: Callable[[Any, Any], bool]) -> list:
    """Go's ``sort.SliceStable`` for short slices (an insertion sort), kept for its quirks with
    a comparator that is not a strict order."""
    out = list(values)
    for i in range(1, len(out)):
        j = i
        while j > 0 and less(out[j], out[j - 1]):
            out[j], out[j - 1] = out[j - 1], out[j]
            j -= 1
    return out


def _normalize_slice_order(values: list, order: list, merge_key: str, is_map: bool) -> list:
    to_delete: list = []
    if is_map:
        for value in [*values, *order]:
            if not isinstance(value, dict):
                raise _bad_arg("map[string]interface {}", value)
            if merge_key not in value:
                raise _no_merge_key(value, merge_key)
        to_delete = [v for v in values if v.get(DIRECTIVE) == "delete"]
        values = [v for v in values if v.get(DIRECTIVE) != "delete"]

    def less(a: Any, b: Any) -> bool:
        ia = _index(order, a, merge_key, is_map)
        if ia >= 0:
            ib = _index(order, b, merge_key, is_map)
            if ib >= 0:
                return ia < ib
        return True

    return _insertion_sort(values, less) + to_delete


def _normalize_element_order(
    patch_items: list, server_only: list, patch_order: list, server_order: list, merge_key: str, is_map: bool
) -> list:
    patch_items = _normalize_slice_order(patch_items, patch_order, merge_key, is_map)
    server_only = _normalize_slice_order(server_only, server_order, merge_key, is_map)
    out: list = []
    i = j = 0
    while i < len(server_only) or j < len(patch_items):
        if i >= len(server_only):
            out.append(patch_items[j])
            j += 1
        elif j >= len(patch_items):
            out.append(server_only[i])
            i += 1
        else:
            li = _index(server_order, server_only[i], merge_key, is_map)
            ri = _index(server_order, patch_items[j], merge_key, is_map)
            if li >= 0 and ri >= 0 and li < ri:
                out.append(server_only[i])
                i += 1
            else:
                out.append(patch_items[j])
                j += 1
    return out


def _validate_order(patch_list: list, order: list, merge_key: str) -> None:
    if not order or not patch_list:
        return
    items = [v for v in patch_list if not (merge_key and isinstance(v, dict) and v.get(DIRECTIVE) == "delete")]
    p = s = 0
    while p < len(items) and s < len(order):
        if isinstance(items[p], dict) and DIRECTIVE in items[p]:
            p += 1
            continue
        if merge_key:
            if not isinstance(items[p], dict) or merge_key not in items[p]:
                raise _no_merge_key(items[p], merge_key)
            if not isinstance(order[s], dict) or merge_key not in order[s]:
                raise _no_merge_key(order[s], merge_key)
            equal = items[p][merge_key] == order[s][merge_key]
        else:
            equal = items[p] == order[s]
        if equal:
            p += 1
        s += 1
    if p < len(items):
        raise SmpError(
            "internal",
            f"The order in patch list:\n{go_format(patch_list)}\n doesn't match $setElementOrder list:\n"
            f"{go_format(order)}\n",
        )
