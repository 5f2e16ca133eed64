"""Print "MASTER <json>": whether MASTER_PORT is held for this job (a plain bind is refused) and
whether rank 0 can still serve on it the way torch's TCPStore does (SO_REUSEADDR, then listen)."""
import json
import os
import socket

port = int(os.environ["MASTER_PORT"])
with socket.socket() as plain:
    try:
        plain.bind(("127.0.0.1", port))
        plain_error = 0
    except OSError as exc:
        plain_error = exc.errno
served = None
if os.environ["RANK"] == "0":
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("", port))
        server.listen(1)
        served = server.getsockname()[1]
print("MASTER " + json.dumps({"rank": int(os.environ["RANK"]), "port": port, "plain_error": plain_error,
                              "served": served}), flush=True)
