"""Run an experiment on a Mininet topology and collect everything into one folder.

``homagg mininet --topo star --switch emulator --workers 4 --loss 1`` (or ``python -m topologies.runner``)

1. builds the topology (:mod:`topologies.star` or :mod:`topologies.two_tier`) with TCLinks,
2. writes the job description (``job.json``: every worker's address is ``(its ip, 18500)``, so no
   registration is needed) and starts the switch: the emulator on the switch host, or
   ``simple_switch_grpc`` configured by :class:`homagg.p4.Controller`,
3. optionally captures every worker link with tcpdump (``pcaps/``),
4. starts one worker process per host (:mod:`topologies._worker`): every scheme, exact check,
5. collects ``results.json`` (per worker, per scheme), ``logs/``, switch counters and, on two_tier,
   the bytes each leaf's uplink carried up and down while the workers ran (``uplink_bytes``),
6. tears everything down in ``finally`` — processes, the network, leftover ``hg*`` links — even on
   failure or Ctrl-C.  Prints the folder.  Exit status 0 iff every worker was exact.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from homagg._errors import ConfigError

from ._deploy import Deployment, LinkOpts
from ._mn import mininet_missing

__all__ = ["run_experiment", "configure_parser", "run", "main", "remove_leftovers", "WORKER_PORT"]

#: every worker sends from (its ip, WORKER_PORT); not HOMAGG_UDP_PORT, which marks the switch's own
#: results (the raw emulator backend ignores frames from it)
WORKER_PORT = 18500


def remove_leftovers(prefix: str = "hg") -> None:
    """Delete network interfaces named ``<prefix>...`` left by a crashed run (root namespace)."""
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=False).stdout
    for line in out.splitlines():
        parts = line.split(":")
        if len(parts) > 1:
            name = parts[1].strip().split("@")[0]
            if name.startswith(prefix):
                subprocess.run(["ip", "link", "del", name], capture_output=True, check=False)


def _racks(workers: int, racks: int) -> list[list[int]]:
    from .two_tier import rack_of

    return [[r for r in range(workers) if rack_of(r, workers, racks) == l] for l in range(racks)]


def _build(topo: str, workers: int, switch: str, link: LinkOpts, racks: int, emulator_backend: str,
           tree: bool = False, uplink: LinkOpts | None = None) -> Deployment:
    if tree and topo != "two_tier":
        raise ValueError(f"tree: the leaves of two_tier aggregate; {topo} has one switch")
    if topo == "star":
        from .star import build_star

        return build_star(workers, switch, link, emulator_backend)
    if topo == "two_tier":
        from .two_tier import build_two_tier

        if emulator_backend != "udp":
            raise ValueError("two_tier runs the emulator with its UDP backend only")
        return build_two_tier(workers, switch, link, racks=racks, tree=tree, uplink=uplink)
    raise ValueError(f"unknown topology {topo!r}")


def _job(dep: Deployment, n_slots: int, words: int) -> Any:
    from homagg.jobs import JobSpec, WorkerAddr, new_token

    return JobSpec(job_id=1, world_size=len(dep.workers), slot_base=0, n_slots=n_slots, words_per_packet=words,
                   workers=tuple(WorkerAddr(r, s.ip, WORKER_PORT) for r, s in enumerate(dep.workers)),
                   token=new_token()).validate()


def _tree_jobs(dep: Deployment, job: Any, racks: int) -> tuple[Any, list[Any]]:
    """A two-tier tree's jobs (docs/trees.md), from the one-switch ``job``: the spine's (its members
    the leaves' data addresses, worker id = rack) and each leaf's (its rack's workers, worker ids
    0.. in rank order, ``parent`` the spine's data address, ``child_id`` its rack); same job id,
    token, slots and words everywhere."""
    from dataclasses import replace

    from homagg.jobs import WorkerAddr

    spine = replace(job, world_size=racks, workers=tuple(WorkerAddr(l, *dep.tree_links[l][0])
                                                          for l in range(racks))).validate()
    leaves = []
    for l, ranks in enumerate(_racks(len(dep.workers), racks)):
        leaves.append(replace(job, world_size=len(ranks), parent=dep.tree_links[l][1], child_id=l,
                              workers=tuple(WorkerAddr(i, dep.workers[r].ip, WORKER_PORT)
                                            for i, r in enumerate(ranks))).validate())
    return spine, leaves


def _emulator_nodes(dep: Deployment, tree: bool) -> list[tuple[Any, str]]:
    """The emulator hosts and their names in the results folder: the spine alone (``switch``), or
    with aggregating leaves every switch of the tree (its node name)."""
    if tree:
        return [(n, n.name) for n in dep.switch_nodes]
    return [(dep.switch_nodes[-1], "switch")]


def _start_emulator(dep: Deployment, out: Path, job_file: Path, sw: Any = None, name: str = "switch") -> None:
    sw = sw if sw is not None else dep.switch_nodes[-1]
    log = out / "logs" / f"{name}.log"
    raw = [a for i in dep.raw_ifaces for a in ("--iface", i)]
    dep.python(sw, ["-m", "switch_emulator", "--listen", f"0.0.0.0:{dep.data_port}",
                    "--control", f"127.0.0.1:{dep.control_port}", "--jobs", str(job_file), "--ready-json",
                    "--secret-file", str(out / f"{name}.secret"),
                    *(["--backend", "raw", *raw] if raw else [])], log)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if log.exists() and "{" in log.read_text(errors="replace"):
            return
        if dep.procs[-1].poll() is not None:
            break
        time.sleep(0.1)
    raise RuntimeError(f"the emulator did not start; see {log}:\n{log.read_text(errors='replace')[-2000:]}")


def _emulator_status(dep: Deployment, out: Path, sw: Any = None, name: str = "switch") -> dict[str, Any]:
    sw = sw if sw is not None else dep.switch_nodes[-1]
    code = ("import json,sys;from homagg.transport import ControlClient;"
            f"print(json.dumps(ControlClient(('127.0.0.1',{dep.control_port})).status()))")
    text = sw.cmd(f"HOMAGG_SWITCH_SECRET_FILE={out / (name + '.secret')} {sys.executable} -c \"{code}\"")
    try:
        return json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": text[-2000:]}


def run_experiment(topo: str = "star", switch: str = "emulator", workers: int = 4, link: LinkOpts | None = None,
                   out: Path | None = None, racks: int = 2, numel: int = 20000, density: float = 0.01,
                   schemes: str = "dense,compact,sketch,auto", n_slots: int = 64, words: int = 32,
                   pcap: bool = True, timeout: float = 240.0, emulator_backend: str = "udp",
                   forge: int = 0, tree: bool = False, uplink: LinkOpts | None = None) -> dict[str, Any]:
    """Run one experiment; return the summary (also written to ``<out>/results.json``).

    ``tree`` (two_tier): the leaves aggregate their racks and the spine the leaves (docs/trees.md);
    every worker sends to its leaf; each switch has its own job (BMv2: in ``job.json``'s
    ``bmv2.switches``; emulators: ``job-<switch>.json``), its status under its name.  ``uplink``
    (two_tier): each leaf-spine link's parameters (its bandwidth: the uplink speed).

    ``forge``: every worker first sends that many datagrams with a wrong job token from its own
    address (the switch must drop and count them: ``drop_token``; were one accepted, no result
    of the first round could be exact)."""
    why = mininet_missing()
    if why:
        raise RuntimeError(why)
    link = link or LinkOpts()
    out = Path(out or f"results/mininet-{topo}-{switch}-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    (out / "workers").mkdir(exist_ok=True)
    remove_leftovers()
    dep: Deployment | None = None
    summary: dict[str, Any] = {"topology": topo, "switch": switch, "workers": workers, "link": link.params(),
                               "emulator_backend": emulator_backend if switch == "emulator" else None,
                               "numel": numel, "density": density, "folder": str(out), "ok": False,
                               "tree": tree}
    try:
        dep = _build(topo, workers, switch, link, racks, emulator_backend, tree, uplink)
        if uplink is not None and uplink.bw and link.bw:
            summary["oversubscription"] = round(max(len(r) for r in _racks(workers, racks)) * link.bw / uplink.bw, 3)
        summary["loss_emulation"] = dep.apply_loss(link) or ("netem" if link.loss else None)
        job = _job(dep, n_slots, words if switch == "emulator" else min(words, 32))
        job_file = out / "job.json"
        extra: dict[str, Any] = {}
        if switch == "bmv2":
            extra = dep.bmv2_config  # type: ignore[attr-defined]
        worker_jobs = [job] * workers  # each worker's job at its switch, and its worker id there
        worker_ids = list(range(workers))
        own_files: list[Path] = []  # an emulator tree: each switch's job file, switch_nodes order
        if tree:
            spine_job, leaf_jobs = _tree_jobs(dep, job, racks)
            for i, own in enumerate([spine_job, *leaf_jobs]):  # switch_nodes: the spine, then the leaves
                if switch == "bmv2":
                    extra["bmv2"]["switches"][i]["jobs"] = [own.to_dict()]
                else:
                    own_files.append(out / f"job-{dep.switch_nodes[i].name}.json")
                    own_files[-1].write_text(json.dumps({"jobs": [own.to_dict()]}, indent=2))
                    own_files[-1].chmod(0o600)
            for leaf_job in leaf_jobs:
                for w in leaf_job.workers:
                    r = next(i for i, site in enumerate(dep.workers) if site.ip == w.ip)
                    worker_jobs[r], worker_ids[r] = leaf_job, w.worker_id
            job = spine_job
        job_file.write_text(json.dumps({"jobs": [job.to_dict()], **extra}, indent=2))
        job_file.chmod(0o600)  # it holds the job's token
        if pcap:
            (out / "pcaps").mkdir(exist_ok=True)
            for node, intf in dep.capture_intfs:
                dep.popen(node, ["tcpdump", "-n", "-i", intf, "-s", "96", "-U", "-w",
                                 str(out / "pcaps" / f"{intf}.pcap")], out / "logs" / f"tcpdump-{intf}.log")
            time.sleep(0.5)
        if switch == "emulator":
            for (node, name), f in zip(_emulator_nodes(dep, tree), own_files or [job_file]):
                _start_emulator(dep, out, f, node, name)
        else:
            dep.start_bmv2(out, job_file)  # type: ignore[attr-defined]
        uplinks_before = dep.uplink_bytes()
        t0 = time.monotonic()
        procs = []
        for r, site in enumerate(dep.workers):
            procs.append(dep.python(site.host, [
                "-m", "topologies._worker", "--switch", dep.switch_addr(r), "--bind", site.ip,
                "--bind-port", str(WORKER_PORT), "--rank", str(r), "--job", worker_jobs[r].to_json(),
                "--worker-id", str(worker_ids[r]), "--world-size", str(workers),
                "--schemes", schemes, "--numel", str(numel), "--density", str(density),
                "--timeout", str(min(60.0, timeout)), "--out", str(out / "workers" / f"rank{r}.json"),
                "--forge", str(forge),
            ], out / "logs" / f"worker{r}.log"))
        for p in procs:
            p.wait(timeout=max(1.0, timeout - (time.monotonic() - t0)))
        summary["seconds"] = round(time.monotonic() - t0, 3)
        if dep.uplinks:  # two_tier: what crossed each leaf's uplink while the workers ran
            summary["uplink_bytes"] = [{k: after[k] - before[k] for k in after}
                                       for before, after in zip(uplinks_before, dep.uplink_bytes())]
        ranks = []
        for r in range(workers):
            f = out / "workers" / f"rank{r}.json"
            ranks.append(json.loads(f.read_text()) if f.exists() else {"rank": r, "ok": False, "error": "no report"})
        summary["ranks"] = ranks
        summary["ok"] = all(r.get("ok") for r in ranks) and all(p.returncode == 0 for p in procs)
        if switch == "emulator":
            status = {name: _emulator_status(dep, out, node, name) for node, name in _emulator_nodes(dep, tree)}
            summary["switch_status"] = status if tree else status["switch"]
        else:
            summary["switch_status"] = dep.bmv2_status()  # type: ignore[attr-defined]
    except Exception as exc:  # noqa: BLE001 - recorded, then re-raised after teardown
        summary["error"] = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        if dep is not None:
            dep.stop()
        remove_leftovers()
        (out / "results.json").write_text(json.dumps(summary, indent=2, default=str))
        print(f"homagg mininet results: {out}", file=sys.stderr)
    return summary


def configure_parser(p: argparse.ArgumentParser) -> None:
    """The experiment's options (``homagg mininet`` and ``python -m topologies.runner``)."""
    p.add_argument("--topo", choices=("star", "two_tier"), default="star")
    p.add_argument("--switch", choices=("emulator", "bmv2"), default="emulator")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--emulator-backend", choices=("udp", "raw"), default="udp",
                   help="star + emulator: UDP socket on a routing switch host, or raw AF_PACKET ports")
    p.add_argument("--racks", type=int, default=2, help="two_tier: number of leaf switches")
    p.add_argument("--bw", type=float, default=None, help="link bandwidth, Mbit/s")
    p.add_argument("--delay", default=None, help="link delay, e.g. 1ms")
    p.add_argument("--loss", type=float, default=0.0, help="link loss, percent (each direction)")
    p.add_argument("--numel", type=int, default=20000)
    p.add_argument("--density", type=float, default=0.01)
    p.add_argument("--schemes", default="dense,compact,sketch,auto")
    p.add_argument("--words", type=int, default=32, help="payload words per packet (bmv2: at most 32)")
    p.add_argument("--slots", type=int, default=64, help="slots (window) of the job")
    p.add_argument("--no-pcap", action="store_true")
    p.add_argument("--timeout", type=float, default=240.0)
    p.add_argument("--out", type=Path, default=None, help="results folder (default results/mininet-...)")
    p.add_argument("--forge", type=int, default=0,
                   help="each worker first sends N datagrams with a wrong job token (dropped: drop_token)")
    p.add_argument("--tree", action="store_true",
                   help="two_tier: the leaves aggregate their racks, the spine the leaves (docs/trees.md)")
    p.add_argument("--uplink-bw", type=float, default=None,
                   help="two_tier: bandwidth of each leaf's uplink to the spine, Mbit/s (default: unshaped); the "
                        "oversubscription is a rack's workers x --bw / --uplink-bw")


def run(a: argparse.Namespace) -> int:
    """Run the experiment ``a`` describes; print each rank's line and the folder; the exit status."""
    if a.uplink_bw is not None and not a.uplink_bw > 0:
        raise ConfigError(f"--uplink-bw {a.uplink_bw}: a bandwidth in Mbit/s > 0")
    if a.uplink_bw is not None and a.topo != "two_tier":
        raise ConfigError("--uplink-bw: only two_tier has uplinks")
    try:
        s = run_experiment(a.topo, a.switch, a.workers, LinkOpts(a.bw, a.delay, a.loss), a.out, a.racks, a.numel,
                           a.density, a.schemes, a.slots, a.words, not a.no_pcap, a.timeout, a.emulator_backend,
                           a.forge, a.tree, None if a.uplink_bw is None else LinkOpts(bw=a.uplink_bw))
    except Exception as exc:  # noqa: BLE001
        print(f"experiment failed: {exc}", file=sys.stderr)
        return 1
    for r in s.get("ranks", []):
        line = ", ".join(f"{k}: {'exact' if v['exact'] else 'NOT EXACT'} {v['seconds']}s"
                         for k, v in r.get("schemes", {}).items())
        t = r.get("transport") or {}
        if t.get("packets"):
            line += (f"; {t['retransmits']} of {t['packets']} first sends retransmitted "
                     f"({100 * t['retransmits'] / t['packets']:.1f}%, {t.get('spurious_retransmits', 0)} spurious)")
        print(f"rank {r['rank']}: {line or r.get('error')}")
    print(s["folder"])
    return 0 if s["ok"] else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m topologies.runner", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    configure_parser(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
