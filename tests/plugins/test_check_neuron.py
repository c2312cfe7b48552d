"""Built-in AWS Neuron checks: neuron-devices, neuron-allocation, neuron-ultraserver.

Host sysfs and /dev are fixture trees built under tmp_path; neuron-ls is a fake executable on a tmp
PATH that prints the recorded outputs in shared/testdata/tool-outputs (read in place). The clock is
injected; nothing sleeps.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.checks.builtin import import_builtin
from agent.checks.model import Check, CheckConfigError, CheckContext, CheckResult, CheckStatus, ProcessResult
from agent.core.types import Severity

from helpers import REPO
from helpers.testdata import tool_output

neuronls = import_builtin("neuron.neuronls")
devices = import_builtin("neuron.devices")
topology = import_builtin("neuron.topology")
ultraserver = import_builtin("neuron.ultraserver")

CAT, SLEEP = shutil.which("cat") or "/bin/cat", shutil.which("sleep") or "/bin/sleep"  # the tool PATH is only bin/
PLUGIN_DIR = REPO / "plugins" / "neuron"
# The "no driver" answer of neuron-ls (reference device-checks.md §1.4, from the Backend.AI Neuron plugin
# tests): there is no recording of it in tool-outputs, so stdout/stderr/exit code are rebuilt from those facts.
NO_DRIVER_STDERR = (
    'time="2024-05-02T10:11:12Z" level=fatal msg="Failed to load MLA system information" '
    'error="failed to discover Neuron devices"\n'
)


# --- fixtures ------------------------------------------------------------------------------------------


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def recorded(name: str) -> str:
    """A recorded neuron-ls output without the docs' shell prompt line (``$ neuron-ls -j``): the prompt
    is part of the published transcript, not of what the program prints."""
    return "".join(line for line in tool_output(name).splitlines(keepends=True) if not line.startswith("$ "))


def write_counter(hardware: Path, name: str, value: int, *, layout: str) -> None:
    if layout == "single":
        (hardware / name).write_text(f"{value}\n")
    else:  # total/present directory
        (hardware / name).mkdir(exist_ok=True)
        (hardware / name / "total").write_text(f"{value}\n")
        (hardware / name / "present").write_text(f"{min(value, 1)}\n")


def make_host(
    root: Path,
    sysfs: Iterable[int] = range(16),
    dev: Iterable[int] | None = None,
    *,
    layout: str = "virtual",
    counters: Mapping[int, Mapping[str, int]] | None = None,
    counter_layout: str = "single",
) -> tuple[Path, Path]:
    """A host /sys and /dev with the given neuron<N> entries (dev defaults to the same indices).

    ``layout``: ``virtual`` (devices/virtual/neuron_device/neuronN plus class links, the documented tree) or
    ``class-only`` (only class/neuron_device/neuronN links into a PCI path, as a reorganised tree may be).
    """
    sys_root, dev_root = root / "sys", root / "dev"
    dev_root.mkdir(parents=True, exist_ok=True)
    (sys_root / "class" / "neuron_device").mkdir(parents=True, exist_ok=True)
    for i in sysfs:
        if layout == "virtual":
            device = sys_root / "devices" / "virtual" / "neuron_device" / f"neuron{i}"
        else:
            device = sys_root / "devices" / "pci0000:00" / f"0000:00:{i + 16:02x}.0" / "neuron_device" / f"neuron{i}"
        (device / "info" / "architecture").mkdir(parents=True)
        (device / "info" / "architecture" / "device_name").write_text("Trainium1\n")
        (device / "core_count").write_text("2\n")
        (device / "reset").write_text("0\n")
        hardware = device / "stats" / "hardware"
        hardware.mkdir(parents=True)
        for name, value in ((counters or {}).get(i) or {}).items():
            write_counter(hardware, name, value, layout=counter_layout)
        (sys_root / "class" / "neuron_device" / f"neuron{i}").symlink_to(device)
    for i in sysfs if dev is None else dev:
        (dev_root / f"neuron{i}").write_text("")
    return sys_root, dev_root


def fake_tool(bin_dir: Path, *, stdout: str = "", stderr: str = "", exit_code: int = 0, body: str = "") -> Path:
    """A fake neuron-ls: logs its arguments, prints the given stdout/stderr, exits with the given code."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "stdout.txt").write_text(stdout)
    (bin_dir / "stderr.txt").write_text(stderr)
    script = bin_dir / "neuron-ls"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> "{bin_dir}/calls.log"\n'
        f"{body}"
        f'{CAT} "{bin_dir}/stdout.txt"\n'
        f'{CAT} "{bin_dir}/stderr.txt" >&2\n'
        f"exit {exit_code}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return script


def tool_calls(bin_dir: Path) -> list[str]:
    log = bin_dir / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def context(
    root: Path,
    *,
    sys_root: Path | None = None,
    dev_root: Path | None = None,
    instance_type: str | None = "trn1.32xlarge",
    labels: Mapping[str, str] | None = None,
    clock: Clock | None = None,
) -> CheckContext:
    (root / "bin").mkdir(parents=True, exist_ok=True)
    return CheckContext(
        sys_root=sys_root or root / "sys",
        dev_root=dev_root or root / "dev",
        state_dir=root / "state",
        tool_path=str(root / "bin"),
        instance_type=lambda: instance_type,
        node_labels=lambda: labels,
        clock=clock or Clock(),
    )


def devices_check(ctx: CheckContext, **options: Any):
    return devices.NeuronDevicesCheck(name="neuron-devices", context=ctx, options=options)


def main(results: list[CheckResult]) -> CheckResult:
    (result,) = [r for r in results if r.condition == "NeuronDevices"]
    return result


def warnings(results: list[CheckResult]) -> dict[str, CheckResult]:
    return {r.reason: r for r in results if r.condition is None}


def value(result: CheckResult, name: str, **labels: str) -> float | None:
    for v in result.values:
        if v.name == name and all(v.labels.get(k) == want for k, want in labels.items()):
            return v.value
    return None


# --- neuron-ls parsing ---------------------------------------------------------------------------------


def test_published_trn2_json_is_not_valid_json_and_the_parser_says_so() -> None:
    # The docs elide devices 1-14 with a literal "..." line: the published text is not JSON.
    with pytest.raises(neuronls.NeuronLsParseError, match="not valid JSON"):
        neuronls.parse_json_output(recorded("neuron-ls-trn2-json-elided.txt"))


def test_published_trn2_json_with_the_ellipsis_line_removed_parses() -> None:
    # Removing the docs' "..." line leaves the two devices shown, as neuron-ls would print them.
    text = "\n".join(line for line in recorded("neuron-ls-trn2-json-elided.txt").splitlines() if line.strip() != "...")
    report = neuronls.parse_json_output(text)
    assert report.indices == {0, 15}
    first = report.devices[0]
    assert (first.bdf, first.core_count, first.memory_bytes, first.connected_to) == (
        "cc:00.0",
        4,
        103079215104,
        (12, 3, 4, 1),
    )
    assert report.instance_type is None


def test_element_with_instance_type_from_a_real_trn2_capture() -> None:
    # The element shape of reference §4.3 (trn2.48xlarge capture), in the old top-level array.
    element = {
        "instance_type": "trn2.48xlarge",
        "neuron_device": 0,
        "bdf": "0000:e1:00.0",
        "cpu_affinity": "48-95,144-191",
        "numa_node": "1",
        "connected_to": [12, 1, 9, 14],
        "nc_count": 4,
        "logical_neuroncore_config": 2,
        "memory_size": 103079215104,
        "neuroncore_ids": [0, 1, 2, 3],
        "neuron_processes": [],
    }
    report = neuronls.parse_json_output(json.dumps([element]))
    assert report.instance_type == "trn2.48xlarge"
    assert report.devices[0].connected_to == (12, 1, 9, 14)


@pytest.mark.parametrize(
    "doc, indices, instance_type",
    [
        # Synthetic: Neuron 2.34's --output-format json is documented only as "top-level fields for
        # instance and UltraServer details"; its key names are not published, so two plausible shapes.
        (
            {
                "instance": {"instance_type": "trn2u.48xlarge"},
                "ultraserver": {"mode": "4"},
                "neuron_devices": [{"neuron_device": 0}, {"neuron_device": 1}],
            },
            {0, 1},
            "trn2u.48xlarge",
        ),
        ({"instance_type": "trn1.2xlarge", "system": {"devices": [{"neuron_device": 0}]}}, {0}, "trn1.2xlarge"),
        ({"instance_type": "trn1.2xlarge", "neuron_devices": []}, set(), "trn1.2xlarge"),
        ([{"neuron_device": 0, "connected_to": None}], {0}, None),
        ([], set(), None),
    ],
    ids=["object-devices-key", "object-nested", "object-empty-list", "array-single-device", "array-empty"],
)
def test_both_json_forms_are_read(doc: Any, indices: set[int], instance_type: str | None) -> None:
    report = neuronls.parse_json_output(json.dumps(doc))
    assert report.indices == indices
    assert report.instance_type == instance_type


@pytest.mark.parametrize(
    "text, complaint",
    [
        ("", "empty output"),
        ("null", "JSON NoneType"),
        ('{"instance": {}}', "without a device list"),
        ("[1, 2]", "not an object"),
        ('[{"bdf": "cc:00.0"}]', "no non-negative integer neuron_device"),
        ('[{"neuron_device": "0"}]', "no non-negative integer neuron_device"),
        ("+----+\n| NEURON |", "not valid JSON"),
    ],
    ids=["empty", "null", "object-without-devices", "numbers", "no-index", "string-index", "table-output"],
)
def test_garbage_is_a_parse_error(text: str, complaint: str) -> None:
    with pytest.raises(neuronls.NeuronLsParseError, match=complaint):
        neuronls.parse_json_output(text)


def test_neuron_ls_table_output_is_not_json() -> None:
    # What a wrongly configured command (plain `neuron-ls`) prints: the recorded trn2 table.
    with pytest.raises(neuronls.NeuronLsParseError, match="not valid JSON"):
        neuronls.parse_json_output(recorded("neuron-ls-trn2-default.txt"))


def test_logfmt_fatal_line() -> None:
    assert neuronls.parse_logfmt(NO_DRIVER_STDERR.strip())["error"] == "failed to discover Neuron devices"
    assert neuronls.fatal_error(NO_DRIVER_STDERR) == (
        "Failed to load MLA system information: failed to discover Neuron devices"
    )
    assert neuronls.fatal_error("plain words\n") is None


def _pr(**kw: Any) -> ProcessResult:
    return ProcessResult(argv=("neuron-ls", "--json-output"), **{"exit_code": 0, **kw})


@pytest.mark.parametrize(
    "result, state",
    [
        (_pr(stdout='[{"neuron_device": 0}]'), "ok"),
        (_pr(exit_code=None, error="not found in PATH (/x)"), "absent"),
        (_pr(exit_code=None, error="not executable (permission denied)"), "failed"),
        (_pr(exit_code=None, timed_out=True, duration=10.0), "failed"),
        (_pr(exit_code=-9), "failed"),
        (_pr(exit_code=1, stderr=NO_DRIVER_STDERR), "no-devices"),
        (_pr(exit_code=1, stderr='level=fatal msg="boom" error="something else"'), "failed"),
        (_pr(stdout="not json"), "failed"),
        (_pr(exit_code=2, stderr="Error: unknown flag: --json-output\nUsage: neuron-ls [flags]"), None),
    ],
    ids=["ok", "absent", "not-executable", "timed-out", "killed", "no-driver", "other-fatal", "garbage", "usage"],
)
def test_interpreting_one_run(result: ProcessResult, state: str | None) -> None:
    outcome = neuronls.interpret(result)
    assert (outcome.state.value if outcome else None) == state


# --- neuron-devices: counting --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sysfs, dev, layout, instance_type, status, reason, message_has",
    [
        (range(16), None, "virtual", "trn1.32xlarge", "OK", "NeuronDevicesOk", "16 Neuron devices present"),
        (range(16), None, "class-only", "trn1.32xlarge", "OK", "NeuronDevicesOk", "expected 16"),
        (
            [i for i in range(16) if i != 5],
            None,
            "virtual",
            "trn1.32xlarge",
            "PROBLEM",
            "NeuronDeviceMissing",
            "15 of 16 Neuron devices present (instance type trn1.32xlarge); missing: neuron5",
        ),
        (
            range(16),
            [i for i in range(16) if i != 7],
            "virtual",
            "trn1.32xlarge",
            "PROBLEM",
            "NeuronDeviceMissing",
            "in sysfs but without a device file",
        ),
        (range(16), range(17), "virtual", "trn1.32xlarge", "OK", "NeuronDevicesOk", "but not in sysfs: neuron16"),
        (range(16), [], "virtual", "trn1.32xlarge", "OK", "NeuronDevicesOk", "host /dev not mounted?"),
        ([], range(16), "virtual", "trn1.32xlarge", "OK", "NeuronDevicesOk", "judged from"),
        ([], [], "virtual", "trn2.48xlarge", "PROBLEM", "NeuronDevicesNotFound", "no Neuron device found, expected 16"),
        ([], [], "virtual", None, "OK", "NoNeuronDevices", "none expected"),
        ([], [], "virtual", "m5.large", "OK", "NoNeuronDevices", "none expected"),
        (range(12), None, "virtual", "inf2.48xlarge", "OK", "NeuronDevicesOk", "12 Neuron devices"),
        (range(6), None, "virtual", None, "OK", "NeuronDevicesOk", "no expected count known"),
    ],
    ids=[
        "trn1-healthy",
        "trn1-class-links-only",
        "trn1-one-missing",
        "dev-node-missing",
        "stale-extra-dev-node",
        "host-dev-not-mounted",
        "sysfs-shows-none",
        "trn2-zero-devices",
        "no-neuron-node",
        "cpu-instance",
        "inf2-healthy",
        "unknown-type-first-run",
    ],
)
def test_device_count(
    tmp_path: Path,
    sysfs: Iterable[int],
    dev: Iterable[int] | None,
    layout: str,
    instance_type: str | None,
    status: str,
    reason: str,
    message_has: str,
) -> None:
    make_host(tmp_path, sysfs, dev, layout=layout)
    results = devices_check(context(tmp_path, instance_type=instance_type)).run()
    result = main(results)
    assert (result.status.value, result.reason) == (status, reason), result.message
    assert message_has in result.message
    if result.status is CheckStatus.PROBLEM:
        assert result.severity is Severity.CRITICAL
    assert not warnings(results)  # no neuron-ls installed: nothing to say about it


def test_missing_device_values_show_the_gap(tmp_path: Path) -> None:
    make_host(tmp_path, [i for i in range(16) if i not in (3, 9)])
    result = main(devices_check(context(tmp_path)).run())
    assert "missing: neuron3, neuron9" in result.message
    assert value(result, "neuron_devices", source="usable") == 14
    assert value(result, "neuron_devices_expected") == 16
    assert value(result, "neuron_devices_missing") == 2


@pytest.mark.parametrize(
    "options, instance_type, status, reason",
    [
        ({"expectedCount": 8}, "trn1.32xlarge", "OK", "NeuronDevicesOk"),
        ({"expectedCount": 17}, "trn1.32xlarge", "PROBLEM", "NeuronDeviceMissing"),
        ({"instanceTypes": {"trn2.3xlarge": 1}}, "trn2.3xlarge", "OK", "NeuronDevicesOk"),
        ({"instanceTypes": {"trn1.32xlarge": 20}}, "trn1.32xlarge", "PROBLEM", "NeuronDeviceMissing"),
        ({"instanceTypes": {"TRN1.32XLARGE": 16}}, "Trn1.32xlarge", "OK", "NeuronDevicesOk"),
    ],
    ids=["option-below", "option-above", "table-extended", "table-overridden", "case-insensitive"],
)
def test_expected_count_sources(
    tmp_path: Path, options: dict[str, Any], instance_type: str, status: str, reason: str
) -> None:
    make_host(tmp_path, range(16))
    result = main(devices_check(context(tmp_path, instance_type=instance_type), **options).run())
    assert (result.status.value, result.reason) == (status, reason)


def test_learned_count_rises_never_falls_and_survives_a_restart(tmp_path: Path) -> None:
    make_host(tmp_path, range(16))
    ctx = context(tmp_path, instance_type=None)
    first = main(devices_check(ctx).run())
    assert first.status is CheckStatus.OK
    state = json.loads((tmp_path / "state" / "neuron-devices.json").read_text())
    assert state["maxSeen"] == 16
    assert [p.name for p in (tmp_path / "state").iterdir()] == ["neuron-devices.json"]  # no temp file left

    for path in (tmp_path / "sys/devices/virtual/neuron_device/neuron15", tmp_path / "dev/neuron15"):
        os.rename(path, path.with_name("gone"))
    restarted = devices_check(ctx)  # a new process reads the file
    result = main(restarted.run())
    assert (result.status, result.reason) == (CheckStatus.PROBLEM, "NeuronDeviceMissing")
    assert "15 of 16 Neuron devices present (largest count seen on this node); missing: neuron15" in result.message
    assert json.loads((tmp_path / "state" / "neuron-devices.json").read_text())["maxSeen"] == 16


def test_learned_count_is_per_instance_type_and_a_bad_file_is_ignored(tmp_path: Path) -> None:
    make_host(tmp_path, range(4))
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "neuron-devices.json").write_text('{"maxSeen": 16, "instanceType": "x1.big"}')
    result = main(devices_check(context(tmp_path, instance_type="x2.small")).run())
    assert result.status is CheckStatus.OK  # 16 was seen on another instance type (resized instance)

    (tmp_path / "state" / "neuron-devices.json").write_text("{not json")
    result = main(devices_check(context(tmp_path, instance_type=None)).run())
    assert result.status is CheckStatus.OK
    assert json.loads((tmp_path / "state" / "neuron-devices.json").read_text())["maxSeen"] == 4


def test_unwritable_state_dir_costs_a_note_not_the_check(tmp_path: Path) -> None:
    make_host(tmp_path, range(2))
    (tmp_path / "state").write_text("a file where the directory should be")
    result = main(devices_check(context(tmp_path, instance_type=None)).run())
    assert result.status is CheckStatus.OK
    assert "cannot save the learned count" in result.message


def test_unlistable_sysfs_is_unknown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_host(tmp_path, range(16))
    blocked = tmp_path / "sys" / "devices" / "virtual" / "neuron_device"
    real_scandir = os.scandir

    def scandir(path: Any = ".") -> Any:
        if Path(path) == blocked:
            raise PermissionError(13, "Permission denied")
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)  # the tests run as root, where chmod would not stop a read
    result = main(devices_check(context(tmp_path)).run())
    assert (result.status, result.reason) == (CheckStatus.UNKNOWN, "NeuronSysfsUnreadable")
    assert "permission denied" in result.message


def test_this_machine_is_never_a_problem(tmp_path: Path) -> None:
    # The real /sys, /dev and tool PATH of the machine running the tests (no Neuron device here).
    ctx = CheckContext(state_dir=tmp_path / "state")
    for check in build_declared(tmp_path, ctx=ctx):
        for result in check.run():
            assert result.status is not CheckStatus.PROBLEM, (check.name, result.message)


# --- neuron-devices: ECC counters ----------------------------------------------------------------------


@pytest.mark.parametrize("counter_layout", ["single", "total-present"])
def test_uncorrected_ecc_rise_is_critical_after_the_baseline(tmp_path: Path, counter_layout: str) -> None:
    counters = {i: {"mem_ecc_uncorrected": 0, "sram_ecc_uncorrected": 2} for i in range(16)}
    make_host(tmp_path, range(16), counters=counters, counter_layout=counter_layout)
    clock = Clock()
    check = devices_check(context(tmp_path, clock=clock), eccHold="1h")

    baseline = main(check.run())  # sram_ecc_uncorrected=2 at start: the baseline, not a problem
    assert baseline.status is CheckStatus.OK
    assert value(baseline, "neuron_ecc_uncorrected", device="4", counter="sram_ecc_uncorrected") == 2

    hardware = tmp_path / "sys/devices/virtual/neuron_device/neuron4/stats/hardware"
    write_counter(hardware, "mem_ecc_uncorrected", 3, layout="single" if counter_layout == "single" else "dir")
    clock.now += 60
    rose = main(check.run())
    assert (rose.status, rose.reason, rose.severity) == (
        CheckStatus.PROBLEM,
        "NeuronEccUncorrected",
        Severity.CRITICAL,
    )
    assert "neuron4 mem_ecc_uncorrected rose 0 -> 3" in rose.message
    assert value(rose, "neuron_ecc_uncorrected", device="4", counter="mem_ecc_uncorrected") == 3

    clock.now += 1800  # no further rise, still within eccHold
    assert main(check.run()).reason == "NeuronEccUncorrected"
    clock.now += 1801  # past eccHold since the rise
    assert main(check.run()).status is CheckStatus.OK


def test_counter_going_down_is_a_new_baseline(tmp_path: Path) -> None:
    make_host(tmp_path, range(16), counters={0: {"mem_ecc_uncorrected": 5}})
    clock = Clock()
    check = devices_check(context(tmp_path, clock=clock))
    hardware = tmp_path / "sys/devices/virtual/neuron_device/neuron0/stats/hardware"
    check.run()
    write_counter(hardware, "mem_ecc_uncorrected", 6, layout="single")
    assert main(check.run()).reason == "NeuronEccUncorrected"
    write_counter(hardware, "mem_ecc_uncorrected", 0, layout="single")  # driver reloaded
    clock.now += 60
    assert main(check.run()).status is CheckStatus.OK
    write_counter(hardware, "mem_ecc_uncorrected", 1, layout="single")
    assert "rose 0 -> 1" in main(check.run()).message


def test_missing_device_and_ecc_rise_keep_one_stable_reason(tmp_path: Path) -> None:
    make_host(tmp_path, range(16), counters={0: {"sram_ecc_uncorrected": 0}})
    check = devices_check(context(tmp_path))
    check.run()
    write_counter(
        tmp_path / "sys/devices/virtual/neuron_device/neuron0/stats/hardware",
        "sram_ecc_uncorrected",
        1,
        layout="single",
    )
    os.remove(tmp_path / "dev" / "neuron9")
    result = main(check.run())
    assert result.reason == "NeuronDeviceMissing"  # the device count outranks ECC, always the same way
    assert "uncorrected ECC: neuron0 sram_ecc_uncorrected rose 0 -> 1" in result.message


def test_counters_are_only_read_and_reset_is_never_opened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    counters = {i: {"mem_ecc_uncorrected": 1, "mem_ecc_repairable_uncorrected": 0} for i in range(16)}
    make_host(tmp_path, range(16), counters=counters, counter_layout="total-present")
    sys_root = tmp_path / "sys"
    before = {p: p.read_bytes() for p in sys_root.rglob("*") if p.is_file()}
    opened: list[tuple[str, str]] = []
    real_open = io.open

    def spy(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        opened.append((str(file), mode))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr("builtins.open", spy)
    monkeypatch.setattr(io, "open", spy)
    check = devices_check(context(tmp_path))
    check.run()
    check.run()
    monkeypatch.undo()
    sysfs_opens = [(f, m) for f, m in opened if f.startswith(str(sys_root))]
    assert sysfs_opens, "the counters were read"
    assert all(set(m) <= {"r", "b"} for _, m in sysfs_opens)
    assert not [f for f, _ in sysfs_opens if Path(f).name == "reset"]
    assert {p: p.read_bytes() for p in sys_root.rglob("*") if p.is_file()} == before


def test_unreadable_counter_is_an_unknown_warning_beside_the_verdict(tmp_path: Path) -> None:
    make_host(tmp_path, range(16))
    hardware = tmp_path / "sys/devices/virtual/neuron_device/neuron2/stats/hardware"
    (hardware / "mem_ecc_uncorrected").write_text("garbage\n")
    results = devices_check(context(tmp_path)).run()
    assert main(results).status is CheckStatus.OK
    warning = warnings(results)["NeuronCounterUnreadable"]
    assert warning.status is CheckStatus.UNKNOWN
    assert "not a number" in warning.message


# --- neuron-devices with neuron-ls ---------------------------------------------------------------------


def test_published_trn2_json_makes_the_tool_part_unknown_and_sysfs_still_decides(tmp_path: Path) -> None:
    make_host(tmp_path, range(16))
    fake_tool(tmp_path / "bin", stdout=recorded("neuron-ls-trn2-json-elided.txt"))
    results = devices_check(context(tmp_path, instance_type="trn2.48xlarge")).run()
    assert (main(results).status, main(results).reason) == (CheckStatus.OK, "NeuronDevicesOk")
    tool = warnings(results)["NeuronLsFailed"]
    assert tool.status is CheckStatus.UNKNOWN
    assert "not valid JSON" in tool.message


def test_neuron_ls_listing_fewer_devices_is_the_container_view_not_a_fault(tmp_path: Path) -> None:
    make_host(tmp_path, range(16))
    two = "\n".join(line for line in recorded("neuron-ls-trn2-json-elided.txt").splitlines() if line.strip() != "...")
    fake_tool(tmp_path / "bin", stdout=two)
    results = devices_check(context(tmp_path, instance_type="trn2.48xlarge")).run()
    result = main(results)
    assert result.status is CheckStatus.OK
    assert "neuron-ls lists 2 of them (it sees only the devices mounted into this container" in result.message
    assert value(result, "neuron_devices", source="neuron_ls") == 2
    assert tool_calls(tmp_path / "bin") == ["--json-output"]


def test_instance_type_from_neuron_ls_when_the_node_does_not_say(tmp_path: Path) -> None:
    make_host(tmp_path, range(15))
    element = [{"instance_type": "trn2.48xlarge", "neuron_device": i} for i in range(15)]
    fake_tool(tmp_path / "bin", stdout=json.dumps(element))
    result = main(devices_check(context(tmp_path, instance_type=None)).run())
    assert (result.status, result.reason) == (CheckStatus.PROBLEM, "NeuronDeviceMissing")
    assert "(instance type trn2.48xlarge); missing: neuron15" in result.message


@pytest.mark.parametrize(
    "sysfs, instance_type, options, status, reason",
    [
        # sysfs shows the devices: neuron-ls failing to discover them means this container has no device
        # files mounted, not that the node lost them.
        (range(16), "trn2.48xlarge", {}, "OK", "NeuronDevicesOk"),
        # sysfs shows none either: the driver is not loaded on a node meant to have devices.
        ([], "trn2.48xlarge", {}, "PROBLEM", "NeuronDevicesNotFound"),
        # no instance type known, but the Neuron tools are installed: the node is meant to have devices.
        ([], None, {}, "PROBLEM", "NeuronDevicesNotFound"),
        # expectedCount 0 says none are expected, whatever is installed.
        ([], None, {"expectedCount": 0}, "OK", "NoNeuronDevices"),
    ],
    ids=["sysfs-has-devices", "sysfs-has-none", "tool-installed-type-unknown", "none-expected"],
)
def test_no_driver_answer_of_neuron_ls(
    tmp_path: Path, sysfs: Iterable[int], instance_type: str | None, options: dict, status: str, reason: str
) -> None:
    make_host(tmp_path, sysfs)
    fake_tool(tmp_path / "bin", stderr=NO_DRIVER_STDERR, exit_code=1)
    results = devices_check(context(tmp_path, instance_type=instance_type), **options).run()
    result = main(results)
    assert (result.status.value, result.reason) == (status, reason), result.message
    if result.status is CheckStatus.PROBLEM:
        assert "failed to discover Neuron devices" in result.message
    assert not warnings(results)  # the tool answered; it did not fail
    assert value(result, "neuron_devices", source="neuron_ls") in (0, None)


def test_hanging_neuron_ls_is_unknown_for_the_tool_and_sysfs_is_still_judged(tmp_path: Path) -> None:
    make_host(tmp_path, [i for i in range(16) if i != 11])
    fake_tool(tmp_path / "bin", body=f"exec {SLEEP} 30\n")
    results = devices_check(context(tmp_path), neuronLsTimeout="300ms").run()
    assert (main(results).status, main(results).reason) == (CheckStatus.PROBLEM, "NeuronDeviceMissing")
    tool = warnings(results)["NeuronLsFailed"]
    assert tool.status is CheckStatus.UNKNOWN
    assert "timed out" in tool.message
    assert tool_calls(tmp_path / "bin") == ["--json-output"]  # a hung tool is not tried again with other flags


def test_newer_neuron_ls_gets_output_format_json_and_it_is_remembered(tmp_path: Path) -> None:
    make_host(tmp_path, range(16))
    body = 'if [ "$1" = "--json-output" ]; then echo "Error: unknown flag: --json-output" >&2; exit 2; fi\n'
    doc = {"instance": {"instance_type": "trn1.32xlarge"}, "neuron_devices": [{"neuron_device": i} for i in range(16)]}
    fake_tool(tmp_path / "bin", stdout=json.dumps(doc), body=body)
    check = devices_check(context(tmp_path, instance_type=None))
    assert main(check.run()).status is CheckStatus.OK
    assert main(check.run()).status is CheckStatus.OK
    assert tool_calls(tmp_path / "bin") == ["--json-output", "--output-format json", "--output-format json"]


def test_non_executable_neuron_ls_is_unknown(tmp_path: Path) -> None:
    make_host(tmp_path, range(16))
    fake_tool(tmp_path / "bin").chmod(0o644)
    results = devices_check(context(tmp_path)).run()
    assert main(results).status is CheckStatus.OK
    assert warnings(results)["NeuronLsFailed"].status is CheckStatus.UNKNOWN


def test_neuron_ls_judged_alone_when_host_roots_show_nothing(tmp_path: Path) -> None:
    make_host(tmp_path, [])
    fake_tool(tmp_path / "bin", stdout=json.dumps([{"neuron_device": i} for i in range(16)]))
    result = main(devices_check(context(tmp_path)).run())
    assert result.status is CheckStatus.OK
    assert "judged from neuron-ls" in result.message


# --- options -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "factory, options, field",
    [
        ("devices", {"expectedCount": -1}, "expectedCount"),
        ("devices", {"expectedCount": True}, "expectedCount"),
        ("devices", {"instanceTypes": ["trn1.32xlarge"]}, "instanceTypes"),
        ("devices", {"instanceTypes": {"trn1.32xlarge": "16"}}, "instanceTypes"),
        ("devices", {"neuronLsTimeout": "soon"}, "neuronLsTimeout"),
        ("devices", {"neuronLsTimeout": 0}, "neuronLsTimeout"),
        ("devices", {"neuronLs": 5}, "neuronLs"),
        ("devices", {"eccCounters": ["reset"]}, "eccCounters"),
        ("devices", {"eccCounters": "mem_ecc_uncorrected"}, "eccCounters"),
        ("devices", {"eccHold": "-1s"}, "eccHold"),
        ("devices", {"expectedcount": 16}, "expectedcount"),
        ("devices", {"stateFile": "../x.json"}, "stateFile"),
        ("allocation", {"topology": "mesh"}, "topology"),
        ("ultraserver", {"compareSysfs": "yes"}, "compareSysfs"),
        ("ultraserver", {"instanceTypes": []}, "instanceTypes"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_bad_options_name_the_option(tmp_path: Path, factory: str, options: dict, field: str) -> None:
    cls = {
        "devices": devices.NeuronDevicesCheck,
        "allocation": topology.NeuronAllocationCheck,
        "ultraserver": ultraserver.NeuronUltraServerCheck,
    }[factory]
    with pytest.raises(CheckConfigError) as info:
        cls(name="x", context=context(tmp_path), options=options)
    assert info.value.field == field


def build_declared(tmp_path: Path, *, ctx: CheckContext | None = None, defaults: bool = False) -> list[Check]:
    """Every check in plugins/neuron/checks.yaml, built as the loader would (``use``, ``name``, ``options``)."""
    checks = []
    for entry in yaml.safe_load((PLUGIN_DIR / "checks.yaml").read_text())["checks"]:
        module, attribute = entry["use"].split(":")
        factory = getattr(import_builtin(module), attribute)
        options = {} if defaults else entry.get("options") or {}
        checks.append(factory(name=entry["name"], context=ctx or context(tmp_path), options=options))
    return checks


@pytest.mark.parametrize("defaults", [False, True], ids=["declared-options", "all-defaults"])
def test_checks_yaml_declares_buildable_checks(tmp_path: Path, defaults: bool) -> None:
    checks = build_declared(tmp_path, defaults=defaults)
    assert all(isinstance(c, Check) for c in checks)
    assert {c.name: [(s.type, s.reason, s.source, s.accelerator) for s in c.conditions] for c in checks} == {
        "neuron-devices": [("NeuronDevices", "NeuronDevicesOk", "neuron-devices", True)],
        "neuron-allocation": [],
        "neuron-ultraserver": [("NeuronUltraServer", "NeuronUltraServerOk", "neuron-ultraserver", True)],
        "nccom-test": [],  # active checks (issue 36): own no condition
        "nobs-health": [],
    }


# --- allocation rules ----------------------------------------------------------------------------------

RING, TORUS, ANY = topology.Topology.RING, topology.Topology.TORUS, topology.Topology.ANY


@pytest.mark.parametrize(
    "kind, chosen, total, allowed",
    [
        (RING, [0, 1, 2], 12, True),
        (RING, [0, 2, 4], 12, False),
        (RING, [5], 12, True),
        (RING, range(12), 12, True),
        (RING, [11, 0], 12, False),  # assumption: no wrap-around
        (RING, [3, 4, 5, 6, 7], 12, True),
        (RING, [11, 12], 12, False),
        (RING, [], 12, False),
        (TORUS, [7], 16, True),
        (TORUS, range(4), 16, True),
        (TORUS, range(4, 8), 16, True),
        (TORUS, range(2, 6), 16, False),  # 4 devices, not aligned
        (TORUS, range(8), 16, True),
        (TORUS, range(8, 16), 16, True),
        (TORUS, range(4, 12), 16, False),  # 8 devices, not aligned
        (TORUS, range(16), 16, True),
        (TORUS, range(7), 16, False),  # "does not support requests for device: 7"
        (TORUS, [0, 1], 16, False),
        (TORUS, range(12), 16, False),
        (ANY, [0, 5, 9], 16, True),
    ],
)
def test_allowed_allocations(kind: Any, chosen: Iterable[int], total: int, allowed: bool) -> None:
    assert topology.is_allowed(kind, list(chosen), total) is allowed


@pytest.mark.parametrize(
    "kind, healthy, total, largest",
    [
        (TORUS, range(16), 16, 16),
        (TORUS, set(range(16)) - {5}, 16, 8),  # one lost device costs half the node
        (TORUS, set(range(16)) - {5, 12}, 16, 4),
        (TORUS, set(range(16)) - {0, 4, 8, 12}, 16, 1),
        (TORUS, set(), 16, 0),
        (RING, range(12), 12, 12),
        (RING, set(range(12)) - {5}, 12, 6),
        (RING, set(range(12)) - {2, 9}, 12, 6),
        (RING, {0, 2, 4}, 6, 1),
        (RING, set(range(16)) - {7}, 16, 8),
        (ANY, {0, 3}, 4, 2),
    ],
)
def test_largest_allocation(kind: Any, healthy: Iterable[int], total: int, largest: int) -> None:
    assert topology.largest_allocation(kind, set(healthy), total) == largest


@pytest.mark.parametrize(
    "instance_type, total, expected",
    [
        ("inf1.24xlarge", 16, RING),
        ("inf2.48xlarge", 12, RING),
        ("trn1.32xlarge", 16, TORUS),
        ("trn1n.32xlarge", 16, TORUS),
        ("trn2u.48xlarge", 16, TORUS),
        ("trn1.2xlarge", 1, ANY),
        ("p5.48xlarge", 8, None),
        (None, 4, None),
    ],
)
def test_topology_by_instance_type(instance_type: str | None, total: int, expected: Any) -> None:
    assert topology.topology_for(instance_type, total) == expected


def test_aligned_groups_of_a_16_device_torus() -> None:
    groups = topology.aligned_groups(16)
    assert groups[4] == [range(0, 4), range(4, 8), range(8, 12), range(12, 16)]
    assert groups[8] == [range(0, 8), range(8, 16)]
    assert groups[16] == [range(0, 16)]


@pytest.mark.parametrize(
    "instance_type, present, options, largest, total",
    [
        ("trn1.32xlarge", range(16), {}, 16, 16),
        ("trn1.32xlarge", [i for i in range(16) if i != 3], {}, 8, 16),
        ("inf2.48xlarge", [i for i in range(12) if i != 5], {}, 6, 12),
        (None, [0, 1, 3], {}, 3, 4),
        (None, [0, 1, 3], {"topology": "ring", "expectedCount": 4}, 2, 4),
    ],
    ids=["trn1-healthy", "trn1-one-lost", "inf2-one-lost", "unknown-type", "configured"],
)
def test_allocation_check(
    tmp_path: Path, instance_type: str | None, present: Iterable[int], options: dict, largest: int, total: int
) -> None:
    make_host(tmp_path, present)
    ctx = context(tmp_path, instance_type=instance_type)
    (result,) = topology.NeuronAllocationCheck(name="neuron-allocation", context=ctx, options=options).run()
    assert (result.status, result.condition) == (CheckStatus.OK, None)
    assert value(result, "neuron_allocatable_devices_max") == largest
    assert value(result, "neuron_allocation_devices_total") == total


def test_allocation_check_exports_free_torus_groups_and_is_quiet_without_devices(tmp_path: Path) -> None:
    make_host(tmp_path, [i for i in range(16) if i != 3])
    check = topology.NeuronAllocationCheck(name="neuron-allocation", context=context(tmp_path), options={})
    (result,) = check.run()
    assert {v.labels["size"]: v.value for v in result.values if v.name == "neuron_allocatable_groups"} == {
        "1": 15,
        "4": 3,
        "8": 1,
        "16": 0,
    }
    empty = tmp_path / "empty"
    make_host(empty, [])
    ctx = context(empty, instance_type=None)
    (result,) = topology.NeuronAllocationCheck(name="neuron-allocation", context=ctx, options={}).run()
    assert (result.status, result.reason, result.values) == (CheckStatus.OK, "NoNeuronDevices", ())


# --- UltraServer ---------------------------------------------------------------------------------------

P = "neuron.amazonaws.com/ultraserver-"
FULL = {
    P + "mode": "1_2_4",
    P + "server-id-2": "u5wy80u0o2saugxy",
    P + "node-id-2": "1",
    P + "server-id-4": "abcd1234efgh5678",
    P + "node-id-4": "3",
}


def without(labels: dict[str, str], *keys: str) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k not in {P + key for key in keys}}


@pytest.mark.parametrize(
    "labels, problems",
    [
        (FULL, []),
        ({P + "mode": "1"}, []),
        ({P + "mode": "1_4", P + "server-id-4": "abcd", P + "node-id-4": "0"}, []),
        ({}, ["no neuron.amazonaws.com/ultraserver-* label"]),
        (without(FULL, "mode"), ["ultraserver-mode label missing"]),
        ({**FULL, P + "mode": "1_3"}, ["is not a list of 1, 2 and 4"]),
        (without(FULL, "server-id-4"), ["server-id-4 missing"]),
        (without(FULL, "node-id-2"), ["node-id-2 missing"]),
        ({**FULL, P + "node-id-2": "2"}, ["node-id-2='2' is not in 0..1"]),
        ({**FULL, P + "node-id-4": "4"}, ["node-id-4='4' is not in 0..3"]),
        ({**FULL, P + "node-id-4": "x"}, ["node-id-4='x' is not in 0..3"]),
        ({**FULL, P + "mode": "1_2"}, ["4-node labels set but"]),
    ],
    ids=[
        "full",
        "single-node-mode",
        "four-only",
        "none",
        "mode-missing",
        "mode-bad",
        "server-id-4-missing",
        "node-id-2-missing",
        "node-id-2-range",
        "node-id-4-range",
        "node-id-4-not-number",
        "labels-beyond-mode",
    ],
)
def test_ultraserver_label_rules(labels: dict[str, str], problems: list[str]) -> None:
    verdict = ultraserver.judge_labels(labels)
    assert len(verdict.problems) == len(problems), verdict.problems
    for found, wanted in zip(verdict.problems, problems, strict=True):
        assert wanted in found


def ultraserver_check(ctx: CheckContext, **options: Any):
    return ultraserver.NeuronUltraServerCheck(name="neuron-ultraserver", context=ctx, options=options)


def write_attribute(root: Path, name: str, text: str) -> None:
    path = root / "sys" / "devices" / "virtual" / "neuron_device" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


@pytest.mark.parametrize(
    "instance_type, labels, attributes, status, reason",
    [
        ("trn1.32xlarge", FULL, {}, "OK", "NotUltraServer"),
        ("trn2.48xlarge", None, {}, "OK", "NotUltraServer"),
        (None, {"kubernetes.io/hostname": "n1"}, {}, "OK", "NotUltraServer"),
        (None, None, {}, "OK", "NotUltraServer"),
        ("trn2u.48xlarge", None, {}, "UNKNOWN", "NodeLabelsUnknown"),
        ("trn2u.48xlarge", FULL, {}, "OK", "NeuronUltraServerOk"),
        (None, FULL, {}, "OK", "NeuronUltraServerOk"),
        ("trn2u.48xlarge", {"kubernetes.io/hostname": "n1"}, {}, "PROBLEM", "NeuronUltraServerLabelsMissing"),
        ("trn2u.48xlarge", {**FULL, P + "node-id-4": "7"}, {}, "PROBLEM", "NeuronUltraServerLabelsInconsistent"),
        ("trn2u.48xlarge", FULL, {"ultraserver_server_id": "abcd1234efgh5678"}, "OK", "NeuronUltraServerOk"),
        ("trn2u.48xlarge", FULL, {"ultraserver_server_id": "ffff0000"}, "PROBLEM", "NeuronUltraServerMismatch"),
        ("trn2u.48xlarge", FULL, {"ultraserver_node_id": "2"}, "PROBLEM", "NeuronUltraServerMismatch"),
        ("trn2u.48xlarge", FULL, {"ultraserver_mode": "4"}, "OK", "NeuronUltraServerOk"),
        ("trn2u.48xlarge", FULL, {"ultraserver_server_id": "busy"}, "UNKNOWN", "NeuronUltraServerBusy"),
    ],
    ids=[
        "trn1",
        "trn2-not-u",
        "unknown-type-no-labels",
        "standalone-unknown-type",
        "trn2u-standalone",
        "trn2u-good",
        "labels-imply-ultraserver",
        "trn2u-no-labels",
        "trn2u-node-id-out-of-range",
        "sysfs-agrees",
        "sysfs-other-server",
        "sysfs-other-node",
        "sysfs-mode-offered",
        "sysfs-busy",
    ],
)
def test_ultraserver_check(
    tmp_path: Path,
    instance_type: str | None,
    labels: dict[str, str] | None,
    attributes: dict[str, str],
    status: str,
    reason: str,
) -> None:
    make_host(tmp_path, range(16))
    for name, text in attributes.items():
        write_attribute(tmp_path, name, text)
    (result,) = ultraserver_check(context(tmp_path, instance_type=instance_type, labels=labels)).run()
    assert (result.status.value, result.reason, result.condition) == (status, reason, "NeuronUltraServer")
    if result.status is CheckStatus.PROBLEM:
        assert result.severity is Severity.ERROR  # placement labels, not broken hardware


def test_ultraserver_values_carry_the_ultraserver_id(tmp_path: Path) -> None:
    make_host(tmp_path, [i for i in range(16) if i != 2])
    (result,) = ultraserver_check(context(tmp_path, instance_type="trn2u.48xlarge", labels=FULL)).run()
    labels4 = {"ultraserver_id": "abcd1234efgh5678", "nodes": "4", "node_id": "3"}
    assert value(result, "neuron_ultraserver_node", **labels4) == 1
    assert value(result, "neuron_ultraserver_devices", **labels4) == 15
    assert value(result, "neuron_ultraserver_devices", ultraserver_id="u5wy80u0o2saugxy", nodes="2") == 15
    assert "4-node abcd1234efgh5678 node 3" in result.message

    broken = {**FULL, P + "node-id-2": "5"}  # the 2-node labels are wrong; the 4-node membership still shows
    (result,) = ultraserver_check(context(tmp_path, instance_type="trn2u.48xlarge", labels=broken)).run()
    assert result.status is CheckStatus.PROBLEM
    assert value(result, "neuron_ultraserver_node", **labels4) == 0
    assert value(result, "neuron_ultraserver_devices", **labels4) == 15


def test_ultraserver_sysfs_comparison_can_be_turned_off(tmp_path: Path) -> None:
    make_host(tmp_path, range(16))
    write_attribute(tmp_path, "ultraserver_server_id", "ffff0000")
    ctx = context(tmp_path, instance_type="trn2u.48xlarge", labels=FULL)
    (result,) = ultraserver_check(ctx, compareSysfs=False).run()
    assert result.reason == "NeuronUltraServerOk"
