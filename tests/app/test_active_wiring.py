"""The active checks' seams as wired: the devices of a kind on the node, and ``busy`` from a holder lookup."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.app.wiring.active import lookup_busy, node_devices
from agent.core.devices import DeviceKind, DeviceRef
from agent.core.holders import Holder, Holders


def test_the_devices_of_each_kind_are_found_where_the_drivers_show_them(tmp_path: Path):
    for pci in ("0000:3b:00.0", "0000:5d:00.0"):
        (tmp_path / "proc/driver/nvidia/gpus" / pci).mkdir(parents=True)
    (tmp_path / "dev").mkdir()
    for name in ("neuron0", "neuron12", "null"):
        (tmp_path / "dev" / name).touch()
    (tmp_path / "sys/class/infiniband/rdmap0s6").mkdir(parents=True)
    roots = {"sys_root": tmp_path / "sys", "dev_root": tmp_path / "dev", "proc_root": tmp_path / "proc"}
    assert [d.key for d in node_devices("gpu", **roots)] == ["gpu:0000:3b:00.0", "gpu:0000:5d:00.0"]
    neurons = node_devices("neuron", **roots)
    assert [(d.key, d.index) for d in neurons] == [("neuron:neuron0", 0), ("neuron:neuron12", 12)]
    assert [d.key for d in node_devices("rdma", **roots)] == ["rdma:rdmap0s6"]


class Lookup:
    def __init__(self, answers: dict[str, Holders]):
        self.answers = answers

    def holders(self, device: DeviceRef) -> Holders:
        return self.answers[device.key]


def holder(ns: str, pod: str) -> Holder:
    return Holder(namespace=ns, pod=pod, container="c", resource="nvidia.com/gpu", device_id="GPU-1")


def gpus(kind: str) -> list[DeviceRef]:
    return [DeviceRef(kind=DeviceKind.GPU, id=i, printed=i) for i in ("0000:3b:00.0", "0000:5d:00.0")]


def test_busy_names_the_holder_pods_none_when_idle_and_raises_when_it_cannot_tell():
    idle = Holders(())
    busy = lookup_busy(Lookup({"gpu:0000:3b:00.0": idle, "gpu:0000:5d:00.0": idle}), gpus)  # type: ignore[arg-type]
    assert busy("gpu") is None
    held = Holders((holder("ml", "train-0"),))
    busy = lookup_busy(Lookup({"gpu:0000:3b:00.0": idle, "gpu:0000:5d:00.0": held}), gpus)  # type: ignore[arg-type]
    assert busy("gpu") == "ml/train-0"
    broken = Holders((), incomplete="unavailable: no socket")
    busy = lookup_busy(Lookup({"gpu:0000:3b:00.0": broken, "gpu:0000:5d:00.0": idle}), gpus)  # type: ignore[arg-type]
    with pytest.raises(LookupError, match="no socket"):
        busy("gpu")


def test_an_active_check_that_has_not_run_is_never_stale():
    from types import SimpleNamespace

    from agent.app.wiring.checks import stale_checks
    from agent.checks.model import ActiveSpec, ScheduledCheck
    from agent.checks.scheduler import CheckStats
    from agent.core.types import ConditionSpec

    class Diag:
        name = "diag"
        conditions = (ConditionSpec(type="GpuDiag", reason="GpuDiagOk", message="fine"),)

        def run(self):
            return []

    now = [1000.0]
    spec = ScheduledCheck(
        check=Diag(), interval=60.0, timeout=10.0, kind="python", origin="test", active=ActiveSpec(devices="gpu")
    )
    scheduler = SimpleNamespace(checks=(spec,), stats={"diag": CheckStats(kind="python", origin="test")})
    stale = stale_checks(scheduler, clock=lambda: now[0])
    now[0] += 86400  # a day of skips (jobs hold the GPUs) or of waiting for a request
    assert stale() == {}


@pytest.mark.parametrize(
    ("given", "share"), [("10%", 0.10), ("25", 0.25), (" 100 % ", 1.0), ("0%", None), ("101%", None), ("nan", None)]
)
def test_the_share_flag_takes_a_percentage_from_1_to_100(given, share):
    from agent.app import flagvalues

    if share is None:
        with pytest.raises(ValueError, match="percentage from 1% to 100%"):
            flagvalues.share(given)
    else:
        assert flagvalues.share(given) == pytest.approx(share)


def test_a_neuron_device_plugin_pod_is_found_holding_its_device_through_the_real_pod_resources_api(tmp_path: Path):
    """The devices as listed are matched against the kubelet's answer: a Neuron device plugin names /dev/neuron<N>
    by N, so the listed device must carry its number (without it every Neuron check was skipped HoldersUnknown)."""
    from agent.app.settings import Settings
    from agent.app.wiring.active import active_gates
    from agent.checks.active import DEVICE_BUSY
    from agent.checks.model import ActiveSpec

    from helpers.podresources_server import Container, Pod, PodResourcesServer

    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "neuron1").touch()
    socket = str(tmp_path / "kubelet.sock")
    settings = Settings(
        standalone=True, config_files=(), plugins_dirs=(), kmsg_path=tmp_path / "kmsg", kmsg_relay=None, listen=None,
        state_dir=tmp_path / "state", lookback=300.0, stall_timeout=60.0, node_name="n", device_holders=True,
        dev_root=tmp_path / "dev", sys_root=tmp_path / "sys", pod_resources_socket=socket,
    )  # fmt: skip
    pod = Pod("ml", "train-1", [Container("main", devices={"aws.amazon.com/neuron": ["1"]})])
    for pods, skip in (([pod], DEVICE_BUSY), ([], None)):
        with PodResourcesServer(socket, pods):
            gates = active_gates(settings, kube=None)
            said = gates.admit(check="neuron-diag", spec=ActiveSpec(devices="neuron"), timeout=60.0)
            assert (said.reason if said else None) == skip
            assert said is None or "ml/train-1" in said.message


def test_the_built_in_dormant_active_checks_are_scheduled_by_the_configuration_loader():
    """``enabled: false`` on an active check means dormant (run on request), not off: the loader the agent
    starts and reloads with keeps them, or a validation request naming dcgm-diag would never be answered."""
    from agent.app.config import load_configuration
    from agent.checks.model import CheckContext
    from agent.core.paths import builtin_plugins_dir

    loaded = load_configuration([builtin_plugins_dir() / "nvidia"], context=CheckContext())
    active = {c.name: c.active for c in loaded.checks if c.active is not None}
    assert set(active) == {"dcgm-diag", "nccl-loopback"}
    assert all(spec.dormant and spec.on_demand for spec in active.values())
    assert "gpu-count" in {c.name for c in loaded.checks}
