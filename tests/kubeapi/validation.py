"""Validation rules of the API server for the kinds the test server serves.

Messages follow ``k8s.io/apimachinery/pkg/util/validation`` and ``pkg/apis/*/validation``; only
the rules an agent can plausibly trip over are implemented (see the module docstrings of the
callers for the list).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from .errors import FieldError

_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*"
_QUALIFIED_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_VALUE = r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?"

_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    f"'{_DNS1123_SUBDOMAIN}')"
)
_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and "
    f"end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
    f"'{_DNS1123_LABEL}')"
)
_QUALIFIED_MSG = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric "
    f"character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '{_QUALIFIED_NAME}')"
)
_LABEL_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used "
    f"for validation is '{_LABEL_VALUE}')"
)

NameValidator = Callable[[str], list[str]]


def is_dns1123_subdomain(value: str) -> list[str]:
    errors = []
    if len(value) > 253:
        errors.append("must be no more than 253 characters")
    if not re.fullmatch(_DNS1123_SUBDOMAIN, value):
        errors.append(_SUBDOMAIN_MSG)
    return errors


def is_dns1123_label(value: str) -> list[str]:
    errors = []
    if len(value) > 63:
        errors.append("must be no more than 63 characters")
    if not re.fullmatch(_DNS1123_LABEL, value):
        errors.append(_LABEL_MSG)
    return errors


def is_path_segment_name(value: str) -> list[str]:
    if value in (".", ".."):
        return [f"may not be '{value}'"]
    return [f"may not contain '{c}'" for c in ("/", "%") if c in value]


def is_qualified_name(value: str) -> list[str]:
    parts = value.split("/")
    errors: list[str] = []
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            errors.append("prefix part must be non-empty")
        else:
            errors.extend("prefix part " + m for m in is_dns1123_subdomain(prefix))
    else:
        return [
            f"a qualified name {_QUALIFIED_MSG} with an optional DNS subdomain prefix and '/' "
            "(e.g. 'example.com/MyName')"
        ]
    if not name:
        errors.append("name part must be non-empty")
    elif len(name) > 63:
        errors.append("name part must be no more than 63 characters")
    if not re.fullmatch(_QUALIFIED_NAME, name):
        errors.append("name part " + _QUALIFIED_MSG)
    return errors


def is_label_value(value: str) -> list[str]:
    errors = []
    if len(value) > 63:
        errors.append("must be no more than 63 characters")
    if not re.fullmatch(_LABEL_VALUE, value):
        errors.append(_LABEL_VALUE_MSG)
    return errors


def validate_object_meta(meta: dict[str, Any], name_validator: NameValidator) -> list[FieldError]:
    """``ValidateObjectMetaAccessor``: name/generateName, labels, annotations, finalizers."""
    errors: list[FieldError] = []
    name = meta.get("name") or ""
    generate_name = meta.get("generateName") or ""
    if generate_name:
        errors += [
            FieldError("Invalid", "metadata.generateName", generate_name, m)
            for m in name_validator(generate_name.rstrip("-") + "x")
        ]
    if not name:
        errors.append(FieldError("Required", "metadata.name", detail="name or generateName is required"))
    else:
        errors += [FieldError("Invalid", "metadata.name", name, m) for m in name_validator(name)]
    for key, value in (meta.get("labels") or {}).items():
        errors += [FieldError("Invalid", "metadata.labels", key, m) for m in is_qualified_name(key)]
        errors += [FieldError("Invalid", "metadata.labels", value, m) for m in is_label_value(value)]
    annotations = meta.get("annotations") or {}
    for key in annotations:
        errors += [FieldError("Invalid", "metadata.annotations", key, m) for m in is_qualified_name(key.lower())]
    total = sum(len(k) + len(v) for k, v in annotations.items())
    if total > 256 * 1024:
        errors.append(FieldError("TooLong", "metadata.annotations", detail="must have at most 262144 bytes"))
    for index, finalizer in enumerate(meta.get("finalizers") or []):
        errors += [
            FieldError("Invalid", f"metadata.finalizers[{index}]", finalizer, m) for m in is_qualified_name(finalizer)
        ]
    return errors


def immutable(new: Any, old: Any, path: str) -> list[FieldError]:
    if new == old:
        return []
    return [FieldError("Invalid", path, new, "field is immutable")]


# --- core/v1 Node --------------------------------------------------------------------------------

_TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def validate_node(node: dict[str, Any]) -> list[FieldError]:
    errors: list[FieldError] = []
    seen: set[tuple[str, str]] = set()
    for index, taint in enumerate((node.get("spec") or {}).get("taints") or []):
        path = f"spec.taints[{index}]"
        key = taint.get("key") or ""
        errors += [FieldError("Invalid", f"{path}.key", key, m) for m in is_qualified_name(key)]
        if taint.get("value"):
            value = taint["value"]
            errors += [FieldError("Invalid", f"{path}.value", value, m) for m in is_label_value(value)]
        effect = taint.get("effect") or ""
        if not effect:
            errors.append(FieldError("Required", f"{path}.effect"))
        elif effect not in _TAINT_EFFECTS:
            supported = ", ".join(json.dumps(e) for e in _TAINT_EFFECTS)
            errors.append(FieldError("NotSupported", f"{path}.effect", effect, f"supported values: {supported}"))
        if (key, effect) in seen:
            errors.append(FieldError("Duplicate", path, taint, "taints must be unique by key and effect pair"))
        seen.add((key, effect))
    return errors


# --- coordination.k8s.io/v1 Lease ----------------------------------------------------------------


def validate_lease(lease: dict[str, Any]) -> list[FieldError]:
    spec = lease.get("spec") or {}
    errors: list[FieldError] = []
    duration = spec.get("leaseDurationSeconds")
    if duration is not None and duration <= 0:
        errors.append(FieldError("Invalid", "spec.leaseDurationSeconds", duration, "must be greater than 0"))
    transitions = spec.get("leaseTransitions")
    if transitions is not None and transitions < 0:
        errors.append(FieldError("Invalid", "spec.leaseTransitions", transitions, "must be greater than or equal to 0"))
    return errors


# --- core/v1 Pod ---------------------------------------------------------------------------------

_RESTART_POLICIES = ("Always", "OnFailure", "Never")
POD_UPDATE_FORBIDDEN = (
    "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,"
    "`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),"
    "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)"
)


def validate_pod(pod: dict[str, Any]) -> list[FieldError]:
    spec = pod.get("spec") or {}
    errors: list[FieldError] = []
    containers = spec.get("containers") or []
    if not containers:
        errors.append(FieldError("Required", "spec.containers"))
    names: set[str] = set()
    for index, container in enumerate(containers):
        path = f"spec.containers[{index}]"
        name = container.get("name") or ""
        if not name:
            errors.append(FieldError("Required", f"{path}.name"))
        else:
            errors += [FieldError("Invalid", f"{path}.name", name, m) for m in is_dns1123_label(name)]
            if name in names:
                errors.append(FieldError("Duplicate", f"{path}.name", name))
            names.add(name)
        if not container.get("image"):
            errors.append(FieldError("Required", f"{path}.image"))
    policy = spec.get("restartPolicy")
    if policy is not None and policy not in _RESTART_POLICIES:
        supported = ", ".join(json.dumps(p) for p in _RESTART_POLICIES)
        errors.append(FieldError("NotSupported", "spec.restartPolicy", policy, f"supported values: {supported}"))
    return errors


def _mask_mutable_pod_fields(spec: dict[str, Any]) -> dict[str, Any]:
    masked = json.loads(json.dumps(spec))
    for key in ("containers", "initContainers"):
        for container in masked.get(key) or []:
            container.pop("image", None)
    for key in ("activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds", "schedulingGates"):
        masked.pop(key, None)
    return masked


def validate_pod_update(new: dict[str, Any], old: dict[str, Any]) -> list[FieldError]:
    errors = validate_pod(new)
    if _mask_mutable_pod_fields(new.get("spec") or {}) != _mask_mutable_pod_fields(old.get("spec") or {}):
        errors.append(FieldError("Forbidden", "spec", detail=POD_UPDATE_FORBIDDEN))
    return errors


# --- policy/v1 PodDisruptionBudget ---------------------------------------------------------------


def _int_or_percent(value: Any, path: str) -> list[FieldError]:
    if isinstance(value, int):
        return [] if value >= 0 else [FieldError("Invalid", path, value, "must be greater than or equal to 0")]
    match = re.fullmatch(r"([0-9]+)%", str(value))
    if match is None:
        return [FieldError("Invalid", path, value, "must be an integer or percentage (e.g '5%')")]
    if int(match.group(1)) > 100:
        return [FieldError("Invalid", path, value, "must not be greater than 100%")]
    return []


def validate_pdb(pdb: dict[str, Any]) -> list[FieldError]:
    spec = pdb.get("spec") or {}
    errors: list[FieldError] = []
    if "minAvailable" in spec and "maxUnavailable" in spec:
        errors.append(FieldError("Invalid", "spec", spec, "minAvailable and maxUnavailable cannot be both set"))
    for key in ("minAvailable", "maxUnavailable"):
        if key in spec:
            errors += _int_or_percent(spec[key], f"spec.{key}")
    return errors


# --- Events (stored in core/v1 shape) ------------------------------------------------------------

_EVENT_LIMIT = 128
_NOTE_LIMIT = 1024


def validate_event_legacy(event: dict[str, Any], namespace: str, *, events_api: bool) -> list[FieldError]:
    """``legacyValidateEvent``: the rules every Event write passes, whatever the API group."""
    errors: list[FieldError] = []
    involved_ns = (event.get("involvedObject") or {}).get("namespace") or ""
    if not event.get("eventTime"):
        if involved_ns == "":
            if namespace not in ("", "default"):
                errors.append(
                    FieldError("Invalid", "involvedObject.namespace", involved_ns, "does not match event.namespace")
                )
        elif namespace != involved_ns:
            errors.append(
                FieldError("Invalid", "involvedObject.namespace", involved_ns, "does not match event.namespace")
            )
    else:
        controller_field = "reportingController" if events_api else "reportingComponent"
        if involved_ns == "" and namespace not in ("default", "kube-system"):
            errors.append(
                FieldError("Invalid", "involvedObject.namespace", involved_ns, "does not match event.namespace")
            )
        controller = event.get("reportingComponent") or ""
        if not controller:
            errors.append(FieldError("Required", controller_field))
        errors += [FieldError("Invalid", controller_field, controller, m) for m in is_qualified_name(controller)]
        instance = event.get("reportingInstance") or ""
        if not instance:
            errors.append(FieldError("Required", "reportingInstance"))
        if len(instance) > _EVENT_LIMIT:
            errors.append(FieldError("Invalid", "reportingInstance", "", f"can have at most {_EVENT_LIMIT} characters"))
        for key in ("action", "reason"):
            value = event.get(key) or ""
            if not value:
                errors.append(FieldError("Required", key))
            if len(value) > _EVENT_LIMIT:
                errors.append(FieldError("Invalid", key, "", f"can have at most {_EVENT_LIMIT} characters"))
        if len(event.get("message") or "") > _NOTE_LIMIT:
            errors.append(FieldError("Invalid", "message", "", f"can have at most {_NOTE_LIMIT} characters"))
    errors += [FieldError("Invalid", "namespace", namespace, m) for m in is_dns1123_subdomain(namespace)]
    return errors


def validate_events_api_create(event: dict[str, Any]) -> list[FieldError]:
    """The strict rules ``events.k8s.io/v1`` adds on create (``ValidateEventCreate``)."""
    errors: list[FieldError] = []
    series = event.get("series")
    if series is not None:
        if (series.get("count") or 0) < 2:
            errors.append(FieldError("Invalid", "series.count", "", "should be at least 2"))
        if not series.get("lastObservedTime"):
            errors.append(FieldError("Required", "series.lastObservedTime"))
    if not event.get("eventTime"):
        errors.append(FieldError("Required", "eventTime"))
    event_type = event.get("type") or ""
    if event_type not in ("Normal", "Warning"):
        errors.append(FieldError("Invalid", "type", "", f"has invalid value: {event_type}"))
    for internal, external in (
        ("firstTimestamp", "deprecatedFirstTimestamp"),
        ("lastTimestamp", "deprecatedLastTimestamp"),
        ("count", "deprecatedCount"),
    ):
        if event.get(internal):
            errors.append(FieldError("Invalid", external, "", "needs to be unset"))
    source = event.get("source") or {}
    if source.get("component") or source.get("host"):
        errors.append(FieldError("Invalid", "deprecatedSource", "", "needs to be unset"))
    return errors


def validate_events_api_update(new: dict[str, Any], old: dict[str, Any]) -> list[FieldError]:
    """Fields ``events.k8s.io/v1`` refuses to change (``ValidateEventUpdate``)."""
    errors: list[FieldError] = []
    for key in (
        "involvedObject",
        "reason",
        "type",
        "eventTime",
        "action",
        "reportingComponent",
        "reportingInstance",
        "related",
    ):
        path = "reportingController" if key == "reportingComponent" else key
        errors += immutable(new.get(key), old.get(key), path)
    return errors
