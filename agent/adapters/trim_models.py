"""Service models trimmed to the operations the agent calls: ``agent/adapters/botocore-models`` (issue 16).

botocore keeps every service model it loads in its loader's cache, as parsed JSON. EC2's model (830
operations, 4,400 shapes) costs an agent ~15 MiB once the first reboot builds an EC2 client, for one
operation. The agent's :class:`~agent.adapters.aws.AwsClients` therefore reads the models of
:data:`~agent.adapters.aws.TRIMMED_SERVICES` from :data:`~agent.adapters.aws.TRIMMED_MODELS_DIR` (a
loader search path of its own session, before botocore's data): the installed botocore's model with
only the operations in :data:`~agent.adapters.aws.CALLS`, the shapes they reach and no documentation.
Everything botocore does with a model (serialising, parsing, errors, endpoints) is unchanged for
those operations; any other operation of the service is unknown to the agent's client (CALLS refuses
it before the client is asked anyway).

Regenerate after upgrading botocore (``tests/adapters/test_trimmed_models.py`` checks the committed
files are what this produces)::

    python -m agent.adapters.trim_models
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from agent.adapters.aws import CALLS, TRIMMED_MODELS_DIR, TRIMMED_SERVICES

DOC_KEYS = frozenset({"documentation", "documentationUrl"})  # text for humans: botocore never reads it to call


def operations_called(service: str) -> tuple[str, ...]:
    """The operations of ``service`` the agent calls (from CALLS), sorted."""
    return tuple(sorted(op for svc, op in CALLS if svc == service))


def shape_refs(shape: Mapping[str, Any]) -> Iterable[str]:
    """The names of the shapes ``shape`` refers to (members, list members, map keys and values)."""
    for member in shape.get("members", {}).values():
        yield member["shape"]
    for key in ("member", "key", "value"):
        if key in shape:
            yield shape[key]["shape"]


def _without_docs(value: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in value.items() if k not in DOC_KEYS}


def trim(model: Mapping[str, Any], operations: Iterable[str]) -> dict[str, Any]:
    """``model`` (a botocore service-2 model) with only ``operations`` and the shapes they reach, undocumented.

    Raises KeyError naming an operation the model does not have."""
    ops: dict[str, Any] = {}
    for name in sorted(operations):
        if name not in model["operations"]:
            raise KeyError(f"{model['metadata'].get('serviceId')} has no operation {name}")
        ops[name] = _without_docs(model["operations"][name])
    wanted: list[str] = []
    for op in ops.values():
        for key in ("input", "output"):
            if key in op:
                wanted.append(op[key]["shape"])
        wanted += [error["shape"] for error in op.get("errors", [])]
    shapes: dict[str, Any] = {}
    while wanted:
        name = wanted.pop()
        if name in shapes:
            continue
        shape = _without_docs(model["shapes"][name])
        if "members" in shape:
            shape["members"] = {k: _without_docs(v) for k, v in shape["members"].items()}
        shapes[name] = shape
        wanted += shape_refs(shape)
    trimmed = {k: v for k, v in model.items() if k not in DOC_KEYS and k not in ("operations", "shapes")}
    trimmed["operations"] = ops
    trimmed["shapes"] = dict(sorted(shapes.items()))
    return trimmed


def model_path(service: str, api_version: str) -> Path:
    return TRIMMED_MODELS_DIR / service / api_version / "service-2.json"


def generate(service: str) -> tuple[Path, str]:
    """(where, text) of the trimmed model of ``service`` from the installed botocore's own data."""
    from botocore.loaders import Loader  # botocore only when generating (as everywhere in the adapters)

    loader = Loader()  # botocore's data only: never a trimmed model or AWS_DATA_PATH
    version = loader.determine_latest_version(service, "service-2")
    model = loader.load_service_model(service, "service-2", version)
    text = json.dumps(trim(model, operations_called(service)), indent=1, sort_keys=False) + "\n"
    return model_path(service, version), text


def main(argv: list[str] | None = None) -> int:
    """Write the trimmed model of every service in TRIMMED_SERVICES; ``--check``: exit 1 where one differs."""
    check = "--check" in (sys.argv[1:] if argv is None else argv)
    stale = []
    for service in sorted(TRIMMED_SERVICES):
        path, text = generate(service)
        if check:
            if not path.is_file() or path.read_text() != text:
                stale.append(str(path))
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path} ({len(text)} bytes)")
    if stale:
        print(f"stale: {', '.join(stale)}: run python -m agent.adapters.trim_models", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
