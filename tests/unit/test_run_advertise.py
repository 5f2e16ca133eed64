"""The address the launcher advertises to workers on other hosts (no network is touched: the
name lookup and the route probe are replaced)."""
import pytest

from accord.run.spec import advertise


@pytest.fixture
def machine(monkeypatch):
    """A fake host: its name's address and the source address of its routes, by destination."""
    seen = {"name": "10.0.0.5", "routes": {}}
    monkeypatch.setattr(advertise, "name_address", lambda: seen["name"])
    monkeypatch.setattr(advertise, "route_source", lambda host: seen["routes"].get(host))
    monkeypatch.setattr(advertise.socket, "gethostname", lambda: "box")
    return seen


def test_an_interface_given_wins(machine):
    assert advertise.advertised_address(["node7"], "192.168.4.4") == "192.168.4.4"


def test_towards_a_known_remote_host_the_route_source(machine):
    machine["routes"]["node7"] = "172.16.0.9"
    assert advertise.advertised_address(["localhost", "node7"], None) == "172.16.0.9"
    assert advertise.advertised_address(["node8"], None) == "box"  # no route: the name


def test_local_hosts_only_the_names_address_unless_it_is_loopback(machine):
    assert advertise.advertised_address(["localhost"], None) == "10.0.0.5"
    machine["name"] = "127.0.1.1"  # Debian's /etc/hosts entry for the machine's name
    machine["routes"][advertise._ANY_REMOTE] = "10.2.3.4"
    assert advertise.advertised_address(["localhost"], None) == "10.2.3.4"
    assert advertise.advertised_address([], None) == "10.2.3.4"  # no host printed yet
    machine["routes"].clear()  # no network at all: the loopback name address is all there is
    assert advertise.advertised_address([], None) == "127.0.1.1"
    machine["name"] = None
    assert advertise.advertised_address([], None) == "box"


@pytest.mark.parametrize("address, loopback", [("127.0.0.1", True), ("127.0.1.1", True), ("localhost", True),
                                               ("10.0.0.1", False), ("box", False)])
def test_is_loopback(address, loopback):
    assert advertise.is_loopback(address) is loopback


def test_route_source_of_a_real_socket_is_an_address_or_none():
    # on this machine, whatever its network: an IPv4 address string, or None without a route
    got = advertise.route_source(advertise._ANY_REMOTE)
    assert got is None or got.count(".") == 3


@pytest.mark.timeout(60)
def test_an_elastic_job_with_only_a_loopback_address_warns_and_still_runs(machine, capfd):
    import sys

    from accord.run.cli import main

    machine["name"] = "127.0.1.1"  # and no route: nothing but loopback to advertise
    code = main(["-np", "1", "--host-discovery-script", "echo localhost:1", sys.executable, "-c", "pass"])
    err = capfd.readouterr().err
    assert code == 0, err[-2000:]
    assert "would be told to reach this host at 127.0.1.1, a loopback address" in err
    assert "HINT: pass --network-interface NAME" in err
    machine["name"] = "10.0.0.5"
    assert main(["-np", "1", "--host-discovery-script", "echo localhost:1", sys.executable, "-c", "pass"]) == 0
    assert "loopback address" not in capfd.readouterr().err
