"""Worker for whole-job restarts with torch: two trainings in one process, each resuming from
disk after a restart. ``fit``: ``accord.Model.fit(save_dir=...)`` (which resumes from its last
epoch checkpoint when ACCORD_RESTART_COUNT > 0). ``state``: a loop with ``hvd.elastic.TorchState``
committed to disk every step and restored from it at the start; its step E runs at the start of
fit's epoch E. Two trainings share the process because a torch worker takes seconds to start.

``--fail A:E:R``: in attempt A, rank R exits 3 at the start of epoch E (before state step E).
Prints ``RESUMED <json>`` (what the state loop restored) and ``RESULT <json>`` with both
trainings' final weights.
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
from torch import nn

import accord
import accord.torch as hvd
from accord.hapi import Callback


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--fail", action="append", default=[])
    args = p.parse_args()
    attempt = int(os.environ.get("ACCORD_RESTART_COUNT", "0"))
    fails = [tuple(int(v) for v in f.split(":")) for f in args.fail]

    def maybe_fail(rank, when):
        if (attempt, when, rank) in fails:
            print(f"rank {rank} failing at {when} of attempt {attempt}", file=sys.stderr, flush=True)
            os._exit(3)

    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 4)).astype(np.float32)
    y = (x.sum(axis=1) > 0).astype(np.int64)
    torch.manual_seed(0)
    fit_net = nn.Linear(4, 2)
    torch.manual_seed(0)
    state_net = nn.Linear(4, 2)

    hvd.init()
    rank = hvd.rank()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(state_net.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=state_net.named_parameters())
    hvd.broadcast_parameters(state_net.state_dict(), root_rank=0)
    state = hvd.elastic.TorchState(state_net, opt, step=0)
    path = os.path.join(args.dir, "state.pt")
    resumed = state.restore_from_disk(path)
    print("RESUMED " + json.dumps({"rank": rank, "resumed": resumed, "step": state.step}), flush=True)

    def state_steps(upto):
        for step in range(state.step, upto):
            part = slice(rank * 4 + step % 2 * 8, rank * 4 + step % 2 * 8 + 4)  # each rank its own batch
            opt.zero_grad()
            nn.functional.cross_entropy(state_net(torch.from_numpy(x[part])), torch.from_numpy(y[part])).backward()
            opt.step()
            state.step = step + 1
            state.commit_to_disk(path)

    class FailAt(Callback):
        def on_epoch_begin(self, epoch, logs=None):
            maybe_fail(self.model.rank, epoch)
            state_steps(epoch + 1)

    model = accord.Model(fit_net)
    model.prepare(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), nn.CrossEntropyLoss())
    model.fit((x, y), batch_size=4, epochs=args.epochs, verbose=0, save_dir=os.path.join(args.dir, "fit"),
              callbacks=[FailAt()])
    state_steps(args.epochs)

    def flat(net):
        return [round(float(v), 6) for v in torch.cat([t.detach().flatten() for t in net.parameters()])]

    print("RESULT " + json.dumps({"rank": rank, "fit": flat(fit_net), "state": flat(state_net), "attempt": attempt}),
          flush=True)


if __name__ == "__main__":
    main()
