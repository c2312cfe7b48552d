"""Cordon, taint, uncordon and the incident record against the test API server (real client).

Each step must be idempotent and must keep what others put on the Node: ``spec.taints`` has no
patch strategy (a strategic merge patch replaces the list), so the steps read, modify and write with
the resourceVersion they read, and a concurrent change makes them read again.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes.client import CoreV1Api

from agent.adapters.kube import KubeClient, KubeError
from agent.core.timefmt import iso
from agent.recovery.model import INCIDENT_ANNOTATION, TAINT_KEY, Action, Incident, NodeView
from agent.recovery.node import (
    CLAIM_TTL,
    CONFLICT_ATTEMPTS,
    claim_mark,
    cordon,
    incident_from_json,
    incident_text,
    parse_incident,
    read_incident,
    read_node_view,
    store_incident,
    taint,
    taint_value,
    uncordon,
)

from helpers import kube_client
from kubeapi import KubeApiServer

pytest_plugins = ["kubeapi.fixtures"]

NODE = "node-1"
NOW = 1_767_225_600.0  # 2026-01-01T00:00:00Z
REASON = "NeuronHasError_DMA_ERROR"
INCIDENT = Incident(
    id=f"NeuronHealth/{REASON}/{NODE}/1767225000", condition="NeuronHealth", reason=REASON, since=NOW - 600, opened=NOW
)
FOREIGN = {"key": "example.com/maintenance", "value": "disk", "effect": "NoSchedule"}
FOREIGN_EXEC = {"key": "example.com/maintenance", "effect": "NoExecute", "timeAdded": "2025-12-31T00:00:00Z"}
OUR_TAINT = {"key": TAINT_KEY, "value": REASON, "effect": "NoSchedule", "timeAdded": iso(NOW)}
NODE_PATCH = rf"/api/v1/nodes/{NODE}$"


@pytest.fixture
def client(kube_api_server: KubeApiServer, tmp_path) -> Iterator[KubeClient]:
    with kube_client(kube_api_server, tmp_path) as kube:
        yield kube


def put_node(
    server: KubeApiServer,
    *,
    unschedulable: bool = False,
    taints: list[dict] | None = None,
    incident: Incident | str | None = None,
    annotations: dict[str, str] | None = None,
) -> None:
    notes = dict(annotations or {})
    if incident is not None:
        notes[INCIDENT_ANNOTATION] = incident if isinstance(incident, str) else incident_text(incident)
    spec: dict[str, Any] = {"providerID": "aws:///us-east-1a/i-0123456789abcdef0"}
    if unschedulable:
        spec["unschedulable"] = True
    if taints:
        spec["taints"] = copy.deepcopy(taints)
    server.put_object(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}, "annotations": notes},
            "spec": spec,
        }
    )


def node(server: KubeApiServer) -> dict:
    return server.get_object("nodes", NODE)


def patches(server: KubeApiServer) -> list:
    return server.requests.filter(method="PATCH", path_regex=NODE_PATCH)


def by_us(incident: Incident = INCIDENT, *done: Action) -> Incident:
    return dataclasses.replace(incident, cordoned_by_us=True, done=done or (Action.CORDON,))


# ---- cordon ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("start", "unschedulable_patched", "taints", "cordoned_by_us"),
    [
        pytest.param({}, True, [OUR_TAINT], True, id="fresh node"),
        pytest.param(
            {"taints": [FOREIGN, FOREIGN_EXEC]},
            True,
            [FOREIGN, FOREIGN_EXEC, OUR_TAINT],
            True,
            id="foreign taints kept",
        ),
        pytest.param(
            {"unschedulable": True, "taints": [FOREIGN]},
            False,
            [FOREIGN, OUR_TAINT],
            False,
            id="cordoned by someone else",
        ),
        pytest.param({"incident": "{not json"}, True, [OUR_TAINT], True, id="garbage annotation replaced"),
        pytest.param(
            {"unschedulable": True, "incident": by_us()},
            False,
            [OUR_TAINT],
            True,
            id="restart after our cordon lost the taint",
        ),
    ],
)
def test_cordon(kube_api_server, client, start, unschedulable_patched, taints, cordoned_by_us) -> None:
    put_node(kube_api_server, annotations={"other.io/keep": "yes"}, **start)

    update = cordon(client, node_name=NODE, incident=INCIDENT, reason=REASON, now=NOW)

    after = node(kube_api_server)
    assert after["spec"]["unschedulable"] is True
    assert after["spec"]["taints"] == taints
    assert after["metadata"]["annotations"]["other.io/keep"] == "yes"
    expected = dataclasses.replace(INCIDENT, cordoned_by_us=cordoned_by_us, done=(Action.CORDON,))
    assert read_incident(after) == expected
    assert update.incident == expected and update.changed
    assert update.view == NodeView(
        name=NODE,
        unschedulable=True,
        labels={"kubernetes.io/hostname": NODE},
        has_our_taint=True,
        provider_id="aws:///us-east-1a/i-0123456789abcdef0",
        uid=after["metadata"]["uid"],
    )
    [patch] = patches(kube_api_server)  # one conditional patch does it all
    assert patch.body["metadata"]["resourceVersion"]
    assert ("unschedulable" in patch.body["spec"]) is unschedulable_patched  # someone else's cordon is theirs


def test_cordon_twice_is_one_change(kube_api_server, client) -> None:
    put_node(kube_api_server, taints=[FOREIGN])
    first = cordon(client, node_name=NODE, incident=INCIDENT, reason=REASON, now=NOW)
    again = cordon(client, node_name=NODE, incident=INCIDENT, reason="OtherReason", now=NOW + 60)

    assert first.changed and not again.changed
    assert again.incident == first.incident and again.incident.cordoned_by_us
    assert node(kube_api_server)["spec"]["taints"] == [FOREIGN, OUR_TAINT]  # our first taint, time and all
    assert len(patches(kube_api_server)) == 1


def test_cordon_after_someone_elses_cordon_stays_theirs_on_repeat(kube_api_server, client) -> None:
    put_node(kube_api_server, unschedulable=True)
    cordon(client, node_name=NODE, incident=INCIDENT, reason=REASON, now=NOW)
    # A restart: the caller's copy of the incident is the one read back from the Node.
    stored = read_incident(node(kube_api_server))
    again = cordon(client, node_name=NODE, incident=stored, reason=REASON, now=NOW + 60)
    assert not again.changed and again.incident.cordoned_by_us is False


def test_a_cordon_by_someone_else_after_our_decision_stays_theirs(kube_api_server, client) -> None:
    """The loop stores the decided incident (cordoned_by_us planned, nothing done) before acting;
    someone cordons the node in between: that plan does not make their cordon ours."""
    planned = dataclasses.replace(INCIDENT, cordoned_by_us=True)
    put_node(kube_api_server, unschedulable=True, incident=planned)
    update = cordon(client, node_name=NODE, incident=planned, reason=REASON, now=NOW)
    assert update.incident == dataclasses.replace(INCIDENT, cordoned_by_us=False, done=(Action.CORDON,))
    assert "unschedulable" not in patches(kube_api_server)[0].body["spec"]


def test_taint_alone_leaves_schedulability(kube_api_server, client) -> None:
    put_node(kube_api_server, taints=[FOREIGN])
    update = taint(client, node_name=NODE, incident=INCIDENT, reason=REASON, now=NOW)
    again = taint(client, node_name=NODE, incident=update.incident, reason=REASON, now=NOW + 1)

    after = node(kube_api_server)
    assert not after["spec"].get("unschedulable")
    assert after["spec"]["taints"] == [FOREIGN, OUR_TAINT]
    assert read_incident(after) == dataclasses.replace(INCIDENT, done=(Action.TAINT,))
    assert update.view.has_our_taint and not update.view.unschedulable
    assert not again.changed and len(patches(kube_api_server)) == 1


def test_taint_without_an_incident_adds_only_the_taint(kube_api_server, client) -> None:
    put_node(kube_api_server, incident=by_us())
    update = taint(client, node_name=NODE, reason=REASON, now=NOW)
    after = node(kube_api_server)
    assert after["spec"]["taints"] == [OUR_TAINT] and not after["spec"].get("unschedulable")
    assert update.incident == by_us() == read_incident(after)  # the record is left as it was


@pytest.mark.parametrize(
    ("reason", "value"),
    [
        (REASON, REASON),
        ("Xid 79: GPU fell off the bus", "Xid_79__GPU_fell_off_the_bus"),
        ("-leading.and.trailing-", "leading.and.trailing"),
        ("x" * 80, "x" * 63),
        ("", ""),
    ],
)
def test_taint_value_is_a_valid_label_value(kube_api_server, client, reason, value) -> None:
    assert taint_value(reason) == value
    put_node(kube_api_server)
    cordon(client, node_name=NODE, incident=INCIDENT, reason=reason, now=NOW)  # the server validates taints
    assert node(kube_api_server)["spec"]["taints"][0].get("value", "") == value


# ---- concurrent writers ------------------------------------------------------------------------


class Interfering:
    """The real client; ``meddle()`` runs right after each of the first ``times`` Node reads, as a
    concurrent writer between our read and our conditional patch."""

    def __init__(self, client: KubeClient, meddle: Callable[[int], None], times: int) -> None:
        self._client = client
        self._meddle = meddle
        self._times = times
        self.reads = 0

    def get_node(self, name: str) -> dict:
        node = self._client.get_node(name)
        self.reads += 1
        if self.reads <= self._times:
            self._meddle(self.reads)
        return node

    def patch_node(self, name: str, body: dict) -> dict:
        return self._client.patch_node(name, body)


def someone_adds_a_taint(server: KubeApiServer) -> Callable[[int], None]:
    def meddle(n: int) -> None:
        with server.api_client() as api_client:
            core = CoreV1Api(api_client)
            taints = core.read_node(NODE).spec.taints or []
            core.patch_node(NODE, {"spec": {"taints": [*taints, {"key": f"other.io/t{n}", "effect": "NoSchedule"}]}})

    return meddle


@pytest.mark.parametrize(
    ("step", "start", "ours"),
    [
        pytest.param(
            lambda c: cordon(c, node_name=NODE, incident=INCIDENT, reason=REASON, now=NOW), {}, True, id="cordon"
        ),
        pytest.param(
            lambda c: taint(c, node_name=NODE, incident=INCIDENT, reason=REASON, now=NOW), {}, True, id="taint"
        ),
        pytest.param(
            lambda c: uncordon(c, node_name=NODE, incident=by_us()),
            {"unschedulable": True, "taints": [OUR_TAINT], "incident": by_us()},
            False,
            id="uncordon",
        ),
    ],
)
def test_a_concurrent_change_is_read_again_and_kept(kube_api_server, client, step, start, ours) -> None:
    put_node(kube_api_server, **start)
    meddler = Interfering(client, someone_adds_a_taint(kube_api_server), times=2)

    step(meddler)

    keys = [t["key"] for t in node(kube_api_server)["spec"].get("taints") or []]
    assert "other.io/t1" in keys and "other.io/t2" in keys  # both concurrent writes survive ours
    assert (TAINT_KEY in keys) is ours
    assert [p.status for p in patches(kube_api_server)] == [200, 409, 200, 409, 200]  # theirs, ours, theirs, ours, ours


def test_conflicts_without_end_are_handed_to_the_caller(kube_api_server, client) -> None:
    put_node(kube_api_server)
    meddler = Interfering(client, someone_adds_a_taint(kube_api_server), times=CONFLICT_ATTEMPTS)
    with pytest.raises(KubeError) as caught:
        cordon(meddler, node_name=NODE, incident=INCIDENT, reason=REASON, now=NOW)
    assert caught.value.status == 409 and caught.value.transient  # the caller's backoff retries later
    assert meddler.reads == CONFLICT_ATTEMPTS


# ---- uncordon ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("start", "incident", "unschedulable", "taints", "changed"),
    [
        pytest.param(
            {"unschedulable": True, "taints": [FOREIGN, OUR_TAINT, FOREIGN_EXEC], "incident": by_us()},
            by_us(),
            False,
            [FOREIGN, FOREIGN_EXEC],
            True,
            id="cordoned by us",
        ),
        pytest.param(
            {"unschedulable": True, "taints": [FOREIGN, OUR_TAINT], "incident": INCIDENT},
            INCIDENT,
            True,
            [FOREIGN],
            True,
            id="cordoned by someone else",
        ),
        pytest.param(
            {"unschedulable": True, "taints": [FOREIGN, OUR_TAINT], "incident": INCIDENT},
            by_us(),
            True,
            [FOREIGN],
            True,
            id="caller says ours, the Node's record says not",
        ),
        pytest.param(
            {"unschedulable": True, "taints": [FOREIGN, OUR_TAINT], "incident": by_us(INCIDENT, Action.TAINT)},
            by_us(INCIDENT, Action.TAINT),
            True,
            [FOREIGN],
            True,
            id="ours planned, never cordoned: someone else's cordon",
        ),
        pytest.param(
            {"unschedulable": True, "taints": [FOREIGN]},
            by_us(),
            True,
            [FOREIGN],
            False,
            id="record gone: someone cordoned it since",
        ),
        pytest.param(
            {"unschedulable": True, "taints": [OUR_TAINT], "incident": "garbage"},
            by_us(),
            True,
            [],
            True,
            id="garbage record",
        ),
    ],
)
def test_uncordon(kube_api_server, client, start, incident, unschedulable, taints, changed) -> None:
    put_node(kube_api_server, annotations={"other.io/keep": "yes"}, **start)

    update = uncordon(client, node_name=NODE, incident=incident)

    after = node(kube_api_server)
    assert bool(after["spec"].get("unschedulable")) is unschedulable
    assert (after["spec"].get("taints") or []) == taints
    assert after["metadata"]["annotations"] == {"other.io/keep": "yes"}
    assert update.changed is changed  # nothing of ours there: not a single write
    assert update.incident is None and not update.view.has_our_taint


def test_uncordon_twice_is_one_change(kube_api_server, client) -> None:
    put_node(kube_api_server, unschedulable=True, taints=[OUR_TAINT], incident=by_us())
    assert uncordon(client, node_name=NODE, incident=by_us()).changed
    # Someone cordons it after we let go: a stale repeat of our uncordon must not undo theirs.
    with kube_api_server.api_client() as api_client:
        CoreV1Api(api_client).patch_node(NODE, {"spec": {"unschedulable": True}})
    again = uncordon(client, node_name=NODE, incident=by_us())
    assert not again.changed and again.view.unschedulable
    assert len(patches(kube_api_server)) == 2  # ours, theirs


def test_cordon_then_uncordon_restores_the_node(kube_api_server, client) -> None:
    put_node(kube_api_server, taints=[FOREIGN], annotations={"other.io/keep": "yes"})
    before = node(kube_api_server)
    update = cordon(client, node_name=NODE, incident=INCIDENT, reason=REASON, now=NOW)
    uncordon(client, node_name=NODE, incident=update.incident)
    after = node(kube_api_server)
    assert not after["spec"].get("unschedulable")
    assert after["spec"]["taints"] == before["spec"]["taints"]
    assert after["metadata"]["annotations"] == before["metadata"]["annotations"]


# ---- the incident record -----------------------------------------------------------------------


def test_store_incident_writes_and_removes_only_ours(kube_api_server, client) -> None:
    put_node(kube_api_server, annotations={"other.io/keep": "yes"})
    record = by_us(INCIDENT, Action.CORDON, Action.DRAIN)
    store_incident(client, node_name=NODE, incident=record)
    assert read_incident(node(kube_api_server)) == record
    store_incident(client, node_name=NODE, incident=None)
    store_incident(client, node_name=NODE, incident=None)  # removing what is gone is fine
    assert node(kube_api_server)["metadata"]["annotations"] == {"other.io/keep": "yes"}


FULL = Incident(
    id="c/r/n/1",
    condition="c",
    reason="r",
    since=1.0,
    opened=2.5,
    done=(Action.CORDON, Action.DRAIN),
    cordoned_by_us=True,
    drain="deadline",
    budget_held=True,
    healthy_since=9.0,
    dry_run=True,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(None, None, id="absent"),
        pytest.param(incident_text(FULL), FULL, id="round trip"),
        pytest.param(incident_text(INCIDENT), INCIDENT, id="defaults"),
        pytest.param(
            json.dumps({**FULL.to_json(), "done": ["cordon", "reimage", "drain"]}), FULL, id="unknown action ignored"
        ),
        pytest.param(
            json.dumps(
                {k: v for k, v in INCIDENT.to_json().items() if k in ("id", "condition", "reason", "since", "opened")}
            ),
            INCIDENT,
            id="optional fields absent",
        ),
        pytest.param("{not json", None, id="not JSON"),
        pytest.param("[1, 2]", None, id="not an object"),
        pytest.param(json.dumps({**FULL.to_json(), "since": "yesterday"}), None, id="wrong type"),
        pytest.param(json.dumps({**FULL.to_json(), "cordonedByUs": "yes"}), None, id="flag not a boolean"),
        pytest.param(json.dumps({**FULL.to_json(), "done": "cordon"}), None, id="done not a list"),
        pytest.param(json.dumps({k: v for k, v in FULL.to_json().items() if k != "id"}), None, id="id missing"),
        # Read back from the cluster as strictly as config (issue 13, finding 11): never a time that is not one.
        pytest.param(json.dumps({**FULL.to_json(), "since": float("nan")}), None, id="since NaN"),
        pytest.param(json.dumps({**FULL.to_json(), "opened": float("inf")}), None, id="opened Infinity"),
        pytest.param(json.dumps({**FULL.to_json(), "healthySince": float("-inf")}), None, id="healthySince -Infinity"),
        pytest.param(incident_text(FULL).replace('"since":1.0', '"since":1e400'), None, id="since overflows"),
        pytest.param(json.dumps({**FULL.to_json(), "since": -1}), None, id="since before 1970"),
        pytest.param(json.dumps({**FULL.to_json(), "since": 1e300}), None, id="since past year 9999"),
        pytest.param(json.dumps({**FULL.to_json(), "since": True}), None, id="since a boolean"),
        pytest.param("[" * 100_000 + "]" * 100_000, None, id="nested too deep"),
    ],
)
def test_read_incident(text, expected, caplog) -> None:
    annotations = {} if text is None else {INCIDENT_ANNOTATION: text}
    with caplog.at_level(logging.WARNING, logger="agent.recovery.node"):
        assert read_incident({"metadata": {"name": NODE, "annotations": annotations}}) == expected
    warned = [r.getMessage() for r in caplog.records]
    if text is not None and expected is None:
        assert len(warned) == 1 and INCIDENT_ANNOTATION in warned[0] and NODE in warned[0]
    else:
        assert warned == []


def test_incident_from_json_rejects_a_non_object() -> None:
    with pytest.raises(ValueError, match="JSON object"):
        incident_from_json(["id"])


@pytest.mark.parametrize(
    ("node_", "view"),
    [
        ({"metadata": {"name": NODE}}, NodeView(name=NODE, unschedulable=False)),
        (
            {
                "metadata": {"name": NODE, "uid": "u1", "labels": {"a": "b"}},
                "spec": {"unschedulable": True, "taints": [FOREIGN, OUR_TAINT], "providerID": "aws:///z/i-1"},
            },
            NodeView(
                name=NODE,
                unschedulable=True,
                labels={"a": "b"},
                has_our_taint=True,
                provider_id="aws:///z/i-1",
                uid="u1",
            ),
        ),
        # Our key with another effect is not our taint (we only ever add NoSchedule).
        (
            {"metadata": {"name": NODE}, "spec": {"taints": [{**OUR_TAINT, "effect": "NoExecute"}]}},
            NodeView(name=NODE, unschedulable=False),
        ),
    ],
)
def test_read_node_view(node_, view) -> None:
    assert read_node_view(node_) == view


@pytest.mark.parametrize(
    ("field", "value", "reads"),
    [
        ("since", NOW + 86_400, True),
        ("since", NOW + 86_401, False),
        ("opened", NOW + 10 * 86_400, False),
        ("healthySince", NOW + 365 * 86_400, False),
        ("healthySince", NOW - 365 * 86_400, True),
    ],
)
def test_read_incident_refuses_times_a_day_past_now(field, value, reads) -> None:
    text = json.dumps({**INCIDENT.to_json(), field: value})
    node_ = {"metadata": {"name": NODE, "annotations": {INCIDENT_ANNOTATION: text}}}
    incident, problem = parse_incident(node_, now=NOW)
    assert (incident is not None, problem == "") == (reads, reads)
    if not reads:
        assert f"incident: {field}: is " in problem and "after now" in problem
    assert read_incident(node_) is not None  # without a now, only the absolute bounds apply


@pytest.mark.parametrize(
    ("stored", "claims"),
    [
        pytest.param(None, True, id="no record"),
        pytest.param(dataclasses.replace(INCIDENT), True, id="unclaimed"),
        pytest.param(dataclasses.replace(INCIDENT, claim="mine", claimed_at=NOW - 5), True, id="ours"),
        pytest.param(dataclasses.replace(INCIDENT, claim="other", claimed_at=NOW - 5), False, id="another agent's"),
        pytest.param(
            dataclasses.replace(INCIDENT, claim="other", claimed_at=NOW - CLAIM_TTL), True, id="another's, stale"
        ),
        pytest.param(dataclasses.replace(INCIDENT, done=(Action.MARK_UNHEALTHY,)), False, id="marked already"),
        pytest.param(
            dataclasses.replace(INCIDENT, id="other/episode", claim="other", claimed_at=NOW),
            True,
            id="another incident",
        ),
    ],
)
def test_claim_mark(kube_api_server, client, stored, claims) -> None:
    """Of two agents given one node name, only the one whose conditional claim lands marks the instance."""
    put_node(kube_api_server, incident=stored)
    claimed = claim_mark(client, node_name=NODE, incident=INCIDENT, token="mine", now=NOW)
    if claims:
        assert claimed == dataclasses.replace(INCIDENT, claim="mine", claimed_at=NOW)
        assert read_incident(node(kube_api_server)) == claimed
    else:
        assert claimed is None
        assert read_incident(node(kube_api_server)) == stored


def test_a_conditional_store_never_overwrites_a_record_changed_since_it_was_read(kube_api_server, client) -> None:
    put_node(kube_api_server, incident=by_us(INCIDENT, Action.CORDON))
    with pytest.raises(KubeError) as info:
        store_incident(client, node_name=NODE, incident=INCIDENT, expect=None)
    assert info.value.status == 409
    assert read_incident(node(kube_api_server)) == by_us(INCIDENT, Action.CORDON)
    store_incident(client, node_name=NODE, incident=INCIDENT, expect=by_us(INCIDENT, Action.CORDON))
    assert read_incident(node(kube_api_server)) == INCIDENT
