"""printf as the Linux kernel renders it (lib/vsprintf.c), for test lines generated from format strings.

One renderer for every rule family's tests, so each proves its rules against what the kernel
really prints. Where the kernel differs from C libraries, it follows the kernel: ``%#x`` of 0 is
``0x0`` (``number()`` prints the prefix for base 16 whatever the value; glibc prints ``0``).

- flags ``-#0 +``, width (digits or ``*``), precision (digits or ``*``: cuts ``%s``);
- lengths ``hh h l ll L z j t``: ``%u``/``%x``/``%o`` wrap at their width (``l``/``ll``/``L``/``z``/
  ``j``/``t`` 64-bit, ``h`` 16, ``hh`` 8, else 32); ``%d`` prints the value given;
- ``%p`` of an int is 16 hex digits, of None the pre-4.15 ``(null)`` (padded to the width, default
  16); ``%px`` the same; every other ``%p`` extension (``%pS``, ``%pV``, ``%pD``, ``%pg``,
  ``%pGg``, ...) takes the text it prints; ``%*pbl`` takes (bits, text).
"""

from __future__ import annotations

import re
from typing import Any

_CONVERSION = re.compile(
    r"%(?P<flags>[-#0 +]*)(?P<width>\*|\d+)?(?:\.(?P<prec>\*|\d+))?(?P<len>hh|h|ll|l|L|z|j|t)?"
    r"(?:(?P<ptr>p[A-Za-z]*)|(?P<conv>[%cdiouxXs]))"
)
_BITS = {"hh": 8, "h": 16, "l": 64, "ll": 64, "L": 64, "z": 64, "j": 64, "t": 64}


def kprintf(fmt: str, *args: Any) -> str:
    """``fmt`` rendered like the kernel's printf; the record's trailing newline dropped."""
    values = list(args)

    def take() -> Any:
        assert values, f"not enough values for {fmt!r}"
        return values.pop(0)

    def pad(text: str, flags: str, width: int, *, zero_ok: bool, prefix: str = "") -> str:
        if "-" in flags:
            return (prefix + text).ljust(width)
        if "0" in flags and zero_ok:
            return prefix + text.rjust(width - len(prefix), "0")
        return (prefix + text).rjust(width)

    def one(m: re.Match[str]) -> str:
        flags = m["flags"]
        width_text = m["width"]
        width = int(take()) if width_text == "*" else int(width_text or 0)
        prec_text = m["prec"]
        prec = int(take()) if prec_text == "*" else (int(prec_text) if prec_text is not None else None)
        if m["ptr"]:
            value = take()
            ext = m["ptr"][1:]
            if ext.startswith("b"):  # %*pb / %*pbl: the width is the bitmap's size in bits
                return str(value)
            if ext not in ("", "x"):
                return pad(str(value), flags, width, zero_ok=False)
            if value is None:
                return "(null)".rjust(width or 16)
            return format(int(value) % 2**64, "016x") if isinstance(value, int) else str(value)
        conv = m["conv"]
        if conv == "%":
            return "%"
        value = take()
        if conv == "s":
            text = str(value)
            return pad(text[:prec] if prec is not None else text, flags, width, zero_ok=False)
        if conv == "c":
            return pad(str(value), flags, width, zero_ok=False)
        if conv in "di":
            number = int(value)
            sign = "-" if number < 0 else "+" if "+" in flags else " " if " " in flags else ""
            return pad(str(abs(number)), flags, width, zero_ok=True, prefix=sign)
        number = int(value) % 2 ** _BITS.get(m["len"] or "", 32)
        if conv == "u":
            return pad(str(number), flags, width, zero_ok=True)
        if conv == "o":
            text = format(number, "o")
            return pad(text, flags, width, zero_ok=True, prefix="0" if "#" in flags and number else "")
        return pad(format(number, conv), flags, width, zero_ok=True, prefix="0" + conv if "#" in flags else "")

    text = _CONVERSION.sub(one, fmt)
    assert not values, f"values left over for {fmt!r}: {values}"
    return text.removesuffix("\n")
