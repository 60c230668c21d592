/* The in-batch softmax loss and its gradient in one pass over row tiles (runtime/retrieval/blocked_softmax.py).
 *
 * With queries q [n, d] (already divided by the temperature), candidates c [m, d] and each row's own
 * column own[i], cells (i, j) listed in `hit_starts`/`hit_columns` masked to -inf:
 *
 *   l = q c^T,  loss_i = logsumexp_j(l_ij) - l_i,own(i),  p = softmax(l) by rows
 *   d/dq_i = (sum_j p_ij c_j - c_own(i)) * grad_scale,   d/dc_j = sum_i p_ij q_i - sum_{i: own(i) = j} q_i
 *
 * torch's path runs this as three GEMMs with a softmax between them, each split over the threads by its
 * own rule, the logits making a round trip through memory. Here each thread takes a contiguous share of
 * the rows and runs them TILE rows at a time: the tile's logits (TILE x m, in the core's L2), their row
 * maxima, exp and sums, then the tile's share of both gradients from the same logits, the row sums
 * folded into the [TILE, d] sides. d/dc accumulates per thread, transposed [d, m], and the threads sum
 * their copies at the end. The products are register-tiled loops over GCC vector types (one 16-float
 * vector: a zmm register with AVX-512, two ymm with AVX2), compiled with -march=native.
 * exp is Cody-Waite reduction and a degree-7 polynomial (below 2 ulp); cells below e^-87 count 0.
 * d must be a multiple of 16 (the caller checks). Returns 0, or 1 when scratch memory is not to be had.
 */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#else
static int omp_get_thread_num(void) { return 0; }
static int omp_get_num_threads(void) { return 1; }
#endif

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));

#define W 16     /* floats per vector */
#define TILE 16  /* rows per tile */
#define COLS 32  /* columns of m per block: m is padded to a multiple */

static inline v16 load(const float *p) { return *(const v16u *)p; }
static inline void store(float *p, v16 v) { *(v16u *)p = v; }
static inline v16 splat(float x) { return (v16){0} + x; }
static inline v16 vmax(v16 a, v16 b) {
    v16i m = a > b;
    return (v16)(((v16i)a & m) | ((v16i)b & ~m));
}

/* The softmax below computes exp by Cody-Waite reduction, whose two-step subtraction must not be
 * reassociated (the build's -fassociative-math would fold it back into one rounded product). */
#pragma GCC push_options
#pragma GCC optimize("no-associative-math")

/* e^x for x <= 0 (the row maximum subtracted); 0 below -87 (and at -inf). */
static inline v16 vexp(v16 x) {
    const v16i keep = x > splat(-87.0f);
    const v16i n = __builtin_convertvector(x * splat(1.44269504088896341f) - splat(0.5f), v16i); /* rounded */
    const v16 k = __builtin_convertvector(n & keep, v16);
    v16 r = x - k * splat(0.693359375f);
    r = r - k * splat(-2.12194440e-4f);
    v16 p = splat(1.0f / 5040);
    p = p * r + splat(1.0f / 720);
    p = p * r + splat(1.0f / 120);
    p = p * r + splat(1.0f / 24);
    p = p * r + splat(1.0f / 6);
    p = p * r + splat(0.5f);
    p = p * r + splat(1.0f);
    p = p * r + splat(1.0f);
    return (v16)(((v16i)p + ((n & keep) << 23)) & keep);
}

/* Masks the tile's hits, then per row: maximum, e = exp(l - max) in place (0 in the padding), the
 * loss, and 1 / sum in `scale`. */
static void tile_softmax(float *logits, int64_t first, int64_t rows, int64_t m, int64_t mp, int64_t ld, const int64_t *own,
                         const int64_t *hit_starts, const int64_t *hit_columns, float *losses, float *scale) {
    for (int64_t r = 0; r < rows; r++) {
        float *l = logits + r * ld;
        const int64_t i = first + r;
        if (hit_starts)
            for (int64_t h = hit_starts[i]; h < hit_starts[i + 1]; h++) l[hit_columns[h]] = -INFINITY;
        for (int64_t j = m; j < mp; j++) l[j] = -INFINITY;
        v16 top = splat(-INFINITY);
        for (int64_t j = 0; j < mp; j += W) top = vmax(top, load(l + j));
        float most = top[0];
        for (int v = 1; v < W; v++) most = top[v] > most ? top[v] : most;
        const float mine = l[own[i]];
        v16 total = splat(0.0f);
        for (int64_t j = 0; j < mp; j += W) {
            const v16 x = vexp(load(l + j) - splat(most));
            store(l + j, x);
            total += x;
        }
        float sum = 0.0f;
        for (int v = 0; v < W; v++) sum += total[v];
        losses[i] = most + logf(sum) - mine;
        scale[r] = 1.0f / sum;
    }
}

#pragma GCC pop_options

/* logits[r][j] = sum_k q[r][k] ct[k][j] for TILE rows and mp (padded) columns. */
static void tile_logits(const float *q, const float *ct, int64_t d, int64_t mp, int64_t ld, float *logits) {
    for (int64_t j = 0; j < mp; j += COLS) {
        for (int64_t r0 = 0; r0 < TILE; r0 += 8) {
            v16 a[8][2];
            for (int r = 0; r < 8; r++) a[r][0] = a[r][1] = splat(0.0f);
            for (int64_t k = 0; k < d; k++) {
                const v16 b0 = load(ct + k * ld + j), b1 = load(ct + k * ld + j + W);
                for (int r = 0; r < 8; r++) {
                    const v16 x = splat(q[(r0 + r) * d + k]);
                    a[r][0] += x * b0;
                    a[r][1] += x * b1;
                }
            }
            for (int r = 0; r < 8; r++) {
                store(logits + (r0 + r) * ld + j, a[r][0]);
                store(logits + (r0 + r) * ld + j + W, a[r][1]);
            }
        }
    }
}

/* acc[r][v] = sum_j e[r][j] c[j][k0 + v W .. +W] for R rows from `e` (row stride ld), NV vectors. */
static inline __attribute__((always_inline)) void rows_times_candidates(const float *e, const float *c, int64_t d,
                                                                         int64_t m, int64_t ld, int64_t k0, int R,
                                                                         int NV, v16 acc[6][4]) {
    for (int r = 0; r < R; r++)
        for (int v = 0; v < NV; v++) acc[r][v] = splat(0.0f);
    for (int64_t j = 0; j < m; j++) {
        v16 b[4];
        for (int v = 0; v < NV; v++) b[v] = load(c + j * d + k0 + v * W);
        for (int r = 0; r < R; r++) {
            const v16 x = splat(e[r * ld + j]);
            for (int v = 0; v < NV; v++) acc[r][v] += x * b[v];
        }
    }
}

/* out[r][:] = ((sum_j e[r][j] c[j][:]) * scale[r] - c[own[r]][:]) * grad_scale for rows [0, rows). */
static void tile_grad_query(const float *e, const float *c, int64_t d, int64_t m, int64_t ld, int64_t rows,
                            const float *scale, const int64_t *own, float grad_scale, float *out) {
    for (int64_t r0 = 0; r0 < rows; r0 += 6) {
        const int nr = rows - r0 < 6 ? (int)(rows - r0) : 6, wide = r0 + 6 <= TILE; /* else rows r0.. r0 + 3 */
        for (int64_t k0 = 0; k0 < d; k0 += 4 * W) {
            const int nv = d - k0 < 4 * W ? (int)((d - k0) / W) : 4;
            v16 acc[6][4];
            if (nv == 4) {
                if (wide)
                    rows_times_candidates(e + r0 * ld, c, d, m, ld, k0, 6, 4, acc);
                else
                    rows_times_candidates(e + r0 * ld, c, d, m, ld, k0, 4, 4, acc);
            } else { /* d - k0 = 16, 32 or 48: a vector at a time */
                for (int v = 0; v < nv; v++) {
                    v16 one[6][4];
                    if (wide)
                        rows_times_candidates(e + r0 * ld, c, d, m, ld, k0 + v * W, 6, 1, one);
                    else
                        rows_times_candidates(e + r0 * ld, c, d, m, ld, k0 + v * W, 4, 1, one);
                    for (int r = 0; r < (wide ? 6 : 4); r++) acc[r][v] = one[r][0];
                }
            }
            for (int r = 0; r < nr; r++) {
                const float *mine = c + own[r0 + r] * d + k0;
                for (int v = 0; v < nv; v++)
                    store(out + (r0 + r) * d + k0 + v * W,
                          (acc[r][v] * splat(scale[r0 + r]) - load(mine + v * W)) * splat(grad_scale));
            }
        }
    }
}

/* gct[k][j] += sum_r qs[r][k] e[r][j] over TILE rows (qs zero past the tile's real rows). */
static void tile_grad_candidates(const float *qs, const float *e, int64_t d, int64_t mp, int64_t ld, float *gct) {
    for (int64_t j = 0; j < mp; j += COLS) {
        for (int64_t k0 = 0; k0 < d; k0 += 8) {
            v16 a[8][2];
            for (int k = 0; k < 8; k++) {
                a[k][0] = load(gct + (k0 + k) * ld + j);
                a[k][1] = load(gct + (k0 + k) * ld + j + W);
            }
            for (int r = 0; r < TILE; r++) {
                const v16 b0 = load(e + r * ld + j), b1 = load(e + r * ld + j + W);
                for (int k = 0; k < 8; k++) {
                    const v16 x = splat(qs[r * d + k0 + k]);
                    a[k][0] += x * b0;
                    a[k][1] += x * b1;
                }
            }
            for (int k = 0; k < 8; k++) {
                store(gct + (k0 + k) * ld + j, a[k][0]);
                store(gct + (k0 + k) * ld + j + W, a[k][1]);
            }
        }
    }
}

int reccompile_in_batch_softmax(int64_t n, int64_t m, int64_t d, const float *q, const float *c, const int64_t *own,
                                const int64_t *hit_starts, const int64_t *hit_columns, float *losses, float *grad_q,
                                float *grad_c, float grad_scale, int64_t threads) {
    if (threads < 1) threads = 1;
    const int64_t mp = (m + COLS - 1) / COLS * COLS;
    const int64_t ld = mp + W; /* rows of the [*, mp] buffers one vector apart from a multiple of 4 KB */
    const int grads = grad_q != NULL;
    /* ct [d, ld]; per thread: logits [TILE, ld], q and q/sum tiles [TILE, d], row scales, d/dc^T [d, ld] */
    const int64_t per_thread = TILE * ld + 2 * TILE * d + TILE + (grads ? d * ld : 0);
    float *scratch = aligned_alloc(64, (size_t)(d * ld + threads * per_thread) * sizeof(float));
    if (!scratch) return 1;
    float *ct = scratch;
#pragma omp parallel num_threads((int)threads)
    {
        const int64_t t = omp_get_thread_num(), team = omp_get_num_threads();
        for (int64_t k = d * t / team; k < d * (t + 1) / team; k++) {
            for (int64_t j = 0; j < m; j++) ct[k * ld + j] = c[j * d + k];
            for (int64_t j = m; j < mp; j++) ct[k * ld + j] = 0.0f;
        }
        float *logits = scratch + d * ld + t * per_thread;
        float *qt = logits + TILE * ld, *qs = qt + TILE * d, *scale = qs + TILE * d, *gct = scale + TILE;
        if (grads) memset(gct, 0, (size_t)(d * ld) * sizeof *gct);
#pragma omp barrier
        const int64_t begin = n * t / team, end = n * (t + 1) / team;
        for (int64_t first = begin; first < end; first += TILE) {
            const int64_t rows = end - first < TILE ? end - first : TILE;
            memcpy(qt, q + first * d, (size_t)(rows * d) * sizeof *qt);
            memset(qt + rows * d, 0, (size_t)((TILE - rows) * d) * sizeof *qt);
            tile_logits(qt, ct, d, mp, ld, logits);
            tile_softmax(logits, first, rows, m, mp, ld, own, hit_starts, hit_columns, losses, scale);
            if (!grads) continue;
            tile_grad_query(logits, c, d, m, ld, rows, scale, own + first, grad_scale, grad_q + first * d);
            for (int64_t r = 0; r < TILE; r++)
                for (int64_t k = 0; k < d; k++) qs[r * d + k] = r < rows ? qt[r * d + k] * scale[r] : 0.0f;
            tile_grad_candidates(qs, logits, d, mp, ld, gct);
            for (int64_t r = 0; r < rows; r++) /* the one-hot's share */
                for (int64_t k = 0; k < d; k++) gct[k * ld + own[first + r]] -= qt[r * d + k];
        }
        if (grads) {
#pragma omp barrier
            const float *first_gct = scratch + d * ld + TILE * ld + 2 * TILE * d + TILE;
            for (int64_t j = m * t / team; j < m * (t + 1) / team; j++)
                for (int64_t k = 0; k < d; k++) {
                    float total = 0.0f;
                    for (int64_t s = 0; s < team; s++) total += first_gct[s * per_thread + k * ld + j];
                    grad_c[j * d + k] = total;
                }
        }
    }
    free(scratch);
    return 0;
}
