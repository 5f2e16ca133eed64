"""accord.run: the ``accordrun`` launcher and ``accord.spawn``.

Torch-free on purpose (the launcher's start-up time counts): nothing here imports torch,
except ``accordrun --check-build``, which reports on it.
"""
