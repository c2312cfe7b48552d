"""The active checks' figures of ``bench/run.py validation`` (issue 36), each with the real parts:

* ``validation.active_started_with_holder``: the check scheduler with the gates as the agent wires them
  (:func:`agent.app.wiring.active.active_gates`, ``--device-holders``) against the real gRPC pod-resources
  test server, a pod holding ``neuron0``. An on-demand active check is requested and the scheduler stepped
  through ten minutes (an injected clock): its starts while the pod holds the device (0 = none; every skip
  must say ``DeviceBusy``). Then the pod leaves and the check must start, or the benchmark fails.
* ``validation.pass_invalidated_by_fault``: the main loop with the built-in rules; a pass of ``dcgm-diag``
  for GPU 3, an Xid 79 on GPU 0 (the pass must stay valid), then one on GPU 3: 1 when the pass is void at
  once (``valid`` false, ``invalidatedBy`` naming GPU 3, as ``/conditions`` shows it), else 0.
* ``validation.fleet_max_concurrent_share``: 100 nodes of one zone on the test API server, each its own
  :class:`~agent.checks.fleetslots.FleetSlots` in its own thread, all due at once (the default share, 10 %):
  the most nodes holding a slot at once (counted in the threads and read back from the Lease) / 100. Every
  node must run once in the end, or the benchmark fails.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from pathlib import Path
from typing import Any

NODES = 100
GPU0, GPU3 = "0000:53:00.0", "0000:97:00.0"  # a p5's first and fourth GPU


class _Counted:
    """An active check that counts its starts."""

    name = "neuron-diag"
    conditions = ()

    def __init__(self) -> None:
        self.starts = 0

    def run(self) -> list[Any]:
        from agent.checks.model import CheckResult, CheckStatus

        self.starts += 1
        return [CheckResult(status=CheckStatus.OK, condition=None, reason="Passed", message="passed")]


def _settings(tmp: Path, socket: str) -> Any:
    from agent.app.settings import Settings

    return Settings(
        standalone=True,
        config_files=(),
        plugins_dirs=(),
        kmsg_path=tmp / "unused",
        kmsg_relay=None,
        listen=None,
        state_dir=tmp / "state",
        lookback=300.0,
        stall_timeout=60.0,
        node_name="bench-node",
        device_holders=True,
        dev_root=tmp / "dev",
        sys_root=tmp / "sys",
        pod_resources_socket=socket,
    )


def _scheduler(check: _Counted, gates: Any, pending: list[Any]) -> Any:
    from agent.checks.model import ActiveSpec, ScheduledCheck
    from agent.checks.scheduler import CheckScheduler
    from agent.core.bus import Inbox
    from agent.core.validation import ValidationRequest

    spec = ScheduledCheck(
        check=check,
        interval=0.0,
        timeout=600.0,
        kind="python",
        origin="bench",
        active=ActiveSpec(devices="neuron", on_demand=True, dormant=True),
    )
    request = ValidationRequest(id="startup", checks=(check.name,), requested_at=0.0)
    return CheckScheduler(
        checks=[spec],
        inbox=Inbox(),
        clock=lambda: 1_767_225_600.0,
        start_thread=lambda target, name: pending.append(target),
        rng=random.Random(0),
        gates=gates,
        requests=lambda: (request,),
    )


def _step(scheduler: Any, pending: list[Any], now: float) -> list[str]:
    """One scheduler step and the runs it started; the skip reasons it reported."""
    reports, _ = scheduler.step(now)
    while pending:
        pending.pop(0)()
    return [r.reason for report in reports if report.skipped for r in report.results]


def started_with_holder(tmp: Path) -> float:
    from agent.app.wiring.active import active_gates
    from agent.checks.active import DEVICE_BUSY

    from helpers.podresources_server import Container, Pod, PodResourcesServer

    (tmp / "dev").mkdir(parents=True)
    (tmp / "dev" / "neuron0").touch()
    socket = str(tmp / "kubelet.sock")
    holder = Pod("ml", "train-0", [Container("main", devices={"aws.amazon.com/neuron": ["0"]})])
    check, pending = _Counted(), []
    with PodResourcesServer(socket, [holder]) as kubelet:
        scheduler = _scheduler(check, active_gates(_settings(tmp, socket), kube=None), pending)
        skips = [reason for t in range(0, 600, 5) for reason in _step(scheduler, pending, float(t))]
        held = check.starts
        if not skips or set(skips) != {DEVICE_BUSY}:
            said = sorted(set(skips))
            raise SystemExit(f"validation benchmark: the held device was skipped as {said}, not DeviceBusy")
        kubelet.pods.clear()  # the pod leaves: the check starts (the lookup's answer is cached 2 s)
        t, deadline = 600.0, time.monotonic() + 30
        while check.starts == 0 and time.monotonic() < deadline:
            t += 5
            _step(scheduler, pending, t)
            time.sleep(0.02)
    if check.starts == 0:
        raise SystemExit("validation benchmark: the active check never started once the device was free")
    return float(held)


def pass_invalidated(tmp: Path) -> float:
    from agent.app.config import load_rule_set
    from agent.checks.model import ActiveSpec, CheckReport, CheckResult, CheckStatus
    from agent.core.bus import RecordBatch
    from agent.core.paths import builtin_plugins_dir
    from agent.sinks.stdout import snapshot_json

    from helpers.mainloop import Loop, record

    state = tmp / "state"
    state.mkdir(parents=True)
    loop = Loop(load_rule_set([builtin_plugins_dir()]), state)
    key = f"gpu:{GPU3}"
    passed = CheckResult(status=CheckStatus.OK, condition=None, reason="DiagPassed", message="level 2", devices=(key,))
    t0 = loop.clock.now
    loop.put(
        CheckReport(
            check="dcgm-diag",
            results=(passed,),
            finished_at=t0,
            duration=120.0,
            active=ActiveSpec(devices="gpu", valid_for=86_400.0),
        )
    )
    loop.step()

    def gpu3() -> dict[str, Any]:
        doc = snapshot_json(loop.feed.latest().snapshot)
        return next(v for v in doc["validations"] if v["devices"] == [key])

    def xid79(seq: int, pci: str) -> None:
        bus = pci.rsplit(".", 1)[0]  # the Xid printer leaves the function out
        loop.put(RecordBatch(records=[record(seq, f"NVRM: Xid (PCI:{bus}): 79, GPU has fallen off the bus.", ts=t0)]))
        loop.step()

    valid_at_first = gpu3()["valid"]
    xid79(1, GPU0)
    kept = gpu3()["valid"]
    xid79(2, GPU3)
    voided = gpu3()
    ok = valid_at_first and kept and not voided["valid"] and voided["invalidatedBy"].endswith(f"on {key}")
    return 1.0 if ok else 0.0


class _Fleet:
    """What the simulated nodes saw: how many held a slot at once, and who ran."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.holding = 0
        self.peak = 0
        self.ran: set[str] = set()


def _lease_holders(client: Any, namespace: str) -> int:
    from agent.checks.fleetslots import SLOTS_ANNOTATION, lease_name

    lease = client.get_lease(namespace, lease_name("topology.kubernetes.io/zone=us-west-2a"))
    holders = json.loads(lease["metadata"]["annotations"][SLOTS_ANNOTATION])["holders"]
    now = time.time()
    return sum(1 for h in holders.values() if h["expires"] > now)


def _node(i: int, client: Any, fleet: _Fleet, start: threading.Barrier, deadline: float) -> None:
    from agent.checks.fleetslots import GRANTED, FleetSlots

    from helpers.recovery import NS

    name = f"node-{i:03d}"
    rng = random.Random(i)
    # a slot expires 7 s after it is taken (the agent's: the check's timeout + 60 s): a release lost to
    # a write race frees the slot quickly, never a run still going (each runs 0.1 s)
    slots = FleetSlots(client=client, namespace=NS, node_name=name, grace=2.0, rng=rng)
    start.wait()
    while time.monotonic() < deadline:
        if slots.acquire(check="dcgm-diag", timeout=5.0).outcome == GRANTED:
            on_lease = _lease_holders(client, NS)
            with fleet.lock:
                fleet.holding += 1
                fleet.peak = max(fleet.peak, fleet.holding, on_lease)
            time.sleep(0.1)  # the check runs
            with fleet.lock:
                fleet.holding -= 1
                fleet.ran.add(name)
            slots.release()
            return
        time.sleep(rng.uniform(0.1, 0.4))  # the scheduler's jittered retry (30-90 s in the agent), scaled


def fleet_share(tmp: Path) -> float:
    from helpers import kube_clients
    from helpers.recovery import prepare
    from kubeapi.server import KubeApiServer

    api = prepare(KubeApiServer().start())
    for i in range(NODES):
        labels = {"topology.kubernetes.io/zone": "us-west-2a"}
        api.put_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"node-{i:03d}", "labels": labels}})
    fleet = _Fleet()
    quiet = logging.getLogger("agent.checks.fleetslots")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # lost write races are expected here
    try:
        with kube_clients(api, tmp, timeout=30.0) as make:
            clients = [make() for _ in range(10)]
            start = threading.Barrier(NODES)
            deadline = time.monotonic() + 240
            threads = [
                threading.Thread(target=_node, args=(i, clients[i % 10], fleet, start, deadline), daemon=True)
                for i in range(NODES)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=300)
    finally:
        quiet.setLevel(level)
        api.stop()
    if len(fleet.ran) != NODES:
        raise SystemExit(f"validation benchmark: {len(fleet.ran)} of {NODES} nodes ran their active check")
    return fleet.peak / NODES


def measure(tmp: Path) -> dict[str, float]:
    for name in ("holder", "invalidation", "fleet"):
        (tmp / name).mkdir()
    return {
        "validation.active_started_with_holder": started_with_holder(tmp / "holder"),
        "validation.pass_invalidated_by_fault": pass_invalidated(tmp / "invalidation"),
        "validation.fleet_max_concurrent_share": fleet_share(tmp / "fleet"),
    }
