"""The ``node-health-agent`` executable (and ``python -m agent``): ``kmsg-relay`` before anything else.

The relay is the DaemonSet's privileged container and must stay small (issue 37: RSS <= 15 MiB), so
``node-health-agent kmsg-relay ...`` goes straight to :func:`agent.sources.relay_server.main`, which
imports the standard library and the relay's own modules only; every other command goes to
:func:`agent.app.cli.entry`, imported only then. Nothing here is imported by the rest of the agent.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys


def entry() -> None:
    """Run the command in ``sys.argv``; the relay exits like the others (flush, then ``os._exit``)."""
    from agent.sources import relay_server

    if not relay_server.is_relay_command(sys.argv[1:]):
        from agent.app.cli import entry as cli_entry

        cli_entry()
        return
    code = relay_server.main(sys.argv[1:])
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    logging.shutdown()
    os._exit(code)
