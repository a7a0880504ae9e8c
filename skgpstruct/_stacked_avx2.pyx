"""The AVX2 + FMA build of ``skgpstruct._stacked``: the same source, compiled
by setup.py with -mavx2 -mfma where the build targets x86-64.
``skgpstruct._simd`` loads it in place of ``_stacked`` where the processor
supports those instructions."""

include "_stacked.pyx"
