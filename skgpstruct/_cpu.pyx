"""What the processor running this process supports.

Compiled for the baseline instruction set of its target, so it imports on
every processor; :mod:`skgpstruct._simd` asks it which build of the
compiled kernels can run.
"""

cdef extern from *:
    """
    static int skgpstruct_has_avx2_fma(void)
    {
    #if (defined(__GNUC__) || defined(__clang__)) && \
        (defined(__x86_64__) || defined(__i386__))
        /* libgcc's and compiler-rt's checks include the operating system's
           support of the 256-bit registers (XGETBV), not only CPUID. */
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    #else
        return 0;
    #endif
    }
    """
    int skgpstruct_has_avx2_fma() noexcept nogil


def has_avx2_fma():
    """Whether the processor and the operating system support AVX2 and FMA.

    False on processors other than x86 and where the compiler that built
    the package has no CPU-feature builtins.
    """
    return bool(skgpstruct_has_avx2_fma())
