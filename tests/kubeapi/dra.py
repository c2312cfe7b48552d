"""``resource.k8s.io``: ResourceSlice, ResourceClaim and DeviceTaintRule, per served version.

Modelled on ``k8s.io/api/resource/{v1alpha3,v1beta1,v1beta2,v1}/types.go`` and
``pkg/registry/resource/*/strategy.go``.  Objects are stored in the ``v1`` shape; the
``v1beta1`` shapes differ (a ResourceSlice device keeps its fields under ``basic``, a claim's
request has them inline instead of under ``exactly``) and are converted on the way in and out.
DeviceTaintRule has the same shape in v1alpha3, v1beta2 and v1.

Which versions a server serves is a :data:`DraApis` mapping (plural -> versions), e.g. one of
:data:`DRA_RELEASES`; discovery, routing and 404s follow it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from . import validation
from .errors import FieldError
from .resources import ResourceType, Strategy, _fields, _get

Obj = dict[str, Any]
DraApis = Mapping[str, tuple[str, ...]]  # plural -> the resource.k8s.io versions serving it

GROUP = "resource.k8s.io"
TAINT_EFFECTS = ("None", "NoSchedule", "NoExecute")  # DeviceTaintEffect; None exists from 1.35
MAX_RULE_CONDITIONS = 8  # DeviceTaintRuleStatusMaxConditions

# What a cluster of each release serves once DRA (and, before 1.37, the DeviceTaintRule API) is
# switched on with --runtime-config / feature gates: KEP-5055 (DeviceTaintRule v1alpha3 in
# 1.33-1.35, v1beta2 in 1.36, v1 in 1.37) and KEP-4381 (ResourceSlice/ResourceClaim v1beta1 1.32,
# v1beta2 1.33, v1 1.34).  "off": no resource.k8s.io at all.
DRA_RELEASES: dict[str, DraApis] = {
    "off": {},
    "1.33": {
        "resourceslices": ("v1beta2", "v1beta1"),
        "resourceclaims": ("v1beta2", "v1beta1"),
        "devicetaintrules": ("v1alpha3",),
    },
    "1.35": {
        "resourceslices": ("v1", "v1beta2", "v1beta1"),
        "resourceclaims": ("v1", "v1beta2", "v1beta1"),
        "devicetaintrules": ("v1alpha3",),
    },
    "1.36": {
        "resourceslices": ("v1", "v1beta2", "v1beta1"),
        "resourceclaims": ("v1", "v1beta2", "v1beta1"),
        "devicetaintrules": ("v1beta2",),
    },
    "1.37": {
        "resourceslices": ("v1", "v1beta2", "v1beta1"),
        "resourceclaims": ("v1", "v1beta2", "v1beta1"),
        "devicetaintrules": ("v1",),
    },
}
_KINDS = {
    "resourceslices": ("ResourceSlice", "resourceslice", False, ()),
    "resourceclaims": ("ResourceClaim", "resourceclaim", True, ("status",)),
    "devicetaintrules": ("DeviceTaintRule", "devicetaintrule", False, ("status",)),
}


# --- conversions between the stored v1 shape and v1beta1 --------------------------------------


def _slice_from_v1beta1(obj: Obj) -> Obj:
    for device in (obj.get("spec") or {}).get("devices") or []:
        device.update(device.pop("basic", None) or {})
    return obj


def _slice_to_v1beta1(obj: Obj) -> Obj:
    devices = (obj.get("spec") or {}).get("devices") or []
    for index, device in enumerate(devices):
        devices[index] = {"name": device.pop("name", ""), "basic": device}
    return obj


def _claim_from_v1beta1(obj: Obj) -> Obj:
    requests = ((obj.get("spec") or {}).get("devices") or {}).get("requests") or []
    for index, request in enumerate(requests):
        if "firstAvailable" not in request:
            requests[index] = {"name": request.pop("name", ""), "exactly": request}
    return obj


def _claim_to_v1beta1(obj: Obj) -> Obj:
    requests = ((obj.get("spec") or {}).get("devices") or {}).get("requests") or []
    for request in requests:
        request.update(request.pop("exactly", None) or {})
    return obj


def _identity(obj: Obj) -> Obj:
    return obj


_CONVERSIONS: dict[tuple[str, str], tuple[Callable[[Obj], Obj], Callable[[Obj], Obj]]] = {
    ("resourceslices", "v1beta1"): (_slice_to_v1beta1, _slice_from_v1beta1),
    ("resourceclaims", "v1beta1"): (_claim_to_v1beta1, _claim_from_v1beta1),
}


# --- strategies -----------------------------------------------------------------------------------


def _qualified(value: str, path: str) -> list[FieldError]:
    return [FieldError("Invalid", path, value, m) for m in validation.is_qualified_name(value)]


def validate_device_taint(taint: Obj, path: str) -> list[FieldError]:
    """``validateDeviceTaint``: key a qualified name, value a label value, effect in the enum."""
    errors: list[FieldError] = []
    key = taint.get("key") or ""
    errors += [FieldError("Required", f"{path}.key")] if not key else _qualified(key, f"{path}.key")
    value = taint.get("value") or ""
    errors += [FieldError("Invalid", f"{path}.value", value, m) for m in validation.is_label_value(value) if value]
    effect = taint.get("effect") or ""
    if not effect:
        errors.append(FieldError("Required", f"{path}.effect"))
    elif effect not in TAINT_EFFECTS:
        supported = ", ".join(json.dumps(e) for e in sorted(TAINT_EFFECTS))
        errors.append(FieldError("NotSupported", f"{path}.effect", effect, f"supported values: {supported}"))
    return errors


def validate_device_taint_rule(rule: Obj) -> list[FieldError]:
    spec = rule.get("spec") or {}
    errors = validate_device_taint(spec.get("taint") or {}, "spec.taint")
    selector = spec.get("deviceSelector") or {}
    if selector.get("driver"):
        driver = selector["driver"]
        errors += [
            FieldError("Invalid", "spec.deviceSelector.driver", driver, m)
            for m in validation.is_dns1123_subdomain(driver)
        ]
    if selector.get("device"):
        device = selector["device"]
        errors += [
            FieldError("Invalid", "spec.deviceSelector.device", device, m) for m in validation.is_dns1123_label(device)
        ]
    conditions = (rule.get("status") or {}).get("conditions") or []
    if len(conditions) > MAX_RULE_CONDITIONS:
        errors.append(
            FieldError(
                "TooMany", "status.conditions", len(conditions), f"must have at most {MAX_RULE_CONDITIONS} items"
            )
        )
    return errors


class DeviceTaintRuleStrategy(Strategy):
    """``pkg/registry/resource/devicetaintrule/strategy.go``: status only through ``/status``,
    generation bumped by spec changes, ``taint.timeAdded`` set on create and whenever the effect
    changes (a given value equal to the old one is replaced then)."""

    has_status = True
    tracks_generation = True

    def __init__(self, now: Callable[[], str]) -> None:
        self._now = now

    def prepare_for_create(self, obj: Obj) -> None:
        obj.pop("status", None)
        taint = obj.setdefault("spec", {}).setdefault("taint", {})
        taint.setdefault("timeAdded", self._now())

    def prepare_for_update(self, new: Obj, old: Obj, subresource: str | None) -> None:
        super().prepare_for_update(new, old, subresource)
        if subresource == "status":
            return
        taint = new.setdefault("spec", {}).setdefault("taint", {})
        old_taint = (old.get("spec") or {}).get("taint") or {}
        effect_changed = taint.get("effect") != old_taint.get("effect")
        if not taint.get("timeAdded") or (effect_changed and taint["timeAdded"] == old_taint.get("timeAdded")):
            taint["timeAdded"] = self._now() if effect_changed else old_taint.get("timeAdded") or self._now()

    def validate_create(self, obj: Obj, namespace: str) -> list[FieldError]:
        return validate_device_taint_rule(obj)


def validate_resource_slice(obj: Obj) -> list[FieldError]:
    spec = obj.get("spec") or {}
    errors = [] if spec.get("driver") else [FieldError("Required", "spec.driver")]
    if not (spec.get("pool") or {}).get("name"):
        errors.append(FieldError("Required", "spec.pool.name"))
    chosen = [k for k in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection") if spec.get(k)]
    if len(chosen) != 1:
        errors.append(
            FieldError(
                "Invalid",
                "spec",
                "{`nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection`}",
                "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required",
            )
        )
    for index, device in enumerate(spec.get("devices") or []):
        for t_index, taint in enumerate(device.get("taints") or []):
            errors += validate_device_taint(taint, f"spec.devices[{index}].taints[{t_index}]")
    return errors


class ResourceSliceStrategy(Strategy):
    def validate_create(self, obj: Obj, namespace: str) -> list[FieldError]:
        return validate_resource_slice(obj)


class ResourceClaimStrategy(Strategy):
    """Status (the allocation, ``reservedFor``) is written by the scheduler through ``/status``."""

    has_status = True

    def prepare_for_create(self, obj: Obj) -> None:
        obj.pop("status", None)


def _slice_fields(obj: Obj) -> dict[str, str]:
    """``resourceslice.ToSelectableFields``: ``spec.nodeName`` and ``spec.driver``."""
    fields = _fields(obj, (), namespaced=False)
    fields["spec.nodeName"] = _get(obj, "spec.nodeName")
    fields["spec.driver"] = _get(obj, "spec.driver")
    return fields


def _resource_type(plural: str, version: str, now: Callable[[], str]) -> ResourceType:
    kind, singular, namespaced, subresources = _KINDS[plural]
    strategy: Strategy = {
        "resourceslices": ResourceSliceStrategy,
        "resourceclaims": ResourceClaimStrategy,
    }.get(plural, Strategy)()
    if plural == "devicetaintrules":
        strategy = DeviceTaintRuleStrategy(now)
    to_external, to_internal = _CONVERSIONS.get((plural, version), (_identity, _identity))
    return ResourceType(
        GROUP,
        version,
        plural,
        kind,
        singular,
        namespaced,
        f"io.k8s.api.resource.{version}.{kind}",
        strategy,
        subresources=subresources,
        field_labels=_slice_fields
        if plural == "resourceslices"
        else (lambda o, n=namespaced: _fields(o, (), namespaced=n)),
        to_external=to_external,
        to_internal=to_internal,
    )


def dra_resources(apis: DraApis, now: Callable[[], str]) -> list[ResourceType]:
    """The served resource.k8s.io types, in ``apis``' order (each kind's versions as given)."""
    unknown = sorted(set(apis) - set(_KINDS))
    if unknown:
        raise ValueError(f"unknown resource.k8s.io resources {unknown}; known: {sorted(_KINDS)}")
    return [_resource_type(plural, version, now) for plural, versions in apis.items() for version in versions]


def storage_resources(now: Callable[[], str]) -> list[ResourceType]:
    """The v1 types of every kind, served or not: ``put_object`` and ``get_object`` use them so a
    test can seed slices and claims whatever the server serves."""
    return [_resource_type(plural, "v1", now) for plural in _KINDS]


def resolve(dra: str | DraApis) -> DraApis:
    if isinstance(dra, str):
        if dra not in DRA_RELEASES:
            raise ValueError(f"unknown DRA release {dra!r}; known: {sorted(DRA_RELEASES)}")
        return DRA_RELEASES[dra]
    return {plural: tuple(versions) for plural, versions in dra.items()}
