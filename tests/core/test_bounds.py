"""agent.core.bounds: how a reason or message of any length is cut, and how distinct reasons are bounded."""

from __future__ import annotations

import hashlib

import pytest

from agent.core.bounds import (
    MAX_MESSAGE,
    MAX_REASON,
    OVERFLOW_REASON,
    ProblemCounts,
    bounded_message,
    bounded_reason,
    counted_reason,
)

LONG = "NeuronHasError_" + "X" * 300


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("NeuronHasError_DMA_ERROR", "NeuronHasError_DMA_ERROR"),  # real reasons never change
        ("GpuXid79", "GpuXid79"),
        ("R" * MAX_REASON, "R" * MAX_REASON),
        ("R" * (MAX_REASON + 1), "R" * (MAX_REASON - 9) + "_" + digest("R" * (MAX_REASON + 1))),
        (LONG, LONG[: MAX_REASON - 9] + "_" + digest(LONG)),
        ("é" * 64, "é" * 64),  # 128 bytes: fits
        ("é" * 65, "é" * 59 + "_" + digest("é" * 65)),  # never a half character
    ],
    ids=["neuron", "xid", "at-limit", "one-over", "300-char-type", "utf8-at-limit", "utf8-over"],
)
def test_a_reason_is_kept_or_cut_to_128_bytes_with_a_digest(reason, expected):
    assert bounded_reason(reason) == expected
    assert len(bounded_reason(reason).encode()) <= MAX_REASON
    assert bounded_reason(bounded_reason(reason)) == bounded_reason(reason), "cutting twice changes nothing"


def test_distinct_long_reasons_stay_distinct_and_the_same_one_is_always_cut_alike():
    a, b = LONG + "A", LONG + "B"
    assert bounded_reason(a) != bounded_reason(b)
    assert bounded_reason(a) == bounded_reason(LONG + "A")


@pytest.mark.parametrize(
    ("message", "length"),
    [("x" * 10, 10), ("x" * MAX_MESSAGE, MAX_MESSAGE), ("x" * (MAX_MESSAGE + 1), MAX_MESSAGE), ("€" * 400, 1023)],
    ids=["short", "at-limit", "one-over", "utf8"],
)
def test_a_message_is_cut_to_1_kib_of_utf8(message, length):
    cut = bounded_message(message)
    assert len(cut.encode()) == length
    assert cut.endswith("...") == (len(message.encode()) > MAX_MESSAGE)


def test_a_lone_surrogate_cannot_reach_a_sink():
    assert bounded_reason("Bad\udc80") == "Bad?"
    assert bounded_message("Bad\udc80") == "Bad?"


def test_each_owner_counts_a_bounded_number_of_undeclared_reasons_and_the_rest_as_other():
    counts = ProblemCounts(reasons=["OOMKilling"], pairs=[("GpuXid", "GpuXid79")], limit=3)
    for i in range(10):
        counts.count("NeuronHealth", f"NeuronHasError_T{i}")
        counts.pair("NeuronHealth", f"NeuronHasError_T{i}")
    counts.count("kernel/oom", "OOMKilling")  # declared: never limited
    counts.count("GpuXid", "GpuXid79")
    counts.pair("GpuXid", "GpuXid79")
    counts.count("GpuXid", "GpuXid48")  # another owner has its own room
    assert counts.counts == {
        "OOMKilling": 1,
        "NeuronHasError_T0": 1,
        "NeuronHasError_T1": 1,
        "NeuronHasError_T2": 1,
        OVERFLOW_REASON: 7,
        "GpuXid79": 1,
        "GpuXid48": 1,
    }
    assert counts.pairs == (
        ("GpuXid", "GpuXid79"),
        ("NeuronHealth", "NeuronHasError_T0"),
        ("NeuronHealth", "NeuronHasError_T1"),
        ("NeuronHealth", "NeuronHasError_T2"),
        ("NeuronHealth", OVERFLOW_REASON),
    )
    assert counts.overflowed == {"NeuronHealth": 7}


@pytest.mark.parametrize(
    ("condition", "reason", "expected"),
    [
        ("NeuronHealth", "NeuronHasError_T0", "NeuronHasError_T0"),  # listed
        ("NeuronHealth", "NeuronHasError_T9", OVERFLOW_REASON),  # not listed, the condition overflowed
        ("GpuXid", "GpuXid48", "GpuXid48"),  # not listed, no overflow: its own name
    ],
)
def test_counted_reason(condition, reason, expected):
    pairs = {("NeuronHealth", "NeuronHasError_T0"), ("NeuronHealth", OVERFLOW_REASON), ("GpuXid", "GpuXid79")}
    assert counted_reason(condition, reason, pairs=pairs) == expected
