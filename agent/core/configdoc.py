"""Configuration documents of every kind: finding them, reading them (JSON or YAML, bounded by
:mod:`agent.core.docreader`) with a line number for every field, and collecting problems that name
the file, the field path and the line."""

from __future__ import annotations

import itertools
import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from agent.core.docreader import (
    MAX_DIR_DEPTH,
    MAX_DIR_ENTRIES,
    MAX_FILES,
    Refused,
    compose_yaml,
    load_json,
    load_yaml,
    read_config_bytes,
)
from agent.core.errors import ConfigProblem

# The keys of a rule pack / system-log-monitor file (agent.detectors.schema reads them; the NPD custom-plugin
# reader names them when one turns up in the wrong kind of file).
LOG_MONITOR_TOP_KEYS = frozenset(
    {
        "plugin",
        "pluginConfig",
        "logPath",
        "lookback",
        "delay",
        "skipList",
        "bufferSize",
        "source",
        "metricsReporting",
        "conditions",
        "rules",
        "lists",
        "cloudwatchNamespace",
    }
)
LOG_MONITOR_RULE_KEYS = frozenset(
    {
        "type",
        "condition",
        "reason",
        "pattern",
        "patternGeneratedMessageSuffix",
        "name",
        "severity",
        "where",
        "threshold",
        "keyValues",
        "fieldTypes",
        "enabled",
        "provenance",
        "fallback",
        "device",
        "maxLevel",
    }
)

FieldPath = tuple[str | int, ...]  # where a value is in a document: keys and list indexes from the top

PACK_SUFFIXES = (".json", ".yaml", ".yml")
_SUFFIXES_TEXT = ", ".join(f"*{s}" for s in PACK_SUFFIXES)


_WINDOWS_PATH = re.compile(r"[A-Za-z]:[\\/]|\\\\")  # C:\x, C:/x, \\server\share


def windows_path_problem(value: object) -> str | None:
    """Why ``value`` cannot be used when it is a Windows path (every config kind says it the same way)."""
    if not isinstance(value, str) or not _WINDOWS_PATH.match(value):
        return None
    return (
        f"{value!r} is a Windows path: node-health-agent runs on Linux nodes only (node-problem-detector's "
        "windows-*.json configs have no equivalent here)"
    )


class TooManyEntries(Exception):
    """A directory with more entries than :data:`~agent.core.docreader.MAX_DIR_ENTRIES`."""


def list_directory(path: Path) -> list[Path]:
    """The entries of a directory, sorted. Raises OSError (e.g. permission denied) or TooManyEntries."""
    with os.scandir(path) as entries:
        names = [e.name for e in itertools.islice(entries, MAX_DIR_ENTRIES + 1)]
    if len(names) > MAX_DIR_ENTRIES:
        raise TooManyEntries
    return sorted(path / name for name in names)


def _reason(exc: OSError) -> str:
    text = exc.strerror or str(exc)
    return text[:1].lower() + text[1:]


def _walk(
    directory: Path, *, found: list[Path], problems: list[ConfigProblem], seen: set[Path], depth: int = 0
) -> None:
    real = directory.resolve()
    if real in seen:  # a symlink loop
        return
    seen.add(real)
    if depth > MAX_DIR_DEPTH:
        problems.append(
            ConfigProblem(
                file=str(directory), field="", message=f"is nested more than {MAX_DIR_DEPTH} directories deep: not read"
            )
        )
        return
    try:
        entries = list_directory(directory)
    except OSError as exc:
        problems.append(ConfigProblem(file=str(directory), field="", message=f"cannot read directory: {_reason(exc)}"))
        return
    except TooManyEntries:
        problems.append(
            ConfigProblem(
                file=str(directory),
                field="",
                message=f"has more than {MAX_DIR_ENTRIES:,} entries: not read (is it really a plugin directory?)",
            )
        )
        return
    for entry in entries:
        if len(found) > MAX_FILES:
            return
        if entry.name.startswith("."):
            continue  # hidden: editor files, and the ..data copies of a mounted ConfigMap
        if entry.is_dir():
            _walk(entry, found=found, problems=problems, seen=seen, depth=depth + 1)
        elif entry.suffix in PACK_SUFFIXES and entry.exists():
            # A FIFO or a device is kept (reading it says why it is refused); a dangling symlink
            # (a mounted ConfigMap between its two steps of an update) is not a file yet.
            found.append(entry)


def discover(paths: Iterable[Path]) -> tuple[list[Path], list[ConfigProblem]]:
    """Configuration files in load order, and the problems found looking for them.

    A directory expands (recursively, sorted by path, hidden entries skipped) into its ``*.json``,
    ``*.yaml`` and ``*.yml`` files; a directory without any, or one that cannot be listed, is a
    problem. Other paths are kept as given (reading them reports what is wrong). At most
    :data:`~agent.core.docreader.MAX_FILES` files in all: past that, a problem.
    """
    found: list[Path] = []
    problems: list[ConfigProblem] = []
    for path in paths:
        if len(found) > MAX_FILES:
            break
        if not path.is_dir():
            found.append(path)
            continue
        before_files, before_problems = len(found), len(problems)
        _walk(path, found=found, problems=problems, seen=set())
        if len(found) == before_files and len(problems) == before_problems:
            problems.append(
                ConfigProblem(
                    file=str(path), field="", message=f"is a directory with no rule pack files ({_SUFFIXES_TEXT})"
                )
            )
    if len(found) > MAX_FILES:
        problems.append(
            ConfigProblem(
                file=str(found[MAX_FILES]),
                field="",
                message=f"more than {MAX_FILES:,} configuration files in all: this one and those after it are not read",
            )
        )
        del found[MAX_FILES:]
    return found, problems


@dataclass(frozen=True, kw_only=True, slots=True)
class Document:
    """A parsed pack plus a map from field path to line number."""

    data: Any
    lines: Mapping[FieldPath, int]
    nodes: int = 0  # YAML nodes, aliases expanded (see agent.core.docreader)
    size: int = 0  # bytes

    def line(self, path: FieldPath) -> int | None:
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return self.lines.get((), None)


def _collect_lines(node: yaml.Node, path: FieldPath, lines: dict[FieldPath, int]) -> None:
    """Bounded by the reader: at most MAX_DEPTH deep and MAX_NODES paths, aliases followed."""
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else "?"  # "? [a, b]": a complex key
            child = (*path, key)
            _collect_lines(value_node, child, lines)
            lines[child] = key_node.start_mark.line + 1  # a problem with a field points at its key
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _collect_lines(item, (*path, i), lines)


def _line_map(root: yaml.Node | None) -> dict[FieldPath, int]:
    lines: dict[FieldPath, int] = {}
    if root is not None:
        _collect_lines(root, (), lines)
    return lines


def _parse(text: str, *, is_json: bool) -> tuple[Any, yaml.Node | None, int]:
    """(data, composed root for line numbers, node count); raises Refused, YAMLError, JSONDecodeError."""
    if not is_json:
        return load_yaml(text)
    try:
        # JSON is (almost always) YAML too, so one composer gives line numbers for both, and its
        # scan bounds the document before json builds anything. Tabs are whitespace in JSON but not
        # YAML indentation; expanding them keeps every line.
        root = compose_yaml(text.expandtabs())
    except yaml.YAMLError:
        root = None  # JSON that YAML 1.1 cannot read ("\/" escapes): no line numbers; load_json bounds it
    data, nodes = load_json(text)
    return data, root, nodes


def read_pack(path: Path) -> tuple[Document | None, list[ConfigProblem]]:
    """Parse a pack file (``.json`` as JSON, anything else as YAML); None and the problem if it cannot be.

    Within the bounds of :mod:`agent.core.docreader` (regular files, size, nodes, depth)."""
    name = str(path)
    try:
        raw = read_config_bytes(path)
        text = raw.decode("utf-8")
        data, root, nodes = _parse(text, is_json=path.suffix == ".json")
    except Refused as exc:
        return None, [ConfigProblem(file=name, field="", message=exc.message, line=exc.line)]
    except OSError as exc:
        return None, [ConfigProblem(file=name, field="", message=f"cannot read file: {_reason(exc)}")]
    except UnicodeDecodeError as exc:
        return None, [ConfigProblem(file=name, field="", message=f"cannot read file: not UTF-8 text ({exc.reason})")]
    except json.JSONDecodeError as exc:
        return None, [ConfigProblem(file=name, field="", message=f"invalid JSON: {exc.msg}", line=exc.lineno)]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        line = mark.line + 1 if mark else None
        return None, [ConfigProblem(file=name, field="", message=f"invalid YAML: {problem}", line=line)]
    return Document(data={} if data is None else data, lines=_line_map(root), nodes=nodes, size=len(raw)), []


def field_path(path: FieldPath) -> str:
    """``("rules", 3, "pattern")`` -> ``rules[3].pattern``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


class Problems:
    """The problems of one file, each with its field path and line."""

    def __init__(self, *, file: str, doc: Document) -> None:
        self.file = file
        self.doc = doc
        self._found: list[ConfigProblem] = []

    def add(self, path: FieldPath, message: str) -> None:
        self._found.append(
            ConfigProblem(file=self.file, field=field_path(path), message=message, line=self.doc.line(path))
        )

    def where(self, path: FieldPath) -> str:
        """``rules[0].name, line 4`` for a message that points at another field."""
        line = self.doc.line(path)
        return field_path(path) + (f", line {line}" if line is not None else "")

    def __len__(self) -> int:
        return len(self._found)

    @property
    def problems(self) -> list[ConfigProblem]:
        """In line order (problems without a line first), then in the order found."""
        return sorted(self._found, key=lambda p: p.line or 0)
