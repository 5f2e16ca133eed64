"""The message of a name that ranks submitted with different signatures (a mismatch), one line
per field that differs, naming each rank's value (used by :func:`accord.engine.negotiation.negotiate.decide`)."""
from __future__ import annotations

from accord.comm.ops import ReduceOp
from accord.engine.request import RAGGED_OPS, Op, Signature
from accord.errors import with_hint

_LABELS = [  # (field, label) in the order they are reported
    ("op", "operations"),
    ("process_set", "process sets"),
    ("device", "device types"),
    ("dtype", "data types"),
    ("wire_dtype", "compressed data types"),
    ("shape", "shapes"),
    ("reduce_op", "reduce ops"),
    ("root", "root ranks"),
    ("prescale", "prescale factors"),
    ("postscale", "postscale factors"),
]


def _show(fieldname: str, value) -> str:
    if fieldname == "shape":
        return str(list(value))
    if fieldname == "reduce_op":
        return ReduceOp(value).name if value >= 0 else "none"
    return str(value)


def _per_rank(fieldname: str, sigs: dict[int, Signature]) -> str:
    groups: dict[str, list[int]] = {}
    for r in sorted(sigs):
        groups.setdefault(_show(fieldname, getattr(sigs[r], fieldname)), []).append(r)
    parts = []
    for value, ranks in groups.items():
        who = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
        parts.append(f"{who} sent {value}")
    return ", ".join(parts)


def mismatch_message(name: str, sigs: dict[int, Signature]) -> str:
    """E.g. "Mismatched allreduce shapes for 'w': rank 0 sent [3], rank 1 sent [4]" + HINT."""
    ops = {s.op for s in sigs.values()}
    op = next(iter(ops)) if len(ops) == 1 else None
    lines = []
    for fieldname, label in _LABELS:
        if fieldname == "wire_dtype" and all(s.wire_dtype == s.dtype for s in sigs.values()):
            continue  # no rank compresses: the data types line says it all
        if len({getattr(s, fieldname) for s in sigs.values()}) > 1:
            if fieldname == "shape" and op is not None and Op(op) in RAGGED_OPS:
                label = "shapes (after dim 0)"
            what = f"{op} {label}" if op is not None and fieldname != "op" else label
            lines.append(f"Mismatched {what} for {name!r}: {_per_rank(fieldname, sigs)}")
    return with_hint("\n".join(lines),
                     "every rank must submit the same collective under a name, with the same "
                     "shape, dtype, device, op, root and scale factors; check the code path that "
                     "builds this tensor on the ranks listed")
