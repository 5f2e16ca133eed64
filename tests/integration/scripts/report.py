"""Worker for launcher tests: prints its environment contract as one JSON line, then output
that exercises the launcher's line handling (stderr, a \\r progress redraw, a multi-byte
character split across writes, a last line without a newline)."""
import json
import os
import sys
import time

NAMES = [
    "ACCORD_RANK", "ACCORD_SIZE", "ACCORD_LOCAL_RANK", "ACCORD_LOCAL_SIZE", "ACCORD_CROSS_RANK",
    "ACCORD_CROSS_SIZE", "ACCORD_HOSTNAME", "ACCORD_STORE_ADDR", "ACCORD_STORE_PORT", "ACCORD_JOB_ID",
    "ACCORD_ERROR_FILE", "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE",
    "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE", "HOROVOD_HOSTNAME", "RANK", "WORLD_SIZE", "LOCAL_RANK",
    "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS",
    "ACCORD_FUSION_THRESHOLD", "ACCORD_CYCLE_TIME", "ACCORD_HIERARCHICAL_ALLREDUCE", "ACCORD_LOG_LEVEL",
    "CUDA_VISIBLE_DEVICES", "ACCORD_CACHE_CAPACITY", "ACCORD_TIMELINE_MARK_CYCLES", "ACCORD_COLLECTIVE_TIMEOUT",
    "NCCL_IB_DISABLE",
]

env = {k: os.environ.get(k) for k in NAMES}
env["secret_len"] = len(os.environ.get("ACCORD_JOB_SECRET", ""))
env["argv"] = sys.argv[1:]
print("ENV " + json.dumps(env), flush=True)
rank = os.environ["ACCORD_RANK"]
print(f"to stderr from {rank}", file=sys.stderr, flush=True)
sys.stdout.write("progress 1/2\rprogress 2/2\r\n")
sys.stdout.flush()
snow = "\u2603".encode()  # 3 bytes, written in two pieces
sys.stdout.buffer.write(b"snow " + snow[:1])
sys.stdout.flush()
time.sleep(0.05)
sys.stdout.buffer.write(snow[1:] + b"\n")
sys.stdout.write(f"last line of {rank} without newline")
sys.stdout.flush()
