"""Reading the per-job secret (hex text, or a file only its owner may access), and sealing
payloads with it. Torch-free, so parameter servers and the launcher can use it too."""
from __future__ import annotations

import hashlib
import hmac
import os
import stat

from accord.errors import ConfigError, with_hint


def secret_from_hex(text: str, where: str) -> bytes:
    """Decode a hex secret of at least 16 bytes; ``where`` names its source in the error."""
    try:
        secret = bytes.fromhex(text.strip())
    except ValueError:
        secret = b""
    if len(secret) < 16:
        raise ConfigError(with_hint(
            f"{where} does not hold a hex secret of at least 16 bytes (got {len(text)} characters)",
            "generate one with `python -c \"import secrets; print(secrets.token_hex(32))\"`"))
    return secret


def read_secret_file(path: str) -> bytes:
    """The secret in ``path``, refusing a file that group or others may access.

    Raises:
        ConfigError: the file is missing or unreadable, has a loose mode, or holds no valid hex.
    """
    try:
        info = os.stat(path)
    except OSError as exc:
        raise ConfigError(with_hint(f"ACCORD_SECRET_FILE={path!r} cannot be read: {exc}",
                                    "point ACCORD_SECRET_FILE at the job's secret file")) from None
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(with_hint(
            f"ACCORD_SECRET_FILE={path!r} has mode {stat.S_IMODE(info.st_mode):04o}: group or "
            "others may access the job secret",
            f"run `chmod 600 {path}` so that only its owner can read it"))
    with open(path, encoding="ascii", errors="replace") as fh:
        return secret_from_hex(fh.read().strip(), f"the secret file {path!r}")


SEAL_BYTES = 32  # an HMAC-SHA256 tag


def seal(secret: bytes, purpose: bytes, data: bytes) -> bytes:
    """``data`` prefixed with an HMAC-SHA256 tag under the job secret, bound to ``purpose``
    (so a sealed payload for one use is refused by another)."""
    return hmac.new(secret, purpose + b"\0" + data, hashlib.sha256).digest() + data


def unseal(secret: bytes, purpose: bytes, sealed: bytes) -> bytes:
    """The data of :func:`seal`'s output, after checking its tag in constant time.

    Raises:
        ValueError: the tag is missing or does not match (not sealed by a holder of the job
            secret for ``purpose``, or altered on the way). Nothing of the data was decoded.
    """
    tag, data = sealed[:SEAL_BYTES], sealed[SEAL_BYTES:]
    expected = hmac.new(secret, purpose + b"\0" + data, hashlib.sha256).digest()
    if len(tag) != SEAL_BYTES or not hmac.compare_digest(tag, expected):
        raise ValueError(with_hint(
            f"a sealed {purpose.decode(errors='replace')} payload of {len(sealed)} bytes failed its "
            "authentication check and was not decoded",
            "every rank must share the job's secret; if they do, something other than the "
            "job's ranks wrote to the data plane: run it on a trusted network"))
    return data
