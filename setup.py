"""Build of homagg's optional native kernels (everything else is in pyproject.toml).

``homagg._native_kernels`` is plain C loaded with ctypes (:mod:`homagg._native`: the codec's
kernels; :mod:`homagg.transport._fastpath`: the worker port's batched datagram I/O), and so is
``switch_emulator._dataplane`` (:mod:`switch_emulator.native`: the emulator's native engine); ``optional``:
without a C compiler the install still succeeds and homagg uses its numpy code instead.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("homagg._native_kernels",
                             ["homagg/_native_kernels.c", "homagg/_dense_kernels.c",
                              "homagg/transport/_fastpath.c"], optional=True,
                             extra_compile_args=["-O3"]),
                   Extension("switch_emulator._dataplane", ["switch_emulator/_dataplane.c"], optional=True,
                             extra_compile_args=["-O3"])])
