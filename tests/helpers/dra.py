"""DRA objects for tests: ResourceSlices as the NVIDIA and Neuron DRA drivers publish them, claims
allocated to their devices and the pods that use those claims (stored in the v1 shape; the test API
server serves them in whatever versions it was built with)."""

from __future__ import annotations

from typing import Any

from kubeapi import KubeApiServer

NODE = "n1"
NVIDIA = "gpu.nvidia.com"
NEURON = "neuron.aws.com"


def gpu_device(minor: int, *, uuid: str, pci: str, taints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A full GPU as k8s-dra-driver-gpu publishes it (``GpuInfo.GetDevice``)."""
    device: dict[str, Any] = {
        "name": f"gpu-{minor}",
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": uuid},
            "pcieBusID": {"string": pci},
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
        },
    }
    if taints:
        device["taints"] = taints
    return device


def neuron_device(index: int, *, taints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A Neuron device as the Neuron DRA driver publishes it (its attributes reference)."""
    device: dict[str, Any] = {
        "name": f"neurondevice{index}",
        "attributes": {
            "deviceId": {"int": index},
            "resourceType": {"string": "neuron_device"},
            "instanceType": {"string": "trn2.48xlarge"},
        },
    }
    if taints:
        device["taints"] = taints
    return device


def resource_slice(
    driver: str, devices: list[dict[str, Any]], *, node: str = NODE, name: str | None = None, generation: int = 1
) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name or f"{node}-{driver}-{generation}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def allocated_claim(
    name: str,
    driver: str,
    devices: list[str],
    *,
    namespace: str = "default",
    pool: str = NODE,
    tolerations: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    results = [{"request": "r", "driver": driver, "pool": pool, "device": d} for d in devices]
    for result in results:
        if tolerations:
            result["tolerations"] = tolerations
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": driver}}]}},
        "status": {"allocation": {"devices": {"results": results}}},
    }


def claim_pod(name: str, claim: str, *, namespace: str = "default", node: str = NODE) -> dict[str, Any]:
    """A running pod using ``claim`` (a ResourceClaim of its namespace)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "image": "busybox", "resources": {"claims": [{"name": "dev"}]}}],
            "resourceClaims": [{"name": "dev", "resourceClaimName": claim}],
        },
        "status": {"phase": "Running"},
    }


H100_UUIDS = [f"GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd" for i in range(8)]
H100_PCI = [
    "0000:18:00.0",
    "0000:2a:00.0",
    "0000:3a:00.0",
    "0000:5d:00.0",
    "0000:9a:00.0",
    "0000:ab:00.0",
    "0000:ba:00.0",
    "0000:db:00.0",
]


def seed_p5(server: KubeApiServer, *, node: str = NODE, taints: dict[int, list[dict[str, Any]]] | None = None) -> None:
    """Eight H100s of a p5.48xlarge in one slice (``taints``: per minor, as the driver set them)."""
    devices = [gpu_device(i, uuid=H100_UUIDS[i], pci=H100_PCI[i], taints=(taints or {}).get(i)) for i in range(8)]
    server.put_object(resource_slice(NVIDIA, devices, node=node))
