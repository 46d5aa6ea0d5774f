/* The CPU's multiply-add peak, measured: loops of independent vector FMAs (fp32) and bf16 dot products that
 * nothing but the execution ports limits. Each function runs `iters` rounds of ACC independent accumulators (more
 * than the FMA latency times the FMA ports, so the loop is throughput-bound) and returns a sum of the accumulators
 * so that the compiler keeps the work. Every function is compiled for its own instruction set (target attribute);
 * the inner loops are unrolled so that the accumulators stay in registers; the caller runs only those the CPU reports (bench/fma_peak.py). FLOPs per round: ACC x lanes x 2 (fp32 FMA) and
 * ACC x 16 x 4 (vdpbf16ps: 16 fp32 lanes, each 2 bf16 products and their additions). */
#include <stdint.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define ACC 12

__attribute__((target("avx2,fma"))) double fma_fp32_avx2(int64_t iters) {
    __m256 acc[ACC];
    const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < ACC; i++) acc[i] = _mm256_set1_ps((float)i);
    for (int64_t r = 0; r < iters; r++) {
#pragma GCC unroll 16
        for (int i = 0; i < ACC; i++) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
    }
    float out[8];
    __m256 s = acc[0];
    for (int i = 1; i < ACC; i++) s = _mm256_add_ps(s, acc[i]);
    _mm256_storeu_ps(out, s);
    double total = 0;
    for (int i = 0; i < 8; i++) total += out[i];
    return total;
}

/* ACC independent 512-bit accumulators updated by OP(acc, a, b) `iters` times; a and b of type T, made by MAKE_A and
 * MAKE_B */
#define LOOP512(NAME, TARGET, T, MAKE_A, MAKE_B, OP)                                  \
    __attribute__((target(TARGET))) double NAME(int64_t iters) {                      \
        __m512 acc[ACC];                                                              \
        const T a = MAKE_A, b = MAKE_B;                                               \
        for (int i = 0; i < ACC; i++) acc[i] = _mm512_set1_ps((float)i);              \
        for (int64_t r = 0; r < iters; r++) {                                         \
            _Pragma("GCC unroll 16") for (int i = 0; i < ACC; i++) acc[i] = OP(acc[i], a, b); \
        }                                                                             \
        __m512 s = acc[0];                                                            \
        for (int i = 1; i < ACC; i++) s = _mm512_add_ps(s, acc[i]);                   \
        return (double)_mm512_reduce_add_ps(s);                                       \
    }

LOOP512(fma_fp32_avx512, "avx512f", __m512, _mm512_set1_ps(0.999999f), _mm512_set1_ps(1e-7f), _mm512_fmadd_ps)
/* bf16 1.0 and ~6e-8 */
LOOP512(dot_bf16_avx512, "avx512f,avx512bf16", __m512bh, (__m512bh)_mm512_set1_epi16(0x3f80),
        (__m512bh)_mm512_set1_epi16(0x3380), _mm512_dpbf16_ps)

int accumulators(void) { return ACC; }
#else
int accumulators(void) { return 0; }
#endif
