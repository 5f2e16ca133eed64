"""Python objects as sealed pickles: what ``broadcast_object`` / ``allgather_object`` send.

The sender pickles (cloudpickle when installed, as Horovod does, so lambdas and local classes
travel too) and seals the bytes with an HMAC under the job secret; a receiver checks the seal
before unpickling, so bytes no holder of the secret sealed are refused, never unpickled.
Unpickling runs code chosen by the sender: only ranks of the same job should be senders.
Torch-free; :mod:`accord.frontend.object_collectives` (every frontend's broadcast_object) binds ``purpose``
to the call.
"""
from __future__ import annotations

import io
import pickle
from typing import Any

from accord.store.secret import seal, unseal

try:
    import cloudpickle as _pickler
except ImportError:  # pragma: no cover - depends on the environment
    _pickler = pickle


def dumps_sealed(secret: bytes, purpose: bytes, obj: Any) -> bytes:
    """``obj`` pickled and sealed for ``purpose``."""
    buf = io.BytesIO()
    _pickler.dump(obj, buf)
    return seal(secret, purpose, buf.getvalue())


def loads_sealed(secret: bytes, purpose: bytes, data: bytes) -> Any:
    """The object of :func:`dumps_sealed`'s output.

    Raises:
        ValueError: the seal is missing or wrong (nothing was unpickled).
    """
    return pickle.loads(unseal(secret, purpose, data))  # cloudpickle output loads with pickle
