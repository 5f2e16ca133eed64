"""The fastest two simulated hosts can swap N MiB each way: plain TCP, no framework.

Used by the cluster benchmarks as the physical bound beside the frameworks they compare: an
allreduce or a KVStore push+pull of N MiB between two hosts must move at least N MiB out of each
host (half the pushes and half the pull answers cross), so no framework's round can beat this
exchange. One stdlib process per host; h2 listens, h1 connects, both send N MiB and receive
N MiB at the same time (a thread sends, the main thread receives), and each reports the time
from the moment both were connected until its receive completed.

    python benchmarks/link_floor.py --mb 100 --rate 1gbit     (builds its own two-host cluster)
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

PORT = 9311
CHUNK = 1 << 20

EXCHANGE = r"""
import json, socket, sys, threading, time
role, peer, port, nbytes, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
if role == "listen":
    srv = socket.create_server(("0.0.0.0", port))
    sock = srv.accept()[0]
    srv.close()
else:
    for attempt in range(200):
        try:
            sock = socket.create_connection((peer, port))
            break
        except OSError:
            time.sleep(0.05)
    else:
        raise SystemExit(f"could not connect to {peer}:{port} in 10 s")
sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
payload = memoryview(bytes(%d))
sink = bytearray(%d)

def send():
    left = nbytes
    while left:
        n = min(left, len(payload))
        sock.sendall(payload[:n])
        left -= n

def recv_exact(n):
    view = memoryview(sink)
    while n:
        got = sock.recv_into(view[:min(n, len(sink))])
        if not got:
            raise SystemExit("peer closed early")
        n -= got

times = []
for _ in range(rounds):
    sock.sendall(b"g"); recv_exact(1)          # both sides start together
    start = time.perf_counter()
    sender = threading.Thread(target=send)
    sender.start()
    recv_exact(nbytes)
    sender.join()
    times.append(time.perf_counter() - start)
print(json.dumps({"role": role, "ms": [round(t * 1e3, 1) for t in times]}), flush=True)
""" % (CHUNK, CHUNK)


def measure(cluster, mb: float, rounds: int = 3, hosts: tuple[str, str] = ("h1", "h2")) -> dict:
    """Swap ``mb`` MiB each way between two hosts ``rounds`` times; the slower side's median."""
    nbytes = int(mb * 1024 * 1024)
    first, second = hosts
    listener = cluster.popen(second, [sys.executable, "-c", EXCHANGE, "listen", "-", str(PORT), str(nbytes),
                                      str(rounds)], stdout=subprocess.PIPE, text=True)
    connector = cluster.popen(first, [sys.executable, "-c", EXCHANGE, "connect", cluster.hosts[second].address,
                                      str(PORT), str(nbytes), str(rounds)], stdout=subprocess.PIPE, text=True)
    outs = [p.communicate(timeout=60 + rounds * mb)[0] for p in (connector, listener)]
    if connector.returncode or listener.returncode:
        sys.exit(f"link floor exchange failed: {outs}")
    sides = [json.loads(out.strip().splitlines()[-1])["ms"] for out in outs]
    slowest = [max(pair) for pair in zip(*sides)]
    return {"MB_each_way": mb, "rounds_ms": slowest, "median_ms": round(statistics.median(slowest), 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mb", type=float, default=100.0)
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    from cluster_common import start_cluster

    with start_cluster(hosts=2, rate=None if args.rate == "unlimited" else args.rate) as cluster:
        print(json.dumps({"rate": args.rate, **measure(cluster, args.mb, args.rounds)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
