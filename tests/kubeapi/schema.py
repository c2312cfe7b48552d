"""The published Kubernetes OpenAPI definitions, as shipped by the ``kubernetes-validate`` package.

``kubernetes-validate`` vendors the JSON-schema form of the API server's OpenAPI document for
several Kubernetes releases (``kubernetes-json-schema/v<release>-local/_definitions.json``).  Those
definitions keep the ``x-kubernetes-patch-strategy`` / ``x-kubernetes-patch-merge-key``
extensions, which mirror the ``patchStrategy`` / ``patchMergeKey`` struct tags the API server uses
for strategic merge patch, so merge keys are read from there rather than from a hand-written table.

The loaded document is immutable and cached per release (:func:`load_schema`).
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

_REF_PREFIX = "#/$defs/"
TIME = "io.k8s.apimachinery.pkg.apis.meta.v1.Time"
MICRO_TIME = "io.k8s.apimachinery.pkg.apis.meta.v1.MicroTime"
INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"


@dataclass(frozen=True)
class PatchMeta:
    """Strategic-merge-patch metadata of one field."""

    strategies: frozenset[str] = frozenset()
    merge_key: str | None = None

    @property
    def strategy(self) -> str | None:
        """``merge`` or ``replace`` (``retainKeys`` is reported separately), or ``None``."""
        for name in ("merge", "replace"):
            if name in self.strategies:
                return name
        return None

    @property
    def retain_keys(self) -> bool:
        return "retainKeys" in self.strategies


class SchemaNode:
    """One resolved schema (a definition, a property, a list item or a map value)."""

    def __init__(self, schema: OpenApiSchema, raw: dict[str, Any], name: str | None = None) -> None:
        self._schema = schema
        self.raw = raw
        self.name = name

    @property
    def short_name(self) -> str:
        """The Go type name, e.g. ``NodeCondition``, for error messages."""
        return (self.name or "").rsplit(".", 1)[-1] or "object"

    @property
    def kind(self) -> str:
        """One of time, microtime, intorstring, quantity, object, map, array, string, integer,
        number, boolean, any."""
        special = {TIME: "time", MICRO_TIME: "microtime", INT_OR_STRING: "intorstring", QUANTITY: "quantity"}
        if self.name in special:
            return special[self.name]
        types = self.raw.get("type")
        if isinstance(types, str):
            types = [types]
        types = [t for t in (types or []) if t != "null"]
        if not types:
            return "any"
        main = types[0]
        if main == "object":
            if "properties" in self.raw:
                return "object"
            if "additionalProperties" in self.raw:
                return "map"
            return "any"
        return main

    def go_type(self) -> str:
        kind = self.kind
        if kind == "integer":
            return "int64" if self.raw.get("format") == "int64" else "int32"
        if kind == "number":
            return "float64"
        if kind == "boolean":
            return "bool"
        if kind in ("time", "microtime"):
            return f"v1.{self.short_name}"
        if kind == "object":
            return f"v1.{self.short_name}"
        if kind == "array":
            return "[]" + (self.items().go_type() if self.items() else "interface {}")
        if kind == "map":
            return "map[string]" + (self.values().go_type() if self.values() else "interface {}")
        return kind

    def property(self, key: str) -> SchemaNode | None:
        prop = (self.raw.get("properties") or {}).get(key)
        return None if prop is None else self._schema.resolve(prop)

    def items(self) -> SchemaNode | None:
        item = self.raw.get("items")
        return None if item is None else self._schema.resolve(item)

    def values(self) -> SchemaNode | None:
        value = self.raw.get("additionalProperties")
        return self._schema.resolve(value) if isinstance(value, dict) else None

    def child(self, key: str) -> SchemaNode | None:
        """The schema of ``key`` in an object, or of any value in a map."""
        kind = self.kind
        if kind == "object":
            return self.property(key)
        if kind == "map":
            return self.values()
        return None

    def patch_meta(self, key: str) -> PatchMeta:
        prop = (self.raw.get("properties") or {}).get(key) or {}
        strategy = prop.get("x-kubernetes-patch-strategy") or ""
        return PatchMeta(
            strategies=frozenset(s for s in strategy.split(",") if s),
            merge_key=prop.get("x-kubernetes-patch-merge-key"),
        )


class OpenApiSchema:
    """Definitions keyed by their OpenAPI name, e.g. ``io.k8s.api.core.v1.Node``."""

    def __init__(self, definitions: dict[str, Any], release: str) -> None:
        self._definitions = definitions
        self.release = release

    def definition(self, name: str) -> SchemaNode:
        return SchemaNode(self, self._definitions[name], name)

    def resolve(self, raw: dict[str, Any]) -> SchemaNode:
        ref = raw.get("$ref")
        if isinstance(ref, str) and ref.startswith(_REF_PREFIX):
            name = ref[len(_REF_PREFIX) :]
            return SchemaNode(self, self._definitions[name], name)
        return SchemaNode(self, raw)


def _release_key(directory: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", directory))


def available_releases() -> list[str]:
    """Releases shipped by ``kubernetes-validate`` (e.g. ``1.37.0``), oldest first."""
    root = resources.files("kubernetes_validate").joinpath("kubernetes-json-schema")
    names = [entry.name for entry in root.iterdir() if re.fullmatch(r"v[\d.]+-local", entry.name)]
    return [name[1 : -len("-local")] for name in sorted(names, key=_release_key)]


@functools.lru_cache(maxsize=4)
def load_schema(release: str | None = None) -> OpenApiSchema:
    """Load the definitions of ``release`` (default: the newest shipped release)."""
    release = release or available_releases()[-1]
    path = resources.files("kubernetes_validate").joinpath(
        "kubernetes-json-schema", f"v{release}-local", "_definitions.json"
    )
    document = json.loads(path.read_text(encoding="utf-8"))
    return OpenApiSchema(document["$defs"], release)
