"""Text from the cluster made safe to print on a terminal.

Node names, condition reasons, pause fields, Lease contents: anyone who can write a Node's status or
a Lease chooses them. ``printable`` escapes every character that is not printable (ESC and the other
controls, line breaks, bidi overrides and other format characters) as ``\\xNN`` / ``\\uNNNN``, so a
crafted value can neither move the cursor nor hide or reorder what ``status`` prints. JSON output
(``json.dumps``) escapes them already.
"""

from __future__ import annotations


def printable(value: object) -> str:
    """``value`` as text with every non-printable character escaped."""
    text = value if isinstance(value, str) else str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def _escape(c: str) -> str:
    code = ord(c)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
