"""Small naming types shared by the server modules."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class GroupResource:
    """``schema.GroupResource``: prints as ``nodes`` or ``leases.coordination.k8s.io``."""

    group: str
    resource: str

    def __str__(self) -> str:
        return f"{self.resource}.{self.group}" if self.group else self.resource


# The alphabet apiserver's names.SimpleNameGenerator draws from (no vowels, no confusable digits).
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def generate_name(prefix: str, rng: random.Random) -> str:
    """``metadata.generateName`` + five random characters, truncated like the real generator."""
    max_prefix = 63 - 5
    return prefix[:max_prefix] + "".join(rng.choice(_GENERATE_ALPHABET) for _ in range(5))
