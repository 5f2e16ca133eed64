"""Output, per-rank and timeline files are not written through links another user planted in
the folder (a job run as root would overwrite the file the link points at)."""
import io
import os

import pytest

from accord.engine.cycle.timeline import Timeline
from accord.errors import ConfigError
from accord.owned_files import open_for_writing
from accord.run.processes.console_tee import ConsoleTee
from accord.run.processes.output import OutputMux

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def victim(tmp_path):
    path = tmp_path / "victim"
    path.write_text("precious\n")
    return path


def _unchanged(victim):
    return victim.read_text() == "precious\n"


def test_a_new_file_and_its_folders_are_created_and_an_old_one_is_truncated(tmp_path):
    with open_for_writing(str(tmp_path), ["rank.0", "stdout"], "--output-filename") as f:
        f.write(b"first, longer text\n")
    with open_for_writing(str(tmp_path), ["rank.0", "stdout"], "--output-filename") as f:
        f.write(b"second\n")
    assert (tmp_path / "rank.0" / "stdout").read_bytes() == b"second\n"


def test_a_symlinked_file_is_refused_and_its_target_left_alone(tmp_path, victim):
    (tmp_path / "out" / "rank.0").mkdir(parents=True)
    (tmp_path / "out" / "rank.0" / "stdout").symlink_to(victim)
    with pytest.raises(ConfigError) as info:
        open_for_writing(str(tmp_path / "out"), ["rank.0", "stdout"], "--output-filename")
    text = str(info.value)
    assert f"--output-filename: {tmp_path / 'out' / 'rank.0' / 'stdout'} is a symbolic link" in text
    assert "HINT:" in text and _unchanged(victim)


def test_a_symlinked_folder_is_refused(tmp_path, victim):
    (tmp_path / "out").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "stdout").symlink_to(victim)  # not even reached
    (tmp_path / "out" / "rank.0").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match=r"rank\.0 is a symbolic link"):
        open_for_writing(str(tmp_path / "out"), ["rank.0", "stdout"], "--output-filename")
    assert _unchanged(victim) and not (tmp_path / "elsewhere" / "x").exists()


def test_a_hard_link_a_fifo_and_a_folder_are_refused_at_once(tmp_path, victim):
    os.link(victim, tmp_path / "linked")
    with pytest.raises(ConfigError, match="has 2 hard links"):
        open_for_writing(str(tmp_path), ["linked"], "x")
    assert _unchanged(victim)
    os.mkfifo(tmp_path / "fifo")  # no reader: a blocking open would wait forever
    with pytest.raises(ConfigError, match="is not a regular file"):
        open_for_writing(str(tmp_path), ["fifo"], "x")
    (tmp_path / "folder").mkdir()
    with pytest.raises(ConfigError, match="is not a regular file"):
        open_for_writing(str(tmp_path), ["folder"], "x")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")
def test_a_file_or_folder_of_another_user_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.write_text("")
    os.chown(theirs, 12345, 12345)
    with pytest.raises(ConfigError, match="is owned by uid 12345"):
        open_for_writing(str(tmp_path), ["theirs"], "x")
    (tmp_path / "rank.1").mkdir()
    os.chown(tmp_path / "rank.1", 12345, 12345)
    with pytest.raises(ConfigError, match=r"rank\.1 is owned by uid 12345"):
        open_for_writing(str(tmp_path), ["rank.1", "stdout"], "x")


def test_the_launchers_per_rank_files_refuse_a_planted_link(tmp_path, victim):
    (tmp_path / "rank.0").mkdir()
    (tmp_path / "rank.0" / "stderr").symlink_to(victim)
    mux = OutputMux(io.BytesIO(), io.BytesIO(), output_dir=str(tmp_path), size=1)
    r, w = os.pipe()
    with os.fdopen(r, "rb") as out, os.fdopen(w, "wb"):
        with pytest.raises(ConfigError, match="stderr is a symbolic link"):
            mux.add(0, out, out)
    assert _unchanged(victim)


def test_spawns_per_rank_files_refuse_a_planted_link(tmp_path, victim):
    (tmp_path / "rank.0").mkdir()
    (tmp_path / "rank.0" / "stdout").symlink_to(victim)
    with pytest.raises(ConfigError, match="stdout is a symbolic link"):
        ConsoleTee(str(tmp_path / "rank.0")).close()
    assert _unchanged(victim)


def test_the_timeline_refuses_a_planted_link(tmp_path, victim):
    (tmp_path / "timeline.json").symlink_to(victim)
    with pytest.raises(ConfigError, match="the timeline file: .*timeline.json is a symbolic link"):
        Timeline(str(tmp_path / "timeline.json"))
    assert _unchanged(victim)
