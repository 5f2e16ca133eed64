"""accord.distributed.naming: names by call order that recur while a program repeats its step."""
import pytest
import torch

from accord.distributed.naming import MAX_PERIOD, GroupNames, describe

pytestmark = pytest.mark.timeout(30)


def _names(descriptions, group="g"):
    names = GroupNames(group)
    return [names.next(d) for d in descriptions]


def test_calls_without_a_repeat_are_numbered():
    assert _names("abcde") == ["g.1", "g.2", "g.3", "g.4", "g.5"]


def test_a_repeated_step_gets_recurring_names_from_its_third_round():
    step = ["a", "b", "c"]
    got = _names(step * 4)
    # two rounds show the period; from then on each call's place in the step names it
    assert got[:6] == [f"g.{n}" for n in range(1, 7)]
    assert got[6:] == ["g.s3.0", "g.s3.1", "g.s3.2"] * 2


def test_one_repeated_call_is_one_name():
    assert _names(["x"] * 5) == ["g.1", "g.2", "g.s1.0", "g.s1.0", "g.s1.0"]


def test_a_break_in_the_sequence_goes_back_to_numbers_then_finds_the_new_period():
    got = _names(["a", "b"] * 3 + ["c"] + ["d"] * 3)
    assert got[4:6] == ["g.s2.0", "g.s2.1"]
    assert got[6] == "g.s2.0"  # named before its description counts: a rank that differs agrees
    assert got[7:] == ["g.8", "g.9", "g.s1.0"]


def test_a_call_that_differs_gets_its_peers_name():
    """Ranks with the same history name the next call alike whatever it is, so the engine sees one
    name with two signatures (a mismatch on every rank), never two names (a stall)."""
    history = ["a", "b"] * 3
    mine, theirs = GroupNames("g"), GroupNames("g")
    for d in history:
        assert mine.next(d) == theirs.next(d)
    assert mine.next("a") == theirs.next("z")


def test_forget_starts_again_from_numbers():
    names = GroupNames("g")
    for d in ["x"] * 4:
        names.next(d)
    names.forget()
    assert [names.next("x") for _ in range(3)] == ["g.5", "g.6", "g.s1.0"]


class _Work:
    """Stands in for a work object (the names hold it weakly)."""


def test_recurring_names_remember_their_last_work_and_numbered_ones_do_not():
    names = GroupNames("g")
    first = names.next("x")
    w1, w3 = _Work(), _Work()
    names.submitted(first, w1)
    assert names.previous_work(first) is None
    names.next("x")
    recurring = names.next("x")
    names.submitted(recurring, w3)
    assert names.previous_work(recurring) is w3


def test_a_work_nothing_else_holds_is_not_kept_alive_by_its_name():
    """A pending work is held by the engine's callbacks; once done and let go by its caller, it
    (and the outputs it refers to) must be freed, not kept until the name recurs."""
    import gc
    import weakref

    names = GroupNames("g")
    recurring = [names.next("x") for _ in range(3)][-1]
    work = _Work()
    alive = weakref.ref(work)
    names.submitted(recurring, work)
    del work
    gc.collect()
    assert alive() is None
    assert names.previous_work(recurring) is None


def test_periods_longer_than_the_limit_are_not_recognised():
    step = [f"d{i}" for i in range(MAX_PERIOD + 1)]
    assert all(not name.startswith("g.s") for name in _names(step * 3))


def test_descriptions_leave_out_what_may_differ_between_ranks():
    big, small = torch.zeros(8, 3), torch.zeros(2, 3)
    # ragged ops: dim 0 and splits are per rank
    assert describe("allgather", [big]) == describe("allgather", [small])
    assert describe("alltoall", [big], splits=[4, 4]) == describe("alltoall", [small], splits=[1, 1])
    assert describe("scatter", [big], root_rank=0) != describe("scatter", [big], root_rank=1)
    # everything else must agree
    assert describe("allreduce", [big]) != describe("allreduce", [small])
    assert describe("allreduce", [big]) != describe("allreduce", [big.double()])
    assert describe("allreduce", [big], reduce_op=1) != describe("allreduce", [big], reduce_op=4)
    assert describe("allreduce", [big]) != describe("broadcast", [big])
