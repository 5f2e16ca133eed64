"""An elastic training job for accordrun --host-discovery-script (hvd.elastic.run, plain loop).

    python elastic_job.py LOG_DIR [--batch 2] [--samples 48] [--sleep 0.05]

Trains a linear model (float64, SGD with momentum) on a fixed dataset through an
ElasticSampler, epoch after epoch, until LOG_DIR/stop exists at an epoch's end (rank 0 decides,
every rank follows). LOG_DIR/start.<worker id>.json says when the worker started, had
imported torch and accord, and had joined (init returned). After each committed step every rank appends one JSON line to
LOG_DIR/log.<worker id>.jsonl: the step number, the epoch, the world size, this rank, the time,
the whole job's batch (each rank's sample indices, gathered) and a digest of the weights. The
test checks these against an independent replay (tests/cluster/elastic_check.py).
"""
import time

STARTED = time.time()  # before the imports: a new worker's start-up is part of growing

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402

import torch  # noqa: E402

import accord.torch as hvd  # noqa: E402

IMPORTED = time.time()

parser = argparse.ArgumentParser()
parser.add_argument("log_dir")
parser.add_argument("--batch", type=int, default=2)
parser.add_argument("--samples", type=int, default=48)
parser.add_argument("--sleep", type=float, default=0.05)
parser.add_argument("--fit", action="store_true", help="train with accord.Model.fit(elastic=True)")
args = parser.parse_args()

torch.set_num_threads(1)
hvd.init()
member = int(os.environ["ACCORD_ELASTIC_ID"])
log = open(os.path.join(args.log_dir, f"log.{member}.jsonl"), "a", buffering=1)
with open(os.path.join(args.log_dir, f"start.{member}.json"), "w") as fh:  # where start-up time goes
    json.dump({"started": STARTED, "imported": IMPORTED, "initialized": time.time()}, fh)

gen = torch.Generator().manual_seed(0)
X = torch.randn(args.samples, 4, generator=gen, dtype=torch.float64)
Y = X @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]], dtype=torch.float64) + 0.1


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return args.samples

    def __getitem__(self, i):
        return i, X[i], Y[i]


torch.manual_seed(1000 + member)  # different on every worker: the sync must make them equal
model = torch.nn.Linear(4, 1).double()
opt = None if args.fit else hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.5),
                               named_parameters=model.named_parameters())
sampler = hvd.elastic.ElasticSampler(Data(), shuffle=True, seed=5)
loader = torch.utils.data.DataLoader(Data(), batch_size=args.batch, sampler=sampler)
state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=0, gstep=0)
resets = []
state.register_reset_callbacks([lambda: resets.append(hvd.size())])


def digest():
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16]


def _record(member, step, batches):
    log.write(json.dumps({"m": member, "rank": hvd.rank(), "size": hvd.size(), "epoch": step[0],
                          "gstep": step[1], "t": time.time(), "batches": batches, "w": digest()}) + "\n")


@hvd.elastic.run
def train(state):
    while True:
        for i, (idx, x, y) in enumerate(loader):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            batches = hvd.allgather_object(idx.tolist())
            sampler.record_batch(i, args.batch)
            state.gstep += 1
            state.save()  # = commit() in two halves: log exactly what is committed
            _record(member, (state.epoch, state.gstep), batches)
            state.check_host_updates()
            time.sleep(args.sleep)
        stop = hvd.broadcast_object(os.path.exists(os.path.join(args.log_dir, "stop")), 0)
        state.epoch += 1
        sampler.set_epoch(state.epoch)
        state.commit()
        if stop:
            return


class Stop(Exception):
    """Every rank saw LOG_DIR/stop (rank 0's view) at an epoch's start: training is over."""


def fit_mode():
    """The same training through accord.Model.fit(elastic=True). The network reads the sample
    index as the first input column (and drops it), so the log knows each rank's batch."""
    from accord.hapi import Callback, Model

    class Indexed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = model  # the same initial weights as the plain loop
            self.seen = []

        def forward(self, xi):
            self.seen = xi[:, 0].long().tolist()
            return self.lin(xi[:, 1:])

    class Log(Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if hvd.broadcast_object(os.path.exists(os.path.join(args.log_dir, "stop")), 0):
                raise Stop()

        def on_train_batch_end(self, step, logs=None):  # before fit's own commit
            st = self.model.elastic_state
            _record(member, (st.epoch, st.commits + 1), hvd.allgather_object(net.seen))
            time.sleep(args.sleep)

    net = Indexed()
    fit_model = Model(net)
    fit_model.prepare(torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.5),
                      loss=torch.nn.functional.mse_loss)
    inputs = torch.cat([torch.arange(args.samples, dtype=torch.float64)[:, None], X], dim=1)
    try:
        fit_model.fit((inputs, Y), epochs=10_000, batch_size=args.batch, seed=5, verbose=0,
                      callbacks=[Log()], elastic=True)
    except Stop:
        pass
    return fit_model.elastic_state


if args.fit:
    state = fit_mode()
else:
    train(state)
weights = [p.detach().flatten().tolist() for p in model.parameters()]
print("DONE " + json.dumps({"m": member, "rank": hvd.rank(), "size": hvd.size(), "weights": weights,
                            "resets": resets, "epoch": state.epoch}), flush=True)
hvd.shutdown()
