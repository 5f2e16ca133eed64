"""Messages between KVStore workers and parameter servers (no pickle).

A message is ``[tags, header, payload_0, ..., payload_{n-1}]`` (:mod:`accord.kvstore.transport`
carries it on a connection whose ends have proven they hold the secret): ``header`` is a small
JSON object, each payload a raw array buffer sent without a copy. ``tags`` is
``nonce | payload_tag | header_tag`` (16 + 16 + 32 bytes)::

    nonce       = 16 random bytes, drawn for every new list of payloads
    payload_key = HMAC-SHA256(secret, DOMAIN | "payload-key" | direction | nonce)
    payload_tag = Poly1305(payload_key, n | len(payload_0) | payload_0 | ... | payload_{n-1})
    header_tag  = HMAC-SHA256(secret, DOMAIN | direction | mode | nonce | payload_tag
                                      | len(header) | header | n | len(payload_0) | ...)

(lengths and counts are 8-byte big-endian; ``mode`` says whether payload bytes are covered.)
This is the shape of ChaCha20-Poly1305's authenticator: a one-time Poly1305 key derived by a PRF
from a nonce, with the header bound to the payload tag by an HMAC. Poly1305 is as strong as HMAC
only if a key never tags two *different* byte strings, and here it never does: every sealed list
of payloads gets a fresh random 128-bit nonce, so a fresh key. The one reuse is deliberate and
harmless: a sender that resends byte-identical payloads may resend their nonce and tag too
(:class:`PayloadSeal`; a server answering every worker's pull of one unchanged stored value
computes Poly1305 once), which tags the same bytes under the same key again and reveals nothing
new; the server drops the saved seal before it changes those bytes. Each answer still has its own
header tag (its header names the request it answers). Without the secret nobody can compute a
payload key; payloads cannot be swapped between messages (another nonce, another key), reordered,
truncated or altered, nor a payload tag moved to another header. Poly1305 runs at ~6 GB/s per
core here (SHA-256 at 0.5-1.5 GB/s), streamed over the frames without copying.

The receiver checks, in this order and in constant time (:func:`hmac.compare_digest`), the
header tag and then the payload tag, and only then parses the header or hands out a payload.
The direction byte stops a worker's request from being reflected back as an answer; the header's
``sid`` (random per worker connection) and strictly increasing ``seq`` stop replays (the server
drops a seq it has already seen from that sid; a worker accepts only answers to requests it has
pending). A request's ``to`` names the random token of the one server process it is for, and an
answer's ``from`` carries it back (:mod:`accord.kvstore.directory`), so a message recorded for one
server is refused by every other, in this job or a later one with the same secret.

Memory is bounded before any tag is checked: the transport checks the counts and lengths a
message announces against :data:`MAX_HEADER`, :data:`MAX_PAYLOADS` and the frame limit
(:func:`frame_limit`) before it buffers them, and the header tag (:func:`check_head`, which
covers the payload lengths and the payload tag) before it allocates memory for the payloads;
the payload tag is checked once they are in (:func:`open_body`). After the tags, a header nested
deeper than :data:`MAX_HEADER_DEPTH` is refused (the JSON codec recurses). :func:`seal` refuses
to build a header over :data:`MAX_HEADER` bytes, so the sender fails at once (a very long key).

A job on a network it trusts, like the one Gloo and NCCL need for their unauthenticated data
plane, may set ACCORD_KVSTORE_PAYLOAD_MAC=0 on every process: messages then carry no payload tag
(``tags`` is ``nonce | header_tag``), so headers (requests, keys, shapes, sequence numbers,
payload lengths) stay authenticated and replay-proof while array bytes are not. Both ends apply
their own setting and ``mode`` is authenticated, so a mismatch is refused, never silently
downgraded.

A server answers a message with a wrong tag with a refusal and closes the connection
(:mod:`accord.kvstore.transport`), so that a worker with the wrong secret fails at once instead
of timing out.

Payload tags need the ``cryptography`` package (``pip install 'accord[ps]'``).
"""
from __future__ import annotations

import hmac
import json
import os
import struct
from typing import Any, Sequence

from accord.errors import AuthenticationError, ConfigError, RendezvousError, with_hint
from accord.runtime.settings import HostAndSecret
from accord.store.secret import read_secret_file, secret_from_hex

__all__ = ["HeaderTooLarge", "Head", "PayloadSeal", "ProtocolError", "TO_SERVER", "TO_WORKER",
           "check_head", "frame_limit", "load_secret", "open_body", "open_message",
           "require_payload_mac", "seal"]

DOMAIN = b"accord-kvstore-v2"
TO_SERVER = b"W"
TO_WORKER = b"S"
MAX_HEADER = 64 * 1024
# Deepest nesting of lists and objects a header may have (real ones nest 4 deep: entries of
# set_states). Python's JSON codec recurses, so a deeper header could exhaust the stack when it
# is decoded or when an answer echoes part of it back.
MAX_HEADER_DEPTH = 16
MAX_PAYLOADS = 1 << 16
MAX_ITEMSIZE = 16  # the widest number type a payload may hold (float128)
NONCE_BYTES, HEADER_TAG_BYTES, PAYLOAD_TAG_BYTES = 16, 32, 16
_MODE = {True: b"P", False: b"L"}  # payload bytes covered / lengths only
_U64 = struct.Struct("!Q")
_WRONG_MAC_HINT = ("every worker and server of the job must use the same secret (ACCORD_JOB_SECRET "
                   "or ACCORD_SECRET_FILE) and the same ACCORD_KVSTORE_PAYLOAD_MAC; a stale or "
                   "foreign process may be connecting")

_poly1305: list[Any] = []  # the Poly1305 class, imported on first use (cryptography loads in ~5 ms)


class ProtocolError(RendezvousError):
    """A message is malformed (wrong frame count, oversized or non-JSON header)."""


class HeaderTooLarge(ProtocolError, ValueError):
    """A message to send has a header over :data:`MAX_HEADER` bytes (a very long key, say)."""


def require_payload_mac() -> Any:
    """The Poly1305 class of ``cryptography``; call it early to fail at start, not mid-run.

    Raises:
        ConfigError: ``cryptography`` is not installed.
    """
    if not _poly1305:
        try:
            from cryptography.hazmat.primitives.poly1305 import Poly1305
        except ImportError as exc:
            raise ConfigError(with_hint(
                f"the parameter-server transport authenticates array bytes with Poly1305 from the "
                f"'cryptography' package, which cannot be imported ({exc})",
                "pip install 'accord[ps]' (or pip install cryptography) on every host; only on a "
                "trusted network, ACCORD_KVSTORE_PAYLOAD_MAC=0 skips payload authentication")) from None
        _poly1305.append(Poly1305)
    return _poly1305[0]


def frame_limit(chunk_elements: int = 1 << 20) -> int:
    """The largest frame a server accepts when workers send pieces of at most ``chunk_elements``
    elements (ACCORD_KVSTORE_CHUNK_ELEMENTS): the header limit plus the widest such piece."""
    return MAX_HEADER + max(1, int(chunk_elements)) * MAX_ITEMSIZE


def _view(frame: Any) -> memoryview:
    """The bytes of a bytes object, array or memoryview, without a copy."""
    view = memoryview(frame)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


class PayloadSeal:
    """The nonce and payload tag of payloads that one sender sends unchanged in several messages.

    Pass the same object to :func:`seal` each time: the first call fills it, later calls with the
    same direction and payload lengths reuse it instead of running Poly1305 again. The sender
    must call :meth:`clear` before it changes the bytes (see the module docstring for why a
    reused seal is safe only for identical bytes).
    """

    __slots__ = ("for_", "nonce", "tag")

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        """Forget the seal (the payload bytes are about to change)."""
        self.for_: tuple[bytes, tuple[int, ...]] | None = None
        self.nonce = self.tag = b""


def _header_tag(secret: bytes, direction: bytes, payload_mac: bool, nonce: bytes, payload_tag: bytes,
                header: bytes, lengths: Sequence[int]) -> bytes:
    msg = b"".join((DOMAIN, direction, _MODE[payload_mac], nonce, payload_tag,
                    _U64.pack(len(header)), header, _U64.pack(len(lengths)),
                    struct.pack(f"!{len(lengths)}Q", *lengths)))
    return hmac.digest(secret, msg, "sha256")


def _payload_tag(secret: bytes, direction: bytes, nonce: bytes, views: Sequence[memoryview]) -> bytes:
    # A one-time key per nonce (see the module docstring for why it never tags two byte strings).
    key = hmac.digest(secret, DOMAIN + b"payload-key" + direction + nonce, "sha256")
    mac = require_payload_mac()(key)
    mac.update(_U64.pack(len(views)))
    for view in views:
        mac.update(_U64.pack(view.nbytes))
        mac.update(view)  # streamed from the frame's memory, no copy
    return mac.finalize()


def seal(secret: bytes, direction: bytes, header: dict[str, Any], payloads: Sequence[Any] = (),
         reuse: PayloadSeal | None = None, payload_mac: bool = True) -> list[Any]:
    """The frames of one message: ``[tags, header, *payloads]`` (payloads as given, uncopied).

    Args:
        reuse: a :class:`PayloadSeal` for payloads sent unchanged in several messages.
        payload_mac: authenticate the payload bytes (False: only their count and lengths).

    Raises:
        HeaderTooLarge: the header would exceed :data:`MAX_HEADER` bytes (nothing is sent).
        ConfigError: ``payload_mac`` is on and ``cryptography`` is missing.
    """
    data = json.dumps(header, separators=(",", ":")).encode()
    if len(data) > MAX_HEADER:
        raise _too_large(header, len(data))
    views = [_view(p) for p in payloads]
    lengths = tuple(v.nbytes for v in views)
    if not payload_mac:
        nonce, ptag = os.urandom(NONCE_BYTES), b""
    elif reuse is not None and reuse.for_ == (direction, lengths):
        nonce, ptag = reuse.nonce, reuse.tag
    else:
        nonce = os.urandom(NONCE_BYTES)
        ptag = _payload_tag(secret, direction, nonce, views)
        if reuse is not None:
            reuse.for_, reuse.nonce, reuse.tag = (direction, lengths), nonce, ptag
    htag = _header_tag(secret, direction, payload_mac, nonce, ptag, data, lengths)
    return [nonce + ptag + htag, data, *payloads]


def _too_large(header: dict[str, Any], size: int) -> HeaderTooLarge:
    key = header.get("key")
    what = f"{header['op']!r} message" if "op" in header else "answer"
    if isinstance(key, str) and len(key) > 256:
        what += f" for key {key[:40]!r}... ({len(key)} characters)"
    return HeaderTooLarge(with_hint(
        f"the {what} would have a {size}-byte header, over the parameter servers' limit of "
        f"{MAX_HEADER} bytes (they would refuse it)",
        "use shorter keys: a key travels in the header of every request about it (str keys of "
        "up to a few thousand characters fit)"))


def _refuse(what: str) -> AuthenticationError:
    return AuthenticationError(with_hint(f"a kvstore message carried a wrong MAC ({what})",
                                         _WRONG_MAC_HINT))


def open_message(secret: bytes, direction: bytes, frames: Sequence[Any],
                 payload_mac: bool = True) -> tuple[dict[str, Any], list[Any]]:
    """Authenticate, then decode ``[tags, header, *payloads]``; returns (header, payload frames).

    Nothing is parsed or returned before both tags are verified.

    Raises:
        AuthenticationError: a tag does not match (wrong secret, tampering, reflection, swapped
            or reordered payloads, a different ACCORD_KVSTORE_PAYLOAD_MAC at the sender).
        ProtocolError: too few/many frames, an oversized header, or a header that is not a JSON
            object or nests deeper than MAX_HEADER_DEPTH (checked only after the tags).
        ConfigError: ``payload_mac`` is on and ``cryptography`` is missing.
    """
    if len(frames) < 2 or len(frames) > 2 + MAX_PAYLOADS:
        raise ProtocolError(f"a kvstore message has {len(frames)} frames (expected 2 to "
                            f"{2 + MAX_PAYLOADS})")
    payloads = list(frames[2:])
    head = check_head(secret, direction, bytes(_view(frames[0])), _view(frames[1]),
                      [_view(p).nbytes for p in payloads], payload_mac)
    return open_body(secret, direction, head, payloads, payload_mac)


class Head:
    """A message's tags and header bytes whose header tag has been verified (:func:`check_head`);
    its payloads are still to be received and checked (:func:`open_body`)."""

    __slots__ = ("nonce", "payload_tag", "data")

    def __init__(self, nonce: bytes, payload_tag: bytes, data: bytes) -> None:
        self.nonce, self.payload_tag, self.data = nonce, payload_tag, data


def check_head(secret: bytes, direction: bytes, tags: bytes, header: Any, lengths: Sequence[int],
               payload_mac: bool = True) -> Head:
    """Verify a message's header tag, which covers the header bytes, the count and length of its
    payloads and their payload tag, before any payload is received (a transport can then refuse
    to allocate memory for payloads nobody with the secret announced).

    Raises:
        ProtocolError: an oversized header or too many payloads.
        AuthenticationError: the tag does not match, or has the other ACCORD_KVSTORE_PAYLOAD_MAC's length.
    """
    if len(header) > MAX_HEADER:
        raise ProtocolError(f"a kvstore message header of {len(header)} bytes exceeds {MAX_HEADER}")
    if len(lengths) > MAX_PAYLOADS:
        raise ProtocolError(f"a kvstore message has {len(lengths)} payloads (at most {MAX_PAYLOADS})")
    ptag_len = PAYLOAD_TAG_BYTES if payload_mac else 0
    if len(tags) != NONCE_BYTES + ptag_len + HEADER_TAG_BYTES:
        raise _refuse(f"{len(tags)} tag bytes, expected {NONCE_BYTES + ptag_len + HEADER_TAG_BYTES}")
    nonce, ptag = tags[:NONCE_BYTES], tags[NONCE_BYTES:NONCE_BYTES + ptag_len]
    data = bytes(header)
    expected = _header_tag(secret, direction, payload_mac, nonce, ptag, data, lengths)
    if not hmac.compare_digest(tags[NONCE_BYTES + ptag_len:], expected):
        raise _refuse("header")
    return Head(nonce, ptag, data)


def open_body(secret: bytes, direction: bytes, head: Head, payloads: list[Any],
              payload_mac: bool = True) -> tuple[dict[str, Any], list[Any]]:
    """Verify the payload tag of a message whose head passed :func:`check_head` (with these
    payloads' lengths), then decode its header; returns (header, payloads).

    Raises:
        AuthenticationError: the payload tag does not match.
        ProtocolError: the header is not a JSON object or nests deeper than MAX_HEADER_DEPTH.
    """
    if payload_mac:
        views = [_view(p) for p in payloads]
        if not hmac.compare_digest(head.payload_tag, _payload_tag(secret, direction, head.nonce, views)):
            raise _refuse("payload")
    data = head.data
    try:
        decoded = json.loads(data)
    except ValueError as exc:
        raise ProtocolError(f"kvstore message header is not JSON: {exc}") from None
    except RecursionError:  # nested too deeply for the decoder itself
        raise _too_deep(data) from None
    # The brackets bound the depth from above: only a header with many of them is walked.
    if data.count(b"[") + data.count(b"{") > MAX_HEADER_DEPTH and _nests_deeper(decoded, MAX_HEADER_DEPTH):
        raise _too_deep(data)
    if not isinstance(decoded, dict):
        raise ProtocolError(f"kvstore message header is a {type(decoded).__name__}, not an object")
    return decoded, payloads


def _too_deep(data: bytes) -> ProtocolError:
    return ProtocolError(f"a kvstore message header ({len(data)} bytes) nests lists or objects "
                         f"deeper than {MAX_HEADER_DEPTH} levels")


def _nests_deeper(value: Any, limit: int) -> bool:
    """Whether ``value`` (decoded JSON) nests lists or objects more than ``limit`` levels deep;
    iterative, so that the check itself cannot exhaust the stack."""
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def load_secret() -> bytes:
    """The job secret from ACCORD_JOB_SECRET (hex) or ACCORD_SECRET_FILE (a 0600 file of hex).

    Torch-free (servers must not import torch), same rules as the runtime's bootstrap.

    Raises:
        ConfigError: neither is set, the hex is invalid or short, or the file is readable by
            group or others.
    """
    source = HostAndSecret.from_environ()
    text = source.secret_hex
    if not text:
        path = source.secret_file
        if not path:
            raise ConfigError(with_hint(
                "parameter servers and their workers need the job secret, and neither "
                "ACCORD_JOB_SECRET nor ACCORD_SECRET_FILE is set",
                "start the job with accordrun (it sets the secret), or export ACCORD_JOB_SECRET="
                "$(python -c 'import secrets; print(secrets.token_hex(32))') for every process"))
        return read_secret_file(path)
    return secret_from_hex(text, "ACCORD_JOB_SECRET")
