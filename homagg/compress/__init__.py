"""Gradient compression in front of homagg's exact codec (off by default: the default is exact).

::

    from homagg.compress import Compressor
    comp = Compressor("topk:0.01")                 # top-1% with error feedback, per key
    comp.allreduce(grad, port, key="layer1")        # SUM over the port's workers, in place

    ddp.register_comm_hook(hh.State(compress="onebit"), hh.allreduce_hook)    # any DDP model
    dist.init_process_group("homagg", pg_options={"compress": "dgc:0.001"})   # or HOMAGG_COMPRESS:
    # the group compresses the allreduces issued during backward (DDP's buckets); others stay exact

Spec syntax (:mod:`homagg.compress._spec`): ``topk:0.01``, ``randk:0.01``, ``threshold:value=1e-3``,
``threshold:density=0.01``, ``dgc:0.001[,momentum=0.9,clip=1,warmup=200]``, ``onebit``, ``twobit``,
``terngrad``, ``qsgd:levels=16[,norm=max]``; stages compose with ``|``; ``ef=0/1`` toggles error
feedback; ``none`` (or no spec) is the exact codec.

Two families:

* **Sparsifiers** (:class:`TopK`, :class:`RandomK`, :class:`Threshold`, :class:`DGC`) zero most
  elements; the exact codec then aggregates the union of the workers' supports (compact or sketch).
* **Homomorphic quantisers** (:class:`OneBit`, :class:`TwoBit`, :class:`TernGrad`, :class:`QSGD`)
  agree one scale per block with MAX (the round the codec spends on block exponents), quantise
  to small integers, pack several per word, let the switch ADD them and decode once.  The shared
  scale keeps TernGrad/QSGD unbiased at a higher variance; see :mod:`homagg.compress._quantize`.

:mod:`homagg.compress.baselines` holds the classic (own-scale) versions as gloo comm hooks
(imported on demand: ``from homagg.compress.baselines import OwnScaleState, own_scale_hook``).
"""

from __future__ import annotations

from ._base import Compose, Context, ErrorFeedback, Stage
from ._compressor import Compressor, build_quantizer, build_stage, from_spec
from ._dgc import DGC, warmup_density
from ._homomorphic import lane_bits, pack, quantized_protocol, scale_codes, scales, unpack
from ._quantize import QSGD, OneBit, Quantizer, TernGrad, TwoBit
from ._sparsify import RandomK, Threshold, TopK, keep_count
from ._spec import QUANTIZERS, SPARSIFIERS, STAGES, StageSpec, format_spec, parse

__all__ = [
    "Compressor",
    "from_spec",
    "parse",
    "format_spec",
    "StageSpec",
    "STAGES",
    "SPARSIFIERS",
    "QUANTIZERS",
    "Stage",
    "Compose",
    "Context",
    "ErrorFeedback",
    "TopK",
    "RandomK",
    "Threshold",
    "DGC",
    "warmup_density",
    "keep_count",
    "Quantizer",
    "OneBit",
    "TwoBit",
    "TernGrad",
    "QSGD",
    "build_stage",
    "build_quantizer",
    "quantized_protocol",
    "scale_codes",
    "scales",
    "lane_bits",
    "pack",
    "unpack",
]
