"""Networking core print sites (issue 38): the pack sites-net.yaml from plugins/kernel/sites/net.tsv.

    python plugins/kernel/generate_net.py extract \\
        /work/src/linux-source-6.1 /work/src/linux-source-5.10 > plugins/kernel/sites/net.tsv
    python plugins/kernel/generate_net.py generate plugins/kernel/sites/net.tsv > plugins/kernel/sites-net.yaml

Every error-level print of the networking a Kubernetes accelerator host runs on (the device core of
net/core, the qdisc core and its transmit watchdog, IPv4 and IPv6, netlink, packet and unix sockets,
ethtool netlink, conntrack's core, bonding, bridge, VLAN, and the virtual devices CNIs build pods on:
veth, vxlan, geneve, macvlan, tun) that another pack's specific rules do not already speak for is a
warning Event ``NetworkError``: a NAPI poll that overran its budget, a protocol that failed to register,
a dead loop on a virtual device, a bond that could not set a slave's MAC. The print does not say what it
costs the node, so it sets no condition.

Two prints the issue names are below error level and are added to the extract as explicit extra sites
(``EXTRA_SITES``): conntrack's "nf_conntrack: table full, dropping packet" (net_warn_ratelimited, warning)
and the neighbour table's "neighbor table overflow!" (net_info_ratelimited, info). Both drop traffic: a
node whose conntrack or ARP/ND table is full loses connections.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path

import printsites
from printsites import Call, Exclusion, Family, Spec

HERE = Path(__file__).resolve().parent
EXTRACT = HERE / "sites" / "net.tsv"
PACK = HERE / "sites-net.yaml"
# KBUILD_MODNAME of the files whose pr_fmt uses it (the module's name, or a built-in object's), and
# the name the device prefixes render with elsewhere.
DRIVER = {
    "drivers/net/bonding/*": "bonding",
    "drivers/net/tun.c": "tun",
    "drivers/net/vxlan/*": "vxlan",
    "drivers/net/geneve.c": "geneve",
    "net/8021q/*": "8021q",
    "net/core/drop_monitor.c": "drop_monitor",
    "net/core/neighbour.c": "neighbour",
    "net/core/netpoll.c": "netpoll",
    "net/core/pktgen.c": "pktgen",
    "net/core/skbuff.c": "skbuff",
    "net/core/sock.c": "sock",
    "net/ipv4/gre_demux.c": "gre",
    "net/ipv6/ip6_tunnel.c": "ip6_tunnel",
    "net/netfilter/nf_conntrack_core.c": "nf_conntrack",
    "net/packet/*": "af_packet",
    "net/unix/*": "unix",
    "*": "virtio_net",
}


def _levels(base: str, fmt_arg: int, prefix: str, head: str = "") -> dict[str, Call]:
    return {
        f"{base}_{level}{suffix}": Call(level=level, fmt_arg=fmt_arg, prefix=prefix, head=head)
        for level in ("err", "crit", "alert", "emerg")
        for suffix in ("", "_ratelimited", "_once")
    }


SPEC = Spec(
    name="net",
    paths=[
        "net/core/*.c",
        "net/sched/sch_generic.c",
        "net/sched/sch_api.c",
        "net/sched/cls_api.c",
        "net/ipv4/*.c",
        "net/ipv6/*.c",
        "net/netlink/*.c",
        "net/packet/*.c",
        "net/unix/*.c",
        "net/ethtool/*.c",
        "net/netfilter/nf_conntrack_core.c",
        "net/bridge/*.c",
        "net/8021q/*.c",
        "drivers/net/bonding/*.c",
        "drivers/net/veth.c",
        "drivers/net/vxlan/*.c",
        "drivers/net/geneve.c",
        "drivers/net/macvlan.c",
        "drivers/net/tun.c",
    ],
    # KBUILD_MODNAME of the files whose pr_fmt prints it, from their Makefiles: a module's name
    # (drivers/net/bonding/Makefile: bonding.o; net/unix: unix.o; net/ipv4: gre-y := gre_demux.o), else,
    # for an object built in (net/core's netpoll, sock, skbuff, neighbour), the object's own name.
    modules={
        "drivers/net/bonding/*": "bonding",
        "drivers/net/tun.c": "tun",
        "net/8021q/*": "8021q",
        "net/ipv4/gre_demux.c": "gre",
        "net/ipv6/ip6_tunnel.c": "ip6_tunnel",
        "net/netfilter/nf_conntrack_core.c": "nf_conntrack",
        "net/packet/af_packet.c": "af_packet",
        "net/unix/*": "unix",
        **{f"net/core/{name}.c": name for name in ("drop_monitor", "neighbour", "netpoll", "pktgen", "skbuff", "sock")},
    },
    calls={
        # include/linux/net.h: net_err_ratelimited(fmt, ...) is pr_err behind net_ratelimit(), and so on.
        **{
            f"net_{level}_ratelimited": Call(level=level, fmt_arg=0, prefix="pr")
            for level in ("err", "crit", "alert", "emerg")
        },
        # include/linux/netdevice.h: netif_err(priv, type, dev, fmt, ...) is netdev_err(dev, fmt, ...).
        **_levels("netif", 3, "netdev"),
        # include/net/bonding.h: slave_err(bond_dev, slave_dev, fmt, ...) is netdev_err(bond_dev, "(slave %s): " fmt, ...).  # noqa: E501
        **_levels("slave", 2, "netdev", head="(slave %s): "),
        # drivers/net/bonding/bond_main.c: without an extack, BOND_NL_ERR/SLAVE_NL_ERR print the message.
        "BOND_NL_ERR": Call(level="err", fmt_arg=2, prefix="netdev", head="Error: "),
        "SLAVE_NL_ERR": Call(level="err", fmt_arg=3, prefix="netdev", head="(slave %s): Error: "),
        # net/core/netpoll.c: np_err(np, fmt, ...) is pr_err("%s: " fmt, np->name, ...).
        "np_err": Call(level="err", fmt_arg=1, prefix="pr", head="%s: "),
        # include/linux/netdevice.h: netdev_WARN(dev, fmt, ...) is WARN(1, "netdevice: %s%s: " fmt, ...).
        "netdev_WARN": Call(level="warn", fmt_arg=1, prefix="none", head="netdevice: %s%s: "),
        "netdev_WARN_ONCE": Call(level="warn", fmt_arg=1, prefix="none", head="netdevice: %s%s: "),
    },
)

# Below error level, yet named by the issue: (file, the print's text), extracted at their own level.
EXTRA_SITES: list[tuple[str, str]] = [
    ("net/netfilter/nf_conntrack_core.c", r"nf_conntrack: table full, dropping packet"),
    ("net/core/neighbour.c", r"neighbor table overflow!"),
]
_EXTRA_SPEC = Spec(
    name="net",
    paths=sorted({path for path, _ in EXTRA_SITES}),
    calls={
        "net_warn_ratelimited": Call(level="warning", fmt_arg=0, prefix="pr"),
        "net_info_ratelimited": Call(level="info", fmt_arg=0, prefix="pr"),
    },
    levels=frozenset({"warning", "info"}),
    modules=SPEC.modules,
)

FAMILY = Family(name="net", reason="NetworkError")

_BOND_OPTIONS = r"^drivers/net/bonding/bond_(options|sysfs)\.c:"

# Sites no rule of this pack speaks for, and why. A multi-record report is one finding: its first record's.
EXCLUSIONS: list[Exclusion] = [
    # The bodies of print wrappers the scanner reads as sites; their call sites are listed through the
    # wrapper (SPEC.calls), each with its own message.
    Exclusion(
        pattern=r"^(\(slave %s\): )?Error: %s\\n$",
        where=r"^drivers/net/bonding/bond_main\.c:",
        reason="the body of the BOND_NL_ERR/SLAVE_NL_ERR wrapper (its call sites are listed with their messages)",
    ),
    Exclusion(
        pattern=r"^netpoll: %s: \{fmt\}$",
        where=r"^net/core/netpoll\.c:",
        reason="the body of the np_err wrapper (its call sites are listed with their messages)",
    ),
    # An extack message printed as it is ("%s\n", "%s: %s\n"): no literal text of the site's own; the
    # message is the answer to the request that failed (an MTU change, a nexthop, a bridge port flag).
    Exclusion(
        pattern=r"^(%s: )?%s\\n$",
        reason="an extack message printed verbatim: no literal text to tell the line apart",
    ),
    # bond_options.c, bond_sysfs.c: the bond refusing an option or a bonding_masters write (sysfs,
    # netlink, module parameter); the writer gets the error. Network managers print these on healthy
    # hosts when they apply options in their own order ("unable to set because the bond device is up").
    Exclusion(
        pattern=r"",
        where=_BOND_OPTIONS,
        reason="the bond refusing an option write (the writer gets the error): configuration, not the node",
        benign=True,
    ),
    # Answers to a user program's request, refused with an error to it.
    Exclusion(
        pattern=r"^(af_packet: )?(tpacket_rcv: packet too big, clamped|Packet exceed the number of skb frags"
        r"|packet size is too long \(|packet_mmap: vma is busy)",
        where=r"^net/packet/af_packet\.c:",
        reason="af_packet answering a capture or raw-send program's request it cannot serve (the program's ring or frame)",  # noqa: E501
        benign=True,
    ),
    Exclusion(
        pattern=r"^sock: sock_timestamping_bind_phc: sock not bind to device",
        where=r"^net/core/sock\.c:",
        reason="SO_TIMESTAMPING's PHC binding asked on a socket bound to no device (the caller gets -EOPNOTSUPP)",
        benign=True,
    ),
    Exclusion(
        pattern=r"^Only offline tests are supported",
        where=r"^net/core/selftests\.c:",
        reason="the answer to an online ethtool self-test request (ethtool -t ... online)",
        benign=True,
    ),
    Exclusion(
        pattern=r"^ip_local_port_range: prefer different parity",
        where=r"^net/ipv4/sysctl_net_ipv4\.c:",
        reason="advice on an accepted ip_local_port_range write (the write took effect)",
        benign=True,
    ),
    # ipconfig.c: DHCP/BOOTP replies for other hosts, and fragmented ones, on a shared boot network.
    Exclusion(
        pattern=r"^DHCP/BOOTP: (Reply not for us|Ignoring fragmented reply)",
        where=r"^net/ipv4/ipconfig\.c:",
        reason="kernel IP autoconfiguration skipping a DHCP reply meant for another host",
        benign=True,
    ),
    # netif_napi_add_weight(): a driver registering NAPI with a weight above 64 (once per boot).
    Exclusion(
        pattern=r"^netif_napi_add_weight\(\) called with weight %d",
        where=r"^net/core/dev\.c:",
        reason="a driver's NAPI weight above the default, noted once; the interface works",
        benign=True,
    ),
    # skb_panic(): the over/under-panic record comes right before BUG(); the "kernel BUG at
    # net/core/skbuff.c" / "invalid opcode" oops that follows is the report's finding (kernel/oops).
    Exclusion(
        pattern=r"^skbuff: %s: text:%px len:%d put:%d",
        where=r"^net/core/skbuff\.c:",
        reason="the record skb_panic() prints before BUG(): the oops that follows is the finding",
    ),
    # bond_xmit_get_slave()/__bond_start_xmit(): a bond mode outside the known ones (the mode is checked
    # when it is set: unreachable). The words are also WARN_ONCE's message in bond_xmit_get_slave(), whose
    # "WARNING: CPU:" header kernel/warning reports: a rule on them would report that WARN twice.
    Exclusion(
        pattern=r"^Unknown bonding mode %d\\n$",
        where=r"^drivers/net/bonding/bond_main\.c:",
        reason="an unreachable bond mode; its words are a WARN_ONCE message kernel/warning reports",
    ),
    # pktgen is a packet generator an operator loads by hand to test a link; its errors are the test's.
    Exclusion(
        pattern=r"",
        where=r"^net/core/pktgen\.c:",
        reason="pktgen (a traffic generator loaded by hand for tests): its errors are the tester's",
    ),
]

# Sites another pack's rules already speak for: no rule here, so a line is reported once.
LEAVE: list[Exclusion] = [
    Exclusion(
        pattern=r"^unregister_netdevice: waiting for %s to become free",
        where=r"^net/core/dev\.c:",
        reason="kernel-monitor.yaml kernel/unregister-netdevice",
    ),
    Exclusion(
        pattern=r"^NETDEV WATCHDOG: CPU: %d: transmit queue %u timed out",
        where=r"^net/sched/sch_generic\.c:",
        reason="network.yaml kernel/netdev-tx-timeout-cpu (NICTransmitTimeout)",
    ),
]


def extract(root: Path) -> list[printsites.Site]:
    """The error-level sites of SPEC, then the EXTRA_SITES at their own level."""
    extra = [
        site
        for site in printsites.extract(root, _EXTRA_SPEC)
        if any(site.where.startswith(path + ":") and re.search(text, site.text) for path, text in EXTRA_SITES)
    ]
    return printsites.extract(root, SPEC) + extra


def generate(sites: list[printsites.Site]) -> str:
    return printsites.family_pack(
        family=FAMILY,
        sites=sites,
        exclusions=EXCLUSIONS,
        leave=LEAVE,
        generator="plugins/kernel/generate_net.py",
        extract_path="plugins/kernel/sites/net.tsv",
        header=[
            "Two sites are below error level, added by name (generate_net.py EXTRA_SITES): conntrack's table",
            "full (warning) and the neighbour table's overflow (info).",
        ],
    )


def main(argv: Sequence[str]) -> int:
    if len(argv) >= 2 and argv[0] == "extract":
        roots = [Path(a) for a in argv[1:]]
        sites = printsites.extract_releases(roots, extract)
        sys.stdout.write(printsites.write_extract(SPEC, " + ".join(r.name for r in roots), sites))
        return 0
    return printsites.main(argv, spec=SPEC, generate=generate)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
