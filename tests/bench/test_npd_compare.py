"""bench/npd_compare.py without Go: its classification of disagreements with node-problem-detector, on
recorded harness outputs (small inline tables), its inputs, our side of the comparison, and its exits."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from helpers import REPO

ROOT = REPO


@pytest.fixture()
def nc(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(ROOT))
    from bench import npd_compare

    return npd_compare


def match(nc, line: int, rule: int, message: str, *, reason: str = "R", type: str = "temporary", condition=None):
    return nc.Match(line=line, rule=rule, type=type, reason=reason, condition=condition, message=message)


def facts(nc, patterns, texts, *, ages=None, buffer_size=10, lookback=300.0, refused=None, kmsg=None):
    ages = ages or [0.0] * len(texts)
    kmsg = kmsg or [None] * len(texts)
    records = [nc.Record(text=t, age=a, kmsg=k) for t, a, k in zip(texts, ages, kmsg, strict=True)]
    return nc.StreamFacts(
        patterns=patterns, buffer_size=buffer_size, lookback=lookback, records=records, refused=refused or {}
    )


# --- what the harness prints, and how the two sides' findings are paired ---------------------------------

RECORDED_HARNESS = """\
{"line":1,"rule":0,"type":"temporary","reason":"OOMEither","condition":null,"message":"oom-kill:constraint=NONE"}
{"line":2,"rule":0,"type":"temporary","reason":"OOMEither","condition":null,"message":"oom-kill:constraint=NONE\\nready"}
{"line":2,"rule":1,"type":"permanent","reason":"DockerHung","condition":"KernelDeadlock","message":"ready"}
"""


def test_parse_npd_output(nc) -> None:
    got = nc.parse_npd_output(RECORDED_HARNESS)
    assert [(m.line, m.rule, m.type, m.condition) for m in got] == [
        (1, 0, "temporary", None),
        (2, 0, "temporary", None),
        (2, 1, "permanent", "KernelDeadlock"),
    ]
    assert got[1].message == "oom-kill:constraint=NONE\nready"


def test_disagreements_pairs_by_line_and_rule(nc) -> None:
    npd = nc.parse_npd_output(RECORDED_HARNESS)
    ours = [
        match(nc, 1, 0, "oom-kill:constraint=NONE", reason="OOMEither"),
        match(nc, 2, 1, "ready", reason="DockerHung", type="permanent", condition="KernelDeadlock"),
        match(nc, 3, 1, "later", reason="DockerHung", type="permanent", condition="KernelDeadlock"),
    ]
    found = nc.disagreements(npd, ours)
    assert [(d.key, d.kind) for d in found] == [((2, 0), "only NPD"), ((3, 1), "only ours")]
    ours[0] = match(nc, 1, 0, "other text", reason="OOMEither")
    assert [d.kind for d in nc.disagreements(npd, ours)][0] == "different message"


# --- classification: (pattern, lines, recorded disagreement, counterfactual evidence) -> point -----------

ALTERNATION_LINES = ["oom-kill:constraint=NONE", "systemd[1]: Started Session 7 of user core."]


def test_alternation_needs_the_grouped_run_and_a_top_level_bar(nc) -> None:
    d = nc.Disagreement(line=2, rule=0, npd=match(nc, 2, 0, "\n".join(ALTERNATION_LINES)), ours=None)
    f = facts(nc, ["oom-kill|Out of memory"], ALTERNATION_LINES)
    assert nc.classify(d, f, vanishes={nc.GROUPED}) == (nc.ALTERNATION,)
    assert nc.classify(d, f, vanishes=()) == (nc.UNEXPLAINED,)  # no evidence from the grouped run
    grouped = facts(nc, ["(?:oom-kill|Out of memory)"], ALTERNATION_LINES)
    assert nc.classify(d, grouped, vanishes={nc.GROUPED}) == (nc.UNEXPLAINED,)  # nothing to group


def test_lookback_needs_an_old_record_in_the_window(nc) -> None:
    hung = "INFO: task docker:20744 blocked for more than 120 seconds."
    d = nc.Disagreement(line=1, rule=0, npd=None, ours=match(nc, 1, 0, hung, type="permanent"))
    old = facts(nc, [r"task docker:\d+ blocked"], [hung], ages=[900.0])
    assert nc.classify(d, old, vanishes={nc.NO_LOOKBACK}) == (nc.LOOKBACK,)
    recent = facts(nc, [r"task docker:\d+ blocked"], [hung], ages=[10.0])
    assert nc.classify(d, recent, vanishes={nc.NO_LOOKBACK}) == (nc.UNEXPLAINED,)


def test_alternation_and_lookback_together(nc) -> None:
    d = nc.Disagreement(line=2, rule=0, npd=match(nc, 2, 0, "x"), ours=None)
    f = facts(nc, ["a|b"], ["a", "c"], ages=[900.0, 0.0])
    assert nc.classify(d, f, vanishes={nc.BOTH}) == (nc.ALTERNATION, nc.LOOKBACK)
    assert nc.is_documented((nc.ALTERNATION, nc.LOOKBACK))


def test_empty_pattern_is_a_refused_rule_with_no_pattern(nc) -> None:
    d = nc.Disagreement(line=1, rule=0, npd=match(nc, 1, 0, "anything"), ours=None)
    f = facts(nc, [""], ["anything"], refused={0: "must not be empty"})
    assert nc.classify(d, f) == (nc.EMPTY_PATTERN,)
    other = facts(nc, ["[a-z]{1000}{1000}"], ["anything"], refused={0: "too large"})
    assert nc.classify(d, other) == (nc.REFUSED,)
    assert not nc.is_documented((nc.REFUSED,))


EXT4 = "EXT4-fs error (device sda1): ext4_find_entry:1455: inode #2: comm ls: reading directory lblock 0"


@pytest.mark.parametrize(
    ("pattern", "line", "vanishes", "expected"),
    [
        ("^EXT4-fs error .*", 1, {"prefilled"}, ("start-anchor",)),
        (r"\AEXT4-fs error .*", 1, {"prefilled"}, ("start-anchor",)),
        ("^EXT4-fs error .*", 1, set(), ("unexplained",)),  # the prefilled run must agree
        ("^EXT4-fs error .*", 11, {"prefilled"}, ("unexplained",)),  # NPD's buffer was full by then
        ("EXT4-fs error .*", 1, {"prefilled"}, ("empty-slots",)),  # not anchored: outside the table
    ],
)
def test_start_anchor_only_before_the_buffer_fills(nc, pattern, line, vanishes, expected) -> None:
    texts = [EXT4 if n in (1, 11) else f"filler {n}" for n in range(1, 12)]
    d = nc.Disagreement(line=line, rule=0, npd=None, ours=match(nc, line, 0, EXT4))
    assert nc.classify(d, facts(nc, [pattern], texts), vanishes=vanishes) == expected


def test_empty_slots_are_evidence_only_when_one_side_is_silent(nc) -> None:
    f = facts(nc, [r"\nCall Trace:"], ["Call Trace:"])
    npd_only = nc.Disagreement(line=1, rule=0, npd=match(nc, 1, 0, "Call Trace:"), ours=None)
    assert nc.classify(npd_only, f, vanishes={nc.PREFILLED}) == (nc.EMPTY_SLOTS,)
    both = nc.Disagreement(line=1, rule=0, npd=match(nc, 1, 0, "Call Trace:"), ours=match(nc, 1, 0, "other"))
    assert nc.classify(both, f, vanishes={nc.PREFILLED}) == (nc.UNEXPLAINED,)


def test_kmsg_record_layer(nc) -> None:
    link = "mlx5_core 0000:4b:00.0 enp75s0np0: Link down"
    d = nc.Disagreement(line=1, rule=0, npd=None, ours=match(nc, 1, 0, link))
    with_dict = facts(
        nc, [".* Link down"], [link], kmsg=[f"6,1,0,-;{link}\n SUBSYSTEM=pci\n DEVICE=+pci:0000:4b:00.0\n"]
    )
    assert nc.classify(d, with_dict) == (nc.KMSG_DICTIONARY,)
    tab = "nvme nvme0: I/O 17 QID 3 timeout,\treset controller"
    escaped = facts(nc, [r"timeout,\s+reset"], [tab], kmsg=[nc.kmsg_record(1, tab)])
    assert nc.classify(d, escaped) == (nc.KMSG_ESCAPING,)
    plain = facts(nc, [r"timeout,\s+reset"], [tab])  # not sent as a record: nothing escaped
    assert nc.classify(d, plain) == (nc.UNEXPLAINED,)
    newline = facts(nc, ["first line.*"], ["first line\nsecond line"])
    assert nc.classify(d, newline) == (nc.EMBEDDED_NEWLINE,)


def test_line_break_start(nc) -> None:
    hung = "INFO: task docker:20744 blocked for more than 120 seconds."
    assert nc.line_break_start("Call Trace:", f"{hung}\nCall Trace:")
    assert nc.line_break_start("alpha gamma", "\nalpha gamma")  # the line before was empty
    assert not nc.line_break_start("Call Trace:", f"a\n{hung}\nCall Trace:")  # two lines more
    assert not nc.line_break_start("Call Trace:", "Call Trace:")
    d = nc.Disagreement(
        line=2, rule=0, npd=match(nc, 2, 0, "Call Trace:"), ours=match(nc, 2, 0, f"{hung}\nCall Trace:")
    )
    assert nc.classify(d, facts(nc, [r"\s*Call Trace:"], [hung, "Call Trace:"])) == (nc.LINE_BREAK_START,)


def test_summary_counts_points_and_the_rest(nc) -> None:
    stream = nc.Stream(
        name="s",
        config={"rules": [{"pattern": "a|b"}, {"pattern": ""}]},
        records=(nc.Record(text="a"), nc.Record(text="c")),
        lookback="5m",
    )
    d1 = nc.Disagreement(line=2, rule=0, npd=match(nc, 2, 0, "a\nc"), ours=None)
    d2 = nc.Disagreement(line=1, rule=1, npd=match(nc, 1, 1, "a"), ours=None)
    d3 = nc.Disagreement(line=2, rule=1, npd=match(nc, 2, 1, "c"), ours=None)
    result = nc.StreamResult(
        stream=stream,
        npd=[match(nc, 1, 0, "a"), d1.npd, d2.npd, d3.npd],
        ours=[match(nc, 1, 0, "a")],
        refused={1: "must not be empty"},
        verdicts=[(d1, (nc.ALTERNATION,)), (d2, (nc.EMPTY_PATTERN,)), (d3, (nc.UNEXPLAINED,))],
    )
    s = nc.summary([result])
    assert (s["decisions"], s["agreements"], s["disagreements"]) == (4, 1, 3)
    assert (s["npd_matches"], s["our_matches"]) == (4, 1)
    assert s["by_point"] == {"alternation": 1, "empty-pattern": 1}
    assert s["outside_table"] == {"unexplained": 1}


# --- the kmsg record format, inputs, and our side --------------------------------------------------------


def test_kernel_escape_is_undone_by_our_kmsg_parser(nc) -> None:
    from agent.sources.kmsg.format import parse_record

    text = "tab\there, caf\u00e9, back\\slash, line\nbreak"
    record = nc.kmsg_record(7, text)
    assert record == "6,7,0,-;tab\\x09here, caf\\xc3\\xa9, back\\x5cslash, line\\x0abreak\n"
    assert parse_record(record.encode(), boot_time=0.0).message == text


def test_inputs(nc, tmp_path: Path) -> None:
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"rules": [{"type": "temporary", "reason": "R", "pattern": "x"}]}))
    log = tmp_path / "dmesg.txt"
    log.write_text("[  12.345678] EXT4-fs error (device sda1): x\n{1}[Hardware Error]: event severity: fatal\n")
    (stream,) = nc.load_streams(log, rules=rules, lookback="5m", kmsg_records=False)
    assert [r.text for r in stream.records] == [
        "EXT4-fs error (device sda1): x",
        "{1}[Hardware Error]: event severity: fatal",
    ]
    jsonl = tmp_path / "lines.jsonl"
    entries = [
        {"text": "Nov 22 14:56:44 host kernel: a message"},
        {"message": "  kept as is  ", "age": 900},
        {"kmsg": "6,5,0,-;dev: Link down\n SUBSYSTEM=pci"},
    ]
    jsonl.write_text("".join(json.dumps(e) + "\n" for e in entries))
    (stream,) = nc.load_streams(jsonl, rules=rules, lookback="5m", kmsg_records=False)
    assert [(r.text, r.age, r.dictionary) for r in stream.records] == [
        ("a message", 0.0, False),
        ("  kept as is  ", 900.0, False),
        ("dev: Link down", 0.0, True),
    ]
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps({"cases": [{"name": "c", "bufferSize": 4, "rules": [], "lines": ["a1", "b2"]}]}))
    (stream,) = nc.load_streams(cases, rules=None, lookback="5m", kmsg_records=True)
    assert (stream.name, stream.buffer_size, stream.records[1].kmsg) == ("c", 4, "6,2,0,-;b2\n")
    with pytest.raises(nc.Unusable, match="needs --rules"):
        nc.load_streams(log, rules=None, lookback="5m", kmsg_records=False)


def test_our_side_maps_rules_refuses_the_empty_pattern_and_replays(nc) -> None:
    (stream,) = nc.cases_streams(
        [
            {
                "name": "ours",
                "rules": [
                    {"type": "temporary", "reason": "Anything", "pattern": ""},
                    {"type": "temporary", "reason": "TaskHung", "pattern": r"task \S+:\d+ blocked for .*"},
                    {
                        "type": "permanent",
                        "condition": "KernelDeadlock",
                        "reason": "DockerHung",
                        "pattern": r"task docker:\d+ blocked for .*",
                    },
                ],
                "lines": [
                    {"message": "INFO: task docker:1 blocked for more than 120 seconds.", "age": 900},
                    {"message": "INFO: task docker:2 blocked for more than 120 seconds.", "age": 1},
                ],
            }
        ],
        lookback="5m",
        kmsg_records=False,
        origin="t",
    )
    run = nc.run_ours(stream)
    assert set(run.refused) == {0}
    # The old record only rebuilds the permanent condition; the recent one fires both rules.
    assert [(m.line, m.rule, m.reason) for m in run.matches] == [
        (1, 2, "DockerHung"),
        (2, 1, "TaskHung"),
        (2, 2, "DockerHung"),
    ]
    everything = nc.run_ours(stream, lookback=math.inf)
    assert [(m.line, m.rule) for m in everything.matches] == [(1, 1), (1, 2), (2, 1), (2, 2)]


def test_compare_stream_with_recorded_npd_runs(nc, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole loop, NPD's side replaced by what the legacy harness printed for each run."""
    (stream,) = nc.cases_streams(
        [
            {
                "name": "alternation",
                "rules": [{"type": "temporary", "reason": "OOM", "pattern": "oom-kill|Out of memory"}],
                "lines": ALTERNATION_LINES,
            }
        ],
        lookback="5m",
        kmsg_records=False,
        origin="t",
    )
    legacy = [
        match(nc, 1, 0, ALTERNATION_LINES[0], reason="OOM"),
        match(nc, 2, 0, "\n".join(ALTERNATION_LINES), reason="OOM"),
    ]

    def recorded(harness, s, *, group=False, lookback=None):
        if group or len(s.records) > len(stream.records):  # grouped, or prefilled: NPD anchors every branch
            return []
        return legacy

    monkeypatch.setattr(nc, "run_npd", recorded)
    result = nc.compare_stream(Path("unused"), stream)
    assert [(d.key, v) for d, v in result.verdicts] == [((1, 0), ("alternation",)), ((2, 0), ("alternation",))]


def test_exit_2_without_a_harness(nc, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert nc.main(["--adversarial"]) == nc.EXIT_UNUSABLE
    assert "harness is not given" in capsys.readouterr().err
    missing = tmp_path / "npd-harness"
    assert nc.main(["--npd-harness", str(missing), "--adversarial"]) == nc.EXIT_UNUSABLE
    assert "not built" in capsys.readouterr().err
    missing.write_text("not executable")
    assert nc.main(["--npd-harness", str(missing), "--adversarial"]) == nc.EXIT_UNUSABLE


def test_exit_status_follows_the_verdicts(nc, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    harness = tmp_path / "npd-harness"
    harness.write_text("#!/bin/sh\necho recorded\n")
    harness.chmod(0o755)
    stream = nc.Stream(name="s", config={"rules": [{"pattern": "a|b"}]}, records=(nc.Record(text="a"),), lookback="5m")
    d = nc.Disagreement(line=1, rule=0, npd=match(nc, 1, 0, "a"), ours=None)
    monkeypatch.setattr(nc, "cases_streams", lambda *a, **k: [stream])
    for verdict, status in [
        ((nc.ALTERNATION,), nc.EXIT_OK),
        ((nc.KMSG_DICTIONARY,), nc.EXIT_OK),
        ((nc.UNEXPLAINED,), nc.EXIT_OUTSIDE),
    ]:
        result = nc.StreamResult(stream=stream, npd=[d.npd], ours=[], refused={}, verdicts=[(d, verdict)])
        monkeypatch.setattr(nc, "compare_stream", lambda h, s, result=result: result)
        assert nc.main(["--npd-harness", str(harness), "--adversarial"]) == status


def test_adversarial_cases_load_on_our_side(nc) -> None:
    """Every built-in case is a valid stream for our loader (the empty pattern aside, refused as documented)."""
    streams = nc.cases_streams(nc.ADVERSARIAL_CASES, lookback="5m", kmsg_records=False, origin="adversarial")
    for stream in streams:
        run = nc.run_ours(stream)
        assert all(stream.rules[i]["pattern"] == "" for i in run.refused), stream.name
