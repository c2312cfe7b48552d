"""``metav1.Status`` failures with the reasons, codes and messages the API server uses."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .names import GroupResource


@dataclass(frozen=True)
class FieldError:
    """One entry of a ``field.ErrorList`` (k8s.io/apimachinery/pkg/util/validation/field)."""

    type: str  # Required, Invalid, NotSupported, Duplicate, Forbidden, TooLong, TooMany
    field: str
    value: Any = None
    detail: str = ""

    _CAUSES = {
        "Required": ("FieldValueRequired", "Required value"),
        "Invalid": ("FieldValueInvalid", "Invalid value"),
        "NotSupported": ("FieldValueNotSupported", "Unsupported value"),
        "Duplicate": ("FieldValueDuplicate", "Duplicate value"),
        "Forbidden": ("FieldValueForbidden", "Forbidden"),
        "TooLong": ("FieldValueTooLong", "Too long"),
        "TooMany": ("FieldValueTooMany", "Too many"),
    }

    @property
    def cause_type(self) -> str:
        return self._CAUSES[self.type][0]

    def body(self) -> str:
        """``ErrorBody()``: the message without the field path."""
        label = self._CAUSES[self.type][1]
        with_value = self.type in ("Invalid", "NotSupported", "Duplicate")
        text = f"{label}: {_go_value(self.value)}" if with_value else label
        return f"{text}: {self.detail}" if self.detail else text

    def __str__(self) -> str:
        return f"{self.field}: {self.body()}"


def _go_value(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


@dataclass
class ApiError(Exception):
    """An error response: HTTP ``code`` with a ``Status`` body."""

    code: int
    reason: str
    message: str
    details: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
        }
        if self.details is not None:
            body["details"] = self.details
        body["code"] = self.code
        return body


def _details(resource: GroupResource, name: str | None = None, **extra: Any) -> dict[str, Any]:
    details: dict[str, Any] = {}
    if name:
        details["name"] = name
    if resource.group:
        details["group"] = resource.group
    details["kind"] = resource.resource
    details.update(extra)
    return details


def not_found(resource: GroupResource, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{resource} "{name}" not found', _details(resource, name))


def already_exists(resource: GroupResource, name: str) -> ApiError:
    return ApiError(409, "AlreadyExists", f'{resource} "{name}" already exists', _details(resource, name))


OPTIMISTIC_LOCK_MESSAGE = "the object has been modified; please apply your changes to the latest version and try again"


def conflict(resource: GroupResource, name: str, why: str = OPTIMISTIC_LOCK_MESSAGE) -> ApiError:
    return ApiError(
        409, "Conflict", f'Operation cannot be fulfilled on {resource} "{name}": {why}', _details(resource, name)
    )


def invalid(group: str, kind: str, name: str, errors: list[FieldError]) -> ApiError:
    qualified = f"{kind}.{group}" if group else kind
    message = f'{qualified} "{name}" is invalid'
    if errors:
        joined = str(errors[0]) if len(errors) == 1 else "[" + ", ".join(str(e) for e in errors) + "]"
        message = f"{message}: {joined}"
    details: dict[str, Any] = {"name": name} if name else {}
    if group:
        details["group"] = group
    details["kind"] = kind
    details["causes"] = [{"reason": e.cause_type, "message": e.body(), "field": e.field} for e in errors]
    return ApiError(422, "Invalid", message, details)


def patch_invalid(patched: str, error: str) -> ApiError:
    """A patched document that no longer decodes (``errors.NewInvalid`` with an empty kind)."""
    return invalid("", "", "", [FieldError("Invalid", "patch", patched, error)])


def unprocessable(server_message: str) -> ApiError:
    """``NewGenericServerResponse(422, ...)``, used e.g. for a failing JSON-patch ``test`` op."""
    return ApiError(
        422,
        "Invalid",
        "the server rejected our request due to an error in our request",
        {"causes": [{"reason": "UnexpectedServerResponse", "message": server_message}]},
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def internal(message: str) -> ApiError:
    return ApiError(
        500,
        "InternalError",
        f"Internal error occurred: {message}",
        {"causes": [{"message": message}]},
    )


def unknown(message: str, code: int = 500) -> ApiError:
    """An error the API server passes through unclassified (``ErrorToAPIStatus``: reason Unknown)."""
    return ApiError(code, "Unknown", message)


def unauthorized() -> ApiError:
    return ApiError(401, "Unauthorized", "Unauthorized")


def forbidden(message: str, resource: GroupResource | None = None, name: str | None = None) -> ApiError:
    details = _details(resource, name) if resource is not None else None
    return ApiError(403, "Forbidden", message, details)


def method_not_allowed(method: str) -> ApiError:
    return ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")


def unsupported_media_type(accepted: list[str]) -> ApiError:
    return ApiError(
        415,
        "UnsupportedMediaType",
        "the body of the request was in an unknown format - accepted media types include: " + ", ".join(accepted),
    )


def too_many_requests(
    message: str, retry_after: int | None = None, causes: list[dict[str, str]] | None = None
) -> ApiError:
    details: dict[str, Any] = {}
    if causes:
        details["causes"] = causes
    headers: dict[str, str] = {}
    if retry_after:
        details["retryAfterSeconds"] = retry_after
        headers["Retry-After"] = str(retry_after)
    return ApiError(429, "TooManyRequests", message, details or None, headers)


def service_unavailable(retry_after: int | None = None) -> ApiError:
    error = ApiError(503, "ServiceUnavailable", "The server is currently unable to handle the request")
    if retry_after:
        error.details = {"retryAfterSeconds": retry_after}
        error.headers["Retry-After"] = str(retry_after)
    return error


def gateway_timeout() -> ApiError:
    return ApiError(
        504,
        "Timeout",
        "Timeout: request did not complete within requested timeout - context deadline exceeded",
        {},
    )


def expired(message: str) -> ApiError:
    """410 Gone, reason ``Expired`` (a watch from a compacted resourceVersion)."""
    return ApiError(410, "Expired", message)


def for_status_code(code: int, retry_after: int | None = None, message: str | None = None) -> ApiError:
    """A generic failure of ``code`` as the API server's filters produce it (for fault injection)."""
    if code == 429:
        error = too_many_requests(message or "Too many requests, please try again later.", retry_after or 1)
    elif code == 500:
        error = internal(message or "injected fault")
    elif code == 503:
        error = service_unavailable(retry_after)
    elif code == 504:
        error = gateway_timeout()
    elif code == 401:
        error = unauthorized()
    elif code == 403:
        error = forbidden(message or "forbidden")
    elif code == 409:
        error = ApiError(409, "Conflict", message or OPTIMISTIC_LOCK_MESSAGE)
    else:
        error = ApiError(code, "Unknown", message or f"the server responded with the status code {code}")
    if message and code in (503, 504):
        error.message = message
    return error
