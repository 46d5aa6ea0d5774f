/* Products of a state by a weight for one CPU thread at inference, fp32, built for AVX-512 (16 lanes) or AVX2 + FMA
 * (8 lanes) by the flags it is compiled with, and the Hyper-SET feedforward fused around them. Built and loaded by
 * hyperset/accel/cpu_gemm.py.
 *
 * A weight B (k x n, n a multiple of 16) is packed once (`hs_pack`) into panels of 16 columns, each k x 16
 * contiguous; a tile of up to 6 rows x TV vectors of columns of the product is summed in registers over the whole of k
 * (AVX2: one panel, two vectors; AVX-512: four panels, one vector each, fewer where n leaves fewer), the rows' values
 * broadcast from A and the panels' rows read in order. Then:
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

#define PW 16   /* columns of a panel */
#define RB 24   /* rows of a block: each panel read once per block */

/* the sum of the 8 lanes of v */
static inline float hsum8(__m256 v)
{
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* The vector operations: VL lanes of fp32 */
#if defined(__AVX512F__)
#define VL 16
#define TV 4    /* vectors across a tile: four panels */
typedef __m512 vf;
#define vzero _mm512_setzero_ps
#define vset1 _mm512_set1_ps
#define vload _mm512_loadu_ps
#define vstore _mm512_storeu_ps
#define vmul _mm512_mul_ps
#define vmax _mm512_max_ps
#define vfmadd _mm512_fmadd_ps
static inline float vsum(vf v) { return _mm512_reduce_add_ps(v); }
#else
#define VL 8
#define TV 2    /* vectors across a tile: one panel */
typedef __m256 vf;
#define vzero _mm256_setzero_ps
#define vset1 _mm256_set1_ps
#define vload _mm256_loadu_ps
#define vstore _mm256_storeu_ps
#define vmul _mm256_mul_ps
#define vmax _mm256_max_ps
#define vfmadd _mm256_fmadd_ps
static inline float vsum(vf v) { return hsum8(v); }
#endif
#define RT 6          /* rows of a tile: RT TV accumulators + TV panel vectors + 1 broadcast in 15 or 29 registers */
#define TW (TV * VL)  /* columns of a tile */

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

/* acc[r][v] = a (R rows, leading dimension lda) times the V vectors' columns of the panels from bp (k x 16 each,
 * PW k apart), R and V constants where this is inlined */
static inline __attribute__((always_inline)) void tile_sum(const int R, const int V, int64_t k, const float *a,
                                                           int64_t lda, const float *bp, vf acc[RT][TV])
{
    _Pragma("GCC unroll 6") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 4") for (int v = 0; v < V; v++) acc[r][v] = vzero();
    for (int64_t q = 0; q < k; q++) {
        vf b[TV];
        _Pragma("GCC unroll 4") for (int v = 0; v < V; v++)
            b[v] = vload(bp + (v * VL / PW) * PW * k + PW * q + v * VL % PW);
        _Pragma("GCC unroll 6") for (int r = 0; r < R; r++) {
            vf x = vset1(a[r * lda + q]);
            _Pragma("GCC unroll 4") for (int v = 0; v < V; v++) acc[r][v] = vfmadd(x, b[v], acc[r][v]);
        }
    }
}

/* One tile: R rows of c (leading dimension ldc) x V vectors' columns = a (R rows, leading dimension lda) times the
 * panels from bp, or x + cs s * (a bp) (s with leading dimension lds, x with ldc) where s is not NULL */
static inline __attribute__((always_inline)) void panel_tile_r(const int R, const int V, int64_t k, const float *a,
                                                               int64_t lda, const float *bp, float *c, int64_t ldc,
                                                               const float *s, int64_t lds, const float *x, float cs)
{
    vf acc[RT][TV];
    if (s) /* the step's operands, one line per row each, on their way while the tile is summed */
        _Pragma("GCC unroll 6") for (int r = 0; r < R; r++) {
            _mm_prefetch((const char *)(s + r * lds), _MM_HINT_T0);
            _mm_prefetch((const char *)(x + r * ldc), _MM_HINT_T0);
        }
    tile_sum(R, V, k, a, lda, bp, acc);
    vf vc = vset1(cs);
    _Pragma("GCC unroll 6") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 4") for (int v = 0; v < V; v++) {
            vf o = acc[r][v];
            if (s) o = vfmadd(vmul(vc, vload(s + r * lds + VL * v)), o, vload(x + r * ldc + VL * v));
            vstore(c + r * ldc + VL * v, o);
        }
}

/* CASE(r, v) for the tile of R rows (1 to RT) by V vectors (TV; with AVX-512 1 to 3 where n leaves 16 to 48 columns) */
#define TILE_CASES(V) CASE(1, V) CASE(2, V) CASE(3, V) CASE(4, V) CASE(5, V) CASE(6, V)
#if TV == 4
#define TILE_SHAPES(R, V)                                                                                             \
    switch (V) {                                                                                                      \
    case 1: switch (R) { TILE_CASES(1) default: break; } break;                                                       \
    case 2: switch (R) { TILE_CASES(2) default: break; } break;                                                       \
    case 3: switch (R) { TILE_CASES(3) default: break; } break;                                                       \
    case 4: switch (R) { TILE_CASES(4) default: break; } break;                                                       \
    default: break;                                                                                                   \
    }
#else
#define TILE_SHAPES(R, V) do { (void)(V); switch (R) { TILE_CASES(TV) default: break; } } while (0)
#endif

static void panel_tile(int R, int V, int64_t k, const float *a, int64_t lda, const float *bp, float *c, int64_t ldc,
                       const float *s, int64_t lds, const float *x, float cs)
{
#define CASE(r, v) case r: panel_tile_r(r, v, k, a, lda, bp, c, ldc, s, lds, x, cs); break;
    TILE_SHAPES(R, V);
#undef CASE
}

/* A block of `rows` rows of C (leading dimension n) = A Bp, or X + cs S * (A Bp): TW columns at a time (fewer where
 * n leaves fewer), each panel used for every tile of the block while it is in the first-level cache */
static void block_product(int64_t rows, int64_t n, int64_t k, const float *a, int64_t lda, const float *Bp, float *c,
                          const float *s, int64_t lds, const float *x, float cs)
{
    for (int64_t j = 0; j < n; j += TW) {
        int V = n - j < TW ? (int)((n - j) / VL) : TV;
        for (int64_t i = 0; i < rows; i += RT)
            panel_tile(rows - i < RT ? (int)(rows - i) : RT, V, k, a + i * lda, lda, Bp + j * k, c + i * n + j, n,
                       s ? s + i * lds + j : NULL, lds, x ? x + i * n + j : NULL, cs);
    }
}

/* all[r] += u^2 and pos[r] += ReLU(u)^2 over the V vectors' columns of u = a bp, for R rows of a */
static inline __attribute__((always_inline)) void energy_tile_r(const int R, const int V, int64_t d, const float *a,
                                                                const float *bp, vf *all, vf *pos)
{
    vf acc[RT][TV], zero = vzero();
    tile_sum(R, V, d, a, d, bp, acc);
    _Pragma("GCC unroll 6") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 4") for (int v = 0; v < V; v++) {
            vf p = vmax(acc[r][v], zero);
            all[r] = vfmadd(acc[r][v], acc[r][v], all[r]);
            pos[r] = vfmadd(p, p, pos[r]);
        }
}

static void energy_tile(int R, int V, int64_t d, const float *a, const float *bp, vf *all, vf *pos)
{
#define CASE(r, v) case r: energy_tile_r(r, v, d, a, bp, all, pos); break;
    TILE_SHAPES(R, V);
#undef CASE
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
            vf all = vzero();
            for (int64_t j = 0; j < M; j += VL) {
                vf v = vload(row + j);
                all = vfmadd(v, v, all);
            }
            vf scale = vset1(1.0f / sqrtf(vsum(all) / (float)M + eps)), zero = vzero();
            for (int64_t j = 0; j < M; j += VL) vstore(row + j, vmul(vmax(vload(row + j), zero), scale));
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
            vf all[RB], pos[RB];
            for (int64_t r = 0; r < rows; r++) all[r] = pos[r] = vzero();
            for (int64_t j = 0; j < M; j += TW) {
                int V = M - j < TW ? (int)((M - j) / VL) : TV;
                for (int64_t i = 0; i < rows; i += RT)
                    energy_tile(rows - i < RT ? (int)(rows - i) : RT, V, d, a + i * d, Dp + j * d, all + i, pos + i);
            }
            for (int64_t r = 0; r < rows; r++) total += (double)(vsum(pos[r]) / (vsum(all[r]) / (float)M + eps));
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
                float sq = hsum8(acc);
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
