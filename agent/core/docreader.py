"""The bounded reader of configuration documents: what a file may be before it is parsed.

Every configuration file the agent reads (rule packs, log monitors, ``checks:`` files, NPD plugin
files, the recovery policy) comes through here, at start and on every reload. A file is refused,
with a :class:`Refused` naming the reason and (where known) the line, when it is:

- not a regular file: a FIFO, a device (``/dev/zero``), a socket. A symlink to a regular file is
  fine (a mounted ConfigMap is symlinks). Opening never blocks (``O_NONBLOCK``: a FIFO with no
  writer), and the type is checked again on the open file;
- larger than :data:`MAX_FILE_BYTES`; never more than that plus one byte is read, so a file that
  grows while read (or lies about its size) costs no more;
- a document of more than :data:`MAX_NODES` nodes counting every alias as the nodes it stands for,
  nested more than :data:`MAX_DEPTH` levels deep, or with an alias inside the node it names (a
  recursive document).

YAML anchors and aliases stay allowed (the built-in NVIDIA pack shares one Xid pattern across its
rules with them): what is bounded is what they expand to, so a "billion laughs" file of a few
hundred bytes is refused at the alias that crosses the bound. The bounds are checked on the parser's
event stream before anything is built, so a refused file costs the scan up to the bound and no
more; only a file within them is composed (with line numbers) and constructed. libyaml's C parser
(``yaml.CSafeLoader``) is used where PyYAML has it, the pure-Python one otherwise.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import yaml

MAX_FILE_BYTES = 1 << 20  # 1 MiB; the largest built-in pack is 24 KiB
MAX_NODES = 20_000  # per document, aliases expanded; the largest built-in pack has 683
MAX_DEPTH = 32  # mappings and lists inside each other; the built-in packs go 6 deep
# All the configuration together (plugin directories and --config files, agent.core.configfiles):
MAX_FILES = 1_000
MAX_TOTAL_BYTES = 8 << 20  # 8 MiB
MAX_TOTAL_NODES = 100_000
# Plugin directories (agent.core.configdoc.discover):
MAX_DIR_ENTRIES = 10_000  # entries of one directory, of any kind
MAX_DIR_DEPTH = 16  # directories below a plugin directory

LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class Refused(Exception):
    """A file or document outside the bounds; ``message`` says why, ``line`` where (1-based)."""

    def __init__(self, message: str, *, line: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.line = line


def _not_regular(mode: int) -> Refused | None:
    if stat.S_ISREG(mode):
        return None
    what = next((text for test, text in _KINDS if test(mode)), "not a regular file")
    return Refused(f"is {what}: configuration files must be regular files (a symlink to one is fine)")


def _too_large(size: int | None, limit: int) -> Refused:
    got = f"is {size:,} bytes" if size is not None else "is larger than that"
    return Refused(f"{got}: a configuration file may be at most {limit:,} bytes ({limit / (1 << 20):g} MiB)")


def not_a_regular_file(path: Path) -> str | None:
    """Why ``path`` cannot be a configuration file, found without opening it ("no such file", "is a
    FIFO ..."), or None. For the command line's early checks; reading checks again."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "no such file"
    except OSError as exc:
        return exc.strerror[:1].lower() + exc.strerror[1:] if exc.strerror else str(exc)
    refused = _not_regular(mode)
    return refused.message if refused is not None else None


def read_config_bytes(path: Path, *, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes. Raises Refused, or OSError (e.g. missing)."""
    before = os.stat(path)  # follows symlinks; refuse a FIFO before opening it
    refused = _not_regular(before.st_mode)
    if refused is not None:
        raise refused
    if before.st_size > limit:
        raise _too_large(before.st_size, limit)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        refused = _not_regular(os.fstat(fd).st_mode)  # swapped between the stat and the open
        if refused is not None:
            raise refused
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        raise _too_large(None, limit)  # grew after the stat
    return data


def _over(*, aliased: bool, line: int | None) -> Refused:
    extra = " counting what its aliases stand for" if aliased else ""
    return Refused(
        f"the document has more than {MAX_NODES:,} nodes{extra}: a configuration file may hold at most {MAX_NODES:,}",
        line=line,
    )


def scan_yaml(text: str) -> int:
    """The number of nodes of the YAML stream ``text``, aliases expanded. Raises Refused past a bound,
    yaml.YAMLError for a syntax error. Builds nothing: one pass over the parser's events."""
    nodes = 0
    open_anchors: list[str | None] = []  # the anchor of each collection being read (None: none)
    starts: list[int] = []  # ``nodes`` before each open collection
    sizes: dict[str, int] = {}  # anchor -> the nodes its node stands for
    aliased = False
    for event in yaml.parse(text, Loader=LOADER):
        line = event.start_mark.line + 1 if event.start_mark is not None else None
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in open_anchors:
                raise Refused(f"alias *{event.anchor} is inside the node it names (a recursive document)", line=line)
            aliased = True
            nodes += sizes.get(event.anchor or "", 1)  # an unknown anchor: the composer reports it
        elif isinstance(event, yaml.ScalarEvent):
            nodes += 1
            if event.anchor is not None:
                sizes[event.anchor] = 1
        elif isinstance(event, yaml.CollectionStartEvent):
            if len(starts) >= MAX_DEPTH:
                raise Refused(f"nested more than {MAX_DEPTH} levels deep", line=line)
            starts.append(nodes)
            open_anchors.append(event.anchor)
            nodes += 1
        elif isinstance(event, yaml.CollectionEndEvent):
            anchor = open_anchors.pop()
            start = starts.pop()
            if anchor is not None:
                sizes[anchor] = nodes - start
        if nodes > MAX_NODES:
            raise _over(aliased=aliased, line=line)
    return nodes


def _first_clause(exc: Exception) -> str:
    """The reason without Python's advice ("...; use sys.set_int_max_str_digits() to ...")."""
    text = str(exc).split(";")[0]
    return text[:1].lower() + text[1:]


def load_yaml(text: str) -> tuple[object, yaml.Node | None, int]:
    """(data, the composed root node or None for an empty document, node count) of a bounded YAML document.

    Raises Refused (a bound, or a value the constructor cannot hold) or yaml.YAMLError."""
    nodes = scan_yaml(text)
    loader = LOADER(text)
    try:
        root = loader.get_single_node()
        try:
            data = loader.construct_document(root) if root is not None else None
        except (ValueError, OverflowError) as exc:  # e.g. an integer of more than 4300 digits
            raise Refused(f"invalid YAML: {_first_clause(exc)}") from None
    finally:
        loader.dispose()
    return data, root, nodes


def compose_yaml(text: str) -> yaml.Node | None:
    """The composed root node of a bounded YAML document (for line numbers); the errors of :func:`load_yaml`."""
    scan_yaml(text)
    loader = LOADER(text)
    try:
        return loader.get_single_node()
    finally:
        loader.dispose()


def load_json(text: str) -> tuple[object, int]:
    """(data, node count) of a bounded JSON document. Raises Refused or json.JSONDecodeError."""
    try:
        data = json.loads(text)
    except RecursionError:
        raise Refused(f"nested more than {MAX_DEPTH} levels deep") from None
    except json.JSONDecodeError:
        raise
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise Refused(f"invalid JSON: {_first_clause(exc)}") from None
    nodes, stack = 0, [(data, 1)]
    while stack:  # no recursion: the shape is not known to be bounded yet
        value, depth = stack.pop()
        nodes += 1
        if isinstance(value, dict | list) and depth > MAX_DEPTH:
            raise Refused(f"nested more than {MAX_DEPTH} levels deep")
        if isinstance(value, dict):
            nodes += len(value)  # keys are nodes too, as in YAML
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)
        if nodes > MAX_NODES:
            raise _over(aliased=False, line=None)
    return data, nodes
