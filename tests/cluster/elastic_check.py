"""Checks of an elastic job's history (the logs of scripts/elastic_job.py), computed
independently of accord: the committed steps, the world size of each, identical weights on
every rank, every sample once per epoch, and the final weights of a one-process replay."""
from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

SAMPLES = 48  # elastic_job.py's defaults
LR, MOMENTUM = 0.02, 0.5


def load(log_dir: Path) -> list[dict[str, Any]]:
    """Every line every worker logged."""
    out = []
    for path in sorted(log_dir.glob("log.*.jsonl")):
        out.extend(json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return out


def committed(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per committed step, in order: the job's history.

    Ranks log a step once it is committed on them. If a failure made some ranks go back to an
    earlier commit, the step was redone: the version logged last is the one the job kept
    (the at-most-one-uncommitted-batch rule), and its predecessor chain is the history.
    """
    by_step: dict[int, dict[tuple, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        key = (r["size"], r["epoch"], json.dumps(r["batches"]))
        by_step[r["gstep"]][key].append(r)
    history = []
    for step in sorted(by_step):
        versions = by_step[step]
        kept = max(versions.values(), key=lambda rs: max(x["t"] for x in rs))
        first = kept[0]
        history.append({"gstep": step, "size": first["size"], "epoch": first["epoch"],
                        "batches": first["batches"], "t": min(x["t"] for x in kept),
                        "digests": {x["rank"]: x["w"] for x in kept}, "members": sorted(x["m"] for x in kept)})
    assert [h["gstep"] for h in history] == list(range(1, len(history) + 1)), "a committed step is missing"
    return history


def size_changes(history: list[dict[str, Any]]) -> list[int]:
    """The world sizes in order, each change once: e.g. [2, 4, 2, 3, 2]."""
    sizes: list[int] = []
    for h in history:
        if not sizes or sizes[-1] != h["size"]:
            sizes.append(h["size"])
    return sizes


def check_same_weights(history: list[dict[str, Any]]) -> None:
    """Every rank that logged a step holds bit-identical weights after it."""
    for h in history:
        assert len(set(h["digests"].values())) == 1, f"ranks disagree after step {h['gstep']}: {h['digests']}"
        assert len(h["batches"]) == h["size"], h


def check_samples(history: list[dict[str, Any]], samples: int = SAMPLES) -> int:
    """Within each epoch every sample index is trained on exactly once, apart from the padding
    of the epoch's last step (fewer than the world size of repeats, as in DistributedSampler).
    Returns the number of complete epochs."""
    epochs: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for h in history:
        epochs[h["epoch"]].append(h)
    for epoch, steps in epochs.items():
        counts = Counter(i for h in steps for batch in h["batches"] for i in batch)
        assert sorted(counts) == list(range(samples)), f"epoch {epoch}: samples missing: " \
            f"{sorted(set(range(samples)) - set(counts))}"
        before_last = Counter(i for h in steps[:-1] for batch in h["batches"] for i in batch)
        assert max(before_last.values()) == 1, f"epoch {epoch}: a sample repeated before the last step"
        extra = sum(counts.values()) - samples
        assert extra < steps[-1]["size"], f"epoch {epoch}: {extra} repeats (padding is < world size)"
    return len(epochs)


def replay(history: list[dict[str, Any]]) -> list[float]:
    """The final weights of one process applying the same steps: for each step, the mean over
    that step's ranks of the gradient of each rank's mean loss on its batch."""
    import torch

    gen = torch.Generator().manual_seed(0)
    X = torch.randn(SAMPLES, 4, generator=gen, dtype=torch.float64)
    Y = X @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]], dtype=torch.float64) + 0.1
    torch.manual_seed(1000)  # worker 0's initial weights: it is rank 0 throughout the test
    model = torch.nn.Linear(4, 1).double()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for h in history:
        opt.zero_grad()
        n = len(h["batches"])
        for batch in h["batches"]:
            idx = torch.tensor(batch)
            (torch.nn.functional.mse_loss(model(X[idx]), Y[idx]) / n).backward()
        opt.step()
    return [v for p in model.parameters() for v in p.detach().flatten().tolist()]


def first_step_after(history: list[dict[str, Any]], t: float, size: int) -> float | None:
    """Seconds from ``t`` to the first committed step at world size ``size`` after it."""
    later = [h["t"] for h in history if h["t"] > t and h["size"] == size]
    return min(later) - t if later else None
