"""Host strings, hostfiles (MPI and MXNet formats), --ips, device and rank lists."""
import json
import shutil
import socket
import subprocess

import pytest

from accord.errors import ConfigError
from accord.run.spec.hosts import (
    HostSlots,
    is_local,
    parse_devices,
    parse_hostfile,
    parse_hostfile_text,
    parse_hosts,
    parse_ips,
    parse_rank_list,
    this_host_addresses,
)


def test_parse_hosts_slots_and_bare_host():
    assert parse_hosts("h1:2,h2:4") == [HostSlots("h1", 2), HostSlots("h2", 4)]
    assert parse_hosts("node-1.example.com") == [HostSlots("node-1.example.com", 1)]
    assert parse_hosts("10.0.0.5:3") == [HostSlots("10.0.0.5", 3)]


def test_parse_hosts_repeated_host_sums_slots_in_first_order():
    assert parse_hosts("a:1,b:2,a:2") == [HostSlots("a", 3), HostSlots("b", 2)]


def test_parse_hosts_ipv6_needs_brackets():
    assert parse_hosts("[fe80::1]:2") == [HostSlots("fe80::1", 2)]
    with pytest.raises(ConfigError, match="need brackets"):
        parse_hosts("fe80::1:2")


@pytest.mark.parametrize("text, fragment", [
    ("h1:0", "0 slots"),
    ("h1:-2", "-2 slots"),
    ("h1:x", "must be an integer"),
    ("h1,,h2", "empty entry"),
    ("", "empty entry"),
    ("bad host:2", "not a valid host name"),
])
def test_parse_hosts_rejects_bad_input_with_hint(text, fragment):
    with pytest.raises(ConfigError) as info:
        parse_hosts(text)
    assert fragment in str(info.value) and "HINT:" in str(info.value)


def test_hostfile_all_formats_comments_and_blank_lines():
    text = """
    # MPI style
    node1 slots=4
    node2 slots=2 max_slots=8   # trailing comment
    node3:3
    node4

    node1 slots=1
    """
    assert parse_hostfile_text(text) == [
        HostSlots("node1", 5), HostSlots("node2", 2), HostSlots("node3", 3), HostSlots("node4", 1),
    ]


@pytest.mark.parametrize("line, fragment", [
    ("node1 slots=0", "0 slots"),
    ("node1 cores=4", "unknown field"),
    ("node1:2 slots=2", "not both"),
])
def test_hostfile_bad_lines_name_file_and_line(line, fragment):
    with pytest.raises(ConfigError) as info:
        parse_hostfile_text(f"ok\n{line}\n", source="hosts.txt")
    text = str(info.value)
    assert "hosts.txt:2" in text and fragment in text and "HINT:" in text


def test_hostfile_empty_and_missing(tmp_path):
    with pytest.raises(ConfigError, match="no hosts"):
        parse_hostfile_text("# nothing\n\n")
    with pytest.raises(ConfigError, match="cannot read"):
        parse_hostfile(str(tmp_path / "nope"))
    path = tmp_path / "hosts"
    path.write_text("a slots=2\nb:1\n")
    assert parse_hostfile(str(path)) == [HostSlots("a", 2), HostSlots("b", 1)]


def test_ips_give_every_host_nproc_per_node():
    assert parse_ips("10.0.0.1,10.0.0.2", 2) == [HostSlots("10.0.0.1", 2), HostSlots("10.0.0.2", 2)]
    with pytest.raises(ConfigError, match="nproc-per-node"):
        parse_ips("10.0.0.1", 0)


def test_devices_and_rank_lists():
    assert parse_devices("0,1, 3") == ("0", "1", "3")
    with pytest.raises(ConfigError, match="HINT:"):
        parse_devices("0,0")
    assert parse_rank_list("0,2", "--ranks-filter") == frozenset({0, 2})
    with pytest.raises(ConfigError, match="--ranks-filter"):
        parse_rank_list("a", "--ranks-filter")


def test_local_names():
    assert is_local("localhost") and is_local("127.0.0.1") and is_local("127.0.1.1")
    assert is_local(socket.gethostname())
    assert not is_local("node-that-is-not-here")
    assert is_local("box", local_names=frozenset({"box"}))


def _addresses_ip_lists() -> set[str]:
    """This machine's interface addresses as iproute2 reports them (independent of accord)."""
    done = subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, timeout=20, check=True)
    return {info["local"] for link in json.loads(done.stdout) for info in link.get("addr_info", [])}


@pytest.mark.skipif(shutil.which("ip") is None, reason="needs iproute2's ip to list addresses independently")
def test_an_address_of_this_host_is_local_and_others_are_not():
    listed = _addresses_ip_lists()
    assert any(a not in ("127.0.0.1", "::1") for a in listed), listed  # something beyond loopback
    for address in listed:
        assert is_local(address), address
    assert {str(a) for a in this_host_addresses()} >= listed
    for foreign in ("198.51.100.7", "2001:db8::7", "203.0.113.250"):  # documentation ranges
        assert foreign not in listed and not is_local(foreign), foreign
    assert is_local("[::1]") and not is_local("198.51.100.7", local_names=frozenset({"box"}))
