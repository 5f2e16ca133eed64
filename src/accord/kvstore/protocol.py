"""Messages between KVStore workers and parameter servers (ZeroMQ multipart, no pickle).

A message is ``[tag, header, payload_0, ..., payload_n]`` (a ROUTER socket adds the peer's
routing id in front): ``header`` is a small JSON object, each payload a raw array buffer sent
without a copy. The tag authenticates all of it with the per-job secret::

    tag = HMAC-SHA256(secret, DOMAIN | direction | len(header) | header
                              | n | SHA-256(payload_0) | ... | SHA-256(payload_n))

Hashing each payload first lets a server compute the digest of a stored value once per version
and answer every worker's pull of it with a short HMAC; it is as strong as an HMAC over the raw
bytes because SHA-256 is collision resistant.

Hashing costs CPU (SHA-256 runs at ~1.5 GB/s per core here, and a dist_sync round hashes every
byte pushed and pulled on both ends). A job on a network it trusts, like the one Gloo and NCCL
need for their unauthenticated data plane, may set ACCORD_KVSTORE_PAYLOAD_MAC=0 on every
process: the "digest" of a payload is then only its length, so headers (requests, keys, shapes,
sequence numbers) stay authenticated and replay-proof while array bytes are not. Both ends apply
their own setting, so a mismatch is refused, never silently downgraded. The receiver checks the tag with
:func:`hmac.compare_digest` before it parses a byte of the header. The direction byte stops a
worker's request from being reflected back as an answer; the header's ``sid`` (random per worker
connection) and strictly increasing ``seq`` stop replays (the server drops a seq it has already
seen from that sid; a worker accepts only answers to requests it has pending).

A server answers a message with a wrong tag with the unauthenticated frames
``[b"", REFUSED]``, so that a worker with the wrong secret fails at once instead of timing out.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import struct
from typing import Any, Sequence

from accord import config
from accord.errors import AuthenticationError, ConfigError, RendezvousError, with_hint
from accord.runtime.secret import read_secret_file, secret_from_hex

__all__ = ["ProtocolError", "REFUSED", "TO_SERVER", "TO_WORKER", "digest", "load_secret",
           "open_message", "seal"]

DOMAIN = b"accord-kvstore-v1"
TO_SERVER = b"W"
TO_WORKER = b"S"
REFUSED = b"accord-kvstore-refused"
MAX_HEADER = 64 * 1024
MAX_PAYLOADS = 1 << 16
_U64 = struct.Struct("!Q")


class ProtocolError(RendezvousError):
    """A message is malformed (wrong frame count, oversized or non-JSON header)."""


def _view(frame: Any) -> memoryview:
    """The bytes of a zmq Frame, bytes object or array, without a copy."""
    buf = getattr(frame, "buffer", None)
    view = memoryview(frame if buf is None else buf)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def digest(payload: Any, payload_mac: bool = True) -> bytes:
    """SHA-256 of one payload buffer (with ``payload_mac=False``: its length only)."""
    view = _view(payload)
    if not payload_mac:
        return b"length" + _U64.pack(view.nbytes)
    return hashlib.sha256(view).digest()


def _tag(secret: bytes, direction: bytes, header: bytes, digests: Sequence[bytes]) -> bytes:
    mac = hmac.new(secret, DOMAIN + direction, hashlib.sha256)
    mac.update(_U64.pack(len(header)))
    mac.update(header)
    mac.update(_U64.pack(len(digests)))
    for d in digests:
        mac.update(d)
    return mac.digest()


def seal(secret: bytes, direction: bytes, header: dict[str, Any], payloads: Sequence[Any] = (),
         digests: Sequence[bytes | None] | None = None, payload_mac: bool = True) -> list[Any]:
    """The frames of one message: ``[tag, header, *payloads]``.

    ``digests`` may give precomputed payload digests (None entries are computed here).
    """
    data = json.dumps(header, separators=(",", ":")).encode()
    known = list(digests) if digests is not None else [None] * len(payloads)
    ds = [d if d is not None else digest(p, payload_mac) for d, p in zip(known, payloads)]
    return [_tag(secret, direction, data, ds), data, *payloads]


def open_message(secret: bytes, direction: bytes, frames: Sequence[Any],
                 payload_mac: bool = True) -> tuple[dict[str, Any], list[Any]]:
    """Authenticate, then decode ``[tag, header, *payloads]``; returns (header, payload frames).

    Raises:
        AuthenticationError: the tag does not match (wrong secret, tampering, reflection).
        ProtocolError: too few/many frames, an oversized header, or a header that is not a JSON
            object (checked only after the tag).
    """
    if len(frames) < 2 or len(frames) > 2 + MAX_PAYLOADS:
        raise ProtocolError(f"a kvstore message has {len(frames)} frames (expected 2 to "
                            f"{2 + MAX_PAYLOADS})")
    tag, header = bytes(_view(frames[0])), _view(frames[1])
    if len(header) > MAX_HEADER:
        raise ProtocolError(f"a kvstore message header of {len(header)} bytes exceeds {MAX_HEADER}")
    payloads = list(frames[2:])
    expected = _tag(secret, direction, bytes(header), [digest(p, payload_mac) for p in payloads])
    if not hmac.compare_digest(tag, expected):
        raise AuthenticationError(with_hint(
            "a kvstore message carried a wrong MAC",
            "every worker and server of the job must use the same secret (ACCORD_JOB_SECRET or "
            "ACCORD_SECRET_FILE) and the same ACCORD_KVSTORE_PAYLOAD_MAC; a stale or foreign "
            "process may be connecting"))
    try:
        decoded = json.loads(bytes(header))
    except ValueError as exc:
        raise ProtocolError(f"kvstore message header is not JSON: {exc}") from None
    if not isinstance(decoded, dict):
        raise ProtocolError(f"kvstore message header is a {type(decoded).__name__}, not an object")
    return decoded, payloads


def load_secret() -> bytes:
    """The job secret from ACCORD_JOB_SECRET (hex) or ACCORD_SECRET_FILE (a 0600 file of hex).

    Torch-free (servers must not import torch), same rules as the runtime's bootstrap.

    Raises:
        ConfigError: neither is set, the hex is invalid or short, or the file is readable by
            group or others.
    """
    text = config.get("ACCORD_JOB_SECRET")
    if not text:
        path = config.get("ACCORD_SECRET_FILE")
        if not path:
            raise ConfigError(with_hint(
                "parameter servers and their workers need the job secret, and neither "
                "ACCORD_JOB_SECRET nor ACCORD_SECRET_FILE is set",
                "start the job with accordrun (it sets the secret), or export ACCORD_JOB_SECRET="
                "$(python -c 'import secrets; print(secrets.token_hex(32))') for every process"))
        return read_secret_file(path)
    return secret_from_hex(text, "ACCORD_JOB_SECRET")
