"""Start ``world`` rank processes of a script (like torchrun, without its start-up cost) and collect results.

Each rank gets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT`` (a free
loopback port) and ``HOMAGG_RESULT_DIR``; a rank reports by writing ``rank<r>.json`` there (see
:func:`write_result`).  Every wait is bounded: on timeout all ranks are killed and the error names
the ranks still running, with the tail of their output.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent

__all__ = ["free_port", "process_alive", "launch", "write_result", "run_checks", "check_values", "RankFailure", "REPO",
           "SCRIPTS",
           "tensor_to_json", "tensor_from_json", "make_input", "entry_point_site"]


class RankFailure(AssertionError):
    """A rank exited non-zero, timed out, or wrote no result."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (a zombie is gone for our purpose)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def launch(
    script: str,
    world: int,
    *,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    timeout: float = 120.0,
) -> tuple[list[dict[str, Any]], list[str]]:
    """Run ``SCRIPTS/script`` as ``world`` ranks; return (per-rank results, per-rank output)."""
    with tempfile.TemporaryDirectory(prefix="homagg-dist-") as tmp:
        base = dict(os.environ)
        base.update(env or {})
        base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(world),
                    HOMAGG_RESULT_DIR=tmp, PYTHONUNBUFFERED="1")
        base["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), base.get("PYTHONPATH", "")) if p)
        procs = []
        logs = []
        for r in range(world):
            log = open(Path(tmp) / f"rank{r}.log", "w+")
            logs.append(log)
            procs.append(subprocess.Popen([sys.executable, str(SCRIPTS / script), *args],
                                          env={**base, "RANK": str(r), "LOCAL_RANK": str(r)},
                                          stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO)))
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.05)
        running = [r for r, p in enumerate(procs) if p.poll() is None]
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        outputs = []
        for log in logs:
            log.seek(0)
            outputs.append(log.read())
            log.close()
        if running:
            raise RankFailure(f"{script}: ranks {running} still running after {timeout}s\n" + _tails(outputs))
        bad = [(r, p.returncode) for r, p in enumerate(procs) if p.returncode != 0]
        if bad:
            raise RankFailure(f"{script}: ranks exited with {bad}\n" + _tails(outputs))
        results = []
        for r in range(world):
            path = Path(tmp) / f"rank{r}.json"
            if not path.exists():
                raise RankFailure(f"{script}: rank {r} wrote no result\n" + _tails(outputs))
            results.append(json.loads(path.read_text()))
        return results, outputs


def _tails(outputs: list[str], n: int = 3000) -> str:
    return "\n".join(f"--- rank {r} ---\n{out[-n:]}" for r, out in enumerate(outputs))


def write_result(result: Mapping[str, Any]) -> None:
    """Write this rank's result (called by the rank scripts)."""
    out = Path(os.environ["HOMAGG_RESULT_DIR"]) / f"rank{os.environ['RANK']}.json"
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(out)


def run_checks(checks: Sequence[tuple[str, Callable[[], Any]]]) -> dict[str, Any]:
    """Run named checks in order; map each name to ``"ok"``, a returned value, or its traceback."""
    results: dict[str, Any] = {}
    for name, check in checks:
        try:
            value = check()
            results[name] = "ok" if value is None else value
        except Exception:  # noqa: BLE001 - reported to the test, which fails on it
            results[name] = "FAILED\n" + traceback.format_exc()
    return results


def check_values(per_rank: Sequence[Mapping[str, Any]], check: str) -> list[Any]:
    """Every rank's value of ``check`` (:func:`run_checks`' results, one per rank); a rank whose
    check raised fails here, with its traceback."""
    values = [res[check] for res in per_rank]
    for rank, value in enumerate(values):
        assert not (isinstance(value, str) and value.startswith("FAILED")), f"rank {rank}: {value}"
    return values


def tensor_to_json(t: Any) -> dict[str, Any]:
    """A tensor as JSON (dtype, shape, raw bytes in base64): :func:`tensor_from_json` gives it back bit for bit."""
    import torch

    t = t.detach().cpu().contiguous()
    raw = t.reshape(-1).view(torch.uint8).numpy().tobytes()
    return {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "data": base64.b64encode(raw).decode()}


def tensor_from_json(d: Mapping[str, Any]) -> Any:
    """Inverse of :func:`tensor_to_json`."""
    import torch

    raw = bytearray(base64.b64decode(d["data"]))
    dtype = getattr(torch, d["dtype"])
    flat = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
    return flat.view(dtype).reshape(d["shape"])


def make_input(rank: int, spec: Mapping[str, Any]) -> Any:
    """Rank ``rank``'s input described by ``spec`` (``homagg.testing.sparse_tensor`` keyword arguments,
    ``dtype`` as a name): rank scripts return the spec, tests rebuild every rank's input from it."""
    import torch

    from homagg.testing import sparse_tensor

    kw = dict(spec)
    return sparse_tensor(rank, tuple(kw.pop("shape")), kw.pop("density"), dtype=getattr(torch, kw.pop("dtype")), **kw)


def entry_point_site(folder: Path) -> Path:
    """A site dir declaring homagg's ``torch.backends`` entry point, as an installed wheel does."""
    info = folder / "homagg_entrypoint_test-0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: homagg-entrypoint-test\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text("[torch.backends]\nhomagg = homagg._autoload:autoload\n")
    return folder
