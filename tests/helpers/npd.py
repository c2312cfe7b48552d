"""node-problem-detector's kernel-monitor.json rules as the agent loads them (type, condition, reason,
pattern).
"""

from __future__ import annotations

NPD_KERNEL_MONITOR = [
    # (type, condition, reason, pattern) in file order, as published upstream
    ("temporary", None, "OOMKilling", r"Killed process \d+ (.+) total-vm:\d+kB, anon-rss:\d+kB, file-rss:\d+kB.*"),
    ("temporary", None, "TaskHung", r"task [\S ]+:\w+ blocked for more than \w+ seconds\."),
    (
        "temporary",
        None,
        "UnregisterNetDevice",
        r"unregister_netdevice: waiting for \w+ to become free. Usage count = \d+",
    ),
    ("temporary", None, "KernelOops", r"BUG: unable to handle kernel NULL pointer dereference at .*"),
    ("temporary", None, "KernelOops", r"divide error: 0000 \[#\d+\] SMP"),
    ("temporary", None, "Ext4Error", r"EXT4-fs error .*"),
    ("temporary", None, "Ext4Warning", r"EXT4-fs warning .*"),
    ("temporary", None, "IOError", r"Buffer I/O error .*"),
    ("permanent", "XfsShutdown", "XfsHasShutdown", r"XFS .* Shutting down filesystem.?"),
    ("temporary", None, "MemoryReadError", r"CE memory read error .*"),
    ("temporary", None, "CperHardwareErrorCorrected", r".*\[Hardware Error\]: event severity: corrected$"),
    ("temporary", None, "CperHardwareErrorRecoverable", r".*\[Hardware Error\]: event severity: recoverable$"),
    ("permanent", "CperHardwareErrorFatal", "CperHardwareErrorFatal", r".*\[Hardware Error\]: event severity: fatal$"),
    ("permanent", "KernelDeadlock", "DockerHung", r"task docker:\w+ blocked for more than \w+ seconds\."),
]
