"""``node-health-agent pause`` / ``resume`` / ``status``: a pause reaches the agents it names whatever flags the
operator remembered, refuses one that reaches no agent or covers nothing, says what it covers; ``resume``'s
report agrees with what it did; ``status`` says which pause Lease the agents read, flags one no agent reads,
says on a node's row that a pause holds it, and prints cluster text escaped. Real client, test API server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.app.cli import main
from agent.recovery.holds import PAUSE_ANNOTATION, Pause, Pauses, Scope, decode_pauses, encode_pauses

from helpers.recovery import agent_pod
from kubeapi import KubeApiServer

pytest_plugins = ["kubeapi.fixtures"]

NS = "node-health-agent"
LEASE = "node-health-agent-recovery-pause"
T0 = 1_767_225_600.0
POOL = "eks.amazonaws.com/nodegroup"


def node(name: str, *, labels: dict | None = None, conditions: list[dict] = ()) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/os": "linux", **(labels or {})}},
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}, *conditions]},
    }


def xid(reason: str = "GpuXid79", status: str = "True") -> dict:
    return {"type": "GpuXid", "status": status, "reason": reason, "lastTransitionTime": "2026-01-01T00:00:00Z"}


@pytest.fixture
def api(kube_api_server: KubeApiServer) -> KubeApiServer:
    """Two p5 nodes of node group gpu-p5, one with Xid 79; their agents run with cluster name prod."""
    server = kube_api_server
    server.put_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    server.put_object(node("ip-10-0-0-1.ec2.internal", labels={POOL: "gpu-p5"}, conditions=[xid()]))
    server.put_object(node("ip-10-0-0-2.ec2.internal", labels={POOL: "gpu-p5"}))
    for name in ("ip-10-0-0-1.ec2.internal", "ip-10-0-0-2.ec2.internal"):
        server.put_object(agent_pod(name, cluster_name="prod"))
    return server


def cli(api: KubeApiServer, tmp_path: Path, capsys, *argv: str) -> tuple[int, str, str]:
    code = main([argv[0], "--kubeconfig", str(api.write_kubeconfig(tmp_path / "kubeconfig")), *argv[1:]])
    out, err = capsys.readouterr()
    return code, out, err


def pauses(api: KubeApiServer, lease: str = LEASE) -> tuple[str, ...]:
    found = api.get_object("leases", lease, NS)
    if found is None:
        return ()
    return tuple(p.key for p in decode_pauses(found["metadata"]["annotations"][PAUSE_ANNOTATION]).pauses)


def put_pauses(api: KubeApiServer, text: str, lease: str = LEASE) -> None:
    api.put_object(
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": lease, "namespace": NS, "annotations": {PAUSE_ANNOTATION: text}},
            "spec": {},
        }
    )


# ---- whom it reaches ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "lease"),
    [
        ([], LEASE),  # as documented: the namespace's Lease, which every agent reads
        (["--cluster-name", "prod"], f"{LEASE}-prod"),  # the agents' own name: their cluster's Lease
    ],
)
def test_a_pause_goes_to_a_lease_the_agents_read(api, tmp_path, capsys, argv, lease):
    code, out, _ = cli(api, tmp_path, capsys, "pause", "--reason", "bad rule rollout", *argv)
    assert code == 0
    assert pauses(api, lease) == ("cluster",)
    assert "reaches: 2 of 2 agent pod(s)" in out


@pytest.mark.parametrize(
    ("pods", "argv", "code", "names"),
    [
        # the operator's cluster name is not the agents': refused, naming the agents' cluster names
        ([agent_pod("a", cluster_name="prod")], ["--cluster-name", "staging"], 1, ["staging", "prod"]),
        ([], [], 1, ["no agent pod in namespace node-health-agent"]),  # the wrong namespace: no agent there
    ],
)
def test_a_pause_no_agent_reads_is_refused_naming_why(kube_api_server, tmp_path, capsys, pods, argv, code, names):
    api = kube_api_server
    api.put_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    api.put_object(node("a"))
    for pod in pods:
        api.put_object(pod)
    got, _, err = cli(api, tmp_path, capsys, "pause", *argv)
    assert got == code
    assert "refused (nothing written)" in err and all(n in err for n in names), err
    assert api.list_objects("leases", NS) == []


def test_an_agent_whose_cluster_name_comes_from_a_configmap_cannot_be_told(kube_api_server, tmp_path, capsys):
    api = kube_api_server
    api.put_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    api.put_object(node("a"))
    pod = agent_pod("a")
    pod["spec"]["containers"][1]["env"].append(
        {"name": "CLUSTER_NAME", "valueFrom": {"configMapKeyRef": {"name": "cluster", "key": "name"}}}
    )
    api.put_object(pod)
    code, _, err = cli(api, tmp_path, capsys, "pause", "--cluster-name", "prod")
    assert code == 1 and "cannot tell for 1 pod(s)" in err and "without --cluster-name" in err
    code, out, _ = cli(api, tmp_path, capsys, "pause")  # the namespace's Lease: read whatever the name is
    assert code == 0 and pauses(api) == ("cluster",)


def test_pods_list_forbidden_cannot_tell_and_force_writes_anyway(api, tmp_path, capsys):
    api.faults.add(method="GET", path_regex=rf"/namespaces/{NS}/pods$", status=403, count=None)
    code, _, err = cli(api, tmp_path, capsys, "pause")
    assert code == 1 and "cannot tell which agents read" in err and "pods list" in err
    assert pauses(api) == ()
    code, out, err = cli(api, tmp_path, capsys, "pause", "--force")
    assert code == 0 and pauses(api) == ("cluster",)
    assert "reaches: cannot tell" in out and "warning (--force)" in err


# ---- what it covers ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "hint"),
    [
        (["--condition-reason", "gpuxid*"], "globs are case-sensitive"),  # the reasons are GpuXid*
        (["--condition-reason", "GpuXdi*"], "matches no reason"),
        (["--condition-reason", "NeuronHealth/GpuXid*"], "matches no reason"),
        (["--node", "IP-10-0-0-1.ec2.internal"], "did you mean 'ip-10-0-0-1.ec2.internal'"),
        (["--node", "ip-10-0-0-9.ec2.internal"], "no Node is named"),
        (["--pool", "gpu-P5"], "did you mean 'gpu-p5'"),
        (["--pool", "gpu-p4"], "no Node has 'gpu-p4' under a pool label"),
    ],
)
def test_a_pause_that_covers_nothing_is_refused_unless_forced(api, tmp_path, capsys, selector, hint):
    code, out, err = cli(api, tmp_path, capsys, "pause", *selector)
    assert code == 2 and "covers nothing" in err and hint in err, err
    assert pauses(api) == () and out == ""
    code, _, err = cli(api, tmp_path, capsys, "pause", *selector, "--force")
    assert code == 0 and "warning (--force)" in err
    assert len(pauses(api)) == 1


@pytest.mark.parametrize(
    ("selector", "covers"),
    [
        ([], "covers: every node (2 listed)"),
        (["--pool", "gpu-p5"], "covers: 2 node(s): ip-10-0-0-1.ec2.internal, ip-10-0-0-2.ec2.internal"),
        (["--node", "ip-10-0-0-2.ec2.internal"], "covers: 1 node(s): ip-10-0-0-2.ec2.internal"),
        (["--condition-reason", "GpuXid7*"], "covers: reasons GpuXid74, GpuXid79; 1 node(s) with such a problem now"),
        (["--condition-reason", "GpuXid/*"], "covers: reasons GpuXid/*, GpuXid/GpuXid109"),
        (["--condition-reason", "NeuronHasError_DMA*"], "covers: reasons NeuronHasError_*"),  # a policy glob
    ],
)
def test_an_accepted_pause_says_what_it_covers(api, tmp_path, capsys, selector, covers):
    code, out, _ = cli(api, tmp_path, capsys, "pause", *selector)
    assert code == 0 and covers in out, out


def test_a_pool_under_the_policys_own_label_needs_the_policy(api, tmp_path, capsys):
    api.put_object(node("n-a1", labels={"example.com/gpu-pool": "gpu-a"}))
    policy = tmp_path / "policy.yaml"
    policy.write_text("budget:\n  groups:\n    - label: example.com/gpu-pool\n      maxUnhealthy: 1\n")
    code, _, err = cli(api, tmp_path, capsys, "pause", "--pool", "gpu-a")
    assert code == 2 and "label example.com/gpu-pool has that value" in err and "--recovery-policy" in err
    code, out, _ = cli(api, tmp_path, capsys, "pause", "--pool", "gpu-a", "--recovery-policy", str(policy))
    assert code == 0 and "covers: 1 node(s): n-a1" in out


# ---- resume: what it did and what it says agree -------------------------------------------------------------


def test_resume_whose_event_fails_says_so_and_exits_0(api, tmp_path, capsys):
    put_pauses(api, encode_pauses(Pauses(pauses=(Pause(scope=Scope.CLUSTER, by="alice", since=T0),))))
    api.faults.add(method="POST", path_regex=rf"/namespaces/{NS}/events$", status=403, count=None)
    code, out, err = cli(api, tmp_path, capsys, "resume")
    assert pauses(api) == ()
    assert code == 0 and "recovery resumed" in out
    assert "warning: done, but its Event" in err


@pytest.mark.parametrize("since", [1e300, -1e300, 253402300800.0])
def test_resume_all_over_an_absurd_since_lifts_it_and_says_so(api, tmp_path, capsys, since):
    put_pauses(api, json.dumps({"version": 1, "pauses": [{"scope": "node", "value": "x", "since": since}]}))
    """A time past the record's bounds makes the record unreadable (agent.recovery.fields); ``resume --all`` still
    lifts every pause in it, and says the record was unreadable."""
    code, out, err = cli(api, tmp_path, capsys, "resume", "--all")
    assert code == 0 and pauses(api) == () and "lifted every pause of an unreadable record" in out, err
    assert "pauses[0].since" in out and "Traceback" not in err


def test_resume_lifts_a_pause_written_with_the_agents_cluster_name(api, tmp_path, capsys):
    """Paused with --cluster-name prod (or by an older CLI), resumed without: lifted, since the agents read it."""
    put_pauses(api, encode_pauses(Pauses(pauses=(Pause(scope=Scope.CLUSTER, by="a", since=T0),))), f"{LEASE}-prod")
    code, out, _ = cli(api, tmp_path, capsys, "resume")
    assert code == 0 and pauses(api, f"{LEASE}-prod") == () and f"{NS}/{LEASE}-prod" in out


@pytest.mark.parametrize("text", ['{"version": 1, "pauses": [{"scope": "cluster", "since": 1' + "0" * 400 + "}]}"])
def test_a_lease_whose_numbers_overflow_is_reported_never_a_crash(api, tmp_path, capsys, text):
    put_pauses(api, text)
    for argv in (["pause"], ["resume"]):
        code, _, err = cli(api, tmp_path, capsys, *argv)
        assert code == 1 and "unreadable" in err and "Traceback" not in err, argv
    code, out, _ = cli(api, tmp_path, capsys, "status")
    assert code == 0 and "PAUSED EVERYWHERE" in out
    code, out, err = cli(api, tmp_path, capsys, "resume", "--all")  # the way out: every pause lifted
    assert code == 0 and pauses(api) == () and "lifted every pause of an unreadable record" in out, err
    code, out, _ = cli(api, tmp_path, capsys, "status")
    assert code == 0 and "PAUSED EVERYWHERE" not in out


# ---- status --------------------------------------------------------------------------------------------------


def test_status_says_which_lease_the_agents_read_and_flags_one_no_agent_reads(api, tmp_path, capsys):
    one = encode_pauses(Pauses(pauses=(Pause(scope=Scope.POOL, value="gpu-p5", by="alice", since=T0),)))
    put_pauses(api, one, f"{LEASE}-staging")  # the issue's: written for a cluster name no agent has
    code, out, _ = cli(api, tmp_path, capsys, "status", "--cluster-name", "staging")
    assert code == 0
    assert f"the agents (2 pods) read Lease {NS}/{LEASE} and {NS}/{LEASE}-prod" in out
    assert f"WARNING: no agent reads the pause Lease {NS}/{LEASE}-staging" in out and "prod" in out
    assert "held: paused" not in out, "a pause no agent reads holds nothing"
    code, out, _ = cli(api, tmp_path, capsys, "status", "--cluster-name", "staging", "--json")
    view = json.loads(out)["pauses"]
    assert view["unread"] == [f"{NS}/{LEASE}-staging"] and view["agents"]["clusterNames"] == ["prod"]


@pytest.mark.parametrize(
    ("selector", "held"),
    [
        (["--pool", "gpu-p5"], "held: paused by alice (pool=gpu-p5)"),
        (["--condition-reason", "GpuXid*"], "held: paused by alice (condition-reason=GpuXid*)"),
        (["--node", "ip-10-0-0-1.ec2.internal"], "held: paused by alice (node=ip-10-0-0-1.ec2.internal)"),
    ],
)
def test_the_row_of_a_node_a_pause_holds_says_so(api, tmp_path, capsys, selector, held):
    assert cli(api, tmp_path, capsys, "pause", *selector, "--by", "alice")[0] == 0
    code, out, _ = cli(api, tmp_path, capsys, "status")
    (row,) = [line for line in out.splitlines() if line.startswith("ip-10-0-0-1.ec2.internal ")]
    assert code == 0 and held in row, out


def test_status_prints_cluster_text_escaped(api, tmp_path, capsys):
    api.put_object(node("n-esc", conditions=[xid("GpuXid79\x1b[2J\x1b]0;owned\x07\u202e")]))
    evil = Pause(scope=Scope.NODE, value="n-esc", by="mallory\x1b[31m", why="fix\r\nok\x1b[0m", since=T0)
    put_pauses(api, encode_pauses(Pauses(pauses=(evil,))))
    code, out, _ = cli(api, tmp_path, capsys, "status")
    assert code == 0
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out and "\r" not in out
    assert "GpuXid79\\x1b[2J\\x1b]0;owned\\x07\\u202e" in out
    assert "mallory\\x1b[31m" in out and "fix\\x0d\\x0aok" in out
    code, out, _ = cli(api, tmp_path, capsys, "status", "--json")
    assert json.loads(out)["pauses"]["pauses"][0]["by"] == "mallory\x1b[31m", "JSON keeps the value (escaped by JSON)"
