"""A stepped fleet: thousands of simulated agents on a simulated clock that jumps from one due turn to the
next (``bench/run.py fleet``: the steady state and the outage at 2,000 agents).

The agents are bench/fleetsim.py's :class:`~bench.fleetsim.SimAgent` (the Kubernetes-mode wiring: seeder,
main loop with the built-in packs, condition and Event sinks, the recovery loop with its budget and pause
Lease; each agent its own ``KubeClient``, every request a real HTTP request to tests/kubeapi). None of their
components runs in a thread: one worker process turns each at the simulated time its own loop would wake
(``SinkWorker.turn``, ``RecoveryLoop.turn``, ``MainLoop.step``), earlier when the agent publishes a new
snapshot (as their waits end on a new publication). The clock stands still during a turn, so a simulated hour
costs the CPU of its turns and requests only, whatever the fleet size, and the API server's service time does
not count in simulated time (with threads on a scaled clock, it counted ``scale`` times over: 2,000 agents as
6,000 threads ran this 2-core machine's load average to 1,800).

What this cannot show: two agents' requests in flight at once (the worker sends one request at a time, so the
server never answers a burst concurrently; bursts still show in the per-window counts, in simulated time) and
a request timeout's real duration. The misfire, where the budget Lease's conflicts come from agents racing,
runs with threads (bench/fleetsim.py).

The parent process holds the API server and drives the scenario (:class:`SteppedFleet`, the same interface as
:class:`~bench.fleetsim.Fleet`): ``sim.until(t)`` lets the worker run every turn due up to simulated second
``t`` and then stop, so the parent can change the server (an outage) or read it between steps. Requests get
their simulated time from the worker's breakpoints: (real ``time.monotonic()``, simulated second) each time the
clock moves; a request arrived during the turn of the last breakpoint before it (one request at a time).
"""

from __future__ import annotations

import bisect
import heapq
import multiprocessing
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bench.fleetsim import (
    CLUSTER,
    NAMESPACE,
    T0,
    OnePass,
    SimAgent,
    WorkerParts,
    WorkerSpec,
    fleet_server,
    node_names,
    requests_between,
)

ROOT = Path(__file__).resolve().parent.parent
SEED_RETRY = 2.0  # simulated seconds between a failed Node read and the seeder's next (the Pump's turn)
WAKE_ON_PUBLICATION = ("conditions", "events", "recovery")

__all__ = ["CLUSTER", "NAMESPACE", "SteppedFleet"]


# ---- the worker's side ------------------------------------------------------------------------------


class StepClock:
    """The worker's simulated clock: it stands still during a turn and moves only forward. ``sleep`` (the
    budget's retry pause inside a step) moves it on. ``breakpoints``: (real monotonic, simulated s) from each
    move, which date the requests the server logged."""

    scale = 1.0  # the agents' waits are never called here: they are turned, not waiting

    def __init__(self) -> None:
        self.t = 0.0
        self.slept = 0.0
        self.breakpoints: list[tuple[float, float]] = [(time.monotonic(), 0.0)]

    def mono(self) -> float:
        return self.t

    def now(self) -> float:
        return T0 + self.t

    def advance(self, t: float) -> None:
        if t > self.t:
            self.t = t
            self.breakpoints.append((time.monotonic(), t))

    def sleep(self, seconds: float) -> None:
        self.slept += seconds
        self.advance(self.t + max(0.0, seconds))


class Stepper:
    """Every component of ``agents``, each turned at the simulated time its pause ends (a heap of due turns;
    a turn scheduled earlier replaces a later one of the same component)."""

    def __init__(self, agents: list[SimAgent], clock: StepClock) -> None:
        self.agents = agents
        self.clock = clock
        self._heap: list[tuple[float, int, int, str]] = []
        self._due: dict[tuple[int, str], float] = {}
        self._seq = 0
        self._published = [0] * len(agents)
        self._recovery_wakes = [True] * len(agents)  # False while a failed recovery step's backoff runs

    def start(self) -> None:
        for i, agent in enumerate(self.agents):
            agent.recovery.attach(agent.stop)
            agent.main._publish([], last_seq=None)  # as MainLoop.run begins
            self._published[i] = agent.feed.latest().number
            for component in ("seed", "conditions", "events"):
                self.schedule(i, component, 0.0)
            self.schedule(i, "recovery", min(agent.recovery._interval, agent.recovery.holds.due_in()))

    def schedule(self, i: int, component: str, due: float) -> None:
        key = (i, component)
        if key in self._due and self._due[key] <= due:
            return
        self._due[key] = due
        self._seq += 1
        heapq.heappush(self._heap, (due, self._seq, i, component))

    def inject(self, line: str, nodes: set[str] | None) -> None:
        for i, agent in enumerate(self.agents):
            if nodes is None or agent.node in nodes:
                agent.inject(line, self.clock.now())
                self.schedule(i, "main", self.clock.t)

    def run_until(self, end: float) -> None:
        while self._heap and self._heap[0][0] <= end:
            due, _, i, component = heapq.heappop(self._heap)
            if self._due.get((i, component)) != due:
                continue  # replaced by an earlier turn, which has run
            del self._due[(i, component)]
            self.clock.advance(due)
            self._turn(i, component)
        self.clock.advance(end)

    def _turn(self, i: int, component: str) -> None:
        agent, t = self.agents[i], self.clock.t
        if component == "seed":
            agent.seeder.run(OnePass())  # type: ignore[arg-type]
            if not agent.seeder.done.is_set():
                self.schedule(i, "seed", t + SEED_RETRY)
            self.schedule(i, "main", t)
        elif component == "main":
            agent.main.step(timeout=0)
            if agent.inbox.received > agent.inbox.taken:  # more than one step's worth
                self.schedule(i, "main", self.clock.t)
            timeout = agent.main.idle_timeout()
            if timeout is not None:
                self.schedule(i, "main", self.clock.t + timeout)
        elif component == "recovery":
            pause = agent.recovery.turn()
            self._recovery_wakes[i] = pause.wakes_on_publication
            wait = min(pause.seconds, agent.recovery.holds.due_in()) if pause.wakes_on_publication else pause.seconds
            self.schedule(i, "recovery", self.clock.t + wait)
        else:
            sink = agent.conditions if component == "conditions" else agent.events
            self.schedule(i, component, self.clock.t + sink.turn())
        number = agent.feed.latest().number
        if number != self._published[i]:  # a new snapshot: the sinks' and recovery's waits end now
            self._published[i] = number
            for other in WAKE_ON_PUBLICATION:
                if other != "recovery" or self._recovery_wakes[i]:
                    self.schedule(i, other, self.clock.t)


def step_worker(spec: WorkerSpec, conn: Any) -> None:
    """The worker process: build the agents, then answer ``until``, ``inject``, ``report`` and ``stop``."""
    parts = WorkerParts(spec)
    clock = StepClock()
    agents = parts.agents(clock, tick=None)  # the main loop is turned when its next expiry is due, or on input
    stepper = Stepper(agents, clock)
    conn.send("built")
    sent = 0
    while True:
        command, *args = conn.recv()
        if command == "until":
            if sent == 0:
                clock.breakpoints[0] = (time.monotonic(), 0.0)  # the clock starts with the first step
                stepper.start()
            stepper.run_until(args[0])
            conn.send((clock.t, clock.breakpoints[sent:]))
            sent = len(clock.breakpoints)
        elif command == "inject":
            stepper.inject(args[0], set(args[1]) if args[1] is not None else None)
            conn.send("injected")
        elif command == "report":
            conn.send({a.node: a.report() for a in agents})
        elif command == "stop":
            for agent in agents:
                agent.close()
            conn.send({a.node: a.report() for a in agents})
            parts.close()
            return


# ---- the parent's side ------------------------------------------------------------------------------


class SteppedTime:
    """The parent's view of the worker's clock: ``until`` runs the fleet to a simulated second; ``at`` dates a
    request the server logged (its real arrival) in simulated seconds."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._t = 0.0
        self._reals: list[float] = []
        self._sims: list[float] = []

    def mono(self) -> float:
        return self._t

    def now(self) -> float:
        return T0 + self._t

    def until(self, sim_seconds: float) -> None:
        if sim_seconds < self._t:
            return
        self._conn.send(("until", sim_seconds))
        self._t, points = self._conn.recv()
        for real, sim in points:
            self._reals.append(real)
            self._sims.append(sim)

    def at(self, real_monotonic: float) -> float:
        i = bisect.bisect_right(self._reals, real_monotonic) - 1
        return self._sims[i] if i >= 0 else float("-inf")


class SteppedFleet:
    """``agents`` simulated agents in one stepped worker process against one API server (``with``); the
    interface of :class:`bench.fleetsim.Fleet` (``sim`` is a :class:`SteppedTime`)."""

    def __init__(self, *, agents: int, startup_delay: float = 60.0, seed: int = 0) -> None:
        self.names = node_names(agents)
        self._tmp = tempfile.TemporaryDirectory()
        self.server = fleet_server(self.names)
        self._startup_delay = startup_delay
        self._seed = seed
        self._proc: Any = None
        self._conn: Any = None
        self.sim: SteppedTime | None = None
        self.final: dict[str, dict[str, Any]] = {}

    def __enter__(self) -> SteppedFleet:
        self.server.start()
        self.kubeconfig = self.server.write_kubeconfig(Path(self._tmp.name) / "kubeconfig")
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        spec = WorkerSpec(
            kubeconfig=str(self.kubeconfig), nodes=tuple(self.names), startup_delay=self._startup_delay, seed=self._seed
        )
        self._proc = ctx.Process(target=step_worker, args=(spec, child), daemon=True)
        self._proc.start()
        self._conn = parent
        if not parent.poll(600) or parent.recv() != "built":
            raise RuntimeError("the stepped fleet's worker did not start")
        self.server.reset_requests()
        self.sim = SteppedTime(parent)
        return self

    def inject(self, line: str, nodes: Iterable[str] | None = None) -> None:
        """Append ``line`` to the kernel log of ``nodes`` (None: every node), at the current simulated second."""
        self._conn.send(("inject", line, None if nodes is None else list(nodes)))
        self._conn.recv()

    def report(self) -> dict[str, dict[str, Any]]:
        self._conn.send(("report",))
        return dict(self._conn.recv())

    def __exit__(self, *exc: object) -> None:
        try:
            self._conn.send(("stop",))
            self.final.update(self._conn.recv())
        finally:
            self._proc.join(timeout=60)
            if self._proc.is_alive():
                self._proc.kill()
            self.server.stop()
            self._tmp.cleanup()

    def requests(self, start: float = float("-inf"), end: float = float("inf")) -> list[Any]:
        """Requests answered (or not) between simulated seconds ``start`` and ``end``."""
        assert self.sim is not None
        return requests_between(self.server, self.sim, start, end)
