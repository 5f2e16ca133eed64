"""Hostile input that is not a network message: NaN and infinity in every float flag and float
environment variable, a NaN timeout sent to the store, and secret files that are symlinks,
FIFOs or owned by someone else."""
from __future__ import annotations

import math
import os
import pwd
import socket
import threading

import pytest

from accord import config
from accord.errors import ConfigError
from accord.store import wire
from accord.store.opcodes import Op, Status
from accord.store.secret import read_secret_file
from accord.store.server import StoreServer

pytestmark = pytest.mark.timeout(30)

NOT_FINITE = ["nan", "NaN", "inf", "-inf", "Infinity", "1e999"]


def _float_actions(parser):
    """Every option of ``parser`` (and its subcommands) whose value is a float."""
    import argparse

    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += [(f"{name} {flag}", a) for flag, a in _float_actions(sub)]
        elif action.option_strings and action.type is not None:
            try:
                value = action.type("1.5")
            except (ValueError, TypeError, Exception):  # noqa: B014 - any parser that refuses
                continue
            if isinstance(value, float):
                found.append((action.option_strings[-1], action))
    return found


def test_accordrun_refuses_nan_and_infinity_in_every_float_flag(capsys):
    from accord.run.cli import build_parser

    parser = build_parser()
    actions = _float_actions(parser)
    flags = [flag for flag, _ in actions]
    assert {"--start-timeout", "--grace-period", "--cycle-time-ms", "--fusion-threshold-mb",
            "--stall-check-warning-time-seconds", "--stall-check-shutdown-time-seconds",
            "--discovery-interval", "--elastic-timeout", "--blacklist-cooldown-range"} <= set(flags)
    for flag, action in actions:
        for text in NOT_FINITE:
            # a flag of several numbers (--blacklist-cooldown-range MIN MAX) gets the bad one first
            given = [f"{flag}={text}"] if action.nargs is None else [flag, text] + ["1"] * (action.nargs - 1)
            with pytest.raises(SystemExit) as info:
                parser.parse_args(["-np", "1", *given, "python3", "-c", "pass"])
            err = capsys.readouterr().err
            assert info.value.code == 2, (flag, text)
            # argparse reads a lone "-inf" as an option: refused too, as a missing value
            why = "expected" if action.nargs is not None and text.startswith("-") else "finite"
            assert flag in err and "HINT:" in err and why in err, (flag, text, err)


def test_accord_bench_refuses_nan_and_infinity_in_every_float_flag(capsys):
    from accord.bench.cli import build_parser

    parser = build_parser()
    flags = _float_actions(parser)
    assert any(flag.endswith("--lr") for flag, _ in flags)
    for flag, _ in flags:
        command, option = flag.split(" ")
        for text in NOT_FINITE:
            with pytest.raises(SystemExit) as info:
                parser.parse_args([command, f"{option}={text}"])
            err = capsys.readouterr().err
            assert info.value.code == 2, (flag, text)
            assert option in err and "HINT:" in err and "finite" in err, (flag, text, err)


def _float_variables():
    names = []
    for name, var in config.VARIABLES.items():
        try:
            value = var.parse("1.5")
        except ValueError:
            continue
        if isinstance(value, float):
            names.append(name)
    return names


def test_every_float_environment_variable_refuses_nan_and_infinity():
    names = _float_variables()
    assert {"ACCORD_START_TIMEOUT", "ACCORD_CYCLE_TIME", "ACCORD_KVSTORE_TIMEOUT",
            "ACCORD_COLLECTIVE_TIMEOUT"} <= set(names)
    for name in names:
        assert config.get(name, {name: "2.5"}) == 2.5
        for text in NOT_FINITE:
            with pytest.raises(ConfigError) as info:
                config.get(name, {name: text})
            message = str(info.value)
            assert name in message and "finite" in message and "HINT:" in message, message
        for alias in config.VARIABLES[name].aliases:  # Horovod's names are read the same way
            with pytest.raises(ConfigError, match=alias):
                config.get(name, {alias: "nan"})


def _raw_channel(port: int, secret: bytes) -> wire.Channel:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    return wire.client_handshake(sock, secret)


@pytest.mark.parametrize("op", [Op.GET, Op.WAIT, Op.MULTI_GET])
@pytest.mark.parametrize("timeout", [math.nan, math.inf, -math.inf])
def test_a_store_request_with_a_non_finite_timeout_gets_an_error_reply(op, timeout):
    secret = os.urandom(32)
    with StoreServer(secret=secret) as server:
        channel = _raw_channel(server.port, secret)
        try:
            key = "never-set" if op == Op.GET else ["never-set"]
            channel.send(wire.encode([int(op), key, timeout]))
            # refused as it came: a request that waited on its key would get no answer at all,
            # or a TIMEOUT, not this ERROR (the channel's 10 s socket timeout ends a hang)
            status, message = wire.decode(channel.recv())
            assert status == Status.ERROR and "timeout" in message and "finite" in message, message
            channel.send(wire.encode([int(Op.PING)]))  # the connection and its thread still serve
            assert wire.decode(channel.recv()) == [Status.OK]
        finally:
            channel.close()


def test_the_client_refuses_a_nan_timeout_before_sending():
    from accord.store.connection import StoreConnection

    secret = os.urandom(32)
    with StoreServer(secret=secret) as server, \
            StoreConnection("127.0.0.1", server.port, secret, timeout=5) as conn:
        with pytest.raises(ValueError, match="finite"):
            conn.get("k", timeout=math.nan)
        conn.set("k", b"v")  # the connection is still usable
        assert conn.get("k") == b"v"


# --- the secret file ----------------------------------------------------------------------------

def _secret_file(tmp_path, name="secret"):
    path = tmp_path / name
    path.write_text("ab" * 32)
    os.chmod(path, 0o600)
    return path


def test_a_secret_file_reached_through_a_symlink_is_refused(tmp_path):
    target = _secret_file(tmp_path)
    link = tmp_path / "link"
    link.symlink_to(target)
    assert read_secret_file(str(target)) == bytes.fromhex("ab" * 32)
    with pytest.raises(ConfigError) as info:
        read_secret_file(str(link))
    assert "symbolic link" in str(info.value) and "HINT:" in str(info.value)


def test_a_fifo_as_secret_file_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    released = []

    def release() -> None:
        """A reader blocked on the FIFO waits for a writer forever: after 20 s, be one."""
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # fails (ENXIO) with no reader
            released.append(True)
        except OSError:
            pass

    guard = threading.Timer(20, release)
    guard.name = "accord-test-fifo-guard"
    guard.start()
    try:
        with pytest.raises(ConfigError, match="not a regular file"):
            read_secret_file(str(fifo))
    finally:
        guard.cancel()
        guard.join()
    assert not released, "reading the FIFO blocked until a writer came"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the file to another user")
def test_a_secret_file_owned_by_another_user_is_refused(tmp_path):
    path = _secret_file(tmp_path)
    other = pwd.getpwnam("nobody").pw_uid
    os.chown(path, other, -1)
    with pytest.raises(ConfigError) as info:
        read_secret_file(str(path))
    text = str(info.value)
    assert f"owned by uid {other}" in text and f"uid {os.geteuid()}" in text and "HINT:" in text


def test_a_secret_file_with_a_loose_mode_is_still_refused(tmp_path):
    path = _secret_file(tmp_path)
    os.chmod(path, 0o640)
    with pytest.raises(ConfigError, match="chmod 600"):
        read_secret_file(str(path))
