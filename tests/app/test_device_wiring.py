"""``holder_parts``: the device-holder lookup and teller exist only with ``--device-holders``."""

from __future__ import annotations

import dataclasses

from agent.app.cli import build_parser
from agent.app.settings import build_settings
from agent.app.wiring.devices import holder_parts
from agent.core.types import Event
from agent.recovery.holderlookup import HolderLookup
from agent.recovery.holdertell import HolderTeller


def settings(*argv: str):  # type: ignore[no-untyped-def]
    return build_settings(build_parser().parse_args(["run", *argv]))


def test_off_by_default_nothing_is_made():
    assert holder_parts(settings(), lambda e: None) == (None, None)


def test_on_the_lookup_reads_the_socket_given_and_the_teller_puts_through_put():
    put: list[Event] = []
    base = settings("--device-holders", "true", "--pod-resources-socket", "/host/kubelet.sock")
    lookup, teller = holder_parts(dataclasses.replace(base, node_name="node-a"), put.append)
    assert isinstance(lookup, HolderLookup) and lookup.socket_path == "/host/kubelet.sock"
    assert isinstance(teller, HolderTeller)
