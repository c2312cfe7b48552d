"""The API resources the test server serves, and their per-kind strategies.

A strategy is what ``pkg/registry/<group>/<kind>/strategy.go`` does in the API server: which
fields a write through the main resource or the ``status`` subresource may change, defaults set
on create, validation, and whether ``metadata.generation`` is tracked.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import eventconv, validation
from .errors import FieldError
from .names import GroupResource

Obj = dict[str, Any]


class Strategy:
    """Default behaviour: the whole object is writable, nothing is validated beyond metadata."""

    has_status = False
    tracks_generation = False
    allow_create_on_update = False

    def prepare_for_create(self, obj: Obj) -> None:
        """Reset fields a client may not set on create, apply defaults."""

    def prepare_for_update(self, new: Obj, old: Obj, subresource: str | None) -> None:
        """Keep what the endpoint may not change: ``status`` on the main resource, everything but
        ``status`` and ``metadata`` on ``/status`` (built-in kinds let ``/status`` change metadata)."""
        if not self.has_status:
            return
        if subresource == "status":
            for key in [k for k in new if k not in ("apiVersion", "kind", "metadata", "status")]:
                del new[key]
            for key, value in old.items():
                if key not in ("apiVersion", "kind", "metadata", "status"):
                    new[key] = copy.deepcopy(value)
        else:
            _copy_field(new, old, "status")

    def validate_create(self, obj: Obj, namespace: str) -> list[FieldError]:
        return []

    def validate_update(self, new: Obj, old: Obj, namespace: str) -> list[FieldError]:
        return self.validate_create(new, namespace)

    def generation_changed(self, new: Obj, old: Obj) -> bool:
        return new.get("spec") != old.get("spec")

    def check_graceful_delete(self, obj: Obj, requested: int | None) -> int | None:
        """``RESTGracefulDeleteStrategy.CheckGracefulDelete``: the grace period a first DELETE
        gives ``obj`` (``requested`` is DeleteOptions.gracePeriodSeconds, negatives already made
        1), or ``None`` for kinds without graceful deletion (deleted at once unless finalizers)."""
        return None


def _copy_field(new: Obj, old: Obj, key: str) -> None:
    if key in old:
        new[key] = copy.deepcopy(old[key])
    else:
        new.pop(key, None)


class NodeStrategy(Strategy):
    """core/v1 Node: status is kept on create (kubelet registers with status)."""

    has_status = True

    def validate_create(self, obj: Obj, namespace: str) -> list[FieldError]:
        return validation.validate_node(obj)


def _qos_class(pod: Obj) -> str:
    containers = (pod.get("spec") or {}).get("containers") or []
    resources = [c.get("resources") or {} for c in containers]
    if not any(r.get("requests") or r.get("limits") for r in resources):
        return "BestEffort"
    guaranteed = all(
        r.get("limits")
        and {k: v for k, v in (r.get("requests") or r["limits"]).items()} == r["limits"]
        and {"cpu", "memory"} <= set(r["limits"])
        for r in resources
    )
    return "Guaranteed" if guaranteed else "Burstable"


class PodStrategy(Strategy):
    """core/v1 Pod: status reset to Pending on create, spec mostly immutable, defaults applied."""

    has_status = True
    tracks_generation = True

    def prepare_for_create(self, obj: Obj) -> None:
        spec = obj.setdefault("spec", {})
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        spec.setdefault("dnsPolicy", "ClusterFirst")
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("securityContext", {})
        spec.setdefault("enableServiceLinks", True)
        spec.setdefault("priority", 0)
        for container in spec.get("containers") or []:
            image = container.get("image") or ""
            tag = image.rsplit("/", 1)[-1]
            latest = "@" not in image and (":" not in tag or tag.endswith(":latest"))
            container.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
            container.setdefault("terminationMessagePath", "/dev/termination-log")
            container.setdefault("terminationMessagePolicy", "File")
            container.setdefault("resources", {})
        # DefaultTolerationSeconds admission plugin
        tolerations = spec.setdefault("tolerations", [])
        for taint in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
            if not any(t.get("key") == taint and t.get("effect") in (None, "NoExecute") for t in tolerations):
                tolerations.append(
                    {"key": taint, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
                )
        obj["status"] = {"phase": "Pending", "qosClass": _qos_class(obj)}

    def prepare_for_update(self, new: Obj, old: Obj, subresource: str | None) -> None:
        super().prepare_for_update(new, old, subresource)
        if subresource == "status":
            meta, old_meta = new.setdefault("metadata", {}), old.get("metadata") or {}
            _copy_field(meta, old_meta, "ownerReferences")

    def validate_create(self, obj: Obj, namespace: str) -> list[FieldError]:
        return validation.validate_pod(obj)

    def check_graceful_delete(self, obj: Obj, requested: int | None) -> int | None:
        """pkg/registry/core/pod/strategy.go: the requested period, else the pod's
        terminationGracePeriodSeconds (0 when unset); 0 for an unscheduled or a terminal pod."""
        spec, phase = obj.get("spec") or {}, (obj.get("status") or {}).get("phase")
        period = requested if requested is not None else int(spec.get("terminationGracePeriodSeconds") or 0)
        if not spec.get("nodeName") or phase in ("Succeeded", "Failed"):
            period = 0
        return 1 if period < 0 else period

    def validate_update(self, new: Obj, old: Obj, namespace: str) -> list[FieldError]:
        return validation.validate_pod_update(new, old)


class LeaseStrategy(Strategy):
    allow_create_on_update = True

    def validate_create(self, obj: Obj, namespace: str) -> list[FieldError]:
        return validation.validate_lease(obj)


class PdbStrategy(Strategy):
    has_status = True
    tracks_generation = True

    def prepare_for_create(self, obj: Obj) -> None:
        obj.pop("status", None)

    def validate_create(self, obj: Obj, namespace: str) -> list[FieldError]:
        return validation.validate_pdb(obj)


class NamespaceStrategy(Strategy):
    has_status = True

    def prepare_for_create(self, obj: Obj) -> None:
        obj["status"] = {"phase": "Active"}
        spec = obj.setdefault("spec", {})
        spec["finalizers"] = ["kubernetes"]


class CoreEventStrategy(Strategy):
    """core/v1 Event: only the legacy rules (involvedObject namespace, new-style fields)."""

    allow_create_on_update = True

    def validate_create(self, obj: Obj, namespace: str) -> list[FieldError]:
        return validation.validate_event_legacy(obj, namespace, events_api=False)


class EventsApiStrategy(Strategy):
    """events.k8s.io/v1 Event (validated in core shape): legacy rules plus strict create rules."""

    allow_create_on_update = True

    def validate_create(self, obj: Obj, namespace: str) -> list[FieldError]:
        return validation.validate_event_legacy(obj, namespace, events_api=True) + (
            validation.validate_events_api_create(obj)
        )

    def validate_update(self, new: Obj, old: Obj, namespace: str) -> list[FieldError]:
        return validation.validate_event_legacy(new, namespace, events_api=True) + (
            validation.validate_events_api_update(new, old)
        )


def _get(obj: Obj, dotted: str) -> str:
    node: Any = obj
    for part in dotted.split("."):
        if not isinstance(node, dict):
            return ""
        node = node.get(part)
    if isinstance(node, bool):
        return "true" if node else "false"
    return "" if node is None else str(node)


def _fields(obj: Obj, labels: tuple[str, ...], *, namespaced: bool = True) -> dict[str, str]:
    """``generic.ObjectMetaFieldsSet`` (metadata.namespace only for namespaced kinds) plus ``labels``."""
    out = {"metadata.name": _get(obj, "metadata.name")}
    if namespaced:
        out["metadata.namespace"] = _get(obj, "metadata.namespace")
    for label in labels:
        out[label] = _get(obj, label)
    return out


def _node_fields(obj: Obj) -> dict[str, str]:
    fields = _fields(obj, (), namespaced=False)
    fields["spec.unschedulable"] = _get(obj, "spec.unschedulable") or "false"
    return fields


def _pod_fields(obj: Obj) -> dict[str, str]:
    fields = _fields(
        obj,
        (
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ),
    )
    fields["spec.hostNetwork"] = _get(obj, "spec.hostNetwork") or "false"
    return fields


def _event_fields(obj: Obj) -> dict[str, str]:
    involved = tuple(
        f"involvedObject.{k}"
        for k in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")
    )
    fields = _fields(obj, (*involved, "reason", "reportingComponent", "type"))
    fields["source"] = _get(obj, "source.component")
    return fields


def _identity(obj: Obj) -> Obj:
    return obj


@dataclass(frozen=True)
class ResourceType:
    """One served resource (``group/version/plural``) and how it is stored."""

    group: str
    version: str
    plural: str
    kind: str
    singular: str
    namespaced: bool
    definition: str
    strategy: Strategy
    storage: str = ""
    name_validator: validation.NameValidator = validation.is_dns1123_subdomain
    subresources: tuple[str, ...] = ()
    short_names: tuple[str, ...] = ()
    field_labels: Callable[[Obj], dict[str, str]] = lambda obj: _fields(obj, ())
    field_label_aliases: dict[str, str] = field(default_factory=dict)
    to_external: Callable[[Obj], Obj] = _identity
    to_internal: Callable[[Obj], Obj] = _identity

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_resource(self) -> GroupResource:
        return GroupResource(self.group, self.plural)

    @property
    def storage_key(self) -> str:
        return self.storage or str(self.group_resource)

    def verbs(self) -> list[str]:
        """Verbs listed in discovery (deletecollection is not served)."""
        return ["create", "delete", "get", "list", "patch", "update", "watch"]


def default_resources() -> list[ResourceType]:
    """Everything the test server serves."""
    core_event_fields = _event_fields
    return [
        ResourceType(
            "",
            "v1",
            "namespaces",
            "Namespace",
            "namespace",
            False,
            "io.k8s.api.core.v1.Namespace",
            NamespaceStrategy(),
            name_validator=validation.is_dns1123_label,
            subresources=("status",),
            short_names=("ns",),
            field_labels=lambda o: _fields(o, ("status.phase",), namespaced=False),
        ),
        ResourceType(
            "",
            "v1",
            "nodes",
            "Node",
            "node",
            False,
            "io.k8s.api.core.v1.Node",
            NodeStrategy(),
            subresources=("status",),
            short_names=("no",),
            field_labels=_node_fields,
        ),
        ResourceType(
            "",
            "v1",
            "pods",
            "Pod",
            "pod",
            True,
            "io.k8s.api.core.v1.Pod",
            PodStrategy(),
            subresources=("status", "eviction"),
            short_names=("po",),
            field_labels=_pod_fields,
        ),
        ResourceType(
            "",
            "v1",
            "events",
            "Event",
            "event",
            True,
            "io.k8s.api.core.v1.Event",
            CoreEventStrategy(),
            storage="events",
            name_validator=validation.is_path_segment_name,
            short_names=("ev",),
            field_labels=core_event_fields,
        ),
        ResourceType(
            "events.k8s.io",
            "v1",
            "events",
            "Event",
            "event",
            True,
            "io.k8s.api.events.v1.Event",
            EventsApiStrategy(),
            storage="events",
            short_names=("ev",),
            field_labels=core_event_fields,
            field_label_aliases=eventconv.FIELD_LABELS,
            to_external=eventconv.from_core,
            to_internal=eventconv.to_core,
        ),
        ResourceType(
            "coordination.k8s.io",
            "v1",
            "leases",
            "Lease",
            "lease",
            True,
            "io.k8s.api.coordination.v1.Lease",
            LeaseStrategy(),
        ),
        ResourceType(
            "policy",
            "v1",
            "poddisruptionbudgets",
            "PodDisruptionBudget",
            "poddisruptionbudget",
            True,
            "io.k8s.api.policy.v1.PodDisruptionBudget",
            PdbStrategy(),
            subresources=("status",),
            short_names=("pdb",),
        ),
    ]
