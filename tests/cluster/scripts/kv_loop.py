"""``kv_loop.py READY_DIR``: dist_sync push/pull in a loop until something fails (a lost server).

Writes READY_DIR/ready.<rank> after the first round trip."""
import os
import sys
import time

import numpy as np

import accord.kvstore as kvs

kv = kvs.create("dist_sync")
kv.init("w", np.zeros(1000, np.float32))
deadline = time.monotonic() + 120
rounds = 0
while time.monotonic() < deadline:
    kv.push("w", np.ones(1000, np.float32))
    kv.pull("w")
    rounds += 1
    if rounds == 1:
        open(os.path.join(sys.argv[1], f"ready.{kv.rank}"), "w").close()
    time.sleep(0.05)
kv.close()
