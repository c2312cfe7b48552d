"""Strip the prefixes that kernel lines carry in saved logs, so rules see the bare message.

Recognised (and combinations such as a syslog header followed by a dmesg timestamp):

- raw ``/dev/kmsg`` record header ``prio,seq,usec,flags;``
- ``dmesg -r`` priority ``<N>``
- ``dmesg`` timestamps ``[  123.456789]``, ``dmesg -T`` ``[Sun Feb 23 16:24:18 2025]``, redacted ``[XXXXX]``
- ``dmesg --decode`` ``kern  :warn  : 2025-01-21T04:41:44,283302+00:00``
- syslog/journal ``Nov 22 14:56:44 host kernel:`` and ISO ``2025-01-21T04:41:44.283+0000 host kernel:``
- a bare ``kernel:`` tag
"""

from __future__ import annotations

import re

_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
_DAY = r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)"
_ISO = r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?"

_PREFIXES = re.compile(
    "|".join(
        [
            r"\d+,\d+,\d+,[^;\s]*;",  # /dev/kmsg record header
            r"<\d{1,3}>",  # dmesg -r
            r"\[\s*\d+\.\d+\]\s?",  # dmesg
            rf"\[{_DAY} {_MONTH} +\d{{1,2}} \d{{2}}:\d{{2}}:\d{{2}} \d{{4}}\]\s?",  # dmesg -T
            r"\[X+\]\s?",  # documentation with a redacted timestamp
            r"[a-z]+ *:[a-z]+ *: ",  # dmesg --decode / -x facility and level (a timestamp may follow)
            rf"{_ISO}\s",  # the ISO timestamp of dmesg --time-format iso
            rf"{_MONTH} +\d{{1,2}} \d{{2}}:\d{{2}}:\d{{2}}(?:\.\d+)? \S+ kernel: ?",  # syslog / journalctl
            rf"{_ISO} \S+ kernel: ?",  # journalctl -o short-iso
            r"[\w.-]+ kernel: ",  # host tag after a journalctl -o short-monotonic timestamp
            r"kernel: ?",
        ]
    )
)


def strip_prefix(line: str) -> str:
    """The kernel message without any leading log-format prefixes (at most four layers)."""
    text = line
    for _ in range(4):
        m = _PREFIXES.match(text)
        if m is None or m.end() == 0:
            break
        text = text[m.end() :]
    return text


# What a saved log keeps of a record's level: the kmsg header's or ``dmesg -r``'s priority (facility * 8 +
# level), or ``dmesg -x``'s names. Other formats (dmesg, syslog, ``journalctl -o short``) keep none.
_LEVELED = re.compile(r"\s*(?:(\d{1,4}),\d+,\d+,[^;\s]*;|<(\d{1,4})>|([a-z]+) *:([a-z]+) *: )")
_LEVELS = {"emerg": 0, "alert": 1, "crit": 2, "err": 3, "warn": 4, "notice": 5, "info": 6, "debug": 7}


def saved_level(line: str) -> int | None:
    """The kernel level (0 emerg ... 7 debug) a saved log line kept, None where it kept none or the record is
    not the kernel's (a facility other than ``kern``)."""
    m = _LEVELED.match(line)
    if m is None:
        return None
    prio = m.group(1) or m.group(2)
    if prio is not None:
        value = int(prio)
        return value if value < 8 else None
    return _LEVELS.get(m.group(4)) if m.group(3) == "kern" else None
