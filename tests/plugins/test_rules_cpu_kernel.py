"""Issue 18's CPU/kernel rules (kernel-monitor.yaml: RCU kthread starvation, the OOM killer's header)
and the silent neighbours of the issue's storage and NIC rules, from the kernel's format strings.

Each line is rendered with the kernel's printf (tests/kprintf.py) in the wordings of the versions
the rules' provenance names, and must give exactly its finding through both matchers; the lines
around them that the kernel prints as context or at an informational level give none.
"""

from __future__ import annotations

from typing import Any

import pytest

from agent.app.config import load_rule_set
from agent.core.paths import builtin_plugins_dir
from agent.detectors.rules import ReferenceEngine, RuleEngine

from helpers.kprintf import kprintf

pytestmark = pytest.mark.slow  # the exhaustive rule table: thousands of cases

RULE_SET = load_rule_set([builtin_plugins_dir()])
ENGINES = pytest.mark.parametrize("engine_cls", [RuleEngine, ReferenceEngine], ids=["fast", "reference"])

RCU = "kernel/rcu-kthread-starved", "RCUKthreadStarved"
OOM = "kernel/oom-invoked", "OOMKillerInvoked"

# (format, values, (rule, reason), fields)
TABLE: list[tuple[str, tuple[Any, ...], tuple[str, str], dict[str, str]]] = [
    (
        "rcu: %s kthread starved for %ld jiffies! g%ld f%#x %s(%d) ->state=%#x ->cpu=%d\n",
        ("rcu_sched", 15002, 1914781, 0, "RCU_GP_WAIT_FQS", 5, 0x402, 3),
        RCU,
        {"kthread": "rcu_sched", "jiffies": "15002"},
    ),
    (
        "rcu: %s kthread starved for %ld jiffies! g%ld f%#x %s(%d) ->state=%#lx ->cpu=%d\n",
        ("rcu_preempt", 0, -1127, 0x1, "RCU_GP_DOING_FQS", 6, 0, -1),
        RCU,
        {"kthread": "rcu_preempt", "jiffies": "0"},
    ),
    (
        "%s kthread starved for %ld jiffies! g%lu c%lu f%#x %s(%d) ->state=%#lx\n",
        ("rcu_sched", 107693, 4294967007, 4294967006, 0, "RCU_GP_WAIT_FQS", 3, 0x1),
        RCU,
        {"kthread": "rcu_sched"},
    ),
    ("%s kthread starved for %ld jiffies!\n", ("rcu_bh", 2147483647), RCU, {"jiffies": "2147483647"}),
    ("rcu: %s kthread starved for %ld jiffies\n", ("rcuc/3", 2501), RCU, {"kthread": "rcuc/3"}),
    (
        "rcu: %s kthread timer wakeup didn't happen for %ld jiffies! g%ld f%#x %s(%d) ->state=%#x\n",
        ("rcu_sched", 1518, -1055, 0, "RCU_GP_WAIT_FQS", 5, 0x402),
        RCU,
        {"kthread": "rcu_sched", "jiffies": "1518"},
    ),
    (
        "%s invoked oom-killer: gfp_mask=%#x(%s), order=%d, oom_score_adj=%hd\n",
        ("python3", 0x140CCA, "GFP_HIGHUSER_MOVABLE|__GFP_COMP", 0, 999),
        OOM,
        {"comm": "python3", "gfp_mask": "0x140cca"},
    ),
    (
        "%s invoked oom-killer: gfp_mask=%#x(%s), nodemask=%s, order=%d, oom_score_adj=%hd\n",
        ("kworker/u8:2 (flush)", 0x6200CA, "GFP_HIGHUSER_MOVABLE", "(null)", 0, -1000),
        OOM,
        {"comm": "kworker/u8:2 (flush)"},
    ),
    ("%s invoked oom-killer: gfp_mask=0x%x, order=%d, oom_score_adj=%hd\n", ("", 0x201DA, 0, 0), OOM, {}),
    (
        "%s invoked oom-killer: gfp_mask=0x%x, order=%d, oom_adj=%d, oom_score_adj=%d\n",
        ("java", 0x280DA, 0, 0, 0),
        OOM,
        {"comm": "java"},
    ),
]


@ENGINES
@pytest.mark.parametrize(("fmt", "values", "want", "fields"), TABLE, ids=[t[2][1] + "-" + t[0][:30] for t in TABLE])
def test_rendered_line_gives_its_finding(engine_cls, fmt, values, want, fields):
    line = kprintf(fmt, *values).strip()
    findings = engine_cls(rule_set=RULE_SET).feed([line])
    assert [(f.rule, f.reason) for f in findings] == [want], line
    for name, value in fields.items():
        assert findings[0].fields.get(name) == value, (name, dict(findings[0].fields))


SILENT = [
    # context lines of the reports above, and the kernel's informational prints beside them
    kprintf("rcu: \tUnless %s kthread gets sufficient CPU time, OOM is now expected behavior.\n", "rcu_sched"),
    "rcu: RCU grace-period kthread stack dump:",
    kprintf("rcu: \tPossible timer handling issue on cpu=%d timer-softirq=%u\n", 0, 1623),
    "Mem-Info:",
    # SCSI sense keys that are not a failing device (drivers/scsi/constants.c snstext[])
    *[
        kprintf("sd 0:0:0:0: [sda] tag#0 Sense Key : %s [%s]%s\n", key, "current", "")
        for key in ["No Sense", "Recovered Error", "Not Ready", "Illegal Request", "Unit Attention", "Data Protect"]
    ],
    "sd 3:0:0:0: [sdb] tag#3 Add. Sense: Power on, reset, or bus device reset occurred",
    "sd 3:0:0:0: [sdb] tag#3 CDB: Write(10) 2a 00 00 00 14 88 00 00 08 00",
    # rate limiting of sources that are not I/O errors
    kprintf("%s: %d callbacks suppressed\n", "net_ratelimit", 5),
    kprintf("%s: %d callbacks suppressed\n", "mce_notify_irq", 1),
    # the NIC drivers' normal lines
    "ena 0000:00:05.0: Device reset completed successfully, Driver info: Elastic Network Adapter (ENA) v2.4.0g",
    "ena 0000:00:05.0: ENA device version: 0.10",
    "mlx5_core 0000:03:00.0: firmware version: 14.32.1010",
    "mlx5_core 0000:41:00.0: E-Switch: cleanup",
    "pci 0000:04:00.0: BAR 7: failed to assign [mem size 0x01000000 64bit pref]",
]


@ENGINES
@pytest.mark.parametrize("line", SILENT)
def test_context_and_informational_lines_stay_silent(engine_cls, line):
    assert engine_cls(rule_set=RULE_SET).feed([line.strip()]) == []
