"""The scanner reads the filesystem and device-mapper print wrappers (plugins/kernel/printsites.py Call):
a level given by a flag argument (cifs_dbg(VFS, ...)), and a head naming the file's string macro
(DM_MSG_PREFIX in DMERR's "device-mapper: <prefix>: ")."""

from __future__ import annotations

import sys
from pathlib import Path

from agent.core.paths import builtin_plugins_dir

sys.path.insert(0, str(builtin_plugins_dir() / "kernel"))
import printsites  # noqa: E402

sys.path.remove(str(builtin_plugins_dir() / "kernel"))


def _sites(tmp_path: Path, source: str, calls: dict[str, printsites.Call]) -> list[tuple[str, str, str]]:
    (tmp_path / "x.c").write_text(source)
    spec = printsites.Spec(name="t", paths=["*.c"], calls=calls)
    return [(s.level, s.where, s.text) for s in printsites.extract(tmp_path, spec)]


def test_a_flag_argument_gives_the_level_and_unlisted_flags_give_no_site(tmp_path: Path) -> None:
    cifs_dbg = printsites.Call(
        level=None, fmt_arg=1, prefix="pr", level_arg=0, head="VFS: ", level_names={"VFS": "err"}
    )
    source = (
        '#define pr_fmt(fmt) "CIFS: " fmt\n'
        'cifs_dbg(VFS, "reconnect failed rc=%d\\n", rc);\n'
        'cifs_dbg(FYI, "reconnecting\\n");\n'
        'cifs_dbg(VFS | ONCE, "bad lease\\n");\n'
    )
    assert _sites(tmp_path, source, {"cifs_dbg": cifs_dbg}) == [
        ("err", "x.c:2", "CIFS: VFS: reconnect failed rc=%d\\n"),
        ("err", "x.c:4", "CIFS: VFS: bad lease\\n"),
    ]


def test_a_head_names_the_files_string_macro(tmp_path: Path) -> None:
    dmerr = printsites.Call(level="err", fmt_arg=0, prefix="pr", head="device-mapper: {DM_MSG_PREFIX}: ")
    source = '#define DM_MSG_PREFIX "thin"\nDMERR("metadata operation failed: %d", r);\n'
    assert _sites(tmp_path, source, {"DMERR": dmerr}) == [
        ("err", "x.c:2", "device-mapper: thin: metadata operation failed: %d")
    ]


def test_a_head_without_the_macro_keeps_its_name(tmp_path: Path) -> None:
    dmerr = printsites.Call(level="err", fmt_arg=0, prefix="pr", head="device-mapper: {DM_MSG_PREFIX}: ")
    site = _sites(tmp_path, 'DMERR("log server not found");\n', {"DMERR": dmerr})
    assert site == [("err", "x.c:1", "device-mapper: {DM_MSG_PREFIX}: log server not found")]
    rendered = printsites.render(printsites.Site(level="err", where="x.c:1", call="DMERR", text=site[0][2]))
    assert rendered == ["device-mapper: X: log server not found"]
