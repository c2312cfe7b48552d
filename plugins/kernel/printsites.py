"""Print sites of kernel subsystems: extract them from the source, render them, and count coverage (issue 38).

A rule pack that follows the lines its authors saw misses the next batch; one that follows the code that
prints the messages does not. For each subsystem an accelerator host depends on, a generator script
(``plugins/kernel/generate_<subsystem>.py``) uses this module to:

1. ``extract``: walk the subsystem's source files and list every error-level print site (``pr_err`` and its
   ``_ratelimited``/``_once`` forms, ``dev_err``, ``netdev_err``, ``pci_err``, ``printk(KERN_ERR ...)``,
   ``pr_crit``/``pr_alert``/``pr_emerg`` and their device forms, ``WARN``/``WARN_ONCE``, ``panic``, and the
   subsystem's own wrappers, given per subsystem), with its level, place and format string as written, the
   file's ``pr_fmt``/``dev_fmt`` prefix applied. The extract is committed as
   ``plugins/kernel/sites/<subsystem>.tsv`` (format strings and places only: no code).
2. ``generate``: a pure function of the extract (and the generator's own tables) that writes the pack.
3. ``coverage``: every site rendered as the kernel prints it (:func:`render`, with the device prefix its
   print helper adds) must either give a finding from the built-in rules or be in the generator's explicit
   exclusion list with a reason. ``bench/run.py accuracy`` prints the share per subsystem.

Two commands per subsystem, so the next kernel is one command away::

    python plugins/kernel/generate_<subsystem>.py extract /work/src/linux-source-6.1 \\
        > plugins/kernel/sites/<subsystem>.tsv
    python plugins/kernel/generate_<subsystem>.py generate plugins/kernel/sites/<subsystem>.tsv \\
        > plugins/kernel/<subsystem>-family.yaml

The scanner reads C text, not a parse tree: a print whose format is not a string literal (a variable, a
macro this module cannot resolve) is listed with the unresolved part as ``{NAME}`` and rendered as ``X``;
calls inside comments or ``#if 0`` blocks are not skipped (they are few, and listing one too many is safe:
it must still be covered or excluded).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

# Prefix macros of include/linux/printk.h / kernel.h and asm/mce.h, resolved in every file.
COMMON_MACROS = {
    "FW_BUG": "[Firmware Bug]: ",
    "FW_WARN": "[Firmware Warn]: ",
    "FW_INFO": "[Firmware Info]: ",
    "HW_ERR": "[Hardware Error]: ",
    "DEPRECATED": "[Deprecated]: ",
}

# Levels as the kernel numbers them (include/linux/kern_levels.h); error level or worse is <= 3.
LEVELS = {"emerg": 0, "alert": 1, "crit": 2, "err": 3, "warning": 4, "notice": 5, "info": 6, "debug": 7}
KERN_LEVEL = {f"KERN_{name.upper()}": name for name in LEVELS} | {"KERN_WARNING": "warning", "KERN_CONT": "cont"}
# The character after KERN_SOH that each level's macro is (include/linux/kern_levels.h).
_LEVEL_DIGIT = {f"KERN_{name.upper()}": str(n) for name, n in LEVELS.items()} | {"KERN_CONT": "c"}


@dataclass(frozen=True, kw_only=True)
class Call:
    """A print helper: its level (None: from a KERN_* literal), which argument is the format, its prefix."""

    level: str | None
    fmt_arg: int
    # "pr": the file's pr_fmt; "dev": "<driver> <device>: " + dev_fmt; "netdev": "<driver> <device> <if>: "; "none"
    prefix: str
    # A wrapper that takes the level as an argument (edac_printk(KERN_ERR, EDAC_MC, fmt)): its index.
    level_arg: int | None = None
    # A wrapper that prints literal text before the format ("EDAC {2}: ", {N}: argument N's text;
    # "device-mapper: {DM_MSG_PREFIX}: ", {NAME}: the file's string macro NAME).
    head: str = ""
    # Names the level argument takes besides the KERN_* literals (a driver's own levels: EVO_LOG_ERROR -> "err").
    level_names: Mapping[str, str] = field(default_factory=dict)


def call_forms(base: str, level: str, fmt_arg: int, prefix: str) -> dict[str, Call]:
    """A print helper and its ``_ratelimited`` and ``_once`` forms, all printing alike."""
    call = Call(level=level, fmt_arg=fmt_arg, prefix=prefix)
    return {f"{base}{suffix}": call for suffix in ("", "_ratelimited", "_once")}


# The generic print helpers of include/linux/printk.h, dev_printk.h, netdevice.h, pci.h.
GENERIC_CALLS: dict[str, Call] = {
    **{k: v for lvl in ("err", "crit", "alert", "emerg") for k, v in call_forms(f"pr_{lvl}", lvl, 0, "pr").items()},
    **{k: v for lvl in ("err", "crit", "alert", "emerg") for k, v in call_forms(f"dev_{lvl}", lvl, 1, "dev").items()},
    **{
        k: v
        for lvl in ("err", "crit", "alert", "emerg")
        for k, v in call_forms(f"netdev_{lvl}", lvl, 1, "netdev").items()
    },
    **{k: v for lvl in ("err", "crit", "alert", "emerg") for k, v in call_forms(f"pci_{lvl}", lvl, 1, "dev").items()},
    "dev_err_probe": Call(level="err", fmt_arg=2, prefix="dev"),
    "printk": Call(level=None, fmt_arg=0, prefix="pr"),
    "printk_ratelimited": Call(level=None, fmt_arg=0, prefix="pr"),
    "printk_once": Call(level=None, fmt_arg=0, prefix="pr"),
    "printk_deferred": Call(level=None, fmt_arg=0, prefix="pr"),
    "WARN": Call(level="warn", fmt_arg=1, prefix="none"),
    "WARN_ONCE": Call(level="warn", fmt_arg=1, prefix="none"),
    "WARN_RATELIMIT": Call(level="warn", fmt_arg=1, prefix="none"),
    "panic": Call(level="emerg", fmt_arg=0, prefix="none"),
}


@dataclass(frozen=True, kw_only=True)
class Site:
    """One print site: its level (``err``/``crit``/``alert``/``emerg``/``warn`` for WARN), where, the call,
    and the text as the kernel prints it before the conversions are filled (prefix applied; C escapes kept)."""

    level: str
    where: str  # path:line, relative to the source root
    call: str
    text: str
    prefix: str = "none"  # the print helper's prefix kind (see Call)

    @property
    def key(self) -> str:
        """What names a site across kernel versions (line numbers move; the text and call rarely do)."""
        return f"{self.call}\t{self.text}"


@dataclass(frozen=True, kw_only=True)
class Spec:
    """What to scan for one subsystem: files (globs under the source root), extra helpers, and file prefixes."""

    name: str
    paths: Sequence[str]
    calls: Mapping[str, Call] = field(default_factory=dict)
    levels: frozenset[str] = frozenset({"emerg", "alert", "crit", "err", "warn"})
    # Macros used inside format arguments that the scanner cannot find in the file itself (NAME -> literal).
    macros: Mapping[str, str] = field(default_factory=dict)
    # pr_fmt of files that take it from a header (arch/x86/kernel/cpu/mce/internal.h): path glob -> prefix.
    pr_fmt: Mapping[str, str] = field(default_factory=dict)
    # KBUILD_MODNAME as the file's name ("mm/zswap.c" -> "zswap"): what kbuild defines for a built-in
    # object (and a one-file module); False leaves it "{KBUILD_MODNAME}", filled by render's driver.
    modname_from_file: bool = False
    # Whether a bare printk() gets the file's pr_fmt. The kernel's does not (pr_fmt is applied by the
    # pr_* macros only): False prints printk sites as the kernel does; True keeps the older extracts.
    printk_pr_fmt: bool = True
    # KBUILD_MODNAME of files whose module name is known (path glob -> module, from the Makefile:
    # drivers/nvme/host/tcp.c is nvme-tcp.ko, "nvme_tcp"); other files keep it as {KBUILD_MODNAME}.
    modules: Mapping[str, str] = field(default_factory=dict)
    # Directories an older release named otherwise (old prefix -> the primary release's): an older
    # release's site is named, and excluded, by the path the primary release gives it (fs/cifs/ -> fs/smb/client/).
    renamed: Mapping[str, str] = field(default_factory=dict)

    def helpers(self) -> dict[str, Call]:
        return {**GENERIC_CALLS, **self.calls}


_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')
# A macro of string literals (continued over lines with backslashes), with a KERN_* level first or not:
# ``#define ALLOC_FAILURE_MSG KERN_ERR "%s: Allocation failure during" \ " SCSI scanning, ..."``.
_DEFINE = re.compile(
    r'^[ \t]*#[ \t]*define[ \t]+(\w+)[ \t]+((?:(KERN_[A-Z]+)[ \t]+)?(?:"(?:[^"\\\n]|\\.)*"(?:[ \t]|\\\n)*)+)[ \t]*$',
    re.M,
)
_FMT_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(pr_fmt|dev_fmt)\(fmt\)[ \t]+(.*?)(?:\\\n.*?)?$", re.M)


def _literal(token: str) -> str:
    """A string literal's text (a backslash-newline inside it continues the literal on the next line)."""
    return token[1:-1].replace("\\\n", "")


def _file_macros(text: str, extra: Mapping[str, str]) -> dict[str, str]:
    """The file's string macros by name; one that begins with a KERN_* level has it in ``LEVEL_OF`` + name."""
    macros = {**COMMON_MACROS, **extra}
    for m in _DEFINE.finditer(text):
        macros.setdefault(m[1], "".join(_literal(s) for s in _STRING.findall(m[2])))
        if m[3] in KERN_LEVEL:
            macros.setdefault(LEVEL_OF + m[1], m[3])
    return macros


LEVEL_OF = "level of "  # the key of a macro's KERN_* level in the file's macros (no C name has a space)


def _prefix_define(text: str, name: str, macros: Mapping[str, str]) -> str:
    """The literal text a ``#define pr_fmt(fmt) ... fmt`` puts before a format (KBUILD_MODNAME as the module,
    or its name where the spec's macros give it). A prefix of ``%s`` conversions filled by arguments after
    ``fmt`` (``"%s:%s: " fmt, KBUILD_MODNAME, __func__``) has them filled: a macro's text, else ``{NAME}``."""
    module = macros.get("KBUILD_MODNAME", "{KBUILD_MODNAME}")
    for m in _FMT_DEFINE.finditer(text):
        if m[1] != name:
            continue
        body, _, tail = m[2].partition("fmt")
        pieces = re.findall(r'"(?:[^"\\\n]|\\.)*"|\w+', body)
        out = []
        for piece in pieces:
            if piece.startswith('"'):
                out.append(_literal(piece))
            elif piece == "KBUILD_MODNAME":
                out.append(module)
            elif piece in macros:
                out.append(macros[piece])
        return _fill_prefix("".join(out), [a.strip() for a in tail.split(",")[1:]], macros, module)
    return ""


def _fill_prefix(prefix: str, args: Sequence[str], macros: Mapping[str, str], module: str) -> str:
    """``prefix`` with its ``%s`` conversions filled by ``args`` in order; unchanged where they do not pair."""
    conversions = [c for c in re.findall(r"%.", prefix) if c != "%%"]
    if not args or conversions != ["%s"] * len(args) or not all(re.fullmatch(r"\w+", a) for a in args):
        return prefix
    values = iter(module if a == "KBUILD_MODNAME" else macros.get(a, "{" + a + "}") for a in args)
    return re.sub(r"%%|%s", lambda c: c[0] if c[0] == "%%" else next(values), prefix)


def _arguments(text: str, start: int) -> tuple[list[str], int] | None:
    """The top-level arguments of a call whose '(' is at ``start``, and the offset after ')'."""
    depth, i, args, begin = 0, start, [], start + 1
    n = len(text)
    while i < n:
        c = text[i]
        if c == '"' or c == "'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            i = j + 1
            continue
        if c == "/" and text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
            continue
        if c == "/" and text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                args.append(text[begin:i].strip())
                return args, i + 1
        elif c == "," and depth == 1:
            args.append(text[begin:i].strip())
            begin = i + 1
        i += 1
    return None


def _format(arg: str, macros: Mapping[str, str], *, leveled: bool = False) -> tuple[str | None, str]:
    """(level from a KERN_* piece or None, the format text) of a format argument.

    printk takes a record's level from the KERN_* pieces at the very start of the text it formats and drops
    them; one after any text is printed as it is, mid-record: its two bytes, KERN_SOH and the level's digit,
    stay in the message (``pr_err(KERN_ERR "seq: %u ...")`` under a pr_fmt reads ``neuron:f: \\x013seq: 5``
    from /dev/kmsg). ``leveled``: the helper brings a level of its own (pr_err, dev_err), so every KERN_*
    piece is kept in the text as ``{KERN_ERR}`` (a gap between literal runs, rendered as those two bytes);
    :func:`scan_file` drops those its prefix leaves at the start, where printk reads them as the level."""
    level = None
    out = []
    for piece in re.findall(r'"(?:[^"\\\n]|\\.|\\\n)*"|[A-Za-z_]\w*|\S', arg):
        if piece.startswith('"'):
            out.append(_literal(piece))
        elif piece in KERN_LEVEL:
            if leveled or any(out):
                out.append("{" + piece + "}")
            else:
                level = level or KERN_LEVEL[piece]
        elif piece in macros:
            own = macros.get(LEVEL_OF + piece, "")
            if own and (leveled or any(out)):
                out.append("{" + own + "}")
            out.append(macros[piece])
            level = level or KERN_LEVEL.get(own)
        elif piece.startswith("KERN_SOH"):
            continue
        elif re.fullmatch(r"[A-Za-z_]\w*", piece):
            out.append("{" + piece + "}")
    return level, "".join(out)


_LEADING_LEVELS = re.compile(r"^(?:\{KERN_[A-Z]+\})+")

# A return type right before a helper's name: the function's definition or prototype, not a call.
_DECLARATION = re.compile(r"\b(?:void|int|bool)[ \t*]+$")

# A function definition as kernel style writes it: the declaration from column 0, the name right before
# the parameter list, the body's "{" after it (on that line or the next).
_FUNCTION = re.compile(
    r"^(?!(?:if|for|while|switch|return|else|do)\b)[A-Za-z_][\w \t*]*?\b([A-Za-z_]\w*)\s*\([^;{}]*\)\s*\{", re.M
)


def _enclosing_function(text: str, offset: int) -> str | None:
    """The name of the function whose body holds ``offset`` (the last definition that starts before it)."""
    name = None
    for m in _FUNCTION.finditer(text, 0, offset):
        name = m[1]
    return name


def _fill_func(fmt: str, args: Sequence[str], function: str | None) -> str:
    """The format with each ``%s`` whose argument is ``__func__`` written as the function's name, as it prints
    (``dev_err(dev, "%s failed with error code %d\n", __func__, ret)``). Conversions are read as rendering
    reads them (``_CONVERSION``); a ``*`` width or precision takes an argument of its own."""
    if function is None:
        return fmt
    out, at, n = [], 0, 0
    for m in _CONVERSION.finditer(fmt):
        if m[0] == "%%":
            continue
        n += (m["width"] == "*") + (m["prec"] == "*")
        if m[0] == "%s" and n < len(args) and args[n] in ("__func__", "__FUNCTION__"):
            out += [fmt[at : m.start()], function]
            at = m.end()
        n += 1
    return "".join(out) + fmt[at:]


def scan_file(path: Path, rel: str, spec: Spec) -> Iterator[Site]:
    """The error-level print sites of one C file."""
    text = path.read_text(errors="replace")
    helpers = spec.helpers()
    macros = _file_macros(text, spec.macros)
    pr_fmt = _prefix_define(text, "pr_fmt", macros) or next(
        (prefix for glob, prefix in spec.pr_fmt.items() if fnmatch.fnmatch(rel, glob)), ""
    )
    dev_fmt = _prefix_define(text, "dev_fmt", macros)
    if spec.modname_from_file:
        pr_fmt = pr_fmt.replace("{KBUILD_MODNAME}", Path(rel).stem)
        dev_fmt = dev_fmt.replace("{KBUILD_MODNAME}", Path(rel).stem)
    module = next((name for glob, name in spec.modules.items() if fnmatch.fnmatch(rel, glob)), "")
    if module:
        pr_fmt, dev_fmt = (p.replace("{KBUILD_MODNAME}", module) for p in (pr_fmt, dev_fmt))
    names = "|".join(sorted(map(re.escape, helpers), key=len, reverse=True))
    for m in re.finditer(rf"(?<![\w.>])({names})\s*\(", text):
        call = helpers[m[1]]
        if text[max(0, m.start() - 8) : m.start()].rstrip().endswith("define"):
            continue  # a macro definition, not a site
        if _DECLARATION.search(text, max(0, m.start() - 40), m.start()):
            continue  # a wrapper's own definition or prototype ("void warn_alloc(gfp_t gfp_mask, ...)")
        parsed = _arguments(text, m.end() - 1)
        if parsed is None or len(parsed[0]) <= call.fmt_arg or not parsed[0][call.fmt_arg]:
            continue  # no format argument: a name in a comment ("the use of printk() could deadlock")
        level, fmt = _format(parsed[0][call.fmt_arg], macros, leveled=call.level is not None)
        rest = parsed[0][call.fmt_arg + 1 :]
        if "__func__" in rest or "__FUNCTION__" in rest:
            fmt = _fill_func(fmt, rest, _enclosing_function(text, m.start()))
        if call.level_arg is not None:
            argument = parsed[0][call.level_arg]
            level = _format(argument, macros)[0] or next(
                (lvl for name, lvl in call.level_names.items() if re.search(rf"\b{name}\b", argument)), None
            )
        if call.head:
            args = parsed[0]

            def head(h: re.Match[str], a: list[str] = args) -> str:
                return _format(a[int(h[1])], macros)[1] if h[1].isdigit() else macros.get(h[1], h[0])

            fmt = re.sub(r"\{(\w+)\}", head, call.head) + fmt
        level = call.level or level or "warning"  # printk without a level prints at the default (warning)
        if level not in spec.levels:
            continue
        prefix = pr_fmt if call.prefix == "pr" else dev_fmt if call.prefix in ("dev", "netdev") else ""
        if m[1].startswith("printk") and not spec.printk_pr_fmt:
            prefix = ""
        if "{__func__}" in prefix:  # a prefix that prints the function's name ("%s: " fmt, __func__)
            prefix = prefix.replace("{__func__}", _enclosing_function(text, m.start()) or "{__func__}")
        line = text.count("\n", 0, m.start()) + 1
        printed = prefix + fmt
        if call.prefix not in ("dev", "netdev"):  # dev_printk prints "<driver> <device>: " before the format
            printed = _LEADING_LEVELS.sub("", printed)  # printk reads these as the level, and drops them
        yield Site(level=level, where=f"{rel}:{line}", call=m[1], text=printed, prefix=call.prefix)


def extract(root: Path, spec: Spec) -> list[Site]:
    """Every error-level print site of the subsystem, in path and line order."""
    files = sorted({p for pattern in spec.paths for p in root.glob(pattern) if p.is_file()})
    sites: list[Site] = []
    for path in files:
        rel = str(path.relative_to(root))
        for old, new in spec.renamed.items():
            if rel.startswith(old):
                rel = new + rel[len(old) :]
        sites += scan_file(path, rel, spec)
    return sites


def extract_releases(roots: Sequence[Path], scan: Callable[[Path], list[Site]]) -> list[Site]:
    """The sites of the first (primary) release, then those of each older release that print otherwise.

    Fleets run many kernel releases and a message's words move between them (DMAR's fault record lost its
    "PASID %x" for "NO_PASID", nf_conntrack's table-full warning gained its module's prefix): a rule made
    from one release's formats misses the others' lines. An older release's site whose text the primary has
    (from any helper), or whose pattern finds a line the primary prints, is the same print and is left out;
    any other is kept, its ``where`` suffixed with ``@<release>`` (so an exclusion naming a primary
    release's line number does not claim it)."""
    sites = scan(roots[0])
    seen = {s.text for s in sites}  # the same text from another helper (printk(KERN_ERR ...) for dev_err) too
    # A pattern that finds a primary line would report it beside the primary's own rule: one print, two findings.
    printed = [line for s in sites for line in render(s)]
    for root in roots[1:]:
        for site in scan(root):
            if site.text not in seen and not _prints_as_one_of(site, printed):
                seen.add(site.text)
                sites.append(replace(site, where=f"{site.where}@{root.name}"))
    return sites


def _prints_as_one_of(site: Site, lines: Sequence[str]) -> bool:
    """Whether the site's pattern finds a line the primary release prints: the same message, worded a little
    otherwise (a clause the newer release added: "Slab cache still has objects when called from %pS")."""
    pattern = site_pattern(site)
    runs = literal_runs(site)
    if pattern is None or not runs:
        return False
    longest = max(runs, key=len)
    compiled = re.compile(pattern)
    return any(longest in line and compiled.search(line) for line in lines)


# --- the extract file -----------------------------------------------------------------------------------

HEADER = "# level\tpath:line\tcall\tprefix\tformat string as written in C (file prefix applied)"


def write_extract(spec: Spec, source: str, sites: Iterable[Site]) -> str:
    rows = [f"# {source}: error-level print sites of subsystem {spec.name}", HEADER]
    rows += [f"{s.level}\t{s.where}\t{s.call}\t{s.prefix}\t{s.text}" for s in sites]
    return "\n".join(rows) + "\n"


def read_extract(text: str) -> list[Site]:
    sites = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        level, where, call, prefix, fmt = line.split("\t", 4)
        sites.append(Site(level=level, where=where, call=call, text=fmt, prefix=prefix))
    return sites


# --- rendering: one line a site can print ---------------------------------------------------------------

_CONVERSION = re.compile(
    r"%(?P<flags>[-#0 +]*)(?P<width>\*|\d+)?(?:\.(?P<prec>\*|\d+))?(?P<len>hh|h|ll|l|L|z|j|t)?"
    r"(?:(?P<ptr>p[A-Za-z0-9]*)|(?P<conv>[%cdiouxXs]))"
)
# What the %p extensions print (lib/vsprintf.c pointer()), one plausible value each.
_POINTER = {
    "pS": "nvme_timeout+0x1c/0x1a0 [nvme]",
    "ps": "nvme_timeout",
    "pB": "nvme_timeout+0x1c/0x1a0",
    "pF": "nvme_timeout+0x1c/0x1a0",
    "pf": "nvme_timeout",
    "pSR": "nvme_timeout+0x1c/0x1a0",
    "pR": "[mem 0xfe000000-0xfe0fffff 64bit]",
    "pr": "[mem 0xfe000000-0xfe0fffff flags 0x200]",
    "pa": "0x00000000fe000000",
    "pad": "0x00000000fe000000",
    "pap": "0x00000000fe000000",
    "pM": "00:1a:2b:3c:4d:5e",
    "pMR": "5e:4d:3c:2b:1a:00",
    "pm": "001a2b3c4d5e",
    "pI4": "10.0.0.1",
    "pi4": "010.000.000.001",
    "pI6": "fe80::1",
    "pI6c": "fe80::1",
    "pi6": "fe800000000000000000000000000001",
    "pISpc": "10.0.0.1:2049",
    "pIS": "10.0.0.1",
    "pISc": "10.0.0.1",
    "pISp": "10.0.0.1:2049",
    "pU": "5f2c1b8e-3a4d-4e5f-8a9b-0c1d2e3f4a5b",
    "pUb": "5f2c1b8e-3a4d-4e5f-8a9b-0c1d2e3f4a5b",
    "pUl": "5f2c1b8e-3a4d-4e5f-8a9b-0c1d2e3f4a5b",
    "pg": "nvme0n1",
    "pD": "data.bin",
    "pd": "data.bin",
    "pd2": "dir/data.bin",
    "pD2": "dir/data.bin",
    "pe": "-EIO",
    "pV": "request failed",
    "pOF": "/soc/iommu@0",
    "pOFf": "/soc/iommu@0",
    "pfw": "\\_SB.PCI0",
    "pfwf": "\\_SB.PCI0",
    "pfwP": "PCI0",
    "pGp": "locked|uptodate",
    "pGg": "__GFP_NOWARN",
    "pGv": "read|write",
    "pC": "clk0",
    "pCn": "clk0",
    "pt": "2026-12-02T10:00:00",
    "ptR": "2026-12-02T10:00:00",
    "pNF": "0x0000000000000001",
    "pcx": "0x1",
    "pK": "0000000000000000",
    "px": "ffff8881dead0000",
    "ph": "00 01 02 03",
    "phN": "00010203",
    "phC": "00:01:02:03",
    "phD": "00-01-02-03",
    "pb": "0-3",
    "pbl": "0-3",
    "pE": "abc",
    "pEp": "abc",
    "p4cc": "NV12 little-endian (0x3231564e)",
}


def _conversion(m: re.Match[str]) -> str:
    flags, width = m["flags"], m["width"]
    if m["ptr"]:
        ptr = m["ptr"]
        value = next((v for k, v in sorted(_POINTER.items(), key=lambda kv: -len(kv[0])) if ptr.startswith(k)), None)
        text = value if value is not None else "ffff8881dead0000"
    else:
        text = {"%": "%", "c": "c", "d": "3", "i": "3", "u": "3", "o": "7", "x": "1f", "X": "1F", "s": "x"}[m["conv"]]
    head = "0x" if m["conv"] and m["conv"] in "xX" and "#" in flags else ""
    if width and width != "*":
        size = int(width) - len(head)
        if "-" in flags:
            return (head + text).ljust(int(width))
        if "0" in flags and not m["ptr"] and m["conv"] != "s":
            return head + text.rjust(size, "0")
        return (head + text).rjust(int(width))
    return head + text


_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{1,2}|[0-7]{1,3}|.)")


def _unescape(text: str) -> str:
    def one(m: re.Match[str]) -> str:
        e = m[1]
        if e[0] == "x":
            return chr(int(e[1:], 16))
        if e[0] in "01234567":
            return chr(int(e, 8))
        return {"n": "\n", "t": "\t", "r": "\r"}.get(e, e)

    return _ESCAPE.sub(one, text)


# The prefix the device print helpers add (dev_printk: "<driver> <device>: ", netdev_printk adds the interface).
DEV_PREFIX = "{driver} 0000:3b:00.0: "
NETDEV_PREFIX = "{driver} 0000:3b:00.0 eth0: "


def driver_of(site: Site, driver: str | Mapping[str, str]) -> str:
    """The driver name a site's device prefix renders with: ``driver`` itself, or, for a generator whose
    files belong to several drivers (ena and efa), the value of the first path glob that matches."""
    if isinstance(driver, str):
        return driver
    path = site.where.rsplit(":", 1)[0]
    return next((name for glob, name in driver.items() if fnmatch.fnmatch(path, glob)), "nvme")


def render(site: Site, *, driver: str | Mapping[str, str] = "nvme", module: str = "") -> list[str]:
    """The kernel records one print at this site gives, as read from /dev/kmsg (one per line of the message).

    ``driver`` is the device's driver name for dev_*/netdev_* prefixes (or a path glob -> name mapping,
    see :func:`driver_of`); ``module`` fills ``KBUILD_MODNAME`` (default: the driver name). Unresolved
    macros render as ``X``.
    """
    driver = driver_of(site, driver)
    text = site.text.replace("{KBUILD_MODNAME}", module or driver)
    text = re.sub(r"\{(KERN_[A-Z]+)\}", lambda m: "\x01" + _LEVEL_DIGIT[m[1]], text)  # printed as they are
    text = re.sub(r"\{[A-Za-z_]\w*\}", "X", text)
    text = _CONVERSION.sub(_conversion, _unescape(text))
    if site.prefix == "dev":
        text = DEV_PREFIX.format(driver=driver) + text
    elif site.prefix == "netdev":
        text = NETDEV_PREFIX.format(driver=driver) + text
    if site.call == "panic":
        # panic(fmt) prints "Kernel panic - not syncing: <message>" (kernel/panic.c).
        text = "Kernel panic - not syncing: " + text
    if site.call.startswith("WARN"):
        # WARN(cond, fmt) prints the message, then "WARNING: CPU: n PID: n at <where>": the header is the finding.
        text = text + "\nWARNING: CPU: 3 PID: 1234 at " + site.where.split(":")[0] + " nvme_timeout+0x1c/0x1a0"
    lines = [line for line in text.split("\n") if line.strip()]
    return lines


# --- coverage ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Exclusion:
    """Sites no rule should speak for, and why: a regex searched in the site's text (and ``where``, if given).

    ``benign``: the line is printed at error level on healthy machines (a context line, an informational read
    reported as an error): a rule that fires on it is a false positive, so :func:`coverage` reports it as
    ``noisy``. Other exclusions (a path accelerator hosts cannot take, a debug build) are not checked.
    """

    pattern: str
    reason: str
    benign: bool = False
    where: str = ""  # regex on "path:line" (empty: any)

    def matches(self, site: Site) -> bool:
        if self.where and re.search(self.where, site.where) is None:
            return False
        return re.search(self.pattern, site.text) is not None


@dataclass(frozen=True, kw_only=True)
class Coverage:
    subsystem: str
    sites: int
    covered: int
    excluded: int
    uncovered: tuple[Site, ...]
    noisy: tuple[Site, ...] = ()  # excluded as benign, yet a rule fires on them

    @property
    def share(self) -> float:
        return (self.covered + self.excluded) / self.sites if self.sites else 1.0


def coverage(
    subsystem: str,
    sites: Sequence[Site],
    *,
    finds: Callable[[list[str]], bool],
    exclusions: Sequence[Exclusion],
    driver: str | Mapping[str, str] = "nvme",
) -> Coverage:
    """How many sites the rules speak for (``finds`` of the site's rendered lines is true) or exclude."""
    covered = excluded = 0
    uncovered, noisy = [], []
    for site in sites:
        rule = next((e for e in exclusions if e.matches(site)), None)
        found = finds(render(site, driver=driver))
        if rule is not None and rule.benign:
            excluded += 1
            if found:
                noisy.append(site)
        elif found:
            covered += 1
        elif rule is not None:
            excluded += 1
        else:
            uncovered.append(site)
    return Coverage(
        subsystem=subsystem,
        sites=len(sites),
        covered=covered,
        excluded=excluded,
        uncovered=tuple(uncovered),
        noisy=tuple(noisy),
    )


def load_generator(path: Path):  # noqa: ANN201 - a generator module (SPEC, EXCLUSIONS, EXTRACT, DRIVER)
    """Import a ``generate_<subsystem>.py`` script by path (they live beside their packs, not in a package)."""
    import importlib.util
    import sys

    name = f"nha_generator_{path.parent.name}_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def generators(plugins_dir: Path) -> list[Path]:
    """The per-subsystem generator scripts: ``plugins/<pack>/generate_*.py`` that define a ``SPEC``."""
    found = []
    for path in sorted(plugins_dir.glob("*/generate_*.py")):
        if "SPEC" in path.read_text():
            found.append(path)
    return found


# --- generating a family pack from the extract ------------------------------------------------------------

# A literal run shorter than this, alone, says too little about a line to speak for it (": failed", "error ").
MIN_RUN = 10
# Pattern text per rule: keeps each rule's RE2 program far below the 2000-instruction limit.
RULE_BUDGET = 900
_PIECE = re.compile(
    r"%(?:[-#0 +]*(?:\*|\d+)?(?:\.(?:\*|\d+))?(?:hh|h|ll|l|L|z|j|t)?(?:p[A-Za-z0-9]*|[a-zA-Z%]))|\{\w+\}"
)


@dataclass(frozen=True, kw_only=True)
class Family:
    """How a generator turns its sites into rules: the rules' name prefix, reason and severity, and the
    regex a device print (dev_*/netdev_*) must begin with (the NIC drivers: the helper's prefix)."""

    name: str
    reason: str
    severity: str = "warning"
    device_prefix: str = ""  # empty: dev_* sites are matched on their text alone
    # A prefix the primary release prints that older releases printed otherwise -> a regex for both, put in
    # front of the branches that begin with it (fs: 6.1's "CIFS: VFS: ", before 5.10 "CIFS VFS: ").
    older_prefixes: Mapping[str, str] = field(default_factory=dict)
    source: str = ""
    repository: str = "torvalds/linux"  # the provenance's source repository (owner/name)


def literal_runs(site: Site) -> list[str]:
    """The literal text of the site's first telling printed line (a message of several records is one
    finding, its first record's), in order: the pieces between conversions; else of its most telling."""
    best: list[str] = []
    for line in _unescape(site.text).split("\n"):
        runs = [r.strip() for r in _PIECE.split(line.replace("\t", " "))]
        runs = [r for r in runs if len(r) >= 3 and re.search(r"[A-Za-z]{2}", r)]
        if runs and max(map(len, runs)) >= MIN_RUN:
            return runs
        if sum(map(len, runs)) > sum(map(len, best)):
            best = runs
    return best


def site_pattern(site: Site) -> str | None:
    """A one-line RE2 branch for the site: its literal runs in order, ``.*`` between; None when no run
    is long enough to tell the line from other prints."""
    runs = literal_runs(site)
    if not runs or max(map(len, runs)) < MIN_RUN:
        return None
    return ".*".join(map(_escape, runs))


def _escape(literal: str) -> str:
    """``literal`` as an RE2 pattern that matches just it."""
    return re.sub(r"([\\.^$|?*+()\[\]{}])", r"\\\1", literal)


def _overlapping_together(table: Mapping[str, Sequence[Site]]) -> list[list[str]]:
    """The branches in rule order, grouped: those whose texts overlap (one's line matches the other's
    branch, as "DPC: TLP Header: " and "TLP Header: ") in one group, which lands in one rule whole: two
    fallback rules matching one line would report it twice."""
    branches = sorted(table)
    group = {b: b for b in branches}

    def root(b: str) -> str:
        while group[b] != b:
            b = group[b]
        return b

    compiled = [(b, re.compile(b), max(literal_runs_of(b), key=len)) for b in branches]
    for branch, sites in table.items():
        lines = [line for site in sites for line in render(site)]
        for other, regex, needle in compiled:
            if other != branch and any(needle in line and regex.search(line) for line in lines):
                group[root(other)] = root(branch)
    members: dict[str, list[str]] = {}
    for b in branches:
        members.setdefault(root(b), []).append(b)
    return [members[key] for key in sorted(members, key=lambda k: min(members[k]))]


def literal_runs_of(branch: str) -> list[str]:
    """The literal runs of a branch site_pattern wrote (its escapes undone)."""
    return [re.sub(r"\\(.)", r"\1", run) for run in branch.split(".*")]


def _yaml_quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def family_pack(
    *,
    family: Family,
    sites: Sequence[Site],
    exclusions: Sequence[Exclusion],
    leave: Sequence[Exclusion],
    generator: str,
    extract_path: str,
    header: Sequence[str] = (),
) -> str:
    """The pack: a warning Event per error-level site no exclusion or other pack's rule (``leave``) speaks
    for, as ``fallback`` rules (a specific rule of another pack that matched keeps them quiet), each with the
    ``maxLevel`` of its sites (records read with their level are looked at only at that level or worse: the
    prefilter scans the few error-level lines of a batch for these rules' literals, not every line).

    WARN sites are left to kernel/warning (the ``WARNING: CPU:`` header is the report's finding), so one
    WARN report stays one finding; panic sites to kernel/panic ("Kernel panic - not syncing: ...").
    """
    plain: dict[str, list[Site]] = {}
    device: dict[str, list[Site]] = {}
    unmatched: list[Site] = []
    benign: dict[str, list[Site]] = {}  # excluded as printed on healthy machines: quiet, so the catch-all knows them
    left = 0
    for site in sites:
        exclusion = next((e for e in exclusions if e.matches(site)), None)
        branch = _with_older_prefixes(site_pattern(site), family)
        if site.call.startswith("WARN") or site.call == "panic" or exclusion or any(e.matches(site) for e in leave):
            left += 1
            if branch is not None and exclusion is not None and exclusion.benign:
                benign.setdefault(branch, []).append(site)
            continue
        if branch is None:
            unmatched.append(site)
            continue
        table = device if family.device_prefix and site.prefix in ("dev", "netdev") else plain
        table.setdefault(branch, []).append(site)
    out = [
        f"# GENERATED by {generator} from {extract_path}: do not edit.",
        f"# {len(sites)} error-level print sites; {sum(map(len, plain.values())) + sum(map(len, device.values()))}"
        f" have a rule here, {left} are excluded or left to other packs' rules, {len(unmatched)} print too",
        "# little literal text to be told apart:",
        *[f"#   {s.where} {s.text[:100]}" for s in unmatched],
        *[f"# {line}" if line else "#" for line in header],
        "plugin: kmsg",
        f"source: {family.source or family.name + '-family'}",
        "rules:",
    ]
    groups = [("", plain), (family.device_prefix, device)]
    n = 0
    for prefix, table in groups:
        chunk: list[str] = []
        size = 0
        groups_ = _overlapping_together(table)
        for i, members in enumerate(groups_):
            chunk += members
            size += sum(len(branch) + 1 for branch in members)
            if size < RULE_BUDGET and i + 1 < len(groups_):
                continue
            n += 1
            members = [s for b in chunk for s in table[b]]
            out += _family_rule(
                f"{family.name}/sites-{n}",
                family=family,
                sites=members,
                severity=family.severity,
                count=f"{extract_path}: {len(members)} sites",
                pattern=(prefix + ".*" if prefix else "") + "(?:" + "|".join(chunk) + ").*",
                before=["    fallback: true"],
            )
            chunk, size = [], 0
    if benign:
        # One quiet rule for the sites excluded as benign (printed at error level on healthy machines): it never
        # fires (the where filter never passes), and a line it matched is known, so the catch-all raises no
        # KernelError Event for it and no fallback of another pack speaks for it.
        members = [s for group in benign.values() for s in group]
        out += _family_rule(
            f"{family.name}/benign",
            family=family,
            sites=members,
            severity="info",
            count=f"{extract_path}: {len(members)} sites excluded as benign",
            pattern="(?P<benign>)(?:" + "|".join(sorted(benign)) + ").*",
            after=["    where: {benign: [never]}"],
        )
    return "\n".join(out) + "\n"


def _with_older_prefixes(branch: str | None, family: Family) -> str | None:
    """The branch, its first literal's prefix widened to an older release's form where the family names one."""
    if branch is None:
        return None
    for prefix, regex in family.older_prefixes.items():
        if branch.startswith(escaped := _escape(prefix)):
            return regex + branch[len(escaped) :]
    return branch


def _family_rule(
    name: str,
    *,
    family: Family,
    sites: Sequence[Site],
    severity: str,
    count: str,
    pattern: str,
    before: Sequence[str] = (),
    after: Sequence[str] = (),
) -> list[str]:
    """One generated rule's lines: a temporary Event of the family's reason for ``sites``, ``before`` its level
    gate and ``after`` its pattern."""
    where = sorted({s.where.split(":")[0] for s in sites})
    # The rule looks only at records printed at its sites' levels or worse (and at lines of no known level): an
    # info-level line that happens to hold the words is not this print. A site below warning level (net's
    # neighbour overflow, at info) leaves its rule open to every line: a gate that wide would have the gated
    # literals scanned over nearly every line of a batch.
    level = max(LEVELS.get(s.level, LEVELS["warning"]) for s in sites)  # WARN: "warn"
    gate = [f"    maxLevel: {next(n for n, v in LEVELS.items() if v == level)}"] if level <= 4 else []
    return [
        f"  - name: {name}",
        "    type: temporary",
        f"    reason: {family.reason}",
        f"    severity: {severity}",
        *before,
        *gate,
        "    provenance:",
        *[f"      - {_yaml_quote(f'{family.repository}:{path}')}" for path in where[:8]],
        f"      - {_yaml_quote(count)}",
        "    pattern: " + _yaml_quote(pattern),
        *after,
    ]


def main(argv: Sequence[str], *, spec: Spec, generate: Callable[[list[Site]], str]) -> int:
    """``extract ROOT`` (the TSV on stdout) or ``generate EXTRACT`` (the pack on stdout)."""
    import sys

    if len(argv) >= 2 and argv[0] == "extract":
        roots = [Path(a) for a in argv[1:]]
        sys.stdout.write(
            write_extract(
                spec, " + ".join(r.name for r in roots), extract_releases(roots, lambda root: extract(root, spec))
            )
        )
        return 0
    if len(argv) == 2 and argv[0] == "generate":
        sys.stdout.write(generate(read_extract(Path(argv[1]).read_text())))
        return 0
    sys.stderr.write("usage: generate_<subsystem>.py extract SOURCE_ROOT [OLDER_ROOT ...] | generate EXTRACT.tsv\n")
    return 2
