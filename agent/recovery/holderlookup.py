"""Who holds a failing device on this node: the kubelet's pod-resources answer, mapped by
:func:`agent.core.holders.holders_of`.

The client (:class:`agent.adapters.podresources.PodResourcesClient`) is made at the first lookup, and grpc is
imported only by its first call: an agent that never looks up never loads grpc (docs/devices.md, "Memory").
The kubelet limits this API (100 requests per second, burst 10), so ``List`` is read at most once per
``cache_s`` (its answer, or its failure, serves every lookup in between) and ``GetAllocatableResources``
once, for the NeuronCores per Neuron device, and only when a Neuron device is looked up.

The pod-resources API lists only this node's pods: the holders found are always pods on this node.
A lookup never raises: a failure becomes an empty answer whose ``incomplete`` says why.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from agent.adapters.podresources import DEFAULT_SOCKET, DEFAULT_TIMEOUT_S, PodResourcesClient, PodResourcesError
from agent.core.devices import DeviceKind, DeviceRef
from agent.core.holders import DeviceAliases, Holders, PodResources, cores_per_device, holders_of

log = logging.getLogger(__name__)

DraTriples = Callable[[DeviceRef], frozenset[tuple[str, str, str]]]  # (driver, pool, device) of its slices
MigUuids = Callable[[DeviceRef], frozenset[str]]  # the MIG UUIDs on a GPU
DEFAULT_CACHE_S = 2.0


def describe_failure(err: Exception) -> str:
    """``<reason>: <message>`` for a :class:`PodResourcesError`; the type and text for anything else."""
    if isinstance(err, PodResourcesError):
        return f"{err.reason.value}: {str(err).removeprefix(f'pod-resources {err.reason.value}: ')}"
    return f"{type(err).__name__}: {err}"


class HolderLookup:
    """The holders of a device, from the kubelet's pod-resources socket. One caller (the recovery loop's
    thread): not thread-safe."""

    def __init__(
        self,
        *,
        socket_path: str = DEFAULT_SOCKET,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        dra: DraTriples | None = None,
        mig_uuids: MigUuids | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        cache_s: float = DEFAULT_CACHE_S,
    ) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self._dra = dra
        self._mig_uuids = mig_uuids
        self._monotonic = monotonic
        self._cache_s = cache_s
        self._client: PodResourcesClient | None = None
        self._pods: tuple[PodResources, ...] | Exception = ()
        self._listed_at: float | None = None  # monotonic time of the last List (answered or failed)
        self._cores: int | None = None  # NeuronCores per Neuron device, once read
        self._cores_read_at: float | None = None  # the last GetAllocatableResources tried
        self._cores_known = False  # GetAllocatableResources answered (its answer may still say "unknown")

    def holders(self, device: DeviceRef) -> Holders:
        """The containers holding ``device``, sorted; ``incomplete`` says what could not be read."""
        try:
            return self._holders(device)
        except Exception as exc:  # a bug must not stop recovery: the answer says why it is empty
            log.exception("pod-resources lookup of %s failed", device.key)
            return Holders((), incomplete=describe_failure(exc))

    def _holders(self, device: DeviceRef) -> Holders:
        pods = self._list()
        if isinstance(pods, Exception):
            return Holders((), incomplete=describe_failure(pods))
        aliases, missing = self._aliases(device)
        found = holders_of(device, pods, aliases)
        notes = [note for note in (*missing, found.incomplete) if note]
        return Holders(found.holders, incomplete="; ".join(notes) or None)

    def _client_now(self) -> PodResourcesClient:
        if self._client is None:
            self._client = PodResourcesClient(self.socket_path, timeout_s=self.timeout_s)
        return self._client

    def _list(self) -> tuple[PodResources, ...] | Exception:
        """``List``'s answer (or failure), read again only when the last one is ``cache_s`` old."""
        now = self._monotonic()
        if self._listed_at is None or now - self._listed_at >= self._cache_s:
            try:
                self._pods = self._client_now().list()
            except PodResourcesError as err:
                log.warning("pod-resources List failed: %s", err)
                self._pods = err
            self._listed_at = self._monotonic()
        return self._pods

    def _aliases(self, device: DeviceRef) -> tuple[DeviceAliases, list[str]]:
        """What else names ``device`` (DRA triples, MIG UUIDs, cores per device), and what could not be read."""
        missing: list[str] = []
        dra: frozenset[tuple[str, str, str]] = frozenset()
        migs: frozenset[str] = frozenset()
        if self._dra is not None:
            try:
                dra = self._dra(device)
            except Exception as exc:  # e.g. the ResourceSlices could not be read: device-plugin ids still match
                missing.append(f"DRA devices not read: {describe_failure(exc)}")
        if self._mig_uuids is not None and device.kind is DeviceKind.GPU:
            try:
                migs = self._mig_uuids(device)
            except Exception as exc:
                missing.append(f"MIG devices not read: {describe_failure(exc)}")
        cores = self._cores_per_device() if device.kind is DeviceKind.NEURON else None
        return DeviceAliases(mig_uuids=migs, dra=dra, neuron_cores_per_device=cores), missing

    def _cores_per_device(self) -> int | None:
        """NeuronCores per device from ``GetAllocatableResources``: read once; a failure is retried at most
        once per ``cache_s``."""
        now = self._monotonic()
        due = self._cores_read_at is None or now - self._cores_read_at >= self._cache_s
        if not self._cores_known and due:
            self._cores_read_at = now
            try:
                self._cores = cores_per_device(self._client_now().allocatable())
                self._cores_known = True
            except PodResourcesError as err:
                log.warning("pod-resources GetAllocatableResources failed: %s", err)
        return self._cores
