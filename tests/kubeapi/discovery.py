"""``/version`` and the discovery documents (``/api``, ``/api/v1``, ``/apis``, ``/apis/<g>[/<v>]``)."""

from __future__ import annotations

import re
from typing import Any

from .resources import ResourceType

_SUBRESOURCE_VERBS = {"status": ["get", "patch", "update"], "eviction": ["create"]}


def version_info(release: str) -> dict[str, Any]:
    major, minor = release.split(".")[:2]
    return {
        "major": major,
        "minor": minor,
        "gitVersion": f"v{release}",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.25.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    }


def api_versions(server_address: str) -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    }


def resource_list(group_version: str, resources: list[ResourceType]) -> dict[str, Any]:
    entries: list[dict[str, Any]] = []
    for rt in resources:
        if rt.api_version != group_version:
            continue
        entry: dict[str, Any] = {
            "name": rt.plural,
            "singularName": rt.singular,
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": rt.verbs(),
        }
        if rt.short_names:
            entry["shortNames"] = list(rt.short_names)
        entries.append(entry)
        for sub in rt.subresources:
            sub_entry: dict[str, Any] = {
                "name": f"{rt.plural}/{sub}",
                "singularName": "",
                "namespaced": rt.namespaced,
                "kind": rt.kind,
                "verbs": _SUBRESOURCE_VERBS[sub],
            }
            if sub == "eviction":
                sub_entry.update(group="policy", version="v1", kind="Eviction")
            entries.append(sub_entry)
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": entries}


def version_priority(version: str) -> tuple[int, int, int]:
    """``version.CompareKubeAwareVersionStrings`` order as a sort key: GA before beta before
    alpha, higher numbers first (v1 > v1beta2 > v1beta1 > v1alpha3)."""
    match = re.fullmatch(r"v(\d+)(?:(alpha|beta)(\d+))?", version)
    if match is None:
        return (3, 0, 0)
    major, stage, minor = match.groups()
    rank = {None: 0, "beta": 1, "alpha": 2}[stage]
    return (rank, -int(major), -int(minor or 0))


def _group(name: str, versions: list[str]) -> dict[str, Any]:
    versions = sorted(versions, key=version_priority)
    listed = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"name": name, "versions": listed, "preferredVersion": listed[0]}


def api_group_list(resources: list[ResourceType]) -> dict[str, Any]:
    groups: dict[str, list[str]] = {}
    for rt in resources:
        if rt.group and rt.version not in groups.setdefault(rt.group, []):
            groups[rt.group].append(rt.version)
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [_group(g, v) for g, v in groups.items()]}


def api_group(name: str, resources: list[ResourceType]) -> dict[str, Any] | None:
    versions = sorted({rt.version for rt in resources if rt.group == name}, key=version_priority)
    if not versions:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group(name, versions)}
