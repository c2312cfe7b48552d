"""``bench/run.py device``: one GPU's fault costs one GPU, as deployed (issue 35).

A real agent process (``run --kmsg-path FILE``, recovery on, ``--device-holders``) on a p5-like DRA node of
the test API server (eight H100s in one ResourceSlice of ``gpu.nvidia.com``, one pod per GPU through an
allocated ResourceClaim, the device-taint controller writing its status) with the real gRPC pod-resources
test server behind ``POD_RESOURCES_SOCKET`` (the same eight pods, by their DRA devices). The built-in policy
starts at the device for Xid 119 (``RESET_GPU``). Once the agent wrote its first condition PATCH, an Xid 119
on GPU 3 is appended to the kmsg file; then:

* ``device.detect_to_holder_event_s``: until the ``DeviceFault`` Event on the pod holding GPU 3;
* ``device.detect_to_fence_s``: until the agent's DeviceTaintRule for GPU 3 has effect ``NoSchedule`` (its
  first write, with effect ``None``, is checked to have come first);
* ``device.holder_evictions`` / ``device.other_pod_evictions``: Eviction requests for the holder and for the
  seven other GPUs' pods, once the incident recorded its drain;
* ``device.rss_mib_acting``: the agent's VmRSS then (the pod-resources lookup done);
* ``device.refire_after_clear``: ``node-health-agent clear --device`` (the CLI), then the agent restarted
  on the same state dir with the Xid line still in the kmsg file: condition writes that set ``GpuXid`` True
  again, DeviceTaintRules created again and DeviceFault Events told again after the restart (0 = none).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NODE = "ip-10-0-0-7.us-west-2.compute.internal"
GPU = 3  # the failing GPU
AS_DEPLOYED = "import sys; sys.modules['kubernetes_validate'] = None; from agent.app.cli import main; sys.exit(main())"


def _usec() -> int:
    return int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1e6)


def _wait(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.01) -> float:
    """Seconds until ``predicate()`` is true (polled); SystemExit naming ``what`` after ``timeout``."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise SystemExit(f"device benchmark: {what} did not happen in {timeout:g} s")
        time.sleep(interval)
    return time.monotonic() - start


def _seed(server: Any) -> None:
    from helpers import dra

    server.put_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "node-health-agent"}})
    server.put_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}})
    server.put_object(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": NODE, "labels": {"kubernetes.io/os": "linux"}},
            "spec": {"providerID": "aws:///us-west-2a/i-0123456789abcdef0"},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]},
        }
    )
    server.put_object(  # the agent's own pod, as the DaemonSet runs it (the clear command looks for it)
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "node-health-agent-7xk2p",
                "namespace": "node-health-agent",
                "labels": {"app.kubernetes.io/name": "node-health-agent", "app.kubernetes.io/component": "agent"},
            },
            "spec": {
                "nodeName": NODE,
                "containers": [
                    {
                        "name": "agent",
                        "image": "node-health-agent",
                        "args": ["run"],
                        "env": [
                            {"name": "ENABLE_RECOVERY", "value": "true"},
                            {"name": "CLUSTER_NAME", "value": "bench"},
                        ],
                    }
                ],
            },
            "status": {"phase": "Running"},
        }
    )
    dra.seed_p5(server, node=NODE)
    for i in range(8):
        server.put_object(dra.allocated_claim(f"gpu-{i}", dra.NVIDIA, [f"gpu-{i}"], namespace="ml", pool=NODE))
        server.put_object(dra.claim_pod(f"train-{i}", f"gpu-{i}", namespace="ml", node=NODE))


def _holders() -> list[Any]:
    from helpers.podresources_server import Container, Pod

    def holder(i: int) -> Any:
        return Container("main", claims=[("gpu.nvidia.com", NODE, f"gpu-{i}")], claim_name=f"gpu-{i}")

    return [Pod("ml", f"train-{i}", [holder(i)]) for i in range(8)]


def _xid119(pci: str) -> str:
    bus = pci.rsplit(".", 1)[0]  # the Xid printer leaves the function out: PCI:%04x:%02x:%02x
    return (
        f"NVRM: Xid (PCI:{bus}): 119, pid=2024380, name=python3, Timeout after 6s of waiting for RPC response "
        "from GPU3 GSP! Expected function 103 (GSP_RM_ALLOC) (0x2081 0x4)."
    )


class _Agent:
    """The agent as deployed, in its own process."""

    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", AS_DEPLOYED, "run", "--kubeconfig", str(tmp / "kubeconfig")]
            + ["--node-name", NODE, "--kmsg-path", str(tmp / "kmsg"), "--state-dir", str(tmp / "state")]
            + ["--listen", "0"],
            stdout=subprocess.DEVNULL,
            stderr=open(tmp / "agent.log", "ab"),  # noqa: SIM115 - the child holds it
            env=env,
            cwd=ROOT,
        )

    def rss_mib(self) -> float:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")) / 1024

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # a loaded machine: never leave the agent behind
            self.proc.kill()
            self.proc.wait(timeout=10)


def _fence_effect(server: Any, rule: str) -> str | None:
    """The effect of the DeviceTaintRule ``rule`` (None: there is no such rule)."""
    obj = server.get_object("DeviceTaintRule", rule)
    return None if obj is None else ((obj.get("spec") or {}).get("taint") or {}).get("effect")


def _events_on(server: Any, pod: str) -> list[dict[str, Any]]:
    """The DeviceFault Events about ``pod`` (namespace ml)."""
    return [
        e
        for e in server.list_objects("Event", namespace="ml")
        if (e.get("involvedObject") or {}).get("kind") == "Pod"
        and (e.get("involvedObject") or {}).get("name") == pod
        and e.get("reason") == "DeviceFault"
    ]


def _incident(server: Any) -> dict[str, Any]:
    node = server.get_object("Node", NODE)
    text = ((node.get("metadata") or {}).get("annotations") or {}).get("node-health-agent.io/incident")
    return json.loads(text) if text else {}


def _drained(server: Any) -> bool:
    fences = _incident(server).get("fences") or []
    return any("drain-device" in (f.get("steps") or []) for f in fences)


def _evictions(server: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in server.requests.filter(method="POST", path_regex=r"/namespaces/ml/pods/[^/]+/eviction$"):
        pod = r.path.rsplit("/", 2)[-2]
        out[pod] = out.get(pod, 0) + 1
    return out


def measure() -> dict[str, float]:
    sys.path.insert(0, str(ROOT / "tests"))
    from agent.core.devices import DeviceKind, device_from
    from agent.recovery.fence import rule_name

    from helpers import dra
    from helpers.podresources_server import PodResourcesServer
    from kubeapi.server import KubeApiServer

    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        server = KubeApiServer(dra="1.37").start()
        server.device_taints.auto(True)
        server.kubelet.auto_confirm(0.5)
        socket_path = str(tmp / "kubelet.sock")
        kubelet = PodResourcesServer(socket_path, _holders()).__enter__()
        try:
            _seed(server)
            server.write_kubeconfig(tmp / "kubeconfig")
            (tmp / "kmsg").write_text(f"6,1,{_usec()},-;boot\n")
            env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
            env.update(
                ENABLE_RECOVERY="true",
                RECOVERY_STARTUP_DELAY="0",
                CLUSTER_NAME="bench",
                POD_NAMESPACE="node-health-agent",
                DEVICE_HOLDERS="true",
                POD_RESOURCES_SOCKET=socket_path,
                NHA_CLEAR_POLL="1s",
                AWS_REGION="us-west-2",
                AWS_ACCESS_KEY_ID="testing",
                AWS_SECRET_ACCESS_KEY="testing",
            )
            pci = dra.H100_PCI[GPU]
            device = device_from(DeviceKind.GPU, pci)
            assert device is not None
            rule = rule_name(NODE, device)
            holder = f"train-{GPU}"

            agent = _Agent(tmp, env)
            try:
                _wait(lambda: _status_patches(server) >= 1, 90, "the first PATCH")
                with (tmp / "kmsg").open("a") as f:
                    f.write(f"3,2,{_usec()},-;{_xid119(pci)}\n")
                t0 = time.monotonic()
                _wait(lambda: bool(_events_on(server, holder)), 60, "the DeviceFault Event on the holder")
                figures["device.detect_to_holder_event_s"] = time.monotonic() - t0
                _wait(lambda: _fence_effect(server, rule) == "NoSchedule", 60, "the NoSchedule fence")
                figures["device.detect_to_fence_s"] = time.monotonic() - t0
                creates = server.requests.filter(method="POST", path_regex=r"/devicetaintrules$")
                first = (creates[0].body or {}) if creates else {}
                if ((first.get("spec") or {}).get("taint") or {}).get("effect") != "None":
                    raise SystemExit("device benchmark: the fence was not written with effect None first")
                _wait(lambda: _drained(server), 120, "the holder's drain")
                evictions = _evictions(server)
                figures["device.holder_evictions"] = float(evictions.get(holder, 0))
                figures["device.other_pod_evictions"] = float(sum(n for p, n in evictions.items() if p != holder))
                figures["device.rss_mib_acting"] = agent.rss_mib()

                clear = subprocess.run(
                    [sys.executable, "-c", AS_DEPLOYED, "clear", "--kubeconfig", str(tmp / "kubeconfig")]
                    + ["--node", NODE, "--condition", "GpuXid", "--device", pci, "--reason", "bench: GPU 3 reseated"]
                    + ["--wait", "60"],
                    capture_output=True,
                    text=True,
                    env=env,
                    cwd=ROOT,
                    timeout=120,
                )
                if clear.returncode != 0:
                    said = f"{clear.stdout.strip()} {clear.stderr.strip()}"
                    raise SystemExit(f"device benchmark: clear failed ({clear.returncode}): {said}")
                _wait(lambda: _fence_effect(server, rule) is None, 60, "the fence lifted after the clear")
            finally:
                agent.stop()

            before = len(server.requests)
            events_before = len(_events_on(server, holder))
            patches_before = _status_patches(server)
            agent = _Agent(tmp, env)
            try:
                _wait(lambda: _status_patches(server) > patches_before, 90, "the restart's first PATCH")
                time.sleep(5.0)  # a settled agent: what it would re-raise from the ring, it has by now
            finally:
                agent.stop()
            after = server.requests.snapshot()[before:]
            refired = sum(1 for r in after if r.method == "PATCH" and r.path.endswith("/status") and _sets_true(r.body))
            refired += sum(1 for r in after if r.method == "POST" and r.path.endswith("/devicetaintrules"))
            refired += len(_events_on(server, holder)) - events_before
            figures["device.refire_after_clear"] = float(refired)
        finally:
            kubelet.__exit__(None, None, None)
            server.stop()
    return figures


def _status_patches(server: Any) -> int:
    return server.requests.count(method="PATCH", path_regex=rf"/nodes/{NODE}/status$")


def _sets_true(body: Any) -> bool:
    """A condition PATCH that sets GpuXid True."""
    conditions = ((body or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "GpuXid" and c.get("status") == "True" for c in conditions)
