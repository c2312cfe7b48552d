"""Configuration errors that name the file, the field and (where known) the line."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class ConfigProblem:
    file: str
    field: str  # e.g. "rules[3].pattern"; "" for the whole file
    message: str
    line: int | None = None  # 1-based

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
        if self.field:
            where += f": {self.field}"
        return f"{where}: {self.message}"


class ConfigError(Exception):
    """One or more configuration problems; ``str()`` lists every one of them."""

    def __init__(self, problems: Sequence[ConfigProblem]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(str(p) for p in self.problems))
