"""``fail_on.py RANK CODE [READY_DIR]``: every rank writes READY_DIR/ready.<rank> (if given) and
waits 120 s; rank RANK exits with CODE after a second."""
import json
import os
import socket
import sys
import time

rank = int(os.environ["ACCORD_RANK"])
print("REPORT " + json.dumps({"rank": rank, "hostname": socket.gethostname()}), flush=True)
if len(sys.argv) > 3:
    open(os.path.join(sys.argv[3], f"ready.{rank}"), "w").close()
if rank == int(sys.argv[1]):
    time.sleep(1)
    print(f"rank {rank} on {socket.gethostname()} fails now", file=sys.stderr, flush=True)
    sys.exit(int(sys.argv[2]))
time.sleep(120)
print(f"rank {rank} waited to the end", flush=True)  # what a job that was not stopped shows
