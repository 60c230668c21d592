/* DLRM's pairwise dot interaction on the CPU, forward and backward.
 *
 * Per sample, n vectors z_0 .. z_{n-1} of width d are read in place from
 * `parts` inputs: row b of input k starts at inputs[k] + b * strides[k] and
 * holds the next counts[k] vectors, so the caller never concatenates them
 * (an input may be a column slice of a wider buffer, as the pieces of a
 * pooled all-to-all's receive buffer are). The backward writes each part's
 * gradient in the same way, rows grad_strides[k] apart.
 *
 *   forward:  out[b] = [z_0, <z_i, z_j> for i < j in row-major order]
 *   backward: with g the gradient of out[b] and g_ij the one of <z_i, z_j>,
 *             dz_i = sum_{j != i} g_ij z_j, plus g[0:d] for z_0.
 *
 * torch.bmm computes the full n x n Gram matrix per sample through small
 * batched GEMMs; here only the strict upper triangle is formed, each pair with
 * d fused multiply-adds that the compiler vectorises (it is built with
 * -O3 -march=native and associative float math; see runtime/cpu/native/__init__.py),
 * and the batch is split over `threads` threads of an OpenMP team. With AVX
 * and 8-lane vectors, pairs (i, j..j+3) are summed together and their four
 * horizontal sums share one reduction tree, which was most of a pair's work
 * (0.44 -> 0.38 ms per 512 samples of 27 x 64 on one thread of an AVX2 EPYC).
 *
 * Returns 0, or 1 when a scratch allocation fails.
 */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX__) && !defined(__AVX512F__)
#include <immintrin.h>
#endif

#ifdef _OPENMP
#include <omp.h>
#else
static int omp_get_thread_num(void) { return 0; }
static int omp_get_num_threads(void) { return 1; }
#endif

typedef struct {
    int64_t begin, end; /* samples [begin, end) */
    int64_t parts, n, d;
    const float *const *inputs;
    const int64_t *counts, *strides;
    const float *grad_out; /* backward only: rows of grad_stride floats */
    int64_t grad_stride;
    float *out;            /* forward: (batch, d + n(n-1)/2) */
    float *const *grad_inputs;
    const int64_t *grad_strides;
    int status;
} job_t;

/* Pointers to the n vectors of sample b in `base` (inputs or their gradients, rows `strides` apart). */
static void locate(const job_t *job, int64_t b, float *const *base, const int64_t *strides, float **vec) {
    int64_t k = 0;
    for (int64_t part = 0; part < job->parts; part++) {
        float *row = base[part] + b * strides[part];
        for (int64_t v = 0; v < job->counts[part]; v++) vec[k++] = row + v * job->d;
    }
}

/* GCC/Clang vector extension as wide as the target's float registers, loadable
 * from any float address. A vector wider than the registers (16 floats on an
 * AVX2 CPU) is split by the compiler through the stack, ten times slower. */
#if defined(__AVX512F__)
#define LANES 16
#elif defined(__AVX__)
#define LANES 8
#else
#define LANES 4 /* SSE2, NEON */
#endif
typedef float vecf __attribute__((vector_size(4 * LANES), aligned(4)));

static inline float sum_lanes(vecf v) {
    float total = 0.0f;
    for (int lane = 0; lane < LANES; lane++) total += v[lane];
    return total;
}

/* Pairs (i, j..j+3) of z_i held in registers, written to pair[0..3]: with AVX's
 * 8 lanes, one tree of horizontal adds reduces all four sums; elsewhere none. */
#if defined(__AVX__) && !defined(__AVX512F__)
#define FOUR_PAIRS 1
static inline void four_pairs(const vecf *zi, int nv, float *const *vec, int64_t j, float *pair) {
    const float *a = vec[j], *b = vec[j + 1], *c = vec[j + 2], *e = vec[j + 3];
    vecf s0 = zi[0] * *(const vecf *)a, s1 = zi[0] * *(const vecf *)b;
    vecf s2 = zi[0] * *(const vecf *)c, s3 = zi[0] * *(const vecf *)e;
    for (int k = 1; k < nv; k++) {
        s0 += zi[k] * *(const vecf *)(a + LANES * k);
        s1 += zi[k] * *(const vecf *)(b + LANES * k);
        s2 += zi[k] * *(const vecf *)(c + LANES * k);
        s3 += zi[k] * *(const vecf *)(e + LANES * k);
    }
    const __m256 sums = _mm256_hadd_ps(_mm256_hadd_ps((__m256)s0, (__m256)s1), _mm256_hadd_ps((__m256)s2, (__m256)s3));
    _mm_storeu_ps(pair, _mm_add_ps(_mm256_castps256_ps128(sums), _mm256_extractf128_ps(sums, 1)));
}
#else
#define FOUR_PAIRS 0
static inline void four_pairs(const vecf *zi, int nv, float *const *vec, int64_t j, float *pair) {
    (void)zi, (void)nv, (void)vec, (void)j, (void)pair;
}
#endif

/* Vector registers: 32 with AVX-512, 16 with AVX and SSE (x86-64), 32 with NEON. The backward
 * holds rows x NV accumulators, NV loaded vectors and a broadcast: as many rows as fit, at most 4. */
#if defined(__AVX512F__) || defined(__aarch64__)
#define REGISTERS 32
#else
#define REGISTERS 16
#endif
#define FIT_ROWS(NV) ((REGISTERS - (NV) - 2) / (NV))
#define BLOCK_ROWS(NV) (FIT_ROWS(NV) < 1 ? 1 : FIT_ROWS(NV) > 4 ? 4 : FIT_ROWS(NV))

/* Per-sample kernels for d = LANES * NV, with a whole vector held in registers. */
#define VECTOR_KERNELS(NV)                                                                       \
    static void forward_sample_##NV(float *const *vec, float *row, int64_t n, int64_t d) {       \
        memcpy(row, vec[0], (size_t)d * sizeof *row);                                            \
        float *pair = row + d;                                                                   \
        for (int64_t i = 0; i < n; i++) {                                                        \
            vecf zi[NV];                                                                         \
            for (int k = 0; k < NV; k++) zi[k] = *(const vecf *)(vec[i] + LANES * k);            \
            int64_t j = i + 1;                                                                   \
            if (FOUR_PAIRS)                                                                      \
                for (; j + 4 <= n; j += 4, pair += 4) four_pairs(zi, NV, vec, j, pair);          \
            for (; j < n; j++) {                                                                 \
                vecf acc = zi[0] * *(const vecf *)vec[j];                                        \
                for (int k = 1; k < NV; k++) acc += zi[k] * *(const vecf *)(vec[j] + LANES * k); \
                *pair++ = sum_lanes(acc);                                                        \
            }                                                                                    \
        }                                                                                        \
    }                                                                                            \
    /* dz_i for BLOCK_ROWS(NV) rows i at a time: each z_j is loaded once per block of rows, not  \
     * once per row, so the loop runs on multiply-adds rather than loads. Every dz_i still sums  \
     * its terms in the order of j, as the one-row loop after it does. */                       \
    static void backward_sample_##NV(float *const *vec, float *const *grad, const float *g,      \
                                     const float *sym, int64_t n, int64_t d) {                   \
        (void)d;                                                                                 \
        enum { ROWS = BLOCK_ROWS(NV) };                                                          \
        int64_t i = 0;                                                                           \
        for (; ROWS > 1 && i + ROWS <= n; i += ROWS) {                                           \
            vecf acc[ROWS][NV];                                                                  \
            for (int r = 0; r < ROWS; r++)                                                       \
                for (int k = 0; k < NV; k++)                                                     \
                    acc[r][k] = i + r == 0 ? *(const vecf *)(g + LANES * k) : (vecf){0};         \
            for (int64_t j = 0; j < n; j++) {                                                    \
                vecf zj[NV];                                                                     \
                for (int k = 0; k < NV; k++) zj[k] = *(const vecf *)(vec[j] + LANES * k);        \
                for (int r = 0; r < ROWS; r++) {                                                 \
                    const float s = sym[(i + r) * n + j];                                        \
                    for (int k = 0; k < NV; k++) acc[r][k] += s * zj[k];                         \
                }                                                                                \
            }                                                                                    \
            for (int r = 0; r < ROWS; r++)                                                       \
                for (int k = 0; k < NV; k++) *(vecf *)(grad[i + r] + LANES * k) = acc[r][k];     \
        }                                                                                        \
        for (; i < n; i++) {                                                                     \
            const float *s = sym + i * n;                                                        \
            vecf acc[NV];                                                                        \
            for (int k = 0; k < NV; k++)                                                         \
                acc[k] = i == 0 ? *(const vecf *)(g + LANES * k) : (vecf){0};                    \
            for (int64_t j = 0; j < n; j++)                                                      \
                for (int k = 0; k < NV; k++) acc[k] += s[j] * *(const vecf *)(vec[j] + LANES * k); \
            for (int k = 0; k < NV; k++) *(vecf *)(grad[i] + LANES * k) = acc[k];                \
        }                                                                                        \
    }

VECTOR_KERNELS(1)
VECTOR_KERNELS(2)
VECTOR_KERNELS(4)
VECTOR_KERNELS(8)

/* Any width: scalar loops the compiler vectorises as it can. */
static void forward_sample_any(float *const *vec, float *row, int64_t n, int64_t d) {
    memcpy(row, vec[0], (size_t)d * sizeof *row);
    float *pair = row + d;
    for (int64_t i = 0; i < n; i++) {
        for (int64_t j = i + 1; j < n; j++) {
            float acc = 0.0f;
            for (int64_t t = 0; t < d; t++) acc += vec[i][t] * vec[j][t];
            *pair++ = acc;
        }
    }
}

static void backward_sample_any(float *const *vec, float *const *grad, const float *g, const float *sym,
                                int64_t n, int64_t d) {
    for (int64_t i = 0; i < n; i++) {
        const float *s = sym + i * n;
        float *restrict out = grad[i];
        for (int64_t t = 0; t < d; t++) out[t] = i == 0 ? g[t] : 0.0f;
        for (int64_t j = 0; j < n; j++) {
            const float *restrict zj = vec[j];
            for (int64_t t = 0; t < d; t++) out[t] += s[j] * zj[t];
        }
    }
}

typedef void (*forward_fn)(float *const *, float *, int64_t, int64_t);
typedef void (*backward_fn)(float *const *, float *const *, const float *, const float *, int64_t, int64_t);

static forward_fn forward_kernel(int64_t d) {
    switch (d) {
        case LANES * 1: return forward_sample_1;
        case LANES * 2: return forward_sample_2;
        case LANES * 4: return forward_sample_4;
        case LANES * 8: return forward_sample_8;
        default: return forward_sample_any;
    }
}

static backward_fn backward_kernel(int64_t d) {
    switch (d) {
        case LANES * 1: return backward_sample_1;
        case LANES * 2: return backward_sample_2;
        case LANES * 4: return backward_sample_4;
        case LANES * 8: return backward_sample_8;
        default: return backward_sample_any;
    }
}

static void forward_range(job_t *job) {
    const int64_t n = job->n, d = job->d, width = d + n * (n - 1) / 2;
    const forward_fn kernel = forward_kernel(d);
    float **vec = malloc((size_t)n * sizeof *vec);
    if (vec == NULL) {
        job->status = 1;
        return;
    }
    for (int64_t b = job->begin; b < job->end; b++) {
        locate(job, b, (float *const *)job->inputs, job->strides, vec);
        kernel(vec, job->out + b * width, n, d);
    }
    free(vec);
}

/* The gradients of sample b's pairs as the symmetric n x n matrix S (zero
 * diagonal), so that dz_i = S[i] . Z reads one row in order, with no branch. */
static void symmetric_pairs(const float *pairs, float *sym, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        sym[i * n + i] = 0.0f;
        for (int64_t j = i + 1; j < n; j++) sym[i * n + j] = sym[j * n + i] = *pairs++;
    }
}

static void backward_range(job_t *job) {
    const int64_t n = job->n, d = job->d;
    const backward_fn kernel = backward_kernel(d);
    float **vec = malloc((size_t)n * sizeof *vec);
    float **grad = malloc((size_t)n * sizeof *grad);
    float *sym = malloc((size_t)(n * n) * sizeof *sym);
    if (vec == NULL || grad == NULL || sym == NULL) {
        free(vec);
        free(grad);
        free(sym);
        job->status = 1;
        return;
    }
    for (int64_t b = job->begin; b < job->end; b++) {
        const float *g = job->grad_out + b * job->grad_stride;
        locate(job, b, (float *const *)job->inputs, job->strides, vec);
        locate(job, b, job->grad_inputs, job->grad_strides, grad);
        symmetric_pairs(g + d, sym, n);
        kernel(vec, grad, g, sym, n, d);
    }
    free(vec);
    free(grad);
    free(sym);
}

/* Runs `body` over the batch split into one contiguous range per thread of
 * an OpenMP team. The library links the OpenMP runtime torch has loaded
 * (libgomp.so.1 by soname; see runtime/cpu/native), so the team is torch's own
 * intra-op pool: no thread is created, and none spins beside ours. Built
 * without OpenMP, it runs on the calling thread. */
static int run(const job_t *proto, int64_t batch, int64_t threads, void (*body)(job_t *)) {
    if (threads < 1) threads = 1;
    if (threads > batch) threads = batch > 0 ? batch : 1;
    int status = 0;
#pragma omp parallel num_threads((int)threads) reduction(| : status)
    {
        job_t job = *proto;
        const int64_t t = omp_get_thread_num(), count = omp_get_num_threads();
        job.begin = batch * t / count;
        job.end = batch * (t + 1) / count;
        job.status = 0;
        body(&job);
        status |= job.status;
    }
    return status;
}

static job_t make_job(int64_t parts, const float *const *inputs, const int64_t *counts, const int64_t *strides,
                      int64_t d) {
    job_t job = {.parts = parts, .d = d, .inputs = inputs, .counts = counts, .strides = strides};
    for (int64_t k = 0; k < parts; k++) job.n += counts[k];
    return job;
}

int reccompile_dot_forward(int64_t batch, int64_t parts, const float *const *inputs, const int64_t *counts,
                           const int64_t *strides, int64_t d, float *out, int64_t threads) {
    job_t job = make_job(parts, inputs, counts, strides, d);
    job.out = out;
    return run(&job, batch, threads, forward_range);
}

int reccompile_dot_backward(int64_t batch, int64_t parts, const float *const *inputs, const int64_t *counts,
                            const int64_t *strides, int64_t d, const float *grad_out, int64_t grad_stride,
                            float *const *grad_inputs, const int64_t *grad_strides, int64_t threads) {
    job_t job = make_job(parts, inputs, counts, strides, d);
    job.grad_out = grad_out;
    job.grad_stride = grad_stride;
    job.grad_inputs = grad_inputs;
    job.grad_strides = grad_strides;
    return run(&job, batch, threads, backward_range);
}
