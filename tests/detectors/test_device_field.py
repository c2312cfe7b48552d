"""A rule's ``device`` field: validated with file, field and line; it names the device of each finding."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from agent.app.config import load_rule_set
from agent.core.devices import DeviceKind
from agent.core.errors import ConfigError
from agent.detectors.rules import ReferenceEngine, RuleEngine

HEAD = """
conditions:
  - {type: Gpu, reason: GpuIsFine, message: ok}
rules:
  - name: mine/xid
    type: permanent
    condition: Gpu
    reason: GpuXid
    pattern: 'Xid \\(PCI:(?P<pci>[0-9a-zA-Z:.]+)\\): (?P<xid>\\d+)'
"""


def load(tmp_path: Path, device: str) -> object:
    path = tmp_path / "mine.yaml"
    path.write_text(textwrap.dedent(HEAD).lstrip("\n") + f"    device: {device}\n", encoding="utf-8")
    return load_rule_set([path])


@pytest.mark.parametrize(
    ("device", "field", "message"),
    [
        ("gpu", "rules[0].device", "must be a mapping {kind: gpu|neuron|rdma"),
        ("{kind: tpu, field: pci}", "rules[0].device.kind", "one of gpu, neuron, rdma, got 'tpu'"),
        ("{field: pci}", "rules[0].device.kind", "required: one of gpu, neuron, rdma"),
        ("{kind: gpu}", "rules[0].device.field", "required: the field"),
        ("{kind: gpu, field: []}", "rules[0].device.field", "required: the field"),
        ("{kind: gpu, field: bdf}", "rules[0].device.field", "unknown field 'bdf'"),
        ("{kind: gpu, field: [pci, bdf]}", "rules[0].device.field", "unknown field 'bdf'"),
        ("{kind: gpu, field: pci, by: x}", "rules[0].device.by", "unknown key 'by'"),
    ],
)
def test_bad_device_field(tmp_path: Path, device: str, field: str, message: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        load(tmp_path, device)
    problems = [(p.field, p.line, p.message) for p in excinfo.value.problems]
    assert [(f, line) for f, line, _ in problems] == [(field, 9)]
    assert message in problems[0][2]
    assert str(excinfo.value.problems[0]).startswith(f"{tmp_path / 'mine.yaml'}:9")


@pytest.mark.parametrize("engine_cls", [RuleEngine, ReferenceEngine], ids=["fast", "reference"])
def test_device_field_names_the_finding_device(tmp_path: Path, engine_cls: type) -> None:
    rule_set = load(tmp_path, "{kind: gpu, field: pci}")
    rule = rule_set.rules[0]
    assert rule.device is not None and rule.device.kind is DeviceKind.GPU and rule.device.fields == ("pci",)
    (finding,) = engine_cls(rule_set=rule_set).feed(["Xid (PCI:0000:3B:00): 79"], times=1.0)
    assert finding.device is not None and finding.device.key == "gpu:0000:3b:00.0"
    (finding,) = engine_cls(rule_set=rule_set).feed(["Xid (PCI:zz): 79"], times=1.0)
    assert finding.device is None  # not an address: the finding stays node-scoped
