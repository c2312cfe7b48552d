"""The scanner's handling of a subsystem's own print helpers and of built-in files (issue 38; the mm and
kernel core generators rely on each): a helper's definition is not a site, a name in a comment is not a
site, KBUILD_MODNAME is the file's name where a Spec says so, and a bare printk() carries no pr_fmt
where a Spec says so (the kernel applies pr_fmt in the pr_* macros only)."""

from __future__ import annotations

import sys
from pathlib import Path

from agent.core.paths import builtin_plugins_dir

sys.path.insert(0, str(builtin_plugins_dir() / "kernel"))
import printsites  # noqa: E402

sys.path.remove(str(builtin_plugins_dir() / "kernel"))

SOURCE = """\
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt
/* Explicitly disable this CPU's synchronous printk() before taking the lock. */
void warn_alloc(gfp_t gfp_mask, nodemask_t *nodemask, const char *fmt, ...)
{
	pr_warn("%s: %pV", current->comm, &vaf);
}
static void f(void)
{
	warn_alloc(gfp_mask, NULL, "page allocation failure: order:%u", order);
	pr_err("failed to start\\n");
	printk(KERN_EMERG "Thread overran stack\\n");
}
"""

WARN_ALLOC = printsites.Call(level="warning", fmt_arg=2, prefix="none", head="%s: ")


def _sites(tmp_path: Path, **spec: object) -> list[tuple[str, str, str, str]]:
    (tmp_path / "mm").mkdir()
    (tmp_path / "mm" / "zswap.c").write_text(SOURCE)
    levels = frozenset({"emerg", "alert", "crit", "err", "warn", "warning"})
    s = printsites.Spec(name="t", paths=["mm/*.c"], calls={"warn_alloc": WARN_ALLOC}, levels=levels, **spec)
    return [(x.level, x.where, x.call, x.text) for x in printsites.extract(tmp_path, s)]


def test_a_wrappers_definition_and_a_name_in_a_comment_are_not_sites(tmp_path: Path) -> None:
    got = _sites(tmp_path)
    assert [where for _, where, _, _ in got] == ["mm/zswap.c:9", "mm/zswap.c:10", "mm/zswap.c:11"]
    assert got[0] == ("warning", "mm/zswap.c:9", "warn_alloc", "%s: page allocation failure: order:%u")


def test_by_default_kbuild_modname_is_left_for_render_and_printk_takes_pr_fmt(tmp_path: Path) -> None:
    texts = [text for *_, text in _sites(tmp_path)]
    assert texts[1:] == ["{KBUILD_MODNAME}: failed to start\\n", "{KBUILD_MODNAME}: Thread overran stack\\n"]


def test_a_built_in_file_names_its_module_and_a_bare_printk_prints_no_pr_fmt(tmp_path: Path) -> None:
    texts = [text for *_, text in _sites(tmp_path, modname_from_file=True, printk_pr_fmt=False)]
    assert texts[1:] == ["zswap: failed to start\\n", "Thread overran stack\\n"]
