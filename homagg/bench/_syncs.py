"""Counting what makes a CUDA stream wait for the host: host reads of device tensors, and transfers.

A GPU runs ahead of the Python that launches its kernels until the host needs a value: each
``bool()``, ``int()``, ``.item()``, ``.tolist()``, ``nonzero``, a boolean-mask index, a copy to
the host (and, from pageable memory, a copy to the device) waits for every queued kernel: one
*device synchronisation*.  Two ways to count them:

* :class:`HostReads`, a :class:`~torch.overrides.TorchFunctionMode` that classifies every torch
  call made under it; on any device, so a CPU run shows where a CUDA run would wait.  With
  :func:`device_paths` the codec takes the code path it takes for CUDA tensors (no numpy, no native
  kernels), so the count on a CPU is the CUDA path's.
* :func:`cuda_syncs`: ``torch.cuda.set_sync_debug_mode("warn")``, whose warnings are the
  synchronisations the CUDA runtime was asked for (the ground truth; CUDA only).
"""

from __future__ import annotations

import contextlib
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["HostReads", "device_paths", "cuda_syncs", "CudaSyncs", "SYNC_CALLS", "SYNC_WARNING"]

#: torch calls that read a device tensor's values on the host (one synchronisation each on CUDA)
SYNC_CALLS = frozenset({
    "__bool__", "__int__", "__float__", "__index__", "item", "tolist", "numpy", "nonzero", "argwhere",
    "unique", "unique_consecutive", "masked_select", "bincount", "equal", "repeat_interleave", "cpu",
})
_HOMAGG = str(Path(__file__).resolve().parents[1])


def _has_bool_index(args: tuple[Any, ...]) -> bool:
    """Whether a ``__getitem__``/``__setitem__``/``index_put_`` call indexes with a bool tensor."""
    if len(args) < 2:
        return False
    index = args[1]
    parts = index if isinstance(index, (tuple, list)) else (index,)
    return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts)


def _where() -> str:
    """The innermost homagg frame of the current stack, as ``module.py:line function``."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if frame.filename.startswith(_HOMAGG) and not frame.filename.endswith("_syncs.py"):
            return f"{Path(frame.filename).name}:{frame.lineno} {frame.name}"
    return "?"


class HostReads(TorchFunctionMode):
    """Counts the torch calls made under it (:attr:`calls`) and, among them, the host reads
    (:attr:`reads`, by call name, and :attr:`sites`, by homagg source line): the calls of
    :data:`SYNC_CALLS`, a boolean-mask index, a copy between devices, and ``torch.tensor`` of host
    data onto a non-CPU device.  A call made inside another (e.g. ``__bool__`` running ``any``) is
    counted once, as the outer one.

    On a CPU every tensor is a host tensor: reads made in ``host_modules`` (modules whose tensors
    are host tensors whatever the input's device: the call descriptor's words) are counted apart,
    in :attr:`host_reads`, not as reads a device would synchronise for."""

    def __init__(self, sites: bool = True, host_modules: tuple[str, ...] = ("_descriptor.py",)) -> None:
        super().__init__()
        self.host_modules = host_modules
        self.host_reads = 0
        self.calls = 0
        self.reads: Counter[str] = Counter()
        self.sites: Counter[str] = Counter()
        self.names: Counter[str] = Counter()  #: every call, by name
        self._with_sites = sites
        self._depth = 0

    def _is_read(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        if name in SYNC_CALLS:
            return name != "repeat_interleave" or kwargs.get("output_size") is None
        if name in ("__getitem__", "__setitem__", "index_put_", "index_put"):
            return _has_bool_index(args)
        if name in ("to", "copy_") and args and isinstance(args[0], torch.Tensor):
            dst = _target_device(name, args, kwargs)
            return dst is not None and dst.type != args[0].device.type
        if name == "tensor":
            dev = kwargs.get("device")
            return dev is not None and torch.device(dev).type != "cpu"
        return False

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if self._depth == 0:
            self.calls += 1
            name = getattr(func, "__name__", str(func))
            self.names[name] += 1
            if self._is_read(name, args, kwargs):
                site = _where()
                if site.split(":")[0] in self.host_modules:
                    self.host_reads += 1
                else:
                    self.reads[name] += 1
                    if self._with_sites:
                        self.sites[site] += 1
        self._depth += 1
        try:
            return func(*args, **kwargs)
        finally:
            self._depth -= 1

    @property
    def total(self) -> int:
        return sum(self.reads.values())


def _target_device(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.device | None:
    if name == "copy_":
        src = args[1] if len(args) > 1 else kwargs.get("src")
        return src.device if isinstance(src, torch.Tensor) else None
    for a in (*args[1:], kwargs.get("device")):
        if isinstance(a, (str, torch.device)):
            with contextlib.suppress(RuntimeError):
                return torch.device(a)
        if isinstance(a, torch.Tensor):
            return a.device
    return None


@contextlib.contextmanager
def device_paths() -> Iterator[None]:
    """Inside, the codec treats CPU tensors as it treats CUDA ones: no native kernels, no numpy
    views (every ``homagg.codec._hostops`` function takes its torch fallback).  For counting a
    CUDA call's host reads, and checking its results, on a CPU."""
    from ..codec import _hostops, _native

    saved = (_native.AVAILABLE, _native.FILL_QUANTIZE32, _hostops._host, _hostops.reads_free)
    _native.AVAILABLE, _native.FILL_QUANTIZE32 = False, None
    _hostops._host = _hostops.reads_free = lambda t: False  # type: ignore[assignment]
    try:
        yield
    finally:
        _native.AVAILABLE, _native.FILL_QUANTIZE32, _hostops._host, _hostops.reads_free = saved  # type: ignore[assignment]


#: the text of torch's warning for a synchronising call under ``set_sync_debug_mode("warn")``
SYNC_WARNING = "called a synchronizing CUDA operation"


class CudaSyncs:
    """The synchronisations the CUDA runtime was asked for inside :func:`cuda_syncs`: their count
    and the homagg line that asked, from the warnings' stacks; other warnings raised meanwhile
    (e.g. torch's one-time notes about the debug mode) in :attr:`others`, not counted."""

    def __init__(self) -> None:
        self.count = 0
        self.sites: Counter[str] = Counter()
        self.others: list[str] = []


@contextlib.contextmanager
def cuda_syncs() -> Iterator[CudaSyncs]:
    """Count ``torch.cuda.set_sync_debug_mode("warn")`` warnings (one per synchronising call)."""
    found = CudaSyncs()
    old = torch.cuda.get_sync_debug_mode()
    original = warnings.showwarning

    with warnings.catch_warnings():
        warnings.simplefilter("always")

        def show(message: Any, category: Any, filename: str, lineno: int, *rest: Any) -> None:
            if SYNC_WARNING in str(message):
                found.count += 1
                found.sites[_where()] += 1
            else:
                found.others.append(f"{filename}:{lineno}: {message}")

        warnings.showwarning = show
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield found
        finally:
            torch.cuda.set_sync_debug_mode(old)
            warnings.showwarning = original
