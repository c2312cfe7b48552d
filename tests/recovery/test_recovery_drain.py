"""The drain against the test API server (real client, real PodDisruptionBudgets), on fake time.

As on a real cluster, an accepted eviction only marks the pod (``deletionTimestamp``); it goes
when its kubelet confirms (``server.kubelet.confirm()``). ``FakeTime.sleep`` is the drain's sleep:
it advances the fake clock and runs what the test scheduled for that time (the kubelet confirming,
an outage beginning or ending, a stop).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes.client import CoreV1Api

from agent.adapters.kube import KubeClient, KubeError
from agent.recovery.drain import Drainer, DrainOutcome, DrainResult, SkippedPod, skip_reason
from agent.recovery.model import MIRROR_POD_ANNOTATION, SAFE_TO_EVICT_ANNOTATION, DrainSettings, OnDeadline

from helpers import finishes, kube_client
from kubeapi import KubeApiServer
from kubeapi.authz import PolicyRule

pytest_plugins = ["kubeapi.fixtures"]

NODE = "node-1"
EVICTIONS = r"/pods/[^/]+/eviction$"


class FakeTime:
    """The drain's clock and sleep. ``at(t, fn)`` runs ``fn`` once when the clock reaches ``t``;
    ``every_sleep`` runs after each sleep (e.g. a kubelet confirming terminations as time passes)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept = 0
        self._scheduled: list[tuple[float, Callable[[], object]]] = []
        self.every_sleep: Callable[[], object] | None = None

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0, "the drain never sleeps for nothing"
        self.now += seconds
        self.slept += 1
        due = [(t, fn) for t, fn in self._scheduled if t <= self.now]
        self._scheduled = [(t, fn) for t, fn in self._scheduled if t > self.now]
        for _, fn in sorted(due, key=lambda item: item[0]):
            fn()
        if self.every_sleep is not None:
            self.every_sleep()

    def at(self, when: float, fn: Callable[[], object]) -> None:
        self._scheduled.append((when, fn))


class Timed:
    """The real client, noting the fake time of each call; ``before_evict(namespace, name)`` runs
    before each eviction is sent."""

    def __init__(self, client: KubeClient, fake: FakeTime) -> None:
        self._client = client
        self._time = fake
        self.calls: list[tuple[float, str, str]] = []  # (time, method, namespace/name)
        self.before_evict: Callable[[str, str], object] | None = None

    def list_pods_on_node(self, node_name: str) -> list[dict[str, Any]]:
        self.calls.append((self._time.now, "list", node_name))
        return self._client.list_pods_on_node(node_name)

    def evict_pod(self, namespace: str, name: str, **kwargs: Any) -> dict[str, Any]:
        self.calls.append((self._time.now, "evict", f"{namespace}/{name}"))
        if self.before_evict is not None:
            self.before_evict(namespace, name)
        return self._client.evict_pod(namespace, name, **kwargs)

    def delete_pod(self, namespace: str, name: str, **kwargs: Any) -> dict[str, Any]:
        self.calls.append((self._time.now, "delete", f"{namespace}/{name}"))
        return self._client.delete_pod(namespace, name, **kwargs)

    def times(self, method: str, pod: str | None = None) -> list[float]:
        return [t for t, m, p in self.calls if m == method and (pod is None or p == pod)]


class Setup:
    def __init__(self, server: KubeApiServer, client: KubeClient) -> None:
        self.server = server
        self.time = FakeTime()
        self.client = Timed(client, self.time)
        self.reports: list[tuple[float, str, str]] = []

    def drainer(self, *, report: Callable[[str, str], None] | None = None, **settings: Any) -> Drainer:
        return Drainer(
            client=self.client,
            node_name=NODE,
            settings=DrainSettings(**settings),
            clock=self.time.clock,
            sleep=self.time.sleep,
            report=report or (lambda kind, message: self.reports.append((self.time.now, kind, message))),
            rng=lambda: 0.5,  # no jitter
        )

    def drain(self, stop: threading.Event | None = None, **settings: Any) -> DrainResult:
        return self.drainer(**settings).run(stop or threading.Event())

    def kubelet_confirms(self) -> None:
        """From now on the node's kubelet confirms terminations whenever time passes."""
        self.time.every_sleep = lambda: self.server.kubelet.confirm(node=NODE)

    def kinds(self) -> list[str]:
        return [kind for _, kind, _ in self.reports]

    def on_node(self) -> list[str]:
        return sorted(
            f"{p['metadata']['namespace']}/{p['metadata']['name']}"
            for p in self.server.list_objects("pods")
            if p["spec"].get("nodeName") == NODE
        )

    def evictions(self) -> int:
        return self.server.requests.count(method="POST", path_regex=EVICTIONS)


@pytest.fixture
def setup(kube_api_server: KubeApiServer, tmp_path) -> Iterator[Setup]:
    kube_api_server.put_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    with kube_client(kube_api_server, tmp_path) as client:
        yield Setup(kube_api_server, client)


def pod(
    name: str,
    *,
    namespace: str = "default",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    owner: str | None = None,
    phase: str = "Running",
    node: str = NODE,
) -> dict[str, Any]:
    """A Running+Ready pod bound to ``node`` (as the scheduler and kubelet would leave it)."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels or {}}
    if annotations:
        meta["annotations"] = annotations
    if owner:
        meta["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": owner, "name": f"{name}-owner", "uid": f"uid-{name}", "controller": True}
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.9"}],
            "terminationGracePeriodSeconds": 30,  # the default a created pod gets: deletion is graceful
        },
        "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def pdb(name: str, *, app: str, min_available: int, namespace: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": app}}},
    }


def put(server: KubeApiServer, *objects: dict[str, Any]) -> None:
    for obj in objects:
        server.put_object(obj)


# ---- the plain drain ---------------------------------------------------------------------------


def test_plain_drain_evicts_every_pod_and_waits_for_them(setup) -> None:
    put(setup.server, pod("a"), pod("b", namespace="team"), pod("c"), pod("elsewhere", node="node-2"))
    setup.kubelet_confirms()

    result = setup.drain()

    assert result.outcome is DrainOutcome.DONE
    assert sorted(result.evicted) == ["default/a", "default/c", "team/b"]
    assert result.deleted == result.remaining == result.skipped == ()
    assert setup.on_node() == [] and setup.server.get_object("pods", "elsewhere") is not None
    assert setup.evictions() == 3
    assert setup.kinds() == ["DrainStarted", "DrainSucceeded"]
    assert "3 pods to move" in setup.reports[0][2]


def test_an_empty_node_is_done_at_once(setup) -> None:
    result = setup.drain()
    assert result.outcome is DrainOutcome.DONE and setup.time.now == 0
    assert setup.kinds() == ["DrainStarted", "DrainSucceeded"]


@pytest.mark.parametrize("on_deadline", [OnDeadline.REPORT, OnDeadline.DELETE])
def test_daemonset_mirror_finished_and_protected_pods_stay(setup, on_deadline) -> None:
    put(
        setup.server,
        pod("ds", owner="DaemonSet"),
        pod("static", annotations={MIRROR_POD_ANNOTATION: "abc"}),
        pod("done", phase="Succeeded"),
        pod("crashed", phase="Failed"),
        pod("keep", annotations={SAFE_TO_EVICT_ANNOTATION: "false"}),
        pod("free", owner="ReplicaSet", annotations={SAFE_TO_EVICT_ANNOTATION: "true"}),
    )
    setup.kubelet_confirms()

    result = setup.drain(pod_deadline=60, on_deadline=on_deadline)

    assert result.outcome is DrainOutcome.DEADLINE
    assert result.evicted == ("default/free",) and result.deleted == ()
    assert result.skipped == (
        SkippedPod(pod="default/crashed", why="Failed"),
        SkippedPod(pod="default/done", why="Succeeded"),
        SkippedPod(pod="default/ds", why="DaemonSet"),
        SkippedPod(pod="default/static", why="mirror pod"),
    )
    assert result.remaining == ("default/keep",)
    assert setup.on_node() == ["default/crashed", "default/done", "default/ds", "default/keep", "default/static"]
    assert setup.evictions() == 1
    assert setup.server.requests.count(method="DELETE", path_regex=r"/pods/") == 0  # never, even with DELETE
    # The protected pod was waited for (it might have finished on its own) until its deadline.
    assert setup.time.now == pytest.approx(60)
    assert setup.kinds() == ["DrainStarted", "DrainPodDeadline", "DrainIncomplete"]
    assert "default/keep" in setup.reports[1][2] and SAFE_TO_EVICT_ANNOTATION in setup.reports[1][2]


def test_a_protected_pod_that_finishes_on_its_own_completes_the_drain(setup) -> None:
    put(setup.server, pod("job", annotations={SAFE_TO_EVICT_ANNOTATION: "False"}))
    setup.time.at(20, lambda: setup.server.put_object(pod("job", phase="Succeeded")))

    result = setup.drain(pod_deadline=60)

    assert result.outcome is DrainOutcome.DONE and result.skipped == (SkippedPod(pod="default/job", why="Succeeded"),)
    assert setup.evictions() == 0 and 20 <= setup.time.now < 25


@pytest.mark.parametrize(
    ("pod_", "why"),
    [
        (pod("x", owner="DaemonSet"), "DaemonSet"),
        (pod("x", owner="StatefulSet"), None),
        (pod("x", annotations={MIRROR_POD_ANNOTATION: "h"}), "mirror pod"),
        (pod("x", phase="Succeeded"), "Succeeded"),
        (pod("x", phase="Pending"), None),
        (pod("x", annotations={SAFE_TO_EVICT_ANNOTATION: "false"}), None),  # not skipped: protected
    ],
)
def test_skip_reason(pod_, why) -> None:
    assert skip_reason(pod_) == why


# ---- PodDisruptionBudgets ----------------------------------------------------------------------


@pytest.mark.parametrize("on_deadline", [OnDeadline.REPORT, OnDeadline.DELETE])
def test_a_pod_its_budget_keeps_reaches_its_deadline(setup, on_deadline) -> None:
    put(
        setup.server,
        pod("web-1", labels={"app": "web"}),
        pod("web-2", labels={"app": "web"}, node="node-2"),
        pdb("web", app="web", min_available=2),
        pod("free"),
    )
    setup.kubelet_confirms()

    result = setup.drain(pod_deadline=30, on_deadline=on_deadline)

    # "free" first (0), then web-1 within the rate cap (0.2), retried with backoff (5 s, 10 s, next one past 30).
    assert setup.client.times("evict", "default/web-1") == pytest.approx([0.2, 5.2, 15.2])
    assert "default/free" in result.evicted
    if on_deadline is OnDeadline.REPORT:
        assert result.outcome is DrainOutcome.DEADLINE and result.remaining == ("default/web-1",)
        assert setup.on_node() == ["default/web-1"]
        assert setup.server.requests.count(method="DELETE", path_regex=r"/pods/") == 0
        assert setup.kinds() == ["DrainStarted", "DrainPodDeadline", "DrainIncomplete"]
        assert "PodDisruptionBudget" in setup.reports[1][2] and "PodDisruptionBudget" in result.message
    else:
        assert result.outcome is DrainOutcome.DONE and result.deleted == ("default/web-1",)
        assert setup.on_node() == [] and setup.client.times("delete") == [pytest.approx(30)]
        assert setup.kinds() == ["DrainStarted", "DrainPodDeadline", "DrainSucceeded"]
        assert "bypassed" in setup.reports[1][2]
    assert setup.server.get_object("pods", "web-2") is not None


def test_a_budget_that_frees_up_lets_the_eviction_through(setup) -> None:
    put(
        setup.server,
        pod("web-1", labels={"app": "web"}),
        pod("web-2", labels={"app": "web"}, node="node-2"),
        pdb("web", app="web", min_available=2),
    )
    setup.kubelet_confirms()
    setup.time.at(12, lambda: setup.server.put_object(pod("web-3", labels={"app": "web"}, node="node-2")))

    result = setup.drain(pod_deadline=300)

    assert result.outcome is DrainOutcome.DONE and result.evicted == ("default/web-1",)
    assert setup.client.times("evict") == [0, 5, 15]  # refused, refused, allowed once a replacement runs


@pytest.mark.parametrize(
    ("fault", "attempts"),
    [
        pytest.param({"status": 429, "retry_after": 40}, [0, 40], id="429 Retry-After honoured"),
        pytest.param({"status": 429}, [0, 5], id="429 backoff"),
        pytest.param({"status": 503, "retry_after": 12}, [0, 12], id="503 Retry-After honoured"),
        pytest.param({"status": 500, "count": 2}, [0, 5, 15], id="500 backoff grows"),
    ],
)
def test_a_refused_eviction_is_retried_after_a_while(setup, fault, attempts) -> None:
    put(setup.server, pod("a"))
    setup.server.faults.add(method="POST", path_regex=EVICTIONS, **fault)
    setup.kubelet_confirms()

    result = setup.drain(pod_deadline=300)

    assert result.outcome is DrainOutcome.DONE and result.evicted == ("default/a",)
    assert setup.client.times("evict") == attempts


# ---- pods that linger --------------------------------------------------------------------------


def test_a_terminating_pod_is_waited_for_never_evicted_again(setup) -> None:
    put(setup.server, pod("slow"), pod("leaving"))
    with setup.server.api_client() as api_client:  # someone deleted it before the drain: it terminates
        CoreV1Api(api_client).delete_namespaced_pod("leaving", "default")
    assert setup.server.get_object("pods", "leaving")["metadata"]["deletionTimestamp"]

    result = setup.drain(wait_for_deletion=30)  # the kubelet never confirms

    assert result.outcome is DrainOutcome.DEADLINE
    assert result.evicted == ("default/slow",)
    assert result.remaining == ("default/leaving", "default/slow")
    assert setup.client.times("evict") == [0]  # "leaving" never, "slow" once
    assert len(setup.client.times("list")) > 5  # it looked again and again while waiting
    assert setup.time.now == pytest.approx(30)
    assert setup.kinds() == ["DrainStarted", "DrainPodDeadline", "DrainPodDeadline", "DrainIncomplete"]
    assert "still terminating" in result.message


def test_a_pod_confirmed_gone_while_waiting_completes_the_drain(setup) -> None:
    put(setup.server, pod("slow"))
    setup.time.at(10, lambda: setup.server.kubelet.confirm(node=NODE))

    result = setup.drain(wait_for_deletion=30)

    assert result.outcome is DrainOutcome.DONE and setup.evictions() == 1
    assert 10 <= setup.time.now <= 12  # noticed at the next listing


def test_an_eviction_answered_404_means_already_gone(setup) -> None:
    put(setup.server, pod("a"), pod("b"))
    setup.kubelet_confirms()
    # The pod disappears between our listing and our eviction (its kubelet finished it).
    setup.client.before_evict = lambda ns, name: name == "a" and setup.server.delete_object("pods", name, ns)

    result = setup.drain()

    assert result.outcome is DrainOutcome.DONE and result.evicted == ("default/b",)
    assert setup.server.requests.count(method="POST", path_regex=EVICTIONS, status=404) == 1


# ---- bounds: rate, timeout, stop ---------------------------------------------------------------


def test_evictions_are_rate_capped(setup) -> None:
    put(setup.server, *(pod(f"p{i}") for i in range(6)))
    setup.kubelet_confirms()

    result = setup.drain(evictions_per_second=2)

    assert result.outcome is DrainOutcome.DONE and len(result.evicted) == 6
    assert setup.client.times("evict") == pytest.approx([0, 0.5, 1.0, 1.5, 2.0, 2.5])


def test_the_total_timeout_ends_the_drain(setup) -> None:
    put(
        setup.server,
        pod("web-1", labels={"app": "web"}),
        pdb("web", app="web", min_available=1),
    )

    result = setup.drain(pod_deadline=600, timeout=50)

    assert result.outcome is DrainOutcome.TIMEOUT and result.remaining == ("default/web-1",)
    assert setup.time.now == pytest.approx(50)
    assert max(setup.client.times("evict")) < 50
    assert setup.kinds() == ["DrainStarted", "DrainTimeout"]


def test_a_stopped_drain_resumes_without_evicting_a_pod_twice(setup) -> None:
    put(setup.server, *(pod(f"p{i}") for i in range(4)))
    stop = threading.Event()
    setup.client.before_evict = lambda ns, name: name == "p1" and stop.set()  # stop arrives during p1's eviction

    first = setup.drain(stop, evictions_per_second=1)

    assert first.outcome is DrainOutcome.STOPPED and first.evicted == ("default/p0", "default/p1")
    assert setup.time.now < 2  # promptly
    assert setup.kinds() == ["DrainStarted"]  # no end report: it was not over
    assert len(setup.on_node()) == 4  # p0, p1 terminating (the kubelet has not confirmed yet)

    setup.client.before_evict = None
    setup.kubelet_confirms()
    second = setup.drain(evictions_per_second=1)

    assert second.outcome is DrainOutcome.DONE and second.evicted == ("default/p2", "default/p3")
    assert setup.evictions() == 4  # each pod once over both runs
    assert setup.on_node() == []


def test_a_stop_during_a_long_wait_returns_promptly(setup) -> None:
    put(setup.server, pod("web-1", labels={"app": "web"}), pdb("web", app="web", min_available=1))
    stop = threading.Event()
    setup.time.at(7, stop.set)

    result = setup.drain(stop, pod_deadline=600)

    assert result.outcome is DrainOutcome.STOPPED and result.remaining == ("default/web-1",)
    assert 7 <= setup.time.now <= 8


# ---- API trouble -------------------------------------------------------------------------------


def test_an_outage_mid_drain_is_ridden_out(setup) -> None:
    put(setup.server, *(pod(f"p{i}") for i in range(3)))
    setup.kubelet_confirms()
    setup.time.at(0.5, lambda: setup.server.set_outage("refuse"))
    setup.time.at(20, lambda: setup.server.set_outage(None))

    result = setup.drain(evictions_per_second=1)

    assert result.outcome is DrainOutcome.DONE and len(result.evicted) == 3
    assert setup.evictions() == 3  # answered ones; the refused ones never reached it
    assert setup.time.now >= 20 and setup.client.times("evict")[-1] >= 20


def test_an_outage_longer_than_the_timeout_times_out(setup) -> None:
    put(setup.server, pod("a"))
    setup.server.set_outage("refuse")

    result = setup.drain(timeout=60)

    assert result.outcome is DrainOutcome.TIMEOUT and setup.time.now == pytest.approx(60)
    assert setup.kinds() == ["DrainTimeout"]  # never got to list the pods


@pytest.mark.parametrize(
    ("rules", "outcome", "kinds"),
    [
        pytest.param([], DrainOutcome.FAILED, ["DrainFailed"], id="cannot list pods"),
        pytest.param(
            [PolicyRule(verbs=("list",), api_groups=("",), resources=("pods",))],
            DrainOutcome.FAILED,
            ["DrainStarted", "DrainPodFailed", "DrainPodFailed", "DrainFailed"],
            id="cannot evict",
        ),
    ],
)
def test_a_forbidden_drain_fails_and_says_why(setup, rules, outcome, kinds) -> None:
    put(setup.server, pod("a"), pod("b"))
    setup.server.restrict(rules)

    result = setup.drain()

    assert result.outcome is outcome and setup.kinds() == kinds
    assert "forbidden" in result.message.lower() or "forbidden" in setup.reports[-2][2].lower()
    assert setup.on_node() == ["default/a", "default/b"]


def test_a_broken_report_does_not_break_the_drain(setup) -> None:
    put(setup.server, pod("a"))
    setup.kubelet_confirms()

    def broken(kind: str, message: str) -> None:
        raise RuntimeError("the event sink is down")

    assert setup.drainer(report=broken).run(threading.Event()).outcome is DrainOutcome.DONE


class WatchedStop(threading.Event):
    """A stop event that notes each wait on it: ``waiting`` is set once one began; ``woken`` holds what
    each returned (True: woken by the stop; False: the wait ran out)."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = threading.Event()
        self.woken: list[bool] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waiting.set()
        woken = super().wait(timeout)
        self.woken.append(woken)
        return woken


def test_without_a_sleep_the_drain_waits_on_its_stop_event(setup) -> None:
    put(setup.server, pod("web-1", labels={"app": "web"}), pdb("web", app="web", min_available=1))
    stop = WatchedStop()
    drainer = Drainer(  # the fake clock stands still: no wait can run out, only the stop ends one
        client=setup.client,
        node_name=NODE,
        settings=DrainSettings(timeout=1e9, pod_deadline=1e9),
        clock=setup.time.clock,
        report=lambda kind, message: None,
    )

    def sigterm() -> None:  # the agent's SIGTERM, while the drain waits for the budget
        try:
            stop.waiting.wait(60)
        finally:
            stop.set()

    stopper = threading.Thread(target=sigterm)
    stopper.start()
    result = finishes(lambda: drainer.run(stop), what="the drain after its stop")
    stopper.join()
    assert result.outcome is DrainOutcome.STOPPED and result.remaining == ("default/web-1",)
    assert stop.woken and stop.woken[-1], "the last wait was woken by the stop, not by the end of the wait"


def test_kube_error_is_what_the_client_raises(setup) -> None:
    """The drain classifies KubeError: make sure the refused connection really arrives as one."""
    setup.server.set_outage("refuse")
    with pytest.raises(KubeError) as caught:
        setup.client.list_pods_on_node(NODE)
    assert caught.value.status is None and caught.value.transient


# ---- a device drain: only the pods holding the device ------------------------------------------------------


def device_drain(setup: Setup, only: frozenset[str], **settings: Any) -> DrainResult:
    return dataclasses.replace(setup.drainer(**settings), only=only).run(threading.Event())


def test_a_device_drain_moves_only_the_holder_pods(setup) -> None:
    put(setup.server, pod("holder", namespace="team"), pod("other-gpu", namespace="team"), pod("no-gpu"))
    setup.kubelet_confirms()

    result = device_drain(setup, frozenset({"team/holder"}))

    assert result.outcome is DrainOutcome.DONE and result.evicted == ("team/holder",)
    assert setup.on_node() == ["default/no-gpu", "team/other-gpu"]
    assert setup.evictions() == 1
    assert "1 device holder pods of node" in setup.reports[0][2]


def test_a_device_drain_respects_the_holders_disruption_budget(setup) -> None:
    put(
        setup.server,
        pod("holder", labels={"app": "train"}),
        pod("other", labels={"app": "train"}, node="node-2"),
        pdb("train", app="train", min_available=2),
    )
    setup.kubelet_confirms()

    result = device_drain(setup, frozenset({"default/holder"}), pod_deadline=60.0, timeout=120.0)

    assert result.outcome is DrainOutcome.DEADLINE and result.remaining == ("default/holder",)
    assert setup.on_node() == ["default/holder"]  # the budget keeps it; nothing deleted
