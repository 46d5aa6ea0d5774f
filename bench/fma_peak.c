/* The CPU's multiply-add peak, measured: loops of independent vector FMAs (fp32), bf16 dot products and AMX tile
 * products that nothing but the execution units limits. Each vector function runs `iters` rounds of ACC independent
 * accumulators (more than the FMA latency times the FMA ports, so the loop is throughput-bound) and returns a sum of
 * the accumulators so that the compiler keeps the work. Every function is compiled for its own instruction set
 * (target attribute); the inner loops are unrolled so that the accumulators stay in registers; the caller runs only
 * those the CPU reports (bench/fma_peak.py). FLOPs per round: ACC x lanes x 2 (fp32 FMA), ACC x 16 x 4 (vdpbf16ps:
 * 16 fp32 lanes, each 2 bf16 products and their additions) and AMX_TILES x 16 x 16 x 32 x 2 (tdpbf16ps: a 16 x 16
 * fp32 tile plus a 16 x 32 by 32 x 16 bf16 product). */
#include <stdint.h>
#include <string.h>

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

/* AMX's intrinsics: GCC 11 and clang 12 on */
#if defined(__linux__) && defined(__x86_64__) && \
    ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && __GNUC__ >= 11))
#include <sys/syscall.h>
#include <unistd.h>
#define AMX_TILES 4 /* accumulator tiles: four 16 x 16 fp32 products from two A and two B tiles */

/* 1 where Linux lets this process use AMX's tile data (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) */
int amx_permitted(void) { return syscall(SYS_arch_prctl, 0x1023, 18) == 0; }

int amx_tiles(void) { return AMX_TILES; }

__attribute__((target("amx-tile,amx-bf16"))) double amx_bf16(int64_t iters) {
    struct {
        uint8_t palette, start_row, reserved[14];
        uint16_t colsb[16];
        uint8_t rows[16];
    } cfg;
    static uint16_t a[16 * 32], b[16 * 32]; /* bf16 1.0 and ~6e-8 */
    float c[16 * 16];
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) cfg.rows[t] = 16, cfg.colsb[t] = 64;
    for (int i = 0; i < 16 * 32; i++) a[i] = 0x3f80, b[i] = 0x3380;
    _tile_loadconfig(&cfg);
    _tile_loadd(4, a, 64);
    _tile_loadd(5, a, 64);
    _tile_loadd(6, b, 64);
    _tile_loadd(7, b, 64);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t r = 0; r < iters; r++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    double total = 0;
    _tile_stored(0, c, 64);
    for (int i = 0; i < 16 * 16; i++) total += c[i];
    _tile_stored(3, c, 64);
    for (int i = 0; i < 16 * 16; i++) total += c[i];
    _tile_release();
    return total;
}
#else
int amx_permitted(void) { return 0; }
int amx_tiles(void) { return 0; }
#endif
#else
int accumulators(void) { return 0; }
int amx_permitted(void) { return 0; }
int amx_tiles(void) { return 0; }
#endif
