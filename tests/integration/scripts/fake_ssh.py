"""A stand-in for the ssh client: runs the remote script (its last argument) with sh on this
machine, in a new session, feeding it our stdin; when we die the script's stdin reaches
end-of-file, as a remote shell's does when the ssh connection drops. Records its argv in
$FAKE_SSH_LOG (to check that no secret is on a command line)."""
import json
import os
import subprocess
import sys
import threading

with open(os.environ["FAKE_SSH_LOG"], "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\n")
remote = subprocess.Popen(["sh", "-c", sys.argv[-1]], stdin=subprocess.PIPE, start_new_session=True)


def pump():
    while True:
        data = os.read(0, 4096)
        if not data:
            break
        remote.stdin.write(data)
        remote.stdin.flush()
    remote.stdin.close()


threading.Thread(target=pump, daemon=True).start()
code = remote.wait()
sys.exit(code if code >= 0 else 128 - code)
