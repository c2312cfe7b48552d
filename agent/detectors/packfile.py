"""Rule pack files: finding them, reading them (JSON or YAML) with a line number for every field,
and collecting problems that name the file, the field path and the line."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from agent.errors import ConfigProblem

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


def list_directory(path: Path) -> list[Path]:
    """The entries of a directory, sorted. Raises OSError (e.g. permission denied)."""
    return sorted(path.iterdir())


def _reason(exc: OSError) -> str:
    text = exc.strerror or str(exc)
    return text[:1].lower() + text[1:]


def _walk(directory: Path, *, found: list[Path], problems: list[ConfigProblem], seen: set[Path]) -> None:
    real = directory.resolve()
    if real in seen:  # a symlink loop
        return
    seen.add(real)
    try:
        entries = list_directory(directory)
    except OSError as exc:
        problems.append(ConfigProblem(file=str(directory), field="", message=f"cannot read directory: {_reason(exc)}"))
        return
    for entry in entries:
        if entry.name.startswith("."):
            continue  # hidden: editor files, and the ..data copies of a mounted ConfigMap
        if entry.is_dir():
            _walk(entry, found=found, problems=problems, seen=seen)
        elif entry.suffix in PACK_SUFFIXES and entry.is_file():
            found.append(entry)


def discover(paths: Iterable[Path]) -> tuple[list[Path], list[ConfigProblem]]:
    """Rule pack files in load order, and the problems found looking for them.

    A directory expands (recursively, sorted by path, hidden entries skipped) into its ``*.json``,
    ``*.yaml`` and ``*.yml`` files; a directory without any, or one that cannot be listed, is a
    problem. Other paths are kept as given (reading them reports what is wrong).
    """
    found: list[Path] = []
    problems: list[ConfigProblem] = []
    for path in paths:
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
    return found, problems


@dataclass(frozen=True, kw_only=True, slots=True)
class Document:
    """A parsed pack plus a map from field path to line number."""

    data: Any
    lines: Mapping[tuple, int]

    def line(self, path: tuple) -> int | None:
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return self.lines.get((), None)


def _collect_lines(node: yaml.Node, path: tuple, lines: dict[tuple, int]) -> None:
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            child = (*path, getattr(key_node, "value", None))
            _collect_lines(value_node, child, lines)
            lines[child] = key_node.start_mark.line + 1  # a problem with a field points at its key
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _collect_lines(item, (*path, i), lines)


def _line_map(text: str) -> dict[tuple, int]:
    lines: dict[tuple, int] = {}
    try:
        # Tabs are whitespace in JSON but not YAML indentation; expanding them keeps every line.
        node = yaml.compose(text.expandtabs(), Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return lines
    if node is not None:
        _collect_lines(node, (), lines)
    return lines


def read_pack(path: Path) -> tuple[Document | None, list[ConfigProblem]]:
    """Parse a pack file (``.json`` as JSON, anything else as YAML); None and the problem if it cannot be."""
    name = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        return None, [ConfigProblem(file=name, field="", message=f"cannot read file: {_reason(exc)}")]
    except UnicodeDecodeError as exc:
        return None, [ConfigProblem(file=name, field="", message=f"cannot read file: not UTF-8 text ({exc.reason})")]
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            return None, [ConfigProblem(file=name, field="", message=f"invalid JSON: {exc.msg}", line=exc.lineno)]
    else:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            problem = getattr(exc, "problem", None) or str(exc)
            return None, [
                ConfigProblem(
                    file=name, field="", message=f"invalid YAML: {problem}", line=mark.line + 1 if mark else None
                )
            ]
    # JSON is (almost always) YAML too, so one composer gives line numbers for both.
    return Document(data={} if data is None else data, lines=_line_map(text)), []


def field_path(path: tuple) -> str:
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

    def add(self, path: tuple, message: str) -> None:
        self._found.append(
            ConfigProblem(file=self.file, field=field_path(path), message=message, line=self.doc.line(path))
        )

    def where(self, path: tuple) -> str:
        """``rules[0].name, line 4`` for a message that points at another field."""
        line = self.doc.line(path)
        return field_path(path) + (f", line {line}" if line is not None else "")

    def __len__(self) -> int:
        return len(self._found)

    @property
    def problems(self) -> list[ConfigProblem]:
        """In line order (problems without a line first), then in the order found."""
        return sorted(self._found, key=lambda p: p.line or 0)
