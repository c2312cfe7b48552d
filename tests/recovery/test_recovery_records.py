"""Every record recovery reads back from the cluster, checked by one set of rules (agent.recovery.fields).

One table over every field of every record (the budget Lease, the pause Lease, the incident, the ladder's
history, the flap record, the reboot attempt ledger) with hostile values: an integer too large for a float,
NaN, the infinities, -1e308, steps below 0 and past the ladder, wrong types, over-long strings. Each is
corrupt, named by record and field, and raises only the record's documented error (or returns the codec's
"corrupt" result): never OverflowError, IndexError, TypeError or ValueError of another kind.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from agent.recovery.attempt import ATTEMPT_ANNOTATION, parse_attempt
from agent.recovery.budget import CorruptBudget, decode_state
from agent.recovery.fields import MAX_RECORD, CorruptRecord
from agent.recovery.flaps import FLAP_ANNOTATION, parse_flaps
from agent.recovery.holds import CorruptPauses, decode_pauses
from agent.recovery.ladder import HISTORY_ANNOTATION, parse_history
from agent.recovery.model import INCIDENT_ANNOTATION
from agent.recovery.node import parse_incident

NOW = 1_767_225_600.0
BIG = "1" + "0" * 400  # a JSON integer too large for a float
HOLE = "__HOSTILE__"

TIME = [BIG, "-" + BIG, "NaN", "Infinity", "-Infinity", "-1e308", "1e308", "-1", "1e400", "true", '"now"', "[]", "{}"]
INT = [BIG, "-5", "1000000", "1.5", "true", '"1"', "NaN", "Infinity", "-1e308", "null"]
TEXT = ['"' + "x" * 5000 + '"', "3", "true", "[]", "{}", BIG, "NaN"]
FLAG = ['"yes"', "1", BIG, "null", "[]"]
CHOICE = ['"nope"', "3", BIG, "[]", "null"]
LIST = ['"x"', "{}", BIG, "NaN", "true", "[" + ",".join(["1"] * 5000) + "]"]
OBJECT = ['"x"', "[]", BIG, "3", "null"]


def on_node(annotation: str) -> Callable[[str], str]:
    def read(text: str) -> str:
        node = {"metadata": {"name": "n", "annotations": {annotation: text}}}
        if annotation == INCIDENT_ANNOTATION:
            return parse_incident(node, now=NOW)[1]
        if annotation == FLAP_ANNOTATION:
            return parse_flaps(node, now=NOW)[1]
        if annotation == ATTEMPT_ANNOTATION:
            return parse_attempt(node, now=NOW)[1]
        return parse_history(node, now=NOW).problem

    return read


def raising(decode: Callable[[str], Any], error: type[CorruptRecord]) -> Callable[[str], str]:
    def read(text: str) -> str:
        try:
            decode(text)
        except error as exc:  # only the documented type: anything else fails the test
            return str(exc)
        return ""

    return read


READ = {
    "budget": raising(decode_state, CorruptBudget),
    "pauses": raising(decode_pauses, CorruptPauses),
    "incident": on_node(INCIDENT_ANNOTATION),
    "history": on_node(HISTORY_ANNOTATION),
    "flaps": on_node(FLAP_ANNOTATION),
    "attempt": on_node(ATTEMPT_ANNOTATION),
}
RUNG = {
    "incident": "GpuXid/GpuXid79/n/1",
    "condition": "GpuXid",
    "reason": "GpuXid79",
    "remedy": "reboot",
    "step": 0,
    "at": NOW - 600,
    "boot": "boot-1",
    "window": 1200.0,
    "outcome": "ok",
    "message": "instance i-1",
    "finishedAt": NOW - 300,
    "finishedBoot": "boot-2",
    "windowEnd": NOW + 900,
}
VALID: dict[str, dict[str, Any]] = {
    "budget": {
        "version": 1,
        "holders": {"d": {"nodes": ["n1"], "incident": "i", "since": NOW}},
        "actions": [NOW],
    },
    "pauses": {"version": 1, "pauses": [{"scope": "node", "value": "n1", "by": "a", "why": "w", "since": NOW}]},
    "incident": {
        "id": "GpuXid/GpuXid79/n/1",
        "condition": "GpuXid",
        "reason": "GpuXid79",
        "since": NOW - 10,
        "opened": NOW,
        "done": ["cordon"],
        "cordonedByUs": True,
        "drain": "done",
        "budgetHeld": True,
        "healthySince": NOW,
        "dryRun": False,
        "claim": "token",
        "claimedAt": NOW,
        "evidence": ["/var/lib/x.json.gz"],
    },
    "history": {"rungs": [RUNG], "opened": [{"incident": "GpuXid/GpuXid79/n/1", "condition": "GpuXid", "at": NOW}]},
    "flaps": {"count": 2, "lastUncordon": NOW},
    "attempt": {
        "incident": "GpuXid/GpuXid79/n/1",
        "remedy": "reboot",
        "state": "finished",
        "boot": "boot-1",
        "at": NOW - 600,
        "deadline": NOW + 300,
        "finishedAt": NOW - 300,
        "finishedBoot": "boot-2",
        "message": "instance i-1",
    },
}
# (record, the path to the field in VALID, its name in the error, the hostile values)
FIELDS: list[tuple[str, tuple[Any, ...], str, list[str]]] = [
    ("budget", ("version",), "version", INT),
    ("budget", ("holders",), "holders", OBJECT),
    ("budget", ("holders", "d"), "holders['d']", OBJECT),
    ("budget", ("holders", "d", "nodes"), "holders['d'].nodes", [*LIST, "[]"]),
    ("budget", ("holders", "d", "nodes", 0), "holders['d'].nodes[0]", [*TEXT, '""']),
    ("budget", ("holders", "d", "incident"), "holders['d'].incident", TEXT),
    ("budget", ("holders", "d", "since"), "holders['d'].since", TIME),
    ("budget", ("actions",), "actions", LIST[:-1]),
    ("budget", ("actions", 0), "actions[0]", TIME),
    ("pauses", ("version",), "version", INT),
    ("pauses", ("pauses",), "pauses", LIST[:-1]),
    ("pauses", ("pauses", 0), "pauses[0]", OBJECT),
    ("pauses", ("pauses", 0, "scope"), "pauses[0].scope", CHOICE),
    *(("pauses", ("pauses", 0, key), f"pauses[0].{key}", TEXT) for key in ("value", "by", "why")),
    ("pauses", ("pauses", 0, "since"), "pauses[0].since", TIME),
    *(("incident", (key,), key, TEXT) for key in ("id", "condition", "reason", "drain", "claim")),
    *(("incident", (key,), key, TIME) for key in ("since", "opened", "healthySince", "claimedAt")),
    *(("incident", (key,), key, FLAG) for key in ("cordonedByUs", "budgetHeld", "dryRun")),
    *(("incident", (key,), key, LIST) for key in ("done", "evidence")),
    *(("incident", (key, 0), f"{key}[0]", TEXT) for key in ("done", "evidence")),
    ("history", ("rungs",), "rungs", LIST[:-1]),
    ("history", ("rungs", 0), "rungs[0]", OBJECT),
    *(
        ("history", ("rungs", 0, key), f"rungs[0].{key}", TEXT)
        for key in ("incident", "condition", "reason", "boot", "message", "finishedBoot")
    ),
    *(("history", ("rungs", 0, key), f"rungs[0].{key}", CHOICE) for key in ("remedy", "outcome")),
    ("history", ("rungs", 0, "step"), "rungs[0].step", [*INT, "2"]),  # 2: past a ladder of every remedy once
    *(("history", ("rungs", 0, key), f"rungs[0].{key}", TIME) for key in ("at", "finishedAt", "windowEnd")),
    (
        "history",
        ("rungs", 0, "window"),
        "rungs[0].window",
        [BIG, "-5", "0", "true", '"20m"', "NaN", "Infinity", "1e308"],
    ),
    ("history", ("opened",), "opened", LIST[:-1]),
    ("history", ("opened", 0), "opened[0]", OBJECT),
    *(("history", ("opened", 0, key), f"opened[0].{key}", TEXT) for key in ("incident", "condition")),
    ("history", ("opened", 0, "at"), "opened[0].at", TIME),
    ("flaps", ("count",), "count", [*INT, "0", "65"]),
    ("flaps", ("lastUncordon",), "lastUncordon", TIME),
    *(("attempt", (key,), key, [*TEXT, '""', '"' + "x" * 257 + '"']) for key in ("incident", "boot")),
    *(("attempt", (key,), key, TEXT) for key in ("finishedBoot", "message")),
    ("attempt", ("message",), "message", ['"' + "x" * 301 + '"']),
    *(("attempt", (key,), key, CHOICE) for key in ("remedy", "state")),
    *(("attempt", (key,), key, TIME) for key in ("at", "deadline", "finishedAt")),
]


def with_value(record: str, path: tuple[Any, ...], raw: str) -> str:
    """VALID[record] as JSON text with the field at ``path`` replaced by the raw JSON ``raw``."""
    data = json.loads(json.dumps(VALID[record]))
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = HOLE
    return json.dumps(data).replace(json.dumps(HOLE), raw)


CASES = [
    pytest.param(record, path, name, raw, id=f"{record}:{name}={raw[:12]}")
    for record, path, name, values in FIELDS
    for raw in values
    if not (raw == "null" and name in ("healthySince", "claimedAt", "rungs[0].finishedAt", "rungs[0].windowEnd"))
]


@pytest.mark.parametrize("record", sorted(VALID))
def test_each_valid_record_reads(record):
    assert READ[record](json.dumps(VALID[record])) == ""


@pytest.mark.parametrize(("record", "path", "name", "raw"), CASES)
def test_a_hostile_value_in_any_field_is_corrupt_and_named(record, path, name, raw):
    problem = READ[record](with_value(record, path, raw))
    assert problem.startswith(f"{record}: {name}: "), problem
    assert len(problem) < 2000, "what is told is bounded whatever the value"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{not json", "not JSON"),
        ("[1]", "not a JSON object: a list"),
        ('"x"', "not a JSON object: 'x'"),
        ("[" * 100_000 + "]" * 100_000, "not JSON"),  # nested too deep
        ('{"a": ' + "9" * 5000 + "}", "not JSON"),  # an integer of more digits than Python converts
        ('{"a": "' + "x" * 10_000_000 + '"}', f"more than {MAX_RECORD}"),  # 10 MB
    ],
    ids=["not-json", "list", "string", "deep", "5000-digits", "10MB"],
)
@pytest.mark.parametrize("record", sorted(VALID))
def test_a_record_that_is_not_one_is_corrupt(record, text, says):
    problem = READ[record](text)
    assert problem.startswith(f"{record}: ") and says in problem, problem[:300]


def test_the_step_of_a_rung_must_lie_on_a_ladder():
    """Issue 33: ``step: -5`` raised IndexError at every step; a huge step climbed straight to replace."""
    for step, ok in ((-5, False), (0, True), (1, True), (2, False), (10**400, False)):
        problem = READ["history"](json.dumps({"rungs": [{**RUNG, "step": step}]}))
        assert (problem == "") == ok, (step, problem)


def test_times_far_ahead_of_now_are_corrupt_except_a_window_end_within_its_window():
    read = READ["history"]
    assert read(json.dumps({"rungs": [{**RUNG, "at": NOW + 2 * 86_400}]})).startswith("history: rungs[0].at: is ")
    assert read(json.dumps({"rungs": [{**RUNG, "windowEnd": NOW + 86_400 + 1200}]})) == ""
    assert read(json.dumps({"rungs": [{**RUNG, "windowEnd": NOW + 86_400 + 1201}]})).startswith(
        "history: rungs[0].windowEnd: is "
    )


@pytest.mark.parametrize(("key", "name"), [("extra", "extra"), ("k" * 5000, "k" * 60 + "...")], ids=["short", "5000"])
def test_a_field_the_ledger_does_not_know_is_corrupt_and_named_bounded(key, name):
    problem = READ["attempt"](json.dumps({**VALID["attempt"], key: 1}))
    assert problem.startswith(f"attempt: {name}: is not a field of this record"), problem[:300]
    assert len(problem) < 2000
