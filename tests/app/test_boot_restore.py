"""A new boot does not bring back the last boot's kernel-log problems (``--boot-id-file``).

The kernel log that raised them is gone with the reboot, and this boot's log rebuilds those still there;
restored from the state directory, a rebooted node would stay broken forever (and recovery's ladder
could never see a reboot help). A restart on the same boot keeps them, as before."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import free_port, http_get, wait_for

pytestmark = pytest.mark.slow  # starts agent processes

XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


def usec() -> int:
    return int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1e6)


def gpu_xid(tmp: Path, *, boot: str, lines: list[str]) -> dict:
    """Run the standalone agent on a fresh kernel log of ``lines`` at boot id ``boot``; GpuXid as it serves it."""
    (tmp / "boot_id").write_text(boot + "\n")
    (tmp / "kmsg").write_text("".join(f"3,{i + 1},{usec()},-;{line}\n" for i, line in enumerate(lines)))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent", "run", "--standalone", "--pack", "kernel,nvidia", "--serve-conditions", "true"]
        + ["--kmsg-path", str(tmp / "kmsg"), "--state-dir", str(tmp / "state"), "--listen", f"127.0.0.1:{port}"]
        + ["--boot-id-file", str(tmp / "boot_id")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def read() -> dict | None:
            status, body = http_get(f"http://127.0.0.1:{port}/conditions")
            if status != 200:
                return None
            found = [c for c in json.loads(body)["conditions"] if c["type"] == "GpuXid"]
            return found[0] if found else None

        condition = wait_for(read, timeout=60)
        if XID79 in lines:
            condition = wait_for(lambda: (c := read()) and c["status"] == "True" and c, timeout=60)
        time.sleep(1.5)  # the cursor and conditions are saved
        return read() or condition
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err


def test_a_new_boot_forgets_the_last_boots_kernel_log_problems_a_restart_does_not(tmp_path):
    assert gpu_xid(tmp_path, boot="boot-1", lines=["boot", XID79])["status"] == "True"
    assert gpu_xid(tmp_path, boot="boot-1", lines=["boot"])["status"] == "True", "same boot: kept"
    healed = gpu_xid(tmp_path, boot="boot-2", lines=["boot"])
    assert healed["status"] == "False" and healed["reason"] == "GpuXidGood"
