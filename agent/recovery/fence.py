"""The DRA device fence: one DeviceTaintRule per bad device, dry run first (KEP-5055).

On a node whose devices a DRA driver publishes in ResourceSlices, :class:`DeviceFencer` takes one
device out of scheduling without touching the node:

1. Discovery finds the ``resource.k8s.io`` version serving ``devicetaintrules`` (v1 > v1beta2 >
   v1alpha3). None: :attr:`FenceOutcome.NO_API` (logged once), the policy falls back.
2. This node's ResourceSlices (``spec.nodeName``, the newest generation of each pool) give the
   device's ``driver/pool/device``, matched by its attributes (below). Not listed:
   :attr:`FenceOutcome.NOT_DRA` (a device-plugin node).
3. A device whose slice entry already carries a taint of its own driver (key in the driver's
   domain, effect NoSchedule or NoExecute) is left alone: :attr:`FenceOutcome.VENDOR`.
4. The rule is written with effect ``None``; the device-taint eviction controller then writes, once
   per spec change, the ``EvictionInProgress`` condition whose message says how many pods a
   ``NoExecute`` would evict. That count is read back (a bounded wait), then the effect becomes
   ``NoSchedule`` (``NoExecute`` only when constructed so: it deletes pods without
   PodDisruptionBudgets). No status within ``read_back_timeout``: the fence goes on and says so.

How a :class:`DeviceRef` meets a DRA device (attribute names without their driver's domain):

- ``gpu.nvidia.com`` (NVIDIA k8s-dra-driver-gpu, ``cmd/gpu-kubelet-plugin/deviceinfo.go``): full
  GPUs are ``gpu-<minor>`` with ``type: gpu``, ``uuid`` (``GPU-...``) and ``pcieBusID``; matched by
  UUID, then PCI address, then the name from the minor. MIG devices (``type: mig``) are separate
  DRA devices and are not fenced with their GPU.
- ``neuron.aws.com`` (AWS Neuron DRA driver, "Neuron DRA Driver Attributes Reference"): devices
  ``neurondevice<N>`` with the integer ``deviceId``; matched by ``deviceId``, then the name.
  **Assumption**: the Neuron driver's own taint keys are not documented where we could read them;
  any key in ``neuron.aws.com/`` counts as the vendor's.
- ``rdma``: **assumption**, no RDMA/EFA DRA driver was studied: a device named like the RDMA device,
  or whose ``pcieBusID``/``pciAddress`` attribute is its PCI address, of any driver.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from agent.adapters.kube import KubeError
from agent.core.devices import DeviceKind, DeviceRef, normalize_pci

log = logging.getLogger(__name__)

RULES = "devicetaintrules"
SLICES = "resourceslices"
NVIDIA_DRIVER = "gpu.nvidia.com"
NEURON_DRIVER = "neuron.aws.com"
TAINT_KEY = "node-health-agent.io/device-fault"
NODE_LABEL = "node-health-agent.io/node"
DEVICE_LABEL = "node-health-agent.io/device"
INCIDENT_ANNOTATION = "node-health-agent.io/incident"
REASON_ANNOTATION = "node-health-agent.io/reason"
EVICTION_CONDITION = "EvictionInProgress"
EFFECTS = ("NoSchedule", "NoExecute")  # the final effects a fencer may be built with
READ_BACK_STEP = 0.5  # seconds between reads of the rule's status
MAX_NAME = 253  # a DNS subdomain
MAX_LABEL_VALUE = 63
_WOULD_EVICT = re.compile(r"(\d+) pods? would be evicted")
_NOT_NAME = re.compile(r"[^a-z0-9.-]+")
_NOT_LABEL = re.compile(r"[^A-Za-z0-9._-]+")


class FenceOutcome(enum.StrEnum):
    FENCED = "fenced"  # our DeviceTaintRule is in place with the final effect
    VENDOR = "vendor"  # the vendor DRA driver already tainted the device in its ResourceSlice
    NO_API = "no-api"  # the cluster serves no DeviceTaintRule: the policy's fallback
    NOT_DRA = "not-dra"  # no ResourceSlice of this node lists the device: a device-plugin node


@dataclass(frozen=True, kw_only=True, slots=True)
class DraDevice:
    driver: str
    pool: str
    device: str

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Fence:
    outcome: FenceOutcome
    rule: str = ""  # the DeviceTaintRule's name ("" when none written)
    dra: DraDevice | None = None
    would_evict: int | None = None  # from the effect-None read-back (None: the status said nothing)
    message: str = ""  # for Events: what was done and why


class FenceClient(Protocol):
    """The part of :class:`agent.adapters.kube.KubeClient` a fence uses."""

    def resource_api_version(self, resource: str) -> str | None: ...

    def list_resource_slices(self, version: str, *, node_name: str) -> list[dict[str, Any]]: ...

    def get_device_taint_rule(self, version: str, name: str) -> dict[str, Any]: ...

    def create_device_taint_rule(self, version: str, body: dict[str, Any]) -> dict[str, Any]: ...

    def patch_device_taint_rule(self, version: str, name: str, body: dict[str, Any]) -> dict[str, Any]: ...

    def delete_device_taint_rule(self, version: str, name: str) -> dict[str, Any]: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class _SliceDevice:
    dra: DraDevice
    attributes: dict[str, Any]  # name without the driver's domain -> the value ({"string": ...} etc.)
    taints: tuple[dict[str, Any], ...]


class DeviceFencer:
    """Writes, reads back and removes this node's DeviceTaintRules. API errors propagate as
    :class:`KubeError` (the recovery loop retries with backoff)."""

    def __init__(
        self,
        *,
        client: FenceClient,
        node_name: str,
        effect: str = "NoSchedule",
        clock: Callable[[], float] = time.time,
        read_back_timeout: float = 10.0,
        wait: Callable[[float], None] = time.sleep,
    ) -> None:
        if effect not in EFFECTS:
            raise ValueError(f"effect must be one of {EFFECTS}, not {effect!r}")
        self._client = client
        self._node = node_name
        self._effect = effect
        self._clock = clock
        self._read_back_timeout = read_back_timeout
        self._wait = wait
        self._said_no_api = False

    # --- finding the device ----------------------------------------------------------------------

    def dra_device(self, device: DeviceRef) -> DraDevice | None:
        """The DRA device this node's ResourceSlices list for ``device``, or None."""
        found = self._slice_device(device)
        return None if found is None else found.dra

    def _slice_device(self, device: DeviceRef) -> _SliceDevice | None:
        version = self._client.resource_api_version(SLICES)
        if version is None:
            return None
        candidates = _slice_devices(self._client.list_resource_slices(version, node_name=self._node))
        return next((c for c in candidates if _matches(device, c)), None)

    # --- fencing ---------------------------------------------------------------------------------

    def rule_name(self, device: DeviceRef) -> str:
        return rule_name(self._node, device)

    def fence(self, device: DeviceRef, *, reason: str, incident_id: str) -> Fence:
        """Fence ``device`` (idempotent: a rule of our name already there is adopted)."""
        version = self._client.resource_api_version(RULES)
        if version is None:
            return self._no_api()
        found = self._slice_device(device)
        if found is None:
            return Fence(
                outcome=FenceOutcome.NOT_DRA,
                message=f"no ResourceSlice of node {self._node} lists {device.describe()}: not a DRA device",
            )
        vendor = [t for t in found.taints if _is_vendor_taint(found.dra.driver, t)]
        if vendor:
            keys = ", ".join(sorted({f"{t.get('key')}={t.get('effect')}" for t in vendor}))
            return Fence(
                outcome=FenceOutcome.VENDOR,
                dra=found.dra,
                message=f"{found.dra} is already tainted by its driver ({keys}): no DeviceTaintRule written",
            )
        name = self.rule_name(device)
        rule = self._ensure_rule(version, name, device, found.dra, reason=reason, incident_id=incident_id)
        would_evict = _would_evict(rule)
        waited = False
        if _effect(rule) == "None":
            rule, would_evict, waited = self._read_back(version, name, rule)
        if _effect(rule) != self._effect:
            rule = self._client.patch_device_taint_rule(version, name, {"spec": {"taint": {"effect": self._effect}}})
        return Fence(
            outcome=FenceOutcome.FENCED,
            rule=name,
            dra=found.dra,
            would_evict=would_evict,
            message=self._fenced_message(name, found.dra, reason, would_evict, waited),
        )

    def _no_api(self) -> Fence:
        message = "the cluster serves no DeviceTaintRule (resource.k8s.io): device fences fall back to the policy"
        if not self._said_no_api:
            log.warning("%s", message)
            self._said_no_api = True
        return Fence(outcome=FenceOutcome.NO_API, message=message)

    def _ensure_rule(
        self, version: str, name: str, device: DeviceRef, dra: DraDevice, *, reason: str, incident_id: str
    ) -> dict[str, Any]:
        """Our rule: the one already there (adopted), else a new one with effect None."""
        try:
            return self._client.get_device_taint_rule(version, name)
        except KubeError as exc:
            if exc.status != 404:
                raise
        body = rule_body(
            name=name, node=self._node, device=device, dra=dra, reason=reason, incident_id=incident_id, version=version
        )
        try:
            return self._client.create_device_taint_rule(version, body)
        except KubeError as exc:
            if not exc.already_exists:
                raise
            return self._client.get_device_taint_rule(version, name)  # an earlier try's write landed

    def _read_back(self, version: str, name: str, rule: dict[str, Any]) -> tuple[dict[str, Any], int | None, bool]:
        """Wait (bounded) for the controller's condition for this generation of the rule.
        Returns the rule last read, the count it gave (None: no status) and whether time ran out."""
        deadline = self._clock() + self._read_back_timeout
        while not _read_back_done(rule):
            remaining = deadline - self._clock()
            if remaining <= 0:
                log.warning(
                    "DeviceTaintRule %s: no status from the eviction controller within %.0f s; fencing without "
                    "knowing what an eviction would hit",
                    name,
                    self._read_back_timeout,
                )
                return rule, None, True
            self._wait(min(READ_BACK_STEP, remaining))
            rule = self._client.get_device_taint_rule(version, name)
        return rule, _would_evict(rule), False

    def _fenced_message(self, name: str, dra: DraDevice, reason: str, would_evict: int | None, waited: bool) -> str:
        text = f"DeviceTaintRule {name} taints {dra} with effect {self._effect} ({reason})"
        if would_evict is not None:
            plural = "pod" if would_evict == 1 else "pods"
            return f"{text}; its dry run said NoExecute would evict {would_evict} {plural}"
        if waited:
            return (
                f"{text}; the eviction controller wrote no status within {self._read_back_timeout:g} s, "
                "so what an eviction would hit is unknown"
            )
        return f"{text}; its status says nothing of what an eviction would hit"

    # --- unfencing -------------------------------------------------------------------------------

    def unfence(self, device: DeviceRef) -> bool:
        """Delete our rule for ``device``; True when one was deleted (none there, or no API: False)."""
        version = self._client.resource_api_version(RULES)
        if version is None:
            return False
        try:
            self._client.delete_device_taint_rule(version, self.rule_name(device))
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True


# --- names and the body ----------------------------------------------------------------------------


def _bounded(text: str, limit: int) -> str:
    """``text`` if it fits, else its start and a hash of the whole (alphanumeric at both ends)."""
    if len(text) <= limit:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    return f"{text[: limit - len(digest) - 1].rstrip('.-_')}-{digest}"


def device_label(device: DeviceRef) -> str:
    """``device.key`` as a label value: ``gpu:0000:3b:00.0`` -> ``gpu-0000-3b-00.0``."""
    return _bounded(_NOT_LABEL.sub("-", device.key).strip("-._"), MAX_LABEL_VALUE)


def rule_name(node: str, device: DeviceRef) -> str:
    """``node-health-agent-<node>-<device key>``, a DNS subdomain of at most 253 characters."""
    text = _NOT_NAME.sub("-", f"node-health-agent-{node}-{device.key}".lower()).strip("-.")
    return _bounded(text, MAX_NAME)


def rule_body(
    *, name: str, node: str, device: DeviceRef, dra: DraDevice, reason: str, incident_id: str, version: str
) -> dict[str, Any]:
    """A DeviceTaintRule selecting exactly ``dra``, effect None (the dry run)."""
    return {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": name,
            "labels": {NODE_LABEL: _bounded(node, MAX_LABEL_VALUE), DEVICE_LABEL: device_label(device)},
            "annotations": {INCIDENT_ANNOTATION: incident_id, REASON_ANNOTATION: reason},
        },
        "spec": {
            "deviceSelector": {"driver": dra.driver, "pool": dra.pool, "device": dra.device},
            "taint": {"key": TAINT_KEY, "value": _taint_value(reason), "effect": "None"},
        },
    }


def _taint_value(reason: str) -> str:
    """The reason as a label value (what a toleration may match); empty when nothing is left."""
    return _NOT_LABEL.sub("-", reason).strip("-._")[:MAX_LABEL_VALUE].rstrip("-._")


# --- reading slices and rules ----------------------------------------------------------------------


def _slice_devices(slices: Iterable[dict[str, Any]]) -> list[_SliceDevice]:
    """Every device of the newest generation of each pool (older generations are being replaced)."""
    slices = list(slices)
    newest: dict[tuple[str, str], int] = {}
    for item in slices:
        spec = item.get("spec") or {}
        pool = spec.get("pool") or {}
        key = (spec.get("driver") or "", pool.get("name") or "")
        newest[key] = max(newest.get(key, int(pool.get("generation") or 0)), int(pool.get("generation") or 0))
    found = []
    for item in slices:
        spec = item.get("spec") or {}
        driver, pool = spec.get("driver") or "", spec.get("pool") or {}
        if int(pool.get("generation") or 0) != newest[(driver, pool.get("name") or "")]:
            continue
        for entry in spec.get("devices") or []:
            fields = {**entry, **(entry.get("basic") or {})}  # v1beta1 keeps them under "basic"
            attributes = {k.removeprefix(f"{driver}/"): v for k, v in (fields.get("attributes") or {}).items()}
            found.append(
                _SliceDevice(
                    dra=DraDevice(driver=driver, pool=pool.get("name") or "", device=entry.get("name") or ""),
                    attributes=attributes,
                    taints=tuple(fields.get("taints") or ()),
                )
            )
    return found


def _attr(candidate: _SliceDevice, name: str) -> Any:
    value = candidate.attributes.get(name) or {}
    for kind in ("string", "int", "version", "bool"):
        if kind in value:
            return value[kind]
    return None


def _matches(device: DeviceRef, candidate: _SliceDevice) -> bool:
    driver, name = candidate.dra.driver, candidate.dra.device
    if device.kind is DeviceKind.GPU:
        if driver != NVIDIA_DRIVER or _attr(candidate, "type") not in (None, "gpu"):
            return False
        if device.uuid and _attr(candidate, "uuid"):
            return bool(_attr(candidate, "uuid") == device.uuid)
        pci = normalize_pci(str(_attr(candidate, "pcieBusID") or ""))
        if device.pci and pci:
            return pci == device.pci
        return device.index is not None and name == f"gpu-{device.index}"
    if device.kind is DeviceKind.NEURON:
        if driver != NEURON_DRIVER or _attr(candidate, "resourceType") not in (None, "neuron_device"):
            return False
        if _attr(candidate, "deviceId") is not None:
            return device.index is not None and _attr(candidate, "deviceId") == device.index
        return device.index is not None and name == f"neurondevice{device.index}"
    pci = normalize_pci(str(_attr(candidate, "pcieBusID") or _attr(candidate, "pciAddress") or ""))
    return name in {device.name, device.id} or (device.pci is not None and pci == device.pci)


def _is_vendor_taint(driver: str, taint: dict[str, Any]) -> bool:
    """A taint the driver set (its own domain) that keeps pods off: NoSchedule or NoExecute. A
    ``None`` taint (NVIDIA's ignored Xids, ``unmonitored``) only informs: we still fence."""
    return str(taint.get("key") or "").startswith(f"{driver}/") and taint.get("effect") in EFFECTS


def _effect(rule: dict[str, Any]) -> str:
    return str(((rule.get("spec") or {}).get("taint") or {}).get("effect") or "")


def _condition(rule: dict[str, Any]) -> dict[str, Any] | None:
    conditions = (rule.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == EVICTION_CONDITION), None)


def _read_back_done(rule: dict[str, Any]) -> bool:
    """The controller wrote its condition for the rule's current spec."""
    condition = _condition(rule)
    generation = int((rule.get("metadata") or {}).get("generation") or 1)
    return condition is not None and int(condition.get("observedGeneration") or 0) == generation


def _would_evict(rule: dict[str, Any]) -> int | None:
    """The pod count of the dry run's message ("3 pods would be evicted in ..."), or None."""
    condition = _condition(rule)
    if condition is None or condition.get("reason") != "NoEffect":
        return None
    match = _WOULD_EVICT.search(str(condition.get("message") or ""))
    return None if match is None else int(match.group(1))
