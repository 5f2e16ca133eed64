"""Reading the per-job secret: hex text, or a file only its owner may access. Torch-free, so
parameter servers and the launcher can use it too."""
from __future__ import annotations

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
