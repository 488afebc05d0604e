"""A worker killed mid-stream, and two jobs at once on one switch."""

from __future__ import annotations

import time

import switch_emulator
from homagg.testing import UdpJobConfig, run_on_switch, udp_worker
from homagg.transport import ControlClient
from homagg.transport._procs import RankFailure, Workers, context

TIMEOUT = 3.0


def test_killed_worker_typed_error_slots_reclaimed_next_job_fine() -> None:
    with switch_emulator.start() as sw:
        ctl = ControlClient(sw.control_addr)
        world, victim = 3, 1
        job = ctl.admit(world, n_slots=8, words_per_packet=16)
        cfg = UdpJobConfig(numel=400000, density=0.02, seed=0, data=list(sw.data_addr),
                           control=list(sw.control_addr), job=job.to_dict(), timeout=TIMEOUT, schemes=["dense"],
                           secret=sw.secret)
        barrier = context().Barrier(world)
        ws = Workers(udp_worker, world, cfg, barrier, None)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # wait until the job is streaming
            jobs = ctl.status()["jobs"]
            if jobs and jobs[0]["packets"] > 200:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("job never started streaming")
        ws.procs[victim].kill()
        killed_at = time.monotonic()
        results = ws.join(timeout=60)
        elapsed = time.monotonic() - killed_at
        assert isinstance(results[victim], RankFailure) and results[victim].type == "Died"
        for r in (0, 2):
            f = results[r]
            assert isinstance(f, RankFailure) and f.type == "SwitchTimeoutError", f
            assert f"job {job.job_id}" in f.message and "slot" in f.message and "offset" in f.message
            assert f.attrs["missing"] == [victim], f.message
            assert f.attrs["job_id"] == job.job_id and job.slot_base <= f.attrs["slot"] < job.slot_base + job.n_slots
        assert elapsed < TIMEOUT + 8, elapsed  # survivors gave up within the configured timeout (+ start slack)
        # the controller removes the failed job: admission entries and slots are reclaimed
        assert ctl.slot_status(job.job_id, f.attrs["slot"])["banks"][f.attrs["bank"]]["missing"] == [victim]
        assert ctl.remove(job.job_id)
        assert ctl.status()["jobs"] == []
        # jobs can also expire by themselves when idle
        ctl.admit(1, n_slots=8, idle_timeout_s=0.2)
        deadline = time.monotonic() + 10
        while ctl.status()["jobs"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ctl.status()["jobs"] == [] and ctl.status()["counters"]["jobs_expired"] == 1
        # a new job on the same slots runs exactly
        results = run_on_switch(sw, 2, numel=5000, k=16, slots=8, schemes=["dense", "sketch"])
        assert [r["dense"]["digest"] for r in results] == [r["sketch"]["digest"] for r in results]


def test_two_jobs_at_once_isolated() -> None:
    import threading

    with switch_emulator.start() as sw:
        out: dict[int, object] = {}

        def one(i: int) -> None:
            try:
                out[i] = run_on_switch(sw, 2 + i, numel=15000, k=32, slots=8, seed=10 + i,
                                       schemes=["compact", "dense"])
            except BaseException as exc:  # noqa: BLE001
                out[i] = exc

        ts = [threading.Thread(target=one, args=(i,)) for i in range(2)]
        [t.start() for t in ts]
        [t.join(300) for t in ts]
        for i in range(2):
            assert isinstance(out[i], list), out[i]
        c = ControlClient(sw.control_addr).status()["counters"]
        assert c["jobs_admitted"] == 2 and c["drop_unknown_source"] == 0 and c["drop_slot_range"] == 0
