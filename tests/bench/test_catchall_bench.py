"""bench/catchall.py: events a day from a log's levels and times."""

from __future__ import annotations

from pathlib import Path

from agent.app.config import load_rule_set
from bench.catchall import DAY, per_day, records_of

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"


def test_events_a_day_from_the_logs_span():
    rule_set = load_rule_set([PLUGINS / "kernel", PLUGINS / "nvidia", PLUGINS / "neuron"])
    lines = [
        "<3>[    1.000000] ACPI BIOS Error (bug): Could not resolve symbol [\\_SB.X], AE_NOT_FOUND",  # benign
        "<3>[    2.000000] DMAR: DRHD: unhandled state 2",  # an Event
        "<6>[86401.000000] eth0: link up",
        "3,5,172801000000,-;DMAR: DRHD: unhandled state 3",  # a new window: an Event
        "not a record",
    ]
    records = records_of(lines)
    assert [(r.priority, r.facility) for r in records] == [(3, 0), (3, 0), (6, 0), (3, 0)]
    day = per_day("test", records, rule_set)
    assert (day.records, day.severe, day.events) == (4, 3, 2)
    assert day.span_s == 172800.0 and day.per_day == 2 / (172800.0 / DAY)
