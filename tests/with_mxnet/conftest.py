"""MXNet 1.9.1 warns about numpy and distutils APIs on import: not ours to fix."""


def pytest_configure(config):
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:mxnet")
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:mxnet.*")
