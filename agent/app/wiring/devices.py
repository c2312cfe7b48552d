"""The device-holder parts of recovery (``--device-holders``): who holds a failing device, and telling them.

Both parts exist only when the flag is on; their modules are imported only then (and grpc only at the
first lookup: docs/devices.md, "Memory")."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from agent.app.settings import Settings
from agent.core.types import Event

if TYPE_CHECKING:
    from agent.recovery.holderlookup import DraTriples, HolderLookup, MigUuids
    from agent.recovery.holdertell import HolderTeller


def holder_parts(
    settings: Settings,
    put: Callable[[Event], None],
    *,
    dra: DraTriples | None = None,
    mig_uuids: MigUuids | None = None,
    node_name: str | None = None,
    clock: Callable[[], float] = time.time,
) -> tuple[HolderLookup | None, HolderTeller | None]:
    """The lookup on ``--pod-resources-socket`` and the teller putting its Events through ``put`` (the main
    loop's inbox); (None, None) without ``--device-holders``. ``dra`` and ``mig_uuids`` say what else names a
    device (this node's ResourceSlices, the MIG UUIDs on a GPU) where the caller knows it."""
    if not settings.device_holders:
        return None, None
    from agent.recovery.holderlookup import HolderLookup
    from agent.recovery.holdertell import HolderTeller

    lookup = HolderLookup(socket_path=settings.pod_resources_socket, dra=dra, mig_uuids=mig_uuids)
    teller = HolderTeller(put=put, node_name=node_name or settings.node_name or "", clock=clock)
    return lookup, teller
