"""The process's heap: fewer malloc arenas, and startup garbage handed back (glibc only; no-op elsewhere).

glibc gives each thread that allocates its own arena (up to eight per core), and keeps pages freed
during startup (configuration parsing, rule compilation, package metadata) mapped. The agent's
threads mostly wait; two arenas are plenty, and returning the startup pages keeps the resident
size close to what the agent really holds.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

M_ARENA_MAX = -8  # mallopt parameter (malloc.h)
LIBC = "libc.so.6"


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(LIBC)
    except OSError:
        return None


def limit_malloc_arenas(count: int = 2) -> None:
    """Call before threads start. Respects an explicit ``MALLOC_ARENA_MAX`` in the environment."""
    import os

    if "MALLOC_ARENA_MAX" in os.environ:
        return
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    if mallopt(M_ARENA_MAX, count) != 1:
        log.debug("mallopt(M_ARENA_MAX) refused")


def release_free_memory() -> None:
    """Return freed heap pages to the system (``malloc_trim(0)``)."""
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None)
    if trim is None:
        return
    trim.argtypes = [ctypes.c_size_t]
    trim(0)
