"""Per-rank output files: horovodrun's ``--output-filename`` layout.

The folder of rank ``r`` in a job of ``size`` ranks is ``rank.<r>`` with ``r`` zero-padded to
the width of the largest rank (``rank.03`` of 16 ranks), as horovodrun names them, so the
folders sort in rank order. An elastic job's folders (one per worker id) are padded for the
most workers it may have, ``--max-np`` (horovodrun pads to ``-np``, so a job that grows past
it gets folders of two widths): :attr:`accord.run.config.launch_config.LaunchConfig.rank_dir_size`.
"""
from __future__ import annotations


def rank_dirname(rank: int, size: int) -> str:
    """``rank.<rank>`` padded to the width of ``size - 1`` (``rank_dirname(3, 16) == "rank.03"``)."""
    width = len(str(max(size - 1, 0)))
    return f"rank.{str(rank).zfill(width)}"
