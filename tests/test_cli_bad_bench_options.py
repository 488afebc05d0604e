"""Bad numeric options of ``homagg bench ddp|allreduce|net|models|compress|p4rate|faults`` and
``homagg control``, typed as a new user would (0, negative, nan, out of range): each is a
:class:`~homagg.ConfigError` naming the option and what it accepts, exit status 2, no traceback,
before any rank, switch or network starts (:mod:`homagg._options`).  The real CLI runs in a
subprocess.  Every case also passes small sizes, so that a command that took the value anyway
ends in seconds (and fails here) instead of running a full benchmark; the comment of each case
says what it did before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from homagg.wire import MAX_WORKERS
from tests.test_cli_bad_input import _homagg, _refused

_DDP = ["bench", "ddp", "--runs", "1", "--steps", "1", "--vocab", "100", "--backends", "gloo"]
_SWEEP = ["--world", "2", "--numel", "1000", "--density", "1", "--schemes", "dense", "--repeats", "1",
          "--baselines", "gloo", "--no-plot"]
_MODELS = ["bench", "models", "--loopback", "--quick", "--models", "ncf", "--methods", "gloo", "--world", "2",
           "--no-plot"]
_COMPRESS = ["bench", "compress", "--methods", "gloo", "--steps", "10", "--world", "2", "--no-progress", "--no-plot"]


@pytest.mark.parametrize("argv,words", [
    (_DDP + ["--warmup", "-1"], ["--warmup -1", "at least 0"]),  # StatisticsError traceback in rank 0
    (_DDP + ["--vocab", "0"], ["--vocab 0", "at least 1"]),  # RuntimeError traceback in the ranks
    (_DDP + ["--dim", "0"], ["--dim 0", "at least 1"]),  # ran, exit 0
    (_DDP + ["--batch", "0"], ["--batch 0", "at least 1"]),  # ran, exit 0
    (_DDP + ["--fields", "0"], ["--fields 0", "at least 1"]),  # ran, exit 0
    (_DDP + ["--runs", "0"], ["--runs 0", "at least 1"]),  # one message for three options
    (_DDP + ["--timeout", "nan"], ["--timeout nan", "> 0"]),  # ran: "did not finish within nans"
    (_DDP + ["--timeout", "0"], ["--timeout 0", "> 0"]),  # ran: "did not finish within 0.0s"
    (_DDP + ["--backends", "foo"], ["--backends 'foo'", "homagg, gloo"]),  # AssertionError traceback
    (_DDP + ["--backends", ","], ["--backends ','", "homagg, gloo"]),  # measured nothing, exit 0
    # started 33 homagg ranks that hung until --timeout
    (_DDP + ["--backends", "homagg", "--world", str(MAX_WORKERS + 1), "--timeout", "20"],
     [f"--world {MAX_WORKERS + 1}", f"1..{MAX_WORKERS}"]),
])
def test_bench_ddp(argv: list[str], words: list[str]) -> None:
    _refused(_homagg(*argv), *words)


@pytest.mark.parametrize("command", ["allreduce", "net"])
@pytest.mark.parametrize("extra,words", [
    (["--timeout", "nan"], ["--timeout nan", "> 0"]),  # ValueError traceback once the ranks ran
    (["--timeout", "0"], ["--timeout 0", "> 0"]),  # ranks started, then "printed nothing for 0s (hung?)"
    (["--repeats", "0"], ["--repeats 0", "at least 1"]),  # bench net said "bench allreduce: ..."
    (["--density", "nan"], ["--density nan", "(0, 1]"]),
    (["--numel", "1e15"], ["--numel 1000000000000000", "memory"]),  # TypeError/allocation traceback in a rank
    # 33 ranks started; the homagg ones hung until --timeout
    (["--world", str(MAX_WORKERS + 1), "--timeout", "10"], [f"--world {MAX_WORKERS + 1}", f"1..{MAX_WORKERS}"]),
])
def test_bench_allreduce_and_net(command: str, extra: list[str], words: list[str], tmp_path: Path) -> None:
    quick = ["--quick"] if command == "net" else []
    _refused(_homagg("bench", command, *quick, *_SWEEP, "--out", str(tmp_path), *extra), *words)


@pytest.mark.parametrize("extra,words", [
    (["--batch", "0"], ["--batch 0", "at least 1"]),  # ran with the model's own batch size, exit 0
    (["--timeout", "nan"], ["--timeout nan", "> 0"]),  # ValueError traceback
    (["--iterations", "0"], ["--iterations 0", "at least 1"]),  # one message listing five options
    (["--methods", "homagg", "--world", str(MAX_WORKERS + 1), "--timeout", "10"],
     [f"--world {MAX_WORKERS + 1}", f"2..{MAX_WORKERS}"]),  # 33 ranks started, hung until --timeout
])
def test_bench_models(extra: list[str], words: list[str], tmp_path: Path) -> None:
    _refused(_homagg(*_MODELS, "--out", str(tmp_path), *extra), *words)


@pytest.mark.parametrize("extra,words", [
    (["--methods", ","], ["--methods ','", "gloo"]),  # trained nothing, exit 0
    (["--batch", "0"], ["--batch 0", "at least 1"]),  # trained, exit 0
    (["--lr", "nan"], ["--lr nan", "> 0"]),  # trained, exit 0
    (["--momentum", "2"], ["--momentum 2", "[0, 1)"]),  # trained (diverging), exit 0
    (["--tolerance", "nan"], ["--tolerance nan", "[0, inf)"]),  # trained, exit 0: the check cannot fail
    (["--timeout", "nan"], ["--timeout nan", "> 0"]),  # trained, exit 0
    (["--timeout", "0"], ["--timeout 0", "> 0"]),  # every method "failed", exit 1
])
def test_bench_compress(extra: list[str], words: list[str], tmp_path: Path) -> None:
    _refused(_homagg(*_COMPRESS, "--out", str(tmp_path), *extra), *words)


@pytest.mark.parametrize("extra,words", [
    # before: one message for four options ("need --numel, --workers, --repeats >= 1 and densities in (0, 1]")
    (["--workers", "0"], ["--workers 0", f"1..{MAX_WORKERS}"]),
    (["--workers", "1000"], ["--workers 1000", f"1..{MAX_WORKERS}"]),
    (["--densities", "2"], ["--densities 2", "(0, 1]"]),
    (["--repeats", "0"], ["--repeats 0", "at least 1"]),
    (["--schemes", "zip"], ["--schemes 'zip'", "choose one or more of"]),  # before: KeyError traceback
])
def test_bench_gpu(extra: list[str], words: list[str]) -> None:
    _refused(_homagg("bench", "gpu", "--numel", "1000", "--densities", "0.5", "--schemes", "dense", "--workers", "2",
                     "--repeats", "1", "--device", "cpu", *extra), *words)


@pytest.mark.parametrize("extra,words", [
    (["--repeats", "0"], ["--repeats 0", "at least 1"]),  # StatisticsError after starting BMv2
    (["--rounds", "0"], ["--rounds 0", "at least 1"]),
    (["--rates", "fast"], ["--rates 'fast'", "ascending"]),  # ValueError traceback
    (["--grpc-port", "99999"], ["--grpc-port 99999", "1..65535"]),
])
def test_bench_p4rate(extra: list[str], words: list[str]) -> None:
    """Checked before the BMv2 tools are looked for: the same answer with or without them."""
    _refused(_homagg("bench", "p4rate", "--rounds", "3", "--rates", "1000", "--repeats", "1", *extra), *words)


@pytest.mark.parametrize("extra,words", [
    (["--parts", "soak", "--soak-loss", "2"], ["--soak-loss 2", "[0, 1)"]),  # "emulator did not start within 30.0s"
    (["--parts", "soak", "--duration", "nan"], ["--duration nan", "> 0"]),  # hung
    (["--parts", "soak", "--workers", "0"], ["--workers 0", f"1..{MAX_WORKERS}"]),  # the switch's "world_size 0"
    (["--parts", "fuzz", "--fuzz", "-1"], ["--fuzz -1", "at least 1"]),  # fuzzed nothing, exit 0
    (["--parts", "fuzz", "--fuzz-rate", "0"], ["--fuzz-rate 0", "> 0"]),  # ZeroDivisionError traceback
    (["--parts", "loss", "--loss-iters", "0"], ["--loss-iters 0", "at least 1"]),  # StatisticsError traceback
    (["--parts", "loss", "--loss-rates", "2"], ["--loss-rates 2", "[0, 1)"]),  # "emulator did not start"
    (["--parts", "loss", "--timeout", "nan"], ["--timeout nan", "> 0"]),  # ValueError traceback
    (["--parts", "foo"], ["--parts 'foo'", "soak, fuzz, loss, crash, chaos"]),  # ran nothing, exit 0
    (["--parts", "crash", "--crash-steps", "0"], ["--crash-steps 0", "at least 1"]),  # ran, exit 0
    # ran twice undisturbed (the kill comes after the last step), exit 0
    (["--parts", "crash", "--crash-steps", "3", "--crash-at", "3", "--crash-width", "8"],
     ["--crash-at 3", "0..2"]),
])
def test_bench_faults(extra: list[str], words: list[str]) -> None:
    _refused(_homagg("bench", "faults", "--quick", *extra), *words)


def _job_file(tmp_path: Path) -> Path:
    path = tmp_path / "jobs.json"
    path.write_text(json.dumps({"jobs": [{"job_id": 1, "world_size": 2}],
                                "bmv2": {"switches": [{"name": "s1", "grpc": "127.0.0.1:1", "device_id": 0,
                                                       "service_ip": "10.0.0.254",
                                                       "service_mac": "02:48:41:00:00:fe"}]}}))
    return path


@pytest.mark.parametrize("extra,words", [
    (["--timeout", "nan"], ["--timeout nan", "> 0"]),  # waited for the switch forever
    (["--timeout", "inf"], ["--timeout inf", "> 0"]),  # OverflowError traceback
    (["--timeout", "0"], ["--timeout 0", "> 0"]),  # "no P4Runtime server ... after 0.0s"
    (["--job", "99"], ["--job 99", "its jobs: 1"]),  # added nothing (a switch that answered: exit 0)
    (["--job", "1", "--job", "-1"], ["--job -1", "its jobs: 1"]),
])
def test_control(extra: list[str], words: list[str], tmp_path: Path) -> None:
    _refused(_homagg("control", "add", "--config", str(_job_file(tmp_path)), *extra, timeout=30), *words)
