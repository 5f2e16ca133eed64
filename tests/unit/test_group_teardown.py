"""Destroying process groups: the pause before the destructor on torch releases that need it."""
import pytest

from accord import group_teardown

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("version, releases", [
    ("2.4.1+cu121", False), ("2.7.1", False), ("2.8.0", True), ("2.10.0a0+git1234", True), ("2.13.0+cpu", True),
    ("3.0.0", True),
])
def test_which_torch_releases_join_the_gloo_workers_without_the_gil(version, releases):
    assert group_teardown._destructor_releases_gil(version) is releases


@pytest.mark.parametrize("releases, want", [
    (False, [("sleep", group_teardown.LINGER_S), ("destroy", "g")]),
    (True, [("destroy", "g")]),
])
def test_the_gil_is_let_go_before_the_destructor_only_where_needed(monkeypatch, releases, want):
    calls = []
    monkeypatch.setattr(group_teardown, "DESTRUCTOR_RELEASES_GIL", releases)
    monkeypatch.setattr(group_teardown.time, "sleep", lambda s: calls.append(("sleep", s)))
    monkeypatch.setattr(group_teardown.dist, "destroy_process_group", lambda g=None: calls.append(("destroy", g)))
    group_teardown.destroy_process_group("g")
    assert calls == want
