"""Prefix stripping: rules must see the bare kernel message whatever log format the line came from."""

from __future__ import annotations

import pytest

from agent.detectors.prefix import strip_prefix

MSG = "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."

STRIPPED = [
    # (id, line, bare message)
    ("kmsg-record-header", f"4,1893,23345873212,-;{MSG}", MSG),
    ("kmsg-record-header-caller", f"6,1894,23345873299,-,caller=T1234;{MSG}", MSG),
    ("kmsg-record-continuation-flag", f"4,1895,23345873300,c;{MSG}", MSG),
    ("dmesg-r-priority", f"<4>{MSG}", MSG),
    ("dmesg-r-priority-and-timestamp", f"<4>[2315424.099010] {MSG}", MSG),
    ("dmesg-timestamp-padded", f"[  123.456789] {MSG}", MSG),
    ("dmesg-timestamp-zero", f"[    0.000000] {MSG}", MSG),
    ("dmesg-timestamp-no-space", f"[2437042.862382]{MSG}", MSG),
    ("dmesg-T", f"[Sun Feb 23 16:24:18 2025] {MSG}", MSG),
    ("dmesg-T-single-digit-day", f"[Sun Jan  5 20:25:34 2025] {MSG}", MSG),
    ("redacted-timestamp", f"[XXXXX] {MSG}", MSG),
    ("dmesg-decode-iso", f"kern  :warn  : 2025-01-21T04:41:44,283302+00:00 {MSG}", MSG),
    ("dmesg-decode-iso-err", f"kern  :err   : 2025-01-21T04:41:44,283302+00:00 {MSG}", MSG),
    ("syslog", f"Nov 22 14:56:44 cctvserver-MS-7B17 kernel: {MSG}", MSG),
    ("syslog-single-digit-day", f"Nov  2 14:56:44 ip-10-0-1-2 kernel: {MSG}", MSG),
    ("syslog-then-dmesg-timestamp", f"Jan 14 22:15:17 node-40 kernel: [2437042.862382] {MSG}", MSG),
    ("syslog-then-redacted-timestamp", f"Jan 14 22:15:17 node-40 kernel: [XXXXX] {MSG}", MSG),
    ("journal-short-iso", f"2025-01-21T04:41:44+0000 ip-10-0-1-2 kernel: {MSG}", MSG),
    ("journal-short-iso-precise", f"2025-01-21T04:41:44.283302+00:00 ip-10-0-1-2 kernel: {MSG}", MSG),
    ("journal-iso-utc", f"2025-01-21T04:41:44Z host kernel: {MSG}", MSG),
    ("bare-kernel-tag", f"kernel: {MSG}", MSG),
    (
        "bare-kernel-tag-then-timestamp",
        "kernel: [726415.491744] neuron:ndma_memcpy_wait_for_completion: DMA timeout",
        "neuron:ndma_memcpy_wait_for_completion: DMA timeout",
    ),
    (
        "neuron-kernel-tag",
        "kernel: NEURON_HW_ERR=DMA_ERROR instance-id=i-0abc nd-id=3",
        "NEURON_HW_ERR=DMA_ERROR instance-id=i-0abc nd-id=3",
    ),
    ("four-layers", f"<4>Nov 22 14:56:44 host kernel: [  123.456789] {MSG}", MSG),
    ("empty-after-prefix", "[  123.456789] ", ""),
]

UNCHANGED = [
    # (id, line): message text that merely looks like a prefix must be kept as it is
    ("nvrm-xid", MSG),
    ("neuron-mla", "[MLA 0][NC 0] DMA TX engine 3 is in an abort state"),
    ("neuron-fatal-rt", "(FATAL-RT-UNDEFINED-STATE) Uncorrectable memory error is detected, nd 0 nc 1"),
    ("neuron-hw-err", "NEURON_HW_ERR=SRAM_UNCORRECTABLE_ERROR instance-id=i-0abc nd-id=0"),
    ("cper", "[Hardware Error]: event severity: fatal"),
    ("mce", "mce: [Hardware Error]: Machine check events logged"),
    ("drm-tag", "[drm] Initialized nvidia-drm 0.0.0 20160202 for 0000:3b:00.0 on minor 1"),
    ("unknown-angle", "<unknown> process exited"),
    ("kernel-panic", "Kernel panic - not syncing: Fatal exception"),
    ("kernel-word-without-colon", "kernel BUG at mm/slub.c:123!"),
    ("kernelcore", "kernelcore=movable is set"),
    ("timestamp-in-middle", "task python3:1234 blocked [  123.456789] for more than 120 seconds."),
    ("bracketed-non-number", "[ cut here ]"),
    ("empty", ""),
]


@pytest.mark.parametrize(("line", "message"), [c[1:] for c in STRIPPED], ids=[c[0] for c in STRIPPED])
def test_strip_prefix(line: str, message: str) -> None:
    assert strip_prefix(line) == message


@pytest.mark.parametrize("line", [c[1] for c in UNCHANGED], ids=[c[0] for c in UNCHANGED])
def test_message_without_prefix_is_unchanged(line: str) -> None:
    assert strip_prefix(line) == line


@pytest.mark.parametrize("line", [c[1] for c in STRIPPED], ids=[c[0] for c in STRIPPED])
def test_strip_prefix_is_idempotent(line: str) -> None:
    once = strip_prefix(line)
    assert strip_prefix(once) == once


# More saved-log formats: dmesg -x (facility/level then a timestamp) and journalctl's
# short-precise and short-monotonic outputs.
MORE_FORMATS = [
    ("dmesg-x-decode-default-time", f"kern  :warn  : [  123.456789] {MSG}"),
    ("dmesg-x-decode-ctime", f"kern  :err   : [Sun Feb 23 16:24:18 2025] {MSG}"),
    ("journalctl-short-precise", f"Nov 22 14:56:44.123456 ip-10-0-1-2 kernel: {MSG}"),
    ("journalctl-short-monotonic", f"[    3.123456] ip-10-0-1-2 kernel: {MSG}"),
]


@pytest.mark.parametrize("line", [c[1] for c in MORE_FORMATS], ids=[c[0] for c in MORE_FORMATS])
def test_strip_prefix_more_formats(line: str) -> None:
    assert strip_prefix(line) == MSG
