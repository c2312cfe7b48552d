"""Print-site coverage per subsystem (issue 38): every generator's pack is what its extract produces, and
the built-in rules speak for (or explicitly exclude, with a reason) at least 95 % of its error-level sites.

Each ``plugins/<pack>/generate_<subsystem>.py`` defines ``SPEC`` (a printsites.Spec), ``EXCLUSIONS``,
``EXTRACT`` and ``PACK`` (paths), ``DRIVER`` (the device name its dev_* prefixes render with) and
``generate(sites) -> str`` (the pack's text). The shared machinery is plugins/kernel/printsites.py.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from agent.app.config import load_rule_set
from agent.core.paths import builtin_plugins_dir
from bench.accuracy import rule_finder

PLUGINS = builtin_plugins_dir()
sys.path.insert(0, str(PLUGINS / "kernel"))
import printsites  # noqa: E402

sys.path.remove(str(PLUGINS / "kernel"))

GENERATORS = printsites.generators(PLUGINS)
MODULES = {path.stem.removeprefix("generate_"): printsites.load_generator(path) for path in GENERATORS}
RULES = load_rule_set([PLUGINS])
FINDS = rule_finder(RULES)
EACH = pytest.mark.parametrize("name", sorted(MODULES))


def _coverage(name: str) -> printsites.Coverage:
    gen = MODULES[name]
    sites = printsites.read_extract(Path(gen.EXTRACT).read_text())
    return printsites.coverage(
        gen.SPEC.name, sites, finds=FINDS, exclusions=gen.EXCLUSIONS, driver=getattr(gen, "DRIVER", "nvme")
    )


@EACH
def test_the_committed_pack_is_what_the_extract_generates(name: str) -> None:
    gen = MODULES[name]
    sites = printsites.read_extract(Path(gen.EXTRACT).read_text())
    assert Path(gen.PACK).read_text() == gen.generate(sites)


@EACH
def test_the_rules_cover_or_exclude_95_percent_of_the_error_level_sites(name: str) -> None:
    cov = _coverage(name)
    assert cov.sites > 0
    uncovered = [f"{s.where} {s.text}" for s in cov.uncovered]
    assert cov.share >= 0.95, f"{cov.subsystem}: {cov.share:.1%} covered or excluded; uncovered: {uncovered[:20]}"


@EACH
def test_no_rule_fires_on_a_site_excluded_as_benign(name: str) -> None:
    assert [f"{s.where} {s.text}" for s in _coverage(name).noisy] == []


def _benign_sites(name: str) -> list[printsites.Site]:
    gen = MODULES[name]
    sites = printsites.read_extract(Path(gen.EXTRACT).read_text())
    out = []
    for site in sites:
        rule = next((e for e in gen.EXCLUSIONS if e.matches(site)), None)
        if rule is not None and rule.benign:
            out.append(site)
    return out


def _caught(rule_set, site: printsites.Site, driver) -> list[str]:
    """What the agent reports for the site's rendered records read with their level (the catch-all's too)."""
    from agent.app.commands.simulate import simulate_lines

    lines = [
        f"{printsites.LEVELS.get(site.level, 3)},{i},0,-;{line}"
        for i, line in enumerate(printsites.render(site, driver=driver), 1)
    ]
    return [f["reason"] for f in simulate_lines(rule_set=rule_set, lines=iter(lines))]


@EACH
def test_a_site_excluded_as_benign_raises_no_catch_all_event(name: str) -> None:
    """A benign site (printed at error level on healthy machines, or context for the records after it) is
    known to the pack's quiet ``<family>/benign`` rule, so neither a rule nor the catch-all speaks for it;
    without that rule the catch-all raises KernelError Events for them (not for all: platform-noise.yaml
    knows some, as the Neuron driver's banner). A site with too little literal text for a pattern stays the
    catch-all's (at most one)."""
    gen = MODULES[name]
    driver = getattr(gen, "DRIVER", "nvme")
    family = gen.FAMILY.name
    benign = _benign_sites(name)
    patterned = [s for s in benign if printsites.site_pattern(s) is not None]
    assert ({r.name for r in RULES.rules} >= {f"{family}/benign"}) == bool(patterned)
    if not patterned:
        return
    without = dataclasses.replace(RULES, rules=tuple(r for r in RULES.rules if r.name != f"{family}/benign"))
    for site in patterned:
        assert _caught(RULES, site, driver) == [], f"{site.where} {site.text}"
    # The catch-all reads error level or worse: a pack whose benign sites print at warning (mm's allocation
    # failures) has its rule for the fallbacks alone.
    caught = [s for s in patterned if printsites.LEVELS.get(s.level, 4) <= printsites.LEVELS["err"]]
    assert not caught or any(r.startswith("KernelError_") for site in caught for r in _caught(without, site, driver))
    assert len(benign) - len(patterned) <= 1


def test_no_benign_rule_silences_a_site_another_rule_reports() -> None:
    """A quiet rule keeps every fallback off the lines it matches: a benign pattern as wide as another
    site's line would silence that site (a quiet rule for every exclusion, tried, took fs to 59 %)."""
    without = dataclasses.replace(RULES, rules=tuple(r for r in RULES.rules if not r.name.endswith("/benign")))
    finds_without = rule_finder(without)
    for name, gen in sorted(MODULES.items()):
        sites = printsites.read_extract(Path(gen.EXTRACT).read_text())
        driver = getattr(gen, "DRIVER", "nvme")
        lost = [
            s
            for s in sites
            if finds_without(printsites.render(s, driver=driver)) and not FINDS(printsites.render(s, driver=driver))
        ]
        assert [f"{s.where} {s.text}" for s in lost] == [], name


def _findings(lines: list[str]) -> list[str]:
    from agent.detectors.rules import RuleEngine

    engine = RuleEngine(rule_set=RULES)
    return [f.rule for f in engine.feed(list(lines), times=0.0, line_numbers=list(range(1, len(lines) + 1)))]


@EACH
def test_no_site_is_reported_twice(name: str) -> None:
    """A generated rule and another pack's rule (or two generated rules) on one line, or a multi-record
    print giving a finding per record, would report one event twice. (Two hand-written rules on one
    line, as kernel/panic and kernel/mce-fatal on a machine-check panic, are those packs' own choice.)"""
    gen = MODULES[name]
    sites = printsites.read_extract(Path(gen.EXTRACT).read_text())
    twice = []
    for site in sites:
        got = _findings(printsites.render(site, driver=getattr(gen, "DRIVER", "nvme")))
        if len(got) > 1 and any(rule.startswith(gen.FAMILY.name + "/") for rule in got):
            twice.append(f"{site.where} {site.text}: {got}")
    assert twice == []


@EACH
def test_every_exclusion_names_a_reason_and_excludes_something(name: str) -> None:
    gen = MODULES[name]
    sites = printsites.read_extract(Path(gen.EXTRACT).read_text())
    for exclusion in gen.EXCLUSIONS:
        assert exclusion.reason.strip(), exclusion
        assert any(exclusion.matches(s) for s in sites), f"stale exclusion: {exclusion.pattern!r}"


TABLE = [
    ("%d", "3"),
    ("%#010x", "0x0000001f"),
    ("%04x:%02x:%02x.%x", "001f:1f:1f.1f"),
    ("%-5s|", "x    |"),
    ("%s: %pV", "x: request failed"),
    ("%pI4", "10.0.0.1"),
    ("{FW_BUG}", "X"),
]


@pytest.mark.parametrize(("fmt", "line"), TABLE)
def test_a_site_renders_as_the_kernel_would_print_it(fmt: str, line: str) -> None:
    site = printsites.Site(level="err", where="a.c:1", call="pr_err", text=fmt, prefix="pr")
    assert printsites.render(site) == [line]


def test_dev_prints_carry_the_driver_and_device() -> None:
    site = printsites.Site(level="err", where="a.c:1", call="dev_err", text="timeout\\n", prefix="dev")
    assert printsites.render(site, driver="nvme") == ["nvme 0000:3b:00.0: timeout"]


FUNC_TABLE = [
    ('"%s failed with error code %d\\n", __func__, ret', "nvme_rdma_post_send failed with error code %d\\n"),
    ('"%s: %s\\n", __FUNCTION__, msg', "nvme_rdma_post_send: %s\\n"),
    ('"%s: %s\\n", name, __func__', "%s: nvme_rdma_post_send\\n"),
    ('"%*s %s\\n", 4, pad, __func__', "%*s nvme_rdma_post_send\\n"),  # a * width takes an argument
    ('"%.*s %s\\n", 4, buf, __func__', "%.*s nvme_rdma_post_send\\n"),  # so does a * precision
    ('"100%% %s\\n", __func__', "100%% nvme_rdma_post_send\\n"),  # %% takes none
    ('"%d %s\\n", __func__, x', "%d %s\\n"),  # only a %s prints the name
]


@pytest.mark.parametrize(("call", "text"), FUNC_TABLE)
def test_a_conversion_whose_argument_is_the_function_is_its_name(tmp_path: Path, call: str, text: str) -> None:
    (tmp_path / "x.c").write_text(f"static int nvme_rdma_post_send(int ret)\n{{\n    pr_err({call});\n}}\n")
    (site,) = printsites.extract(tmp_path, printsites.Spec(name="t", paths=["*.c"]))
    assert site.text == text


@pytest.mark.parametrize(
    ("define", "level"),
    [
        # drivers/scsi/scsi_scan.c: the level in the macro, the message continued over two lines
        ('#define MSG\tKERN_ERR "%s: Allocation failure during" \\\n\t" SCSI scanning\\n"\n', "err"),
        ('#define MSG KERN_CRIT "%s: Allocation failure during SCSI scanning\\n"\n', "crit"),
        ('#define MSG "%s: Allocation failure during SCSI scanning\\n"\n', None),  # printk's default: not a site
        ('#define MSG KERN_INFO "%s: Allocation failure during SCSI scanning\\n"\n', None),
    ],
)
def test_a_message_macro_brings_its_level(tmp_path: Path, define: str, level: str | None) -> None:
    (tmp_path / "x.c").write_text(define + "static void scsi_alloc_sdev(void)\n{\n    printk(MSG, __func__);\n}\n")
    got = [(s.level, s.text) for s in printsites.extract(tmp_path, printsites.Spec(name="t", paths=["*.c"]))]
    assert got == ([(level, "scsi_alloc_sdev: Allocation failure during SCSI scanning\\n")] if level else [])


def test_the_scanner_finds_levels_prefixes_and_macros(tmp_path: Path) -> None:
    (tmp_path / "x.c").write_text(
        '#define pr_fmt(fmt) "DMAR: " fmt\n'
        '#define PFX "dmar-x "\n'
        "static void f(void) {\n"
        '    pr_err("fault %d\\n", 3);\n'
        '    printk(KERN_CRIT PFX "gone\\n");\n'
        '    printk(KERN_INFO "fine\\n");\n'
        '    dev_err(dev, FW_BUG "bad table %s\\n",\n'
        "            name);\n"
        '    pr_info("fine\\n");\n'
        "}\n"
    )
    spec = printsites.Spec(name="t", paths=["*.c"])
    got = [(s.level, s.where, s.call, s.text) for s in printsites.extract(tmp_path, spec)]
    assert got == [
        ("err", "x.c:4", "pr_err", "DMAR: fault %d\\n"),
        ("crit", "x.c:5", "printk", "DMAR: dmar-x gone\\n"),
        ("err", "x.c:7", "dev_err", "[Firmware Bug]: bad table %s\\n"),
    ]
    assert printsites.read_extract(printsites.write_extract(spec, "test", printsites.extract(tmp_path, spec))) == (
        printsites.extract(tmp_path, spec)
    )
