"""Reading the per-job secret (hex text, or a file only its owner may access), and sealing
payloads with it. Torch-free, so parameter servers and the launcher can use it too."""
from __future__ import annotations

import errno
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


def read_secret_file(path: str, source: str = "ACCORD_SECRET_FILE") -> bytes:
    """The secret in ``path`` (``source``, a variable or a flag, names it in errors): a regular
    file, not a symlink, owned by this process's effective user, that group and others cannot access.

    The file is opened with O_NOFOLLOW (and O_NONBLOCK, so a FIFO cannot stall us), and the
    checks run with fstat on the open descriptor, so the file checked is the file read.

    Raises:
        ConfigError: the file is missing or unreadable, a symlink or not a regular file, owned
            by another user, has a loose mode, or holds no valid hex.
    """
    def refuse(what: str, hint: str) -> ConfigError:
        sep = "=" if source.isupper() else " "
        return ConfigError(with_hint(f"{source}{sep}{path!r} {what}", hint))

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise refuse("is a symbolic link, which is not followed for the job secret",
                         f"point {source} at the file itself") from None
        raise refuse(f"cannot be read: {exc}", f"point {source} at the job's secret file") from None
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise refuse("is not a regular file", f"point {source} at a plain file of hex")
        if info.st_uid != os.geteuid():
            raise refuse(f"is owned by uid {info.st_uid}, not by this process's user "
                         f"(uid {os.geteuid()})",
                         f"create the secret file as the user that runs the job, or `chown "
                         f"{os.geteuid()} {path}`")
        if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise refuse(f"has mode {stat.S_IMODE(info.st_mode):04o}: group or others may access "
                         "the job secret", f"run `chmod 600 {path}` so that only its owner can read it")
        text = fh.read(4096).decode("ascii", errors="replace")
    return secret_from_hex(text.strip(), f"the secret file {path!r}")


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
