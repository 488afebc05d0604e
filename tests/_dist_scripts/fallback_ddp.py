"""Rank script: DDP training through a switch that crashes mid-run and comes back.

``STEPS`` SGD steps of the DDP tests' model (:mod:`_ddp_model`) on the ``homagg`` group.  Rank 0
writes the step it is at to ``PROGRESS`` (a file) before each step, so that the test process can
SIGKILL the switch and start it again at chosen steps (an external emulator), or rank 0 kills
the embedded emulator itself at ``KILL_AT`` (``CRASH=embedded``; the group starts a new one when it
returns) or sets it to drop every datagram (``CRASH=drop_all``, with ``HOMAGG_EMULATOR_FAULTS=1``).
``STEP_S`` seconds of "compute" per step give the switch time to come back.

Each rank reports its loss per step, its parameters after the last step, the path every step's
allreduces took (``switch``/``host``), the kind and job of ``pg.switch`` after every step, and the
group's path statistics.
"""

from __future__ import annotations

import os
import signal
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import homagg
from homagg.transport import ControlClient
from _ddp_model import Net, batch
from _launch import tensor_to_json, write_result

RANK = int(os.environ["RANK"])
STEPS = int(os.environ.get("STEPS", "60"))
CRASH = os.environ.get("CRASH", "none")
KILL_AT = int(os.environ.get("KILL_AT", "15"))
STEP_S = float(os.environ.get("STEP_S", "0.05"))
PROGRESS = os.environ.get("PROGRESS")

dist.init_process_group("homagg")
pg = dist.distributed_c10d._get_default_group()
torch.manual_seed(0)
model = DDP(Net())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
losses, paths, links = [], [], []
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for step in range(STEPS):
        if RANK == 0 and PROGRESS:
            Path(PROGRESS).write_text(str(step))
        if CRASH == "embedded" and RANK == 0 and step == KILL_AT:
            os.kill(pg.switch.emulator.process.pid, signal.SIGKILL)
        if CRASH == "drop_all" and RANK == 0 and step == KILL_AT:  # up, holding the job, forwarding nothing
            with ControlClient(pg.switch.control, secret=pg.switch.emulator.secret) as ctl:
                ctl.set_faults(drop=1.0)
        x, y = batch(step, RANK)
        opt.zero_grad()
        loss = (model(x) - y).square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        paths.append(pg.path)
        links.append([pg.switch.kind, pg.switch.job_id])
        time.sleep(STEP_S)
params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
write_result({
    "losses": losses,
    "paths": paths,
    "links": links,
    "params": tensor_to_json(params),
    "stats_paths": dict(pg.stats.paths),
    "transitions": pg.stats.transitions,
    "warnings": [str(w.message) for w in caught if issubclass(w.category, homagg.PathWarning)],
})
dist.destroy_process_group()
