"""Paddle-style log lines, the terminal-only progress bar, and rank-0-only logging."""
import io

import pytest

from accord.hapi.callbacks import ProgBarLogger
from accord.hapi.progress import ProgressBar, format_time_per_step, format_value

pytestmark = pytest.mark.timeout(30)


def test_value_and_time_formats():
    assert format_value(0.12345) == "0.1235"
    assert format_value(0.0) == "0.0000"
    assert format_value(0.00012345) == "1.2345e-04"
    assert format_time_per_step(0.005) == "5ms/step"
    assert format_time_per_step(2.4) == "2s/step"
    assert format_time_per_step(0.00045) == "450us/step"


def test_lines_when_not_a_terminal():
    out = io.StringIO()
    bar = ProgressBar(938, verbose=1, stream=out)  # StringIO is no terminal: lines, no bar
    bar.update(400, [("loss", 0.12454), ("acc", 0.86181)], seconds_per_step=0.005)
    bar.update(938, [("loss", 0.1), ("acc", 0.9)], seconds_per_step=0.005)
    assert out.getvalue() == ("step 400/938 - loss: 0.1245 - acc: 0.8618 - 5ms/step\n"
                              "step 938/938 - loss: 0.1000 - acc: 0.9000 - 5ms/step\n")


def test_bar_redrawn_in_place_on_a_terminal():
    out = io.StringIO()
    bar = ProgressBar(10, verbose=1, stream=out, width=10, tty=True)
    bar.update(5, [("loss", 1.0)], seconds_per_step=0.002)
    assert out.getvalue() == "\rstep 5/10 [=====>....] - loss: 1.0000 - 2ms/step\x1b[K"
    bar.update(10, [("loss", 0.5)], seconds_per_step=0.002)
    assert out.getvalue().endswith("\rstep 10/10 [==========] - loss: 0.5000 - 2ms/step\x1b[K\n")


def test_verbose_2_prints_lines_even_on_a_terminal():
    out = io.StringIO()
    ProgressBar(3, verbose=2, stream=out, tty=True).update(3, [("loss", 1.0)], seconds_per_step=1.0)
    assert out.getvalue() == "step 3/3 - loss: 1.0000 - 1s/step\n"


class _FakeModel:
    def __init__(self, rank):
        self.rank = rank


def _run_logger(rank, verbose=2):
    out = io.StringIO()
    logger = ProgBarLogger(log_freq=2, verbose=verbose, stream=out)
    logger.set_model(_FakeModel(rank))
    logger.set_params({"epochs": 2, "steps": 3, "metrics": ["loss", "acc"]})
    logger.on_epoch_begin(0)
    logger.on_train_batch_end(0, {"step": 1})  # not a log step: no values, nothing printed
    logger.on_train_batch_end(1, {"step": 2, "loss": 0.5, "acc": 0.25, "samples": 8})
    logger.on_train_batch_end(2, {"step": 3, "loss": 0.4, "acc": 0.5, "samples": 12})
    logger.on_epoch_end(0)
    logger.on_eval_begin({"steps": 2})
    logger.on_eval_end({"steps": 2, "loss": 0.3, "acc": 0.75, "samples": 7})
    return out.getvalue()


def test_logger_prints_on_rank_0_only_in_paddle_style():
    lines = _run_logger(0).splitlines()
    assert lines[0] == "Epoch 1/2"
    assert lines[1].startswith("step 2/3 - loss: 0.5000 - acc: 0.2500 - ") and lines[1].endswith("/step")
    assert lines[2].startswith("step 3/3 - loss: 0.4000 - acc: 0.5000 - ")
    assert lines[3] == "Eval begin..."
    assert lines[4].startswith("step 2/2 - loss: 0.3000 - acc: 0.7500 - ")
    assert lines[5] == "Eval samples: 7"
    assert len(lines) == 6
    assert _run_logger(1) == ""
    assert _run_logger(0, verbose=0) == ""
