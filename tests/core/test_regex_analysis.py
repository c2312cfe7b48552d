"""Regex helpers: NPD end-anchoring with RE2 (Go syntax), the Go → Python translation used for
analysis, and the static analysis the fast matcher relies on (required literals, whether a match can
span lines). The analysis may say "unknown", but it must never claim something a matching string
contradicts."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.core.patterns import _public_spans_function, compile_anchored
from agent.core.regex import (
    PatternError,
    can_span_lines,
    required_literals,
    required_runs,
    translate_go,
)

# --------------------------------------------------------------------------------------------
# translate_go

TRANSLATE = [
    # (id, Go pattern, Python pattern)
    ("plain", r"Xid \(PCI:[0-9a-f:.]+\): \d+", r"Xid \(PCI:[0-9a-f:.]+\): \d+"),
    ("go-whitespace", r"a\sb\S[\s,]", r"a[\t\n\f\r ]b[^\t\n\f\r ][\t\n\f\r ,]"),
    ("end-of-text", r"fatal\z", r"fatal\Z"),
    ("escaped-backslash-then-z", r"C:\\z", r"C:\\z"),
    ("escaped-backslash-then-end-of-text", r"C:\\\z", r"C:\\\Z"),
    ("posix-alpha", r"[[:alpha:]]+", r"[A-Za-z]+"),
    ("posix-digit-in-set", r"[x[:digit:]]", r"[x0-9]"),
    ("posix-negated-set", r"[^[:space:]]+", "[^\\t\\n\\v\\f\\r ]+"),
    ("posix-xdigit", r"0x[[:xdigit:]]+", r"0x[0-9A-Fa-f]+"),
    ("posix-word", r"[[:word:]]+", r"[0-9A-Za-z_]+"),
    ("quote", r"\Q1.5*x\E", r"1\.5\*x"),
    ("quote-between", r"a\Q(b)\Ec", r"a\(b\)c"),
    ("quote-unterminated", r"a\Q.b", r"a\.b"),
    ("escaped-p-is-literal", r"\\p", r"\\p"),
    ("go-named-group", r"(?<xid>\d+)", r"(?P<xid>\d+)"),
    ("lookbehind-is-not-a-group", r"(?<=a)(?<!b)", r"(?<=a)(?<!b)"),
    ("go-brace-comma-is-literal", r"a{,3}", r"a\{,3}"),
    ("go-hex-escape", r"\x{41}\x{1F600}", r"\U00000041\U0001f600"),
]

TRANSLATE_ERRORS = [
    # (id, Go pattern, text of the error)
    ("unicode-class", r"\p{Greek}", "Unicode classes"),
    ("unicode-class-short", r"\pL+", "Unicode classes"),
    ("negated-unicode-class", r"\PL", "Unicode classes"),
    ("unknown-posix", r"[[:foo:]]", "unknown POSIX class"),
    ("negated-posix", r"[[:^alpha:]]", "negated POSIX class"),
]


@pytest.mark.parametrize(("go", "python"), [c[1:] for c in TRANSLATE], ids=[c[0] for c in TRANSLATE])
def test_translate_go(go: str, python: str) -> None:
    assert translate_go(go) == python


@pytest.mark.parametrize(("go", "error"), [c[1:] for c in TRANSLATE_ERRORS], ids=[c[0] for c in TRANSLATE_ERRORS])
def test_translate_go_rejects(go: str, error: str) -> None:
    with pytest.raises(PatternError, match=error):
        translate_go(go)


# --------------------------------------------------------------------------------------------
# compile_anchored: NPD compiles every pattern as `expr + "\z"` and searches (no start anchor)

ANCHORED = [
    # (id, pattern, text, matches)
    ("suffix-match", "Buffer I/O error", "blk_update_request: Buffer I/O error", True),
    ("must-reach-the-end", "Buffer I/O error", "Buffer I/O error on dev sda", False),
    ("trailing-dot-star", "Buffer I/O error .*", "Buffer I/O error on dev sda", True),
    ("alternation-is-grouped", "foo|bar", "foox", False),
    ("alternation-second-branch", "foo|bar", "xbar", True),
    ("dollar", "fatal$", "event severity: fatal", True),
    ("go-end-of-text", r"fatal\z", "event severity: fatal", True),
    ("caret-is-start-of-text", "^foo", "foo", True),
    ("caret-not-mid-text", "^foo", "xfoo", False),
    ("dot-does-not-cross-lines", "a.*b", "a\nb", False),
    ("explicit-newline", r"a\nb", "x a\nb", True),
    ("posix-class", "[[:digit:]]+ UE", "EDAC MC0: 1 UE", True),
    ("quote", r"\Q[#1]\E SMP", "divide error: 0000 [#1] SMP", True),
]


@pytest.mark.parametrize(("pattern", "text", "matches"), [c[1:] for c in ANCHORED], ids=[c[0] for c in ANCHORED])
def test_compile_anchored(pattern: str, text: str, matches: bool) -> None:
    assert (compile_anchored(pattern).search(text) is not None) is matches


GO_SYNTAX = [
    # (id, pattern, text, matches): RE2 reads Go syntax natively; no translation is involved
    ("unicode-class", r"\p{Greek}+ error", "\u03b1\u03b2 error", True),
    ("unicode-letter", r"\pL+ error", "\u00e9t\u00e9 error", True),
    ("negated-posix", r"[[:^digit:]]+$", "abc", True),
    ("go-named-group", r"Xid (?<xid>\d+)", "Xid 79", True),
    ("brace-comma-is-literal", r"a{,3}", "a{,3}", True),
    ("brace-comma-is-not-a-repeat", r"xa{,3}", "xaa", False),
    ("hex-escape", r"\x{41}BC", "ABC", True),
    ("ungreedy-flag", r"(?U)a+b", "aaab", True),
    ("case-insensitive-mid-pattern", r"gpu (?i)fallen", "gpu FALLEN", True),
    ("dollar-is-end-of-text", "fatal$", "fatal\n", False),
    ("unterminated-quote", r"a\Q(b", "xa(b", True),
    ("unbalanced-wrapping-cannot-escape", r"\Q)|(\E", "a)|(", True),
]


@pytest.mark.parametrize(("pattern", "text", "matches"), [c[1:] for c in GO_SYNTAX], ids=[c[0] for c in GO_SYNTAX])
def test_compile_anchored_reads_go_syntax(pattern: str, text: str, matches: bool) -> None:
    assert (compile_anchored(pattern).search(text) is not None) is matches


REJECTED = [
    # (id, pattern, part of the message)
    ("unbalanced", "a(b", "invalid regular expression: missing )"),
    ("unbalanced-close", "a)|(b", "invalid regular expression"),
    ("bad-range", "[z-a]", "invalid regular expression"),
    ("bad-repeat", "a{3,1}", "invalid regular expression"),
    ("repeat-over-1000", "a{1001}", "invalid regular expression"),
    ("duplicate-group", "(?P<x>a)(?P<x>b)", "duplicate group name 'x'"),
    ("lookahead", "CE (?!memory read error).*", "look-around assertions are not supported"),
    ("positive-lookahead", "a(?=b)", "look-around assertions are not supported"),
    ("lookbehind", "(?<=x)a", "look-around assertions are not supported"),
    ("negative-lookbehind", "(?<!x)a", "look-around assertions are not supported"),
    ("backreference", r"(a)\1", "backreferences are not supported"),
    ("named-backreference", "(?P<n>a)(?P=n)", "backreferences are not supported"),
    ("possessive", "a*+b", "possessive quantifiers are not supported"),
    ("python-end-of-text", r"fatal\Z", "invalid escape sequence"),
    ("python-comment", "a(?#note)", "invalid regular expression"),
    ("any-byte", r"a\Cb", "\\C (any byte) is not supported"),
    ("program-too-large", "[a-z]{1000}" * 3, "pattern is too large"),
    ("unicode-class-too-large", r"\pL{1000}", "pattern is too large"),
]


@pytest.mark.parametrize(("pattern", "message"), [c[1:] for c in REJECTED], ids=[c[0] for c in REJECTED])
def test_compile_anchored_rejects(pattern: str, message: str) -> None:
    with pytest.raises(PatternError) as excinfo:
        compile_anchored(pattern)
    assert message in str(excinfo.value)
    assert "b'" not in str(excinfo.value), "RE2's bytes messages are decoded"


def test_rejection_says_npd_would_reject_it_too() -> None:
    with pytest.raises(PatternError, match="RE2/Go syntax .node-problem-detector would reject this pattern too."):
        compile_anchored("(?<=x)a")


def test_named_groups_give_fields() -> None:
    regex = compile_anchored(r"Xid \(PCI:(?P<pci>[0-9a-f:]+)\): (?P<xid>\d+)(?:, (?P<detail>.*))?")
    match = regex.search("NVRM: Xid (PCI:0000:3b:00): 79")
    assert match is not None
    assert match.groupdict() == {"pci": "0000:3b:00", "xid": "79", "detail": None}
    assert (match.start(), match.group()) == (6, "Xid (PCI:0000:3b:00): 79")


def test_match_offsets_are_characters_not_bytes() -> None:
    match = compile_anchored("(?P<w>\u00e9t\u00e9) error").search("\u00e0 \u00e9t\u00e9 error")
    assert match is not None
    assert (match.start(), match.groupdict()) == (2, {"w": "\u00e9t\u00e9"})


@pytest.mark.parametrize(
    ("pattern", "text"),
    [(r"Xid (?P<xid>\d+)(?:, (?P<detail>.*))?", "NVRM: Xid 79"), ("b+", "abbb"), ("b+", "abba"), ("x", "")],
)
def test_public_re2_api_gives_the_same_spans(pattern: str, text: str) -> None:
    """RE2's C++ Match is called directly where the binding exposes it; the public API is the fallback."""
    regex = compile_anchored(pattern)
    data = text.encode()
    direct = regex.program.spans(data)
    assert (None if direct is None else list(direct)) == _public_spans_function(regex.compiled)(data)


def test_lone_surrogate_does_not_break_matching() -> None:
    regex = compile_anchored("error .*")
    assert regex.search("x\ud800 error here") is not None


LEADING_FLAGS = [
    # (pattern, text, matches): Go accepts flag groups at the start; they apply to the whole pattern
    ("(?i)gpu has fallen off the bus", "NVRM: GPU has fallen off the bus", True),
    ("(?i)foo|bar", "BARx", False),
    ("(?s)start.*end", "start\nmiddle\nend", True),
    ("(?m)^end$", "start\nend", True),
    ("(?is)START.END", "start\nend", True),
]


@pytest.mark.parametrize(("pattern", "text", "matches"), LEADING_FLAGS, ids=[p for p, _, _ in LEADING_FLAGS])
def test_compile_anchored_accepts_leading_flags(pattern: str, text: str, matches: bool) -> None:
    assert (compile_anchored(pattern).search(text) is not None) is matches


@pytest.mark.parametrize(
    ("pattern", "text"),
    [(r"Xid \d+", "Xid \u0663"), (r"\w+ error", "\u00e9t\u00e9 error"), (r"a\sb", "a\u00a0b")],
    ids=["arabic-indic-digit", "accented-word", "nbsp"],
)
def test_compile_anchored_character_classes_are_ascii_like_go(pattern: str, text: str) -> None:
    assert compile_anchored(pattern).search(text) is None


def test_compile_anchored_whitespace_class_is_gos() -> None:
    assert compile_anchored(r"a\sb").search("a\vb") is None


# --------------------------------------------------------------------------------------------
# can_span_lines: whether a rule must be evaluated on the joined buffer instead of the newest line

SPAN = [
    # (pattern, can span lines)
    ("abc", False),
    ("a.*b", False),
    (r"\d+ \w+ \S+", False),
    ("[^\\n]*x", False),
    (r"[^\n\S]", False),
    (r"[\S ]+", False),
    (r"[^\D]+", False),
    ("(?:foo|bar)+", False),
    ("(?=abc)a", False),
    (r"a\nb", True),
    ("a\nb", True),
    ("[^x]", True),
    (r"[^\d]", True),
    (r"[^\S]", True),
    (r"\s", True),
    (r"[\s]", True),
    (r"\W", True),
    (r"\D", True),
    ("[\\x00-\\x7f]", True),
    ("[[:space:]]", True),
    ("^a", True),
    (r"\Aa", True),
    ("(?m)a$", True),
    ("(?s)a.b", True),
    ("(?s:a.b)", True),
    ("(?<=x)a", True),
    ("(?<!x)a", True),
    (r"(a)\1", True),
    ("(?:x|a\\n)b", True),
    ("(?:\\n)?b", True),
    ("(?:a|^b)", True),
    (r"\p{Greek}x", True),  # unknown to Python's parser: assume it may span lines
    (r"[[:^alpha:]]", True),
]


@pytest.mark.parametrize(("pattern", "spans"), SPAN, ids=[repr(p) for p, _ in SPAN])
def test_can_span_lines(pattern: str, spans: bool) -> None:
    assert can_span_lines(pattern) is spans


# --------------------------------------------------------------------------------------------
# required_literals / required_runs

LITERALS = [
    # (pattern, literals (as a set) or None for "unknown")
    ("abcd", {"abcd"}),
    ("[a]bcd", {"abcd"}),
    (r"(?:alpha|beta)\d+", {"alpha", "beta"}),
    (r"(?:alpha)?beta", {"beta"}),
    ("(?:abcd)+", {"abcd"}),
    (r"\Qa.b*cd\E", {"a.b*cd"}),
    (r"a\nbcdef", {"bcdef"}),
    (".*", None),
    (r"\d+", None),
    ("abc", None),  # too short to be worth a needle
    (r"(?:alpha|be)\d", None),
    ("(?:abcd)*", None),
    ("(?:abcd)?", None),
    ("(?:abcd|)x", None),
    ("(?i:abcdef)x", None),
    ("(?=abcd)x", None),
    (r"(?!abcd)\w+", None),
    ("(?:(?!abcd)x)+", None),
    ("a(", None),  # unparsable: unknown, never an exception
    (r"\pL+ failure abcdef", None),  # RE2-only syntax: Python's parser cannot read it, so unknown
    (r"(?U)failure \d+", None),
    (r"(?<dev>\w+): link failure", {": link failure"}),  # Go named group: translated for the analysis
    (r"failure{,3} abcdef", {"failure{,3} abcdef"}),  # {,3} is literal text in Go
]


@pytest.mark.parametrize(("pattern", "literals"), LITERALS, ids=[repr(p) for p, _ in LITERALS])
def test_required_literals(pattern: str, literals: set[str] | None) -> None:
    found = required_literals(pattern)
    assert (None if found is None else set(found)) == literals


RUNS = [
    ("Killed process \\d+ (.+) total-vm:\\d+kB", {"Killed process ", " total-vm:", "kB"}),
    ("(?:foo|bar)baz", {"baz"}),
    ("(?:abcd)?efgh", {"efgh"}),
    ("(?:ab)+cd", {"ab", "cd"}),
    ("a\\nbc", {"bc"}),
    ("(?i:abcdef)gh", {"gh"}),
    (".*", set()),
]


@pytest.mark.parametrize(("pattern", "runs"), RUNS, ids=[repr(p) for p, _ in RUNS])
def test_required_runs(pattern: str, runs: set[str]) -> None:
    assert set(required_runs(pattern)) == runs


# Real-world patterns with a line they must match: the analysis must agree with the match.
REAL = [
    (
        r"Killed process \d+ (.+) total-vm:\d+kB, anon-rss:\d+kB, file-rss:\d+kB.*",
        "Out of memory: Killed process 1234 (python3) total-vm:100kB, anon-rss:10kB, file-rss:0kB, shmem-rss:0kB",
    ),
    (
        r"task [\S ]+:\w+ blocked for more than \w+ seconds\.",
        "INFO: task jbd2/nvme0n1p1-:612 blocked for more than 120 seconds.",
    ),
    (r".*\[Hardware Error\]: event severity: fatal$", "{1}[Hardware Error]: event severity: fatal"),
    (r"NEURON_HW_ERR=(?P<error>[A-Z][A-Z0-9_]*).*", "NEURON_HW_ERR=DMA_ERROR instance-id=i-0abc nd-id=3"),
    (
        r"BUG: (?:kernel NULL pointer dereference, address|unable to handle page fault for address): .*",
        "BUG: kernel NULL pointer dereference, address: 0000000000000008",
    ),
    (
        r"NVRM: The NVIDIA GPU (?P<pci>[0-9a-f:.]+)[^\n]*\n(?:[^\n]*\n){0,3}[^\n]*NVRM: +fallen off the bus\.?",
        "NVRM: The NVIDIA GPU 0000:3b:00.0\nNVRM: (PCI ID: 10de:2330) installed in this system has\n"
        "NVRM: fallen off the bus.",
    ),
]


@pytest.mark.parametrize(("pattern", "line"), REAL, ids=[p[:40] for p, _ in REAL])
def test_analysis_agrees_with_real_matches(pattern: str, line: str) -> None:
    match = compile_anchored(pattern).search(line)
    assert match is not None
    literals = required_literals(pattern)
    assert literals is not None
    assert any(lit in match.group() for lit in literals)
    assert all(run in match.group() for run in required_runs(pattern))
    if "\n" in match.group():
        assert can_span_lines(pattern)


# --------------------------------------------------------------------------------------------
# Properties: generate a pattern from a small grammar and a string that matches it.

_WORDS = ["Xid", "error", "NVRM: ", "link down", "abcd", "x", "a", ":", "=", "\u00e9t\u00e9 ", "(x)"]
_ATOMS = [re.escape(w) for w in _WORDS] + [
    r"\d",
    r"\d+",
    "[a-z]+",
    ".",
    ".*",
    r"\s",
    r"\S+",
    "[^x]",
    r"\n",
    r"\w+",
    "[[:digit:]]",
    r"\Q*.\E",
]


def _patterns() -> st.SearchStrategy[str]:
    words = st.lists(st.sampled_from([re.escape(w) for w in _WORDS]), min_size=2, max_size=3)
    atoms = st.sampled_from(_ATOMS) | words.map(lambda ws: "(?:" + "|".join(ws) + ")")
    tree = st.recursive(
        atoms,
        lambda kids: st.one_of(
            st.lists(kids, min_size=2, max_size=4).map("".join),
            st.lists(kids, min_size=2, max_size=3).map(lambda xs: "(?:" + "|".join(xs) + ")"),
            kids.map(lambda x: f"(?:{x})?"),
            kids.map(lambda x: f"(?:{x})+"),
            kids.map(lambda x: f"(?:{x})*"),
            kids.map(lambda x: f"(?:{x}){{1,3}}"),
            kids.map(lambda x: f"({x})"),
        ),
        max_leaves=6,
    )
    flags = st.sampled_from(["", "", "", "(?i)", "(?s)", "(?m)", "(?is)"])
    return st.tuples(flags, st.booleans(), tree).map(lambda t: t[0] + ("^" if t[1] else "") + t[2])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(data=st.data(), pattern=_patterns())
def test_analysis_never_contradicts_a_match(data: st.DataObject, pattern: str) -> None:
    text = data.draw(st.from_regex(re.compile(translate_go(pattern), re.ASCII), fullmatch=True), label="text")
    match = compile_anchored(pattern).search(text)
    assert match is not None
    matched = match.group()
    literals = required_literals(pattern)
    if literals is not None:
        assert any(lit in matched for lit in literals), (literals, matched)
    for run in required_runs(pattern):
        assert run in matched, (run, matched)
    if "\n" in matched:
        assert can_span_lines(pattern)
