"""Output of ``homagg bench models``: the Markdown table and the per-model iteration-time bars."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["markdown_table", "plot", "METHOD_ORDER"]

METHOD_ORDER = ("gloo", "homagg", "homagg-sparse", "homagg-topk", "powersgd", "fp16")


def _key(r: dict[str, Any]) -> tuple[str, int]:
    return r["model"], METHOD_ORDER.index(r["method"]) if r["method"] in METHOD_ORDER else 99


def _exact(r: dict[str, Any]) -> str:
    """The exact column: a lossless method's verdict; for a lossy one, only whether ranks agree."""
    if r["lossless"]:
        return "yes" if r["exact"] else "NO"
    agree = r.get("ranks_identical")
    return "n/a (ranks agree)" if agree else ("n/a (ranks DIFFER)" if agree is not None else "n/a")


def markdown_table(records: Sequence[dict[str, Any]]) -> str:
    """One row per (model, method), models in run order, methods gloo first.  Lossy methods say so
    in the ``lossless`` column, and their ``exact`` column is n/a: they are never exact by design
    (``max rel err`` then shows how far their result is from the exact sum)."""
    order = {m: i for i, m in enumerate(dict.fromkeys(r["model"] for r in records))}
    rows = sorted(records, key=lambda r: (order[r["model"]], _key(r)[1]))
    out = ["| model | params | density | method | iteration ms | compute ms | comm ms | MB/worker/iter "
           "| bytes x gloo | x gloo | lossless | exact | max rel err |",
           "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---|---:|"]
    for r in rows:
        ratio = "-" if r.get("bytes_ratio_vs_gloo") is None else f"{r['bytes_ratio_vs_gloo']:.1f}"
        speed = "-" if r["speedup_vs_gloo"] is None else f"{r['speedup_vs_gloo']:.2f}"
        method = r["method"] + (f" ({r['compress']})" if r.get("compress") else "")
        out.append(f"| {r['model']} | {r['params'] / 1e6:.1f}M | {r['density']:.3g} | {method} | "
                   f"{r['iteration_s'] * 1e3:.0f} | {r['compute_s'] * 1e3:.0f} | {r['comm_s'] * 1e3:.0f} | "
                   f"{r['bytes_per_worker'] / 1e6:.3g} | {ratio} | {speed} | "
                   f"{'yes' if r['lossless'] else 'no: lossy by design'} | {_exact(r)} | {r['max_rel_err']:.1e} |")
    return "\n".join(out)


def plot(records: Sequence[dict[str, Any]], path: Path) -> None:
    """One panel per model: stacked bars (compute, exposed comm) per method, seconds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in records))
    fig, axes = plt.subplots(1, len(models), figsize=(3.6 * len(models), 3.6), squeeze=False)
    for ax, model in zip(axes[0], models):
        here = sorted((r for r in records if r["model"] == model), key=_key)
        names = [r["method"] for r in here]
        compute = [r["compute_s"] for r in here]
        comm = [r["comm_s"] for r in here]
        ax.bar(names, compute, label="compute (no_sync)", color="#8da0cb")
        ax.bar(names, comm, bottom=compute, label="exposed comm", color="#fc8d62")
        for i, r in enumerate(here):
            if r["speedup_vs_gloo"]:
                ax.text(i, r["iteration_s"], f"{r['speedup_vs_gloo']:.2f}x", ha="center", va="bottom", fontsize=7)
        ax.set_ylim(0, 1.18 * max((r["iteration_s"] for r in here), default=1.0))
        ax.set_title(model)
        ax.tick_params(axis="x", labelrotation=45, labelsize=8)
        ax.set_ylabel("seconds per iteration")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper right", fontsize="small")
    bw = records[0]["bw_mbit"] if records else None
    fig.suptitle(f"DDP iteration, world {records[0]['world'] if records else '?'}, "
                 + (f"{bw:g} Mbit/s links" if bw else "loopback"), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
