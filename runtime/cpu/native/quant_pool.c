/* Pooled lookups of inference tables stored in fbgemm's IntNBit host layout.
 *
 * Feature f reads its table at byte offset table_offsets[f], rows of
 * strides[f] bytes holding dims[f] values of types[f]:
 *   0 fp32, 1 fp16: the values;
 *   2 int8, 3 int4: a float16 scale and a float16 bias, then the codes (int4:
 *     two per byte, low nibble first); a value reads as code * scale + bias.
 * Bag (f, b) holds ids[offsets[f * batch + b] .. offsets[f * batch + b + 1]),
 * each times its per-id weight when `weights` is given; its sum goes to
 * out[b, out_offsets[f] .. + dims[f]). Per id the sum takes the same steps as
 * fbgemm's kernel (acc += w * bias, then acc = fma(w * scale, code, acc)), so
 * the results are the same bits (tests/runtime/serving/test_quant_embedding.py).
 * Given each feature's row count, ids are checked on the way (one pass for
 * the check and the sum); the offsets always are.
 *
 * fbgemm's CPU kernel for this pools on one thread. Here the bags are split
 * over an OpenMP team (torch's pool, as in dot_interaction.c), each (type,
 * width) pair has its own loop with the bag's sum in registers, and the rows
 * of the next ids (across bags and features) are prefetched into L2: rows
 * are scattered over hundreds of megabytes.
 */

#include <stdint.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#else
static int omp_get_thread_num(void) { return 0; }
static int omp_get_num_threads(void) { return 1; }
#endif

/* The library is built with associative float math for dot_interaction.c's
 * reductions; here each id's two steps must stay as written to give fbgemm's bits. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-associative-math")
#endif

/* Every x86 intrinsic below sits under the macro of the feature that provides
 * it; without them (x86-64 baseline, aarch64, ...) plain C does the same. */
#if defined(__AVX512F__) || defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

enum { FP32 = 0, FP16 = 1, INT8 = 2, INT4 = 3 };
enum { PREFETCH_DISTANCE = 64 }; /* ids: see prefetch_until */

/* The bag's sum is kept in vectors of the machine's width: 16 lanes with
 * AVX-512, 8 otherwise. A vector wider than the registers (64 bytes on AVX2)
 * makes GCC keep every partial sum on the stack, 2.3x slower per thread. */
#if defined(__AVX512F__)
#define LANES 16
#else
#define LANES 8
#endif
enum { MAX_VECTORS = 8 }; /* accumulators a pass over a bag's ids keeps in registers */
typedef float vec_t __attribute__((vector_size(4 * LANES), aligned(4)));

static inline float half_to_float(const uint8_t *bytes) {
    uint16_t h;
    memcpy(&h, bytes, sizeof h);
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
    if (exponent == 0) { /* zero or subnormal: mantissa * 2^-24, exact in float */
        const float magnitude = (float)mantissa * 5.9604644775390625e-08f;
        return sign ? -magnitude : magnitude;
    }
    const uint32_t bits = exponent == 31 ? sign | 0x7f800000u | (mantissa << 13)
                                         : sign | ((exponent + 112) << 23) | (mantissa << 13);
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
#endif
}

/* Value t of a row's payload as a float (the codes themselves for int8/int4). */
static inline float load1(const uint8_t *payload, int type, int64_t t) {
    switch (type) {
        case FP32: {
            float value;
            memcpy(&value, payload + 4 * t, sizeof value);
            return value;
        }
        case FP16: return half_to_float(payload + 2 * t);
        case INT8: return (float)payload[t];
        default: return (float)((payload[t >> 1] >> ((t & 1) * 4)) & 15);
    }
}

/* Values LANES*k .. LANES*k + LANES-1 of a row's payload, by type. */
#if defined(__AVX512F__)
static inline vec_t load_FP32(const uint8_t *p, int64_t k) { return *(const vec_t *)(p + 64 * k); }
static inline vec_t load_FP16(const uint8_t *p, int64_t k) {
    return (vec_t)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32 * k)));
}
static inline vec_t load_INT8(const uint8_t *p, int64_t k) {
    return (vec_t)_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + 16 * k))));
}
static inline vec_t load_INT4(const uint8_t *p, int64_t k) {
    const __m128i bytes = _mm_loadl_epi64((const __m128i *)(p + 8 * k)), low = _mm_set1_epi8(15);
    const __m128i codes = _mm_unpacklo_epi8(_mm_and_si128(bytes, low), _mm_and_si128(_mm_srli_epi16(bytes, 4), low));
    return (vec_t)_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(codes));
}
#elif defined(__AVX2__) && defined(__F16C__)
static inline vec_t load_FP32(const uint8_t *p, int64_t k) { return *(const vec_t *)(p + 32 * k); }
static inline vec_t load_FP16(const uint8_t *p, int64_t k) {
    return (vec_t)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16 * k)));
}
static inline vec_t load_INT8(const uint8_t *p, int64_t k) {
    return (vec_t)_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8 * k))));
}
static inline vec_t load_INT4(const uint8_t *p, int64_t k) {
    int32_t packed;
    memcpy(&packed, p + 4 * k, sizeof packed);
    const __m128i bytes = _mm_cvtsi32_si128(packed), low = _mm_set1_epi8(15);
    const __m128i codes = _mm_unpacklo_epi8(_mm_and_si128(bytes, low), _mm_and_si128(_mm_srli_epi16(bytes, 4), low));
    return (vec_t)_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(codes));
}
#else
#define LOAD(TYPE)                                                                                      \
    static inline vec_t load_##TYPE(const uint8_t *p, int64_t k) {                                      \
        vec_t out;                                                                                      \
        for (int lane = 0; lane < LANES; lane++) out[lane] = load1(p, TYPE, LANES * k + lane);          \
        return out;                                                                                     \
    }
LOAD(FP32)
LOAD(FP16)
LOAD(INT8)
LOAD(INT4)
#endif

/* The arguments of one reccompile_quant_pool call, shared by its threads. */
typedef struct {
    int64_t features, batch;
    const uint8_t *buffer;
    const int64_t *table_offsets, *strides, *types, *dims, *out_offsets;
    int64_t total_dim;
    const int64_t *ids;
    int64_t count;
    const int64_t *offsets;
    const float *weights;
    const int64_t *rows;
    float *out;
} pool_job_t;

typedef struct {
    const uint8_t *table;
    int64_t stride;
    const int64_t *ids;
    const float *weights;
} bag_source_t;

/* Rows are fetched ahead of their bag by a cursor over the ids, which runs on from one feature's
 * ids into the next's (ids are feature-major; each feature has its own table and stride), so no
 * feature starts on rows nobody prefetched. Before, each feature's kernel prefetched 16 ids ahead
 * within its own ids only: at batch 64 with one id a bag (inference-bench's int8 criteo), a quarter
 * of the rows were waited for, and 1,664 ids on tables colder than the cache took 73-147 us on one
 * thread of the 2-core Zen 4 against 44 us now (as long as on rows in cache). Rows go to L2, not
 * L1 (locality 2: prefetcht1): an fp32 pooling of 20 ids a bag at batch 512 took 5.6 ms on one
 * thread against 8.2 ms with L1 prefetches, likely because an L1 prefetch holds one of the core's
 * few L1 miss buffers until its line arrives. The cursor runs PREFETCH_DISTANCE ids past the end of
 * the bag about to be summed: at 20 ids a bag (multihot, batch 512, int8) 32 to 128 pooled in
 * 1.8-2.2 ms against 2.6-3.5 ms at 16, on the shared machine. */
typedef struct {
    const pool_job_t *job;
    int64_t feature, next, feature_end, limit;
    const uint8_t *table;
    int64_t stride;
} prefetcher_t;

static inline int64_t clamp_id(int64_t i, int64_t low, int64_t high) { return i < low ? low : i > high ? high : i; }

static void prefetcher_enter(prefetcher_t *p, int64_t feature) {
    const pool_job_t *job = p->job;
    p->feature = feature;
    p->table = job->buffer + job->table_offsets[feature];
    p->stride = job->strides[feature];
    /* offsets are checked per bag, not here: a bad one only bounds what is prefetched */
    p->feature_end = clamp_id(job->offsets[(feature + 1) * job->batch], p->next, p->limit);
}

/* Prefetch the rows of ids up to `target` (exclusive, at most the cursor's limit). */
static inline void prefetch_until(prefetcher_t *p, int64_t target) {
    if (target > p->limit) target = p->limit;
    while (p->next < target) {
        while (p->next >= p->feature_end) {
            if (p->feature + 1 >= p->job->features) {
                p->limit = p->next;
                return;
            }
            prefetcher_enter(p, p->feature + 1);
        }
        const uint8_t *row = p->table + p->job->ids[p->next] * p->stride;
        for (int64_t line = 0; line < p->stride; line += 64) __builtin_prefetch(row + line, 0, 2);
        __builtin_prefetch(row + p->stride - 1, 0, 2); /* a row may straddle one more line */
        p->next++;
    }
}

/* Columns [LANES*k0, LANES*(k0+NV)) of one bag of TYPE; CODES: rows start with a float16 scale
 * and bias. */
#define BAG(TYPE, NV, CODES)                                                                          \
    static void bag_##TYPE##_##NV(const bag_source_t *s, int64_t first, int64_t last, int64_t k0,       \
                                  float *out) {                                                        \
        vec_t acc[NV];                                                                                \
        for (int k = 0; k < NV; k++) acc[k] = (vec_t){0};                                             \
        for (int64_t i = first; i < last; i++) {                                                      \
            const uint8_t *row = s->table + s->ids[i] * s->stride;                                    \
            const float w = s->weights != NULL ? s->weights[i] : 1.0f;                                \
            const float scale = CODES ? w * half_to_float(row) : w;                                   \
            const float bias = CODES ? w * half_to_float(row + 2) : 0.0f;                             \
            for (int k = 0; k < NV; k++) {                                                            \
                if (CODES) acc[k] += bias;                                                            \
                acc[k] += scale * load_##TYPE(row + (CODES ? 4 : 0), k0 + k);                         \
            }                                                                                         \
        }                                                                                             \
        memcpy(out + LANES * k0, acc, sizeof acc);                                                    \
    }

#define WIDTHS(TYPE, CODES) \
    BAG(TYPE, 1, CODES) BAG(TYPE, 2, CODES) BAG(TYPE, 3, CODES) BAG(TYPE, 4, CODES) \
    BAG(TYPE, 5, CODES) BAG(TYPE, 6, CODES) BAG(TYPE, 7, CODES) BAG(TYPE, 8, CODES)
WIDTHS(FP32, 0)
WIDTHS(FP16, 0)
WIDTHS(INT8, 1)
WIDTHS(INT4, 1)

/* Columns [from, to) of one bag, one value at a time (a width's last, partial vector). */
static void bag_columns(const bag_source_t *s, int type, int64_t from, int64_t to, int64_t first, int64_t last,
                        float *out) {
    const int64_t header = type == INT8 || type == INT4 ? 4 : 0;
    for (int64_t t = from; t < to; t++) out[t] = 0.0f;
    for (int64_t i = first; i < last; i++) {
        const uint8_t *row = s->table + s->ids[i] * s->stride;
        const float w = s->weights != NULL ? s->weights[i] : 1.0f;
        const float scale = header ? w * half_to_float(row) : w, bias = header ? w * half_to_float(row + 2) : 0.0f;
        for (int64_t t = from; t < to; t++) {
            if (header) out[t] += bias;
            out[t] += scale * load1(row + header, type, t);
        }
    }
}

typedef void (*bag_fn)(const bag_source_t *, int64_t, int64_t, int64_t, float *);

/* The kernel for `vectors` (1 .. MAX_VECTORS) whole vectors of a row of `type`. */
static bag_fn bag_kernel(int type, int64_t vectors) {
#define PICK(TYPE)                                                                               \
    {                                                                                            \
        static const bag_fn kernels[MAX_VECTORS] = {bag_##TYPE##_1, bag_##TYPE##_2, bag_##TYPE##_3, \
                                                    bag_##TYPE##_4, bag_##TYPE##_5, bag_##TYPE##_6, \
                                                    bag_##TYPE##_7, bag_##TYPE##_8};                \
        return kernels[vectors - 1];                                                             \
    }
    switch (type) {
        case FP32: PICK(FP32)
        case FP16: PICK(FP16)
        case INT8: PICK(INT8)
        default: PICK(INT4)
    }
#undef PICK
}

/* One bag of any width: passes of up to MAX_VECTORS vectors (later ones find the rows in cache),
 * then the columns past the last whole vector. */
static void pool_bag(const bag_source_t *s, int type, int64_t d, int64_t first, int64_t last, float *out) {
    const int64_t vectors = d / LANES;
    for (int64_t k0 = 0; k0 < vectors; k0 += MAX_VECTORS) {
        const int64_t n = vectors - k0 < MAX_VECTORS ? vectors - k0 : MAX_VECTORS;
        bag_kernel(type, n)(s, first, last, k0, out);
    }
    if (vectors * LANES < d) bag_columns(s, type, vectors * LANES, d, first, last, out);
}

/* Bags [begin, end) of the feature-major order (bag = f * batch + b), walked
 * feature by feature so that a feature's table, kernel and prefetch bound are
 * set once, not per bag. Returns the status bits of reccompile_quant_pool. */
static int pool_range(const pool_job_t *job, int64_t begin, int64_t end) {
    int status = 0;
    const int64_t start = clamp_id(job->offsets[begin], 0, job->count);
    prefetcher_t ahead = {.job = job, .next = start, .limit = clamp_id(job->offsets[end], start, job->count)};
    prefetcher_enter(&ahead, begin / job->batch);
    for (int64_t f = begin / job->batch, bag = begin; bag < end; f++) {
        const int64_t next_feature = (f + 1) * job->batch, stop = next_feature < end ? next_feature : end;
        const int64_t type = job->types[f], d = job->dims[f], vectors = d / LANES;
        /* the common widths (whole vectors, at most MAX_VECTORS) take their kernel directly */
        const bag_fn whole = vectors >= 1 && vectors <= MAX_VECTORS && vectors * LANES == d ? bag_kernel((int)type, vectors)
                                                                                             : NULL;
        const bag_source_t source = {
            .table = job->buffer + job->table_offsets[f], .stride = job->strides[f], .ids = job->ids,
            .weights = job->weights,
        };
        float *out = job->out + job->out_offsets[f];
        for (; bag < stop; bag++) {
            const int64_t first = job->offsets[bag], last = job->offsets[bag + 1];
            if (first < 0 || last < first || last > job->count) {
                status |= 2;
                continue;
            }
            prefetch_until(&ahead, last + PREFETCH_DISTANCE);
            if (job->rows != NULL) {
                int64_t i = first;
                while (i < last && (uint64_t)job->ids[i] < (uint64_t)job->rows[f]) i++;
                if (i < last) {
                    status |= 1;
                    continue;
                }
            }
            float *row_out = out + (bag - f * job->batch) * job->total_dim;
            if (whole != NULL)
                whole(&source, first, last, 0, row_out);
            else
                pool_bag(&source, (int)type, d, first, last, row_out);
        }
    }
    return status;
}

/* Returns 0, or a bitmask: 1 an id out of its table's rows (when `rows` is
 * given; the bag is left unwritten), 2 offsets that do not fit the ids.
 * Each of `threads` threads pools one contiguous share of the bags. */
int reccompile_quant_pool(int64_t features, int64_t batch, const uint8_t *buffer, const int64_t *table_offsets,
                          const int64_t *strides, const int64_t *types, const int64_t *dims,
                          const int64_t *out_offsets, int64_t total_dim, const int64_t *ids, int64_t count,
                          const int64_t *offsets, const float *weights, const int64_t *rows, float *out,
                          int64_t threads) {
    const pool_job_t job = {
        .features = features, .batch = batch, .buffer = buffer, .table_offsets = table_offsets, .strides = strides, .types = types,
        .dims = dims, .out_offsets = out_offsets, .total_dim = total_dim, .ids = ids, .count = count,
        .offsets = offsets, .weights = weights, .rows = rows, .out = out,
    };
    const int64_t bags = features * batch;
    int status = 0;
    if (bags == 0) return 0; /* an empty batch: pool_range divides by the batch */
    if (threads < 1) threads = 1;
    if (threads > bags) threads = bags;
#pragma omp parallel num_threads((int)threads) reduction(| : status)
    {
        const int64_t team = omp_get_num_threads(), me = omp_get_thread_num();
        status |= pool_range(&job, bags * me / team, bags * (me + 1) / team);
    }
    return status;
}
