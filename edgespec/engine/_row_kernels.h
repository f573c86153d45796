/* Logits rows reduced in one compiled pass: the draft's top-k with full-softmax probabilities, and the
 * target's argmax with its top-1 − top-2 margin.
 *
 * Why C: after each CPU decode the interpreter runs cold (the decode streamed the model's weights
 * through the caches), and the numpy version of these reductions was ten calls per row, each paying
 * that. Here a row is one call, read once for its block maxima (and, at T = 1, Σ exp(l) in the same
 * pass), with an exp that the compiler vectorises.
 *
 * Exactness (pinned by tests/test_sampling.py against a float64 full-vocabulary softmax):
 *   - ids: the top k by logit, descending, equal logits by id ascending — np.argsort(-row, "stable").
 *   - probabilities: p_i = exp((l_i − m)/T − log Z) in double; Z = Σ_v exp((l_v − m)/T) summed in
 *     double from float32 terms, each within 2 ulps of exp (vexp below) and added eight at a time in
 *     float32 first, so every p_i is within ≈ 7e-7 of the float64 softmax (3e-7 at T = 1; the argument
 *     bound is in log_normaliser).
 *
 * Optional: where this does not compile (no C compiler, a compiler without GCC's vector extensions), the
 * package installs without it and engine/rows.py computes the same ids in numpy.
 * Include <Python.h> first (Py_ssize_t). */
#ifndef EDGESPEC_ROW_KERNELS_H
#define EDGESPEC_ROW_KERNELS_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>


#define BLOCK 64 /* logits per block: a row of 152k has 2374 block maxima */

/* A row is read ahead of its pass, 8 KB on: right after a decode the row is in another core's cache or
 * in L3, and the loads alone keep too few reads in flight (2.6 GHz Xeon, OPT-Tree's levels: a half row's
 * pass 37 → 23 µs, a verified row's max-only half 27 → 22 µs). Prefetches past the row's end are
 * harmless: they never fault. */
#define PREFETCH_AHEAD 2048

/* The loops work on 16 floats at a time (GCC/Clang vector extensions: one AVX-512 register, two AVX2
 * ones, four SSE2 ones). One build serves every x86-64 CPU: the kernels are compiled for SSE2, AVX2
 * and AVX-512 and the loader picks the best the CPU has (target_clones, an ifunc). */
#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__) && !defined(__clang__)
#define VECTOR_CLONES __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#else
#define VECTOR_CLONES
#endif
#define LANES 16
typedef float f32v __attribute__((vector_size(4 * LANES)));
typedef int32_t i32v __attribute__((vector_size(4 * LANES)));
typedef float f32h __attribute__((vector_size(2 * LANES))); /* half: 8 floats, widened to 8 doubles */
typedef double f64h __attribute__((vector_size(4 * LANES)));

static inline f32v load(const float *x)
{
    f32v v;
    memcpy(&v, x, sizeof v);
    return v;
}

/* The first `count` (< LANES) floats at x, the other lanes -inf. */
static inline f32v load_part(const float *x, Py_ssize_t count)
{
    float lane[LANES];
    for (int l = 0; l < LANES; l++)
        lane[l] = l < count ? x[l] : -INFINITY;
    return load(lane);
}

static inline f32v pick(i32v mask, f32v yes, f32v no) { return (f32v)((mask & (i32v)yes) | (~mask & (i32v)no)); }
static inline f32v vmax(f32v a, f32v b) { return pick(a > b, a, b); }

/* The largest of the 16 lanes: four halvings (lane i against lane i + 8, + 4, + 2, + 1). */
static inline float hmax(f32v v)
{
#if defined(__has_builtin) && __has_builtin(__builtin_shufflevector)
    v = vmax(v, __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7));
    v = vmax(v, __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3));
    v = vmax(v, __builtin_shufflevector(v, v, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1));
    v = vmax(v, __builtin_shufflevector(v, v, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0));
    return v[0];
#else
    float m = v[0];
    for (int l = 1; l < LANES; l++)
        m = v[l] > m ? v[l] : m;
    return m;
#endif
}

/* exp(x) in float32, 16 at a time (Cephes' expf without branches). x = n·ln2 + r with n = round(x/ln2)
 * and |r| ≤ ln2/2 (ln2 in two parts, the first exact in n·C1), e^r by a degree-7 polynomial, 2^n put into
 * the exponent bits. Measured ≤ 1.01 ulps against exp in double over 17.5 M arguments in [−87, 88]
 * (each of the three builds; the bounds below count 2). x is clamped below at −87, so terms below
 * e^−87 ≈ 1.6e-38 count as that (V of them add < 3e-33 to a Z ≥ 1e-22), and -inf lanes too; callers
 * never pass x > 88 (an upper clamp cost 10 % of a row's pass). */
static inline f32v vexp(f32v x)
{
    const f32v zero = {0}, low = zero - 87.0f, round = zero + 12582912.0f;
    x = pick(x < low, low, x);
    f32v n = (x * 1.44269504088896341f + round) - round; /* 1.5·2^23 pushes the fraction out: rint */
    f32v r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    f32v p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    i32v two_to_n = (__builtin_convertvector(n, i32v) + 127) << 23; /* 2^n, n ∈ [−126, 127] */
    return p * (f32v)two_to_n;
}

/* Σ of 16 float32 terms, added to two double accumulators (the terms widened exactly). Widening
 * costs more than the exp, so callers first add 8 vectors of terms pairwise in float32 (a tree of depth
 * 3: each positive term picks up ≤ 3 roundings, 1.8e-7 relative); see fold8. */
static inline void accumulate(f64h *sum, f32v terms)
{
    f32h half[2];
    memcpy(half, &terms, sizeof half);
    sum[0] += __builtin_convertvector(half[0], f64h);
    sum[1] += __builtin_convertvector(half[1], f64h);
}

/* Σ of four vectors of terms in float32, pairwise; every other call's result waits in *pending and
 * goes into the double sum with the next one's: ((a+b)+(c+d)) + ((e+f)+(g+h)), depth 3. */
static inline void fold8(f64h *sum, f32v *pending, int *waiting, f32v a, f32v b, f32v c, f32v d)
{
    f32v four = (a + b) + (c + d);
    if (*waiting)
        accumulate(sum, *pending + four);
    else
        *pending = four;
    *waiting = !*waiting;
}

static inline void fold8_end(f64h *sum, f32v pending, int waiting)
{
    if (waiting)
        accumulate(sum, pending);
}

static inline double total(const f64h *sum)
{
    double lane[LANES / 2], t = 0.0;
    f64h both = sum[0] + sum[1];
    memcpy(lane, &both, sizeof lane);
    for (int l = 0; l < LANES / 2; l++)
        t += lane[l];
    return t;
}

/* The peak m is in this range at T = 1 → Z' = Σ exp(l) = e^m·Z is taken without shifting: no term
 * overflows (e^80 < 3.4e38) and Z' ≥ e^m ≥ e^-50 stays far above the clamped terms. */
#define EXACT_EXP_LOW -50.0
#define EXACT_EXP_HIGH 80.0

/* One read of a run of logits (n ≥ 1; a row, or a part of one that starts at a block): the max of each
 * block of BLOCK (the last block may be short), and, when want_sum, Σ_v exp(l_v) (unshifted; a block whose
 * max is above EXACT_EXP_HIGH stops the sum, and log_normaliser, seeing that peak, shifts instead). */
static VECTOR_CLONES double blocks_pass(const float *row, Py_ssize_t n, float *block_max, int want_sum)
{
    f64h sum[2] = {{0}, {0}};
    f32v pending = {0};
    int waiting = 0;
    Py_ssize_t b = 0;
    for (; (b + 1) * BLOCK <= n; b++) {
        const float *x = row + b * BLOCK;
        for (int line = 0; line < BLOCK; line += 16) /* the block's four cache lines, 8 KB ahead */
            __builtin_prefetch((const void *)((uintptr_t)x + sizeof *x * (PREFETCH_AHEAD + line)), 0, 3);
        f32v v0 = load(x), v1 = load(x + LANES), v2 = load(x + 2 * LANES), v3 = load(x + 3 * LANES);
        block_max[b] = hmax(vmax(vmax(v0, v1), vmax(v2, v3)));
        want_sum = want_sum && block_max[b] <= EXACT_EXP_HIGH;
        if (want_sum)
            fold8(sum, &pending, &waiting, vexp(v0), vexp(v1), vexp(v2), vexp(v3));
    }
    fold8_end(sum, pending, waiting);
    if (b * BLOCK < n) { /* the short last block, 16 at a time, the missing lanes -inf */
        f32v m = (f32v){0} - INFINITY;
        for (Py_ssize_t j = b * BLOCK; j < n; j += LANES) {
            f32v v = n - j >= LANES ? load(row + j) : load_part(row + j, n - j);
            m = vmax(m, v);
            want_sum = want_sum && hmax(v) <= EXACT_EXP_HIGH; /* as above: past the range, no sum */
            if (want_sum) /* -inf lanes: exp clamps them to e^-87: zero them */
                accumulate(sum, pick(v > -INFINITY, vexp(v), (f32v){0}));
        }
        block_max[b] = hmax(m);
    }
    return total(sum);
}


/* Σ_v exp(d_v), d_v = (l_v − m)·(1/T) in float32 (≤ 0): the normaliser when exp(l) itself would not do. */
static VECTOR_CLONES double shifted_sum(const float *row, Py_ssize_t n, float peak, float inverse_t)
{
    f64h sum[2] = {{0}, {0}};
    f32v pending = {0};
    int waiting = 0;
    Py_ssize_t j = 0;
    for (; j + 4 * LANES <= n; j += 4 * LANES) {
        const float *x = row + j;
        fold8(sum, &pending, &waiting, vexp((load(x) - peak) * inverse_t),
              vexp((load(x + LANES) - peak) * inverse_t), vexp((load(x + 2 * LANES) - peak) * inverse_t),
              vexp((load(x + 3 * LANES) - peak) * inverse_t));
    }
    fold8_end(sum, pending, waiting);
    for (; j < n; j += LANES) {
        f32v v = n - j >= LANES ? load(row + j) : load_part(row + j, n - j);
        accumulate(sum, pick(v > -INFINITY, vexp((v - peak) * inverse_t), (f32v){0}));
    }
    return total(sum);
}

/* log Z, Z = Σ_v exp((l_v − m)/T). Each float32 term carries vexp's ≤ 2 ulps (1.2e-7 relative) and,
 * when shifted, the rounding of its argument d (≤ 2 ulps of d: 1.2e-7·d relative), and ≤ 3 roundings of
 * the float32 fold (1.8e-7) before the double sum. So Z is within 3e-7 + 1.2e-7·E_p[d] relative, where
 * E_p[d] ≤ log V (the entropy bound): a candidate's p_i moves by p_i times that, and since
 * p_max·E_p[d] ≤ 3 for V = 152k every probability stays within ≈ 7e-7 of the float64 softmax (3e-7 at
 * T = 1, where nothing is shifted). */
static double log_normaliser(const float *row, Py_ssize_t n, double peak, double temperature,
                             double unshifted_sum)
{
    if (temperature == 1.0 && peak >= EXACT_EXP_LOW && peak <= EXACT_EXP_HIGH)
        return log(unshifted_sum) - peak;
    return log(shifted_sum(row, n, (float)peak, (float)(1.0 / temperature)));
}

typedef struct {
    float logit;
    int32_t id;
} Candidate;

/* Floats of scratch row_top_k needs for rows of n logits: the block maxima, then room for the pool
 * (k + |banned|) best candidates. */
static inline Py_ssize_t row_scratch_floats(Py_ssize_t n, Py_ssize_t k, Py_ssize_t n_banned)
{
    return (n + BLOCK - 1) / BLOCK + 2 * (k + n_banned) * (Py_ssize_t)(sizeof(Candidate) / sizeof(float));
}

/* How many block maxima are ≥ t (a loop the compiler vectorises). */
static VECTOR_CLONES Py_ssize_t blocks_at_least(const float *block_max, Py_ssize_t n_blocks, float t)
{
    Py_ssize_t count = 0;
    for (Py_ssize_t b = 0; b < n_blocks; b++)
        count += block_max[b] >= t;
    return count;
}

/* A floor f for the row's top `pool` logits: every one of them is ≥ f. Any f with at least `pool` block
 * maxima ≥ f will do — those are `pool` distinct logits ≥ f, so the pool-th largest logit is ≥ f. Found by
 * bisection between the peak and a span below it (widened until enough blocks pass), tightened while more
 * than twice `pool` blocks pass: a handful of counts over the block maxima, and few candidates after. */
static float top_floor(const float *block_max, Py_ssize_t n_blocks, Py_ssize_t pool, float peak)
{
    if (pool >= n_blocks || !isfinite(peak))
        return -INFINITY;
    float span = 8.0f, low = peak - span, high = peak;
    Py_ssize_t at_low;
    while ((at_low = blocks_at_least(block_max, n_blocks, low)) < pool) {
        if (span > 1e30f)
            return -INFINITY;
        high = low, span *= 2.0f, low = peak - span;
    }
    for (int i = 0; i < 8 && at_low > 2 * pool; i++) {
        float middle = low + (high - low) * 0.5f;
        Py_ssize_t at_middle = blocks_at_least(block_max, n_blocks, middle);
        if (at_middle >= pool)
            low = middle, at_low = at_middle;
        else
            high = middle;
    }
    return low;
}

/* `candidate` into best (n of them, at most `pool`, in order: logit descending, equal logits by id
 * ascending); candidates come in ascending id order, so an equal logit goes after those already there. */
static inline void keep_candidate(Candidate *best, Py_ssize_t *n, Py_ssize_t pool, Candidate candidate)
{
    if (*n == pool && !(candidate.logit > best[pool - 1].logit))
        return;
    Py_ssize_t at = *n < pool ? (*n)++ : pool - 1;
    while (at > 0 && candidate.logit > best[at - 1].logit) {
        best[at] = best[at - 1];
        at--;
    }
    best[at] = candidate;
}

static int by_int32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* The top k allowed ids of one row (n logits) into ids/probs; returns how many (k unless the row has
 * fewer allowed ids). banned: ascending, unique. scratch: row_scratch_floats(n, k, n_banned) floats. */
static inline Py_ssize_t row_top_k(const float *row, Py_ssize_t n, Py_ssize_t k, double temperature,
                                   const int32_t *banned, Py_ssize_t n_banned, float *scratch, int32_t *ids,
                                   double *probs)
{
    Py_ssize_t n_blocks = (n + BLOCK - 1) / BLOCK;
    Py_ssize_t pool = k + n_banned < n ? k + n_banned : n; /* the top k + |banned| hold the top k allowed */
    float *block_max = scratch;
    Candidate *best = (Candidate *)(scratch + n_blocks);
    double unshifted_sum = blocks_pass(row, n, block_max, temperature == 1.0);
    float peak = block_max[0];
    for (Py_ssize_t b = 1; b < n_blocks; b++)
        peak = block_max[b] > peak ? block_max[b] : peak;

    /* the top pool, in order, from the logits ≥ f: they lie only in the blocks whose max is ≥ f */
    float floor = top_floor(block_max, n_blocks, pool, peak);
    Py_ssize_t n_best = 0;
    for (Py_ssize_t b = 0; b < n_blocks; b++)
        if (block_max[b] >= floor)
            for (Py_ssize_t v = b * BLOCK; v < n && v < (b + 1) * BLOCK; v++)
                if (row[v] >= floor)
                    keep_candidate(best, &n_best, pool, (Candidate){row[v], (int32_t)v});

    // p_i = exp((l_i − m)/T − log Z), in double.
    double log_z = log_normaliser(row, n, peak, temperature, unshifted_sum);
    Py_ssize_t taken = 0;
    for (Py_ssize_t c = 0; c < n_best && taken < k; c++) {
        int32_t id = best[c].id;
        if (n_banned && bsearch(&id, banned, n_banned, sizeof id, by_int32))
            continue;
        ids[taken] = id;
        probs[taken] = exp(((double)best[c].logit - peak) / temperature - log_z);
        taken++;
    }
    return taken;
}

/* One read of a row: its first maximum (np.argmax's choice) and top-1 − top-2 (0 when the top is shared). */
static inline void row_argmax_margin(const float *row, Py_ssize_t n, float *block_max, Py_ssize_t *best,
                                     double *margin)
{
    Py_ssize_t n_blocks = (n + BLOCK - 1) / BLOCK;
    blocks_pass(row, n, block_max, 0);
    Py_ssize_t top_block = 0;
    for (Py_ssize_t b = 1; b < n_blocks; b++)
        if (block_max[b] > block_max[top_block])
            top_block = b;
    float top = block_max[top_block], second = -INFINITY;
    for (Py_ssize_t b = 0; b < n_blocks; b++) /* the runner-up outside the top block */
        if (b != top_block && block_max[b] > second)
            second = block_max[b];
    Py_ssize_t end = (top_block + 1) * BLOCK < n ? (top_block + 1) * BLOCK : n;
    *best = -1;
    for (Py_ssize_t v = top_block * BLOCK; v < end; v++) {
        if (*best < 0 && row[v] == top)
            *best = v;
        else if (row[v] > second)
            second = row[v];
    }
    *margin = (double)(top - second); /* float32, as numpy subtracts two float32 logits */
}

#endif
