"""Fleet simulation: agents as they run in production, as threads across worker processes, against one
tests/kubeapi server (``bench/run.py fleet``).

Each simulated agent is the Kubernetes-mode wiring (``agent/app/wiring/``) with time injected:
the ``node_seeder`` (reads the Node, seeds the state), the ``main_loop`` with the built-in rule packs,
the ``condition_sink`` (aggregate condition, 300 s heartbeat at the node's phase of a 330 s cycle),
the ``event_sink`` (in-memory outbox) and the ``recovery`` loop (enabled, the built-in policy and budget,
the budget Lease with its conflict retries; mark-unhealthy recorded instead of calling AWS). Every component
runs in its own thread, as under the supervisor; each agent has its own ``KubeClient`` (its own
connection). Agents are spread over ``processes`` worker processes; the API server runs in the
parent and logs every request with its arrival time (``tests/kubeapi/requestlog.py``).

Time: one simulated clock, ``scale`` times faster than real time, read by every process from
``CLOCK_MONOTONIC`` (:class:`SimTime`). Every wait the components make goes through it (the sinks'
``wait``, the recovery loop's feed and stop, the budget's retry sleep), so a simulated hour takes
``3600 / scale`` real seconds. The API server is not scaled: its service time counts ``scale`` times
over in simulated time, so rates are printed where the server kept up (its answer time is reported).

Light agents (``light=True``; the misfire at 2,000): the seeder and the main loop are not threads of their
own but stepped in turn by one :class:`Pump` thread per worker process; the sinks and the recovery loop
(budget, pause Lease, Node writes) keep their threads. Every API request stays a real one.

Faults reach agents as kernel log records through each agent's inbox (a real rule match), never as
made-up state.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import multiprocessing
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

ROOT = Path(__file__).resolve().parent.parent
NAMESPACE = "node-health-agent"
CLUSTER = "fleet"
T0 = 1_767_225_600.0
DMA_LINE = "NEURON_HW_ERR=DMA_ERROR nd-id=0 nc-id=1"  # NeuronHealth=True: the built-in policy acts
READONLY_LINE = "EXT4-fs (nvme0n1p1): Remounting filesystem read-only"  # ReadonlyFilesystem: reported only
HEARTBEAT = 300.0  # the conditions sink's heartbeat (its default), simulated seconds
JITTER = 0.1  # ... and its jitter (its default): heartbeats one cycle of 330 s apart
MAIN_TICK = 2.0  # real seconds between the main loop's idle turns (expiry only; input wakes it at once)
WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


# ---- time ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SimTime:
    """Simulated time: ``scale`` simulated seconds per real second since ``origin`` (a ``time.monotonic()``
    value; CLOCK_MONOTONIC is one clock for every process of the machine)."""

    origin: float
    scale: float

    def mono(self) -> float:
        return (time.monotonic() - self.origin) * self.scale

    def now(self) -> float:
        return T0 + self.mono()

    def at(self, real_monotonic: float) -> float:
        """Simulated seconds since the start at real ``time.monotonic()`` value ``real_monotonic``."""
        return (real_monotonic - self.origin) * self.scale

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds / self.scale)

    def until(self, sim_seconds: float) -> None:
        """Sleep until simulated second ``sim_seconds`` (since the start)."""
        left = (self.origin + sim_seconds / self.scale) - time.monotonic()
        if left > 0:
            time.sleep(left)


class AgentTime(Protocol):
    """What a simulated agent reads time from: :class:`SimTime` (real time scaled) or a stepped clock
    (bench/fleetstep.py), in simulated seconds; ``scale``: simulated seconds per real second of its waits."""

    @property
    def scale(self) -> float: ...

    def mono(self) -> float: ...

    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class ScaledStop:
    """A ``threading.Event`` whose ``wait`` takes simulated seconds (what the recovery loop and the
    seeder wait on)."""

    def __init__(self, event: threading.Event, scale: float) -> None:
        self._event = event
        self._scale = scale

    def is_set(self) -> bool:
        return self._event.is_set()

    def set(self) -> None:
        self._event.set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(None if timeout is None else timeout / self._scale)


class ScaledFeed:
    """The snapshot feed with ``wait_newer`` in simulated seconds (the recovery loop's pause)."""

    def __init__(self, feed: Any, scale: float) -> None:
        self._feed = feed
        self._scale = scale

    def latest(self) -> Any:
        return self._feed.latest()

    def wait_newer(self, after: int, *, timeout: float) -> Any:
        return self._feed.wait_newer(after, timeout=timeout / self._scale)


def sink_wait(stop: threading.Event, feed: Any, scale: float) -> Callable[[float], bool]:
    """A sink's ``wait(seconds) -> stopping`` in simulated seconds, ending early on a newer publication
    (as the sinks' default wait does in real seconds)."""

    def wait(seconds: float) -> bool:
        seen = feed.latest().number
        end = time.monotonic() + seconds / scale
        while not stop.is_set():  # the agent closes its feed when it stops: that ends the wait
            left = end - time.monotonic()
            if left <= 0:
                return False
            if feed.wait_newer(seen, timeout=left) is not None:
                return False
        return True

    return wait


# ---- one agent ---------------------------------------------------------------------------------------


class _Marker:
    """``mark_unhealthy`` that records, with when (simulated s; the AWS side is not simulated: Auto Scaling is
    not the API server)."""

    def __init__(self, mono: Callable[[], float]) -> None:
        self.calls = 0
        self.times: list[float] = []
        self._mono = mono

    def __call__(self, node: Any) -> Any:
        from agent.recovery.asg import MarkResult

        self.calls += 1
        self.times.append(self._mono())
        instance = (node.provider_id or "").rsplit("/", 1)[-1]
        return MarkResult(outcome="marked", instance_id=instance, group=CLUSTER, message=f"{instance} marked Unhealthy")


class EngineCopies:
    """``engine_factory`` for many agents of one rule set in one process: each agent's RuleEngine is a copy
    of one built engine with its own per-stream state. Building the literal prefilter (immutable, shared)
    costs about 80 ms a time: 2,000 agents would spend minutes building the same one."""

    STREAM_STATE = frozenset({"_builder", "_history", "_armed", "_seen"})

    def __init__(self, rule_set: Any) -> None:
        from agent.detectors.rules import RuleEngine

        self._first = RuleEngine(rule_set=rule_set)

    def __call__(self, *, rule_set: Any) -> Any:
        import collections
        import copy

        from agent.detectors.rules import FindingBuilder

        assert rule_set is self._first.rule_set
        engine = copy.copy(self._first)
        engine._builder = FindingBuilder()
        engine._history = collections.deque(maxlen=self._first._history.maxlen)
        engine._armed = {}
        engine._seen = 0
        return engine


class SimAgent:
    """One node's agent: seeder, main loop, condition and Event sinks, recovery, each in a thread."""

    def __init__(
        self,
        *,
        node: str,
        client: Any,
        rule_set: Any,
        sim: AgentTime,
        policy: Any,
        seed: int,
        engines: EngineCopies,
        tick: float | None = MAIN_TICK,
    ) -> None:
        from agent.app.wiring.state import severity_lookup
        from agent.core.bus import Inbox, SnapshotFeed
        from agent.core.state import NodeState
        from agent.core.types import Provenance
        from agent.detectors.pipeline import DetectionPipeline
        from agent.engine.mainloop import MainLoop
        from agent.recovery.budget import ClusterBudget, budget_lease_name
        from agent.recovery.holds import HoldGate, PauseStore, pause_lease_name
        from agent.recovery.loop import RecoveryLoop
        from agent.sinks.conditions import ConditionSink
        from agent.sinks.events import EventSink
        from agent.sources.nodeseed import NodeSeeder
        from agent.sources.replay import ReplayPolicy

        rng = random.Random(seed)
        self.node = node
        self.stop = threading.Event()
        self._scaled_stop = ScaledStop(self.stop, sim.scale)
        specs = tuple(
            s if s.provenance is not None else dataclasses.replace(s, provenance=Provenance.KERNEL_LOG)
            for s in rule_set.conditions
        )
        state = NodeState(
            conditions=specs,
            clock=sim.now,
            reasons=rule_set.reasons,
            problem_pairs=[(r.condition, r.reason) for r in rule_set.rules if r.condition and "{" not in r.reason],
            aggregate=True,
            seeded=False,
        )
        self.inbox = Inbox()
        self.feed = SnapshotFeed(initial=state.snapshot())
        self.seeder = NodeSeeder(
            client=client,
            node_name=node,
            inbox=self.inbox,
            types=state.owned_types,
            severity=severity_lookup(rule_set),
            clock=sim.now,
        )
        self.conditions = ConditionSink(
            client=client,
            node_name=node,
            feed=self.feed,
            heartbeat=HEARTBEAT,
            jitter=JITTER,
            aggregate=True,
            clock=sim.now,
            monotonic=sim.mono,
            wait=sink_wait(self.stop, self.feed, sim.scale),
            rng=rng.random,
        )
        self.events = EventSink(
            client=client,
            node_name=node,
            feed=self.feed,
            namespace="default",
            state_dir=None,
            clock=sim.now,
            monotonic=sim.mono,
            wait=sink_wait(self.stop, self.feed, sim.scale),
            rng=rng.random,
        )
        self.marker = _Marker(sim.mono)
        budget = ClusterBudget(
            client=client,
            namespace=NAMESPACE,
            lease_name=budget_lease_name(CLUSTER),
            node_name=node,
            settings=policy.budget,
            clock=sim.now,
            sleep=sim.sleep,
            rng=rng.random,
        )
        self.recovery = RecoveryLoop(
            feed=ScaledFeed(self.feed, sim.scale),
            inbox=self.inbox,
            client=client,
            node_name=node,
            policy=policy,
            enabled=True,
            budget=budget,
            mark_unhealthy=self.marker,
            holds=HoldGate(  # as agent.app.wiring.recovery.hold_gate: the pause Lease read before acting
                store=PauseStore(client=client, namespace=NAMESPACE, lease_name=pause_lease_name(CLUSTER)),
                client=client,
                node_name=node,
                monotonic=sim.mono,
            ),
            clock=sim.now,
            monotonic=sim.mono,
        )
        self.main = MainLoop(
            inbox=self.inbox,
            feed=self.feed,
            state=state,
            pipeline=DetectionPipeline(rule_set=rule_set, engine_factory=engines),
            replay=ReplayPolicy(cursor=None, boot_id="sim", lookback=300.0),
            health=lambda: {"sim": True},
            stall_timeout=600.0,
            acks=[self.events.acked],
            clock=sim.now,
            tick=tick,
        )
        self._seq = 0
        self._threads: list[threading.Thread] = []

    def start(self, *, light: bool = False) -> None:
        """Each component in its thread; ``light``: the main loop and the seeder not (a :class:`Pump` steps
        them), so an agent is three threads (the sinks and recovery, every API request of theirs real)."""
        runs: list[tuple[str, Callable[[Any], None], Any]] = [
            ("conditions", self.conditions.run, self.stop),
            ("events", self.events.run, self.stop),
            ("recovery", self.recovery.run, self._scaled_stop),
        ]
        if not light:
            runs[:0] = [("main", self.main.run, self.stop), ("seeder", self.seeder.run, self._scaled_stop)]
        for name, target, stop in runs:
            thread = threading.Thread(target=target, args=(stop,), name=f"{self.node}-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def inject(self, line: str, now: float) -> None:
        from agent.core.bus import RecordBatch
        from agent.core.types import LogRecord

        self._seq += 1
        self.inbox.put(RecordBatch(records=[LogRecord(message=line, timestamp=now, seq=self._seq)]), stop=self.stop)

    def report(self) -> dict[str, Any]:
        snapshot = self.feed.latest().snapshot
        return {
            "conditions": {c.type: [c.status.value, c.reason] for c in snapshot.conditions},
            "seeded": snapshot.seeded,
            "in_sync": self.conditions.in_sync,
            "outbox": len(self.events.outbox),
            "marks": self.marker.calls,
            "mark_times": list(self.marker.times),
            "sink_bugs": self.conditions.bugs + self.events.bugs,
            "recovery_errors": self.recovery.stats.errors,
        }

    def close(self) -> None:
        self.stop.set()
        self.feed.close()

    def join(self, deadline: float) -> None:
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))


class OnePass:
    """A stop for one pass of the seeder's loop: it reads the Node once and returns at its first wait (after
    seeding, or after a failed read: the pump, or bench/fleetstep.py's stepper, tries again on its next turn)."""

    def __init__(self) -> None:
        self._waited = False

    def is_set(self) -> bool:
        return self._waited

    def wait(self, timeout: float | None = None) -> bool:
        self._waited = True
        return True


class Pump:
    """Light agents' seeders and main loops, stepped in turn by one thread of the worker process every
    ``MAIN_TICK`` real seconds (the main loop's own idle tick): the same reads of the Node and the same rule
    matches of the injected kernel log lines, without two threads per agent (2,000 agents are 10,000 threads
    otherwise, more than this 2-core machine runs with the API server)."""

    def __init__(self, agents: Sequence[SimAgent], stop: threading.Event) -> None:
        self._agents = agents
        self._stop = stop
        self.thread = threading.Thread(target=self._run, name="pump", daemon=True)

    def _run(self) -> None:
        for agent in self._agents:
            agent.main._publish([], last_seq=None)  # as MainLoop.run begins
        while not self._stop.is_set():
            for agent in self._agents:
                if not agent.seeder.done.is_set():
                    agent.seeder.run(OnePass())  # type: ignore[arg-type]
                agent.main.step(timeout=0)
            self._stop.wait(MAIN_TICK)


# ---- a worker process --------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class WorkerSpec:
    kubeconfig: str
    nodes: tuple[str, ...]
    startup_delay: float  # the recovery policy's (simulated seconds)
    seed: int
    light: bool = False  # the main loops and seeders stepped by one Pump (SimAgent.start)


class WorkerParts:
    """What a worker process's agents share or are given, built once: the built-in rule set and its engine
    copies, the policy with the spec's startup delay, and a ``KubeClient`` per node (each agent its own
    connection). Used by this module's threaded workers and bench/fleetstep.py's stepped one."""

    def __init__(self, spec: WorkerSpec) -> None:
        sys.path.insert(0, str(ROOT))
        logging.basicConfig(level=logging.CRITICAL)  # thousands of agents retrying would drown the output
        from agent.adapters.kube import KubeClient
        from agent.app.config import load_rule_set
        from agent.core.paths import builtin_plugins_dir
        from agent.recovery.policyfile import DEFAULT_POLICY

        self._spec = spec
        self.rule_set = load_rule_set([builtin_plugins_dir()])
        self.policy = dataclasses.replace(DEFAULT_POLICY, startup_delay=spec.startup_delay)
        self.clients = [KubeClient.load(kubeconfig=Path(spec.kubeconfig)) for _ in spec.nodes]
        self.engines = EngineCopies(self.rule_set)

    def agents(self, sim: AgentTime, *, tick: float | None = MAIN_TICK) -> list[SimAgent]:
        """An agent per node of the spec, on ``sim``'s time (``tick``: the main loop's idle tick)."""
        return [
            SimAgent(
                node=n,
                client=c,
                rule_set=self.rule_set,
                sim=sim,
                policy=self.policy,
                seed=self._spec.seed * 100_000 + i,
                engines=self.engines,
                tick=tick,
            )
            for i, (n, c) in enumerate(zip(self._spec.nodes, self.clients, strict=True))
        ]

    def close(self) -> None:
        for client in self.clients:
            client.close()


def worker_main(spec: WorkerSpec, conn: Any) -> None:
    """A worker process: build the clients, then on ``("start", origin, scale)`` the agents; answer commands
    (``inject``, ``report``, ``stop``) until stopped."""
    parts = WorkerParts(spec)
    conn.send("built")
    agents: list[SimAgent] = []
    pump_stop = threading.Event()
    sim: SimTime | None = None
    while True:
        command, *args = conn.recv()
        if command == "start":
            sim = SimTime(origin=args[0], scale=args[1])
            agents = parts.agents(sim)
            for agent in agents:
                agent.start(light=spec.light)
            if spec.light:
                pump = Pump(agents, pump_stop)
                pump.thread.start()
            conn.send("started")
        elif command == "inject":
            line, wanted = args[0], set(args[1]) if args[1] is not None else None
            assert sim is not None
            now = sim.now()
            for agent in agents:
                if wanted is None or agent.node in wanted:
                    agent.inject(line, now)
            conn.send("injected")
        elif command == "report":
            conn.send({a.node: a.report() for a in agents})
        elif command == "stop":
            pump_stop.set()
            for agent in agents:
                agent.close()
            deadline = time.monotonic() + 10
            for agent in agents:
                agent.join(deadline)
            conn.send({a.node: a.report() for a in agents})
            parts.close()
            return


# ---- the fleet --------------------------------------------------------------------------------------


def node_object(name: str, index: int, *, zone: str = "us-west-2a") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/os": "linux", "topology.kubernetes.io/zone": zone},
        },
        "spec": {"providerID": f"aws:///{zone}/i-{index:017x}"},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]},
    }


def node_names(agents: int) -> list[str]:
    return [f"n{i:04d}" for i in range(agents)]


def fleet_server(names: Sequence[str]) -> Any:
    """A tests/kubeapi server (not started) holding the namespace and a Node per name."""
    sys.path.insert(0, str(ROOT / "tests"))
    from kubeapi.server import KubeApiServer

    server = KubeApiServer()
    server.put_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    for i, name in enumerate(names):
        server.put_object(node_object(name, i))
    return server


def requests_between(server: Any, sim: Any, start: float, end: float) -> list[Any]:
    """The server's requests that arrived between simulated seconds ``start`` and ``end`` (``sim.at`` dates them)."""
    return [r for r in server.requests.snapshot() if start <= sim.at(r.at) < end]


class Fleet:
    """``agents`` simulated agents in ``processes`` worker processes against one API server (``with``)."""

    def __init__(
        self,
        *,
        agents: int,
        processes: int,
        scale: float,
        startup_delay: float = 60.0,
        seed: int = 0,
        light: bool = False,
    ):
        self.names = node_names(agents)
        self.scale = scale
        self._tmp = tempfile.TemporaryDirectory()
        self.server = fleet_server(self.names)
        self._processes = processes
        self._startup_delay = startup_delay
        self._seed = seed
        self._light = light
        self._workers: list[tuple[Any, Any]] = []
        self.sim: SimTime | None = None
        self.final: dict[str, dict[str, Any]] = {}

    def __enter__(self) -> Fleet:
        self.server.start()
        self.kubeconfig = self.server.write_kubeconfig(Path(self._tmp.name) / "kubeconfig")
        kubeconfig = str(self.kubeconfig)
        ctx = multiprocessing.get_context("spawn")
        for p in range(self._processes):
            parent, child = ctx.Pipe()
            spec = WorkerSpec(
                kubeconfig=kubeconfig,
                nodes=tuple(self.names[p :: self._processes]),
                startup_delay=self._startup_delay,
                seed=self._seed * 100 + p,
                light=self._light,
            )
            proc = ctx.Process(target=worker_main, args=(spec, child), daemon=True)
            proc.start()
            self._workers.append((proc, parent))
        for _, conn in self._workers:
            if not conn.poll(300) or conn.recv() != "built":
                raise RuntimeError("a fleet worker did not start")
        self.server.reset_requests()
        self.sim = SimTime(origin=time.monotonic(), scale=self.scale)
        self._all(("start", self.sim.origin, self.scale))
        return self

    def _all(self, message: tuple) -> list[Any]:
        for _, conn in self._workers:
            conn.send(message)
        return [conn.recv() for _, conn in self._workers]

    def inject(self, line: str, nodes: Iterable[str] | None = None) -> None:
        """Append ``line`` to the kernel log of ``nodes`` (None: every node), all at once."""
        self._all(("inject", line, None if nodes is None else list(nodes)))

    def report(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for part in self._all(("report",)):
            out.update(part)
        return out

    def __exit__(self, *exc: object) -> None:
        try:
            for part in self._all(("stop",)):
                self.final.update(part)
        finally:
            for proc, _ in self._workers:
                proc.join(timeout=20)
                if proc.is_alive():
                    proc.kill()
            self.server.stop()
            self._tmp.cleanup()

    # ---- the server's view ----------------------------------------------------------------------------

    def requests(self, start: float = float("-inf"), end: float = float("inf")) -> list[Any]:
        """Requests answered (or not) between simulated seconds ``start`` and ``end``."""
        assert self.sim is not None
        return requests_between(self.server, self.sim, start, end)


# ---- measures ------------------------------------------------------------------------------------------


def window_counts(times: Sequence[float], *, start: float, end: float, width: float) -> list[int]:
    """How many of ``times`` fall in each ``width``-second window from ``start`` to ``end``."""
    bins = [0] * max(1, int((end - start) // width))
    for t in times:
        i = int((t - start) // width)
        if 0 <= i < len(bins):
            bins[i] += 1
    return bins


def cordoned_over(records: Iterable[Any], limit: int) -> tuple[int, int]:
    """From the server's view, in arrival order: (cordon PATCHes that left more than ``limit`` nodes
    cordoned by recovery, the most cordoned at once). Uncordons give the place back."""
    cordoned: set[str] = set()
    over = peak = 0
    for r in records:
        if (
            r.method != "PATCH"
            or r.status != 200
            or not r.path.startswith("/api/v1/nodes/")
            or r.path.endswith("/status")
        ):
            continue
        spec = (r.body or {}).get("spec") if isinstance(r.body, dict) else None
        if not spec or "unschedulable" not in spec:
            continue
        name = r.path.rsplit("/", 1)[-1]
        if spec["unschedulable"]:
            if name not in cordoned:
                cordoned.add(name)
                over += len(cordoned) > limit
        else:
            cordoned.discard(name)
        peak = max(peak, len(cordoned))
    return over, peak


def event_reasons(records: Iterable[Any]) -> list[tuple[str, str, float]]:
    """(node, reason, arrival) of every Event the server stored (created, core/v1 or events.k8s.io)."""
    out = []
    for r in records:
        if r.method != "POST" or r.status not in (200, 201) or "/events" not in r.path or not isinstance(r.body, dict):
            continue
        involved = r.body.get("involvedObject") or r.body.get("regarding") or {}
        out.append((involved.get("name", ""), r.body.get("reason", ""), r.at))
    return out


@dataclass(frozen=True, kw_only=True)
class Measured:
    figures: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


# ---- scenario 1: steady state ---------------------------------------------------------------------------


# A node's first heartbeat comes one heartbeat to one heartbeat plus a cycle (330 s) after its first write.
FIRST_HEARTBEAT_BY = HEARTBEAT + HEARTBEAT * (1 + JITTER)


def _fleet(*, agents: int, processes: int, scale: float, light: bool, stepped: bool) -> Any:
    """The threaded fleet on a scaled clock, or with ``stepped`` the stepped one (bench/fleetstep.py: one
    worker process, no threads, ``processes`` and ``scale`` not used)."""
    if stepped:
        from bench.fleetstep import SteppedFleet

        return SteppedFleet(agents=agents)
    return Fleet(agents=agents, processes=processes, scale=scale, light=light)


def _mode(*, light: bool, stepped: bool, processes: int, scale: float) -> str:
    if stepped:
        return "stepped (one worker process)"
    return f"{'light, ' if light else ''}{processes} processes, x{scale:g}"


def steady_state(
    *, agents: int, processes: int, scale: float, hours: float = 1.0, light: bool = False, stepped: bool = False
) -> Measured:
    """Every agent healthy for ``hours`` simulated hours: writes and reads per node-hour, the most writes in
    a 10 s window against the mean, and the API load (requests and objects returned per second, per agent).
    The agents start together (a rollout of every node at once); the hour is measured from when every node
    beats: a heartbeat plus a cycle after every node's conditions were first written."""
    duration = 3600.0 * hours
    with _fleet(agents=agents, processes=processes, scale=scale, light=light, stepped=stepped) as fleet:
        assert fleet.sim is not None
        sim = fleet.sim
        deadline = time.monotonic() + 120.0  # and 2,400 simulated s: a stepped fleet runs ahead of real time
        while len({r.path for r in fleet.server.requests.filter(method="PATCH", path_regex=r"/status$")}) < agents:
            if sim.mono() > 2400.0 and time.monotonic() > deadline:
                raise RuntimeError("the fleet did not write every node's conditions within 120 s (2,400 simulated)")
            sim.until(sim.mono() + 4.0)
        # Every node beats from its first heartbeat on (one heartbeat to one heartbeat plus a cycle after its
        # first write); before that the fleet writes less than its steady rate, which would lower the mean.
        sim.until(sim.mono() + FIRST_HEARTBEAT_BY)
        warm = sim.mono()
        sim.until(warm + duration)
        records = fleet.requests(warm, warm + duration)
    writes = [sim.at(r.at) for r in records if r.method in WRITE_VERBS]
    reads = [r for r in records if r.method == "GET"]
    gaps = sorted(_write_gaps(records, sim))
    bins = window_counts(writes, start=warm, end=warm + duration, width=10.0)
    mean = len(writes) / len(bins)
    objects = sum(r.objects for r in records)
    return Measured(
        figures={
            "fleet.writes_per_node_hour": len(writes) / agents / hours,
            "fleet.reads_per_node_hour": len(reads) / agents / hours,
            "fleet.max_writes_10s_over_mean": max(bins) / mean if mean else 0.0,
            "fleet.max_writes_10s_over_mean_unpulsed": noise_floor(mean, len(bins)),
            "fleet.steady_requests_per_s": len(records) / duration,
            "fleet.steady_objects_per_s": objects / duration,
            "fleet.steady_requests_per_s_per_agent": len(records) / duration / agents,
            "fleet.steady_objects_per_s_per_agent": objects / duration / agents,
        },
        notes=[
            f"steady: {agents} agents, {_mode(light=light, stepped=stepped, processes=processes, scale=scale)}, "
            f"warm after {warm:.0f} s, then {hours:g} simulated h: "
            f"{len(writes)} writes, {len(reads)} reads; 10 s windows: mean {mean:.1f}, max {max(bins)} "
            f"({bins.index(max(bins)) * 10} s in); simulated s between a node's writes: "
            + (
                f"median {gaps[len(gaps) // 2]:.0f}, max {gaps[-1]:.0f} (heartbeats 330 s apart, the first 300-630)"
                if gaps
                else "none"
            )
        ],
    )


def noise_floor(mean: float, windows: int, *, trials: int = 200, seed: int = 0) -> float:
    """The largest of ``windows`` 10 s windows over their mean for writes arriving at random (a Poisson
    process: no pulse at all), averaged over ``trials``: what a small fleet shows without any pulse."""
    rng = random.Random(seed)
    if mean <= 0 or windows <= 0:
        return 0.0
    limit = math.exp(-mean)

    def draw() -> int:  # Knuth's method; the means here are small
        k, p = 0, rng.random()
        while p > limit:
            k += 1
            p *= rng.random()
        return k

    return sum(max(draw() for _ in range(windows)) for _ in range(trials)) / trials / mean


def _write_gaps(records: Iterable[Any], sim: SimTime) -> list[float]:
    """Simulated seconds between consecutive writes of each node's status (a lagging simulation shows here)."""
    last: dict[str, float] = {}
    gaps = []
    for r in records:
        if r.method == "PATCH" and r.path.endswith("/status"):
            at = sim.at(r.at)
            if r.path in last:
                gaps.append(at - last[r.path])
            last[r.path] = at
    return gaps


# ---- scenario 2: a rule misfires on every node ---------------------------------------------------------


def misfire(
    *,
    agents: int,
    processes: int,
    scale: float,
    settle: float = 900.0,
    window: float = 600.0,
    light: bool = False,
) -> Measured:
    """At simulated second 120 (past the policy's 60 s startup delay) the DMA error appears on every node at
    once; the budget's effect is read from the API server's requests for ``settle`` simulated seconds. The
    API load (requests and objects returned per second, all agents and per agent) is measured over the first
    ``window`` simulated seconds of the wave, whatever the convergence: one span for every fleet size."""
    from agent.recovery.budget import budget_lease_name, resolve_limit
    from agent.recovery.policyfile import DEFAULT_POLICY

    limit = resolve_limit(DEFAULT_POLICY.budget, domains=agents)
    start = 120.0
    with Fleet(agents=agents, processes=processes, scale=scale, light=light) as fleet:
        assert fleet.sim is not None
        sim = fleet.sim
        fleet.sim.until(start)
        fleet.inject(DMA_LINE)
        converged: float | None = None
        while sim.mono() < start + settle:
            time.sleep(1.0)
            answered = _answered(fleet, since=start)
            if len(answered) == agents and converged is None:
                converged = max(answered.values()) - start
                break
        fleet.sim.until(max(sim.mono() + 60.0, start + window))  # a minute more: nothing new may start
        records = fleet.requests(start, float("inf"))
        end = sim.mono()
    marks = sum(r["marks"] for r in fleet.final.values())
    over, peak = cordoned_over(records, limit)
    lease = [r for r in records if _lease(r) == budget_lease_name(CLUSTER)]
    pause_reads = sum(1 for r in records if _lease(r) and _lease(r) != budget_lease_name(CLUSTER))
    grants = sum(1 for r in lease if r.method in ("PUT", "POST") and r.status in (200, 201))
    conflicts = sum(1 for r in lease if r.status == 409)
    per10 = window_counts([sim.at(r.at) for r in records], start=start, end=end, width=10.0)
    lists = sum(1 for r in records if r.method == "GET" and r.path == "/api/v1/nodes")
    # Losers of one round reading the Lease again together show as a burst (a pulse) within one simulated second.
    lease_peak = max(window_counts([sim.at(r.at) for r in lease], start=start, end=end, width=1.0))
    load = [r for r in records if sim.at(r.at) < start + window]
    objects = sum(r.objects for r in load)
    kinds = Counter(f"{r.method} {_kind(r.path)}" for r in load)
    objects_by = Counter()
    for r in load:
        objects_by[f"{r.method} {_kind(r.path)}"] += r.objects
    return Measured(
        figures={
            "fleet.actions_over_budget": float(over + max(0, marks - limit)),
            "fleet.lease_requests_per_grant": len(lease) / grants if grants else float("inf"),
            "fleet.lease_conflicts_per_grant": conflicts / grants if grants else float("inf"),
            "fleet.converge_blocked_s": converged if converged is not None else float("inf"),
            "fleet.misfire_peak_requests_per_s": max(per10) / 10.0,
            "fleet.misfire_requests_per_s": len(load) / window,
            "fleet.misfire_objects_per_s": objects / window,
            "fleet.misfire_requests_per_s_per_agent": len(load) / window / agents,
            "fleet.misfire_objects_per_s_per_agent": objects / window / agents,
        },
        notes=[
            f"misfire: {agents} agents at x{scale:g}, limit {limit}: at most {peak} cordoned at once, {marks} marked; "
            f"{len(lease)} budget Lease requests, {conflicts} conflicts, {grants} grants ({pause_reads} pause Lease "
            f"reads); per agent {len(lease) / agents:.1f} budget Lease requests and {conflicts / agents:.1f} "
            f"conflicts, at most {lease_peak} in one simulated second; {lists} node LISTs in "
            f"{end - start:.0f} simulated s; every node blocked or holding after "
            + (f"{converged:.0f} s" if converged is not None else f"more than {settle:.0f} s (not converged)"),
            f"misfire load, {agents} agents, the wave's first {window:.0f} simulated s: {len(load) / window:.1f} "
            f"requests/s and {objects / window:.1f} objects/s in all, per agent {len(load) / window / agents:.4f} "
            f"and {objects / window / agents:.4f}; by request (count, objects): "
            + ", ".join(f"{k} {n} {objects_by[k]}" for k, n in kinds.most_common(8)),
        ],
    )


def _kind(path: str) -> str:
    """A request's resource, names left out: ``nodes``, ``nodes/NAME``, ``leases/NAME``, ``events``..."""
    parts = path.strip("/").split("/")
    if "namespaces" in parts:
        parts = parts[parts.index("namespaces") + 2 :]
    else:
        parts = parts[2:] if parts[:1] == ["api"] else parts[3:]
    if not parts:
        return "?"
    if len(parts) == 1:
        return f"{parts[0]} (list)"
    return parts[0] + ("/" + "/".join(parts[2:]) if len(parts) > 2 else "/NAME")


def pause_mid_wave(
    *, agents: int, processes: int, scale: float, after: float = 60.0, startup_delay: float = 10.0
) -> Measured:
    """The misfire of :func:`misfire` with a cluster-wide pause (``node-health-agent pause``'s own code) issued
    as soon as the API server sees the wave's first cordon: how long after the pause Lease was written a new
    action (a cordon on the server, a mark-unhealthy in an agent) still started, over ``after`` simulated
    seconds. 0 when none did."""
    from agent.adapters.kube import KubeClient
    from agent.app.commands.pause import apply
    from agent.recovery.holds import PauseStore, Scope, pause_lease_name

    start = 2 * startup_delay  # past the policy's startup delay (shortened: this scenario runs at a low scale)
    with Fleet(agents=agents, processes=processes, scale=scale, startup_delay=startup_delay) as fleet:
        assert fleet.sim is not None
        sim = fleet.sim
        client = KubeClient.load(kubeconfig=fleet.kubeconfig)
        try:
            sim.until(start)
            fleet.inject(DMA_LINE)
            deadline = time.monotonic() + 600.0 / scale
            while not _cordons(fleet.requests(start)):
                if time.monotonic() > deadline:
                    raise RuntimeError("no node was cordoned within 600 simulated s of the misfire")
                time.sleep(0.01)
            store = PauseStore(client=client, namespace=NAMESPACE, lease_name=pause_lease_name(CLUSTER))
            apply(
                store,
                command="pause",
                scope=Scope.CLUSTER,
                value="",
                by="bench",
                why="misfire",
                now=sim.now(),
                every={},
            )
        finally:
            client.close()
        records = fleet.requests(start)
        (paused,) = [
            sim.at(r.at)
            for r in records
            if _lease(r) == pause_lease_name(CLUSTER) and r.method in ("POST", "PUT") and r.status < 300
        ]
        sim.until(paused + after)
        records = fleet.requests(start)
    marks = [t for report in fleet.final.values() for t in report["mark_times"]]
    starts = sorted([t for t, _ in _cordons(records, sim)] + marks)
    late = [t for t in starts if t >= paused]
    return Measured(
        figures={
            "fleet.pause_effective_s": (late[-1] - paused) if late else 0.0,
            "fleet.pause_remedies_after": float(sum(1 for t in marks if t >= paused)),
        },
        notes=[
            f"pause mid-wave: {agents} agents at x{scale:g}; the pause written {paused - start:.1f} simulated s into "
            f"the wave, after {len(starts) - len(late)} actions; {len(late)} started after it"
            + (f", the last {late[-1] - paused:.1f} s after" if late else "")
            + f" (cordons {len(_cordons(records, sim))}, marks {len(marks)}; watched {after:.0f} s)"
        ],
    )


def _lease(record: Any) -> str:
    """The name of the Lease a request is about ("" for other requests; a create names it in its body)."""
    if "/leases" not in record.path:
        return ""
    if record.path.endswith("/leases"):
        return str(((record.body or {}).get("metadata") or {}).get("name", "")) if isinstance(record.body, dict) else ""
    return record.path.rsplit("/", 1)[-1]


def _cordons(records: Iterable[Any], sim: SimTime | None = None) -> list[tuple[float, str]]:
    """(arrival, node) of every cordon PATCH the server accepted (simulated s when ``sim`` is given)."""
    out = []
    for r in records:
        cordon = isinstance(r.body, dict) and (r.body.get("spec") or {}).get("unschedulable") is True
        if cordon and r.method == "PATCH" and r.status == 200 and not r.path.endswith("/status"):
            out.append((sim.at(r.at) if sim is not None else r.at, r.path.rsplit("/", 1)[-1]))
    return out


def _answered(fleet: Fleet, *, since: float) -> dict[str, float]:
    """Nodes that reported RecoveryBlocked or cordoned, with when (simulated s), from the server's view."""
    assert fleet.sim is not None
    out: dict[str, float] = {}
    records = fleet.requests(since)
    for node, reason, at in event_reasons(records):
        if reason == "RecoveryBlocked":
            out.setdefault(node, fleet.sim.at(at))
    for r in records:
        cordon = isinstance(r.body, dict) and (r.body.get("spec") or {}).get("unschedulable") is True
        if cordon and r.method == "PATCH" and r.status == 200 and not r.path.endswith("/status"):
            out.setdefault(r.path.rsplit("/", 1)[-1], fleet.sim.at(r.at))
    return out


# ---- scenario 3: the API server down ---------------------------------------------------------------------


RESYNC_WINDOW = 300.0  # simulated seconds after the API server returns over which the resync's load is measured


def outage(
    *,
    agents: int,
    processes: int,
    scale: float,
    down: float = 600.0,
    settle: float = 900.0,
    light: bool = False,
    stepped: bool = False,
) -> Measured:
    """The API server drops every connection for ``down`` simulated seconds; a minute into it every node's
    root filesystem goes read-only (a condition change and its Event to deliver). Requests per node-minute
    while down; time until every node's conditions and Events are on the server after it returns."""
    start = 300.0
    with _fleet(agents=agents, processes=processes, scale=scale, light=light, stepped=stepped) as fleet:
        assert fleet.sim is not None
        sim = fleet.sim
        sim.until(start)
        fleet.server.outage_requests.clear()
        fleet.server.set_outage("drop")
        down_at = time.monotonic()
        sim.until(start + 60.0)
        fleet.inject(READONLY_LINE)
        sim.until(start + down)
        fleet.server.set_outage(None)
        up_at = time.monotonic()
        during = [r for r in fleet.server.outage_requests.snapshot() if down_at <= r.at < up_at]
        converged = None
        while sim.mono() < start + down + settle:
            sim.until(sim.mono() + 5.0)
            if _outage_done(fleet, agents):
                converged = sim.mono() - (start + down)
                break
        sim.until(max(sim.mono(), start + down + RESYNC_WINDOW))
        wrong = _wrong_conditions(fleet)
        events = {n for n, reason, _ in event_reasons(fleet.requests(start)) if reason == "FilesystemIsReadOnly"}
        resync = fleet.requests(start + down, start + down + RESYNC_WINDOW)
    lost = agents - len(events)
    minutes = down / 60.0
    objects = sum(r.objects for r in resync)
    return Measured(
        figures={
            "fleet.outage_requests_per_node_min": len(during) / agents / minutes,
            "fleet.converge_s": converged if converged is not None else float("inf"),
            "fleet.events_lost": float(lost),
            "fleet.conditions_wrong": float(wrong),
            "fleet.outage_resync_requests_per_s": len(resync) / RESYNC_WINDOW,
            "fleet.outage_resync_objects_per_s": objects / RESYNC_WINDOW,
            "fleet.outage_resync_requests_per_s_per_agent": len(resync) / RESYNC_WINDOW / agents,
            "fleet.outage_resync_objects_per_s_per_agent": objects / RESYNC_WINDOW / agents,
        },
        notes=[
            f"outage: {agents} agents, {_mode(light=light, stepped=stepped, processes=processes, scale=scale)}, "
            f"{down:.0f} s down: "
            f"{len(during)} requests while down "
            f"({Counter(r.method for r in during).most_common()}); converged "
            + (f"{converged:.0f} s after it returned" if converged is not None else "not within the settle time")
        ],
    )


def _outage_done(fleet: Fleet, agents: int) -> bool:
    nodes = fleet.server.list_objects("nodes")
    ok = sum(
        1
        for n in nodes
        if any(
            c.get("type") == "ReadonlyFilesystem" and c.get("status") == "True"
            for c in (n.get("status") or {}).get("conditions") or []
        )
    )
    if ok < agents:
        return False
    assert fleet.sim is not None
    events = {n for n, reason, _ in event_reasons(fleet.server.requests.snapshot()) if reason == "FilesystemIsReadOnly"}
    return len(events) >= agents


def _wrong_conditions(fleet: Fleet) -> int:
    """Nodes whose conditions of our types on the server differ from the agent's own state."""
    report = fleet.report()
    wrong = 0
    for node in fleet.server.list_objects("nodes"):
        name = node["metadata"]["name"]
        mine = report.get(name, {}).get("conditions", {})
        theirs = {c["type"]: [c["status"], c["reason"]] for c in (node.get("status") or {}).get("conditions") or []}
        wrong += any(theirs.get(t) != v for t, v in mine.items())
    return wrong


# ---- scenario 4: a week at a real failure rate ---------------------------------------------------------


def week(*, nodes: int, rate_per_1000_node_days: float = 4.0, burst: int = 30, seed: int = 0) -> Measured:
    """A week of faults at ``rate_per_1000_node_days`` (Poisson arrivals) plus one correlated burst of
    ``burst`` nodes of one zone on day 4, on a stepped clock: the real recovery loops and budget of the
    nodes with a fault against the API server (healthy nodes' loops are quiet: they make no requests), Auto
    Scaling replacing a marked instance after 10 minutes. Steady faults never blocked; the burst held."""
    from bench.fleetweek import simulate_week

    result = simulate_week(nodes=nodes, rate=rate_per_1000_node_days, burst=burst, seed=seed)
    return Measured(
        figures={
            "fleet.week_steady_blocked": float(result.steady_blocked),
            "fleet.week_actions_over_budget": float(result.over),
            "fleet.week_burst_held": float(result.burst_held),
        },
        notes=[result.summary],
    )


def as_json(measured: Measured) -> str:
    return json.dumps({"figures": measured.figures, "notes": measured.notes}, indent=2)
