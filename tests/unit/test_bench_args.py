"""accord-bench's argument checks: every unusable value exits 2 with a HINT, before any rank starts."""
from __future__ import annotations

import pytest

from accord.bench import cli, launch, options, placement
from accord.errors import ConfigError

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def no_workers(monkeypatch):
    """Fail the test if the CLI tried to start ranks."""
    def refuse(*args, **kwargs):
        raise AssertionError("workers were started for invalid arguments")

    monkeypatch.setattr(launch, "run_workers", refuse)


def _exit2(capsys, argv, expected):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert expected in err, err
    message, _, hint = err.partition("\nHINT: ")
    assert hint.strip(), f"no HINT in: {err}"
    return err


@pytest.mark.parametrize("argv, expected", [
    (["collectives", "--ops", "allreduce,gather"], "unknown collective 'gather'"),
    (["collectives", "--dtype", "float8"], "unknown dtype 'float8'"),
    (["collectives", "--min-bytes", "4", "--max-bytes", "2"], "bad message sizes"),
    (["collectives", "--sizes", "4,12XB"], "cannot read a size from '12XB'"),
    (["collectives", "--step-factor", "1"], "--step-factor must be >= 2, got 1"),
    (["collectives", "--iters", "0"], "--iters must be >= 1, got 0"),
    (["collectives", "--warmup", "-1"], "--warmup must be >= 0, got -1"),
    (["collectives", "--backends", "nope"], "unknown backend 'nope'"),
    (["collectives", "--backends", "mpi"], "the mpi backend needs the ranks to be started by mpirun"),
    (["collectives", "--backends", "nccl"], "backend 'nccl' does not handle cpu tensors"),
    (["collectives", "--backends", "host"], "backend 'host' does not handle cpu tensors"),
    (["train", "--model", "mlp", "--channels-last"], "--channels-last applies to image models"),
    (["collectives", "--nproc-per-node", "0"], "--nproc-per-node must be >= 1, got 0"),
    (["collectives", "--threads", "0"], "--threads must be >= 1, got 0"),
    (["collectives", "--json", "/nonexistent-accord-dir/out.json"], "folder '/nonexistent-accord-dir' does not exist"),
    (["train", "--batch-size", "0"], "--batch-size must be >= 1, got 0"),
    (["train", "--steps", "0"], "--steps must be >= 1, got 0"),
    (["train", "--compiler-opt", "--warmup", "0"], "--compiler-opt needs at least one warm-up step"),
    (["train", "--model", "mlp", "--image-size", "64"], "--image-size does not apply to the mlp"),
    (["train", "--image-size", "4"], "--image-size must be >= 8, got 4"),
    (["train", "--lr", "0"], "--lr must be > 0"),
    (["train", "--repeats", "0"], "--repeats must be >= 1, got 0"),
])
def test_bad_values_exit_2_with_a_hint(capsys, no_workers, argv, expected):
    _exit2(capsys, argv, expected)


@pytest.mark.parametrize("argv, expected", [
    (["train", "--model", "vgg"], "invalid choice: 'vgg'"),
    (["train", "--amp-level", "O3"], "invalid choice: 'O3'"),
    (["collectives", "--compare", "ddp"], "invalid choice: 'ddp'"),
    (["train", "--steps", "ten"], "invalid int value: 'ten'"),
    (["bogus"], "invalid choice: 'bogus'"),
])
def test_argparse_errors_exit_2_with_a_hint(capsys, no_workers, argv, expected):
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert expected in err and "HINT: run `accord-bench" in err


def test_no_subcommand_prints_help(capsys, no_workers):
    assert cli.main([]) == 2
    assert "collectives" in capsys.readouterr().err


def test_plot_without_matplotlib(capsys, no_workers, monkeypatch, tmp_path):
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)
    err = _exit2(capsys, ["train", "--plot", str(tmp_path / "p.png")], "--plot needs matplotlib")
    assert "pip install matplotlib" in err


def test_cuda_without_a_gpu(capsys, no_workers):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    _exit2(capsys, ["train", "--device", "cuda"], "sees no CUDA device")


def test_models_match_the_registry():
    from accord.models import known_models

    assert sorted(options.MODELS) == known_models()


def test_parsers():
    assert options.parse_ops("all") == options.COLLECTIVE_OPS
    assert options.parse_ops("all_reduce, reduce_scatter,allreduce") == ("allreduce", "reducescatter")
    assert options.parse_dtypes("bf16,fp16,float32,fp32") == ("bfloat16", "float16", "float32")
    assert options.parse_sizes(None, "4", "64", 4) == (4, 16, 64)
    assert options.parse_sizes(None, "1K", "5K", 2) == (1024, 2048, 4096, 5120)
    assert options.parse_sizes("1MB,4,4,1K", "4", "8", 2) == (4, 1024, 1048576)
    with pytest.raises(ConfigError, match="HINT:"):
        options.parse_sizes("0", "4", "8", 2)


def test_placement_detects_an_outside_launcher(monkeypatch):
    where = placement.placement(3)
    assert (where.external, where.size, where.rank, where.local_size) == (False, 3, 0, 3)
    for key, value in {"ACCORD_RANK": "1", "ACCORD_SIZE": "4", "ACCORD_LOCAL_RANK": "1",
                       "ACCORD_LOCAL_SIZE": "2", "ACCORD_STORE_ADDR": "127.0.0.1",
                       "ACCORD_STORE_PORT": "1"}.items():
        monkeypatch.setenv(key, value)
    where = placement.placement(3)
    assert (where.external, where.source, where.rank, where.size, where.local_size) == (True, "accord", 1, 4, 2)
    assert placement.default_threads(2) >= 1


def test_non_zero_ranks_stay_quiet_on_errors(capsys, no_workers, monkeypatch):
    for key, value in {"ACCORD_RANK": "1", "ACCORD_SIZE": "2", "ACCORD_STORE_ADDR": "127.0.0.1",
                       "ACCORD_STORE_PORT": "1"}.items():
        monkeypatch.setenv(key, value)
    assert cli.main(["collectives", "--iters", "0"]) == 2
    assert capsys.readouterr().err == ""


def test_the_cli_parent_does_not_import_torch():
    import subprocess
    import sys

    code = ("import sys; from accord.bench import cli, options, placement; cli.build_parser(); "
            "options.resolve_backends('auto', 'cpu', placement.placement(2)); "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20)
    assert proc.returncode == 0, proc.stderr
