"""The test renderer follows the kernel's vsprintf (lib/vsprintf.c), not a C library."""

from __future__ import annotations

import pytest

from helpers.kprintf import kprintf


@pytest.mark.parametrize(
    ("fmt", "args", "expected"),
    [
        ("%u %d %x", (-1, -2147483648, 255), "4294967295 -2147483648 ff"),
        ("%#x %#x %#06x %#06x", (0, 0x770, 0, 9), "0x0 0x770 0x0000 0x0009"),  # the kernel: 0x0, not 0
        ("%llx %Lx %lu %hu %hhx", (-1, 5, -1, -1, 257), "ffffffffffffffff 5 18446744073709551615 65535 1"),
        ("%016Lx %04x:%02x:%02x.%d", (0xB2, 0x10000, 0x3B, 0, 7), "00000000000000b2 10000:3b:00.7"),
        ("%-22s|%2d|%5s|%-4d|", ("RxErr", 3, "", -1), "RxErr                 | 3|     |-1  |"),
        ("%.*s|%*d|%.3s", (2, "abcdef", 4, 7, "xyzw"), "ab|   7|xyz"),
        ("%o %#o %#o %+d % d", (8, 8, 0, 5, 5), "10 010 0 +5  5"),
        ("%pS %pV (%pg) %*pbl", ("fn+0x1/0x2", "msg", "sda1", 8, "0-3"), "fn+0x1/0x2 msg (sda1) 0-3"),
        ("%px %p %p", (255, None, -1), "00000000000000ff           (null) ffffffffffffffff"),
        ("100%% done\n", (), "100% done"),
    ],
)
def test_kprintf_follows_the_kernel(fmt, args, expected):
    assert kprintf(fmt, *args) == expected


def test_kprintf_refuses_a_wrong_argument_count():
    with pytest.raises(AssertionError):
        kprintf("%d %d", 1)
    with pytest.raises(AssertionError):
        kprintf("%d", 1, 2)
