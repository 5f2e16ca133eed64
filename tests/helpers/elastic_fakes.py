"""Stand-ins for the elastic driver's supervisor, store and discovery poller (unit tests)."""
from __future__ import annotations


class FakeSupervisor:
    grace = 1.0

    def __init__(self):
        self.ended: list = []  # members whose process ended, handed out by reap()
        self.asked: list[int] = []

    def reap(self):
        out, self.ended = self.ended, []
        return out

    def ask_to_stop(self, m):
        m.stopped = True
        self.asked.append(m.index)

    def kill_one(self, m):
        pass


class FakeStore(dict):
    closed = False

    def set(self, key, value):
        self[key] = value

    def get(self, key, default=None, timeout=None):
        return self[key] if key in self else default

    def add(self, key, delta):
        self[key] = int(self.get(key, 0)) + delta
        return self[key]

    def check(self, keys):
        return all(k in self for k in keys)


class FakePoller:
    def __init__(self):
        self.queue = []

    def start(self):
        return self

    def stop(self):
        pass

    def results(self):
        out, self.queue = self.queue, []
        return out
