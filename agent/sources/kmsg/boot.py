"""The host's boot clock and boot id."""

from __future__ import annotations

import time
from pathlib import Path


def boot_time_now() -> float:
    """Wall-clock time of boot, with sub-second precision: ``CLOCK_REALTIME - CLOCK_MONOTONIC``."""
    return time.clock_gettime(time.CLOCK_REALTIME) - time.clock_gettime(time.CLOCK_MONOTONIC)


def read_boot_id(*, proc_root: Path = Path("/proc")) -> str:
    """Return this boot's random id (``<proc_root>/sys/kernel/random/boot_id``).

    Raises ``FileNotFoundError``/``OSError`` naming the file when it cannot be read, and
    ``ValueError`` when it is empty.
    """
    path = proc_root / "sys" / "kernel" / "random" / "boot_id"
    try:
        text = path.read_text(encoding="ascii", errors="replace")
    except FileNotFoundError as exc:
        raise FileNotFoundError(
            f"cannot read the boot id: {path} does not exist (is {proc_root} the host's procfs?)"
        ) from exc
    except OSError as exc:
        raise OSError(f"cannot read the boot id from {path}: {exc}") from exc
    boot_id = text.strip()
    if not boot_id:
        raise ValueError(f"the boot id file {path} is empty")
    return boot_id
