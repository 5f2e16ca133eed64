"""Memory a parameter server holds for strangers: RSS while N connections without the secret
send partial handshakes, and 30 s after they leave (target: <= 64 MiB more, then given back).

    python benchmarks/ps_strangers.py [--strangers 64] [--mib 16] [--hold 8] [--after 30]

One real server process (``python -m accord.kvstore.server`` through LocalCluster, loopback).
Each stranger opens a TCP connection to it and writes, as fast as the server takes them, the
start of a handshake a server of accord has spoken (``zmtp``: a ZeroMQ ZMTP 3.0 greeting with a
PLAIN HELLO announced at ``--mib`` MiB; ``accord``: accord's own hello with lengths announced at
``--mib`` MiB), then filler up to ``--mib`` MiB, or (``stall``) accord's hello and half a proof
and then nothing, and keeps the connection open for ``--hold`` seconds. Meanwhile the server's
VmRSS is sampled every 50 ms and a worker pings it once a second; then the strangers close and
the RSS is read again ``--after`` seconds later. Writes benchmarks/results/ps_strangers.json.
"""
from __future__ import annotations

import argparse
import os
import selectors
import socket
import struct
import sys
import threading
import time

from recording import record

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "ps_strangers.json")
TARGET_MIB = 64

# A ZMTP 3.0 greeting asking for PLAIN (signature, version, mechanism, as-server flag, filler).
_ZMTP = b"\xff" + bytes(8) + b"\x7f" + bytes([3, 0]) + b"PLAIN".ljust(20, b"\0") + bytes(32)


def _opening(style: str, mib: int) -> tuple[bytes, int]:
    """The first bytes a stranger of ``style`` sends, and how many bytes it sends in all."""
    big = mib << 20
    if style == "zmtp":
        return _ZMTP + b"\x06" + struct.pack("!Q", big) + b"\x05HELLO", big
    from accord.kvstore import transport

    hello = transport.hello_bytes(os.urandom(transport.NONCE_BYTES))
    if style == "stall":  # accord's hello and half a proof, then silence
        opening = hello + bytes(transport.PROOF_BYTES // 2)
        return opening, len(opening)
    # accord's hello, then bytes where the proof and a first frame would go
    return hello + struct.pack("!IIQ", big, big, big), big


def _rss_kib(pid: int, field: str = "VmRSS:") -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(field):
                return int(line.split()[1])
    return 0


def _strangers(host: str, port: int, count: int, opening: bytes, budget: int, hold: float) -> dict:
    """Run ``count`` strangers for ``hold`` seconds, each writing ``budget`` bytes at most;
    returns what they managed."""
    sel = selectors.DefaultSelector()
    budget = max(budget, len(opening))
    filler = bytes(1 << 20)
    written: dict[socket.socket, int] = {}
    closed = refused = 0
    for _ in range(count):
        sock = socket.socket()
        sock.setblocking(False)
        try:
            sock.connect((host, port))
        except BlockingIOError:
            pass
        except OSError:
            refused += 1
            sock.close()
            continue
        written[sock] = 0
        sel.register(sock, selectors.EVENT_WRITE | selectors.EVENT_READ)
    deadline = time.monotonic() + hold
    while time.monotonic() < deadline and written:
        for key, events in sel.select(0.05):
            sock = key.fileobj
            if sock not in written:
                continue
            try:
                if events & selectors.EVENT_READ and not sock.recv(65536):
                    raise ConnectionResetError("closed by the server")
                done = written[sock]
                if events & selectors.EVENT_WRITE and done < budget:
                    data = opening[done:] if done < len(opening) else filler[:budget - done]
                    written[sock] = done + sock.send(data)
                    if written[sock] >= budget:
                        sel.modify(sock, selectors.EVENT_READ)
            except OSError:
                closed += 1
                sel.unregister(sock)
                sock.close()
                del written[sock]
    total = sum(written.values())
    for sock in written:
        sel.unregister(sock)
        sock.close()
    sel.close()
    return {"closed_by_server": closed, "refused_at_connect": refused,
            "still_open_at_end": len(written), "mib_written_by_those_open": round(total / 2**20, 1)}


def _pinger(endpoint: str, secret: bytes, stop: threading.Event, out: list) -> None:
    from accord.kvstore.connection import ServerConnections

    conns = ServerConnections([endpoint], secret, rank=0, num_workers=1, timeout=30)
    try:
        while not stop.is_set():
            start = time.monotonic()
            try:
                seq, _ = conns.request(0, "ping", {})
                conns.wait([seq], "ping")
                out.append(round((time.monotonic() - start) * 1000, 1))
            except Exception as exc:  # noqa: BLE001 - reported, not raised
                out.append(f"failed: {exc}")
                return
            stop.wait(1.0)
    finally:
        conns.close()


def _measure(style: str, args: argparse.Namespace) -> dict:
    from accord.kvstore.cluster import LocalCluster
    from accord.kvstore.directory import SERVER_KEY
    from accord.store.connection import StoreConnection

    with LocalCluster(1, 1) as cl:
        with StoreConnection("127.0.0.1", cl.store.port, cl.secret, timeout=10) as conn:
            endpoint = conn.get(SERVER_KEY.format(index=0)).decode()
        host, port = endpoint.split("|")[0][len("tcp://"):].rsplit(":", 1)
        pid = cl.servers[0].pid
        time.sleep(0.5)
        base = _rss_kib(pid)
        peak = [base]
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], _rss_kib(pid))
                stop.wait(0.05)

        pings: list = []
        threads = [threading.Thread(target=sample, daemon=True),
                   threading.Thread(target=_pinger, args=(endpoint, cl.secret, stop, pings), daemon=True)]
        for t in threads:
            t.start()
        started = time.monotonic()
        opening, budget = _opening(style, args.mib)
        outcome = _strangers(host, int(port), args.strangers, opening, budget, args.hold)
        left = time.monotonic() - started
        time.sleep(0.5)
        stop.set()
        for t in threads:
            t.join(35)
        at_leave = _rss_kib(pid)
        time.sleep(args.after)
        after = _rss_kib(pid)
        alive = cl.servers[0].poll() is None
    mib = 1 / 1024
    return {"style": style, "rss_before_mib": round(base * mib, 1), "rss_peak_mib": round(peak[0] * mib, 1),
            "grown_at_peak_mib": round((peak[0] - base) * mib, 1),
            "rss_when_they_left_mib": round(at_leave * mib, 1),
            f"rss_{args.after:.0f}s_after_mib": round(after * mib, 1),
            "held_after_mib": round((after - base) * mib, 1), "strangers_for_s": round(left, 1),
            "worker_pings_ms": pings, "server_alive": alive, **outcome}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--strangers", type=int, default=64, help="connections without the secret")
    parser.add_argument("--mib", type=int, default=16, help="MiB each stranger tries to write")
    parser.add_argument("--hold", type=float, default=8.0, help="seconds the strangers stay")
    parser.add_argument("--after", type=float, default=30.0, help="seconds after they leave to read the RSS again")
    parser.add_argument("--styles", default="zmtp,accord,stall", help="handshake openings to try, comma-separated")
    parser.add_argument("--out", default=RESULTS, help="where to write the JSON result")
    args = parser.parse_args(argv)
    runs = [_measure(style, args) for style in args.styles.split(",")]
    for run in runs:
        print(run)
    worst = max(r["grown_at_peak_mib"] for r in runs)
    held = max(r["held_after_mib"] for r in runs)
    result = {"strangers": args.strangers, "mib_each": args.mib, "hold_s": args.hold,
              "after_s": args.after, "target_mib": TARGET_MIB, "worst_growth_mib": worst,
              "worst_held_after_mib": held, "met": worst <= TARGET_MIB and held <= TARGET_MIB,
              "runs": runs}
    record(result, args.out, "ps_strangers.py", argv)
    print(f"worst growth {worst} MiB at peak, {held} MiB {args.after:.0f}s after (target <= {TARGET_MIB})")
    return 0 if result["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
