/* Products of a state by a weight for one CPU thread at inference, fp32 with 256-bit AVX2 + FMA, and the Hyper-SET
 * feedforward fused around them. Built and loaded by hyperset/accel/cpu_gemm.py.
 *
 * A weight B (k x n, n a multiple of 16) is packed once (`hs_pack`) into panels of 16 columns, each k x 16
 * contiguous; a tile of up to 6 rows x 16 columns of the product is summed in 12 registers over the whole of k, the
 * rows' values broadcast from A and the panel's two vectors per k read in order. Then:
 *   hs_gemm:        C = A B, or C = X + c S * (A B) (X m x n, S m x n with rows lds apart, elementwise: a step
 *                   along a product)
 *   hs_ff_update:   Out = Y + S * (r ReLU(Y Ds)) Dg^T per row of Y (S's rows lds apart), r = 1 / sqrt(mean((Y Ds)^2) + eps): the
 *                   feedforward step with its RMSNorm gain folded into the weights, the hidden row kept in the
 *                   core's cache between the two products
 *   hs_relu_energy: E[b] = -1/2 sum_i |ReLU(u_i)|^2 / (mean(u_i^2) + eps), u_i = x_i D over the rows of board b: the
 *                   normalised ReLU energy, U never written
 *   hs_gemm_heads:  the head projections of A B on their spheres, head-major (each head's row z as
 *                   z / sqrt(mean(z^2) + eps)), a block of rows of A B kept in the core's cache until they are written
 * The matrices are contiguous (row-major).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define RT 6    /* rows of a tile: 12 accumulators + 2 panel vectors + 1 broadcast in 16 registers */
#define RB 24   /* rows of a block: each panel read once per block */
#define PW 16   /* columns of a panel */

/* B (k x n, leading dimension ldb) into panels: panel j / 16 at Bp + j k, row q of it at + 16 q */
int hs_pack(int64_t k, int64_t n, const float *B, int64_t ldb, float *Bp)
{
    for (int64_t j = 0; j < n; j += PW)
        for (int64_t q = 0; q < k; q++) {
            float *dst = Bp + j * k + q * PW;
            for (int c = 0; c < PW; c++) dst[c] = B[q * ldb + j + c];
        }
    return 0;
}

/* acc = a (R rows, leading dimension lda) times the panel bp (k x 16), R a constant where this is inlined */
#define TILE_SUM(R, k, a, lda, bp, acc0, acc1)                                                                     \
    do {                                                                                                          \
        _Pragma("GCC unroll 6") for (int r = 0; r < (R); r++) acc0[r] = acc1[r] = _mm256_setzero_ps();            \
        for (int64_t q = 0; q < (k); q++) {                                                                       \
            __m256 b0 = _mm256_loadu_ps((bp) + PW * q), b1 = _mm256_loadu_ps((bp) + PW * q + 8);                 \
            _Pragma("GCC unroll 6") for (int r = 0; r < (R); r++) {                                               \
                __m256 x = _mm256_broadcast_ss((a) + r * (lda) + q);                                              \
                acc0[r] = _mm256_fmadd_ps(x, b0, acc0[r]);                                                        \
                acc1[r] = _mm256_fmadd_ps(x, b1, acc1[r]);                                                        \
            }                                                                                                     \
        }                                                                                                         \
    } while (0)

/* One tile: R rows of c (leading dimension ldc) x the panel's 16 columns = a (R rows, leading dimension lda) times
 * the panel bp (k x 16), or x + cs s * (a bp) (s with leading dimension lds, x with ldc) where s is not NULL */
static inline __attribute__((always_inline)) void panel_tile_r(const int R, int64_t k, const float *a, int64_t lda,
                                                               const float *bp, float *c, int64_t ldc,
                                                               const float *s, int64_t lds, const float *x, float cs)
{
    __m256 acc0[RT], acc1[RT];
    if (s) /* the step's operands, one line per row each, on their way while the tile is summed */
        _Pragma("GCC unroll 6") for (int r = 0; r < R; r++) {
            _mm_prefetch((const char *)(s + r * lds), _MM_HINT_T0);
            _mm_prefetch((const char *)(x + r * ldc), _MM_HINT_T0);
        }
    TILE_SUM(R, k, a, lda, bp, acc0, acc1);
    __m256 vc = _mm256_set1_ps(cs);
    _Pragma("GCC unroll 6") for (int r = 0; r < R; r++) {
        __m256 v0 = acc0[r], v1 = acc1[r];
        if (s) {
            const float *sr = s + r * lds, *xr = x + r * ldc;
            v0 = _mm256_fmadd_ps(_mm256_mul_ps(vc, _mm256_loadu_ps(sr)), v0, _mm256_loadu_ps(xr));
            v1 = _mm256_fmadd_ps(_mm256_mul_ps(vc, _mm256_loadu_ps(sr + 8)), v1, _mm256_loadu_ps(xr + 8));
        }
        _mm256_storeu_ps(c + r * ldc, v0);
        _mm256_storeu_ps(c + r * ldc + 8, v1);
    }
}

static void panel_tile(int R, int64_t k, const float *a, int64_t lda, const float *bp, float *c, int64_t ldc,
                       const float *s, int64_t lds, const float *x, float cs)
{
    switch (R) {
#define CASE(v) case v: panel_tile_r(v, k, a, lda, bp, c, ldc, s, lds, x, cs); break;
        CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6)
#undef CASE
    default: break;
    }
}

/* A block of `rows` rows of C (leading dimension n) = A Bp, or X + cs S * (A Bp): panel by panel, each panel
 * used for every tile of the block while it is in the first-level cache */
static void block_product(int64_t rows, int64_t n, int64_t k, const float *a, int64_t lda, const float *Bp, float *c,
                          const float *s, int64_t lds, const float *x, float cs)
{
    for (int64_t j = 0; j < n; j += PW)
        for (int64_t i = 0; i < rows; i += RT)
            panel_tile(rows - i < RT ? (int)(rows - i) : RT, k, a + i * lda, lda, Bp + j * k, c + i * n + j, n,
                       s ? s + i * lds + j : NULL, lds, x ? x + i * n + j : NULL, cs);
}

/* all[r] += u^2 and pos[r] += ReLU(u)^2 over the panel's 16 columns of u = a bp, for R rows of a */
static inline __attribute__((always_inline)) void energy_tile_r(const int R, int64_t d, const float *a,
                                                                const float *bp, __m256 *all, __m256 *pos)
{
    __m256 acc0[RT], acc1[RT], zero = _mm256_setzero_ps();
    TILE_SUM(R, d, a, d, bp, acc0, acc1);
    _Pragma("GCC unroll 6") for (int r = 0; r < R; r++) {
        __m256 p0 = _mm256_max_ps(acc0[r], zero), p1 = _mm256_max_ps(acc1[r], zero);
        all[r] = _mm256_fmadd_ps(acc1[r], acc1[r], _mm256_fmadd_ps(acc0[r], acc0[r], all[r]));
        pos[r] = _mm256_fmadd_ps(p1, p1, _mm256_fmadd_ps(p0, p0, pos[r]));
    }
}

static void energy_tile(int R, int64_t d, const float *a, const float *bp, __m256 *all, __m256 *pos)
{
    switch (R) {
#define CASE(v) case v: energy_tile_r(v, d, a, bp, all, pos); break;
        CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6)
#undef CASE
    default: break;
    }
}

static inline float hsum(__m256 v)
{
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

int hs_gemm(int64_t m0, int64_t m1, int64_t n, int64_t k, const float *A, const float *Bp, float *C,
            const float *S, int64_t lds, const float *X, float cs)
{
    for (int64_t i = m0; i < m1; i += RB) {
        int64_t rows = m1 - i < RB ? m1 - i : RB;
        block_product(rows, n, k, A + i * k, k, Bp, C + i * n, S ? S + i * lds : NULL, lds, X ? X + i * n : NULL, cs);
    }
    return 0;
}

int hs_ff_update(int64_t m0, int64_t m1, int64_t d, int64_t M, float eps, const float *Y, const float *Dsp,
                 const float *DgTp, const float *S, int64_t lds, float *Out)
{
    float *u = aligned_alloc(64, (size_t)(RB * M) * sizeof(float));
    if (!u) return 1;
    for (int64_t i = m0; i < m1; i += RB) {
        int64_t R = m1 - i < RB ? m1 - i : RB;
        const float *y = Y + i * d;
        block_product(R, M, d, y, d, Dsp, u, NULL, 0, NULL, 0.0f);  /* U = Y Ds, R x M */
        for (int64_t r = 0; r < R; r++) {  /* ReLU(u) r, r the row's inverse rms */
            float *row = u + r * M;
            __m256 all = _mm256_setzero_ps();
            for (int64_t j = 0; j < M; j += 8) {
                __m256 v = _mm256_loadu_ps(row + j);
                all = _mm256_fmadd_ps(v, v, all);
            }
            __m256 scale = _mm256_set1_ps(1.0f / sqrtf(hsum(all) / (float)M + eps));
            for (int64_t j = 0; j < M; j += 8)
                _mm256_storeu_ps(row + j, _mm256_mul_ps(_mm256_max_ps(_mm256_loadu_ps(row + j), _mm256_setzero_ps()),
                                                        scale));
        }
        block_product(R, d, M, u, M, DgTp, Out + i * d, S + i * lds, lds, y, 1.0f);  /* Y + S * (V Dg^T) */
    }
    free(u);
    return 0;
}

int hs_relu_energy(int64_t b0, int64_t b1, int64_t n, int64_t d, int64_t M, float eps, const float *X,
                   const float *Dp, float *E)
{
    for (int64_t b = b0; b < b1; b++) {
        double total = 0.0;
        for (int64_t i0 = 0; i0 < n; i0 += RB) {  /* a block of rows, panel by panel */
            int64_t rows = n - i0 < RB ? n - i0 : RB;
            const float *a = X + (b * n + i0) * d;
            __m256 all[RB], pos[RB];
            for (int64_t r = 0; r < rows; r++) all[r] = pos[r] = _mm256_setzero_ps();
            for (int64_t j = 0; j < M; j += PW)
                for (int64_t i = 0; i < rows; i += RT)
                    energy_tile(rows - i < RT ? (int)(rows - i) : RT, d, a + i * d, Dp + j * d, all + i, pos + i);
            for (int64_t r = 0; r < rows; r++) total += (double)(hsum(pos[r]) / (hsum(all[r]) / (float)M + eps));
        }
        E[b] = (float)(-0.5 * total);
    }
    return 0;
}

/* Zn = the head projections of A B on their spheres, head-major: row m = b tokens + i of A B holds `heads` heads of
 * p = n / heads values, and head h of it goes to Zn + ((b heads + h) tokens + i) p as z / sqrt(mean(z^2) + eps) */
int hs_gemm_heads(int64_t m0, int64_t m1, int64_t n, int64_t k, const float *A, const float *Bp, int64_t tokens,
                  int64_t heads, float eps, float *Zn)
{
    int64_t p = n / heads;
    float *c = aligned_alloc(64, (size_t)(RB * n) * sizeof(float));
    if (!c) return 1;
    for (int64_t i = m0; i < m1; i += RB) {
        int64_t rows = m1 - i < RB ? m1 - i : RB;
        block_product(rows, n, k, A + i * k, k, Bp, c, NULL, 0, NULL, 0.0f);
        for (int64_t r = 0; r < rows; r++) {
            int64_t b = (i + r) / tokens, t = (i + r) % tokens;
            for (int64_t h = 0; h < heads; h++) {
                const float *z = c + r * n + h * p;
                float *out = Zn + ((b * heads + h) * tokens + t) * p;
                __m256 acc = _mm256_setzero_ps();
                int64_t q = 0;
                for (; q + 8 <= p; q += 8) {
                    __m256 v = _mm256_loadu_ps(z + q);
                    acc = _mm256_fmadd_ps(v, v, acc);
                }
                float sq = hsum(acc);
                for (int64_t e = q; e < p; e++) sq += z[e] * z[e];
                float scale = 1.0f / sqrtf(sq / (float)p + eps);
                __m256 vs = _mm256_set1_ps(scale);
                for (q = 0; q + 8 <= p; q += 8) _mm256_storeu_ps(out + q, _mm256_mul_ps(_mm256_loadu_ps(z + q), vs));
                for (; q < p; q++) out[q] = z[q] * scale;
            }
        }
    }
    free(c);
    return 0;
}
