"""The decoder (many concatenated kmsg records at once, in each mode) against parse_record (one at a time)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.core.columns import RecordColumns
from agent.core.types import LogRecord
from agent.sources.kmsg import decoder
from agent.sources.kmsg.decoder import Mode, decode, scan
from agent.sources.kmsg.format import KmsgParseError, parse_record

BOOT = 1_700_000_000.0

# Each case is one raw record (header line, maybe dictionary lines). Valid or not, parse_chunk must agree
# with parse_record on it: the same LogRecord, or the same error.
CASES = [
    ("plain", b"6,1,2000000,-;hello"),
    ("trailing newline", b"6,1,0,-;hello\n"),
    ("emergency", b"0,2,0,-;x"),
    ("error level", b"3,2,0,-;x"),
    ("userspace facility", b"12,348,165682670,-;hello"),
    ("daemon facility", b"30,2,0,-;x"),
    ("largest priority in the table", b"1023,2,0,-;x"),
    ("priority beyond the table", b"1024,2,0,-;x"),
    ("priority with a leading zero", b"06,2,0,-;x"),
    ("continuation flag", b"4,5,0,c;tail of a line"),
    ("'+' flag", b"4,5,0,+;x"),
    ("empty flags", b"4,5,0,;x"),
    ("caller id after the flags", b"6,7,0,-,caller=T42;msg"),
    ("caller id with a 'c' is no continuation", b"6,7,0,-,caller=C3,x;msg"),
    ("continuation with caller id", b"6,7,0,c,caller=T1;msg"),
    ("semicolon in the message", b"6,1,0,-;a;b"),
    ("commas in the message", b"6,1,0,-;a,b,c,d"),
    ("empty message", b"6,9,0,-;"),
    ("carriage return stays", b"6,9,0,-;dos line\r"),
    ("spaces stay", b"6,9,0,-;  padded  "),
    ("escapes", b"6,1,0,-;tab\\x09nl\\x0abs\\x5c"),
    ("uppercase hex escape", b"6,1,0,-;\\x4A"),
    ("invalid escapes stay literal", b"6,1,0,-;a\\xZZ b\\x4 c\\q d\\"),
    ("escaped backslash", b"6,1,0,-;\\x5cx41"),
    ("escaped UTF-8", b"6,1,0,-;caf\\xc3\\xa9"),
    ("escaped invalid UTF-8", b"6,1,0,-;\\xff!"),
    ("raw UTF-8", "6,1,0,-;caf\u00e9".encode()),
    ("raw invalid UTF-8", b"6,1,0,-;\xff\xfe!"),
    ("non-ASCII digit in seq", "6,\u0663,0,-;x".encode()),
    ("largest u64 seq", b"6,18446744073709551615,0,-;x"),
    ("20-digit numbers", b"6,99999999999999999999,99999999999999999999,-;x"),
    ("dictionary", b"3,8,0,-;Xid 79\n SUBSYSTEM=pci\n DEVICE=+pci:0000:10:1c.0\n"),
    ("dictionary value with '='", b"6,1,0,-;m\n K=a=b\n"),
    ("escaped dictionary", b"6,1,0,-;m\n K\\x3d=a\\x20b\\x0ac\n"),
    ("duplicate dictionary key", b"6,1,0,-;m\n K=1\n K=2\n"),
    ("orphan continuation line", b"3,1,0,-;Xid 79\n fell off the bus\n SUBSYSTEM=pci\n"),
    ("dictionary line without key", b"6,1,0,-;m\n =v\n K=v\n"),
    ("kernel-looking prefixes stay", b"6,1,0,-;[   12.345678] <3>kernel: NVRM: Xid 79"),
    # malformed headers
    ("no separator", b"6,1,0,-hello"),
    ("too few fields", b"6,1,0;x"),
    ("too few fields, commas later", b"6,1,0;x,y,z"),
    ("semicolon in the seq", b"6,1;2,3,4;x"),
    ("priority not a number", b"x,1,0,-;m"),
    ("signed priority", b"+6,1,0,-;m"),
    ("negative seq", b"6,-1,0,-;m"),
    ("empty seq", b"6,,0,-;m"),
    ("empty timestamp", b"6,1,,-;m"),
    ("underscore in seq", b"6,1_0,0,-;m"),
    ("padded seq", b"6, 1,0,-;m"),
    ("fractional timestamp", b"6,1,1.5,-;m"),
    ("21-digit seq", b"6,123456789012345678901,0,-;m"),
    ("21-digit seq with leading zeros", b"6,000000000000000000001,0,-;m"),
    ("garbage", b"garbage"),
    ("garbage with a dictionary line", b"garbage\n K=v\n"),
]


def reference(raws: list[bytes]) -> tuple[list[LogRecord], list[str]]:
    records, errors = [], []
    for raw in raws:
        try:
            records.append(parse_record(raw, boot_time=BOOT))
        except KmsgParseError as exc:
            errors.append(str(exc))
    return records, errors


def chunk_of(raws: list[bytes]) -> bytes:
    return b"".join(raw if raw.endswith(b"\n") else raw + b"\n" for raw in raws)


def assert_same(raws: list[bytes], data: bytes) -> None:
    parsed = decode(data, mode=Mode.FILE, boot_time=BOOT)
    expected_records, expected_errors = reference(raws)
    assert [repr(r) for r in parsed.records] == [repr(r) for r in expected_records]
    assert parsed.records == expected_records
    assert all(type(r) is LogRecord for r in parsed.records)
    assert [str(error) for _, error in parsed.errors] == expected_errors


@pytest.mark.parametrize("raw", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_parse_chunk_agrees_with_parse_record(raw: bytes) -> None:
    assert_same([raw], chunk_of([raw]))
    assert_same([raw], raw.rstrip(b"\n"))  # an unterminated last line is fine too


def test_all_cases_in_one_chunk_on_the_fast_and_the_general_path() -> None:
    raws = [c[1] for c in CASES]
    ascii_raws = [raw for raw in raws if raw.isascii()]
    assert len(ascii_raws) < len(raws)
    assert_same(ascii_raws, chunk_of(ascii_raws))  # ASCII: the fast path
    assert_same(raws, chunk_of(raws))  # not ASCII: the general path


def escape(data: bytes) -> bytes:
    return b"".join(bytes([c]) if 32 <= c < 127 and c != 0x5C else b"\\x%02x" % c for c in data)


_record = st.builds(
    lambda prio, seq, usec, flags, message, fields, raw_utf8: (
        f"{prio},{seq},{usec},{flags};".encode()
        + (message.encode() if raw_utf8 else escape(message.encode()))
        + b"".join(b"\n " + escape(k.encode()) + b"=" + escape(v.encode()) for k, v in fields.items())
    ),
    prio=st.integers(0, 2000),
    seq=st.integers(0, 2**64 - 1),
    usec=st.integers(0, 2**64 - 1),
    flags=st.sampled_from(["-", "c", "+", "", "-,caller=T1", "c,caller=C2"]),
    message=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n"), max_size=40),
    fields=st.dictionaries(st.text("ABC_", min_size=1, max_size=5), st.text(max_size=10), max_size=2),
    raw_utf8=st.booleans(),
)
_broken = st.sampled_from([c[1] for c in CASES if c[0] in ("garbage", "no separator", "negative seq", "empty seq")])


@settings(deadline=None)  # no per-example time limit: the machine is shared
@given(raws=st.lists(st.one_of(_record, _record, _broken), max_size=12))
def test_parse_chunk_agrees_with_parse_record_on_random_records(raws: list[bytes]) -> None:
    assert_same(raws, chunk_of(raws))


_device_record = st.builds(
    lambda prio, usec, flags, message, fields: (prio, usec, flags, message, fields),
    prio=st.integers(0, 1023),
    usec=st.integers(0, 2**64 - 1),
    flags=st.sampled_from(["-", "c", "+", "-,caller=T1"]),
    message=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n"), max_size=40),
    fields=st.dictionaries(st.text("ABC_", min_size=1, max_size=5), st.text(max_size=10), max_size=2),
)


@settings(deadline=None)  # no per-example time limit: the machine is shared
@given(
    records=st.lists(_device_record, min_size=1, max_size=12),
    first=st.integers(0, 2**64 - 20),
    jump=st.one_of(st.none(), st.integers(0, 11)),
    broken=st.one_of(st.none(), st.tuples(st.integers(0, 12), _broken)),
)
def test_the_devices_reads_as_columns_are_the_records_parse_chunk_makes(records, first, jump, broken) -> None:
    """The device's way (messages scanned alone, numbers from the ends) gives parse_chunk's records for any
    chunk it takes, with or without a jump in the numbers, dictionary lines or a broken line; what it does not
    take (None) goes to parse_chunk."""
    raws = []
    seq = first
    for i, (prio, usec, flags, message, fields) in enumerate(records):
        if i == jump:
            seq += 3
        raws.append(
            f"{prio},{seq},{usec},{flags};".encode()
            + escape(message.encode())
            + b"".join(b"\n " + escape(k.encode()) + b"=" + escape(v.encode()) for k, v in fields.items())
        )
        seq += 1
    if broken is not None:
        raws.insert(min(broken[0], len(raws)), broken[1])
    data = chunk_of(raws)
    expected = decode(data, mode=Mode.FILE, boot_time=BOOT)
    # The kernel's own device formats every line: its way checks the two ends only, so a broken line is put
    # at one of them for it (a line in between would be the kernel's bug).
    at_an_end = broken is None or broken[0] == 0 or broken[0] >= len(raws) - 1
    for kernel in (False, True) if at_an_end else (False,):
        columns = scan(data, boot_time=BOOT, mode=Mode.KERNEL_DEVICE if kernel else Mode.OTHER_DEVICE)
        if columns is None:
            assert broken is not None or not data.isascii()  # only a line the scan cannot take refuses the chunk
            continue
        assert not expected.errors and list(columns) == expected.records
        assert list(columns.seqs) == [r.seq for r in expected.records]
        assert list(columns.timestamps) == [r.timestamp for r in expected.records]
        assert list(columns.messages) == [r.message for r in expected.records]
        if columns.raw_lines is not None:  # the kernel's lines as they are: every message in its line
            assert kernel and columns.raw_lines == data
            assert all(m in line for m, line in zip(columns.messages, data.decode().splitlines(), strict=True))


def reference_positions(raws: list[bytes]) -> list[int]:
    """For each record the reference parser refuses: how many records it made before."""
    positions, made = [], 0
    for raw in raws:
        try:
            parse_record(raw, boot_time=BOOT)
        except KmsgParseError:
            positions.append(made)
        else:
            made += 1
    return positions


@pytest.mark.parametrize("mode", list(Mode), ids=[mode.value for mode in Mode])
@settings(deadline=None)  # no per-example time limit: the machine is shared
@given(
    records=st.lists(_device_record, min_size=1, max_size=12),
    first=st.integers(0, 2**64 - 20),
    jump=st.one_of(st.none(), st.integers(0, 11)),
    broken=st.one_of(st.none(), st.tuples(st.integers(0, 12), _broken)),
)
def test_each_mode_decodes_what_the_reference_parses(mode: Mode, records, first, jump, broken) -> None:
    """Every mode of the one decoder, fast path or not, gives the records and errors parse_record gives for
    each record of a chunk read that way: the device's reads, a file's records (the relay's chunks are
    decoded in the mode of what the relay read)."""
    raws = []
    seq = first
    for i, (prio, usec, flags, message, fields) in enumerate(records):
        seq += 3 if i == jump else 0
        raws.append(
            f"{prio},{seq},{usec},{flags};".encode()
            + escape(message.encode())
            + b"".join(b"\n " + escape(k.encode()) + b"=" + escape(v.encode()) for k, v in fields.items())
        )
        seq += 1
    if broken is not None:  # the kernel's own device formats every line: a broken one only at an end
        at = broken[0] if mode is not Mode.KERNEL_DEVICE else 0 if broken[0] % 2 else len(raws)
        raws.insert(min(at, len(raws)), broken[1])
    decoded = decode(chunk_of(raws), mode=mode, boot_time=BOOT)
    expected_records, expected_errors = reference(raws)
    assert list(decoded.records) == expected_records and all(type(r) is LogRecord for r in decoded.records)
    columns = RecordColumns.of(decoded.records)  # what the main loop reads in place of the records
    assert list(columns.seqs) == [r.seq for r in expected_records]
    assert list(columns.timestamps) == [r.timestamp for r in expected_records]
    assert list(columns.messages) == [r.message for r in expected_records]
    assert [str(error) for _, error in decoded.errors] == expected_errors
    assert [before for before, _ in decoded.errors] == reference_positions(raws)
    assert not decoded.bad_lines


@settings(deadline=None)  # no per-example time limit: the machine is shared
@given(data=st.binary(max_size=300))
def test_parse_chunk_only_reports_never_raises(data: bytes) -> None:
    parsed = decode(data, mode=Mode.FILE, boot_time=BOOT)
    assert all(type(r) is LogRecord for r in parsed.records)
    assert all(isinstance(e, KmsgParseError) for _, e in parsed.errors)


def test_errors_say_where_they_were_and_the_seq_when_known() -> None:
    data = (
        b" ORPHAN=dictionary line before any header\n"
        b" MORE=of the same\n"
        b"6,1,0,-;a\n"
        b"x,2,0,-;bad priority\n"
        b" K=v\n"  # belongs to the skipped record: not reported again
        b"6,3,0,-;c\n"
        b"garbage\n"
        b"6,4,0,-;d\n no-equals-sign\n K=v\n"
    )
    parsed = decode(data, mode=Mode.FILE, boot_time=BOOT)
    assert [(r.seq, dict(r.fields)) for r in parsed.records] == [(1, {}), (3, {}), (4, {"K": "v"})]
    assert [(before, error.seq) for before, error in parsed.errors] == [(0, None), (1, 2), (2, None)]
    assert "dictionary line without a record header" in str(parsed.errors[0][1])
    assert len(parsed.bad_lines) == 1 and "no-equals-sign" in str(parsed.bad_lines[0])


@pytest.mark.parametrize("data", [b"", b"\n", b"\n\n\n", b"   \n"])
def test_blank_input(data: bytes) -> None:
    parsed = decode(data, mode=Mode.FILE, boot_time=BOOT)
    assert parsed.records == []
    assert len(parsed.errors) == (1 if data.strip(b"\n") else 0)  # "   " is a dictionary line without header


def test_dictionary_lines_go_to_their_own_record() -> None:
    parsed = decode(b"6,1,0,-;a\n A=1\n6,2,0,-;b\n6,3,0,-;c\n C=3\n", mode=Mode.FILE, boot_time=BOOT)
    assert [dict(r.fields) for r in parsed.records] == [{"A": "1"}, {}, {"C": "3"}]
    assert len({id(r.fields) for r in parsed.records}) == 3


def test_records_are_real_frozen_log_records() -> None:
    record = decode(b"6,1,0,-;a\n", mode=Mode.FILE, boot_time=BOOT).records[0]
    assert type(record) is LogRecord
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.message = "changed"  # type: ignore[misc]
    assert record == parse_record(b"6,1,0,-;a", boot_time=BOOT)


def _well_formed(raw: bytes) -> bool:
    try:
        parse_record(raw, boot_time=BOOT)
    except KmsgParseError:
        return False
    dictionary = raw.rstrip(b"\n").split(b"\n")[1:]
    return (
        raw.isascii()
        and raw.split(b",", 1)[0].decode() in decoder._PRIORITIES
        and all(b"=" in line[2:] for line in dictionary)  # every line KEY=value, the key not empty
    )


def test_a_chunk_of_well_formed_records_takes_the_one_scan_and_agrees() -> None:
    """The columns (one scan, records built when asked for) are taken for records with dictionaries,
    escapes, caller ids, and give what parse_record gives, column by column and record by record; one line
    they cannot take sends the chunk to the per-line code, which agrees too."""
    raws = [raw for _, raw in CASES if _well_formed(raw)]
    assert len(raws) > 20
    data = chunk_of(raws)
    columns = scan(data, boot_time=BOOT, mode=Mode.FILE)
    expected = reference(raws)[0]
    assert columns is not None and list(columns) == expected and columns == expected
    assert list(columns.messages) == [r.message for r in expected]
    assert columns.timestamps == [r.timestamp for r in expected] and columns.seqs == [r.seq for r in expected]
    assert columns[3:7] == expected[3:7] and columns[-1] == expected[-1]
    assert_same(raws, data)
    for odd in (b"06,2,0,-;x", b"1024,2,0,-;x", b"6,1,0;x", b"6,1,0,-;m\n =v", b""):
        mixed = chunk_of([*raws[:3], odd, *raws[3:]]) if odd else chunk_of(raws[:3]) + b"\n" + chunk_of(raws[3:])
        assert scan(mixed, boot_time=BOOT, mode=Mode.FILE) is None
        assert_same([*raws[:3], odd, *raws[3:]] if odd else raws, mixed)
    for between in (b"\n\n", b"\n K=v\n", b"\n 6,1,0,-;x\n"):  # blank lines; a dictionary line after one
        mixed = chunk_of(raws[:3]) + between + chunk_of(raws[3:])
        assert scan(mixed, boot_time=BOOT, mode=Mode.FILE) is None  # the per-line code decides


def test_a_chunk_of_record_lines_takes_the_message_scan_and_agrees() -> None:
    """Without dictionary lines the scan takes each message alone and a record's other fields are read from
    its line when asked for: the same records, columns and slices; one line it cannot take sends the chunk
    to the per-line code."""
    raws = [raw for _, raw in CASES if _well_formed(raw) and b"\n " not in raw.rstrip(b"\n")]
    assert len(raws) > 20
    data = chunk_of(raws)
    expected = reference(raws)[0]
    # The device's way too (the cases' numbers are not consecutive: each is read), and the kernel device's.
    for mode in (Mode.FILE, Mode.OTHER_DEVICE, Mode.KERNEL_DEVICE):
        columns = scan(data, boot_time=BOOT, mode=mode)
        assert columns is not None and list(columns) == expected and columns == expected
        assert list(columns.messages) == [r.message for r in expected]
        assert columns.timestamps == [r.timestamp for r in expected] and columns.seqs == [r.seq for r in expected]
        assert columns[3:7] == expected[3:7] and columns[-1] == expected[-1] and columns[::-2] == expected[::-2]
        assert list(columns.timestamps[2:5]) == [r.timestamp for r in expected[2:5]]
    for odd in (b"06,2,0,-;x", b"1024,2,0,-;x", b"6,1,0;x", b"garbage", b""):
        mixed = chunk_of([*raws[:3], odd, *raws[3:]]) if odd else chunk_of(raws[:3]) + b"\n" + chunk_of(raws[3:])
        assert scan(mixed, boot_time=BOOT, mode=Mode.OTHER_DEVICE) is None
        assert_same([*raws[:3], odd, *raws[3:]] if odd else raws, mixed)
        for ends in (chunk_of([odd, *raws]), chunk_of([*raws, odd])):  # the kernel's way checks the two ends
            assert scan(ends, boot_time=BOOT, mode=Mode.KERNEL_DEVICE) is None


@pytest.mark.parametrize(
    ("lines", "raw_lines"),
    [
        ([b"6,1,5,-;NVRM: Xid (PCI:0000:10:1c): 79", b"4,2,6,-,caller=T12;  spaced  "], True),
        ([b"6,1,5,-;a tab\\x09in it", b"6,2,6,-;b"], False),  # an escape: messages unescaped, no raw lines
        ([b"6,1,5,-;back\\x5cslash", b"6,2,6,-;b"], False),
        ([b"6,1,5,-;a", b" SUBSYSTEM=pci", b"6,2,6,-;b"], False),  # a dictionary line: every field scanned
        ([b"6,1,5,-;", b"6,2,6,c;b"], True),  # an empty message, a continuation
    ],
    ids=["plain", "escaped-tab", "escaped-backslash", "dictionary", "empty-message"],
)
def test_the_kernels_own_lines_are_what_the_prefilter_scans_where_nothing_is_escaped(lines, raw_lines) -> None:
    """Reads of the kernel's /dev/kmsg: a chunk without escapes and dictionary lines is its own ``raw_lines``
    (every message verbatim in its line); any other chunk gives the messages as parse_chunk does."""
    data = b"\n".join(lines) + b"\n"
    columns = scan(data, boot_time=BOOT, mode=Mode.KERNEL_DEVICE)
    assert columns is not None and list(columns) == decode(data, mode=Mode.FILE, boot_time=BOOT).records
    assert columns.raw_lines == (data if raw_lines else None)


@pytest.mark.parametrize(
    ("seqs", "device", "from_the_ends"),
    [
        ([5, 6, 7, 8], True, True),
        ([7], True, True),
        ([5, 6, 7, 8], False, False),  # not the device's reads: every number is read
        ([5, 6, 9, 10], True, False),  # a jump (the device reports one with EPIPE): every number is read
        ([5, 9, 10], True, False),
    ],
)
def test_the_devices_reads_are_numbered_from_their_first_and_last_record(seqs, device, from_the_ends) -> None:
    data = chunk_of([b"6,%d,%d,-;m%d" % (seq, seq * 10, seq) for seq in seqs])
    columns = scan(data, boot_time=BOOT, mode=Mode.OTHER_DEVICE if device else Mode.FILE)
    assert columns is not None and isinstance(columns.seqs, range) is from_the_ends
    assert list(columns.seqs) == seqs and [r.seq for r in columns] == seqs
    assert columns.timestamps == [BOOT + seq * 10 / 1e6 for seq in seqs]


def test_the_fast_parser_knows_every_log_record_field() -> None:
    """The fast path stores every LogRecord field itself: a new field must be added there too."""
    assert tuple(f.name for f in dataclasses.fields(LogRecord)) == decoder._RecordSlots.__slots__
    assert not hasattr(LogRecord, "__post_init__")


PREFIXED = [
    "[   12.345678] NVRM: Xid (PCI:0000:10:1c): 79",
    "<3>NVRM: Xid (PCI:0000:10:1c): 79",
    "kernel: [ 1.000000] EXT4-fs error",
    "Jan  1 00:00:00 ip-10-0-0-1 kernel: watchdog: BUG: soft lockup",
    "kern  :err   : [Mon Jan  1 00:00:00 2024] oops",
    "  leading and trailing spaces  ",
    "ends with a backslash \\",
]


@pytest.mark.parametrize("message", PREFIXED)
def test_the_message_is_never_altered(message: str) -> None:
    raw = b"6,1,0,-;" + escape(message.encode())
    assert parse_record(raw, boot_time=BOOT).message == message
    assert [r.message for r in decode(raw + b"\n", mode=Mode.FILE, boot_time=BOOT).records] == [message]
