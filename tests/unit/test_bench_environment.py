"""accord.bench.environment.describe: plain JSON-friendly values, nothing that needs torch to read
(a rank's description is unpickled by the launcher, which never imports torch)."""
import json
import pickle

import pytest
import torch

from accord.bench.environment import describe

pytestmark = pytest.mark.timeout(30)


def test_versions_are_plain_strings_that_unpickle_without_torch():
    info = describe(world_size=2, threads=1, backend="gloo", device="cpu")
    assert type(info["torch"]) is str and info["torch"] == str(torch.__version__)
    assert type(info["numpy"]) is str
    assert b"torch_version" not in pickle.dumps(info)  # torch's TorchVersion class would be named
    assert json.loads(json.dumps(info)) == info
