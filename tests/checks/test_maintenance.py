"""EC2 scheduled events as ScheduledMaintenance (agent.checks.maintenance): IMDS answers as tables,
served over IMDSv2 by a loopback server (never the real metadata address); the check's ownership."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from agent.adapters.aws import IMDS_MAX_BODY, InstanceMetadata
from agent.app.config import load_configuration
from agent.app.wiring.checks import agent_checks
from agent.checks.maintenance import (
    CONDITION,
    IMDS_PATH,
    MAX_EVENTS,
    EventError,
    ScheduledMaintenanceCheck,
    parse_ec2_time,
    parse_events,
)
from agent.checks.model import CheckContext, CheckStatus
from agent.core.errors import ConfigError
from agent.core.timefmt import read_not_before
from agent.core.types import Provenance, Severity

from helpers.aws import StrictImds, closed_endpoint
from helpers.trickle import TricklingImds

JAN21 = 1_768_986_000.0  # 2026-01-21T09:00:00Z


def event(code: str = "instance-retirement", *, state: str = "active", before: str = "21 Jan 2026 09:00:00 GMT", **kw):
    item = {
        "NotBefore": before,
        "Code": code,
        "Description": kw.pop("description", "The instance is running on degraded hardware"),
        "EventId": kw.pop("event_id", "instance-event-0d59937288b749b32"),
        "NotAfter": kw.pop("after", "21 Jan 2026 09:17:23 GMT"),
        "State": state,
    }
    item.update(kw)
    return item


def imds_body(*events: dict) -> str:
    return json.dumps(list(events), indent=2)


# ---- reading the answer --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("21 Jan 2026 09:00:00 GMT", JAN21),
        ("1 Feb 2026 00:00:00 GMT", 1_769_904_000.0),
        ("29 Feb 2028 12:00:00 UTC", 1_835_438_400.0),
        (" 21 Jan 2026 09:00:00 GMT ", JAN21),
    ],
)
def test_ec2_times(text, expected):
    assert parse_ec2_time(text, field="NotBefore") == expected


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("2026-01-21T09:00:00Z", "is not a time like '21 Jan 2026 09:00:00 GMT'"),
        ("21 Jan 2026 09:00:00 PST", "is not a time like"),
        ("21 Jab 2026 09:00:00 GMT", "is not a time like"),
        ("30 Feb 2026 09:00:00 GMT", "is not a valid date and time"),
        ("21 Jan 2026 25:00:00 GMT", "is not a valid date and time"),
        ("1 Jan 0000 00:00:00 GMT", "is not a valid date and time (year 0000)"),  # no year 0: never a raise
        ("29 Feb 0000 00:00:00 GMT", "is not a valid date and time (year 0000)"),
        ("21 Jan 2026 09:00:00 GMT\n", None),  # a trailing newline is whitespace: fine
        (1768986000, "must be a string like '21 Jan 2026 09:00:00 GMT', got int"),
        (None, "must be a string"),
    ],
)
def test_bad_ec2_times_name_the_field(value, why):
    if why is None:
        assert parse_ec2_time(value, field="event 0.NotBefore") == JAN21
        return
    with pytest.raises(EventError) as refused:
        parse_ec2_time(value, field="event 0.NotBefore")
    assert str(refused.value).startswith("event 0.NotBefore") and why in str(refused.value)


@pytest.mark.parametrize(
    ("body", "reasons", "notes"),
    [
        ("[]", [], []),
        ("", [], []),
        (imds_body(event()), ["ScheduledInstanceRetirement"], []),
        (imds_body(event("instance-reboot")), ["ScheduledInstanceReboot"], []),
        (imds_body(event("system-reboot")), ["ScheduledSystemReboot"], []),
        (imds_body(event("system-maintenance")), ["ScheduledSystemMaintenance"], []),
        (imds_body(event("instance-stop")), ["ScheduledInstanceStop"], []),
        # Completed and canceled events stay listed a while: they do not count (State, or the description's tag).
        (imds_body(event(state="completed"), event(state="canceled")), [], []),
        (imds_body(event(description="[Canceled] scheduled reboot", State="")), [], []),
        (imds_body(event(description="[Completed] scheduled reboot")), [], []),
        # Earliest first, whatever the order listed.
        (
            imds_body(
                event("system-reboot", before="25 Jan 2026 09:00:00 GMT"),
                event("instance-stop", before="22 Jan 2026 09:00:00 GMT"),
            ),
            ["ScheduledInstanceStop", "ScheduledSystemReboot"],
            [],
        ),
        (imds_body(event("instance-melt")), ["ScheduledMaintenanceOther"], ["unknown event code 'instance-melt'"]),
        (imds_body(event(NotAfter="")), ["ScheduledInstanceRetirement"], []),
        (imds_body(event(state="completed", NotBefore="garbage")), [], []),  # done: its dates do not matter
    ],
)
def test_pending_events(body, reasons, notes):
    events, said = parse_events(body)
    assert [e.reason for e in events] == reasons
    assert said == notes


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ("{", "the answer is not JSON"),
        ('{"Code": "system-reboot"}', "the answer must be a JSON list of events, got dict"),
        ('["system-reboot"]', "event 0 must be a JSON object, got str"),
        (imds_body(event(NotBefore="soon")), "event 0.NotBefore 'soon' is not a time like"),
        (imds_body(event(), event(NotAfter="later")), "event 1.NotAfter 'later' is not a time like"),
        (imds_body(event(NotBefore=None)), "event 0.NotBefore must be a string"),
        ("[" * 100_000 + "]" * 100_000, "the answer is not JSON"),
    ],
)
def test_unreadable_answers(body, why):
    with pytest.raises(EventError) as refused:
        parse_events(body)
    assert why in str(refused.value)


def test_hostile_text_is_cut_and_cleaned_and_events_are_bounded():
    many = [event(EventId=f"e-{i}\x1b[31m" + "x" * 500, Code="odd\ncode") for i in range(MAX_EVENTS + 10)]
    events, notes = parse_events(json.dumps(many))
    assert len(events) == MAX_EVENTS
    assert notes[0] == f"{MAX_EVENTS + 10} events listed, the first {MAX_EVENTS} looked at"
    assert all(len(e.event_id) <= 120 and "\x1b" not in e.event_id for e in events)
    assert events[0].code == "odd code"


# ---- the check, over IMDSv2 ----------------------------------------------------------------------


def check_at(imds: StrictImds) -> ScheduledMaintenanceCheck:
    return ScheduledMaintenanceCheck(fetch=InstanceMetadata(endpoint=imds.endpoint, environ={}).get)


@pytest.mark.parametrize(
    ("answer", "status", "reason", "message_start"),
    [
        ("[]", CheckStatus.OK, "NoScheduledMaintenance", "no EC2 scheduled event is pending"),
        (
            imds_body(event()),
            CheckStatus.PROBLEM,
            "ScheduledInstanceRetirement",
            "notBefore=2026-01-21T09:00:00Z EC2 scheduled event: instance-retirement 2026-01-21T09:00:00Z to "
            "2026-01-21T09:17:23Z (instance-event-0d59937288b749b32: The instance is running on degraded hardware)",
        ),
        (imds_body(event(state="completed")), CheckStatus.OK, "NoScheduledMaintenance", "no EC2"),
        (
            imds_body(event("instance-melt")),
            CheckStatus.PROBLEM,
            "ScheduledMaintenanceOther",
            "notBefore=2026-01-21T09:00:00Z EC2 scheduled event: instance-melt",
        ),
        ("not json", CheckStatus.UNKNOWN, "ScheduledEventsUnreadable", "EC2 scheduled events answer refused"),
        # Bigger than the client reads (64 KiB): cut, so no longer JSON: unreadable, never a crash.
        (
            imds_body(*[event() for _ in range(IMDS_MAX_BODY // 200)]),
            CheckStatus.UNKNOWN,
            "ScheduledEventsUnreadable",
            "EC2 scheduled events answer refused: the answer is not JSON",
        ),
        (None, CheckStatus.UNKNOWN, "ImdsUnavailable", "cannot read EC2 scheduled events: instance metadata GET"),
        # Year 0000 (no such year): the check says so, it does not raise.
        (
            imds_body(event(before="1 Jan 0000 00:00:00 GMT")),
            CheckStatus.UNKNOWN,
            "ScheduledEventsUnreadable",
            "EC2 scheduled events answer refused: event 0.NotBefore '1 Jan 0000 00:00:00 GMT' is not a valid date",
        ),
    ],
)
def test_the_check_reads_imds(answer, status, reason, message_start):
    metadata = {} if answer is None else {IMDS_PATH.removeprefix("meta-data/"): answer}
    with StrictImds(metadata=metadata) as imds:
        (result,) = check_at(imds).run()
        assert imds.puts == 1  # an IMDSv2 token first, as for the instance id
    assert (result.status, result.condition, result.reason) == (status, CONDITION, reason)
    assert result.message.startswith(message_start), result.message
    if status is CheckStatus.PROBLEM:
        assert result.severity is Severity.WARNING
        assert read_not_before(result.message) == JAN21


def test_the_token_is_reused_and_renewed_once_revoked():
    key = IMDS_PATH.removeprefix("meta-data/")
    with StrictImds(metadata={key: "[]"}) as imds:
        check = check_at(imds)
        check.run()
        check.run()
        assert imds.puts == 1
        imds.revoke()
        (result,) = check.run()
        assert imds.puts == 2 and result.status is CheckStatus.OK


@pytest.mark.parametrize("token_status", [403, 500])
def test_a_refused_token_is_unknown(token_status):
    with StrictImds(metadata={}, token_status=token_status) as imds:
        (result,) = check_at(imds).run()
    assert result.status is CheckStatus.UNKNOWN and result.reason == "ImdsUnavailable"
    assert f"HTTP {token_status}" in result.message


def test_no_metadata_service_is_unknown():
    check = ScheduledMaintenanceCheck(fetch=InstanceMetadata(endpoint=closed_endpoint(), environ={}).get)
    (result,) = check.run()
    assert result.status is CheckStatus.UNKNOWN and "cannot be reached" in result.message


@pytest.mark.parametrize(
    "trickles",
    [
        "token",  # the PUT's answer, a byte at a time
        "head",  # the GET's status line and headers
        "body",  # the GET's body (after a complete head)
    ],
)
def test_a_trickling_answer_ends_at_the_clients_deadline(trickles):
    # Each byte comes well within the per-operation timeout (2 s), so only a whole-request deadline ends it;
    # the client's is injected small (0.3 s) and the check is UNKNOWN with the timeout as its reason.
    with TricklingImds(trickles=trickles, every=0.05) as imds:
        metadata = InstanceMetadata(endpoint=imds.endpoint, environ={}, timeout=2.0, deadline=0.3)
        (result,) = ScheduledMaintenanceCheck(fetch=metadata.get).run()
        assert imds.trickled  # the server did trickle (the request reached that part)
    assert (result.status, result.reason) == (CheckStatus.UNKNOWN, "ImdsTimeout")
    assert "did not finish answering within 0.3s" in result.message, result.message


def test_the_check_polls_again_after_a_trickling_answer():
    # The deadline frees the caller: the next run reads the (now prompt) answer.
    with TricklingImds(trickles="body", every=0.05, after=1, body="[]") as imds:
        check = ScheduledMaintenanceCheck(
            fetch=InstanceMetadata(endpoint=imds.endpoint, environ={}, timeout=2.0, deadline=0.3).get
        )
        first, second = check.run()[0], check.run()[0]
    assert (first.status, first.reason) == (CheckStatus.UNKNOWN, "ImdsTimeout")
    assert (second.status, second.reason) == (CheckStatus.OK, "NoScheduledMaintenance")


# ---- the agent owns the condition ----------------------------------------------------------------


class Flags:
    scheduled_maintenance = True


def small_pack(tmp_path: Path, condition: str = "SomethingElse") -> Path:
    pack = tmp_path / "pack.yaml"
    pack.write_text(
        textwrap.dedent(
            f"""
            plugin: kmsg
            source: mine
            conditions:
              - type: {condition}
                reason: Fine
                message: fine
            rules: []
            """
        )
    )
    return pack


def test_the_flag_adds_the_agents_check_and_its_condition(tmp_path):
    assert agent_checks(type("Off", (), {"scheduled_maintenance": False})()) == ()  # type: ignore[arg-type]
    (scheduled,) = agent_checks(Flags())  # type: ignore[arg-type]
    assert (scheduled.interval, scheduled.failure_threshold, scheduled.success_threshold) == (300.0, 1, 1)
    pack = small_pack(tmp_path)
    loaded = load_configuration([pack], context=CheckContext(state_dir=tmp_path), agent_checks=[scheduled])
    owned = {s.type: s.provenance for s in loaded.conditions}
    assert owned[CONDITION] is Provenance.BUILTIN_CHECK
    assert loaded.checks[-1] is scheduled
    # A reload keeps it (the watcher passes only the previous generation).
    again = load_configuration([pack], context=CheckContext(state_dir=tmp_path), previous=loaded)
    assert again.checks[-1] is scheduled and CONDITION in {s.type for s in again.conditions}


def test_a_plugin_declaring_the_condition_is_refused(tmp_path):
    pack = small_pack(tmp_path, CONDITION)
    (scheduled,) = agent_checks(Flags())  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as refused:
        load_configuration([pack], context=CheckContext(state_dir=tmp_path), agent_checks=[scheduled])
    assert "condition type 'ScheduledMaintenance' is declared by" in str(refused.value)
    assert "the agent (--scheduled-maintenance)" in str(refused.value)
