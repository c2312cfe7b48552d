#!/usr/bin/env python3
"""Is the node's clock synchronised? node-problem-detector's plugin protocol: exit 0 yes, 1 no, 2 cannot tell.

The kernel keeps one clock for the whole node, and adjtimex(2) with no modes set only reads its state, so
an unprivileged container sees what chrony or ntpd on the host achieved: the call returns TIME_ERROR (5)
and the status has STA_UNSYNC (0x40) while the clock is not synchronised. The image has Python, so a
plugin may be written in it; any language works (a shell script with a #! line, a static binary).
"""

import ctypes
import ctypes.util
import sys

TIME_ERROR = 5
STA_UNSYNC = 0x0040
STATUS_OFFSET = 40  # struct timex: unsigned modes (padded to 8), then long offset, freq, maxerror, esterror, int status
MAXERROR_OFFSET = 24


def main() -> int:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    buf = ctypes.create_string_buffer(512)  # larger than struct timex on every architecture; modes = 0: read only
    state = libc.adjtimex(buf)
    if state < 0:
        print(f"adjtimex failed: errno {ctypes.get_errno()}")
        return 2
    status = ctypes.c_int.from_buffer(buf, STATUS_OFFSET).value
    maxerror_us = ctypes.c_long.from_buffer(buf, MAXERROR_OFFSET).value
    if state == TIME_ERROR or status & STA_UNSYNC:
        print(f"the kernel clock is not synchronised (adjtimex state {state}, maximum error {maxerror_us} us)")
        return 1
    print(f"the kernel clock is synchronised (maximum error {maxerror_us} us)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
