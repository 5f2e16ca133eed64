"""MXNet 1.9.1 warns about numpy and distutils APIs on import: not ours to fix. The simulated
cluster's fixtures (``cluster``, ``shared_dir``) come from tests/cluster, for the MXNet job across
hosts; they skip with the reason where namespaces or sshd are unavailable."""
from cluster.conftest import cluster, cluster_session, shared_dir  # noqa: F401


def pytest_configure(config):
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:mxnet")
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:mxnet.*")
