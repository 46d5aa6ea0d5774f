/* The bi-softmax attention maps of the Hyper-SET layer for one CPU thread, fused per (board, head): the maps stay
 * in the core's cache between the products and the softmax instead of making a round trip to memory between
 * batched library calls. fp32, built for AVX-512 (16 lanes) or AVX2 + FMA (8 lanes) by the flags it is compiled
 * with. Built and loaded by hyperset/accel/cpu_kernels.py.
 *
 * For each batch element b of [b0, b1), Zn (N x p), beta:
 *   forward:  P = softmax_rows(beta Zn Zn^T)             (N x N, saved for the backward pass; not written
 *                                                        where P is NULL, at inference)
 *             G = (P + P^T) Zn                            (N x p)
 *   energy:   E = sum_i logsumexp_j(beta Zn Zn^T)_ij     (one number; the attention energy times beta; where
 *                                                        the scores are bounded, from the upper triangle)
 *   heads:    at inference, the same G for head-major maps with a gain, written with the heads merged
 *             (hs_bisoftmax_attention_heads), and the head projections put on their spheres head-major
 *             (hs_heads_rms)
 *   backward: given dG (N x p), with S = P + P^T,
 *             dP = softmax'(beta (dG Zn^T + Zn dG^T))     (the softmax's derivative at P)
 *             dZn = S dG + (dP + dP^T) Zn                 (N x p)
 * The matrices are contiguous (row-major); the scratch buffers are padded to a multiple of 16 columns.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The vector operations the kernel is written in: VL lanes of fp32, a lane mask `vmask`. */
#if defined(__AVX512F__)
#define VL 16
#define RMAX 12 /* rows of a product tile: 2 x RMAX accumulators + 2 operands + 1 broadcast in 32 registers */
typedef __m512 vf;
typedef __mmask16 vmask;
static inline vmask lanes(int64_t n)
{
    return n >= 16 ? (vmask)0xFFFF : n <= 0 ? (vmask)0 : (vmask)((1u << n) - 1u);
}
static inline vmask vnot(vmask m) { return (vmask)~m; }
#define vzero _mm512_setzero_ps
#define vset1 _mm512_set1_ps
#define vload _mm512_loadu_ps
#define vstore _mm512_storeu_ps
#define vstream _mm512_stream_ps
#define vadd _mm512_add_ps
#define vsub _mm512_sub_ps
#define vmul _mm512_mul_ps
#define vmax _mm512_max_ps
#define vfmadd _mm512_fmadd_ps
#define vfmsub _mm512_fmsub_ps
#define vfnmadd _mm512_fnmadd_ps
static inline vf vload_mask(vmask m, const float *p) { return _mm512_maskz_loadu_ps(m, p); }
static inline vf vload_mask_or(vf other, vmask m, const float *p) { return _mm512_mask_loadu_ps(other, m, p); }
static inline void vstore_mask(float *p, vmask m, vf v) { _mm512_mask_storeu_ps(p, m, v); }
static inline vf vkeep(vmask m, vf v) { return _mm512_maskz_mov_ps(m, v); }
static inline vf vblend(vmask m, vf a, vf b) { return _mm512_mask_blend_ps(m, a, b); } /* b where m */
static inline float vsum(vf v) { return _mm512_reduce_add_ps(v); }
static inline float vhmax(vf v) { return _mm512_reduce_max_ps(v); }
static inline vf vround(vf x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
#define EXP_MIN -103.0f /* scalef makes the subnormal results below e^-87.3 */
static inline vf vscale2(vf y, vf n) { return _mm512_scalef_ps(y, n); } /* y 2^n */

/* 16 x 16 transpose of the rows r[0..15] in place */
static inline __attribute__((always_inline)) void transpose_block(vf r[16])
{
    vf t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    /* u[4g + c], 128-bit lane L: column 4L + c of rows 4g..4g+3 */
    for (int g = 0; g < 4; g++) {
        u[4 * g + 0] = _mm512_shuffle_ps(t[4 * g + 0], t[4 * g + 2], 0x44);
        u[4 * g + 1] = _mm512_shuffle_ps(t[4 * g + 0], t[4 * g + 2], 0xEE);
        u[4 * g + 2] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
        u[4 * g + 3] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xEE);
    }
    /* column 4L + c gathers lane L of u[c], u[4 + c], u[8 + c], u[12 + c] */
    for (int c = 0; c < 4; c++) {
        vf x0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44), x1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xEE);
        vf x2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44);
        vf x3 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xEE);
        r[c] = _mm512_shuffle_f32x4(x0, x2, 0x88);
        r[4 + c] = _mm512_shuffle_f32x4(x0, x2, 0xDD);
        r[8 + c] = _mm512_shuffle_f32x4(x1, x3, 0x88);
        r[12 + c] = _mm512_shuffle_f32x4(x1, x3, 0xDD);
    }
}
#elif defined(__AVX2__) && defined(__FMA__)
#define VL 8
#define RMAX 6 /* 2 x RMAX accumulators + 2 operands + 1 broadcast in 16 registers */
typedef __m256 vf;
typedef __m256i vmask;
static inline vmask lanes(int64_t n)
{
    int k = n >= 8 ? 8 : n <= 0 ? 0 : (int)n;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline vmask vnot(vmask m) { return _mm256_xor_si256(m, _mm256_set1_epi32(-1)); }
#define vzero _mm256_setzero_ps
#define vset1 _mm256_set1_ps
#define vload _mm256_loadu_ps
#define vstore _mm256_storeu_ps
#define vstream _mm256_stream_ps
#define vadd _mm256_add_ps
#define vsub _mm256_sub_ps
#define vmul _mm256_mul_ps
#define vmax _mm256_max_ps
#define vfmadd _mm256_fmadd_ps
#define vfmsub _mm256_fmsub_ps
#define vfnmadd _mm256_fnmadd_ps
/* vmaskmovps stores are microcoded on AMD's Zen cores (tens of cycles each on Zen 1): a full mask takes the plain
 * store and an empty one none; the loads likewise, so that a hot loop pays for the mask only at a row's tail */
static inline int vmask_bits(vmask m) { return _mm256_movemask_ps(_mm256_castsi256_ps(m)); }
static inline vf vload_mask(vmask m, const float *p)
{
    int bits = vmask_bits(m);
    return bits == 0xFF ? _mm256_loadu_ps(p) : bits ? _mm256_maskload_ps(p, m) : _mm256_setzero_ps();
}
static inline vf vblend(vmask m, vf a, vf b) { return _mm256_blendv_ps(a, b, _mm256_castsi256_ps(m)); }
static inline vf vload_mask_or(vf other, vmask m, const float *p) { return vblend(m, other, vload_mask(m, p)); }
static inline void vstore_mask(float *p, vmask m, vf v)
{
    int bits = vmask_bits(m);
    if (bits == 0xFF)
        _mm256_storeu_ps(p, v);
    else if (bits)
        _mm256_maskstore_ps(p, m, v);
}
static inline vf vkeep(vmask m, vf v) { return _mm256_and_ps(v, _mm256_castsi256_ps(m)); }
static inline float vsum(vf v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
static inline float vhmax(vf v)
{
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}
static inline vf vround(vf x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
#define EXP_MIN -87.0f /* 2^n from the exponent bits needs n >= -126: results stay normal */
static inline vf vscale2(vf y, vf n)
{
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* 8 x 8 transpose of the rows r[0..7] in place */
static inline __attribute__((always_inline)) void transpose_block(vf r[8])
{
    vf t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int g = 0; g < 2; g++) {
        u[4 * g + 0] = _mm256_shuffle_ps(t[4 * g + 0], t[4 * g + 2], 0x44);
        u[4 * g + 1] = _mm256_shuffle_ps(t[4 * g + 0], t[4 * g + 2], 0xEE);
        u[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
        u[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xEE);
    }
    for (int c = 0; c < 4; c++) {
        r[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
        r[4 + c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
    }
}
#else
#error "the attention-map kernel needs AVX-512 or AVX2 with FMA"
#endif

/* acc (R rows x the 2 VL columns under masks m0, m1) += a b: a (R x k) row-major with leading dimension lda,
 * b (k x 2 VL) rows of leading dimension ldb */
static inline __attribute__((always_inline)) void accumulate(int R, int64_t k, const float *a, int64_t lda,
                                                             const float *b, int64_t ldb, vmask m0, vmask m1,
                                                             vf *acc0, vf *acc1)
{
    for (int64_t q = 0; q < k; q++) {
        vf b0 = vload_mask(m0, b + q * ldb), b1 = vload_mask(m1, b + q * ldb + VL);
#pragma GCC unroll 12
        for (int r = 0; r < R; r++) {
            vf x = vset1(a[r * lda + q]);
            acc0[r] = vfmadd(x, b0, acc0[r]);
            acc1[r] = vfmadd(x, b1, acc1[r]);
        }
    }
}

/* C (R rows x the 2 VL columns under masks m0, m1) = a b [+ a2 b2]: the accumulators stay in registers over the
 * whole sum */
static inline __attribute__((always_inline)) void tile(
    int R, int64_t k1, const float *a, int64_t lda, const float *b, int64_t ldb,
    int64_t k2, const float *a2, int64_t lda2, const float *b2, int64_t ldb2,
    float *c, int64_t ldc, vmask m0, vmask m1)
{
    vf acc0[RMAX], acc1[RMAX];
#pragma GCC unroll 12
    for (int r = 0; r < R; r++) {
        acc0[r] = vzero();
        acc1[r] = vzero();
    }
    accumulate(R, k1, a, lda, b, ldb, m0, m1, acc0, acc1);
    accumulate(R, k2, a2, lda2, b2, ldb2, m0, m1, acc0, acc1);
#pragma GCC unroll 12
    for (int r = 0; r < R; r++) {
        vstore_mask(c + r * ldc, m0, acc0[r]);
        vstore_mask(c + r * ldc + VL, m1, acc1[r]);
    }
}

static void tile_rows(int R, int64_t k1, const float *a, int64_t lda, const float *b, int64_t ldb, int64_t k2,
                      const float *a2, int64_t lda2, const float *b2, int64_t ldb2, float *c, int64_t ldc,
                      vmask m0, vmask m1)
{
    switch (R) {
#define CASE(n) case n: tile(n, k1, a, lda, b, ldb, k2, a2, lda2, b2, ldb2, c, ldc, m0, m1); break;
        CASE(1) CASE(2) CASE(3) CASE(4) CASE(5)
#if RMAX > 6
        CASE(6) CASE(7) CASE(8) CASE(9) CASE(10) CASE(11)
#endif
#undef CASE
    default: break;
    }
}

/* C (m x n, leading dimension ldc) = A B [+ A2 B2]; A (m x k1), B (k1 x n), A2 (m x k2), B2 (k2 x n). With
 * `upper`, for a symmetric C (m = n): only the blocks of 2 VL columns at and right of the diagonal, each from row 0
 * to its last column (every entry C_ij with j >= i; some below the diagonal). A last block narrower than VL columns
 * (81 tokens: one) is made from its rows across every column instead, and its columns above them copied from those
 * rows: a few rows of tiles rather than a tile per 2 VL rows of C that would be mostly empty columns. */
static void gemm(int64_t m, int64_t n, int64_t k1, const float *a, int64_t lda, const float *b, int64_t ldb,
                 int64_t k2, const float *a2, int64_t lda2, const float *b2, int64_t ldb2, float *c, int64_t ldc,
                 int upper)
{
    for (int64_t j = 0; j < n; j += 2 * VL) {
        vmask m0 = lanes(n - j), m1 = lanes(n - j - VL);
        int64_t i = 0, rows = upper && j + 2 * VL < m ? j + 2 * VL : m;
        if (upper && j > 0 && n - j < VL) {
            for (int64_t q = 0; q < n; q += 2 * VL)
                for (int64_t r = j; r < m; r += RMAX) {
                    vmask q0 = lanes(n - q), q1 = lanes(n - q - VL);
                    if (m - r >= RMAX)
                        tile(RMAX, k1, a + r * lda, lda, b + q, ldb, k2, a2 + r * lda2, lda2, b2 + q, ldb2,
                             c + r * ldc + q, ldc, q0, q1);
                    else
                        tile_rows((int)(m - r), k1, a + r * lda, lda, b + q, ldb, k2, a2 + r * lda2, lda2, b2 + q,
                                  ldb2, c + r * ldc + q, ldc, q0, q1);
                }
            for (int64_t r = 0; r < j; r++)
                for (int64_t q = j; q < n; q++) c[r * ldc + q] = c[q * ldc + r];
            break;
        }
        for (; i + RMAX <= rows; i += RMAX)
            tile(RMAX, k1, a + i * lda, lda, b + j, ldb, k2, a2 + i * lda2, lda2, b2 + j, ldb2, c + i * ldc + j,
                 ldc, m0, m1);
        if (i < rows)
            tile_rows((int)(rows - i), k1, a + i * lda, lda, b + j, ldb, k2, a2 + i * lda2, lda2, b2 + j, ldb2,
                      c + i * ldc + j, ldc, m0, m1);
    }
}

/* y = x + x^T for a square matrix of side ld (a multiple of 16) with leading dimension ld; y may be x */
static void add_transpose(const float *x, float *y, int64_t ld)
{
    for (int64_t bi = 0; bi < ld; bi += VL)
        for (int64_t bj = bi; bj < ld; bj += VL) {
            vf a[VL], t[VL];
            for (int r = 0; r < VL; r++) {
                a[r] = vload(x + (bi + r) * ld + bj);
                t[r] = vload(x + (bj + r) * ld + bi);
            }
            transpose_block(t);
            for (int r = 0; r < VL; r++) a[r] = vadd(a[r], t[r]);
            for (int r = 0; r < VL; r++) vstore(y + (bi + r) * ld + bj, a[r]);
            transpose_block(a);
            for (int r = 0; r < VL; r++) vstore(y + (bj + r) * ld + bi, a[r]);
        }
}

/* e^x, x <= 88 (the softmax's arguments are <= 0): Cephes' expf polynomial after x = n ln 2 + r, |r| <= ln2 / 2 */
static inline vf vexp(vf x)
{
    x = vmax(x, vset1(EXP_MIN));
    vf n = vround(vmul(x, vset1(1.44269504088896341f)));
    vf r = vfnmadd(n, vset1(0.693359375f), x);
    r = vfnmadd(n, vset1(-2.12194440e-4f), r);
    vf p = vset1(1.9875691500e-4f);
    p = vfmadd(p, r, vset1(1.3981999507e-3f));
    p = vfmadd(p, r, vset1(8.3334519073e-3f));
    p = vfmadd(p, r, vset1(4.1665795894e-2f));
    p = vfmadd(p, r, vset1(1.6666665459e-1f));
    p = vfmadd(p, r, vset1(5.0000001201e-1f));
    vf y = vadd(vfmadd(p, vmul(r, r), r), vset1(1.0f));
    return vscale2(y, n);
}

/* ROWS rows at a time, so that their reductions' latencies overlap: for each row of a (leading dimension ld), over
 * its first n columns, vm = beta max_j a_j and vs = sum_j e^(beta a_j - vm) (both broadcast); the terms are stored
 * into pp (leading dimension ld, zero past n) where pp is not NULL */
#define ROWS 4
static inline __attribute__((always_inline)) void exp_rows(int rows, const float *a, float *pp, int64_t n,
                                                           int64_t ld, float beta, vf vm[ROWS], vf vs[ROWS])
{
    vf vb = vset1(beta);
    for (int r = 0; r < ROWS; r++) {
        vm[r] = vset1(-INFINITY);
        vs[r] = vzero();
    }
    for (int64_t j = 0; j < n; j += VL)
        for (int r = 0; r < rows; r++)
            vm[r] = vmax(vm[r], vload_mask_or(vset1(-INFINITY), lanes(n - j), a + r * ld + j));
    for (int r = 0; r < rows; r++) vm[r] = vset1(beta * vhmax(vm[r]));
    for (int64_t j = 0; j < ld; j += VL) {
        vmask m = lanes(n - j);
        for (int r = 0; r < rows; r++) {
            vf e = vkeep(m, vexp(vfmsub(vload(a + r * ld + j), vb, vm[r])));
            vs[r] = vadd(vs[r], e);
            if (pp) vstore(pp + r * ld + j, e);
        }
    }
}

/* p = softmax(beta a) over the first n columns of each of `rows` rows of a into pp (see exp_rows) */
static inline __attribute__((always_inline)) void softmax_rows(int rows, const float *a, float *pp, int64_t n,
                                                               int64_t ld, float beta)
{
    vf vm[ROWS], vs[ROWS];
    exp_rows(rows, a, pp, n, ld, beta, vm, vs);
    for (int r = 0; r < rows; r++) vs[r] = vset1(1.0f / vsum(vs[r]));
    for (int64_t j = 0; j < ld; j += VL)
        for (int r = 0; r < rows; r++) vstore(pp + r * ld + j, vmul(vload(pp + r * ld + j), vs[r]));
}

/* sum over `rows` rows of a of logsumexp_j(beta a_j), the first n columns (see exp_rows) */
static inline __attribute__((always_inline)) double logsumexp_rows(int rows, const float *a, int64_t n, int64_t ld,
                                                                   float beta)
{
    vf vm[ROWS], vs[ROWS];
    exp_rows(rows, a, NULL, n, ld, beta, vm, vs);
    double total = 0.0;
    for (int r = 0; r < rows; r++) total += (double)vhmax(vm[r]) + log((double)vsum(vs[r]));
    return total;
}

/* ROWS rows of the softmax's derivative at a time: with p a row of P (leading dimension n) and q the same row of
 * dA (leading dimension ld), q = beta p (q - p.q), and p copied into pp (leading dimension ld, zero past n) */
static inline __attribute__((always_inline)) void softmax_backward_rows(int rows, const float *p, float *q, float *pp,
                                                                        int64_t n, int64_t ld, float beta)
{
    vf vdot[ROWS], vb = vset1(beta);
    for (int r = 0; r < ROWS; r++) vdot[r] = vzero();
    for (int64_t j = 0; j < ld; j += VL)
        for (int r = 0; r < rows; r++) {
            vf v = vload_mask(lanes(n - j), p + r * n + j);
            vstore(pp + r * ld + j, v);
            vdot[r] = vfmadd(v, vload(q + r * ld + j), vdot[r]);
        }
    for (int r = 0; r < rows; r++) vdot[r] = vset1(vsum(vdot[r]));
    for (int64_t j = 0; j < ld; j += VL)
        for (int r = 0; r < rows; r++) {
            vf v = vload(pp + r * ld + j), d = vsub(vload(q + r * ld + j), vdot[r]);
            vstore(q + r * ld + j, vmul(vmul(v, d), vb));
        }
}

/* ask for the cache lines of count floats from x (the next batch element's operands) */
static inline void prefetch_lines(const float *x, int64_t count)
{
    for (int64_t i = 0; i < count; i += 16) _mm_prefetch((const char *)(x + i), _MM_HINT_T0);
}

/* VL consecutive values from index o of the n x n matrix (n >= VL) held row by row in pp (leading dimension ld;
 * rows end in padding, and pp is followed by more scratch, so the loads stay inside the buffer) */
static inline vf chunk(const float *pp, int64_t ld, int64_t n, int64_t o)
{
    int64_t r = o / n, c = o % n, k = n - c;
    vf v = vload(pp + r * ld + c);
    if (k >= VL) return v;
    return vblend(vnot(lanes(k)), v, vload(pp + (r + 1) * ld - k));
}

/* out (n x n, contiguous) = the matrix in pp: streaming stores on whole vectors (P is read again only in the
 * backward pass, so it need not be fetched into the cache first nor kept there), masked stores at the ends */
static void store_streaming(const float *pp, int64_t ld, int64_t n, float *out)
{
    const uintptr_t align = VL * sizeof(float);
    if (n < VL) {  /* a chunk of VL would span more than two rows */
        for (int64_t r = 0; r < n; r++) vstore_mask(out + r * n, lanes(n), vload(pp + r * ld));
        return;
    }
    int64_t total = n * n, o = (int64_t)((align - ((uintptr_t)out & (align - 1))) & (align - 1)) / 4;
    if ((uintptr_t)out & 3) o = 0;  /* not float-aligned: plain stores all the way */
    if (o > total) o = total;
    if (o) vstore_mask(out, lanes(o), chunk(pp, ld, n, 0));
    if (((uintptr_t)(out + o) & (align - 1)) == 0)
        for (; o + VL <= total; o += VL) vstream(out + o, chunk(pp, ld, n, o));
    for (; o < total; o += VL) vstore_mask(out + o, lanes(total - o), chunk(pp, ld, n, o));
}

static inline int64_t padded(int64_t n) { return (n + 15) / 16 * 16; }

/* zt (p x ld) = z^T for z (n x p): whole VL x VL blocks in registers, the rest one by one. The columns n..ld of zt
 * are never written (they stay as the scratch was zeroed). */
static void transpose_into(const float *z, int64_t n, int64_t p, float *zt, int64_t ld)
{
    int64_t nb = n / VL * VL, pb = p / VL * VL;
    for (int64_t i = 0; i < nb; i += VL)
        for (int64_t k = 0; k < pb; k += VL) {
            vf r[VL];
            for (int q = 0; q < VL; q++) r[q] = vload(z + (i + q) * p + k);
            transpose_block(r);
            for (int q = 0; q < VL; q++) vstore(zt + (k + q) * ld + i, r[q]);
        }
    for (int64_t i = 0; i < n; i++)
        for (int64_t k = (i < nb ? pb : 0); k < p; k++) zt[k * ld + i] = z[i * p + k];
}

/* Whether every score beta z_i.z_j of z (n x p) is known to lie within +-BOUND (Cauchy-Schwarz: |z_i.z_j| <=
 * max_i |z_i|^2): then e^(beta z_i.z_j) needs no max taken first (fp32 holds e^88), and the symmetric scores can be
 * made and exponentiated once per pair (rows on a small sphere, as the layer's projections are) */
#define BOUND 80.0f
static int bounded_scores(const float *z, int64_t n, int64_t p, float beta)
{
    float most = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        vf acc = vzero();
        for (int64_t k = 0; k < p; k += VL) {
            vf v = vload_mask(lanes(p - k), z + i * p + k);
            acc = vfmadd(v, v, acc);
        }
        float sq = vsum(acc);
        if (sq > most) most = sq;
    }
    return beta * most <= BOUND;
}

/* The upper triangle of the symmetric n x n scores a (leading dimension ld; `gemm` with `upper`), bounded (see
 * bounded_scores): sums[i] = sum_j e^(beta a_ij) over the whole row i, each pair's exponential made once (added to
 * row i's sum and kept in sums[j] for row j's), and with `store` the exponentials written over a for j >= i */
static inline __attribute__((always_inline)) void exp_upper(float *a, int64_t n, int64_t ld, float beta,
                                                            float *sums, int store)
{
    vf vb = vset1(beta);
    memset(sums, 0, (size_t)ld * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        float *row = a + i * ld;
        int64_t j0 = i / VL * VL;
        float before = sums[i];  /* sum_{j < i} e^(beta a_ji), from the rows above */
        vf s = vzero();
        for (int64_t j = j0; j < n; j += VL) {
            vf e = vkeep(lanes(n - j), vexp(vmul(vload(row + j), vb)));
            if (j == j0) e = vkeep(vnot(lanes(i - j0)), e);  /* columns j >= i */
            s = vadd(s, e);
            vstore(sums + j, vadd(vload(sums + j), e));
            if (store) vstore(row + j, e);
        }
        sums[i] = vsum(s) + before;
    }
}

/* S = P + P^T from the exponentials e_ij (j >= i) in a and the row sums s (`exp_upper`): S_ij = e_ij (1/s_i + 1/s_j)
 * for j >= i and S_ji = S_ij, into y (leading dimension ld, the rows and columns below n), one VL x VL block at and
 * right of the diagonal at a time, each written with its transpose; a diagonal block is its upper triangle (a holds
 * zeros left of the diagonal there, and past n) plus its transpose, the diagonal taken once */
static void symmetric_maps(const float *a, const float *sums, int64_t n, int64_t ld, float *r, float *y)
{
    for (int64_t i = 0; i < ld; i++) r[i] = i < n ? 1.0f / sums[i] : 0.0f;
    for (int64_t bi = 0; bi < n; bi += VL)
        for (int64_t bj = bi; bj < n; bj += VL) {
            vf s[VL], rj = vload(r + bj);
            for (int q = 0; q < VL; q++) s[q] = vmul(vload(a + (bi + q) * ld + bj), vadd(vset1(r[bi + q]), rj));
            if (bj == bi) {
                vf t[VL];
                for (int q = 0; q < VL; q++) t[q] = s[q];
                transpose_block(t);
                for (int q = 0; q < VL; q++) vstore(y + (bi + q) * ld + bj, vadd(s[q], t[q]));
                for (int q = 0; q < VL; q++) y[(bi + q) * ld + bi + q] *= 0.5f;
            } else {
                for (int q = 0; q < VL; q++) vstore(y + (bi + q) * ld + bj, s[q]);
                transpose_block(s);
                for (int q = 0; q < VL; q++) vstore(y + (bj + q) * ld + bi, s[q]);
            }
        }
}

/* scratch per thread: three ld x ld maps and the p x ld transposed operand, zeroed once (the padding stays 0) */
static float *scratch(int64_t ld, int64_t p)
{
    size_t bytes = (size_t)(3 * ld * ld + p * ld) * sizeof(float);
    float *w = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (w) memset(w, 0, bytes);
    return w;
}

/* One map: P (where pb is not NULL) and G = (P + P^T) z for z (n x p, contiguous), G written with leading dimension
 * ldg; w the thread's scratch (`scratch`), `next` the next map's operand to ask the cache for (or NULL) */
static void forward_map(const float *z, int64_t n, int64_t p, float beta, float *pb, float *g, int64_t ldg,
                        float *w, const float *next)
{
    int64_t ld = padded(n);
    float *A = w, *Pp = w + ld * ld, *S = w + 2 * ld * ld, *zt = w + 3 * ld * ld;
    int sym = !pb && bounded_scores(z, n, p, beta);  /* at inference, scores bounded: each pair once */
    transpose_into(z, n, p, zt, ld);
    gemm(n, n, p, z, p, zt, ld, 0, z, p, zt, ld, A, ld, sym);
    if (next) prefetch_lines(next, n * p);
    if (sym) {
        exp_upper(A, n, ld, beta, Pp, 1);
        symmetric_maps(A, Pp, n, ld, Pp + ld, S);
    } else {
        for (int64_t i = 0; i < n; i += ROWS)
            softmax_rows(i + ROWS <= n ? ROWS : (int)(n - i), A + i * ld, Pp + i * ld, n, ld, beta);
        if (pb) store_streaming(Pp, ld, n, pb);
        add_transpose(Pp, S, ld);
    }
    gemm(n, p, n, S, ld, z, p, 0, S, ld, z, p, g, ldg, 0);
}

int hs_bisoftmax_forward(int64_t b0, int64_t b1, int64_t n, int64_t p, float beta, const float *Zn, float *P,
                         float *G)
{
    float *w = scratch(padded(n), p);
    if (!w) return 1;
    for (int64_t b = b0; b < b1; b++)
        forward_map(Zn + b * n * p, n, p, beta, P ? P + b * n * n : NULL, G + b * n * p, p, w,
                    b + 1 < b1 ? Zn + (b + 1) * n * p : NULL);
    _mm_sfence();  /* the streaming stores of P reach memory before anything reads it */
    free(w);
    return 0;
}

/* At inference, for the maps [m0, m1) of head-major projections Zn (boards x heads maps of n x p, map m = board
 * m / heads, head m % heads) and a gain g (p): G = (P + P^T) (Zn g) with P = softmax(beta (Zn g)(Zn g)^T), written
 * token-major with the heads merged: row i of board b at Gm + (b n + i) heads p, head h at columns h p .. h p + p
 * (the layout the back-projection reads) */
int hs_bisoftmax_attention_heads(int64_t m0, int64_t m1, int64_t n, int64_t p, int64_t heads, float beta,
                                 const float *Zn, const float *g, float *Gm)
{
    float *w = scratch(padded(n), p), *zg = aligned_alloc(64, (size_t)((n * p + 15) / 16 * 16) * sizeof(float));
    if (!w || !zg) {
        free(w);
        free(zg);
        return 1;
    }
    for (int64_t m = m0; m < m1; m++) {
        const float *z = Zn + m * n * p;
        for (int64_t i = 0; i < n; i++)
            for (int64_t k = 0; k < p; k += VL) {
                vmask k_lanes = lanes(p - k);
                vstore_mask(zg + i * p + k, k_lanes, vmul(vload_mask(k_lanes, z + i * p + k), vload_mask(k_lanes, g + k)));
            }
        forward_map(zg, n, p, beta, NULL, Gm + (m / heads) * n * heads * p + (m % heads) * p, heads * p, w,
                    m + 1 < m1 ? z + n * p : NULL);
    }
    free(zg);
    free(w);
    return 0;
}

/* The head projections of boards [b0, b1) on their spheres: XW holds n rows of heads x p values per board (head h
 * at columns h p .. h p + p); each head's row z goes to Zn head-major (board, head, token) as z / sqrt(mean(z^2) +
 * eps) */
int hs_heads_rms(int64_t b0, int64_t b1, int64_t n, int64_t heads, int64_t p, float eps, const float *XW,
                 float *Zn)
{
    for (int64_t b = b0; b < b1; b++)
        for (int64_t i = 0; i < n; i++)
            for (int64_t h = 0; h < heads; h++) {
                const float *z = XW + ((b * n + i) * heads + h) * p;
                float *out = Zn + ((b * heads + h) * n + i) * p;
                vf acc = vzero();
                for (int64_t k = 0; k < p; k += VL) {
                    vf v = vload_mask(lanes(p - k), z + k);
                    acc = vfmadd(v, v, acc);
                }
                vf s = vset1(1.0f / sqrtf(vsum(acc) / (float)p + eps));
                for (int64_t k = 0; k < p; k += VL) {
                    vmask k_lanes = lanes(p - k);
                    vstore_mask(out + k, k_lanes, vmul(vload_mask(k_lanes, z + k), s));
                }
            }
    return 0;
}

int hs_bisoftmax_energy(int64_t b0, int64_t b1, int64_t n, int64_t p, float beta, const float *Zn, float *E)
{
    int64_t ld = padded(n);
    float *w = scratch(ld, p);
    if (!w) return 1;
    float *A = w, *col = w + ld * ld, *zt = w + 3 * ld * ld;
    for (int64_t b = b0; b < b1; b++) {
        const float *z = Zn + b * n * p;
        int bounded = bounded_scores(z, n, p, beta);
        transpose_into(z, n, p, zt, ld);
        gemm(n, n, p, z, p, zt, ld, 0, z, p, zt, ld, A, ld, bounded);
        if (b + 1 < b1) prefetch_lines(z + n * p, n * p);
        double total = 0.0;
        if (bounded) {
            exp_upper(A, n, ld, beta, col, 0);
            for (int64_t i = 0; i < n; i++) total += log((double)col[i]);
        } else
            for (int64_t i = 0; i < n; i += ROWS)
                total += logsumexp_rows(i + ROWS <= n ? ROWS : (int)(n - i), A + i * ld, n, ld, beta);
        E[b] = (float)total;
    }
    free(w);
    return 0;
}

int hs_bisoftmax_backward(int64_t b0, int64_t b1, int64_t n, int64_t p, float beta, const float *Zn,
                          const float *P, const float *dG, float *dZn)
{
    int64_t ld = padded(n);
    float *w = scratch(ld, p);
    if (!w) return 1;
    float *Q = w, *Pp = w + ld * ld, *S = w + 2 * ld * ld, *zt = w + 3 * ld * ld;
    for (int64_t b = b0; b < b1; b++) {
        const float *z = Zn + b * n * p, *pb = P + b * n * n, *g = dG + b * n * p;
        if (b + 1 < b1) {
            prefetch_lines(z + n * p, n * p);
            prefetch_lines(g + n * p, n * p);
        }
        transpose_into(z, n, p, zt, ld);
        gemm(n, n, p, g, p, zt, ld, 0, g, p, zt, ld, Q, ld, 0);
        add_transpose(Q, Q, ld);  /* dG Zn^T + Zn dG^T */
        for (int64_t i = 0; i < n; i += ROWS) {
            if (b + 1 < b1) prefetch_lines(pb + n * n + i * n, (i + ROWS <= n ? ROWS : n - i) * n);
            softmax_backward_rows(i + ROWS <= n ? ROWS : (int)(n - i), pb + i * n, Q + i * ld, Pp + i * ld, n, ld,
                                  beta);
        }
        add_transpose(Q, Q, ld);  /* beta (dP + dP^T) */
        add_transpose(Pp, S, ld);
        gemm(n, p, n, S, ld, g, p, n, Q, ld, z, p, dZn + b * n * p, p, 0);
    }
    free(w);
    return 0;
}

/* The feedforward's normalised ReLU at inference, rows [r0, r1) of U (m values each): v = ReLU(u) / sqrt(|u|^2 / m +
 * eps), the rms over the whole row u, into V (which may be U): the update's ReLU(RMSNorm(u)) with the gain folded
 * into the weights, its row scale taken before the product instead of after (the same values within fp32
 * rounding). The second pass reads the row again from the core's first-level cache. */
int hs_relu_rms_rows(int64_t r0, int64_t r1, int64_t m, float eps, const float *U, float *V)
{
    for (int64_t i = r0; i < r1; i++) {
        const float *u = U + i * m;
        float *v = V + i * m;
        vf all = vzero();
        for (int64_t j = 0; j < m; j += VL) {
            vf x = vload_mask(lanes(m - j), u + j);
            all = vfmadd(x, x, all);
        }
        vf r = vset1(1.0f / sqrtf(vsum(all) / (float)m + eps));
        for (int64_t j = 0; j < m; j += VL) {
            vmask k = lanes(m - j);
            vstore_mask(v + j, k, vmul(vmax(vload_mask(k, u + j), vzero()), r));
        }
    }
    return 0;
}

/* The feedforward energy at inference, boards [b0, b1) of n rows of m values each in U (U = X D): E[b] =
 * -1/2 sum_i |ReLU(u_i)|^2 / (|u_i|^2 / m + eps), the ReLU energy of the rows put on their spheres (it is positively
 * homogeneous, so no normalised copy is made), one pass over each row, the sum over rows in double */
int hs_relu_energy(int64_t b0, int64_t b1, int64_t n, int64_t m, float eps, const float *U, float *E)
{
    for (int64_t b = b0; b < b1; b++) {
        double total = 0.0;
        for (int64_t i = 0; i < n; i++) {
            const float *u = U + (b * n + i) * m;
            vf all = vzero(), pos = vzero();
            for (int64_t j = 0; j < m; j += VL) {
                vf x = vload_mask(lanes(m - j), u + j), y = vmax(x, vzero());
                all = vfmadd(x, x, all);
                pos = vfmadd(y, y, pos);
            }
            total += (double)(vsum(pos) / (vsum(all) / (float)m + eps));
        }
        E[b] = (float)(-0.5 * total);
    }
    return 0;
}
