"""A worker of an elastic job run from a --sync-dst-dir copy (no training):

    python elastic_in_dir.py LOG_DIR

Reads data/payload.txt (a file of the copy) as in_dir.py does, writes LOG_DIR/report.<worker id>.json
(its working folder, host and that file), then waits for LOG_DIR/stop (at most 120 s) and exits 0."""
import json
import os
import socket
import sys
import time

log_dir = sys.argv[1]
member = os.environ["ACCORD_ELASTIC_ID"]
with open("data/payload.txt", encoding="utf-8") as fh:
    payload = fh.read()
report = os.path.join(log_dir, f"report.{member}.json")
with open(report + ".tmp", "w", encoding="utf-8") as fh:
    json.dump({"member": int(member), "cwd": os.getcwd(), "hostname": socket.gethostname(), "payload": payload}, fh)
os.replace(report + ".tmp", report)  # the test never reads a half-written report
deadline = time.monotonic() + 120
while not os.path.exists(os.path.join(log_dir, "stop")) and time.monotonic() < deadline:
    time.sleep(0.1)
