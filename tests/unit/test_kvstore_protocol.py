"""The parameter-server pieces without processes: message MACs, secrets, sharding, the numpy
2-bit decoder, and the server's request handling (rounds, deferral, errors) driven directly."""
import os
import zlib

import numpy as np
import pytest
import torch

from accord.errors import AuthenticationError, ConfigError
from accord.kvstore import protocol
from accord.kvstore.gradient_compression import compress
from accord.kvstore.server.codec import dequantize_2bit
from accord.kvstore.server.core import ServerCore
from accord.kvstore.sharding import partition, wire_key

pytestmark = pytest.mark.timeout(30)

SECRET = b"k" * 32


# --- messages ----------------------------------------------------------------------------------

def test_seal_and_open_round_trip_and_refuse_tampering():
    payload = np.arange(10, dtype=np.float32)
    frames = protocol.seal(SECRET, protocol.TO_SERVER, {"op": "push", "seq": 1}, [payload, b"xy"])
    assert frames[2] is payload and len(frames[0]) == 64  # payloads go out as given, uncopied
    header, payloads = protocol.open_message(SECRET, protocol.TO_SERVER, frames)
    assert header == {"op": "push", "seq": 1}
    np.testing.assert_array_equal(np.frombuffer(payloads[0], np.float32), payload)
    with pytest.raises(AuthenticationError, match="wrong MAC"):
        protocol.open_message(b"z" * 32, protocol.TO_SERVER, frames)  # wrong secret
    with pytest.raises(AuthenticationError):
        protocol.open_message(SECRET, protocol.TO_WORKER, frames)  # reflected back to its sender
    tampered = list(frames)
    tampered[2] = payload * 2
    with pytest.raises(AuthenticationError):
        protocol.open_message(SECRET, protocol.TO_SERVER, tampered)
    with pytest.raises(AuthenticationError):  # moving bytes between header and payload
        protocol.open_message(SECRET, protocol.TO_SERVER, [frames[0], frames[1] + b"x", frames[2], b"y"])


def test_header_only_mode_still_authenticates_headers_and_lengths():
    payload = np.arange(4, dtype=np.float32)
    frames = protocol.seal(SECRET, protocol.TO_SERVER, {"op": "push"}, [payload], payload_mac=False)
    assert len(frames[0]) == 48  # nonce + header tag, no payload tag
    swapped = [frames[0], frames[1], payload * 3]  # same length: accepted, by design
    assert protocol.open_message(SECRET, protocol.TO_SERVER, swapped, payload_mac=False)[0] == {"op": "push"}
    with pytest.raises(AuthenticationError):  # another length
        protocol.open_message(SECRET, protocol.TO_SERVER, [frames[0], frames[1], payload[:3]], False)
    with pytest.raises(AuthenticationError):  # another header
        protocol.open_message(SECRET, protocol.TO_SERVER, [frames[0], b'{"op":"pull"}', payload], False)
    with pytest.raises(AuthenticationError, match="ACCORD_KVSTORE_PAYLOAD_MAC"):  # policies differ
        protocol.open_message(SECRET, protocol.TO_SERVER, frames, payload_mac=True)
    full = protocol.seal(SECRET, protocol.TO_SERVER, {"op": "push"}, [payload])
    with pytest.raises(AuthenticationError, match="ACCORD_KVSTORE_PAYLOAD_MAC"):  # the other way
        protocol.open_message(SECRET, protocol.TO_SERVER, full, payload_mac=False)
    with pytest.raises(AuthenticationError):  # a full tag cut down to the header-only length
        protocol.open_message(SECRET, protocol.TO_SERVER, [full[0][:48], *full[1:]], payload_mac=False)


def test_open_checks_frames_and_header_after_the_mac():
    with pytest.raises(protocol.ProtocolError, match="frames"):
        protocol.open_message(SECRET, protocol.TO_SERVER, [b"only one"])
    not_object = protocol.seal(SECRET, protocol.TO_SERVER, [1, 2], [])  # a validly tagged list
    with pytest.raises(protocol.ProtocolError, match="not an object"):
        protocol.open_message(SECRET, protocol.TO_SERVER, not_object)
    huge = [b"t" * 64, b"{" + b" " * protocol.MAX_HEADER + b"}"]
    with pytest.raises(protocol.ProtocolError, match="exceeds"):
        protocol.open_message(SECRET, protocol.TO_SERVER, huge)


def test_load_secret_from_env_and_file(monkeypatch, tmp_path):
    for name in ("ACCORD_JOB_SECRET", "ACCORD_SECRET_FILE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError, match="ACCORD_JOB_SECRET"):
        protocol.load_secret()
    monkeypatch.setenv("ACCORD_JOB_SECRET", "ab" * 32)
    assert protocol.load_secret() == bytes.fromhex("ab" * 32)
    monkeypatch.setenv("ACCORD_JOB_SECRET", "abcd")
    with pytest.raises(ConfigError, match="16 bytes"):
        protocol.load_secret()
    monkeypatch.delenv("ACCORD_JOB_SECRET")
    path = tmp_path / "secret"
    path.write_text("cd" * 32)
    os.chmod(path, 0o644)
    monkeypatch.setenv("ACCORD_SECRET_FILE", str(path))
    with pytest.raises(ConfigError, match="chmod 600"):
        protocol.load_secret()
    os.chmod(path, 0o600)
    assert protocol.load_secret() == bytes.fromhex("cd" * 32)


# --- sharding and 2-bit decoding --------------------------------------------------------------

def test_partition_follows_mxnet():
    # small keys: one server, (key * 9973) % num_servers; str keys through CRC-32
    assert partition(5, 10, 3, 1000)[0].server == (5 * 9973) % 3
    assert partition("w", 10, 4, 1000)[0].server == (zlib.crc32(b"w") * 9973) % 4
    assert [(p.start, p.stop) for p in partition(7, 10, 1, 5)] == [(0, 10)]
    # big keys (>= bound): every server, piece i ends at round(n / S * (i + 1)), half away from 0
    parts = partition(1, 10, 3, 10)
    assert [(p.server, p.start, p.stop) for p in parts] == [(0, 0, 3), (1, 3, 7), (2, 7, 10)]
    parts = partition(1, 5, 2, 5)  # 2.5 rounds up, as C's round
    assert [(p.start, p.stop) for p in parts] == [(0, 3), (3, 5)]
    assert len(partition(1, 999_999, 2, 1_000_000)) == 1
    assert len(partition(1, 1_000_000, 2, 1_000_000)) == 2
    assert [p.size for p in partition(1, 1, 3, 1)] == [1]  # empty pieces are not sent
    # chunks subdivide each server's piece, in order, with consecutive indices
    parts = partition(1, 50, 2, 16, chunk=8)
    assert [(p.server, p.index, p.start, p.stop) for p in parts] == [
        (0, 0, 0, 8), (0, 1, 8, 16), (0, 2, 16, 24), (0, 3, 24, 25),
        (1, 4, 25, 33), (1, 5, 33, 41), (1, 6, 41, 49), (1, 7, 49, 50)]
    assert [(p.start, p.stop) for p in partition(3, 0, 2, 16, chunk=8)] == [(0, 0)]
    with pytest.raises(ValueError):
        partition(1, 10, 2, 5, chunk=0)
    assert wire_key(3) == "i:3" and wire_key("3") == "s:3"
    with pytest.raises(ValueError):
        partition(1, 10, 0, 5)


@pytest.mark.parametrize("n", [1, 16, 37, 1000])
def test_numpy_dequantize_reads_the_torch_wire_format(n):
    g = torch.from_numpy(np.random.default_rng(n).uniform(-1.5, 1.5, n).astype(np.float32))
    packed = compress(g, torch.zeros(n), 0.7)
    got = dequantize_2bit(packed.numpy().tobytes(), 0.7, n)
    expected = np.where(g.numpy() >= np.float32(0.7), np.float32(0.7),
                        np.where(g.numpy() <= -np.float32(0.7), -np.float32(0.7), 0))
    np.testing.assert_array_equal(got, expected)
    with pytest.raises(ValueError, match="cannot hold"):
        dequantize_2bit(b"\0" * 4, 0.7, 17)


# --- the server's request handling --------------------------------------------------------------

class _Peer:
    """A fake worker: collects the server's answers."""

    def __init__(self):
        self.answers = []


def _core(num_workers=2):
    def reply(peer, request, fields, payloads, reuse, buf):
        peer.answers.append((request["op"], request.get("seq"), fields,
                             [np.array(p, copy=True) for p in payloads]))

    return ServerCore(num_workers, 0, reply)


def _req(core, peer, op, rank, seq, payloads=(), **fields):
    header = {"op": op, "rank": rank, "seq": seq, "ns": 1, "sync": True, "nw": core.num_workers,
              **fields}
    core.handle(peer, header, [memoryview(np.ascontiguousarray(p)).cast("B") for p in payloads])


def test_sync_rounds_defer_acks_and_pulls_and_keep_per_worker_order():
    core = _core(2)
    w0, w1 = _Peer(), _Peer()
    key = "s:w#0"
    _req(core, w0, "init", 0, 1, [np.zeros(3, np.float32)], key=key, dtype="<f4", n=3)
    assert w0.answers[-1][2] == {"ok": True}
    _req(core, w0, "push", 0, 2, [np.ones(3, np.float32)], key=key, dtype="<f4")
    _req(core, w0, "pull", 0, 3, key=key)          # waits: worker 0 pushed in this round
    _req(core, w0, "push", 0, 4, [np.full(3, 10, np.float32)], key=key, dtype="<f4")  # next round
    _req(core, w0, "pull", 0, 5, key=key)          # after its second push: waits for round 2
    assert len(w0.answers) == 1
    _req(core, w1, "pull", 1, 1, key=key)          # worker 1 has not pushed: the current value
    np.testing.assert_array_equal(w1.answers[-1][3][0].view(np.float32), [0, 0, 0])
    _req(core, w1, "push", 1, 2, [np.full(3, 2, np.float32)], key=key, dtype="<f4")
    ops = [(op, seq) for op, seq, _, _ in w0.answers[1:]]
    assert ops == [("push", 2), ("pull", 3)]       # round 1 done: ack, then the deferred pull
    np.testing.assert_array_equal(w0.answers[2][3][0].view(np.float32), [3, 3, 3])
    _req(core, w1, "push", 1, 3, [np.full(3, 5, np.float32)], key=key, dtype="<f4", rop="sum")
    np.testing.assert_array_equal(w0.answers[-1][3][0].view(np.float32), [15, 15, 15])
    assert [(op, seq) for op, seq, _, _ in w0.answers[3:]] == [("push", 4), ("pull", 5)]


@pytest.mark.parametrize("num_workers", [1, 2, 3])
@pytest.mark.parametrize("dtype,rop", [("<f4", "sum"), ("<i8", "sum"), ("<f8", "max"), ("<i4", "min")])
def test_sync_rounds_merge_every_workers_push(num_workers, dtype, rop):
    core = _core(num_workers)
    peers = [_Peer() for _ in range(num_workers)]
    key = "i:1#0"
    rng = np.random.default_rng(num_workers)
    _req(core, peers[0], "init", 0, 1, [np.zeros(5, dtype)], key=key, dtype=dtype, n=5)
    for rnd in range(3):  # the merge buffer is reused across rounds
        pushes = [(rng.standard_normal(5) * 100).astype(dtype) for _ in range(num_workers)]
        for rank in reversed(range(num_workers)):  # arrival order does not matter
            _req(core, peers[rank], "push", rank, 10 + 2 * rnd, [pushes[rank]], key=key, dtype=dtype, rop=rop)
        _req(core, peers[0], "pull", 0, 11 + 2 * rnd, key=key)
        fn = {"sum": np.add, "max": np.maximum, "min": np.minimum}[rop]
        expected = pushes[-1]
        for p in reversed(pushes[:-1]):  # in arrival order, as float addition is not associative
            expected = fn(expected, p)
        np.testing.assert_array_equal(peers[0].answers[-1][3][0].view(dtype), expected)


def test_server_errors_are_answered_not_fatal():
    core = _core(2)
    w = _Peer()
    _req(core, w, "init", 0, 1, [np.zeros(4, np.float32)], key="s:k#0", dtype="<f4", n=4)
    _req(core, w, "init", 0, 2, [np.zeros(4, np.float32)], key="s:k#0", dtype="<f4", n=4)
    assert "duplicate init of key 'k'" in w.answers[-1][2]["error"]
    w1 = _Peer()
    _req(core, w, "push", 0, 3, [np.zeros(6, np.float32)], key="s:k#0", dtype="<f4")
    assert "with 6 elements, but it was initialised with 4" in w.answers[-1][2]["error"]
    _req(core, w1, "push", 1, 1, [np.zeros(4, np.float32)], key="s:k#0", dtype="<f4")  # ends that round
    assert "the push of rank 0 in it was refused" in w1.answers[-1][2]["error"]
    _req(core, w, "push", 0, 4, [np.zeros(4, np.float64)], key="s:k#0", dtype="<f8")
    assert "as float64" in w.answers[-1][2]["error"]
    _req(core, w1, "push", 1, 2, [np.zeros(4, np.float32)], key="s:k#0", dtype="<f4")
    _req(core, w, "pull", 0, 5, key="i:7#1")
    assert "unknown key 7 (piece 1)" in w.answers[-1][2]["error"]
    _req(core, w, "frobnicate", 0, 6)
    assert "unknown request" in w.answers[-1][2]["error"]
    core.handle(w, {"op": "ping", "nw": 3}, [])
    assert "started for 2" in w.answers[-1][2]["error"]
    _req(core, w, "push", 0, 7, [np.ones(4, np.float32)], key="s:k#0", dtype="<f4", rop="max")
    other = _Peer()
    _req(core, other, "push", 1, 1, [np.ones(4, np.float32)], key="s:k#0", dtype="<f4", rop="min")
    assert "op='min' while other workers pushed op='max'" in other.answers[-1][2]["error"]
    _req(core, w, "push", 0, 8, [np.ones(4, np.float32)], key="s:k#0", dtype="<f4", sync=False)
    assert "is dist_sync on the servers" in w.answers[-1][2]["error"]
    _req(core, w, "set_optimizer", 0, 9, optimizer={"name": "nope"})
    assert "unknown optimizer" in w.answers[-1][2]["error"]
    _req(core, w, "init", 0, 10, [np.ones(2, np.float32)], key="s:z#0", n=2)  # no dtype field
    assert "malformed" in w.answers[-1][2]["error"]


def test_async_mode_needs_an_optimizer_and_applies_pushes_at_once():
    core = _core(2)
    w = _Peer()
    _req(core, w, "init", 0, 1, [np.zeros(2, np.float32)], key="i:0#0", dtype="<f4", n=2, sync=False)
    _req(core, w, "push", 0, 2, [np.ones(2, np.float32)], key="i:0#0", dtype="<f4", sync=False)
    assert "none is set" in w.answers[-1][2]["error"]
    _req(core, w, "set_optimizer", 0, 3, sync=False,
         optimizer={"name": "sgd", "params": {"learning_rate": 0.5}})
    _req(core, w, "push", 0, 4, [np.ones(2, np.float32)], key="i:0#0", dtype="<f4", sync=False)
    _req(core, w, "pull", 0, 5, key="i:0#0", sync=False)
    np.testing.assert_array_equal(w.answers[-1][3][0].view(np.float32), [-0.5, -0.5])
    _req(core, w, "get_states", 0, 6, sync=False)
    assert w.answers[-1][2]["entries"] == [{"key": "i:0#0", "count": 1, "states": 0, "dtypes": []}]


def test_param_only_barrier_and_compressed_push():
    core = _core(2)
    a, b = _Peer(), _Peer()
    _req(core, a, "init", 0, 1, [np.zeros(2, np.float32)], key="s:p#0", dtype="<f4", n=2, param_only=True)
    _req(core, a, "set_optimizer", 0, 2, optimizer={"name": "sgd", "params": {"learning_rate": 9.0}})
    _req(core, a, "push", 0, 3, [np.array([1, 2], np.float32)], key="s:p#0", dtype="<f4")
    _req(core, b, "push", 1, 1, [np.array([3, 6], np.float32)], key="s:p#0", dtype="<f4")
    _req(core, b, "pull", 1, 2, key="s:p#0")
    np.testing.assert_array_equal(b.answers[-1][3][0].view(np.float32), [2, 4])  # mean, no optimizer
    _req(core, a, "barrier", 0, 4, gen=1)
    assert a.answers[-1][0] != "barrier"
    _req(core, b, "barrier", 1, 3, gen=1)
    assert a.answers[-1][0] == "barrier" and b.answers[-1][0] == "barrier"
    _req(core, a, "barrier", 0, 5, gen=2)
    _req(core, a, "barrier", 0, 6, gen=2)
    assert "twice" in a.answers[-1][2]["error"]
    g = torch.tensor([0.9, -0.9, 0.1])
    _req(core, a, "init", 0, 7, [np.zeros(3, np.float32)], key="s:c#0", dtype="<f4", n=3)
    core.stopped = False
    _req(core, a, "set_optimizer", 0, 8, optimizer={"name": "sgd", "params": {"learning_rate": 1.0}})
    for peer, rank in ((a, 0), (b, 1)):
        packed = compress(g, torch.zeros(3), 0.5).numpy()
        _req(core, peer, "push", rank, 20, [packed], key="s:c#0", comp=[0.5, 3])
    _req(core, b, "pull", 1, 21, key="s:c#0")
    np.testing.assert_array_equal(b.answers[-1][3][0].view(np.float32), [-1.0, 1.0, 0.0])


def test_the_server_side_never_imports_torch():
    """The launcher imports accord.kvstore.server, and servers start without torch (fast)."""
    import subprocess
    import sys

    code = ("import sys, accord.kvstore, accord.kvstore.server, accord.kvstore.cluster; "
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)
