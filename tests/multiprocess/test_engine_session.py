"""The frontend-neutral session on real ranks: init, process sets, submit, shutdown, init again."""
import json
import os
import threading

import pytest
from helpers.ranks import run_ranks

pytestmark = pytest.mark.timeout(90)


def _session_checks(rank, size, tmp):
    import torch

    from accord.engine import session
    from accord.errors import ShutdownError

    assert not session.is_initialized()
    with pytest.raises(ValueError, match="HINT"):
        session.topology()
    session.init()
    topo = session.topology()
    assert (topo.rank, topo.size) == (rank, size)
    assert session.engine().running

    # named and unnamed requests; unnamed ones match by call order
    x = torch.full((4,), float(rank + 1))
    h1 = session.submit("allreduce", x, "x", in_place=True)
    h2 = session.submit("allreduce", torch.ones(2))
    h3 = session.submit("allgather", torch.full((1,), float(rank)))
    assert session.synchronize(h1) is x and x.tolist() == [6.0] * 4
    assert session.synchronize(h2).tolist() == [3.0, 3.0]
    assert session.synchronize(h3).tolist() == [0.0, 1.0, 2.0]
    assert session.poll(h1)

    # a group: one handle per tensor, named <name>_<i>of<n>; unnamed groups match by call order
    a, b = torch.full((2,), float(rank)), torch.full((3,), 2.0 * rank)
    group = session.submit_group("allreduce", [a, b], "pair", in_place=True)
    assert [h.name for h in group] == ["pair_1of2", "pair_2of2"]
    assert [session.synchronize(h).tolist() for h in group] == [[3.0] * 2, [6.0] * 3]
    unnamed_group = session.submit_group("allgather", [torch.full((1,), float(rank))] * 2)
    assert [session.synchronize(h).tolist() for h in unnamed_group] == [[0.0, 1.0, 2.0]] * 2
    # all or none: a name already in flight refuses the whole group, nothing is left queued
    held = session.submit("allreduce", torch.ones(1), "busy_2of2")
    with pytest.raises(ValueError, match="already in flight"):
        session.submit_group("allreduce", [torch.ones(1), torch.ones(1)], "busy")
    assert not session.engine().in_flight("busy_1of2")
    assert session.synchronize(held).tolist() == [3.0]

    # compressed in-place allreduces are cast by the engine while it moves the data (no wire
    # buffer); the data really travels as bfloat16: 1 + 2**-10 rounds to 1 there
    from accord.engine.compression import Compression
    for step in range(2):
        g = torch.full((5,), 1.0 + 2.0 ** -10 + step)
        h = session.submit("allreduce", g, "grad.w", in_place=True, compression=Compression.bf16)
        assert session.synchronize(h) is g and g.dtype == torch.float32
        assert g.tolist() == [float(size * (1 + step))] * 5
    assert "grad.w" not in session._current().wire_buffers
    # out-of-place named compressed requests reuse one wire buffer per name; values stay exact
    buffers = []
    for step in range(2):
        g = torch.full((5,), float(rank + 1 + step))
        out = session.synchronize(session.submit("allreduce", g, "grad.o", compression=Compression.bf16))
        assert out.dtype == torch.float32 and g.tolist() == [float(rank + 1 + step)] * 5
        assert out.tolist() == [float(sum(r + 1 + step for r in range(size)))] * 5
        buffers.append(session._current().wire_buffers["grad.o"])
    assert buffers[0] is buffers[1] and buffers[0].dtype == torch.bfloat16
    unnamed = session.submit("allreduce", torch.ones(3), compression=Compression.bf16)
    assert session.synchronize(unnamed).tolist() == [3.0] * 3
    assert list(session._current().wire_buffers) == ["grad.o"]  # unnamed requests are not cached

    # process sets are collective: every rank registers and removes them
    even = session.add_process_set([0, 2])
    assert even == 1 and session.process_sets() == {0: (0, 1, 2), 1: (0, 2)}
    if rank in (0, 2):
        got = session.synchronize(session.submit("allreduce", torch.tensor([float(rank)]), "even",
                                                 process_set_id=even))
        assert got.tolist() == [2.0]
        got = session.synchronize(session.submit("broadcast", torch.tensor([float(rank)]), "even.bc",
                                                 root_rank=2, process_set_id=even))
        assert got.tolist() == [2.0]
    with pytest.raises(ValueError, match="already registered"):
        session.add_process_set([0, 2])
    session.remove_process_set(even)
    assert session.process_sets() == {0: (0, 1, 2)}
    with pytest.raises(ValueError):
        session.remove_process_set(0)

    session.start_timeline(os.path.join(tmp, "explicit.json"))
    session.synchronize(session.submit("allreduce", torch.ones(3), "traced"))
    session.stop_timeline()

    # shutdown stops the engine; init again works in the same processes
    session.shutdown()
    session.shutdown()  # idempotent
    assert not session.is_initialized()
    assert not [t for t in threading.enumerate() if t.name == "accord-engine"]
    with pytest.raises(ValueError):
        session.submit("allreduce", torch.ones(1), "after.shutdown")
    session.init([[1, 2]])
    assert session.process_sets() == {0: (0, 1, 2), 1: (1, 2)}
    got = session.synchronize(session.submit("allreduce", torch.ones(2), "again"))
    assert got.tolist() == [3.0, 3.0]
    if rank in (1, 2):
        got = session.synchronize(session.submit("allreduce", torch.ones(1), "pair", process_set_id=1))
        assert got.tolist() == [2.0]
    # a request still pending at shutdown fails with ShutdownError instead of hanging
    pending = session.submit("allreduce", torch.ones(1), "never.matched") if rank == 0 else None
    eng = session.engine()
    session.shutdown()
    assert not eng.running
    if pending is not None:
        with pytest.raises(ShutdownError):
            session.synchronize(pending)
    return True


def test_session_lifecycle_on_three_ranks(tmp_path):
    env = {"ACCORD_TIMELINE": str(tmp_path / "from_env.json")}
    assert run_ranks(_session_checks, 3, str(tmp_path), init="accord", env=env, timeout=80) == [True] * 3
    explicit = json.loads((tmp_path / "explicit.json").read_text())
    names = {e["args"]["name"] for e in explicit["traceEvents"] if e["name"] == "thread_name"}
    assert names == {"traced"}
    # ACCORD_TIMELINE started a timeline at each init; the second init's file is complete JSON
    from_env = json.loads((tmp_path / "from_env.json").read_text())
    names = {e["args"]["name"] for e in from_env["traceEvents"] if e["name"] == "thread_name"}
    assert "again" in names and "x" not in names


def _init_with_other_settings(rank, size):
    from accord.engine import session
    from accord.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        session.init()
    assert not session.is_initialized()
    return str(info.value)


def test_init_refuses_engine_settings_that_differ_between_ranks():
    messages = run_ranks(_init_with_other_settings, 2, init="accord", timeout=60,
                         per_rank_env=lambda r: {"ACCORD_FUSION_THRESHOLD": str(1024 * (r + 1))})
    for m in messages:
        assert m.startswith("engine setting fusion_threshold differs between ranks: "
                            "rank 0 has 1024, rank 1 has 2048")
        assert "HINT:" in m
