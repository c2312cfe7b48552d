"""``Memo``: a value built again only when its key changes; ``SteadyFamilies``: a family kept as the same
object while it is written alike (the metrics collectors' families, issue 16)."""

from __future__ import annotations

import pytest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from agent.core.memo import Memo, SteadyFamilies


def test_builds_once_per_run_of_equal_keys() -> None:
    built: list[tuple[int, ...]] = []

    def build(key: tuple[int, ...]) -> list[int]:
        built.append(key)
        return list(key)

    memo: Memo[tuple[int, ...], list[int]] = Memo(build)
    first = memo((1, 2))
    assert memo((1, 2)) is first  # an equal key, another object: the same value
    assert memo((1, 3)) == [1, 3]
    assert memo((1, 2)) == [1, 2] and memo((1, 2)) is not first  # only the last key is kept
    assert built == [(1, 2), (1, 3), (1, 2)]


def test_a_key_that_is_not_equal_to_itself_builds_every_time() -> None:
    nan = float("nan")
    calls = []
    memo: Memo[tuple[float, ...], int] = Memo(lambda key: calls.append(key) or len(calls))
    assert memo((nan, 1.0)) != memo((float("nan"), 1.0))
    assert len(calls) == 2


def _gauge(value: float, *, name: str = "g", doc: str = "help", labels: dict[str, str] | None = None):
    family = GaugeMetricFamily(name, doc, labels=list(labels or {}))
    family.add_metric(list((labels or {}).values()), value)
    return family


@pytest.mark.parametrize(
    ("before", "after", "kept"),
    [
        (_gauge(1.0), _gauge(1.0), True),
        (_gauge(1.0), _gauge(2.0), False),
        (_gauge(0.0), _gauge(-0.0), False),  # written "0.0" and "-0.0"
        (_gauge(-0.0), _gauge(-0.0), True),
        (_gauge(float("nan")), _gauge(float("nan")), False),  # NaN is never equal: written again
        (_gauge(1.0), _gauge(1.0, doc="other help"), False),
        (_gauge(1.0, labels={"a": "x"}), _gauge(1.0, labels={"a": "y"}), False),
        (_gauge(1.0), CounterMetricFamily("g", "help", value=1.0), False),
    ],
    ids=["equal", "value", "zero-sign", "negative-zero", "nan", "help", "label", "type"],
)
def test_a_family_written_alike_is_handed_back_as_the_same_object(before, after, kept) -> None:
    steady = SteadyFamilies()
    assert steady([before]) == (before,)
    (got,) = steady([after])
    assert (got is before) is kept and (got is after) is not kept


def test_steady_families_keeps_every_family_in_order_and_forgets_what_is_gone() -> None:
    steady = SteadyFamilies()
    a, b = _gauge(1.0, name="a"), _gauge(2.0, name="b")
    assert steady([a, b]) == (a, b)
    a2, c = _gauge(1.0, name="a"), _gauge(3.0, name="c")
    assert steady([c, a2]) == (c, a)  # a stands: the old object; b is gone
    b2 = _gauge(2.0, name="b")
    assert steady([b2])[0] is b2  # b came back after a call without it: not remembered
