"""Line splitting, prefixes, per-rank files and the console filter (pipes, no processes)."""
import io
import os

import pytest

from accord.run.processes.output import LineSplitter, OutputMux, format_line
from accord.run.processes.rank_files import rank_dirname


def _feed(chunks):
    s = LineSplitter()
    lines = []
    for c in chunks:
        lines += s.feed(c)
    return lines, s.close()


def test_lines_newlines_and_partial_last_line():
    assert _feed([b"a\nb", b"c\n", b"tail"]) == (["a", "bc"], ["tail"])
    assert _feed([b"\n\n"]) == (["", ""], [])


def test_utf8_character_split_across_reads():
    snow = "\u2603".encode()
    assert _feed([b"x" + snow[:1], snow[1:2], snow[2:] + b"\n"]) == (["x\u2603"], [])
    assert _feed([b"bad \xff\n"]) == (["bad \ufffd"], [])


def test_carriage_returns_redraws_and_crlf_split_across_reads():
    assert _feed([b"\r10%\r20%\r", b"\n"]) == (["10%", "20%"], [])
    assert _feed([b"a\r", b"\nb\r\n"]) == (["a", "b"], [])
    assert _feed([b"p1\rp2\r"]) == (["p1"], ["p2"])  # a trailing \r waits for a possible \n


def test_format_line_prefix_and_timestamp():
    assert format_line(3, "stderr", "boom") == "[3]<stderr>:boom\n"
    assert format_line(0, "stdout", "x", prefix=False) == "x\n"
    stamped = format_line(1, "stdout", "x", timestamp=0.5)
    assert stamped.endswith(".500 [1]<stdout>:x\n") and stamped[:2] in ("19", "20")


@pytest.mark.timeout(20)
def test_mux_routes_prefixes_files_filter_and_tail(tmp_path):
    out, err = io.BytesIO(), io.BytesIO()
    mux = OutputMux(out, err, ranks_filter=[1], output_dir=str(tmp_path), tail_lines=2)
    writers = {}
    for rank in (0, 1):
        r_out, w_out = os.pipe()
        r_err, w_err = os.pipe()
        writers[rank] = (w_out, w_err)
        mux.add(rank, os.fdopen(r_out, "rb", buffering=0), os.fdopen(r_err, "rb", buffering=0))
    mux.start()
    for rank, (w_out, w_err) in writers.items():
        os.write(w_out, f"hello {rank}\npartial {rank}".encode())
        os.write(w_err, f"e1\ne2\ne3 {rank}\n".encode())
        os.close(w_out)
        os.close(w_err)
    assert mux.wait_rank(0, 5) and mux.wait_rank(1, 5)
    mux.close(timeout=5)
    assert out.getvalue().decode() == "[1]<stdout>:hello 1\n[1]<stdout>:partial 1\n"
    assert err.getvalue().decode() == "[1]<stderr>:e1\n[1]<stderr>:e2\n[1]<stderr>:e3 1\n"
    assert mux.stderr_tail(0) == ["e2", "e3 0"]
    for rank in (0, 1):  # files: every rank, raw bytes, no prefixes
        assert (tmp_path / f"rank.{rank}" / "stdout").read_bytes() == f"hello {rank}\npartial {rank}".encode()
        assert (tmp_path / f"rank.{rank}" / "stderr").read_bytes() == f"e1\ne2\ne3 {rank}\n".encode()


@pytest.mark.timeout(20)
def test_mux_close_gives_up_on_a_pipe_held_open():
    out = io.BytesIO()
    mux = OutputMux(out, None)
    r, w = os.pipe()
    mux.add(0, os.fdopen(r, "rb", buffering=0), None)
    mux.start()
    os.write(w, b"still open")
    assert not mux.wait_rank(0, 0.3)
    mux.close(timeout=0.2)  # must return although the writer never closed
    os.close(w)
    assert out.getvalue() == b"[0]<stdout>:still open\n"


@pytest.mark.parametrize("rank, size, name", [(0, 1, "rank.0"), (9, 10, "rank.9"), (3, 11, "rank.03"),
                                              (10, 11, "rank.10"), (7, 101, "rank.007")])
def test_rank_folders_are_zero_padded_like_horovodrun(rank, size, name):
    # horovodrun pads to int(log10(size - 1)) + 1 digits; computed here independently
    import math

    assert name == f"rank.{str(rank).zfill(int(math.log10(max(size - 1, 1))) + 1)}"
    assert rank_dirname(rank, size) == name


@pytest.mark.timeout(20)
def test_mux_writes_padded_rank_folders_for_the_job_size(tmp_path):
    mux = OutputMux(None, None, output_dir=str(tmp_path), size=12)
    r_out, w_out = os.pipe()
    mux.add(4, os.fdopen(r_out, "rb", buffering=0), None)
    mux.start()
    os.write(w_out, b"four\n")
    os.close(w_out)
    assert mux.wait_rank(4, 5)
    mux.close(timeout=5)
    assert sorted(os.listdir(tmp_path)) == ["rank.04"]
    assert (tmp_path / "rank.04" / "stdout").read_bytes() == b"four\n"
