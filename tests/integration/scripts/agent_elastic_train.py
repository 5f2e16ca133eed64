"""An hvd.elastic.run training loop for the elastic agent tests (``--nnodes MIN:MAX``).

    python agent_elastic_train.py --steps N --pid-dir D [--hold-step S --hold-file F]
                                  [--until-size K --step-sleep T] [--report-steps]

Each worker writes ``D/<ACCORD_ELASTIC_ID>.pid`` once, as it starts. With ``--hold-step S``
every rank writes ``D/<id>.held`` and waits, before step S, until the file F exists (the test
kills a node meanwhile).
With ``--until-size K`` it trains past N steps until a step has run on K workers (a node that
joins), sleeping T seconds per step; it gives up after 120 s (exit 4). Step s of rank r
trains on data seeded ``100*s + r``. ``--die M:S`` (repeatable): worker M SIGKILLs itself
before step S. With ``--report-steps`` rank 0 prints
``STEP {"step": s, "size": n, "t": wall clock}`` after each commit. Every rank that finishes
prints ``DONE {"rank", "member", "pid", "restart", "sizes", "weight", "bias"}``.
"""
import argparse
import json
import os
import signal
import time

import torch

import accord.torch as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--pid-dir", required=True)
parser.add_argument("--hold-step", type=int, default=-1)
parser.add_argument("--hold-file", default="")
parser.add_argument("--until-size", type=int, default=0)
parser.add_argument("--step-sleep", type=float, default=0.0)
parser.add_argument("--report-steps", action="store_true")
parser.add_argument("--die", action="append", default=[], help="MEMBER:STEP: that worker SIGKILLs itself there")
args = parser.parse_args()

member = int(os.environ["ACCORD_ELASTIC_ID"])
with open(os.path.join(args.pid_dir, f"{member}.pid"), "x") as fh:  # "x": a restarted process would fail here
    fh.write(str(os.getpid()))

torch.set_num_threads(1)
hvd.init()
torch.manual_seed(0)
model = torch.nn.Linear(3, 1).double()
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters())
state = hvd.elastic.TorchState(model, opt, step=0, sizes=[])
give_up = time.monotonic() + 120


def more(state):
    if state.step < args.steps:
        return True
    return bool(args.until_size) and args.until_size not in state.sizes


@hvd.elastic.run
def train(state):
    while more(state):
        if time.monotonic() > give_up:
            os._exit(4)
        if state.step == args.hold_step:
            open(os.path.join(args.pid_dir, f"{member}.held"), "a").close()
            while not os.path.exists(args.hold_file):
                if time.monotonic() > give_up:
                    os._exit(4)
                time.sleep(0.02)
        if f"{member}:{state.step}" in args.die:
            os.kill(os.getpid(), signal.SIGKILL)
        gen = torch.Generator().manual_seed(100 * state.step + hvd.rank())
        x = torch.randn(4, 3, generator=gen, dtype=torch.float64)
        y = torch.randn(4, 1, generator=gen, dtype=torch.float64)
        torch.nn.functional.mse_loss(state.model(x), y).backward()
        state.optimizer.step()
        state.optimizer.zero_grad()
        state.sizes.append(hvd.size())
        state.step += 1
        state.commit()
        if args.report_steps and hvd.rank() == 0:
            print("STEP " + json.dumps({"step": state.step, "size": hvd.size(), "t": time.time()}), flush=True)
        if args.step_sleep:
            time.sleep(args.step_sleep)


train(state)
print("DONE " + json.dumps({"rank": hvd.rank(), "member": member, "pid": os.getpid(),
                            "restart": os.environ.get("ACCORD_RESTART_COUNT"), "sizes": state.sizes,
                            "weight": model.weight.detach().flatten().tolist(),
                            "bias": model.bias.detach().flatten().tolist()}), flush=True)
hvd.shutdown()
