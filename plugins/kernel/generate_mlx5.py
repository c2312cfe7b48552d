"""mlx5 print sites (issue 38): the pack sites-mlx5.yaml from plugins/kernel/sites/mlx5.tsv.

    python plugins/kernel/generate_mlx5.py extract \\
        /work/src/linux-source-6.1 /work/src/linux-source-5.10 > plugins/kernel/sites/mlx5.tsv
    python plugins/kernel/generate_mlx5.py generate plugins/kernel/sites/mlx5.tsv > plugins/kernel/sites-mlx5.yaml

Every error-level print of the mlx5 driver (ConnectX NICs and DPUs: mlx5_core's core, Ethernet, E-Switch,
steering, LAG and FPGA code, and mlx5_ib, its RDMA side) that network.yaml's specific rules do not
already speak for is a warning Event ``MLX5Error``: the print says that one driver operation failed (a
command, a steering table, a queue, a probe step), not what that costs the node; the conditions
(MLX5HealthCompromised, MLX5FatalError, failed recovery) stay with network.yaml.

The driver prints through its own wrappers, which put the function, line and pid before the format
(mlx5_core.h: ``mlx5_core_err(dev, fmt)`` is ``dev_err(dev->device, "%s:%d:(pid %d): " fmt, __func__,
__LINE__, current->pid)``), so a line reads ``mlx5_core 0000:3b:00.0: mlx5_cmd_out_err:838:(pid 1234):
CREATE_MKEY(0x200) op_mod(0x0) failed, ...``. mlx5_ib_err prints on the IB device itself, whose
dev_driver_string is its class: ``infiniband mlx5_0: create_qp:3206:(pid 1234): Create QP type 2 failed``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import printsites
from printsites import Call, Exclusion, Family, Spec

HERE = Path(__file__).resolve().parent
EXTRACT = HERE / "sites" / "mlx5.tsv"
PACK = HERE / "sites-mlx5.yaml"
DRIVER = "mlx5_core"

_CORE = "drivers/net/ethernet/mellanox/mlx5/core"
_IB = "drivers/infiniband/hw/mlx5"
# What mlx5_core_err and the wrappers built on it print before the format: function, line, pid.
_WHERE = "%s:%d:(pid %d): "


def _core(head: str = "", fmt_arg: int = 1) -> Call:
    """A wrapper of mlx5_core_err (dev_err on the core device, "func:line:(pid N): " first)."""
    return Call(level="err", fmt_arg=fmt_arg, prefix="dev", head=_WHERE + head)


SPEC = Spec(
    name="mlx5",
    # The .c files, and the two headers with print sites outside macro definitions.
    paths=[f"{_CORE}/**/*.c", f"{_CORE}/mlx5_core.h", f"{_CORE}/en/txrx.h", f"{_IB}/*.c"],
    calls={
        "mlx5_core_err": _core(),
        "mlx5_core_err_rl": _core(),
        "fs_err": _core(),  # en/fs.h
        "mlx5dr_err": _core(),  # steering/dr_types.h
        "qos_err": _core("QoS: "),  # qos.h
        "mlx5_fpga_err": _core("FPGA: " + _WHERE),  # fpga/core.h adds its own function, line and pid
        "mlx5_fpga_warn_ratelimited": _core("FPGA: %s:%d: "),  # despite its name: mlx5_core_err_rl
        # mlx5_log(dev, level, fmt): the level is the firmware's severity of a health report (an
        # error unless the firmware says otherwise), listed as err.
        "mlx5_log": _core(fmt_arg=2),
        # dev_err on the IB device: "infiniband <ibdev>: " (dev_driver_string of a class device).
        "mlx5_ib_err": Call(level="err", fmt_arg=1, prefix="none", head="infiniband %s: " + _WHERE),
    },
)

FAMILY = Family(name="mlx5", reason="MLX5Error", device_prefix=r"mlx5_core(?:\.sf)? ")

_HEALTH = rf"^{_CORE}/health\.c:"


def _refusal(pattern: str, where: str, what: str) -> Exclusion:
    return Exclusion(
        pattern=pattern,
        where=where,
        reason=f"refuses a configuration the operator (or an application) asked for ({what}); the request "
        "fails with the error and nothing on the node is broken",
    )


# Sites no rule of this pack speaks for, and why. A multi-record report is one finding: its header's.
EXCLUSIONS: list[Exclusion] = [
    # --- records of a report whose header is the finding ---
    # print_health_info(): "Health issue observed, <syndrome>, severity(N) <LEVEL>:" (a rule here; the
    # unrecoverable form is network.yaml's kernel/mlx5-unrecoverable), then the health buffer a field a line.
    Exclusion(
        pattern=r"^%s:%d:\(pid %d\): (assert_|fw_ver|time|hw_id|rfr|severity|irisc_index|synd|ext_synd|raw fw_ver)",
        where=_HEALTH,
        reason="a field of the firmware health buffer that print_health_info prints after its 'Health issue "
        "observed' header (the report's finding)",
    ),
    Exclusion(
        pattern=r"^%s:%d:\(pid %d\): (start|end)\\n$",
        where=_HEALTH,
        reason="the start and end markers of mlx5_error_sw_reset, which runs only in the error state: the fatal "
        "error before it is the finding",
    ),
    Exclusion(
        pattern=r"^%s:%d:\(pid %d\): (vendor_err_synd|syndrome)=",
        where=rf"^{_CORE}/lib/aso\.c:",
        reason="a field of an ASO error CQE, printed after its 'Bad OP in ASOSQ CQE' header (the finding)",
    ),
    Exclusion(
        pattern=r"^(EQ 0x%x: Cons = |Recovered %d eqes on EQ )",
        where=rf"^{_CORE}/en/health\.c:",
        reason="a step of the EQ recovery that a TX timeout starts: the 'TX timeout detected' record is the finding",
    ),
    Exclusion(
        pattern=r"^%s\\n$",
        where=rf"^{_CORE}/en/health\.c:",
        reason="mlx5e_health_report prints the reporter's message, built by its caller: a TX timeout's finding "
        "is 'TX timeout detected', an error CQE's 'Error cqe on cqn'; an RX timeout at channel open has no "
        "other record and goes unreported (the format is '%s' alone)",
    ),
    Exclusion(
        pattern=r"^%s:%d:\(pid %d\): < %s \(%d\) > $",
        where=rf"^{_CORE}/steering/dr_action\.c:",
        reason="one action of the list dr_action_print_sequence prints after 'Invalid action ... sequence "
        "provided:' (the finding)",
    ),
    Exclusion(
        pattern=r"^Failed configuring rate limit\(err %d\): ",
        where=rf"^{_IB}/qp\.c:",
        reason="the QP's record of a rate-limit failure that mlx5_rl_add_rate (rl.c) already printed: rl.c's "
        "'Failed configuring rate limit' (or its refusal) is the finding; this literal also carries the "
        "source's indentation after a backslash-newline, which no pattern should depend on",
    ),
    # --- not a print site, or too little text ---
    Exclusion(
        pattern=r"^%s:%d:\(pid %d\): \{format\}$",
        where=rf"^{_CORE}/mlx5_core\.h:",
        reason="the body of the mlx5_core_err / mlx5_core_err_rl macro, not a site: its sites are its callers",
    ),
    # --- counted by another pack's rule ---
    Exclusion(
        pattern=r"op_mod\(0x%x\) failed, status %s\(0x%x\), syndrome \(0x%x\), err\(%d\)",
        where=rf"^{_CORE}/cmd\.c:",
        reason="network.yaml kernel/mlx5-command-failed (MLX5CommandFailed) counts these: an Event past 10 in "
        "10 minutes per device (one rejected command is a caller's bad request)",
    ),
    # --- printed on healthy machines ---
    Exclusion(
        pattern=r"^%s:%d:\(pid %d\): Command completion arrived after timeout",
        where=rf"^{_CORE}/cmd\.c:",
        reason="the late completion of a command whose timeout was already printed (network.yaml "
        "kernel/mlx5-command-leak for one that leaks; one that the EQ polling rescued printed 'recovered "
        "after timeout' at warning level): the command recovered, so this is no finding",
        benign=True,
    ),
    # ethtool -m (and monitoring agents that read module EEPROMs) on an empty cage, a passive copper cable
    # or a module without the page asked for: the firmware's MCIA status comes back as an error print.
    Exclusion(
        pattern=r"^%s:%d:\(pid %d\): (query_mcia_reg failed: status: |I2C address not recognized: )",
        where=rf"^{_CORE}/port\.c:",
        reason="a module EEPROM read (ethtool -m, a monitoring agent) that the module or empty cage cannot "
        "answer: healthy ports print it; a failing module reports a Port module event",
        benign=True,
    ),
    Exclusion(
        pattern=r"^mlx5e_get_module_\w+: (cable type not recognized:|mlx5_query_eeprom failed:"
        r"|mlx5_query_module_eeprom_by_page failed:)",
        where=rf"^{_CORE}/en_ethtool\.c:",
        reason="a module EEPROM read (ethtool -m, a monitoring agent) that the module or empty cage cannot "
        "answer: healthy ports print it; a failing module reports a Port module event",
        benign=True,
    ),
    # --- configuration refusals (ethtool, dcbnl, tc, devlink rate, MACsec, AF_XDP, PTP, verbs) ---
    _refusal(
        r"(cannot change the number of channels|56G link speed requires autoneg|Not supported link mode\(s\) "
        r"requested|Profile doesn't support enabling of CQE compression|cannot change the PTP state|"
        r"cannot set the TX-port-TS)",
        rf"^{_CORE}/en_ethtool\.c:",
        "ethtool -L, -s, -C, --set-priv-flags",
    ),
    _refusal(
        r"(Failed to validate ETS: |maxrate %llu Kbps exceeds limit|, priority( group)? is out of range|"
        r", ets is not supported)",
        rf"^{_CORE}/en_dcbnl\.c:",
        "DCB through dcbnl: lldpad, dcbtool, dcb",
    ),
    _refusal(
        r"^(Rate limiting is not supported on this device|TX rate %u, is not in range|Cannot activate MQPRIO|"
        r"Zero size for queue-group|Min tx rate is not supported|Discontinuous queues config|Num of queues "
        r"\(%d\) does not match|Active offloaded tc filters, can't turn|Active HTB offload, can't turn|"
        r"MTU %d is too big for an XSK)",
        rf"^{_CORE}/en_main\.c:",
        "a queue's maxrate, tc mqprio, ethtool -K, an MTU for an AF_XDP socket",
    ),
    _refusal(
        r"(Stop room %u is bigger than the SQ size|for XSK can't be activated|is too big for XSK|"
        r"MTU %u is too big for non-linear legacy RQ|XSK chunk size %u out of bounds|Legacy RQ linear mode "
        r"for XSK)",
        rf"^{_CORE}/en/(params|xsk/setup)\.c:",
        "ring sizes, an MTU, an AF_XDP socket's parameters",
    ),
    _refusal(
        r"(can't duplicate output to same device|can't duplicate encap action|Only UDP and TCP transport are "
        r"supported|Code and type matching only with ICMP|Matching on MPLS is supported only)",
        rf"^{_CORE}/(en_tc|en/tc_tun_encap|en/tc/act/mirred)\.c:",
        "a tc filter the hardware cannot offload",
    ),
    _refusal(
        r"(MACsec offload is supported only when|encrypt off isn't supported|already exists?\\n|doesn't exist\\n|"
        r"PN isn't supported|unable to create entry for RX SC|MACsec net_device already exist|only %d MACsec "
        r"offload devices can be set)",
        rf"^{_CORE}/en_accel/macsec\.c:",
        "ip macsec offload settings and SAs",
    ),
    _refusal(
        r"rate value %llu(Bps not in link speed units|Mbps exceed link maximum speed)",
        rf"^{_CORE}/esw/qos\.c:",
        "devlink rate or a VF's rate",
    ),
    _refusal(
        r"(Invalid rate: %u, should be|Max number of %u rates reached)",
        rf"^{_CORE}/rl\.c:",
        "a packet-pacing rate out of the device's range, or more distinct rates than its table holds",
    ),
    _refusal(
        r"(NPPS pulse duration %u is not in|NPPS period is lower than)",
        rf"^{_CORE}/lib/clock\.c:",
        "a PTP periodic output request",
    ),
    _refusal(
        r"Can't perform loopback test while device is down",
        rf"^{_CORE}/en_selftest\.c:",
        "ethtool -t on a device that is down",
    ),
    _refusal(
        r"^(sgid_index \(%u\) too large|Bad block size given|Bad signature type \(%d\) is given|Invalid status "
        r"check mask|signature status check requested on a non-signature)",
        rf"^{_IB}/(qp|wr|mr)\.c:",
        "an application's verbs call: a QP attribute, a signature work request, an MR status check",
    ),
]

# Sites another pack's rules already speak for: no rule here, so a line is reported once.
LEAVE: list[Exclusion] = [
    Exclusion(
        pattern=r"^%s:%d:\(pid %d\): (health recovery failed|health recovery flow aborted, PCI reads still not "
        r"working|Driver is in error state\. Unloading)",
        where=_HEALTH,
        reason="network.yaml kernel/mlx5-health-recovery-failed (MLX5HealthRecoveryFailed)",
    ),
    Exclusion(
        pattern=r"^%s:%d:\(pid %d\): Fatal error %u detected",
        where=_HEALTH,
        reason="network.yaml kernel/mlx5-fatal-error (MLX5FatalError)",
    ),
    Exclusion(
        pattern=r"^%s:%d:\(pid %d\): device's health compromised",
        where=_HEALTH,
        reason="network.yaml kernel/mlx5-health-compromised (MLX5HealthCompromised)",
    ),
    Exclusion(
        pattern=r"^%s:%d:\(pid %d\): (handle_hca_cap failed|mlx5_pci_init failed with error code|mlx5_init_one "
        r"failed with error code)",
        where=rf"^{_CORE}/main\.c:",
        reason="network.yaml kernel/mlx5-load-failed (MLX5LoadFailed)",
    ),
]


def generate(sites: list[printsites.Site]) -> str:
    return printsites.family_pack(
        family=FAMILY,
        sites=sites,
        exclusions=EXCLUSIONS,
        leave=LEAVE,
        generator="plugins/kernel/generate_mlx5.py",
        extract_path="plugins/kernel/sites/mlx5.tsv",
    )


if __name__ == "__main__":
    raise SystemExit(printsites.main(sys.argv[1:], spec=SPEC, generate=generate))
