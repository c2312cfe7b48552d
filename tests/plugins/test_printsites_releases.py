"""Print sites of more than one kernel release (issue 38): fleets run many releases and a message's words
move between them, so an extract takes the primary release's sites and then each older release's sites
that print otherwise. An older site the primary prints the same (the same text, from any helper, or a
pattern that finds a primary line) is left out, so no print gets two rules; a kept one is named
``path:line@release`` (an exclusion that names a primary line number does not claim it) and by the path
the primary release gives its directory."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from agent.core.paths import builtin_plugins_dir

sys.path.insert(0, str(builtin_plugins_dir() / "kernel"))
import printsites  # noqa: E402

sys.path.remove(str(builtin_plugins_dir() / "kernel"))

NEW = {
    "drivers/iommu/intel/dmar.c": [
        'pr_err("[%s NO_PASID] Request device [%02x:%02x.%d] fault addr 0x%llx [fault reason 0x%02x] %s\\n", a);',
        'pr_err("DRHD: handling fault status reg %x\\n", s);',
        'dev_err(dev, "Slab cache still has objects when called from %pS", f);',
    ],
    "fs/smb/client/connect.c": ['pr_err("CIFS: reconnect failed\\n");'],
}
OLD = {
    "drivers/iommu/intel/dmar.c": [
        'pr_err("[%s] Request device [%02x:%02x.%d] PASID %x fault addr %llx [fault reason %02d] %s\\n", a);',
        'printk(KERN_ERR "DRHD: handling fault status reg %x\\n", s);',  # the same text, another helper
        'pr_err("Slab cache still has objects\\n");',  # its pattern finds the newer line
    ],
    "fs/cifs/connect.c": ['pr_err("CIFS: reconnect timed out\\n");'],
}


def _tree(root: Path, files: dict[str, list[str]]) -> Path:
    for rel, calls in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        body = "\n".join(f"\t{c}" for c in calls)
        (root / rel).write_text(f"static void f(void)\n{{\n{body}\n}}\n")
    return root


def test_an_older_release_adds_only_the_prints_worded_otherwise(tmp_path: Path) -> None:
    new = _tree(tmp_path / "linux-6.1", NEW)
    old = _tree(tmp_path / "linux-5.10", OLD)
    spec = printsites.Spec(
        name="t",
        paths=["drivers/iommu/intel/*.c", "fs/smb/client/*.c", "fs/cifs/*.c"],
        renamed={"fs/cifs/": "fs/smb/client/"},
    )
    sites = printsites.extract_releases([new, old], lambda root: printsites.extract(root, spec))
    added = [(s.where, s.text) for s in sites if "@" in s.where]
    assert added == [
        (
            "drivers/iommu/intel/dmar.c:3@linux-5.10",
            "[%s] Request device [%02x:%02x.%d] PASID %x fault addr %llx [fault reason %02d] %s\\n",
        ),
        ("fs/smb/client/connect.c:3@linux-5.10", "CIFS: reconnect timed out\\n"),
    ]
    assert len(sites) == 4 + len(added)


def test_an_exclusion_naming_a_primary_line_does_not_claim_an_older_site() -> None:
    site = printsites.Site(level="err", where="drivers/ata/libata-eh.c:2392@linux-source-5.10", call="x", text="y")
    by_line = printsites.Exclusion(pattern="y", where=r"^drivers/ata/libata-eh\.c:(2[34]\d\d)$", reason="r")
    by_path = printsites.Exclusion(pattern="y", where=r"^drivers/ata/libata-eh\.c:", reason="r")
    assert (by_line.matches(site), by_path.matches(site)) == (False, True)


def test_a_prefix_older_releases_printed_otherwise_is_widened_in_the_rules() -> None:
    """fs: 6.1's cifs_dbg(VFS, ...) prints "CIFS: VFS: ", releases before 5.10 "CIFS VFS: " (the same sites):
    the family names the older form, and the rule of such a site finds both lines; others are unchanged."""
    sites = [
        printsites.Site(level="err", where=where, call=call, prefix="pr", text=text)
        for where, call, text in [
            (
                "fs/smb/client/connect.c:1821",
                "cifs_dbg",
                "CIFS: VFS: Error connecting to socket. Aborting operation.\\n",
            ),
            ("fs/smb/client/connect.c:99", "pr_err", "CIFS: reconnect timed out for a long while\\n"),
        ]
    ]
    family = printsites.Family(name="t", reason="R", older_prefixes={"CIFS: VFS: ": "CIFS:? VFS: "})
    pack = printsites.family_pack(family=family, sites=sites, exclusions=[], leave=[], generator="g", extract_path="e")
    (pattern,) = re.findall(r"^    pattern: '(.*)'$", pack, re.M)
    for line, found in [
        ("CIFS: VFS: Error connecting to socket. Aborting operation.", True),
        ("CIFS VFS: Error connecting to socket. Aborting operation.", True),
        ("CIFS: reconnect timed out for a long while", True),
        ("CIFS reconnect timed out for a long while", False),
    ]:
        assert (re.fullmatch(pattern, line) is not None) == found, line
