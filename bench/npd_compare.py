"""Side by side with node-problem-detector: which lines fire which rules, here and in NPD's own code.

For every input line and every rule the script asks both sides whether the rule fires on that line
(and with which message), and sorts each disagreement into the points docs/rule-packs.md documents
("Where node-problem-detector matches differently"):

- ``alternation``: a top-level ``a|b``; NPD releases before kubernetes/node-problem-detector#1338
  append ``\\z`` to the pattern as text, so only the last branch is anchored at the end;
- ``start-anchor``: ``^``/``\\A`` before NPD's buffer has filled (its empty slots come first);
- ``empty-pattern``: NPD fires it on every line, we refuse it;
- ``lookback``: NPD drops records older than ``lookback``; we rebuild permanent conditions from them.

A disagreement counts as one of these only if it disappears when that point is neutralised on both
sides (every pattern grouped as ``(?:...)``; no lookback; for ``^``/``\\A``, ``bufferSize - 1``
empty lines first, so NPD's buffer starts full) and the pattern or the lines have the property, or,
for the empty pattern, when it is the rule our loader refuses. Anything else is outside the table:
``empty-slots`` (before NPD's buffer fills, the line breaks between its empty slots can be matched),
``line-break-start`` (a match starting at a line break: NPD's message starts on the next line, ours
on the one before), one of NPD's kmsg record layer (``kmsg-dictionary``: NPD matches a record's
``SUBSYSTEM=``/``DEVICE=`` lines as part of its message; ``kmsg-escaping``: NPD matches the text as
/dev/kmsg escapes it, ``\\xNN``; ``embedded-newline``: a message holding a newline is one line of
NPD's buffer, several of ours), a ``refused`` rule other than the empty pattern, or
``unexplained``. Exit status: 0 when every disagreement is one of the table's points, 1 otherwise,
2 when the harness is missing or fails or the input is unusable.

Usage::

    python bench/npd_compare.py --npd-harness /tmp/npd-harness/npd-harness-head \\
        --rules kernel-monitor.json ../shared/testdata/kernel-lines.jsonl
    python bench/npd_compare.py --npd-harness BIN --adversarial           # the built-in cases below
    python bench/npd_compare.py --npd-harness BIN cases.json              # {"cases": [...]} files

Inputs: a ``{"cases": [{"name", "config" | "rules" (+ "bufferSize", "conditions", "lookback"),
"lines"}]}`` document (each case a fresh stream; a line is a string, the message itself, or an
object as below); or, with ``--rules``, a JSON-lines file of ``{"message"}`` (the kernel message),
``{"text"}`` (a saved log line: its prefixes are stripped as ``simulate`` strips them) or
``{"kmsg"}`` (a raw ``/dev/kmsg`` record, dictionary lines included), each with an optional
``"age"`` in seconds before now; or a plain log file (one saved log line per line). NPD's side gets
each message as go-kmsg-parser hands it over: the record text and the newline ending every record
(``--kmsg-records`` sends every line as a raw record instead, escaped as the kernel escapes it).
Our side runs the agent's own path: the rule pack loader (the file as it is; a rule it refuses is
left out and reported), the replay policy (``--lookback``, default 5m) and the detection pipeline.

Rebuilding the NPD harness (Go and NPD's sources stay outside this repository; tests never need it)
----------------------------------------------------------------------------------------------------
1. ``apt-get install -y golang-go`` (Debian bookworm: Go 1.19); build with
   ``GOFLAGS=-mod=mod GOPROXY=off``: the harness needs the standard library only.
2. From github.com/kubernetes/node-problem-detector take
   ``pkg/systemlogmonitor/log_buffer.go`` (two versions: master after PR #1338, where
   ``CompilePattern`` returns a ``*Pattern`` of ``(?:expr)\\z`` with the ``lastLineOnly`` shortcut;
   and commit 2a4daab6, where it returns ``regexp.Compile(expr + `\\z`)``) and
   ``pkg/systemlogmonitor/types/types.go``; for checking them, ``log_buffer_test.go`` and
   ``log_buffer_equivalence_test.go``.
3. Make a Go module ``npdharness`` (``go 1.19``): ``types/types.go`` unchanged;
   ``head/systemlogmonitor/log_buffer.go`` and ``legacy/systemlogmonitor/log_buffer.go`` unchanged
   but for their imports (``k8s.io/node-problem-detector/pkg/systemlogmonitor/types`` becomes
   ``npdharness/types``, and ``slices`` becomes ``npdharness/slices``, a shim with the generic
   ``Contains`` and ``Reverse`` that Go 1.19 lacks). NPD's two test files, copied beside them (Go
   1.22 ``range`` loops rewritten as counted loops), must pass: ``go test ./...``.
4. ``main.go`` (package main), with ``engine_head.go`` / ``engine_legacy.go`` (build tag
   ``legacy``) choosing the package through type aliases (``pattern``, ``logBuffer``) and
   ``compilePattern``/``newLogBuffer``. It reads flags ``-rules FILE`` (NPD's config JSON),
   ``-lookback DUR`` (overrides the config's), ``-uptime DUR`` (default 1000h) and ``-describe``
   (prints which log_buffer.go it was built with), and does, with the statements of the originals:
   ``MonitorConfig.ApplyDefaultConfiguration`` (bufferSize 10, lookback "0"), ``ValidateRules``
   (``regexp.Compile`` of every pattern; a failure exits 3), ``CompilePattern`` for each rule;
   ``util.GetStartTime`` (now - uptime, raised to now - lookback); then for each stdin JSON line
   ``{"message"}`` or ``{"record"}`` (the latter through go-kmsg-parser's ``parseMessage``: the
   Message is everything after the first ``;``) with ``"age"``: the kmsg watcher's loop (skip an
   empty Message, skip one timestamped before the start time, ``strings.TrimSpace``) and
   ``logMonitor.parseLog`` (``Push``, then every rule in order: ``Match``; on a match print
   ``{"line", "rule" (index), "type", "reason", "condition" (permanent rules), "message"}`` with
   ``generateMessage``'s message, the matched lines joined by newlines).
5. ``go build -o npd-harness-head .`` and ``go build -tags legacy -o npd-harness-legacy .``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ALTERNATION = "alternation"
START_ANCHOR = "start-anchor"
EMPTY_PATTERN = "empty-pattern"
LOOKBACK = "lookback"
# Found by this comparison and then decided (rows added to the table): how NPD's kmsg watcher hands
# records to its buffer, and two details of the matching itself.
KMSG_DICTIONARY = "kmsg-dictionary"
KMSG_ESCAPING = "kmsg-escaping"
EMBEDDED_NEWLINE = "embedded-newline"
EMPTY_SLOTS = "empty-slots"  # before NPD's buffer fills, its empty slots add line breaks a pattern can match
LINE_BREAK_START = "line-break-start"  # a match starting at a line break: NPD's message starts on the next line
DOCUMENTED = (  # the table in docs/rule-packs.md
    ALTERNATION,
    START_ANCHOR,
    EMPTY_PATTERN,
    LOOKBACK,
    KMSG_DICTIONARY,
    KMSG_ESCAPING,
    EMBEDDED_NEWLINE,
    EMPTY_SLOTS,
    LINE_BREAK_START,
)
REFUSED = "refused"
UNEXPLAINED = "unexplained"

# The counterfactual runs: which documented points they neutralise on both sides.
GROUPED = "grouped"  # every pattern written as (?:...): no top-level alternation left
NO_LOOKBACK = "no-lookback"  # every record counts as recent
BOTH = "grouped+no-lookback"
PREFILLED = "prefilled"  # bufferSize - 1 empty lines first: NPD's buffer starts full, ours sees the same text

NOW = 1_767_323_045.0  # the harness's fixed "now" (2026-01-02T03:04:05Z), as epoch seconds
NO_LOOKBACK_GO = "876000h"  # a lookback longer than the harness's uptime: nothing is dropped
EXIT_OK, EXIT_OUTSIDE, EXIT_UNUSABLE = 0, 1, 2


class Unusable(Exception):
    """The harness is missing or failed, or an input cannot be used (exit 2)."""


@dataclass(frozen=True, kw_only=True)
class Record:
    """One kernel record: ``text`` is the message as the kernel printed it (what our kmsg source
    delivers); ``kmsg`` the raw ``/dev/kmsg`` record NPD reads, when the record is sent as one."""

    text: str
    age: float = 0.0
    kmsg: str | None = None

    @property
    def dictionary(self) -> bool:
        return self.kmsg is not None and "\n " in self.kmsg.rstrip("\n")

    @property
    def escaped(self) -> bool:
        return self.kmsg is not None and any(_kernel_escapes(c) for c in self.text.encode("utf-8"))

    @property
    def newline(self) -> bool:
        return "\n" in self.text


@dataclass(frozen=True, kw_only=True)
class Stream:
    name: str
    config: Mapping[str, Any]  # NPD system-log-monitor configuration
    records: tuple[Record, ...]
    lookback: str  # Go duration
    path: Path | None = None  # the configuration file as given, if any

    @property
    def rules(self) -> list[Mapping[str, Any]]:
        return list(self.config.get("rules") or [])

    @property
    def buffer_size(self) -> int:
        return int(self.config.get("bufferSize") or 10)


@dataclass(frozen=True, kw_only=True)
class Match:
    """A rule that fired on a line (1-based record number), as either side reports it."""

    line: int
    rule: int  # index in the configuration's rules
    type: str
    reason: str
    condition: str | None
    message: str

    @property
    def key(self) -> tuple[int, int]:
        return (self.line, self.rule)


@dataclass(frozen=True, kw_only=True)
class Disagreement:
    line: int
    rule: int
    npd: Match | None
    ours: Match | None

    @property
    def key(self) -> tuple[int, int]:
        return (self.line, self.rule)

    @property
    def kind(self) -> str:
        if self.npd is None:
            return "only ours"
        if self.ours is None:
            return "only NPD"
        return "different message" if self.npd.message != self.ours.message else "different finding"


@dataclass(frozen=True, kw_only=True)
class StreamFacts:
    """What classification needs to know about a stream besides the two sides' matches."""

    patterns: Sequence[str]
    buffer_size: int
    lookback: float  # seconds
    records: Sequence[Record]
    refused: Mapping[int, str] = field(default_factory=dict)  # rule index -> why our loader refused it

    def old(self, line: int) -> bool:
        return self.records[line - 1].age > self.lookback

    def window(self, line: int) -> range:
        """1-based lines NPD's buffer can hold when ``line`` is pushed."""
        return range(max(1, line - self.buffer_size + 1), line + 1)

    def npd_pushed(self, line: int) -> int:
        """Lines NPD has pushed into its buffer once ``line`` is in (its watcher drops old records)."""
        return sum(1 for n in range(1, line + 1) if not self.old(n))


# --- the kernel's /dev/kmsg record format ---------------------------------------------------------


def _kernel_escapes(byte: int) -> bool:
    return byte < 0x20 or byte >= 0x7F or byte == 0x5C  # printk's msg_add_ext_text


def kernel_escape(text: str) -> str:
    """The message as /dev/kmsg shows it: control bytes, bytes >= 0x7f and backslashes as ``\\xNN``."""
    return "".join(f"\\x{b:02x}" if _kernel_escapes(b) else chr(b) for b in text.encode("utf-8"))


def kmsg_record(seq: int, text: str, *, prio: int = 6, usec: int = 0) -> str:
    return f"{prio},{seq},{usec},-;{kernel_escape(text)}\n"


# --- inputs -----------------------------------------------------------------------------------------


def _record(entry: Any, *, seq: int, where: str, saved_log: bool, kmsg_records: bool) -> Record:
    from agent.detectors.pipeline import saved_log_line
    from agent.sources.kmsg.format import KmsgParseError, parse_record

    age = 0.0
    kmsg = None
    if isinstance(entry, str):
        text = saved_log_line(entry) if saved_log else entry
    elif isinstance(entry, dict) and sum(k in entry for k in ("message", "text", "kmsg")) == 1:
        age = float(entry.get("age", 0.0))
        if "kmsg" in entry:
            kmsg = str(entry["kmsg"])
            if not kmsg.endswith("\n"):
                kmsg += "\n"  # a read() of /dev/kmsg returns the record with its final newline
            try:
                text = parse_record(kmsg.encode("utf-8", "surrogateescape"), boot_time=0.0).message
            except KmsgParseError as exc:
                raise Unusable(f"{where}: not a /dev/kmsg record: {exc}") from None
        elif "text" in entry:
            text = saved_log_line(str(entry["text"]))
        else:
            text = str(entry["message"])
    else:
        raise Unusable(f"{where}: expected a string or an object with one of message, text, kmsg")
    if kmsg is None and kmsg_records:
        kmsg = kmsg_record(seq, text)
    return Record(text=text, age=age, kmsg=kmsg)


def _case_config(case: Mapping[str, Any]) -> dict[str, Any]:
    if "config" in case:
        return dict(case["config"])
    config: dict[str, Any] = {"plugin": "kmsg", "source": "npd-compare", "rules": list(case["rules"])}
    for key in ("bufferSize", "conditions"):
        if key in case:
            config[key] = case[key]
    if "conditions" not in config:  # our loader wants every permanent rule's condition declared
        types = sorted({r["condition"] for r in config["rules"] if r.get("type") == "permanent"})
        config["conditions"] = [{"type": t, "reason": f"No{t}", "message": f"no {t}"} for t in types]
    return config


def cases_streams(
    cases: Iterable[Mapping[str, Any]], *, lookback: str, kmsg_records: bool, origin: str
) -> list[Stream]:
    streams = []
    for i, case in enumerate(cases):
        name = str(case.get("name") or f"{origin}#{i + 1}")
        lines = case.get("lines") or []
        records = tuple(
            _record(entry, seq=n, where=f"{name} line {n}", saved_log=False, kmsg_records=kmsg_records)
            for n, entry in enumerate(lines, start=1)
        )
        streams.append(
            Stream(name=name, config=_case_config(case), records=records, lookback=str(case.get("lookback", lookback)))
        )
    return streams


def _is_json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def load_streams(path: Path, *, rules: Path | None, lookback: str, kmsg_records: bool) -> list[Stream]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise Unusable(f"cannot read {path}: {exc}") from None
    stripped = text.lstrip()
    if stripped.startswith("{") and '"cases"' in stripped[:200]:
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise Unusable(f"{path}: {exc}") from None
        if isinstance(doc, dict) and isinstance(doc.get("cases"), list):
            return cases_streams(doc["cases"], lookback=lookback, kmsg_records=kmsg_records, origin=path.name)
    if rules is None:
        raise Unusable(f'{path}: a log file needs --rules FILE (only a {{"cases": ...}} file carries its own)')
    try:
        config = json.loads(rules.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise Unusable(f"cannot read {rules}: {exc}") from None
    entries: list[Any] = []
    jsonl = _is_json_object(stripped.split("\n", 1)[0])
    for n, line in enumerate(text.splitlines(), start=1):
        if jsonl:
            if not line.strip():
                continue
            try:
                entries.append(json.loads(line))
            except ValueError as exc:
                raise Unusable(f"{path}:{n}: {exc}") from None
        else:
            entries.append(line)
    records = tuple(
        _record(e, seq=n, where=f"{path}:{n}", saved_log=not jsonl, kmsg_records=kmsg_records)
        for n, e in enumerate(entries, start=1)
    )
    return [Stream(name=path.name, config=config, records=records, lookback=lookback, path=rules)]


# --- the two sides ----------------------------------------------------------------------------------


def _grouped(config: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(config)
    out["rules"] = [{**r, "pattern": f"(?:{r.get('pattern', '')})"} for r in config.get("rules") or []]
    return out


def parse_npd_output(text: str) -> list[Match]:
    """The harness's JSON lines as matches."""
    out = []
    for line in text.splitlines():
        if line.strip():
            d = json.loads(line)
            out.append(
                Match(
                    line=d["line"],
                    rule=d["rule"],
                    type=d["type"],
                    reason=d["reason"],
                    condition=d.get("condition"),
                    message=d["message"],
                )
            )
    return out


def describe_harness(harness: Path) -> str:
    try:
        proc = subprocess.run([str(harness), "-describe"], capture_output=True, text=True, timeout=30)
    except OSError as exc:
        raise Unusable(f"cannot run the harness {harness}: {exc}") from None
    if proc.returncode != 0:
        raise Unusable(f"the harness {harness} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


def run_npd(harness: Path, stream: Stream, *, group: bool = False, lookback: str | None = None) -> list[Match]:
    config = _grouped(stream.config) if group else dict(stream.config)
    with tempfile.TemporaryDirectory(prefix="npd-compare-") as tmp:
        path = Path(tmp) / "config.json"
        path.write_text(json.dumps(config), encoding="utf-8")
        feed = "".join(
            json.dumps(
                {"record": r.kmsg, "age": r.age} if r.kmsg is not None else {"message": r.text + "\n", "age": r.age}
            )
            + "\n"
            for r in stream.records
        )
        argv = [str(harness), "-rules", str(path), "-lookback", lookback or stream.lookback]
        proc = subprocess.run(argv, input=feed, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise Unusable(f"{stream.name}: the harness failed ({proc.returncode}): {proc.stderr.strip()}")
    return parse_npd_output(proc.stdout)


@dataclass(frozen=True, kw_only=True)
class OurRun:
    matches: list[Match]
    refused: dict[int, str]


_RULE_FIELD = re.compile(r"^rules\[(\d+)\]\.pattern$")


def _load_ours(stream: Stream, config: Mapping[str, Any], tmp: Path, *, as_given: bool) -> tuple[Any, list[int], dict]:
    """Load the configuration with our rule pack loader; rules whose pattern it refuses are left out."""
    from agent.app.config import load_rule_set
    from agent.core.errors import ConfigError

    rules = list(config.get("rules") or [])
    keep = list(range(len(rules)))
    refused: dict[int, str] = {}
    path = stream.path if as_given and stream.path is not None else None
    for attempt in range(2):
        if path is None:
            path = tmp / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', stream.name)}-{attempt}.json"
            path.write_text(json.dumps({**config, "rules": [rules[i] for i in keep]}), encoding="utf-8")
        try:
            return load_rule_set([path]), keep, refused
        except ConfigError as exc:
            bad = {}
            for problem in exc.problems:
                m = _RULE_FIELD.match(problem.field)
                if m is None or attempt:
                    raise Unusable(f"{stream.name}: node-health-agent refuses the configuration: {exc}") from None
                bad[keep[int(m.group(1))]] = problem.message
            refused.update(bad)
            keep = [i for i in keep if i not in bad]
            path = None
            if not keep:
                return None, keep, refused
    raise AssertionError("unreachable")


def run_ours(stream: Stream, *, group: bool = False, lookback: float | None = None) -> OurRun:
    """Our side: the rule pack loader, the replay policy and the detection pipeline, as the agent runs them."""
    from agent.core.durations import parse_duration
    from agent.core.types import LogRecord
    from agent.detectors.pipeline import Batch, DetectionPipeline
    from agent.sources.replay import ReplayPolicy

    config = _grouped(stream.config) if group else dict(stream.config)
    with tempfile.TemporaryDirectory(prefix="npd-compare-") as tmp:
        rule_set, keep, refused = _load_ours(stream, config, Path(tmp), as_given=not group)
    if rule_set is None:
        return OurRun(matches=[], refused=refused)
    if len(rule_set.rules) != len(keep):
        raise Unusable(f"{stream.name}: {len(rule_set.rules)} rules loaded for {len(keep)} in the file")
    index = {rule.name: keep[j] for j, rule in enumerate(rule_set.rules)}
    suffixes = {keep[j]: rule.suffix for j, rule in enumerate(rule_set.rules) if getattr(rule, "suffix", None)}
    records = [LogRecord(message=r.text, timestamp=NOW - r.age, seq=n) for n, r in enumerate(stream.records, start=1)]
    window = parse_duration(stream.lookback) if lookback is None else lookback
    policy = ReplayPolicy(cursor=None, boot_id="npd-compare", lookback=window)
    pipeline = DetectionPipeline(rule_set=rule_set)
    matches = []
    for run, replayed in policy.split(records, now=NOW):
        for f in pipeline.process(Batch(records=run, permanent_only=replayed)):
            rule = index[f.rule]
            message = f.message
            if rule in suffixes and message.endswith(f"; {suffixes[rule]}"):
                message = message[: -len(suffixes[rule]) - 2]  # NPD's harness prints no suffix
            matches.append(
                Match(
                    line=f.line,
                    rule=rule,
                    type=f.type.value,
                    reason=f.reason,
                    condition=f.condition,
                    message=message,
                )
            )
    return OurRun(matches=matches, refused=refused)


# --- comparison and classification -------------------------------------------------------------------


def _by_key(matches: Iterable[Match]) -> dict[tuple[int, int], Match]:
    out: dict[tuple[int, int], Match] = {}
    for m in matches:
        out.setdefault(m.key, m)  # one finding per (line, rule) on both sides
    return out


def disagreements(npd: Iterable[Match], ours: Iterable[Match]) -> list[Disagreement]:
    """Every (line, rule) where one side fires and the other does not, or both fire differently."""
    a, b = _by_key(npd), _by_key(ours)
    out = []
    for key in sorted(a.keys() | b.keys()):
        x, y = a.get(key), b.get(key)
        if (
            x is not None
            and y is not None
            and (x.type, x.reason, x.condition, x.message)
            == (
                y.type,
                y.reason,
                y.condition,
                y.message,
            )
        ):
            continue
        out.append(Disagreement(line=key[0], rule=key[1], npd=x, ours=y))
    return out


def pattern_points(pattern: str) -> set[str]:
    """The documented points ``validate-config`` warns about for this pattern."""
    from agent.core.regex import npd_differences

    found = set()
    for text in npd_differences(pattern):
        if text.startswith("top-level alternation"):
            found.add(ALTERNATION)
        elif text.startswith("anchored at the start"):
            found.add(START_ANCHOR)
    return found


def classify(d: Disagreement, facts: StreamFacts, *, vanishes: Iterable[str] = ()) -> tuple[str, ...]:
    """The points that explain a disagreement: one or two of ``DOCUMENTED``, or one outside the table.

    ``vanishes``: the counterfactual runs (``grouped``, ``no-lookback``, ``grouped+no-lookback``,
    ``prefilled``) in which this (line, rule) no longer disagrees.
    """
    vanishes = set(vanishes)
    pattern = facts.patterns[d.rule]
    if d.rule in facts.refused:
        if pattern == "" and d.ours is None:
            return (EMPTY_PATTERN,)
        return (REFUSED,)
    points = pattern_points(pattern)
    window = facts.window(d.line)
    old = any(facts.old(n) for n in window)
    if GROUPED in vanishes and ALTERNATION in points:
        return (ALTERNATION,)
    if NO_LOOKBACK in vanishes and old:
        return (LOOKBACK,)
    if BOTH in vanishes and ALTERNATION in points and old:
        return (ALTERNATION, LOOKBACK)
    # Prefilling compares only whether the sides fire: evidence for one-sided disagreements alone.
    empty_slots = facts.npd_pushed(d.line) < facts.buffer_size and PREFILLED in vanishes and None in (d.npd, d.ours)
    if empty_slots and START_ANCHOR in points and d.npd is None:
        return (START_ANCHOR,)
    if empty_slots:
        return (EMPTY_SLOTS,)
    records = [facts.records[n - 1] for n in window]
    if any(r.dictionary for r in records):
        return (KMSG_DICTIONARY,)
    if any(r.escaped for r in records):
        return (KMSG_ESCAPING,)
    if any(r.newline for r in records):
        return (EMBEDDED_NEWLINE,)
    if d.npd is not None and d.ours is not None and line_break_start(d.npd.message, d.ours.message):
        return (LINE_BREAK_START,)
    return (UNEXPLAINED,)


def line_break_start(npd_message: str, our_message: str) -> bool:
    """Whether ours is NPD's message with the line before it: the match began at the line break between."""
    head, sep, tail = our_message.rpartition("\n" + npd_message)
    return bool(sep) and not tail and "\n" not in head


def is_documented(verdict: Sequence[str]) -> bool:
    """Whether the verdict is one of the table's points (or two of them together)."""
    return bool(verdict) and all(v in DOCUMENTED for v in verdict)


HINTS = {
    KMSG_DICTIONARY: "NPD matches the record's SUBSYSTEM=/DEVICE= dictionary lines as part of the message",
    KMSG_ESCAPING: "NPD matches the text as /dev/kmsg escapes it (\\xNN: tabs, newlines, bytes >= 0x7f, backslashes)",
    EMBEDDED_NEWLINE: "NPD keeps a message with a newline as one buffer line; we match each of its lines",
    EMPTY_SLOTS: "before NPD's buffer has filled its empty slots come first, joined by line breaks a pattern can match",
    LINE_BREAK_START: "the match starts at a line break: NPD's message starts on the next line, ours on the one before",
    REFUSED: "node-health-agent refuses this rule",
    UNEXPLAINED: "no known point explains it",
}


@dataclass(kw_only=True)
class StreamResult:
    stream: Stream
    npd: list[Match]
    ours: list[Match]
    refused: dict[int, str]
    verdicts: list[tuple[Disagreement, tuple[str, ...]]]

    @property
    def decisions(self) -> int:
        return len(self.stream.records) * len(self.stream.rules)


def facts_for(stream: Stream, refused: Mapping[int, str]) -> StreamFacts:
    from agent.core.durations import parse_duration

    return StreamFacts(
        patterns=[str(r.get("pattern", "")) for r in stream.rules],
        buffer_size=stream.buffer_size,
        lookback=parse_duration(stream.lookback),
        records=stream.records,
        refused=dict(refused),
    )


def prefilled(stream: Stream) -> tuple[Stream, int]:
    """The stream after ``bufferSize - 1`` empty records, and that count: NPD's buffer is then full
    from the first real line on, holding the same text as its empty slots held, and so does ours."""
    k = stream.buffer_size - 1
    filler = tuple(Record(text="") for _ in range(k))
    return Stream(name=stream.name, config=stream.config, records=filler + stream.records, lookback=stream.lookback), k


def _fires(matches: Iterable[Match], shift: int = 0) -> dict[tuple[int, int], tuple[str, str]]:
    return {(m.line - shift, m.rule): (m.type, m.reason) for m in matches if m.line > shift}


def compare_stream(harness: Path, stream: Stream) -> StreamResult:
    npd = run_npd(harness, stream)
    mine = run_ours(stream)
    found = disagreements(npd, mine.matches)
    vanishes: dict[tuple[int, int], set[str]] = {d.key: set() for d in found}
    if found:
        runs = {
            GROUPED: {"group": True},
            NO_LOOKBACK: {"lookback": math.inf},
            BOTH: {"group": True, "lookback": math.inf},
        }
        for name, how in runs.items():
            go_lookback = NO_LOOKBACK_GO if how.get("lookback") else None
            try:
                cf_npd = run_npd(harness, stream, group=bool(how.get("group")), lookback=go_lookback)
            except Unusable:
                continue  # e.g. a pattern that no longer compiles once grouped: no evidence from this run
            cf_ours = run_ours(stream, group=bool(how.get("group")), lookback=how.get("lookback"))
            still = {d.key for d in disagreements(cf_npd, cf_ours.matches)}
            for key in vanishes:
                if key not in still:
                    vanishes[key].add(name)
        # Prefilled: whether the two sides then fire alike (messages aside: NPD's now hold the empty lines).
        full, k = prefilled(stream)
        a, b = _fires(run_npd(harness, full), k), _fires(run_ours(full).matches, k)
        for key in vanishes:
            if a.get(key) == b.get(key):
                vanishes[key].add(PREFILLED)
    facts = facts_for(stream, mine.refused)
    verdicts = [(d, classify(d, facts, vanishes=vanishes[d.key])) for d in found]
    return StreamResult(stream=stream, npd=npd, ours=mine.matches, refused=mine.refused, verdicts=verdicts)


def summary(results: Sequence[StreamResult]) -> dict[str, Any]:
    by_point: Counter[str] = Counter()
    outside: Counter[str] = Counter()
    for r in results:
        for _, verdict in r.verdicts:
            (by_point if is_documented(verdict) else outside)["+".join(verdict)] += 1
    decisions = sum(r.decisions for r in results)
    disagreeing = sum(len(r.verdicts) for r in results)
    return {
        "streams": len(results),
        "lines": sum(len(r.stream.records) for r in results),
        "decisions": decisions,
        "agreements": decisions - disagreeing,
        "npd_matches": sum(len(_by_key(r.npd)) for r in results),
        "our_matches": sum(len(_by_key(r.ours)) for r in results),
        "disagreements": disagreeing,
        "by_point": dict(sorted(by_point.items())),
        "outside_table": dict(sorted(outside.items())),
    }


def _show(m: Match | None) -> str:
    return "silent" if m is None else f"fires {m.type} {m.reason}: {m.message!r}"


def report(results: Sequence[StreamResult], *, harness: str, out: Any = sys.stdout) -> dict[str, Any]:
    s = summary(results)
    print(f"node-problem-detector harness: {harness}", file=out)
    print(
        f"{s['streams']} stream(s), {s['lines']} lines; {s['decisions']} line x rule decisions: "
        f"{s['agreements']} agree, {s['disagreements']} disagree "
        f"(NPD fired {s['npd_matches']}, node-health-agent {s['our_matches']})",
        file=out,
    )
    for point in DOCUMENTED:
        print(f"  {point}: {sum(n for k, n in s['by_point'].items() if point in k.split('+'))}", file=out)
    print(f"  outside the table: {sum(s['outside_table'].values())} {s['outside_table'] or ''}", file=out)
    for r in results:
        for rule, why in sorted(r.refused.items()):
            print(f"[{r.stream.name}] rule {rule} refused by node-health-agent: {why}", file=out)
        for d, verdict in r.verdicts:
            rule = r.stream.rules[d.rule]
            label = "+".join(verdict) if is_documented(verdict) else f"OUTSIDE THE TABLE: {verdict[0]}"
            print(f"- {label} [{r.stream.name}] line {d.line}, rule {d.rule} {rule.get('reason')!r} ", file=out, end="")
            print(f"pattern {rule.get('pattern')!r}: {d.kind}", file=out)
            print(f"    input:  {r.stream.records[d.line - 1].text!r}", file=out)
            print(f"    NPD:    {_show(d.npd)}", file=out)
            print(f"    ours:   {_show(d.ours)}", file=out)
            if not is_documented(verdict):
                print(f"    why:    {HINTS.get(verdict[0], '')}", file=out)
    return s


# --- the built-in adversarial cases: one or more per documented point, plus the kmsg record layer ----

_LINK_DOWN = "mlx5_core 0000:4b:00.0 enp75s0np0: Link down"
_OOM_KILL = "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,task=stress,pid=4242,uid=0"
_OOM_KILLED = (
    "Out of memory: Killed process 4242 (stress) total-vm:1048576kB, anon-rss:1040000kB, file-rss:0kB, "
    "shmem-rss:0kB, UID:0 pgtables:2080kB oom_score_adj:0"
)
_HUNG = "INFO: task {}:{} blocked for more than 120 seconds."
_EXT4_ERROR = "EXT4-fs error (device sda1): ext4_find_entry:1455: inode #2: comm ls: reading directory lblock 0"
_FILLER = "systemd[1]: Started Session {} of user core."

ADVERSARIAL_CASES: list[dict[str, Any]] = [
    {
        "name": "alternation: an earlier branch matches a buffered line again",
        "rules": [
            {"type": "temporary", "reason": "OOMEither", "pattern": "oom-kill|Out of memory"},
            {"type": "temporary", "reason": "OOMEitherGrouped", "pattern": "(?:oom-kill|Out of memory)"},
            {
                "type": "temporary",
                "reason": "OOMKilledOrConstraint",
                "pattern": r"Out of memory: Killed process \d+.*|oom-kill:.*",
            },
        ],
        "lines": [_OOM_KILL, _FILLER.format(7), _OOM_KILLED, _FILLER.format(8)],
    },
    {
        "name": "start anchor ^: first line, then again once the buffer is full",
        "rules": [
            {"type": "temporary", "reason": "Ext4ErrorCaret", "pattern": "^EXT4-fs error .*"},
            {"type": "temporary", "reason": "Ext4ErrorMultiline", "pattern": "(?m)^EXT4-fs error .*"},
        ],
        "lines": [_EXT4_ERROR, *[_FILLER.format(n) for n in range(9)], _EXT4_ERROR],
    },
    {
        "name": "start anchor \\A: a two-line pattern on the first lines",
        "conditions": [{"type": "XfsShutdown", "reason": "XfsHasNotShutDown", "message": "XFS has not shutdown"}],
        "rules": [
            {
                "type": "permanent",
                "condition": "XfsShutdown",
                "reason": "XfsShutdown",
                "pattern": r"\AXFS \(\S+\): .*\n.*",
            },
        ],
        "lines": [
            "XFS (nvme0n1p1): Corruption of in-memory data detected.  Shutting down filesystem",
            "XFS (nvme0n1p1): Please unmount the filesystem and rectify the problem(s)",
        ],
    },
    {
        "name": "start anchor: a one-line buffer is full at once",
        "bufferSize": 1,
        "rules": [{"type": "temporary", "reason": "Ext4ErrorCaret", "pattern": "^EXT4-fs error .*"}],
        "lines": [_EXT4_ERROR],
    },
    {
        "name": "a pattern that can match a line break: empty slots, and a match starting at a line break",
        "rules": [
            {"type": "temporary", "reason": "TraceAfterBreak", "pattern": r"\nCall Trace:"},
            {"type": "temporary", "reason": "TraceAfterSpace", "pattern": r"\s*Call Trace:"},
        ],
        "lines": ["Call Trace:", _HUNG.format("docker", 20744), "Call Trace:"],
    },
    {
        "name": "empty pattern",
        "rules": [
            {"type": "temporary", "reason": "Anything", "pattern": ""},
            {"type": "temporary", "reason": "TaskHung", "pattern": r"task \S+:\d+ blocked for more than \d+ seconds\."},
        ],
        "lines": [_FILLER.format(1), _HUNG.format("kworker/0:1", 77)],
    },
    {
        "name": "lookback: records older than lookback, one- and two-line patterns",
        "conditions": [
            {"type": "KernelDeadlock", "reason": "KernelHasNoDeadlock", "message": "kernel has no deadlock"}
        ],
        "rules": [
            {"type": "temporary", "reason": "TaskHung", "pattern": r"task \S+:\d+ blocked for more than \d+ seconds\."},
            {
                "type": "permanent",
                "condition": "KernelDeadlock",
                "reason": "DockerHung",
                "pattern": r"task docker:\d+ blocked for more than \d+ seconds\.",
            },
            {
                "type": "temporary",
                "reason": "OOMKilling",
                "pattern": r"Kill process \d+ \(\S+\) score \d+ or sacrifice child\n"
                r"Killed process \d+ \(\S+\) total-vm:\d+kB.*",
            },
        ],
        "lines": [
            {"message": _HUNG.format("docker", 20744), "age": 900},
            {
                "message": "Memory cgroup out of memory: Kill process 1012 (heapster) score 1035 or sacrifice child",
                "age": 400,
            },
            {
                "message": "Killed process 1012 (heapster) total-vm:327128kB, anon-rss:306328kB, file-rss:11132kB",
                "age": 1,
            },
            {"message": _HUNG.format("docker", 20745), "age": 1},
        ],
    },
    {
        "name": "kmsg record: dictionary lines (SUBSYSTEM=, DEVICE=)",
        "rules": [{"type": "temporary", "reason": "LinkDown", "pattern": ".* Link down"}],
        "lines": [
            {"kmsg": f"6,301,5000000,-;{_LINK_DOWN}\n SUBSYSTEM=pci\n DEVICE=+pci:0000:4b:00.0\n"},
            {"kmsg": f"12,302,5000001,-;{_LINK_DOWN}\n"},  # as `echo ... > /dev/kmsg` writes it
        ],
    },
    {
        "name": "kmsg record: escaped bytes (tab, UTF-8, embedded newline)",
        "rules": [
            {"type": "temporary", "reason": "NvmeReset", "pattern": r"I/O \d+ QID \d+ timeout,\s+reset controller"},
            {"type": "temporary", "reason": "Ext4Error", "pattern": "EXT4-fs error .*"},
            {"type": "temporary", "reason": "FirstLine", "pattern": "first line.*"},
        ],
        "lines": [
            {"kmsg": "4,401,6000000,-;nvme nvme0: I/O 17 QID 3 timeout,\\x09reset controller\n"},
            {
                "kmsg": "2,402,6000001,-;EXT4-fs error (device sda1): ext4_lookup:1855: inode #2: comm ls: "
                "name=caf\\xc3\\xa9\n"
            },
            {"kmsg": "6,403,6000002,-;first line\\x0asecond line\n"},
        ],
    },
    {
        "name": "message with an embedded newline (not from /dev/kmsg, which escapes it)",
        "rules": [{"type": "temporary", "reason": "FirstLine", "pattern": "first line.*"}],
        "lines": ["first line\nsecond line"],
    },
    {
        "name": "controls: kernel-monitor style rules, multi-line and $ patterns agree",
        "rules": [
            {
                "type": "temporary",
                "reason": "TaskHung",
                "pattern": r"task [\S ]+:\w+ blocked for more than \w+ seconds\.",
            },
            {"type": "temporary", "reason": "HwFatal", "pattern": r".*\[Hardware Error\]: event severity: fatal$"},
            {"type": "temporary", "reason": "TwoLines", "pattern": r"event severity: fatal\n.*mcelog --ascii.*"},
            {"type": "temporary", "reason": "AnyUntilX", "pattern": "[^x]+"},
        ],
        "lines": [
            _HUNG.format("docker", 20744),
            "{1}[Hardware Error]: Hardware error from APEI Generic Hardware Error Source: 5",
            "{1}[Hardware Error]: event severity: fatal",
            "mce: [Hardware Error]: Run the above through 'mcelog --ascii'",
            "",
            _FILLER.format(9),
        ],
    },
]


# --- command line -----------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--npd-harness", metavar="BIN", help="the harness built as the module docstring says")
    parser.add_argument("--rules", type=Path, help="NPD configuration for log-file inputs (e.g. kernel-monitor.json)")
    parser.add_argument("--lookback", default="5m", help="lookback for both sides (Go duration, default 5m)")
    parser.add_argument("--kmsg-records", action="store_true", help="send every line to NPD as a raw /dev/kmsg record")
    parser.add_argument("--adversarial", action="store_true", help="also run the built-in adversarial cases")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON after the report")
    parser.add_argument("inputs", nargs="*", type=Path)
    args = parser.parse_args(argv)
    harness = Path(args.npd_harness) if args.npd_harness else None
    if harness is None or not harness.is_file() or not os.access(harness, os.X_OK):
        what = "not given (--npd-harness BIN)" if harness is None else f"not built: {harness} is not an executable file"
        print(
            f"npd_compare: the node-problem-detector harness is {what}; build it as the docstring of "
            "bench/npd_compare.py says (Go and NPD's sources stay outside this repository).",
            file=sys.stderr,
        )
        return EXIT_UNUSABLE
    if not args.inputs and not args.adversarial:
        print("npd_compare: give an input file or --adversarial", file=sys.stderr)
        return EXIT_UNUSABLE
    root = Path(__file__).resolve().parents[1]
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    try:
        from agent.core.durations import parse_duration

        parse_duration(args.lookback)
        variant = describe_harness(harness)
        streams: list[Stream] = []
        for path in args.inputs:
            streams.extend(load_streams(path, rules=args.rules, lookback=args.lookback, kmsg_records=args.kmsg_records))
        if args.adversarial:
            streams.extend(
                cases_streams(
                    ADVERSARIAL_CASES, lookback=args.lookback, kmsg_records=args.kmsg_records, origin="adversarial"
                )
            )
        results = [compare_stream(harness, s) for s in streams]
    except (Unusable, ValueError) as exc:
        print(f"npd_compare: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    s = report(results, harness=variant)
    if args.json:
        print(json.dumps(s, indent=2))
    return EXIT_OK if not s["outside_table"] else EXIT_OUTSIDE


if __name__ == "__main__":
    sys.exit(main())
