/* The bi-softmax attention maps of the Hyper-SET layer for one CPU thread, fused per (board, head): the maps stay
 * in the core's cache between the products and the softmax instead of making a round trip to memory between
 * batched library calls. fp32, AVX-512. Built and loaded by hyperset/accel/cpu_kernels.py.
 *
 * For each batch element b of [b0, b1), Zn (N x p), beta:
 *   forward:  P = softmax_rows(beta Zn Zn^T)             (N x N, saved for the backward pass; not written
 *                                                        where P is NULL, at inference)
 *             G = (P + P^T) Zn                            (N x p)
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

#define RMAX 12

static inline __mmask16 lanes(int64_t n)
{
    return n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1u);
}

/* acc (R rows x the 32 columns under masks m0, m1) += a b: a (R x k) row-major with leading dimension lda, b (k x 32)
 * rows of leading dimension ldb */
static inline __attribute__((always_inline)) void accumulate(int R, int64_t k, const float *a, int64_t lda,
                                                             const float *b, int64_t ldb, __mmask16 m0, __mmask16 m1,
                                                             __m512 *acc0, __m512 *acc1)
{
    for (int64_t q = 0; q < k; q++) {
        __m512 b0 = _mm512_maskz_loadu_ps(m0, b + q * ldb), b1 = _mm512_maskz_loadu_ps(m1, b + q * ldb + 16);
#pragma GCC unroll 12
        for (int r = 0; r < R; r++) {
            __m512 x = _mm512_set1_ps(a[r * lda + q]);
            acc0[r] = _mm512_fmadd_ps(x, b0, acc0[r]);
            acc1[r] = _mm512_fmadd_ps(x, b1, acc1[r]);
        }
    }
}

/* C (R rows x the 32 columns under masks m0, m1) = a b [+ a2 b2]: the accumulators stay in registers over the
 * whole sum */
static inline __attribute__((always_inline)) void tile(
    int R, int64_t k1, const float *a, int64_t lda, const float *b, int64_t ldb,
    int64_t k2, const float *a2, int64_t lda2, const float *b2, int64_t ldb2,
    float *c, int64_t ldc, __mmask16 m0, __mmask16 m1)
{
    __m512 acc0[RMAX], acc1[RMAX];
#pragma GCC unroll 12
    for (int r = 0; r < R; r++) {
        acc0[r] = _mm512_setzero_ps();
        acc1[r] = _mm512_setzero_ps();
    }
    accumulate(R, k1, a, lda, b, ldb, m0, m1, acc0, acc1);
    accumulate(R, k2, a2, lda2, b2, ldb2, m0, m1, acc0, acc1);
#pragma GCC unroll 12
    for (int r = 0; r < R; r++) {
        _mm512_mask_storeu_ps(c + r * ldc, m0, acc0[r]);
        _mm512_mask_storeu_ps(c + r * ldc + 16, m1, acc1[r]);
    }
}

static void tile_rows(int R, int64_t k1, const float *a, int64_t lda, const float *b, int64_t ldb, int64_t k2,
                      const float *a2, int64_t lda2, const float *b2, int64_t ldb2, float *c, int64_t ldc,
                      __mmask16 m0, __mmask16 m1)
{
    switch (R) {
#define CASE(n) case n: tile(n, k1, a, lda, b, ldb, k2, a2, lda2, b2, ldb2, c, ldc, m0, m1); break;
        CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8) CASE(9) CASE(10) CASE(11)
#undef CASE
    default: break;
    }
}

/* C (m x n, leading dimension ldc) = A B [+ A2 B2]; A (m x k1), B (k1 x n), A2 (m x k2), B2 (k2 x n) */
static void gemm(int64_t m, int64_t n, int64_t k1, const float *a, int64_t lda, const float *b, int64_t ldb,
                 int64_t k2, const float *a2, int64_t lda2, const float *b2, int64_t ldb2, float *c, int64_t ldc)
{
    for (int64_t j = 0; j < n; j += 32) {
        __mmask16 m0 = lanes(n - j), m1 = lanes(n - j - 16);
        int64_t i = 0;
        for (; i + RMAX <= m; i += RMAX)
            tile(RMAX, k1, a + i * lda, lda, b + j, ldb, k2, a2 + i * lda2, lda2, b2 + j, ldb2, c + i * ldc + j,
                 ldc, m0, m1);
        if (i < m)
            tile_rows((int)(m - i), k1, a + i * lda, lda, b + j, ldb, k2, a2 + i * lda2, lda2, b2 + j, ldb2,
                      c + i * ldc + j, ldc, m0, m1);
    }
}

/* 16 x 16 transpose of the rows r[0..15] in place */
static inline __attribute__((always_inline)) void transpose16(__m512 r[16])
{
    __m512 t[16], u[16];
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
        __m512 x0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44), x1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xEE);
        __m512 x2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44);
        __m512 x3 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xEE);
        r[c] = _mm512_shuffle_f32x4(x0, x2, 0x88);
        r[4 + c] = _mm512_shuffle_f32x4(x0, x2, 0xDD);
        r[8 + c] = _mm512_shuffle_f32x4(x1, x3, 0x88);
        r[12 + c] = _mm512_shuffle_f32x4(x1, x3, 0xDD);
    }
}

/* y = x + x^T for a square matrix of side ld (a multiple of 16) with leading dimension ld; y may be x */
static void add_transpose(const float *x, float *y, int64_t ld)
{
    for (int64_t bi = 0; bi < ld; bi += 16)
        for (int64_t bj = bi; bj < ld; bj += 16) {
            __m512 a[16], t[16];
            for (int r = 0; r < 16; r++) {
                a[r] = _mm512_loadu_ps(x + (bi + r) * ld + bj);
                t[r] = _mm512_loadu_ps(x + (bj + r) * ld + bi);
            }
            transpose16(t);
            for (int r = 0; r < 16; r++) a[r] = _mm512_add_ps(a[r], t[r]);
            for (int r = 0; r < 16; r++) _mm512_storeu_ps(y + (bi + r) * ld + bj, a[r]);
            transpose16(a);
            for (int r = 0; r < 16; r++) _mm512_storeu_ps(y + (bj + r) * ld + bi, a[r]);
        }
}

/* e^x, x <= 88 (the softmax's arguments are <= 0): Cephes' expf polynomial after x = n ln 2 + r, |r| <= ln2 / 2 */
static inline __m512 exp16(__m512 x)
{
    x = _mm512_max_ps(x, _mm512_set1_ps(-103.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(y, n);
}

/* ROWS rows of the softmax at a time, so that their reductions' latencies overlap: p = softmax(beta a) over the
 * first n columns of each row of a (leading dimension ld) into pp (leading dimension ld, zero past n) */
#define ROWS 4
static inline __attribute__((always_inline)) void softmax_rows(int rows, const float *a, float *pp, int64_t n,
                                                               int64_t ld, float beta)
{
    __m512 vmax[ROWS], vsum[ROWS], vb = _mm512_set1_ps(beta);
    for (int r = 0; r < ROWS; r++) {
        vmax[r] = _mm512_set1_ps(-INFINITY);
        vsum[r] = _mm512_setzero_ps();
    }
    for (int64_t j = 0; j < n; j += 16)
        for (int r = 0; r < rows; r++)
            vmax[r] = _mm512_max_ps(vmax[r], _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), lanes(n - j),
                                                                  a + r * ld + j));
    for (int r = 0; r < rows; r++) vmax[r] = _mm512_set1_ps(beta * _mm512_reduce_max_ps(vmax[r]));
    for (int64_t j = 0; j < ld; j += 16) {
        __mmask16 m = lanes(n - j);
        for (int r = 0; r < rows; r++) {
            __m512 e = _mm512_maskz_mov_ps(m, exp16(_mm512_fmsub_ps(_mm512_loadu_ps(a + r * ld + j), vb, vmax[r])));
            vsum[r] = _mm512_add_ps(vsum[r], e);
            _mm512_storeu_ps(pp + r * ld + j, e);
        }
    }
    for (int r = 0; r < rows; r++) vsum[r] = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(vsum[r]));
    for (int64_t j = 0; j < ld; j += 16)
        for (int r = 0; r < rows; r++) {
            __m512 v = _mm512_mul_ps(_mm512_loadu_ps(pp + r * ld + j), vsum[r]);
            _mm512_storeu_ps(pp + r * ld + j, v);
        }
}

/* ROWS rows of the softmax's derivative at a time: with p a row of P (leading dimension n) and q the same row of
 * dA (leading dimension ld), q = beta p (q - p.q), and p copied into pp (leading dimension ld, zero past n) */
static inline __attribute__((always_inline)) void softmax_backward_rows(int rows, const float *p, float *q, float *pp,
                                                                        int64_t n, int64_t ld, float beta)
{
    __m512 vdot[ROWS], vb = _mm512_set1_ps(beta);
    for (int r = 0; r < ROWS; r++) vdot[r] = _mm512_setzero_ps();
    for (int64_t j = 0; j < ld; j += 16)
        for (int r = 0; r < rows; r++) {
            __m512 v = _mm512_maskz_loadu_ps(lanes(n - j), p + r * n + j);
            _mm512_storeu_ps(pp + r * ld + j, v);
            vdot[r] = _mm512_fmadd_ps(v, _mm512_loadu_ps(q + r * ld + j), vdot[r]);
        }
    for (int r = 0; r < rows; r++) vdot[r] = _mm512_set1_ps(_mm512_reduce_add_ps(vdot[r]));
    for (int64_t j = 0; j < ld; j += 16)
        for (int r = 0; r < rows; r++) {
            __m512 v = _mm512_loadu_ps(pp + r * ld + j), d = _mm512_sub_ps(_mm512_loadu_ps(q + r * ld + j), vdot[r]);
            _mm512_storeu_ps(q + r * ld + j, _mm512_mul_ps(_mm512_mul_ps(v, d), vb));
        }
}

/* ask for the cache lines of count floats from x (the next batch element's operands) */
static inline void prefetch_lines(const float *x, int64_t count)
{
    for (int64_t i = 0; i < count; i += 16) _mm_prefetch((const char *)(x + i), _MM_HINT_T0);
}

/* 16 consecutive values from index o of the n x n matrix (n >= 16) held row by row in pp (leading dimension ld;
 * rows end in padding, and pp is followed by more scratch, so the loads stay inside the buffer) */
static inline __m512 chunk16(const float *pp, int64_t ld, int64_t n, int64_t o)
{
    int64_t r = o / n, c = o % n, k = n - c;
    __m512 v = _mm512_loadu_ps(pp + r * ld + c);
    if (k >= 16) return v;
    return _mm512_mask_blend_ps((__mmask16)~lanes(k), v, _mm512_loadu_ps(pp + (r + 1) * ld - k));
}

/* out (n x n, contiguous) = the matrix in pp: streaming stores on whole 64-byte lines (P is read again only in the
 * backward pass, so it need not be fetched into the cache first nor kept there), masked stores at the ends */
static void store_streaming(const float *pp, int64_t ld, int64_t n, float *out)
{
    if (n < 16) {  /* a chunk of 16 would span more than two rows */
        for (int64_t r = 0; r < n; r++) _mm512_mask_storeu_ps(out + r * n, lanes(n), _mm512_loadu_ps(pp + r * ld));
        return;
    }
    int64_t total = n * n, o = (int64_t)((64 - ((uintptr_t)out & 63)) & 63) / 4;
    if ((uintptr_t)out & 3) o = 0;  /* not float-aligned: plain stores all the way */
    if (o > total) o = total;
    if (o) _mm512_mask_storeu_ps(out, lanes(o), chunk16(pp, ld, n, 0));
    if (((uintptr_t)(out + o) & 63) == 0)
        for (; o + 16 <= total; o += 16) _mm512_stream_ps(out + o, chunk16(pp, ld, n, o));
    for (; o < total; o += 16) _mm512_mask_storeu_ps(out + o, lanes(total - o), chunk16(pp, ld, n, o));
}

static inline int64_t padded(int64_t n) { return (n + 15) / 16 * 16; }

/* zt (p x ld) = z^T for z (n x p): whole 16 x 16 blocks in registers, the rest one by one. The columns n..ld of zt
 * are never written (they stay as the scratch was zeroed). */
static void transpose_into(const float *z, int64_t n, int64_t p, float *zt, int64_t ld)
{
    int64_t n16 = n / 16 * 16, p16 = p / 16 * 16;
    for (int64_t i = 0; i < n16; i += 16)
        for (int64_t k = 0; k < p16; k += 16) {
            __m512 r[16];
            for (int q = 0; q < 16; q++) r[q] = _mm512_loadu_ps(z + (i + q) * p + k);
            transpose16(r);
            for (int q = 0; q < 16; q++) _mm512_storeu_ps(zt + (k + q) * ld + i, r[q]);
        }
    for (int64_t i = 0; i < n; i++)
        for (int64_t k = (i < n16 ? p16 : 0); k < p; k++) zt[k * ld + i] = z[i * p + k];
}

/* scratch per thread: three ld x ld maps and the p x ld transposed operand, zeroed once (the padding stays 0) */
static float *scratch(int64_t ld, int64_t p)
{
    size_t bytes = (size_t)(3 * ld * ld + p * ld) * sizeof(float);
    float *w = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (w) memset(w, 0, bytes);
    return w;
}

int hs_bisoftmax_forward(int64_t b0, int64_t b1, int64_t n, int64_t p, float beta, const float *Zn, float *P,
                         float *G)
{
    int64_t ld = padded(n);
    float *w = scratch(ld, p);
    if (!w) return 1;
    float *A = w, *Pp = w + ld * ld, *S = w + 2 * ld * ld, *zt = w + 3 * ld * ld;
    for (int64_t b = b0; b < b1; b++) {
        const float *z = Zn + b * n * p;
        float *pb = P ? P + b * n * n : NULL;
        transpose_into(z, n, p, zt, ld);
        gemm(n, n, p, z, p, zt, ld, 0, z, p, zt, ld, A, ld);
        if (b + 1 < b1) prefetch_lines(z + n * p, n * p);
        for (int64_t i = 0; i < n; i += ROWS)
            softmax_rows(i + ROWS <= n ? ROWS : (int)(n - i), A + i * ld, Pp + i * ld, n, ld, beta);
        if (pb) store_streaming(Pp, ld, n, pb);
        add_transpose(Pp, S, ld);
        gemm(n, p, n, S, ld, z, p, 0, S, ld, z, p, G + b * n * p, p);
    }
    _mm_sfence();  /* the streaming stores of P reach memory before anything reads it */
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
        gemm(n, n, p, g, p, zt, ld, 0, g, p, zt, ld, Q, ld);
        add_transpose(Q, Q, ld);  /* dG Zn^T + Zn dG^T */
        for (int64_t i = 0; i < n; i += ROWS) {
            if (b + 1 < b1) prefetch_lines(pb + n * n + i * n, (i + ROWS <= n ? ROWS : n - i) * n);
            softmax_backward_rows(i + ROWS <= n ? ROWS : (int)(n - i), pb + i * n, Q + i * ld, Pp + i * ld, n, ld,
                                  beta);
        }
        add_transpose(Q, Q, ld);  /* beta (dP + dP^T) */
        add_transpose(Pp, S, ld);
        gemm(n, p, n, S, ld, g, p, n, Q, ld, z, p, dZn + b * n * p, p);
    }
    free(w);
    return 0;
}
