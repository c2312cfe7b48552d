"""The NVRM family rules (nvrm-family.yaml), generated from the driver's own print sites (issue 18).

The NVIDIA driver prints several thousand different messages (NV_PRINTF, NV_DEV_PRINTF, nv_printf
sites in NVIDIA/open-gpu-kernel-modules); no list of patterns follows them from release to release.
What they share is the ``NVRM`` prefix and the words the driver uses when something failed. This
script reads those print sites with their levels and derives, from the driver's own text:

- the failure vocabulary: words of a small failure lexicon (``LEXICON`` below) that the driver's
  error-level prints use (at least ``MIN_ERROR_SITES`` of them) and its informational prints rarely do
  (at most ``MAX_INFO_SHARE`` of the sites using the word are informational);
- the informational phrases: for each informational print (LEVEL_INFO, LEVEL_NOTICE, NV_DBG_INFO,
  ...) that nevertheless uses a vocabulary word ("... failed, using defaults"), the longest literal
  run of its format string around that word, so that line stays silent.

Two steps, so the next driver version is one command away::

    git -C open-gpu-kernel-modules archive HEAD src kernel-open | tar -x -C /tmp/ogkm
    python plugins/nvidia/generate_rules.py extract /tmp/ogkm --release 595.45.04 \
        > plugins/nvidia/nvrm-print-sites.tsv
    python plugins/nvidia/generate_rules.py generate plugins/nvidia/nvrm-print-sites.tsv \
        > plugins/nvidia/nvrm-family.yaml

``extract`` keeps only the print sites whose text holds a lexicon word (the rest cannot change the
output) plus a count of sites per level; ``generate`` is a pure function of that extract
(tests/test_rules_nvrm_family.py checks the committed pack is what it produces).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# The print helpers and the position of their level and format arguments.
CALLS: dict[str, tuple[tuple[int, ...], int]] = {
    "NV_PRINTF": ((0,), 1),
    "NV_PRINTF_EX": ((1,), 2),
    "NV_PRINTF_COND": ((1, 2), 3),
    "NV_DEV_PRINTF": ((0,), 2),
    "NV_DEV_PRINTF_STATUS": ((0,), 3),
    "nv_printf": ((0,), 1),
    "portDbgPrintf": ((), 0),  # printed whatever the debug level: counted with the warnings
}
ERROR_LEVELS = ("LEVEL_ERROR", "LEVEL_FATAL", "NV_DBG_ERRORS")
WARNING_LEVELS = ("LEVEL_WARNING", "NV_DBG_WARNINGS", "ALWAYS")
INFO_LEVELS = ("LEVEL_INFO", "LEVEL_NOTICE", "LEVEL_SILENT", "NV_DBG_INFO", "NV_DBG_SETUP", "NV_DBG_MEMINFO")

# Words that say something failed, whatever the subsystem. The vocabulary is the part of this list
# the driver's own prints bear out (see the module docstring); general words ("not", "no",
# "disabled", "unknown") are left out because the driver uses them as often for normal states.
LEXICON = [
    "assert",
    "assertion",
    "bad",
    "can't",
    "cannot",
    "corrupt",
    "corrupted",
    "couldn't",
    "denied",
    "exceeded",
    "failed",
    "fails",
    "failure",
    "failures",
    "fatal",
    "fault",
    "faulted",
    "faults",
    "hang",
    "hung",
    "illegal",
    "incompatible",
    "insufficient",
    "invalid",
    "leaked",
    "lost",
    "mismatch",
    "missing",
    "overflow",
    "stuck",
    "timed",
    "timedout",
    "timeout",
    "unable",
    "uncorrectable",
    "unexpected",
    "unrecoverable",
    "unsupported",
    "violation",
    "wrong",
    "error",
    "errors",
]
MIN_ERROR_SITES = 3
MAX_INFO_SHARE = 0.25
MIN_PHRASE = 12  # an informational phrase shorter than this would silence too much
# Error-level prints that frame a report a specific rule of nvidia-monitor.yaml already gives: quiet
# like the informational prints, so one fault is not reported twice. (phrase, where it is printed)
CONTEXT_PHRASES = (
    ("*** End GSP Timeout ***", "src/nvidia/src/kernel/gpu/gsp/kernel_gsp.c _kgspLogGspTimeout, 560-580 releases"),
    # The warning-level twin of the "... for GPU at PCI:... The GPU likely needs to be reset." print, which
    # is a finding of its own (nvidia-monitor.yaml: quiet after the report's Xid 119, alone the family's).
    (
        "Rate limiting GSP RPC error prints (printing 1 of every",
        "src/nvidia/src/kernel/gpu/gsp/kernel_gsp.c _kgspRpcIncrementTimeoutCountAndRateLimitPrints NV_PRINTF",
    ),
)
# Error-level prints whose own text says the driver carries on ("... (non-fatal)", "...; falling back to
# PCIe virtual-wire interrupts", "Ignoring the failure and continuing"): quiet like the informational prints.
TOLERATED_TEXT = re.compile(r"\(non-fatal\)|falling back to|Ignoring the failure and continuing")
# Error-level prints of code that carries on after them (the print is all the failure does), printed on
# healthy machines: quiet. (phrase, where it is printed, why)
TOLERATED_SITES = (
    (
        "*** Chipset Setup Function Error!",
        "src/nvidia/src/kernel/platform/chipset/chipset_pcie.c objClInitPcieChipset",
        "a chipset-specific workaround setup returned an error; initialisation goes on (no return), GPUs work",
    ),
    (
        "*** Root Port Setup Function Error",
        "src/nvidia/src/kernel/platform/chipset/chipset_pcie.c objClInitPcieChipset",
        "the root port's workaround setup, the same way",
    ),
    (
        "Upstream port Setup Function Error",
        "src/nvidia/src/kernel/platform/chipset/chipset_pcie.c objClInitPcieChipset",
        "the upstream port's workaround setup, the same way",
    ),
    *(
        (
            f"Unable to read {register}",
            f"src/nvidia/src/kernel/gpu/bif/arch/{arch} kbifCacheVFInfo_{chip}",
            "caching the SR-IOV VF details (count, offset) for virtualisation; a config read that fails returns"
            " from the void function and nothing else uses them on a bare-metal or passthrough GPU",
        )
        for register, arch, chip in (
            ("NV_PF0_INITIAL_AND_TOTAL_VFS", "blackwell/kernel_bif_gb100.c", "GB100"),
            ("NV_PF0_VF_STRIDE_AND_OFFSET", "blackwell/kernel_bif_gb100.c", "GB100"),
            ("NV_EP_PCFG_GPU_SRIOV_INIT_TOT_VF", "hopper/kernel_bif_gh100.c", "GH100"),
            ("NV_EP_PCFG_GPU_SRIOV_FIRST_VF_STRIDE", "hopper/kernel_bif_gh100.c", "GH100"),
        )
    ),
)

_CONVERSION = re.compile(r"%[-+ #0]*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|L|z|j|t)?[a-zA-Z%]")
_WORD = re.compile(r"[A-Za-z0-9_']+")  # as RE2's \b splits words
_STRING = re.compile(r'"((?:[^"\\\n]|\\.)*)"')
_FMT_MACRO = re.compile(r"\b\w+_fmt([xXudo])\b")


@dataclass(frozen=True, kw_only=True)
class Site:
    level: str  # the most severe level the call can print at
    where: str  # path:line in the source tree
    text: str  # the format string as written in C (escapes kept)


def _level(raw: str) -> str:
    if not raw:
        return "ALWAYS"
    names = re.findall(r"\b(?:LEVEL|NV_DBG)_[A-Z]+\b", raw)
    for group in (ERROR_LEVELS, WARNING_LEVELS, INFO_LEVELS):
        for name in names:
            if name in group:
                return name
    return "UNKNOWN"


def _arguments(text: str, start: int) -> list[str] | None:
    """The comma-separated arguments of a call whose '(' ends just before ``start``."""
    depth, args, current, i, n = 0, [], [], start, len(text)
    while i < n:
        c = text[i]
        if c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            current.append(text[i : j + 1])
            i = j + 1
            continue
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if text.startswith("/*", i):
            j = text.find("*/", i)
            i = n if j < 0 else j + 2
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            if depth == 0:
                args.append("".join(current))
                return args
            depth -= 1
        elif c == "," and depth == 0:
            args.append("".join(current))
            current = []
            i += 1
            continue
        current.append(c)
        i += 1
    return None


def _format_text(argument: str) -> str:
    """Adjacent C string literals joined; NvU64_fmtx-style macros become their conversion letters."""
    argument = _FMT_MACRO.sub(lambda m: '"ll' + m.group(1) + '"', argument)
    return "".join(_STRING.findall(argument))


def extract(root: Path) -> tuple[list[Site], Counter[str]]:
    """Every print site under ``root`` (sorted by path and line) and the number of sites per level."""
    call = re.compile(r"\b(" + "|".join(sorted(CALLS, key=len, reverse=True)) + r")\s*\(")
    sites: list[Site] = []
    for directory, _dirs, files in sorted(os.walk(root)):
        for name in sorted(files):
            if not name.endswith((".c", ".h", ".cpp")):
                continue
            path = Path(directory) / name
            text = path.read_text(encoding="utf-8", errors="replace")
            for m in call.finditer(text):
                line_start = text.rfind("\n", 0, m.start()) + 1
                if text[line_start : m.start()].lstrip().startswith("#"):
                    continue  # the macro's own definition
                args = _arguments(text, m.end())
                levels, fmt = CALLS[m.group(1)]
                if args is None or fmt >= len(args):
                    continue
                fmt_text = _format_text(args[fmt])
                if not fmt_text:
                    continue
                level = _level(" ".join(args[k] for k in levels))
                where = f"{path.relative_to(root).as_posix()}:{text.count(chr(10), 0, m.start()) + 1}"
                sites.append(Site(level=level, where=where, text=fmt_text))
    return sites, Counter(s.level for s in sites)


def _words(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(_CONVERSION.sub(" ", text.replace("\\n", " ").replace("\\t", " ")))}


def relevant(site: Site) -> bool:
    return bool(_words(site.text) & set(LEXICON))


def write_extract(sites: Iterable[Site], totals: Counter[str], *, release: str) -> str:
    lines = [
        f"# NVIDIA/open-gpu-kernel-modules {release}: print sites whose text holds a word of LEXICON",
        "# totals\t" + " ".join(f"{level}={totals[level]}" for level in sorted(totals)),
        "# level\tpath:line\tformat string as written in C",
    ]
    lines += [f"{s.level}\t{s.where}\t{s.text}" for s in sites if relevant(s)]
    return "\n".join(lines) + "\n"


def read_extract(text: str) -> tuple[str, list[Site], Counter[str]]:
    release, totals, sites = "", Counter[str](), []
    for line in text.splitlines():
        if line.startswith("# NVIDIA/open-gpu-kernel-modules "):
            release = line.split()[2].rstrip(":")
        elif line.startswith("# totals\t"):
            totals = Counter({k: int(v) for k, v in (item.split("=") for item in line.split("\t")[1].split())})
        elif line and not line.startswith("#"):
            level, where, fmt = line.split("\t", 2)
            sites.append(Site(level=level, where=where, text=fmt))
    return release, sites, totals


def vocabulary(sites: list[Site]) -> list[tuple[str, int, int]]:
    """(word, error-level sites, informational sites) for each lexicon word the driver bears out."""
    errors: Counter[str] = Counter()
    infos: Counter[str] = Counter()
    for site in sites:
        words = _words(site.text)
        if site.level in ERROR_LEVELS:
            errors.update(words)
        elif site.level in INFO_LEVELS:
            infos.update(words)
    kept = []
    for word in sorted(LEXICON):
        e, i = errors[word], infos[word]
        if e >= MIN_ERROR_SITES and i <= MAX_INFO_SHARE * (e + i):
            kept.append((word, e, i))
    return kept


def _segments(text: str) -> list[str]:
    """The literal runs of a format string: between conversions and line breaks, outer blanks trimmed."""
    parts = _CONVERSION.split(text.replace("\\t", " "))
    runs = [s.strip(" .:,") for p in parts for s in p.split("\\n")]
    return [r for r in (re.sub(r"^NVRM\b:?", "", r).strip(" .:,") for r in runs) if r]


def tolerated(site: Site) -> bool:
    """Whether the pack keeps an error-level site silent because the driver carries on after it: its text says
    so (TOLERATED_TEXT) or it is one of TOLERATED_SITES."""
    text = _c_unescape(site.text)
    return TOLERATED_TEXT.search(text) is not None or any(phrase in text for phrase, _, _ in TOLERATED_SITES)


def informational_phrases(sites: list[Site], words: set[str]) -> tuple[list[str], list[Site]]:
    """Phrases that keep informational prints silent, and the informational sites left without one."""

    def says_it_carries_on(site: Site) -> bool:
        return TOLERATED_TEXT.search(_c_unescape(site.text)) is not None

    error_texts = [
        s.text for s in sites if (s.level in ERROR_LEVELS or s.level in WARNING_LEVELS) and not says_it_carries_on(s)
    ]
    phrases: set[str] = set()
    uncovered = []
    for site in sites:
        if not (site.level in INFO_LEVELS or says_it_carries_on(site)) or not (_words(site.text) & words):
            continue
        # The longest literal run, preferably one holding the vocabulary word; never one that an
        # error-level site also prints (it would silence a real failure).
        candidates = [s for s in _segments(site.text) if len(s) >= MIN_PHRASE and not any(s in t for t in error_texts)]
        if not candidates:
            uncovered.append(site)
            continue
        phrases.add(max(candidates, key=lambda s: (bool(_words(s) & words), len(s), s)))
    phrases.update(phrase for phrase, _ in CONTEXT_PHRASES)
    phrases.update(phrase for phrase, _, _ in TOLERATED_SITES)
    return sorted(phrases), uncovered


def _c_unescape(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), text)


def _re2_literal(text: str) -> str:
    return re.sub(r"([\\.^$|?*+()\[\]{}])", r"\\\1", _c_unescape(text))


def _yaml_quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


PHRASES_PER_RULE = 40  # keeps each pattern far below RE2's 2000-instruction limit


def generate(extract_text: str) -> str:
    release, sites, totals = read_extract(extract_text)
    vocab = vocabulary(sites)
    words = {w for w, _, _ in vocab}
    phrases, uncovered = informational_phrases(sites, words)
    error_total = sum(totals[level] for level in ERROR_LEVELS)
    error_covered = sum(1 for s in sites if s.level in ERROR_LEVELS and _words(s.text) & words)
    # Each word as the driver writes it (lower case, capitalised, upper case), spelled out rather than
    # matched with (?i) so that the matcher's prefilter looks for the words themselves: only lines
    # holding one are tried, not every NVRM line. A word shorter than the prefilter's 4 characters
    # carries the blank before it instead of the word boundary.
    spelled = {v for w in words for v in (w, w.capitalize(), w.upper())}
    alternation = "|".join(
        (r"\b" if len(w) >= 4 else " ") + re.escape(w) for w in sorted(spelled, key=lambda w: (-len(w), w))
    )
    out = [
        "# GENERATED by plugins/nvidia/generate_rules.py from plugins/nvidia/nvrm-print-sites.tsv: do not edit.",
        f"# NVIDIA/open-gpu-kernel-modules {release}: {sum(totals.values())} print sites, {error_total} at an",
        f"# error level; the failure vocabulary below appears in {error_covered} of them.",
        "#",
        "# The NVRM family: any driver line (NV_PRINTF 'NVRM: [GPU<n> ]<function>: ', NV_DEV_PRINTF",
        "# 'NVRM: GPU <pci>: ', nv_printf 'NVRM: ', and the 'NVRM <function>: ' form of the 515-525",
        "# releases) that no specific rule of nvidia-monitor.yaml understood, and that uses the driver's",
        "# failure vocabulary, is a warning Event: the driver does not say what the failure costs, so it",
        "# is not a node condition. Xid lines are left to the Xid rules. Informational prints that use a",
        "# vocabulary word anyway are recognised by a phrase of their own and stay silent, and so are the",
        "# error-level prints that say the driver carries on ('(non-fatal)', 'falling back to') and those",
        "# of code that carries on after them on healthy machines (generate_rules.TOLERATED_SITES).",
        "#",
        "# vocabulary (word: error-level sites / informational sites):",
    ]
    for i in range(0, len(vocab), 6):
        out.append("#   " + ", ".join(f"{w}: {e}/{n}" for w, e, n in vocab[i : i + 6]))
    out.append(f"# informational sites without a phrase of their own (they would be reported): {len(uncovered)}")
    for site in uncovered:
        out.append(f"#   {site.level} {site.where}")
    out += [
        "plugin: kmsg",
        "source: nvrm-family",
        "rules:",
        "  - name: nvidia/nvrm-failure",
        "    type: temporary",
        "    reason: NvidiaDriverError",
        "    severity: warning",
        "    fallback: true",
        "    provenance:",
        "      - 'NVIDIA/open-gpu-kernel-modules:src/nvidia/inc/libraries/utils/nvprintf.h: NV_PRINTF prefix"
        ' NV_PRINTF_PREFIX "NVRM" NV_PRINTF_PREFIX_SEPARATOR ": " (LEVEL_ERROR, LEVEL_FATAL sites)\'',
        "      - 'NVIDIA/open-gpu-kernel-modules:kernel-open/common/inc/os-interface.h: NV_DEV_PRINTF"
        ' "NVRM: GPU %04x:%02x:%02x.%x: " (NV_DBG_ERRORS sites)\'',
        "      - 'NVIDIA/open-gpu-kernel-modules:kernel-open/nvidia/*.c: nv_printf(NV_DBG_ERRORS, \"NVRM: ...\")'",
        f"      - 'plugins/nvidia/nvrm-print-sites.tsv: the {error_covered} error-level sites of {release} whose"
        " text uses the vocabulary'",
        "    pattern: " + _yaml_quote(rf"\bNVRM:? +(?:(?P<head>[^\s:]+)[^\n]*?)??(?P<failure>{alternation})\b.*"),
        "    where: {head: {notIn: [Xid]}}",
    ]
    for n, start in enumerate(range(0, len(phrases), PHRASES_PER_RULE)):
        chunk = phrases[start : start + PHRASES_PER_RULE]
        body = "|".join(_re2_literal(p) for p in chunk)
        out += [
            f"  - name: nvidia/nvrm-informational-{n + 1}",
            "    # Matches informational prints and stays quiet (the where filter never passes): a specific",
            "    # rule that matched keeps the family fallback silent for the line.",
            "    type: temporary",
            "    reason: NvidiaDriverInfo",
            "    severity: info",
            "    provenance:",
            f"      - 'plugins/nvidia/nvrm-print-sites.tsv: LEVEL_INFO, LEVEL_NOTICE, NV_DBG_INFO sites of {release}'",
            *[
                f"      - {_yaml_quote(f'NVIDIA/open-gpu-kernel-modules:{where}: {phrase}')}"
                for phrase, where in CONTEXT_PHRASES
                if phrase in chunk
            ],
            *[
                f"      - {_yaml_quote(f'NVIDIA/open-gpu-kernel-modules:{where}: {phrase} ({why})')}"
                for phrase, where, why in TOLERATED_SITES
                if phrase in chunk
            ],
            "    pattern: " + _yaml_quote(rf"\bNVRM:? +(?P<informational>)[^\n]*(?:{body}).*"),
            "    where: {informational: [never]}",
        ]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("extract", help="print sites of a source tree, as TSV on stdout")
    ex.add_argument("root", type=Path)
    ex.add_argument("--release", required=True, help="the driver release the tree is (e.g. 595.45.04)")
    gen = sub.add_parser("generate", help="the rule pack (YAML on stdout) from an extract")
    gen.add_argument("extract", type=Path)
    args = parser.parse_args(argv)
    if args.command == "extract":
        sites, totals = extract(args.root)
        sys.stdout.write(write_extract(sites, totals, release=args.release))
    else:
        sys.stdout.write(generate(args.extract.read_text()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
