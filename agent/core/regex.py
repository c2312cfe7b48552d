"""Static analysis of rule patterns for the fast matcher, on a Python translation of the Go syntax.

Rule patterns are matched with RE2 (``agent.core.patterns``). The analysis here reads a
pattern's structure with Python's regular-expression parser (``re._parser``), on a translation of
the Go/RE2 constructs Python spells differently (``\\z``, POSIX classes, ``\\Q..\\E``, ``(?<name>``,
``\\x{..}``, ``{,n}``). It is used for analysis only, never for matching: a pattern RE2 accepts but
the translation or Python's parser cannot read is simply "unknown".

The analysis answers two questions the fast matcher needs, conservatively (when unsure it says
"unknown", which only costs speed, never correctness):

- ``required_literals``: strings of which at least one occurs in every line (or window) the
  pattern can match; a line containing none of them cannot match.
- ``can_span_lines``: whether a match may cross a ``\\n`` or depends on text before the newest
  line (start anchors, look-behind), in which case the rule is evaluated on the joined line buffer.
"""

from __future__ import annotations

import functools
import math
import re
import warnings
from re import _constants as sre  # type: ignore[attr-defined]  # the parser's opcode constants (stable since 3.11)
from re import _parser as sre_parse  # type: ignore[attr-defined]  # no stubs for the private parser
from typing import Any

_POSIX_CLASSES = {
    "alnum": "0-9A-Za-z",
    "alpha": "A-Za-z",
    "ascii": "\\x00-\\x7F",
    "blank": "\\t ",
    "cntrl": "\\x00-\\x1F\\x7F",
    "digit": "0-9",
    "graph": "!-~",
    "lower": "a-z",
    "print": " -~",
    "punct": "!-/:-@\\[-`{-~",
    "space": "\\t\\n\\v\\f\\r ",
    "upper": "A-Z",
    "word": "0-9A-Za-z_",
    "xdigit": "0-9A-Fa-f",
}
_POSIX_RE = re.compile(r"\[:(\^?)([a-z]+):\]")
_QUOTE_RE = re.compile(r"\\Q(.*?)(?:\\E|$)", re.S)


# Estimated share of each character in kernel log text (English-like lowercase prose, hex,
# digits; uppercase and most punctuation are rare). Used to pick where needles start.
_LOWER = dict(
    zip(
        "etaoinsrdhlcumfpgwybvkxjqz",
        (70, 50, 45, 42, 42, 40, 36, 36, 26, 22, 22, 22, 16, 16, 13, 12, 11, 8, 7, 7, 6, 4, 5, 0.5, 0.5, 0.5),
        strict=True,
    )
)
_PUNCT = {
    " ": 150,
    ":": 15,
    ".": 10,
    ",": 6,
    "-": 6,
    "_": 5,
    "=": 6,
    "/": 4,
    "(": 4,
    ")": 4,
    "[": 2,
    "]": 2,
    '"': 3,
    "'": 0.8,
    "#": 0.5,
    "!": 0.3,
    ";": 0.3,
    "<": 0.5,
    ">": 0.5,
    "@": 0.3,
    "+": 0.5,
    "*": 0.3,
}


def char_frequency(ch: str) -> float:
    """Estimated per-mille frequency of ``ch`` in kernel log text."""
    if ch in _LOWER:
        return _LOWER[ch]
    if ch.isdigit():
        return 30 if ch == "0" else 12
    if ch in _PUNCT:
        return _PUNCT[ch]
    if ch.isupper():
        return 5 if ch in "EINRSTACDOP" else (0.8 if ch in "QXZJKVWY" else 2)
    return 0.2


def information(text: str) -> float:
    """How selective a literal is: bits of surprise under ``char_frequency`` (higher = rarer)."""
    return sum(math.log2(1000.0 / char_frequency(c)) for c in text)


class PatternError(ValueError):
    """A pattern that cannot be used; the message says why."""


def translate_go(pattern: str) -> str:
    """The Python ``re`` spelling of a Go/RE2 pattern, for analysis; PatternError where there is none.

    Translated: ``\\Q..\\E`` quoting, POSIX classes, Go's ``\\s`` (no ``\\v``), ``\\z``, named groups
    written ``(?<name>..)``, ``\\x{hex}`` escapes, and ``{,n}`` (a literal in Go, a repetition in Python).
    Unicode classes (``\\pL``) and negated POSIX classes have no Python spelling.
    """
    out = _QUOTE_RE.sub(lambda m: re.escape(m.group(1)), pattern)

    def posix(m: re.Match[str]) -> str:
        negate, name = m.group(1), m.group(2)
        if name not in _POSIX_CLASSES:
            raise PatternError(f"unknown POSIX class [:{name}:]")
        if negate:
            raise PatternError(f"negated POSIX class [:^{name}:] is not supported; use [^...]")
        return _POSIX_CLASSES[name]

    out = _POSIX_RE.sub(posix, out)
    out = _go_whitespace(out)
    # \z (end of text) is \Z in Python; \Z does not exist in Go, so the rewrite is unambiguous.
    out = re.sub(r"(?<!\\)((?:\\\\)*)\\z", r"\1\\Z", out)
    out = re.sub(r"(?<!\\)((?:\\\\)*)\(\?<(?=[^=!])", r"\1(?P<", out)
    out = re.sub(r"(?<!\\)((?:\\\\)*)\{,", r"\1\\{,", out)
    out = re.sub(
        r"(?<!\\)((?:\\\\)*)\\x\{([0-9A-Fa-f]{1,8})\}", lambda m: f"{m.group(1)}\\U{int(m.group(2), 16):08x}", out
    )
    if re.search(r"(?<!\\)((?:\\\\)*)\\[pP]", out):
        raise PatternError("Unicode classes (\\p{..}) are not supported by Python's re module")
    return out


_GO_SPACE = "\\t\\n\\f\\r "


def _go_whitespace(pattern: str) -> str:
    """Go's ``\\s`` is ``[\\t\\n\\f\\r ]``; Python's also matches ``\\v``. Rewrite ``\\s``/``\\S``."""
    out: list[str] = []
    in_class = False
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            if nxt == "s":
                out.append(_GO_SPACE if in_class else f"[{_GO_SPACE}]")
            elif nxt == "S" and not in_class:
                out.append(f"[^{_GO_SPACE}]")
            else:
                out.append(pattern[i : i + 2])
            i += 2
            continue
        if ch == "[" and not in_class:
            in_class = True
            out.append(ch)
            # a ']' right after '[' or '[^' is a literal member
            j = i + 1
            if pattern[j : j + 1] == "^":
                out.append("^")
                j += 1
            if pattern[j : j + 1] == "]":
                out.append("]")
                j += 1
            i = j
            continue
        if ch == "]" and in_class:
            in_class = False
        out.append(ch)
        i += 1
    return "".join(out)


@functools.lru_cache(maxsize=4)
def _parse(pattern: str) -> sre_parse.SubPattern | None:
    """Python's parse of the translated pattern; None when there is none (the analysis says "unknown").

    A rule is analysed three ways, one after the other (required literals, required runs, whether it spans
    lines): the last few trees are kept for that (callers only read them), and each analysis keeps its own
    small result per pattern. A generated print-site rule's pattern is long enough that Python's parser
    took most of the time of loading the built-in packs; its tree is large, so not every tree is kept (the
    agent's memory)."""
    try:
        translated = translate_go(pattern)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "possible nested set" and the like: Go reads them plainly
            return sre_parse.parse(translated)
    except (re.error, PatternError, RecursionError, OverflowError, ValueError):
        return None


def _literal_runs(items: list[Any]) -> tuple[list[str], list[list[str]]]:
    """Required literal runs in a sequence, and required alternative sets (from branches).

    Returns (runs, alternatives): every run in ``runs`` occurs in any match; for every list in
    ``alternatives`` at least one of its strings occurs in any match.
    """
    runs: list[str] = []
    alternatives: list[list[str]] = []
    current: list[str] = []

    def flush() -> None:
        if current:
            runs.append("".join(current))
            current.clear()

    for op, arg in items:
        if op is sre.LITERAL and arg != 10:
            current.append(chr(arg))
            continue
        flush()
        if op is sre.SUBPATTERN:
            _group, add_flags, _del_flags, sub = arg
            if add_flags & (sre.SRE_FLAG_IGNORECASE):
                continue
            sub_runs, sub_alts = _literal_runs(list(sub))
            runs.extend(sub_runs)
            alternatives.extend(sub_alts)
        elif op in (sre.MAX_REPEAT, sre.MIN_REPEAT, getattr(sre, "POSSESSIVE_REPEAT", None)):
            low, _high, sub = arg
            if low >= 1:
                sub_runs, sub_alts = _literal_runs(list(sub))
                runs.extend(sub_runs)
                alternatives.extend(sub_alts)
        elif op is sre.BRANCH:
            options: list[str] = []
            for branch in arg[1]:
                best = _best_literal(list(branch))
                if best is None:
                    options = []
                    break
                options.extend(best)
            if options:
                alternatives.append(options)
        elif op is getattr(sre, "ATOMIC_GROUP", None):
            sub_runs, sub_alts = _literal_runs(list(arg))
            runs.extend(sub_runs)
            alternatives.extend(sub_alts)
    flush()
    return runs, alternatives


def _best_literal(items: list[Any]) -> list[str] | None:
    runs, alternatives = _literal_runs(items)
    candidates: list[list[str]] = [[r] for r in runs if len(r) >= MIN_LITERAL] + [
        a for a in alternatives if all(len(o) >= MIN_LITERAL for o in a)
    ]
    if not candidates:
        return None
    # Prefer the option whose weakest member is most selective: it contains a rare character
    # (device and driver names made of common letters recur in benign lines), then is long.
    return max(candidates, key=lambda opts: (min(_selectivity(o) for o in opts), -len(opts)))


# Subsystem tags that start most benign kernel lines on accelerator nodes: a literal made of
# them finds many lines that cannot match, so they count for nothing when choosing literals.
COMMON_TAGS = (
    "NVRM: GPU ",
    "NVRM: ",
    "NVRM",  # the colon-less form of the 515-525 drivers ("NVRM <function>: ")
    "nvidia-nvswitch",
    "nvidia",
    "EXT4-fs (",
    "XFS (",
    "mlx5_core ",
    "infiniband ",
    "nvme nvme",
    "efa ",
    "ena ",
    "pcieport ",
    "IPv6: ",
    "audit: ",
    "systemd",
    "neuron:",
    "device ",
    "pci ",
    "kernel: ",
    " callbacks suppressed",  # every rate-limited print (net_ratelimit, kauditd_printk_skb) ends so
)
MIN_LITERAL = 4


def _selectivity(text: str) -> float:
    for tag in COMMON_TAGS:
        text = text.replace(tag, "")
    return information(text) if len(text) >= MIN_LITERAL else 0.0


@functools.lru_cache(maxsize=1024)
def required_runs(pattern: str) -> tuple[str, ...]:
    """Literal runs that all occur in every match (outside groups that may be skipped)."""
    parsed = _parse(pattern)
    if parsed is None or parsed.state.flags & sre.SRE_FLAG_IGNORECASE:
        return ()
    runs, _alternatives = _literal_runs(list(parsed))
    return tuple(dict.fromkeys(r for r in runs if len(r) >= 2))


@functools.lru_cache(maxsize=1024)
def required_literals(pattern: str) -> tuple[str, ...] | None:
    """Strings of which at least one occurs in every match of ``pattern``; None if unknown."""
    parsed = _parse(pattern)
    if parsed is None or parsed.state.flags & sre.SRE_FLAG_IGNORECASE:
        return None
    best = _best_literal(list(parsed))
    if best is None:
        return None
    return tuple(dict.fromkeys(best))


def _may_match_newline(items: list[Any], dotall: bool) -> bool:
    for op, arg in items:
        if op is sre.LITERAL:
            if arg == 10:
                return True
        elif op is sre.NOT_LITERAL:
            if arg != 10:
                return True
        elif op is sre.ANY:
            if dotall:
                return True
        elif op is sre.IN:
            if _class_may_match_newline(arg):
                return True
        elif op is sre.SUBPATTERN:
            _g, add_flags, del_flags, sub = arg
            sub_dotall = (dotall or bool(add_flags & sre.SRE_FLAG_DOTALL)) and not (del_flags & sre.SRE_FLAG_DOTALL)
            if add_flags & sre.SRE_FLAG_MULTILINE or _may_match_newline(list(sub), sub_dotall):
                return True
        elif op in (sre.MAX_REPEAT, sre.MIN_REPEAT, getattr(sre, "POSSESSIVE_REPEAT", None)):
            if _may_match_newline(list(arg[2]), dotall):
                return True
        elif op is sre.BRANCH:
            if any(_may_match_newline(list(b), dotall) for b in arg[1]):
                return True
        elif op is sre.AT:
            if arg in (sre.AT_BEGINNING, sre.AT_BEGINNING_STRING, sre.AT_BEGINNING_LINE, sre.AT_NON_BOUNDARY):
                # start anchors see the buffer's start; \B at a line start depends on the line before
                return True
        elif op in (sre.ASSERT, sre.ASSERT_NOT):
            direction, sub = arg
            if direction < 0 or _may_match_newline(list(sub), dotall):
                return True  # look-behind can see the previous line
        elif op is getattr(sre, "ATOMIC_GROUP", None):
            if _may_match_newline(list(arg), dotall):
                return True
        elif op in (sre.GROUPREF, sre.GROUPREF_EXISTS) or op is sre.CATEGORY:
            return True
    return False


_NEWLINE_CATEGORIES = frozenset(
    {
        sre.CATEGORY_SPACE,
        sre.CATEGORY_NOT_DIGIT,
        sre.CATEGORY_NOT_WORD,
        sre.CATEGORY_LINEBREAK,
        sre.CATEGORY_UNI_SPACE,
        sre.CATEGORY_UNI_NOT_DIGIT,
        sre.CATEGORY_UNI_NOT_WORD,
        sre.CATEGORY_UNI_LINEBREAK,
    }
)


def _class_may_match_newline(items: list[Any]) -> bool:
    """Whether a character class ``[...]`` can match ``\\n``."""
    negated = any(op is sre.NEGATE for op, _ in items)
    matches = any(
        (op is sre.LITERAL and arg == 10)
        or (op is sre.RANGE and arg[0] <= 10 <= arg[1])
        or (op is sre.CATEGORY and arg in _NEWLINE_CATEGORIES)
        for op, arg in items
    )
    return matches != negated


@functools.lru_cache(maxsize=1024)
def can_span_lines(pattern: str) -> bool:
    """True when a match may include a newline or depend on text before the newest line."""
    parsed = _parse(pattern)
    if parsed is None:
        return True
    flags = parsed.state.flags
    return _may_match_newline(list(parsed), bool(flags & sre.SRE_FLAG_DOTALL)) or bool(flags & sre.SRE_FLAG_MULTILINE)


def npd_differences(pattern: str) -> list[str]:
    """Where node-problem-detector would match ``pattern`` differently from us (for user files).

    NPD releases before kubernetes/node-problem-detector#1338 (August 2026) append ``\\z`` to the
    pattern as text, so in a top-level ``a|b`` only the last branch is anchored at the end and the
    others match anywhere in its 10-line buffer (firing again on later lines); and its buffer starts
    as empty slots, so a pattern anchored at the start never matches before the buffer has filled.
    We anchor every branch and match ``^`` from the first line.
    """
    found = []
    if _has_top_level_bar(pattern):
        found.append(
            "top-level alternation: node-problem-detector releases before PR #1338 (August 2026) anchor only "
            "the last branch at the end of the line (they append \\z as text), so they fire the other branches "
            "again on later lines; node-health-agent anchors every branch. Group it, e.g. '(?:a|b)', to mean "
            "the same in every version"
        )
    items = _parse(pattern)
    top = list(items) if items is not None else []
    if top and top[0][0] is sre.AT and top[0][1] in (sre.AT_BEGINNING, sre.AT_BEGINNING_STRING):
        found.append(
            "anchored at the start: node-problem-detector never matches it before its line buffer has "
            "filled (the buffer starts as empty lines); node-health-agent matches it from the first line"
        )
    return found


def _has_top_level_bar(pattern: str) -> bool:
    """Whether ``|`` occurs outside every group and character class (read as text, as NPD's ``+ "\\z"`` is)."""
    depth = 0
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "\\":
            if pattern.startswith("\\Q", i):  # quoted text up to \E
                end = pattern.find("\\E", i + 2)
                i = n if end < 0 else end + 2
                continue
            i += 2
            continue
        if ch == "[":
            i += 1
            if i < n and pattern[i] == "^":
                i += 1
            if i < n and pattern[i] == "]":
                i += 1  # a leading ] is a literal
            while i < n and pattern[i] != "]":
                if pattern.startswith("[:", i):
                    end = pattern.find(":]", i + 2)
                    i = n if end < 0 else end + 2
                    continue
                i += 2 if pattern[i] == "\\" else 1
            i += 1
            continue
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        elif ch == "|" and depth == 0:
            return True
        i += 1
    return False
