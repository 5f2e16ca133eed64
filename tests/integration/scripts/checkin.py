"""Worker that checks in at accord's store like accord's init does (except --skip-rank),
then sleeps. Used to test --start-timeout without depending on the runtime's bootstrap."""
import os
import sys
import time

from accord.store.connection import StoreConnection
from accord.worker_contract import CHECKIN_KEY

rank = int(os.environ["ACCORD_RANK"])
skip = int(sys.argv[1]) if len(sys.argv) > 1 else -1
if rank != skip:
    conn = StoreConnection(os.environ["ACCORD_STORE_ADDR"], int(os.environ["ACCORD_STORE_PORT"]),
                           bytes.fromhex(os.environ["ACCORD_JOB_SECRET"]), timeout=10)
    conn.set(CHECKIN_KEY.format(rank=rank), b"1")
    conn.close()
    print(f"rank {rank} checked in", flush=True)
time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 60)
