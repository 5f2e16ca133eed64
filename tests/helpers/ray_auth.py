"""Ray's token authentication for the test process's Ray clusters, with a token given in the
environment: tests/conftest.py imports this module, before any test module (and Ray) is imported.

Ray (>= 2.52) turns token authentication on for a new local cluster and, unless a token is given,
writes one to ~/.ray/auth_token, a file that outlives the test run. Importing this module sets
``RAY_AUTH_MODE=token`` and a fresh ``RAY_AUTH_TOKEN`` (unless they are set) for the rest of the
process, which Ray's processes inherit. For the whole process, and before Ray is imported: Ray
reads the mode once, when it is imported, and caches the first token it reads.
"""
from __future__ import annotations

import os
import secrets

os.environ.setdefault("RAY_AUTH_MODE", "token")
os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
