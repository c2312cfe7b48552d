"""The startup gate end to end, as wired (agent.app.assembly.build_runtime, Kubernetes mode, recovery on): a
new Node with the taint ``node-health-agent.io/unvalidated``, a policy ``startupValidation: {checks: [x]}``
and an on-demand active Python check ``x`` declared in a checks file. The request flows recovery -> inbox ->
main loop -> check scheduler -> the run (or a gate's skip) -> the validation record -> recovery, which removes
the taint after the pass, and only then. The holders come from the real gRPC pod-resources test server."""

from __future__ import annotations

import logging
import textwrap
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.adapters.kube import KubeClient
from agent.app.assembly import KubeSetup, build_runtime
from agent.app.config import load_configuration
from agent.app.settings import Settings
from agent.checks.active import DEVICE_BUSY, HOLDERS_UNKNOWN
from agent.checks.model import CheckContext, CheckResult, CheckStatus
from agent.recovery.model import UNVALIDATED_TAINT_KEY
from agent.recovery.policyfile import load_policy

from helpers import wait_for
from helpers.podresources_server import Container, Pod, PodResourcesServer
from helpers.recovery import NS
from kubeapi.server import KubeApiServer

pytestmark = pytest.mark.slow  # the real runtime's threads: the scheduler polls requests every 5 s

pytest_plugins = ["kubeapi.fixtures"]

NODE = "ip-10-0-0-9.us-west-2.compute.internal"
CHECKS = """
checks:
  - name: x
    entryPoint: counted
    active: true
    devices: neuron
    interval: 0
    timeout: 1m
    enabled: false
"""
POLICY = """
startupDelay: 0s
startupValidation:
  checks: [x]
  taint: true
"""


class Counted:
    """Check ``x``: passes, counting its starts (the entry point also declares a passive check of its own
    name, ``counted``, which is not counted)."""

    starts = 0

    def __init__(self, *, name: str, context: object, options: object) -> None:
        self.name = name
        self.conditions = ()

    def run(self) -> list[CheckResult]:
        if self.name == "x":
            Counted.starts += 1
        return [CheckResult(status=CheckStatus.OK, condition=None, reason="Passed", message="passed")]


@dataclass(frozen=True)
class EntryPoint:
    name: str = "counted"
    value: str = "tests.app.test_startup_validation_e2e:Counted"
    dist: None = None

    def load(self) -> type[Counted]:
        return Counted


HOLDER = Pod("ml", "train-0", [Container("main", devices={"aws.amazon.com/neuron": ["0"]})])


@pytest.mark.parametrize(
    ("device_holders", "pods", "skip", "untainted"),
    [
        (False, [], HOLDERS_UNKNOWN, False),  # no pod-resources API: not proven idle, never started
        (True, [HOLDER], DEVICE_BUSY, False),  # a pod holds neuron0: never started
        (True, [], None, True),  # idle: it runs, passes, the taint goes
    ],
    ids=["holders-unknown", "device-busy", "idle-pass"],
)
def test_a_new_node_keeps_its_startup_taint_until_its_active_check_passes(
    kube_api_server: KubeApiServer, tmp_path: Path, caplog, device_holders, pods, skip, untainted
):
    api = kube_api_server
    api.put_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    taint = {"key": UNVALIDATED_TAINT_KEY, "effect": "NoSchedule"}
    api.put_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}, "spec": {"taints": [taint]}})
    (tmp_path / "checks.yaml").write_text(textwrap.dedent(CHECKS))
    (tmp_path / "policy.yaml").write_text(textwrap.dedent(POLICY))
    (tmp_path / "kmsg").touch()
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "neuron0").touch()
    socket = str(tmp_path / "kubelet.sock")
    settings = Settings(
        standalone=False, config_files=(tmp_path / "checks.yaml",), plugins_dirs=(), kmsg_path=tmp_path / "kmsg",
        kmsg_relay=None, listen=None, state_dir=tmp_path / "state", lookback=300.0, stall_timeout=60.0,
        node_name=NODE, enable_recovery=True, device_holders=device_holders, dev_root=tmp_path / "dev",
        sys_root=tmp_path / "sys", pod_resources_socket=socket, pod_namespace=NS,
    )  # fmt: skip
    loaded = load_configuration([tmp_path / "checks.yaml"], context=CheckContext(), entry_points=lambda: [EntryPoint()])
    Counted.starts = 0
    client = KubeClient.load(kubeconfig=api.write_kubeconfig(tmp_path / "kubeconfig"))
    runtime = build_runtime(
        settings=settings,
        rule_set=loaded.config.rule_set,
        kube=KubeSetup(client=client, node_name=NODE, node=client.get_node(NODE)),
        checks=loaded.checks,
        extra_conditions=loaded.conditions,
        policy=load_policy(tmp_path / "policy.yaml"),
    )
    stop = threading.Event()
    thread = threading.Thread(target=runtime.run, args=(stop,))

    def tainted() -> bool:
        return any(t["key"] == UNVALIDATED_TAINT_KEY for t in api.get_object("nodes", NODE)["spec"].get("taints") or [])

    def skipped() -> list[str]:
        return [r.args[1] for r in caplog.records if r.getMessage().startswith("active check x skipped")]

    with caplog.at_level(logging.INFO, logger="agent.checks.scheduler"), PodResourcesServer(socket, pods):
        thread.start()
        try:
            if untainted:
                wait_for(lambda: not tainted(), timeout=60)
                assert Counted.starts == 1
                records = runtime.feed.latest().snapshot.validations
                assert [(v.check, v.verdict.value) for v in records] == [("x", "pass")]
            else:
                wait_for(lambda: skipped(), timeout=60)
                assert set(skipped()) == {skip}
                assert Counted.starts == 0
                assert tainted()
                assert runtime.feed.latest().snapshot.validations == ()
                assert [r.id for r in runtime.feed.latest().snapshot.validation_requests] == ["startup"]
        finally:
            stop.set()
            thread.join(timeout=15)
            client.close()
