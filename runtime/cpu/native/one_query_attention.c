/* Attention of one query per sample and head over a prefix of a padded sequence, forward and backward.
 *
 * The last layer of a transformer read at one position (runtime/modules/blocks/transformer.py,
 * output "first" or "last") attends from one query per sample and head, with the
 * query already taken into the input's space (q_h W_k,h, scaled), so keys and
 * values are the input rows themselves. Per sample b, head h, with n = counts[b]
 * keys (the positions 0 .. n-1 of x[b]; n >= 1):
 *
 *   forward:  s_l = <x_l, q_h>,  p = softmax(s),  w_h = sum_l p_l x_l
 *   backward: with g_h the gradient of w_h,
 *             dp_l = <g_h, x_l>,  ds_l = p_l (dp_l - sum_k p_k dp_k)
 *             dq_h = sum_l ds_l x_l,  dx_l = sum_h (p_l g_h + ds_l q_h)   (0 at l >= n)
 *
 * torch.bmm spends most of its time in per-matrix overhead on these tiny
 * products (51 x 64 by 64 x 2, a thousand times a batch); here each sample is
 * a few passes over its rows, vectorised by the compiler (-O3 -march=native,
 * associative float math), with the batch split over `threads` OpenMP threads.
 * `probs` (batch, heads, length) keeps p for the backward (0 past n).
 */

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#else
static int omp_get_thread_num(void) { return 0; }
static int omp_get_num_threads(void) { return 1; }
#endif

static inline float dot(const float *a, const float *b, int64_t d) {
    float total = 0.0f;
    for (int64_t i = 0; i < d; i++) total += a[i] * b[i];
    return total;
}

static void forward_sample(const float *x, const float *q, int64_t n, int64_t length, int64_t heads, int64_t d,
                           float *w, float *probs) {
    for (int64_t h = 0; h < heads; h++) {
        float *p = probs + h * length;
        const float *qh = q + h * d;
        float top = -INFINITY;
        for (int64_t l = 0; l < n; l++) {
            p[l] = dot(x + l * d, qh, d);
            if (p[l] > top) top = p[l];
        }
        float total = 0.0f;
        for (int64_t l = 0; l < n; l++) total += (p[l] = expf(p[l] - top));
        const float scale = 1.0f / total;
        float *wh = w + h * d;
        memset(wh, 0, (size_t)d * sizeof *wh);
        for (int64_t l = 0; l < n; l++) {
            p[l] *= scale;
            const float *xl = x + l * d;
            for (int64_t i = 0; i < d; i++) wh[i] += p[l] * xl[i];
        }
        memset(p + n, 0, (size_t)(length - n) * sizeof *p);
    }
}

static void backward_sample(const float *x, const float *q, const float *probs, const float *g, int64_t n,
                            int64_t length, int64_t heads, int64_t d, float *dx, float *dq, float *ds) {
    memset(dx, 0, (size_t)(length * d) * sizeof *dx);
    for (int64_t h = 0; h < heads; h++) {
        const float *p = probs + h * length, *gh = g + h * d, *qh = q + h * d;
        float mean = 0.0f;
        for (int64_t l = 0; l < n; l++) mean += p[l] * (ds[l] = dot(gh, x + l * d, d));
        float *dqh = dq + h * d;
        memset(dqh, 0, (size_t)d * sizeof *dqh);
        for (int64_t l = 0; l < n; l++) {
            const float dsl = p[l] * (ds[l] - mean), pl = p[l];
            const float *xl = x + l * d;
            float *dxl = dx + l * d;
            for (int64_t i = 0; i < d; i++) {
                dqh[i] += dsl * xl[i];
                dxl[i] += pl * gh[i] + dsl * qh[i];
            }
        }
    }
}

/* Splits samples [0, batch) evenly over the team; `backward` picks the pass, which needs `scratch`:
 * `length` floats per thread (the caller's memory: a long sequence would overflow a thread's stack). */
static void run(int64_t batch, int64_t length, int64_t heads, int64_t d, const float *x, const float *q,
                const int64_t *counts, float *probs, float *w, const float *g, float *dx, float *dq,
                float *scratch, int64_t threads) {
    if (threads < 1) threads = 1;
#pragma omp parallel num_threads((int)threads)
    {
        const int64_t t = omp_get_thread_num(), team = omp_get_num_threads();
        const int64_t begin = batch * t / team, end = batch * (t + 1) / team;
        float *ds = scratch ? scratch + t * length : NULL;
        for (int64_t b = begin; b < end; b++) {
            const int64_t n = counts[b] < 1 ? 1 : (counts[b] > length ? length : counts[b]);
            const float *xb = x + b * length * d, *qb = q + b * heads * d;
            float *pb = probs + b * heads * length;
            if (ds)
                backward_sample(xb, qb, pb, g + b * heads * d, n, length, heads, d, dx + b * length * d,
                                dq + b * heads * d, ds);
            else
                forward_sample(xb, qb, n, length, heads, d, w + b * heads * d, pb);
        }
    }
}

void reccompile_one_query_attention_forward(int64_t batch, int64_t length, int64_t heads, int64_t d, const float *x,
                                            const float *q, const int64_t *counts, float *w, float *probs,
                                            int64_t threads) {
    run(batch, length, heads, d, x, q, counts, probs, w, NULL, NULL, NULL, NULL, threads);
}

void reccompile_one_query_attention_backward(int64_t batch, int64_t length, int64_t heads, int64_t d,
                                             const float *x, const float *q, const int64_t *counts,
                                             const float *probs, const float *g, float *dx, float *dq,
                                             float *scratch, int64_t threads) {
    run(batch, length, heads, d, x, q, counts, (float *)probs, NULL, g, dx, dq, scratch, threads);
}
