"""Run from a --sync-dst-dir copy: report the working folder, the host and a file of the copy."""
import json
import os
import socket

with open("data/payload.txt", encoding="utf-8") as fh:
    payload = fh.read()
print("REPORT " + json.dumps({"rank": int(os.environ["ACCORD_RANK"]), "cwd": os.getcwd(),
                              "hostname": socket.gethostname(), "payload": payload}), flush=True)
