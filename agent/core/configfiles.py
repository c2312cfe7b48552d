"""Every configuration file the agent reads, sorted by kind before anything else looks at it.

Plugin directories and ``--config`` files may hold node-problem-detector configurations of
every kind and our own check declarations. Each file is read once and classified; each kind goes
to its own loader, so a file of one kind never produces knock-on errors from another kind's
schema. A kind we do not run is refused with one line that names it.

=====================  ==============================================  ==========================
kind                   recognised by                                   goes to
=====================  ==============================================  ==========================
rule pack              ``rules`` (``plugin`` absent or ``kmsg``)        detectors.rulepack
log file monitor       ``plugin: filelog``                             a file tailer + its rules
journal monitor        ``plugin: journald``                            journalctl + its rules
custom plugin monitor  ``plugin: custom``                              checks.npd_plugin
checks                 top-level ``checks``                            checks.declared
catch-all              top-level ``catchAll``                          detectors.catchall
system-stats monitor   ``cpu``/``disk``/``memory``/``host``/``net``/...  refused
=====================  ==============================================  ==========================
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.core.configdoc import Document, discover, read_pack
from agent.core.docreader import MAX_TOTAL_BYTES, MAX_TOTAL_NODES
from agent.core.errors import ConfigProblem


class Kind(enum.StrEnum):
    RULE_PACK = "rule pack"
    LOG_FILE = "system-log-monitor (filelog)"
    JOURNAL = "system-log-monitor (journald)"
    CUSTOM_PLUGIN = "custom-plugin-monitor"
    CHECKS = "checks"
    CATCH_ALL = "catch-all"


# Keys only node-problem-detector's system-stats-monitor configs have (pkg/systemstatsmonitor/types).
SYSTEM_STATS_KEYS = frozenset({"cpu", "disk", "host", "memory", "net", "osFeature", "invokeInterval"})
LOG_PLUGINS = {"kmsg": Kind.RULE_PACK, "filelog": Kind.LOG_FILE, "journald": Kind.JOURNAL}


@dataclass(frozen=True, kw_only=True, slots=True)
class ConfigFile:
    path: Path
    kind: Kind
    doc: Document


def classify(path: Path, doc: Document) -> Kind | ConfigProblem:
    """The kind of one parsed file, or the one problem that says why it cannot be used."""
    data = doc.data
    name = str(path)
    if not isinstance(data, dict):
        return ConfigProblem(
            file=name,
            field="",
            message="expected a mapping: a node-problem-detector monitor config or a 'checks:' declaration",
            line=doc.line(()),
        )
    if data.get("kind") == "ConfigMap" and "apiVersion" in data:
        keys = sorted(data.get("data") or {}) if isinstance(data.get("data"), dict) else []
        key = keys[0] if keys else "kernel-monitor.json"
        escaped = key.replace(".", "\\.")
        return ConfigProblem(
            file=name,
            field="kind",
            message=f"is a Kubernetes ConfigMap, not a monitor config: give each of its data entries as a file of its "
            f"own (data keys: {', '.join(keys) or 'none'}), e.g. kubectl get configmap "
            f"{(data.get('metadata') or {}).get('name', '<name>')} -o jsonpath='{{.data.{escaped}}}' > {key} "
            "(docs/migrating-from-npd.md)",
            line=doc.line(("kind",)),
        )
    plugin = data.get("plugin")
    if "checks" in data and plugin is None and "rules" not in data:
        return Kind.CHECKS
    if "catchAll" in data and plugin is None and "rules" not in data:
        return Kind.CATCH_ALL
    if plugin == "custom":
        return Kind.CUSTOM_PLUGIN
    if plugin is None and "rules" not in data and SYSTEM_STATS_KEYS & set(data):
        return ConfigProblem(
            file=name,
            field="",
            message="is a node-problem-detector system-stats-monitor config, which node-health-agent does not run "
            "(export node statistics with a Prometheus node exporter); remove it from the plugin directories",
            line=doc.line(()),
        )
    if plugin is None or plugin in LOG_PLUGINS:
        return LOG_PLUGINS.get(plugin or "kmsg", Kind.RULE_PACK)
    return ConfigProblem(
        file=name,
        field="plugin",
        message=f"plugin {plugin!r} is not one node-health-agent runs (kmsg, filelog, journald or custom)",
        line=doc.line(("plugin",)),
    )


def read_config_files(paths: Iterable[Path]) -> tuple[list[ConfigFile], list[ConfigProblem]]:
    """Every file under ``paths`` (directories recursively, in path order), read and classified.

    Each file within the bounds of :mod:`agent.core.docreader`, and all of them together within
    ``MAX_TOTAL_BYTES`` and ``MAX_TOTAL_NODES``: the file that crosses either is a problem, and the
    files after it are not read."""
    found, problems = discover(list(paths))
    files: list[ConfigFile] = []
    total_bytes = total_nodes = 0
    for path in found:
        doc, read_problems = read_pack(path)
        problems.extend(read_problems)
        if doc is None:
            continue
        total_bytes += doc.size
        total_nodes += doc.nodes
        if total_bytes > MAX_TOTAL_BYTES or total_nodes > MAX_TOTAL_NODES:
            problems.append(
                ConfigProblem(
                    file=str(path),
                    field="",
                    message=f"the configuration files together pass {MAX_TOTAL_BYTES / (1 << 20):g} MiB or "
                    f"{MAX_TOTAL_NODES:,} nodes with this one: it and those after it are not read",
                )
            )
            break
        kind = classify(path, doc)
        if isinstance(kind, ConfigProblem):
            problems.append(kind)
        else:
            files.append(ConfigFile(path=path, kind=kind, doc=doc))
    return files, problems


def of_kind(files: Sequence[ConfigFile], *kinds: Kind) -> list[ConfigFile]:
    return [f for f in files if f.kind in kinds]
