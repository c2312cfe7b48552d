"""bench/run.py's side-by-side rounds: each side measured every round, the order reversed every other round."""

from __future__ import annotations

import pytest

from bench.run import _alternating


@pytest.mark.parametrize(
    ("names", "rounds", "order"),
    [
        (["ours", "NPD"], 1, ["ours", "NPD"]),
        (["ours", "NPD"], 2, ["ours", "NPD", "NPD", "ours"]),
        (["ours", "NPD"], 3, ["ours", "NPD", "NPD", "ours", "ours", "NPD"]),
        (["ours"], 2, ["ours", "ours"]),  # NPD not built here: our side alone, every round
        (["a", "b", "c"], 2, ["a", "b", "c", "c", "b", "a"]),
    ],
)
def test_each_side_every_round_in_turned_order(names: list[str], rounds: int, order: list[str]) -> None:
    measured: list[str] = []

    def measure(name: str) -> tuple[str, int]:
        measured.append(name)
        return name, len(measured)

    results = _alternating(names, rounds, measure)
    assert measured == order
    assert list(results) == names
    for name in names:  # each side's results in its rounds' order, all of them its own
        assert [r[0] for r in results[name]] == [name] * rounds
        assert [r[1] for r in results[name]] == [i + 1 for i, n in enumerate(order) if n == name]
