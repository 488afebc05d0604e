"""Build of homagg's optional native kernels (everything else is in pyproject.toml).

``homagg.codec._native_kernels`` is plain C loaded with ctypes (:mod:`homagg.codec._native`: the
codec's kernels), and so are ``homagg.transport._fastpath_kernels`` (:mod:`homagg.transport._fastpath`:
the worker port's batched datagram I/O) and ``switch_emulator._dataplane``
(:mod:`switch_emulator.native`: the emulator's native engine); ``optional``:
without a C compiler the install still succeeds and homagg uses its numpy code instead.  The last two
share ``homagg/_wirewords.h`` (the word loops between host order and the wire's big-endian words) and
``homagg/_udpseg.h`` (UDP GSO and GRO).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("homagg.codec._native_kernels",
                             ["homagg/codec/_native_kernels.c", "homagg/codec/_scan_kernels.c",
                              "homagg/codec/_dense_kernels.c", "homagg/codec/_exponent_kernels.c",
                              "homagg/codec/_small_kernels.c", "homagg/codec/_mid_kernels.c"], optional=True,
                             depends=["homagg/codec/_native_kernels.h"],
                             extra_compile_args=["-O3"]),
                   Extension("homagg.transport._fastpath_kernels",
                             ["homagg/transport/_fastpath.c", "homagg/transport/_fastround.c"], optional=True,
                             include_dirs=["homagg"],
                             depends=["homagg/_wirewords.h", "homagg/_udpseg.h", "homagg/transport/_fastpath.h"],
                             extra_compile_args=["-O3"]),
                   Extension("switch_emulator._dataplane", ["switch_emulator/_dataplane.c"], optional=True,
                             include_dirs=["homagg"], depends=["homagg/_wirewords.h", "homagg/_udpseg.h", "switch_emulator/_dpsend.h"],
                             extra_compile_args=["-O3"])])
