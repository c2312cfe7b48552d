"""The API semantics, independent of HTTP: one :class:`Request` in, a :class:`Response` or a
:class:`WatchStream` out.

Covers create/get/list/watch/update/patch/delete on the served resources, the ``status``
subresource, pod eviction, graceful pod deletion (a bound pod stays terminating until the
simulated kubelet confirms, see ``kubelet``), admission of namespaced objects into existing
namespaces only, dry runs, preconditions and the no-op write rule (an update that changes
nothing keeps the resourceVersion and emits no watch event).
"""

from __future__ import annotations

import base64
import copy
import json
import queue
import random
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from . import discovery, errors
from .authz import Authorizer
from .codec import DecodeError, StrictDecodingError, decode
from .disruption import check_eviction, matching_count, pdb_status
from .errors import ApiError, FieldError
from .gotime import TimeParseError, format_time, parse_time
from .names import GroupResource, generate_name
from .resources import ResourceType
from .rfcpatch import JsonPatchError, apply_json_patch, apply_merge_patch
from .schema import OpenApiSchema
from .selectors import SelectorError, label_selector_matcher, parse_field_selector
from .smp import SmpError, apply_strategic_merge_patch
from .store import Change, Store, TooOldResourceVersion, Watcher
from .validation import validate_object_meta

Obj = dict[str, Any]

PATCH_TYPES = [
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
]
BODY_TYPES = ["application/json", "application/yaml", "application/vnd.kubernetes.protobuf", "application/cbor"]
_SYSTEM_META = (
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
    "selfLink",
    "managedFields",
)
_NOT_A_MAP = "json: cannot unmarshal array into Go value of type map[string]interface {}"
_NOT_FOUND_PATH = ApiError(404, "NotFound", "the server could not find the requested resource", {})


@dataclass
class Request:
    method: str
    path: str
    query: Mapping[str, str]
    headers: Mapping[str, str]
    body: bytes = b""

    def header(self, name: str) -> str | None:
        for key, value in self.headers.items():
            if key.lower() == name.lower():
                return value
        return None

    @property
    def content_type(self) -> str | None:
        value = self.header("Content-Type")
        return value.split(";", 1)[0].strip().lower() if value else None


@dataclass
class Response:
    status: int
    body: Any  # JSON-able, or str for text/plain
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class WatchStream:
    """Watch events as JSON-able dicts; the iterator ends when the watch times out or the server
    closes it.  Call ``cancel`` when the client goes away."""

    events: Iterator[Obj]
    cancel: Callable[[], None]


@dataclass(frozen=True)
class Target:
    rt: ResourceType
    namespace: str | None
    name: str | None
    subresource: str | None


def _truthy(value: str | None) -> bool:
    return (value or "").lower() in ("true", "1")


class KubeApi:
    """All API behaviour of the test server."""

    def __init__(
        self,
        store: Store,
        schema: OpenApiSchema,
        resources: list[ResourceType],
        *,
        clock: Callable[[], datetime],
        authorizer: Authorizer,
        server_address: Callable[[], str],
        default_watch_timeout: float | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.store = store
        self.schema = schema
        self.resources = resources
        self.clock = clock
        self.authorizer = authorizer
        self.server_address = server_address
        self.default_watch_timeout = default_watch_timeout
        # How many revisions the watch cache (what serves resourceVersion=0) is behind etcd: 0 = caught up, as
        # it is within milliseconds on a real server; a test sets it to serve the stale reads a real one may.
        self.watch_cache_lag = 0
        self.rng = rng or random.Random()
        self._pdb_scales: dict[str, int] = {}
        # Called (store lock held) with a pod that a DELETE or eviction left terminating, i.e.
        # waiting for its kubelet (metadata.deletionGracePeriodSeconds > 0): see ``kubelet``.
        self.on_pod_terminating: Callable[[Obj], None] | None = None
        # What ``seed`` may store: the served types plus any the server keeps without serving them.
        self.seed_resources: list[ResourceType] = resources

    # --- routing ---------------------------------------------------------------------------------

    def resource(self, group: str, version: str, plural: str) -> ResourceType | None:
        for rt in self.resources:
            if (rt.group, rt.version, rt.plural) == (group, version, plural):
                return rt
        return None

    def resource_for(self, api_version: str, kind: str) -> ResourceType | None:
        for rt in self.resources:
            if (rt.api_version, rt.kind) == (api_version, kind):
                return rt
        return None

    def route(self, path: str) -> tuple[str, str, list[str]] | None:
        parts = [p for p in path.split("/") if p]
        if len(parts) >= 2 and parts[0] == "api":
            return "", parts[1], parts[2:]
        if len(parts) >= 3 and parts[0] == "apis":
            return parts[1], parts[2], parts[3:]
        if len(parts) == 2 and parts[0] == "apis":
            return parts[1], "", []  # the group document /apis/<group>
        return None

    def target(self, group: str, version: str, parts: list[str]) -> Target:
        namespace = None
        if parts and parts[0] == "namespaces" and len(parts) >= 3 and parts[2] not in ("status", "finalize"):
            namespace, parts = parts[1], parts[2:]
        if not parts or len(parts) > 3:
            raise _NOT_FOUND_PATH
        rt = self.resource(group, version, parts[0])
        if rt is None or (namespace is not None and not rt.namespaced):
            raise _NOT_FOUND_PATH
        name = parts[1] if len(parts) > 1 else None
        sub = parts[2] if len(parts) > 2 else None
        if sub is not None and sub not in rt.subresources:
            raise _NOT_FOUND_PATH
        return Target(rt, namespace, name, sub)

    def handle(self, request: Request) -> Response | WatchStream:
        try:
            return self._dispatch(request)
        except ApiError as error:
            return Response(error.code, error.status(), dict(error.headers))

    def _dispatch(self, request: Request) -> Response | WatchStream:
        path = request.path.rstrip("/") or "/"
        if path in ("/healthz", "/livez", "/readyz"):
            return Response(200, "ok")
        if path == "/version":
            return Response(200, discovery.version_info(self.schema.release))
        if path == "/api":
            return Response(200, discovery.api_versions(self.server_address()))
        if path == "/apis":
            return Response(200, discovery.api_group_list(self.resources))
        routed = self.route(path)
        if routed is None:
            return Response(404, "404 page not found\n")
        group, version, parts = routed
        if not parts:
            if group and path == f"/apis/{group}":
                document = discovery.api_group(group, self.resources)
            else:
                gv = f"{group}/{version}" if group else version
                document = discovery.resource_list(gv, self.resources)
                document = document if document["resources"] else None
            if document is None:
                raise _NOT_FOUND_PATH
            return Response(200, document)
        target = self.target(group, version, parts)
        verb = self._verb(request, target)
        denied = self.authorizer.check(
            verb, target.rt.group_resource, target.subresource, target.namespace, target.name
        )
        if denied is not None:
            raise denied
        handler = {
            "list": self.list,
            "watch": self.watch,
            "get": self.get,
            "create": self.create,
            "update": self.update,
            "patch": self.patch,
            "delete": self.delete,
        }[verb]
        if target.subresource == "eviction":
            handler = self.evict
        return handler(request, target)

    def _verb(self, request: Request, target: Target) -> str:
        method = request.method.upper()
        if target.subresource == "eviction":
            if method != "POST":
                raise errors.method_not_allowed(method)
            return "create"
        if target.name is None:
            if method == "GET":
                return "watch" if _truthy(request.query.get("watch")) else "list"
            if method == "POST" and (target.namespace is not None or not target.rt.namespaced):
                return "create"
            raise errors.method_not_allowed(method)
        verbs = {"GET": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
        if method not in verbs or (target.subresource == "status" and method == "DELETE"):
            raise errors.method_not_allowed(method)
        return verbs[method]

    # --- helpers ---------------------------------------------------------------------------------

    def now(self) -> str:
        return format_time(self.clock())

    def external(self, rt: ResourceType, internal: Obj, *, typed: bool = True) -> Obj:
        """The stored object as ``rt`` serves it (list items carry no apiVersion/kind)."""
        obj = rt.to_external(copy.deepcopy(internal))
        obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
        if rt.plural == "poddisruptionbudgets":
            pods = self.store.list("pods", obj["metadata"].get("namespace"))
            obj["status"] = pdb_status(obj, pods, self._pdb_scale(obj, pods))
        ordered = {"kind": obj.pop("kind"), "apiVersion": obj.pop("apiVersion"), **obj}
        if not typed:
            del ordered["kind"], ordered["apiVersion"]
        return ordered

    def _parse_json(self, request: Request) -> Any:
        try:
            return json.loads(request.body or b"null")
        except ValueError as exc:
            raise errors.bad_request(f"couldn't get version/kind; json parse error: {exc}") from exc

    def _decode_body(self, request: Request, rt: ResourceType) -> tuple[Obj, list[str]]:
        content_type = request.content_type or "application/json"
        if content_type not in BODY_TYPES:
            raise errors.unsupported_media_type(BODY_TYPES)
        if content_type != "application/json":
            raise errors.unsupported_media_type(["application/json"])
        body = self._parse_json(request)
        if not isinstance(body, dict):
            raise errors.bad_request("couldn't get version/kind; json parse error: cannot unmarshal into object")
        api_version, kind = body.get("apiVersion"), body.get("kind")
        if api_version and api_version != rt.api_version:
            raise errors.bad_request(
                f"the API version in the data ({api_version}) does not match the expected "
                f"API version ({rt.api_version})"
            )
        if kind and kind != rt.kind:
            raise errors.bad_request(
                f'{kind} in version "{rt.version}" cannot be handled as a {rt.kind}: '
                f'no kind "{kind}" is registered for version "{rt.api_version}"'
            )
        strict = request.query.get("fieldValidation") == "Strict"
        try:
            obj, warnings = decode(body, self.schema.definition(rt.definition), strict=strict)
        except StrictDecodingError as exc:
            raise errors.bad_request(str(exc)) from exc
        except DecodeError as exc:
            raise errors.bad_request(
                f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: {exc}'
            ) from exc
        if request.query.get("fieldValidation") == "Ignore":
            warnings = []
        obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
        return obj, warnings

    @staticmethod
    def _warning_headers(warnings: list[str]) -> dict[str, str]:
        if not warnings:
            return {}
        return {"Warning": ", ".join("299 - " + json.dumps(w) for w in warnings)}

    def _require_namespace(self, namespace: str) -> None:
        if self.store.get("namespaces", "", namespace) is None:
            raise errors.not_found(self.resource("", "v1", "namespaces").group_resource, namespace)  # type: ignore[union-attr]

    def _validate(self, rt: ResourceType, obj: Obj, strategy_errors: list[FieldError]) -> None:
        meta_errors = validate_object_meta(obj.get("metadata") or {}, rt.name_validator)
        found = strategy_errors + meta_errors
        if found:
            name = (obj.get("metadata") or {}).get("name") or ""
            raise errors.invalid(rt.group, rt.kind, name, found)

    def _storage_namespace(self, rt: ResourceType, namespace: str | None) -> str:
        return (namespace or "") if rt.namespaced else ""

    # --- read ------------------------------------------------------------------------------------

    def get(self, request: Request, target: Target) -> Response:
        rt = target.rt
        assert target.name is not None
        namespace = self._storage_namespace(rt, target.namespace)
        if request.query.get("resourceVersion") == "0" and self.watch_cache_lag:  # "any": the watch cache
            found = [o for o in self.store.at(rt.storage_key, self._cache_revision()) if _is(o, namespace, target.name)]
            obj = found[0] if found else None
        else:  # unset: the latest (a quorum read); "N": not older than N (etcd's latest always is)
            obj = self.store.get(rt.storage_key, namespace, target.name)
        if obj is None:
            raise errors.not_found(rt.group_resource, target.name)
        return Response(200, self.external(rt, obj))

    def _cache_revision(self) -> int:
        """The revision the watch cache has reached: ``watch_cache_lag`` revisions behind etcd (0: caught
        up), never before the retained history (a cache that far behind is rebuilt: it relists)."""
        with self.store.lock:
            return max(self.store.compacted, self.store.revision - self.watch_cache_lag)

    def _list_items(self, request: Request, rt: ResourceType, namespace: str | None) -> tuple[int, list[Obj], bool]:
        """The revision a list is served at, its objects and whether the watch cache served it, by
        ``resourceVersion`` and ``resourceVersionMatch`` as the API server reads them (ValidateListOptions;
        "Semantics for get and list" of the API concepts): unset = the latest, from etcd; "0" = any, from
        the watch cache; "N" or NotOlderThan = at least N (the latest, or the cache when it has reached N);
        Exact = at N exactly, rebuilt from the history (410 Expired once compacted). The watch cache does
        not page: it answers the whole list whatever ``limit`` (kubernetes#70735), with no continue token."""
        version = request.query.get("resourceVersion") or ""
        match = request.query.get("resourceVersionMatch") or ""
        problems: list[FieldError] = []
        if match:
            if not version:
                problems.append(
                    FieldError(
                        "Forbidden",
                        "resourceVersionMatch",
                        detail="resourceVersionMatch is forbidden unless resourceVersion is provided",
                    )
                )
            if request.query.get("continue"):
                problems.append(
                    FieldError(
                        "Forbidden",
                        "resourceVersionMatch",
                        detail="resourceVersionMatch is forbidden when continue is provided",
                    )
                )
            if match == "Exact" and version == "0":
                problems.append(
                    FieldError(
                        "Forbidden",
                        "resourceVersionMatch",
                        detail='resourceVersionMatch "exact" is forbidden for resourceVersion "0"',
                    )
                )
            elif match not in ("Exact", "NotOlderThan"):
                problems.append(
                    FieldError("NotSupported", "resourceVersionMatch", match, '"Exact", "NotOlderThan", ""')
                )
        if problems:
            raise errors.invalid("meta.k8s.io", "ListOptions", "", problems)
        if request.query.get("continue") and version not in ("", "0"):
            raise errors.bad_request("specifying resource version is not allowed when using continue")
        if version and version != "0":
            try:
                wanted = int(version)
            except ValueError as exc:
                raise errors.bad_request(f'resourceVersion: Invalid value: "{version}": must be an integer') from exc
        with self.store.lock:
            if version == "" or request.query.get("continue"):
                return self.store.revision, self.store.list(rt.storage_key, namespace), False
            cache = self._cache_revision()
            if version == "0":
                revision = cache
            elif match == "Exact":
                revision = wanted
            else:
                revision = cache if cache >= wanted else self.store.revision
            try:
                items = self.store.at(rt.storage_key, revision, namespace)
                return revision, items, revision == cache and match != "Exact"
            except TooOldResourceVersion as exc:
                raise errors.expired(f"The resourceVersion for the provided list is too old: {exc}") from exc

    def _matchers(self, request: Request, rt: ResourceType) -> Callable[[Obj], bool]:
        try:
            labels = label_selector_matcher(request.query.get("labelSelector"))
            fields = parse_field_selector(request.query.get("fieldSelector"))
        except SelectorError as exc:
            raise errors.bad_request(str(exc)) from exc
        supported = set(rt.field_labels({}))
        resolved = []
        for requirement in fields:
            name = rt.field_label_aliases.get(requirement.field, "") if rt.field_label_aliases else requirement.field
            if name not in supported:
                raise errors.bad_request(f"field label not supported: {requirement.field}")
            resolved.append((name, requirement))

        def matches(obj: Obj) -> bool:
            if not labels((obj.get("metadata") or {}).get("labels") or {}):
                return False
            values = rt.field_labels(obj)
            return all(requirement.matches({requirement.field: values.get(name, "")}) for name, requirement in resolved)

        return matches

    def list(self, request: Request, target: Target) -> Response:
        rt = target.rt
        matches = self._matchers(request, rt)
        revision, items, cached = self._list_items(request, rt, target.namespace)
        items = [o for o in items if matches(o)]
        meta: Obj = {"resourceVersion": str(revision)}
        limit = _int_query(request, "limit") or 0
        if cached:  # the watch cache answers the whole list
            limit = 0
        token = request.query.get("continue")
        if token:
            try:
                decoded = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
                start = decoded["start"]
            except (ValueError, KeyError, TypeError) as exc:
                raise errors.bad_request(f"continue key is not valid: {exc}") from exc
            items = [o for o in items if self._list_key(o) >= start]
        if limit > 0 and len(items) > limit:
            rest = items[limit:]
            items = items[:limit]
            payload = {"v": "meta.k8s.io/v1", "rv": revision, "start": self._list_key(rest[0])}
            meta["continue"] = base64.urlsafe_b64encode(json.dumps(payload).encode()).decode().rstrip("=")
            meta["remainingItemCount"] = len(rest)
        return Response(
            200,
            {
                "kind": f"{rt.kind}List",
                "apiVersion": rt.api_version,
                "metadata": meta,
                "items": [self.external(rt, o, typed=False) for o in items],
            },
        )

    @staticmethod
    def _list_key(obj: Obj) -> str:
        meta = obj["metadata"]
        return f"{meta.get('namespace') or ''}/{meta['name']}"

    def watch(self, request: Request, target: Target) -> WatchStream:
        rt = target.rt
        matches = self._matchers(request, rt)
        raw_rv = request.query.get("resourceVersion") or ""
        initial = _truthy(request.query.get("sendInitialEvents"))
        bookmarks = _truthy(request.query.get("allowWatchBookmarks"))
        since: int | None
        if raw_rv in ("", "0") or initial:
            since = None
        else:
            try:
                since = int(raw_rv)
            except ValueError as exc:
                raise errors.bad_request(f'resourceVersion: Invalid value: "{raw_rv}": must be an integer') from exc
        timeout_text = request.query.get("timeoutSeconds")
        timeout = float(_int_query(request, "timeoutSeconds") or 0) if timeout_text else self.default_watch_timeout
        try:
            backlog, watcher = self.store.watch(rt.storage_key, target.namespace, since)
        except TooOldResourceVersion as exc:
            error = errors.expired(str(exc)).status()
            return WatchStream(iter([{"type": "ERROR", "object": error}]), lambda: None)
        return WatchStream(
            self._watch_events(rt, watcher, backlog, matches, timeout, bookmarks, initial),
            lambda: self.store.unwatch(watcher),
        )

    def _watch_events(
        self,
        rt: ResourceType,
        watcher: Watcher,
        backlog: list[Change],
        matches: Callable[[Obj], bool],
        timeout: float | None,
        bookmarks: bool,
        initial: bool,
    ) -> Iterator[Obj]:
        deadline = None if timeout is None else time.monotonic() + timeout
        last_revision = self.store.revision if not backlog else max(c.revision for c in backlog)
        try:
            for change in backlog:
                event = self._watch_event(rt, change, matches)
                if event is not None:
                    yield event
            if initial and bookmarks:
                yield self._bookmark(rt, last_revision, initial_end=True)
            while True:
                wait = 0.25 if deadline is None else min(0.25, deadline - time.monotonic())
                if wait <= 0:
                    if bookmarks:
                        yield self._bookmark(rt, max(last_revision, self.store.revision))
                    return
                try:
                    change = watcher.changes.get(timeout=wait)
                except queue.Empty:
                    continue
                if change is None:
                    return
                last_revision = change.revision
                event = self._watch_event(rt, change, matches)
                if event is not None:
                    yield event
        finally:
            self.store.unwatch(watcher)

    def _watch_event(self, rt: ResourceType, change: Change, matches: Callable[[Obj], bool]) -> Obj | None:
        now_ok = matches(change.obj)
        before_ok = change.prev is not None and matches(change.prev)
        if change.type == "DELETED":
            kind, obj = ("DELETED", change.obj) if now_ok else (None, None)
        elif change.type == "ADDED" or not before_ok:
            kind, obj = ("ADDED", change.obj) if now_ok else (None, None)
        elif now_ok:
            kind, obj = "MODIFIED", change.obj
        else:
            previous = copy.deepcopy(change.prev)
            assert previous is not None
            previous["metadata"]["resourceVersion"] = str(change.revision)
            kind, obj = "DELETED", previous
        if kind is None or obj is None:
            return None
        return {"type": kind, "object": self.external(rt, obj)}

    def _bookmark(self, rt: ResourceType, revision: int, *, initial_end: bool = False) -> Obj:
        meta: Obj = {"resourceVersion": str(revision), "creationTimestamp": None}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return {"type": "BOOKMARK", "object": {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": meta}}

    # --- write -----------------------------------------------------------------------------------

    def create(self, request: Request, target: Target) -> Response:
        rt = target.rt
        obj, warnings = self._decode_body(request, rt)
        created = self._create(rt, rt.to_internal(obj), target.namespace, _truthy_dry_run(request))
        return Response(201, self.external(rt, created), self._warning_headers(warnings))

    def _create(self, rt: ResourceType, obj: Obj, namespace: str | None, dry_run: bool) -> Obj:
        meta = obj.setdefault("metadata", {})
        if rt.namespaced:
            body_ns = meta.get("namespace") or ""
            if body_ns and body_ns != namespace:
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        if meta.get("resourceVersion"):
            raise errors.unknown("resourceVersion should not be set on objects to be created")
        with self.store.lock:
            if rt.namespaced:
                self._require_namespace(namespace or "")
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = generate_name(meta["generateName"], self.rng)
            for key in _SYSTEM_META:
                meta.pop(key, None)
            rt.strategy.prepare_for_create(obj)
            self._validate(rt, obj, rt.strategy.validate_create(obj, namespace or ""))
            key = self._storage_namespace(rt, namespace)
            if self.store.get(rt.storage_key, key, meta["name"]) is not None:
                raise errors.already_exists(rt.group_resource, meta["name"])
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = self.now()
            if rt.strategy.tracks_generation:
                meta["generation"] = 1
            if dry_run:
                return obj
            return self.store.put(rt.storage_key, obj)

    def update(self, request: Request, target: Target) -> Response:
        rt = target.rt
        assert target.name is not None
        obj, warnings = self._decode_body(request, rt)
        obj = rt.to_internal(obj)
        meta = obj.setdefault("metadata", {})
        if meta.get("name") and meta["name"] != target.name:
            raise errors.bad_request(
                f"the name of the object ({meta['name']}) does not match the name on the URL ({target.name})"
            )
        meta["name"] = target.name
        dry_run = _truthy_dry_run(request)
        with self.store.lock:
            old = self.store.get(rt.storage_key, self._storage_namespace(rt, target.namespace), target.name)
            if old is None:
                if rt.strategy.allow_create_on_update and target.subresource is None:
                    if meta.get("resourceVersion"):
                        raise errors.not_found(rt.group_resource, target.name)
                    created = self._create(rt, obj, target.namespace, dry_run)
                    return Response(201, self.external(rt, created), self._warning_headers(warnings))
                raise errors.not_found(rt.group_resource, target.name)
            uid = meta.get("uid")
            if uid and uid != old["metadata"]["uid"]:
                raise errors.conflict(
                    rt.group_resource,
                    target.name,
                    f"Precondition failed: UID in precondition: {uid}, UID in object meta: {old['metadata']['uid']}",
                )
            updated = self._update(rt, old, obj, target, dry_run)
        return Response(200, self.external(rt, updated), self._warning_headers(warnings))

    def _update(self, rt: ResourceType, old: Obj, new: Obj, target: Target, dry_run: bool) -> Obj:
        """Shared by PUT and PATCH; the caller holds the store lock."""
        meta = new.setdefault("metadata", {})
        old_meta = old["metadata"]
        if rt.namespaced:
            body_ns = meta.get("namespace") or ""
            if body_ns and body_ns != target.namespace:
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = target.namespace
        else:
            meta.pop("namespace", None)
        version = meta.get("resourceVersion")
        if version and version != old_meta["resourceVersion"]:
            raise errors.conflict(rt.group_resource, old_meta["name"])
        for key in _SYSTEM_META:
            if key in old_meta:
                meta[key] = copy.deepcopy(old_meta[key])
            else:
                meta.pop(key, None)
        rt.strategy.prepare_for_update(new, old, target.subresource)
        new["apiVersion"], new["kind"] = old.get("apiVersion"), old.get("kind")
        self._validate(rt, new, rt.strategy.validate_update(new, old, target.namespace or ""))
        if rt.strategy.tracks_generation and rt.strategy.generation_changed(new, old):
            meta["generation"] = int(old_meta.get("generation") or 1) + 1
        meta["resourceVersion"] = old_meta["resourceVersion"]
        if (
            old_meta.get("deletionTimestamp")
            and not meta.get("finalizers")
            and not int(old_meta.get("deletionGracePeriodSeconds") or 0) > 0
        ):
            # shouldDeleteDuringUpdate: the last finalizer went and no graceful deletion is pending
            if dry_run:
                return new
            gone = self.store.delete(rt.storage_key, old_meta.get("namespace") or "", old_meta["name"])
            return gone or new
        if _canonical(new) == _canonical(old):
            return old
        if dry_run:
            return new
        return self.store.put(rt.storage_key, new)

    def patch(self, request: Request, target: Target) -> Response:
        rt = target.rt
        assert target.name is not None
        content_type = request.content_type
        if content_type == "application/apply-patch+yaml":
            raise errors.ApiError(
                415, "UnsupportedMediaType", "server-side apply is not implemented by the test server"
            )
        if content_type not in PATCH_TYPES:
            raise errors.unsupported_media_type(PATCH_TYPES)
        try:
            patch = json.loads(request.body or b"null")
        except ValueError as exc:
            raise errors.bad_request(f"error decoding patch: {exc}") from exc
        dry_run = _truthy_dry_run(request)
        with self.store.lock:
            old = self.store.get(rt.storage_key, self._storage_namespace(rt, target.namespace), target.name)
            if old is None:
                raise errors.not_found(rt.group_resource, target.name)
            current = rt.to_external(copy.deepcopy(old))
            current["apiVersion"], current["kind"] = rt.api_version, rt.kind
            patched = self._apply_patch(rt, content_type, current, patch)
            strict = request.query.get("fieldValidation") == "Strict"
            try:
                decoded, warnings = decode(patched, self.schema.definition(rt.definition), strict=strict)
            except StrictDecodingError as exc:
                raise errors.bad_request(str(exc)) from exc
            except DecodeError as exc:
                raise errors.patch_invalid(json.dumps(patched, separators=(",", ":")), str(exc)) from exc
            if request.query.get("fieldValidation") == "Ignore":
                warnings = []
            new = rt.to_internal(decoded)
            meta = new.setdefault("metadata", {})
            if meta.get("name") != target.name:
                raise errors.bad_request(
                    f"the name of the object ({meta.get('name')}) does not match the name on the URL ({target.name})"
                )
            uid = meta.get("uid")
            if uid and uid != old["metadata"]["uid"]:
                raise errors.conflict(
                    rt.group_resource,
                    target.name,
                    f"uid mismatch: the provided object specified uid {uid}, and no object with that uid was found",
                )
            updated = self._update(rt, old, new, target, dry_run)
        return Response(200, self.external(rt, updated), self._warning_headers(warnings))

    def _apply_patch(self, rt: ResourceType, content_type: str, current: Obj, patch: Any) -> Any:
        try:
            if content_type == "application/json-patch+json":
                return apply_json_patch(current, patch)
            if content_type == "application/merge-patch+json":
                if not isinstance(patch, dict):
                    raise errors.bad_request(_NOT_A_MAP)
                return apply_merge_patch(current, patch)
            if not isinstance(patch, dict):
                raise errors.bad_request(_NOT_A_MAP)
            return apply_strategic_merge_patch(current, patch, self.schema.definition(rt.definition))
        except JsonPatchError as exc:
            if exc.category == "bad_request":
                raise errors.bad_request(exc.message) from exc
            raise errors.unprocessable(exc.message) from exc
        except SmpError as exc:
            if exc.category == "bad_request":
                raise errors.bad_request(exc.message) from exc
            if exc.category == "unprocessable":
                raise errors.unprocessable(exc.message) from exc
            raise errors.unknown(exc.message) from exc

    def _delete_options(self, request: Request) -> Obj:
        options: Obj = {}
        if request.body:
            body = self._parse_json(request)
            if isinstance(body, dict):
                options.update(body)
        if "gracePeriodSeconds" in request.query:
            options["gracePeriodSeconds"] = _int_query(request, "gracePeriodSeconds")
        if "dryRun" in request.query:
            options["dryRun"] = [request.query["dryRun"]]
        return options

    def delete(self, request: Request, target: Target) -> Response:
        rt = target.rt
        assert target.name is not None
        options = self._delete_options(request)
        with self.store.lock:
            return self._delete(rt, target.namespace, target.name, options)

    def _delete(self, rt: ResourceType, namespace: str | None, name: str, options: Obj) -> Response:
        """The generic registry's ``Store.Delete`` (k8s.io/apiserver .../registry/generic/registry/store.go
        with ``rest.BeforeDelete``); the caller holds the store lock.

        Kinds with graceful deletion (Pods: ``Strategy.check_graceful_delete``): the first DELETE
        sets ``deletionTimestamp`` = now + grace period and ``deletionGracePeriodSeconds``; with a
        period > 0 the object stays until a DELETE with a shorter period (the kubelet's, with 0)
        removes it.  A later DELETE may only shorten the period (a longer or no period changes
        nothing).  A graceful DELETE with period 0 writes that state once (a watch sees MODIFIED)
        and then removes the object.  Other kinds are removed at once.  Objects with finalizers
        are never removed here: they get ``deletionTimestamp`` (period 0 for non-graceful kinds)
        and go when the last finalizer is removed (see ``_update``)."""
        key_ns = self._storage_namespace(rt, namespace)
        old = self.store.get(rt.storage_key, key_ns, name)
        if old is None:
            raise errors.not_found(rt.group_resource, name)
        meta = old["metadata"]
        self._check_delete_preconditions(rt, old, options.get("preconditions") or {})
        dry_run = "All" in (options.get("dryRun") or [])
        requested = options.get("gracePeriodSeconds")
        if requested is not None:
            requested = 1 if int(requested) < 0 else int(requested)
        original = copy.deepcopy(old)
        now = self.clock()
        marked = meta.get("deletionTimestamp")
        current = meta.get("deletionGracePeriodSeconds")
        if current is not None and current < 0:
            current = 1
        period = rt.strategy.check_graceful_delete(old, requested)
        graceful = False
        if period is not None and marked and current:
            if requested is None or requested >= current:
                return Response(200, self.external(rt, old))  # graceful deletion pending: nothing changes
            # only shortening: move the deadline back, never into the past
            moment = _parse_time_or(marked, now) - timedelta(seconds=current - requested)
            shortened = requested
            if moment < now:
                moment, shortened = now, (0 if requested == 0 else 1)
            meta["deletionTimestamp"], meta["deletionGracePeriodSeconds"] = format_time(moment), shortened
            graceful = True
        elif period is not None and not marked:
            meta["deletionTimestamp"] = format_time(now + timedelta(seconds=period))
            meta["deletionGracePeriodSeconds"] = period
            if int(meta.get("generation") or 0) > 0:
                meta["generation"] = int(meta["generation"]) + 1
            graceful = True
        finalizers = bool(meta.get("finalizers"))
        if finalizers and not graceful:
            # markAsDeleting: deletionTimestamp now (unless already earlier), period 0
            if not marked and int(meta.get("generation") or 0) > 0:
                meta["generation"] = int(meta["generation"]) + 1
            if not marked or _parse_time_or(marked, now) > now:
                meta["deletionTimestamp"] = format_time(now)
            meta["deletionGracePeriodSeconds"] = 0
        if graceful or finalizers:
            if not dry_run and _canonical(old) != _canonical(original):
                old = self.store.put(rt.storage_key, old)
            waiting = int(meta.get("deletionGracePeriodSeconds") or 0) > 0
            if graceful and waiting and not dry_run and self.on_pod_terminating is not None:
                self.on_pod_terminating(copy.deepcopy(old))
            if finalizers or waiting:
                return Response(200, self.external(rt, old))
        last = old if dry_run else self.store.delete(rt.storage_key, key_ns, name)
        assert last is not None
        if rt.plural == "pods":
            return Response(200, self.external(rt, last))
        details: Obj = {"name": name}
        if rt.group:
            details["group"] = rt.group
        details.update(kind=rt.plural, uid=meta["uid"])
        return Response(
            200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}
        )

    def _check_delete_preconditions(self, rt: ResourceType, obj: Obj, preconditions: Obj) -> None:
        """``rest.BeforeDelete`` checks DeleteOptions.preconditions first; its Conflict names the
        kind (``Pod``, ``Lease.coordination.k8s.io``), not the resource."""
        meta = obj["metadata"]
        kind = GroupResource(rt.group, rt.kind)
        if preconditions.get("uid") is not None and preconditions["uid"] != meta["uid"]:
            raise errors.conflict(
                kind,
                meta["name"],
                f"the UID in the precondition ({preconditions['uid']}) does not match the UID in record "
                f"({meta['uid']}). The object might have been deleted and then recreated",
            )
        version = preconditions.get("resourceVersion")
        if version is not None and version != meta["resourceVersion"]:
            raise errors.conflict(
                kind,
                meta["name"],
                f"the ResourceVersion in the precondition ({version}) does not match the ResourceVersion in "
                f"record ({meta['resourceVersion']}). The object might have been modified",
            )

    def evict(self, request: Request, target: Target) -> Response:
        """``POST pods/<name>/eviction`` with a policy/v1 Eviction."""
        assert target.name is not None
        body = self._parse_json(request)
        if not isinstance(body, dict):
            raise errors.bad_request("couldn't get version/kind; json parse error")
        eviction_meta = body.get("metadata") or {}
        if eviction_meta.get("name") and eviction_meta["name"] != target.name:
            raise errors.bad_request("name in URL does not match name in Eviction object")
        options = dict(body.get("deleteOptions") or {})
        if "dryRun" in request.query:
            options["dryRun"] = [request.query["dryRun"]]
        pods_rt = target.rt
        with self.store.lock:
            pod = self.store.get("pods", target.namespace or "", target.name)
            if pod is None:
                raise errors.not_found(pods_rt.group_resource, target.name)
            pdbs = self.store.list("poddisruptionbudgets.policy", target.namespace)
            pods = self.store.list("pods", target.namespace)
            error = check_eviction(pod, pdbs, pods, lambda pdb: self._pdb_scale(pdb, pods))
            if error is not None:
                raise error
            if "All" not in (options.get("dryRun") or []):
                options = self._add_disruption_target(pods_rt, pod, options)
            self._delete(pods_rt, target.namespace, target.name, options)
        return Response(201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})

    def _add_disruption_target(self, rt: ResourceType, pod: Obj, options: Obj) -> Obj:
        """``addConditionAndDeletePod`` (pkg/registry/core/pod/storage/eviction.go): before the
        DELETE, a status write adds the ``DisruptionTarget`` condition (a no-op when it is there
        already).  Returns the DeleteOptions, a resourceVersion precondition moved to that write."""
        self._check_delete_preconditions(rt, pod, options.get("preconditions") or {})
        conditions = pod.setdefault("status", {}).setdefault("conditions", [])
        condition = {
            "type": "DisruptionTarget",
            "status": "True",
            "lastProbeTime": None,
            "lastTransitionTime": self.now(),
            "reason": "EvictionByEvictionAPI",
            "message": "Eviction API: evicting",
        }
        for index, existing in enumerate(conditions):
            if existing.get("type") == "DisruptionTarget":
                if existing.get("status") == "True":
                    condition["lastTransitionTime"] = existing.get("lastTransitionTime")
                changed = any(existing.get(k) != condition[k] for k in ("status", "reason", "message"))
                conditions[index] = {**existing, **condition}
                break
        else:
            conditions.append(condition)
            changed = True
        if not changed:
            return options
        updated = self.store.put("pods", pod)
        preconditions = options.get("preconditions") or {}
        if preconditions.get("resourceVersion") is not None:
            options = {
                **options,
                "preconditions": {**preconditions, "resourceVersion": updated["metadata"]["resourceVersion"]},
            }
        return options

    def _pdb_scale(self, pdb: Obj, pods: list[Obj]) -> int:
        """Largest number of matching pods seen for this PDB (see :mod:`.disruption`)."""
        key = pdb["metadata"].get("uid") or ""
        scale = max(self._pdb_scales.get(key, 0), matching_count(pdb, pods))
        self._pdb_scales[key] = scale
        return scale

    # --- direct access for tests -----------------------------------------------------------------

    def seed(self, obj: Obj) -> Obj:
        """Store ``obj`` as given (no validation, no strategy); fills uid/creationTimestamp."""
        rt = next(
            (r for r in self.seed_resources if (r.api_version, r.kind) == (obj.get("apiVersion"), obj.get("kind"))),
            None,
        )
        if rt is None:
            raise ValueError(f"unknown apiVersion/kind {obj.get('apiVersion')}/{obj.get('kind')}")
        decoded, _ = decode(obj, self.schema.definition(rt.definition))
        internal = rt.to_internal(decoded)
        meta = internal.setdefault("metadata", {})
        if not rt.namespaced:
            meta.pop("namespace", None)
        elif not meta.get("namespace"):
            meta["namespace"] = "default"
        with self.store.lock:
            namespace = meta.get("namespace") or ""
            if rt.namespaced and self.store.get("namespaces", "", namespace) is None:
                self.seed(
                    {
                        "apiVersion": "v1",
                        "kind": "Namespace",
                        "metadata": {"name": namespace},
                        "spec": {"finalizers": ["kubernetes"]},
                        "status": {"phase": "Active"},
                    }
                )
            existing = self.store.get(rt.storage_key, namespace if rt.namespaced else "", meta["name"])
            meta.setdefault("uid", existing["metadata"]["uid"] if existing else str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", existing["metadata"]["creationTimestamp"] if existing else self.now())
            if rt.strategy.tracks_generation:
                meta.setdefault("generation", 1)
            meta.pop("resourceVersion", None)
            return self.external(rt, self.store.put(rt.storage_key, internal))


def _is(obj: Obj, namespace: str, name: str) -> bool:
    meta = obj.get("metadata") or {}
    return (meta.get("namespace") or "") == namespace and meta.get("name") == name


def _int_query(request: Request, name: str) -> int | None:
    """An integer query parameter; 400 BadRequest when it does not parse (as the API server does)."""
    text = request.query.get(name)
    if text is None or text == "":
        return None
    try:
        return int(text)
    except ValueError as exc:
        raise errors.bad_request(f'{name}: Invalid value: "{text}": must be an integer') from exc


def _parse_time_or(value: str, default: datetime) -> datetime:
    try:
        return parse_time(value)
    except TimeParseError:
        return default


def _truthy_dry_run(request: Request) -> bool:
    return request.query.get("dryRun") == "All"


def _canonical(obj: Obj) -> str:
    clone = copy.deepcopy(obj)
    clone.get("metadata", {}).pop("resourceVersion", None)
    return json.dumps(clone, sort_keys=True)
