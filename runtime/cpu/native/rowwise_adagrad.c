/* The backward of a sum-pooled table-batched lookup with row-wise Adagrad
 * applied in place, on the host layout of fbgemm's training TBE.
 *
 * Table t holds rows[t] rows of dims[t] floats at weights + weight_offsets[t]
 * and one float of state per row at momentum + momentum_offsets[t]. Feature f
 * reads table feature_tables[f]; bag (f, b) holds
 * ids[offsets[f * batch + b] .. offsets[f * batch + b + 1]), each id times
 * sample_weights[i] when given, and its gradient is
 * grad[b * grad_width + grad_columns[f] .. + dims].
 *
 * Per table, every row the batch touches gets the sum g of its gradients
 * over all its occurrences (in every feature that reads the table), then
 *     m[r] += mean(g * g);   w[r] -= lr / (sqrt(m[r]) + eps) * g,
 * fbgemm's exact row-wise Adagrad (runtime/embeddings/optim.py).
 *
 * fbgemm's CPU kernel does the same after sorting each table's ids; here the
 * occurrences are sorted by row with an LSD radix sort over only the bits the
 * table's row count needs (two passes for 100,000 rows), each row's gradient
 * is summed in occurrence order, and the weight rows come in increasing order
 * with a row some occurrences on prefetched. An unweighted occurrence is
 * sorted with its bag's number, whose gradient row one small array gives (a
 * bag array of 32 KB per feature at batch 4096 stays in cache, where a record
 * per occurrence would not: at dlrm-bench multihot dist2's 1M ids a rank, 46
 * against 77 ms of CPU).
 *
 * Where a row is a whole number of vectors (16 lanes with AVX-512, 8
 * without), up to MAX_VECTORS, its gradient sum stays in registers from its
 * first occurrence to its update, in a loop of its own per width
 * (`update_rows`; at those 1M ids, 64 wide, 37-40 against 47-51 ms of CPU on
 * the 2-core Zen 4, most of the rest being the weights' and gradients' memory
 * traffic, then 30-32 with the weight rows prefetched into L2 further ahead);
 * any other width sums in a buffer (`update_rows_any`). The mean of
 * squares sums a vector's lanes (16 lanes in the buffer's case), then
 * pairwise. Tables are split over an OpenMP team (torch's pool, as in
 * dot_interaction.c).
 */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Prefetch distances in occurrences. A weight row is fetched into L2 L2_AHEAD occurrences ahead,
 * then for writing into L1 ROW_AHEAD ahead: at dlrm-bench multihot dist2's shapes (one thread,
 * the 2-core Zen 4) 30-32 against 38-40 ms of CPU with the L1 prefetch alone (L2 distances of 32
 * to 256 alike; either prefetch alone costs 4-9 ms more), as L2 keeps more misses in flight than
 * L1's few miss buffers (quant_pool.c found the same). No gradient prefetch cost 1-9 ms more. */
enum { DIGIT_BITS = 11, BUCKETS = 1 << DIGIT_BITS, LANES = 16, MAX_VECTORS = 8 };
enum { L2_AHEAD = 64, ROW_AHEAD = 16, GRAD_AHEAD = 8 };

/* A row's gradient sum is kept in vectors of the machine's width (as in quant_pool.c): 16 lanes
 * with AVX-512, 8 otherwise; a vector wider than the registers would live on the stack. */
#if defined(__AVX512F__)
#define VECTOR_LANES 16
#else
#define VECTOR_LANES 8
#endif
typedef float vec_t __attribute__((vector_size(4 * VECTOR_LANES), aligned(4)));

/* Sorts keys (row << 32 | slot) by row, stably, keys[0..n) with scratch of n; returns the sorted array. */
static uint64_t *sort_by_row(uint64_t *keys, uint64_t *scratch, int64_t n, int64_t rows) {
    int bits = 0;
    while (bits < 63 && ((int64_t)1 << bits) < rows) bits++;
    int64_t *counts = malloc(sizeof(int64_t) * BUCKETS);
    if (counts == NULL) return NULL;
    for (int shift = 32; shift < 32 + bits; shift += DIGIT_BITS) {
        memset(counts, 0, sizeof(int64_t) * BUCKETS);
        for (int64_t i = 0; i < n; i++) counts[(keys[i] >> shift) & (BUCKETS - 1)]++;
        int64_t sum = 0;
        for (int64_t d = 0; d < BUCKETS; d++) {
            const int64_t c = counts[d];
            counts[d] = sum;
            sum += c;
        }
        for (int64_t i = 0; i < n; i++) scratch[counts[(keys[i] >> shift) & (BUCKETS - 1)]++] = keys[i];
        uint64_t *swap = keys;
        keys = scratch;
        scratch = swap;
    }
    free(counts);
    return keys;
}

/* The sum of squares of x[0..d), in LANES partial sums (lane k % LANES) added pairwise at the end:
 * one vector of independent sums instead of a chain of d dependent adds. */
static float sum_of_squares(const float *x, int64_t d) {
    float lanes[LANES] = {0.0f};
    int64_t k = 0;
    for (; k + LANES <= d; k += LANES)
        for (int l = 0; l < LANES; l++) lanes[l] += x[k + l] * x[k + l];
    for (int l = 0; k < d; k++, l++) lanes[l] += x[k] * x[k];
    for (int width = LANES / 2; width > 0; width /= 2)
        for (int l = 0; l < width; l++) lanes[l] += lanes[l + width];
    return lanes[0];
}

/* Fetches weight row `row` (of d floats) into L2, for reading. */
static inline void prefetch_row_l2(const float *table, uint64_t row, int64_t d) {
    for (int64_t k = 0; k < d; k += 16) __builtin_prefetch(table + row * d + k, 0, 2);
}

/* The updates of the rows of sorted[0..n) (keys of `update_table`), rows of V vectors: a row's
 * gradient sum stays in registers from its first occurrence to its update. The weight row
 * L2_AHEAD occurrences on is prefetched into L2, the weight row and state ROW_AHEAD on for
 * writing, the gradient row GRAD_AHEAD on. */
static inline __attribute__((always_inline)) void update_rows(const int V, const uint64_t *sorted, int64_t n,
                                                              const int64_t *sources, const float *slot_weights,
                                                              const float *grad, float *table, float *state,
                                                              float lr, float eps) {
    const int64_t d = (int64_t)V * VECTOR_LANES;
    for (int64_t i = 0; i < n;) {
        const uint64_t row = sorted[i] >> 32;
        if (i + L2_AHEAD < n) prefetch_row_l2(table, sorted[i + L2_AHEAD] >> 32, d);
        if (i + ROW_AHEAD < n) {
            const uint64_t ahead = sorted[i + ROW_AHEAD] >> 32;
            for (int64_t k = 0; k < d; k += 16) __builtin_prefetch(table + ahead * d + k, 1);
            __builtin_prefetch(state + ahead, 1);
        }
        vec_t acc[MAX_VECTORS];
        for (int v = 0; v < V; v++) acc[v] = (vec_t){0};
        do {
            if (i + GRAD_AHEAD < n) {
                const float *g = grad + sources[(uint32_t)sorted[i + GRAD_AHEAD]];
                for (int64_t k = 0; k < d; k += 16) __builtin_prefetch(g + k);
            }
            const uint32_t slot = (uint32_t)sorted[i];
            const float *g = grad + sources[slot], w = slot_weights == NULL ? 1.0f : slot_weights[slot];
            for (int v = 0; v < V; v++) acc[v] += w * *(const vec_t *)(g + v * VECTOR_LANES);
            i++;
        } while (i < n && sorted[i] >> 32 == row);
        vec_t squares = acc[0] * acc[0];
        for (int v = 1; v < V; v++) squares += acc[v] * acc[v];
        float lanes[VECTOR_LANES];
        memcpy(lanes, &squares, sizeof(lanes));
        for (int width = VECTOR_LANES / 2; width > 0; width /= 2)
            for (int l = 0; l < width; l++) lanes[l] += lanes[l + width];
        state[row] += lanes[0] / (float)d;
        const vec_t step = (vec_t){0} + lr / (sqrtf(state[row]) + eps);
        float *weights = table + row * d;
        for (int v = 0; v < V; v++) {
            vec_t *x = (vec_t *)(weights + v * VECTOR_LANES);
            *x = *x - step * acc[v];
        }
    }
}

/* `update_rows` for any width d, the row's sum in `sum` (d floats). */
static void update_rows_any(int64_t d, const uint64_t *sorted, int64_t n, const int64_t *sources,
                            const float *slot_weights, const float *grad, float *table, float *state, float lr,
                            float eps, float *sum) {
    for (int64_t first = 0; first < n;) {
        const uint64_t row = sorted[first] >> 32;
        int64_t last = first + 1;
        while (last < n && sorted[last] >> 32 == row) last++;
        if (last + L2_AHEAD < n) prefetch_row_l2(table, sorted[last + L2_AHEAD] >> 32, d);
        if (last + GRAD_AHEAD < n) { /* rows come in increasing order, a few occurrences apart */
            const uint64_t ahead = sorted[last + GRAD_AHEAD];
            const float *w = table + (ahead >> 32) * d;
            for (int64_t k = 0; k < d; k += 16) __builtin_prefetch(w + k, 1);
            __builtin_prefetch(state + (ahead >> 32), 1);
            const float *g = grad + sources[ahead & 0xffffffffu];
            for (int64_t k = 0; k < d; k += 16) __builtin_prefetch(g + k);
        }
        for (int64_t k = 0; k < d; k++) sum[k] = 0.0f;
        for (int64_t i = first; i < last; i++) {
            const uint32_t slot = (uint32_t)sorted[i];
            const float *g = grad + sources[slot], w = slot_weights == NULL ? 1.0f : slot_weights[slot];
            for (int64_t k = 0; k < d; k++) sum[k] += w * g[k];
        }
        state[row] += sum_of_squares(sum, d) / (float)d;
        const float step = lr / (sqrtf(state[row]) + eps);
        float *w = table + row * d;
        for (int64_t k = 0; k < d; k++) w[k] -= step * sum[k];
        first = last;
    }
}

/* Table t's update; returns 0, 1 for an id outside [0, rows[t]), 4 when out of memory.
 *
 * Each occurrence is sorted as (row << 32 | slot). Unweighted, the slot is its bag's number
 * among the table's bags (feature by feature, then sample), so one small array gives the
 * gradient row of every slot; weighted, the slot is the occurrence's own number, and its
 * gradient row and weight come from two arrays of the occurrences' length. */
static int update_table(int64_t t, int64_t features, int64_t batch, float *weights, const int64_t *weight_offsets,
                        float *momentum, const int64_t *momentum_offsets, const int64_t *rows, const int64_t *dims,
                        const int64_t *feature_tables, const int64_t *grad_columns, int64_t grad_width,
                        const int64_t *ids, const int64_t *offsets, const float *sample_weights, const float *grad,
                        float lr, float eps) {
    int64_t n = 0, bags = 0;
    for (int64_t f = 0; f < features; f++)
        if (feature_tables[f] == t) {
            n += offsets[(f + 1) * batch] - offsets[f * batch];
            bags += batch;
        }
    if (n == 0) return 0;
    const int weighted = sample_weights != NULL;
    const int64_t slots = weighted ? n : bags;
    if (slots > 0xffffffffLL) return 4; /* slots are numbered in 32 bits */
    const int64_t d = dims[t], limit = rows[t];
    uint64_t *keys = malloc(sizeof(uint64_t) * 2 * n);
    int64_t *sources = malloc(sizeof(int64_t) * slots);
    float *slot_weights = weighted ? malloc(sizeof(float) * n) : NULL;
    float *sum = malloc(sizeof(float) * d);
    int status = keys == NULL || sources == NULL || (weighted && slot_weights == NULL) || sum == NULL ? 4 : 0;
    int64_t j = 0, bag = 0;
    for (int64_t f = 0; f < features && status == 0; f++) {
        if (feature_tables[f] != t) continue;
        for (int64_t b = 0; b < batch && status == 0; b++, bag++) {
            const int64_t source = b * grad_width + grad_columns[f];
            if (!weighted) sources[bag] = source;
            for (int64_t i = offsets[f * batch + b]; i < offsets[f * batch + b + 1]; i++, j++) {
                if (ids[i] < 0 || ids[i] >= limit) {
                    status = 1;
                    break;
                }
                keys[j] = (uint64_t)ids[i] << 32 | (uint64_t)(weighted ? j : bag);
                if (weighted) {
                    sources[j] = source;
                    slot_weights[j] = sample_weights[i];
                }
            }
        }
    }
    const uint64_t *sorted = status == 0 ? sort_by_row(keys, keys + n, n, limit) : NULL;
    if (status == 0 && sorted == NULL) status = 4;
    float *table = weights + weight_offsets[t], *state = momentum + momentum_offsets[t];
    const float *by_slot = weighted ? slot_weights : NULL;
    const int64_t vectors = d % VECTOR_LANES == 0 ? d / VECTOR_LANES : 0;
    if (status == 0) switch (vectors) { /* a loop of its own for each width of up to MAX_VECTORS vectors */
#define WIDTH(V)                                                                         \
    case V:                                                                              \
        update_rows(V, sorted, n, sources, by_slot, grad, table, state, lr, eps);       \
        break;
            WIDTH(1) WIDTH(2) WIDTH(3) WIDTH(4) WIDTH(5) WIDTH(6) WIDTH(7) WIDTH(8)
#undef WIDTH
        default:
            update_rows_any(d, sorted, n, sources, by_slot, grad, table, state, lr, eps, sum);
        }
    free(keys);
    free(sources);
    free(slot_weights);
    free(sum);
    return status;
}

/* Returns 0, or a bitmask: 1 an id outside its table's rows (that table is left unchanged),
 * 4 out of memory. */
int reccompile_rowwise_adagrad_backward(int64_t tables, int64_t features, int64_t batch, float *weights,
                                        const int64_t *weight_offsets, float *momentum,
                                        const int64_t *momentum_offsets, const int64_t *rows, const int64_t *dims,
                                        const int64_t *feature_tables, const int64_t *grad_columns,
                                        int64_t grad_width, const int64_t *ids, const int64_t *offsets,
                                        const float *sample_weights, const float *grad, float lr, float eps,
                                        int64_t threads) {
    int status = 0;
    if (threads < 1) threads = 1;
#pragma omp parallel for num_threads((int)threads) schedule(dynamic, 1) reduction(| : status)
    for (int64_t t = 0; t < tables; t++)
        status |= update_table(t, features, batch, weights, weight_offsets, momentum, momentum_offsets, rows, dims,
                               feature_tables, grad_columns, grad_width, ids, offsets, sample_weights, grad, lr, eps);
    return status;
}
