"""One Lease write shared by recovery (the budget, the pause store) and the active checks (their fleet
slots): a JSON annotation put on a Lease that is created when missing, or replaced with the resourceVersion
read (a conditional write: 409 on a race)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Protocol


class LeaseWriter(Protocol):
    """What the write needs of :class:`agent.adapters.kube.KubeClient`."""

    def create_lease(self, namespace: str, body: dict[str, Any]) -> Any: ...

    def replace_lease(self, namespace: str, name: str, body: dict[str, Any]) -> Any: ...


def write_lease_annotation(
    client: LeaseWriter,
    lease: dict[str, Any] | None,
    *,
    namespace: str,
    name: str,
    annotation: str,
    value: str,
    spec: Mapping[str, Any] | None = None,
) -> Any:
    """Set ``annotation`` to ``value`` (and merge ``spec``) on ``lease`` as read, or create the Lease when
    it was not there (``lease`` None); the Lease as written (its new resourceVersion). KubeError as every
    call (409 when another writer came first)."""
    if lease is None:
        body: dict[str, Any] = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {"app.kubernetes.io/managed-by": "node-health-agent"},
            },
            "spec": {},
        }
    else:
        body = copy.deepcopy(lease)  # keeps metadata.resourceVersion: the write is conditional
    metadata = body.setdefault("metadata", {})
    metadata["annotations"] = {**(metadata.get("annotations") or {}), annotation: value}
    if spec:
        body["spec"] = {**(body.get("spec") or {}), **spec}
    if lease is None:
        return client.create_lease(namespace, body)
    return client.replace_lease(namespace, name, body)
