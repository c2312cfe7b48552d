"""Label selectors (string and ``LabelSelector`` forms) and field selectors."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


class SelectorError(ValueError):
    """A selector the API server answers with 400 BadRequest."""


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str  # =, !=, in, notin, exists, !, gt, lt
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        op = self.operator
        if op in ("=", "in"):
            return present and value in self.values
        if op in ("!=", "notin"):
            return not present or value not in self.values
        if op == "exists":
            return present
        if op == "!":
            return not present
        if op in ("gt", "lt"):
            try:
                number, bound = int(value or ""), int(self.values[0])
            except ValueError:
                return False
            return number > bound if op == "gt" else number < bound
        return False


LabelMatcher = Callable[[Mapping[str, str]], bool]

_KEY = r"[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?"
_VALUE = r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_REQUIREMENT = re.compile(
    rf"^\s*(?:(?P<not>!)\s*(?P<nkey>{_KEY})"
    rf"|(?P<key>{_KEY})\s*(?:(?P<op>==|!=|=|>|<)\s*(?P<value>{_VALUE})"
    rf"|\s+(?P<setop>in|notin)\s*\((?P<set>[^()]*)\))?)\s*$"
)


def _split_top_level(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return parts


def parse_label_selector(text: str | None) -> list[Requirement]:
    """Parse ``labelSelector`` query syntax (``a=b,c!=d,e in (f,g),!h,i``)."""
    if not text or not text.strip():
        return []
    requirements = []
    for part in _split_top_level(text):
        match = _REQUIREMENT.match(part)
        if match is None:
            raise SelectorError(f"unable to parse requirement: found '{part.strip()}', expected: identifier")
        if match.group("not"):
            requirements.append(Requirement(match.group("nkey"), "!"))
        elif match.group("setop"):
            values = tuple(v.strip() for v in match.group("set").split(",") if v.strip())
            requirements.append(Requirement(match.group("key"), match.group("setop"), values))
        elif match.group("op"):
            op = {"==": "=", ">": "gt", "<": "lt"}.get(match.group("op"), match.group("op"))
            requirements.append(Requirement(match.group("key"), op, (match.group("value"),)))
        else:
            requirements.append(Requirement(match.group("key"), "exists"))
    return requirements


def label_selector_matcher(text: str | None) -> LabelMatcher:
    requirements = parse_label_selector(text)
    return lambda labels: all(r.matches(labels) for r in requirements)


def label_selector_object_matcher(selector: Mapping[str, Any] | None) -> LabelMatcher:
    """A ``metav1.LabelSelector``; ``None`` selects nothing, ``{}`` everything (policy/v1 PDBs)."""
    if selector is None:
        return lambda labels: False
    requirements = [Requirement(k, "=", (v,)) for k, v in (selector.get("matchLabels") or {}).items()]
    operators = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}
    for expression in selector.get("matchExpressions") or []:
        requirements.append(
            Requirement(expression["key"], operators[expression["operator"]], tuple(expression.get("values") or ()))
        )
    return lambda labels: all(r.matches(labels) for r in requirements)


@dataclass(frozen=True)
class FieldRequirement:
    field: str
    value: str
    negate: bool

    def matches(self, fields: Mapping[str, str]) -> bool:
        equal = fields.get(self.field, "") == self.value
        return not equal if self.negate else equal


def _split_unescaped(text: str, separator: str) -> list[str]:
    parts, current, escaped = [], "", False
    for char in text:
        if escaped:
            current += "\\" + char
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == separator:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current + ("\\" if escaped else ""))
    return parts


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", r"\1", value)


def parse_field_selector(text: str | None) -> list[FieldRequirement]:
    """Parse ``fieldSelector`` query syntax (``a=b,c!=d``; ``\\,`` and ``\\=`` escape)."""
    if not text or not text.strip():
        return []
    requirements = []
    for part in _split_unescaped(text, ","):
        match = re.match(r"^([^=!]+)(==|!=|=)(.*)$", part)
        if match is None:
            raise SelectorError(f"invalid selector: '{text}'; can't understand '{part}'")
        field, op, value = match.group(1).strip(), match.group(2), match.group(3)
        requirements.append(FieldRequirement(field, _unescape(value), op == "!="))
    return requirements
