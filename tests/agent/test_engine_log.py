"""Reading an engine log in chunks from an offset (what `fabricctl ai logs -f` follows)."""

from __future__ import annotations

from agent.vm.engine_log import read_chunk


def test_tail_then_follow_from_next_offset(tmp_path):
    log = tmp_path / "r.log"
    log.write_bytes(b"line one\nline two\n")
    tail = read_chunk(log, -9, 1000)
    assert (tail.text, tail.offset, tail.next_offset, tail.size) == ("line two\n", 9, 18, 18)
    assert read_chunk(log, tail.next_offset, 1000).text == ""
    with open(log, "ab") as f:
        f.write(b"line \xff three\n")
    more = read_chunk(log, tail.next_offset, 6)
    assert more.text == "line \ufffd" and more.next_offset == 24  # bounded, a bad byte does not fail
    assert read_chunk(log, -1000, 1000).offset == 0 and read_chunk(log, 10**9, 10).text == ""
