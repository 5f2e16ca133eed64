"""Worker for whole-job restarts with torch: ``--mode fit`` trains ``accord.Model.fit(save_dir=...)``
(which resumes from its last epoch checkpoint when ACCORD_RESTART_COUNT > 0); ``--mode state``
trains with ``hvd.elastic.TorchState`` committed to disk every step and restored from it at the
start. ``--fail A:E:R``: in attempt A, rank R exits 3 at the start of epoch (or step) E.
Prints ``RESULT <json>`` with the final weights."""
import argparse
import json
import os
import sys

import numpy as np
import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--mode", choices=["fit", "state"], required=True)
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


torch.manual_seed(0)
rng = np.random.default_rng(0)
x = rng.normal(size=(32, 4)).astype(np.float32)
y = (x.sum(axis=1) > 0).astype(np.int64)
net = nn.Linear(4, 2)

if args.mode == "fit":
    import accord
    from accord.hapi import Callback

    class FailAt(Callback):
        def on_epoch_begin(self, epoch, logs=None):
            maybe_fail(self.model.rank, epoch)

    model = accord.Model(net)
    model.prepare(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), nn.CrossEntropyLoss())
    model.fit((x, y), batch_size=4, epochs=args.epochs, verbose=0, save_dir=args.dir, callbacks=[FailAt()])
    rank = model.rank
else:
    import accord.torch as hvd

    hvd.init()
    rank = hvd.rank()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=net.named_parameters())
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    state = hvd.elastic.TorchState(net, opt, step=0)
    path = os.path.join(args.dir, "state.pt")
    resumed = state.restore_from_disk(path)
    print("RESUMED " + json.dumps({"rank": rank, "resumed": resumed, "step": state.step}), flush=True)
    for step in range(state.step, args.epochs):
        maybe_fail(rank, step)
        part = slice(rank * 4 + step % 2 * 8, rank * 4 + step % 2 * 8 + 4)  # each rank its own batch
        opt.zero_grad()
        nn.functional.cross_entropy(net(torch.from_numpy(x[part])), torch.from_numpy(y[part])).backward()
        opt.step()
        state.step = step + 1
        state.commit_to_disk(path)
weights = [round(float(v), 6) for v in torch.cat([t.detach().flatten() for t in net.parameters()])]
print("RESULT " + json.dumps({"rank": rank, "weights": weights, "attempt": attempt}), flush=True)
