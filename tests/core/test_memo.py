"""``Memo``: a value built again only when its key changes (the metrics collectors' families, issue 16)."""

from __future__ import annotations

from agent.core.memo import Memo


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
