"""bench/run.py npd's deployed side: both processes of the relay + agent pair counted, stopped agent first."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from bench import run


@dataclass
class FakeProcess:
    pid: int
    stopped: list[int] = field(default_factory=list)

    def terminate(self) -> None:
        self.stopped.append(self.pid)

    def wait(self, timeout: float) -> int:
        return 0


def test_a_deployed_pair_counts_both_processes_and_stops_the_agent_first() -> None:
    order: list[int] = []
    relay, agent = FakeProcess(os.getpid(), order), FakeProcess(os.getppid(), order)
    pair = run.Deployed(relay=relay, agent=agent)
    assert run._pids(pair) == (os.getpid(), os.getppid()) and run._pids(relay) == (os.getpid(),)
    assert run._cpu_of(pair) >= run._cpu_of(relay) > 0
    run._stop(pair)
    assert order == [os.getppid(), os.getpid()]


def test_peak_rss_is_read_from_the_process_status() -> None:
    assert 1 < run._peak_rss_mib(os.getpid()) < 10_000
