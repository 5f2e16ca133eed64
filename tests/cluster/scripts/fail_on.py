"""``fail_on.py RANK CODE``: every rank waits; rank RANK exits with CODE after a second."""
import json
import os
import socket
import sys
import time

rank = int(os.environ["ACCORD_RANK"])
print("REPORT " + json.dumps({"rank": rank, "hostname": socket.gethostname()}), flush=True)
if rank == int(sys.argv[1]):
    time.sleep(1)
    print(f"rank {rank} on {socket.gethostname()} fails now", file=sys.stderr, flush=True)
    sys.exit(int(sys.argv[2]))
time.sleep(120)
