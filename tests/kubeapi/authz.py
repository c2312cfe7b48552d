"""Bearer-token authentication and an optional RBAC-like authorizer."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .errors import ApiError, forbidden, unauthorized
from .names import GroupResource

PUBLIC_PATHS = ("/healthz", "/livez", "/readyz", "/version")


@dataclass(frozen=True)
class PolicyRule:
    """A ClusterRole rule: ``resources`` may name subresources (``nodes/status``); ``*`` matches all."""

    verbs: tuple[str, ...]
    api_groups: tuple[str, ...]
    resources: tuple[str, ...]

    def allows(self, verb: str, group: str, resource: str) -> bool:
        return (
            ("*" in self.verbs or verb in self.verbs)
            and ("*" in self.api_groups or group in self.api_groups)
            and ("*" in self.resources or resource in self.resources)
        )


def authenticate(expected_token: str | None, header: str | None, *, anonymous: bool, path: str) -> ApiError | None:
    """401 for a wrong token, and for a missing one unless anonymous access reaches a public path."""
    if expected_token is None:
        return None
    if header is None:
        if anonymous and path.rstrip("/") in PUBLIC_PATHS:
            return None
        return unauthorized()
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or token.strip() != expected_token:
        return unauthorized()
    return None


class Authorizer:
    """``rules=None`` allows everything; otherwise a request needs a rule allowing it."""

    def __init__(
        self,
        user: str = "system:serviceaccount:kube-system:node-health-agent",
        rules: Iterable[PolicyRule] | None = None,
    ) -> None:
        self.user = user
        self.rules = None if rules is None else tuple(rules)

    def check(
        self, verb: str, resource: GroupResource, subresource: str | None, namespace: str | None, name: str | None
    ) -> ApiError | None:
        if self.rules is None:
            return None
        full = f"{resource.resource}/{subresource}" if subresource else resource.resource
        if any(rule.allows(verb, resource.group, full) for rule in self.rules):
            return None
        scope = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
        why = f'User "{self.user}" cannot {verb} resource "{full}" in API group "{resource.group}" {scope}'
        subject = f'{resource} "{name}"' if name else str(resource)
        return forbidden(f"{subject} is forbidden: {why}", resource, name)
