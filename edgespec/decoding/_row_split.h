/* A logits row read by two cores: the first half of its blocks here, the second by a helper thread; and a
 * model's decode run on the helper's core while the caller waits.
 *
 * Why: a row's pass (block maxima and Σ exp) costs ~50 µs right after a decode (~35 µs of it the exp, the
 * rest cache misses: the decode streamed the weights through the caches). Two cores halve it: 50 → 31 µs
 * per row in OPT-Tree's levels, 50 → 40 in a chain (this CPU). llama.cpp leaves a core idle when it runs on
 * fewer threads than the machine has (`--threads 1` on two cores; a GPU's host), and the compiled loops
 * are where the rows are read.
 *
 * The decode (row_helper_run): on one thread, llama.cpp computes on the calling thread, and streaming the
 * weights through that core's caches evicts what the caller was doing — the interpreter, the planner's
 * objects. Whatever Python runs after a CPU decode ran cold: a fixed bit of bookkeeping took ~110 µs after a
 * decode on its own core, ~65 µs after one on the other core, ~25 µs warm (2.6 GHz Xeon, issue 12). Run on
 * the helper's core, the decode streams the weights through that core's caches instead; the caller spins
 * (its caches keep its state) and the decode computes the same numbers (the same code, the same single
 * thread's order), so every result is the same, bit for bit.
 *
 * One helper per process, owned by decoding/_rows.c (ROW_HELPER_THREAD defined there) and shared with the
 * engine's modules through a capsule (row_helper_import in their init): a chain's call and the verify
 * call after it find the same thread. A compiled call arms it before its first decode and disarms it at
 * its end; the helper polls for tasks while armed and for ROW_HELPER_GRACE after, then sleeps — a thread
 * woken from sleep costs its waker ~45 µs on a VM, more than a chain's rows save, so between calls a few
 * hundred µs apart it spins, on a core that was idle.
 *
 * A task (a half, or a job: a function and its argument) is posted, taken (by the helper, or by the poster
 * itself when the helper stopped polling), done. One poster at a time (busy); any other caller, and any
 * caller while the helper sleeps, does the work itself. Same result either way, bit for bit: the row's Σ is
 * always the first half's plus the second's (the helper runs _rows.c's copy of blocks_pass: the same
 * source, flags and vector clone), and a job is the same call wherever it runs.
 * Include after blocks_pass is defined (_row_kernels.h does). */
#ifndef EDGESPEC_ROW_SPLIT_H
#define EDGESPEC_ROW_SPLIT_H

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

/* After a call the helper polls on this long (seconds): the next call, a few hundred µs of Python later,
 * finds it awake. */
#define ROW_HELPER_GRACE 0.002

enum { HALF_NONE, HALF_POSTED, HALF_TAKEN, HALF_DONE };

typedef struct {
    pthread_mutex_t lock; /* guards started, sleeping and the wake-up */
    pthread_cond_t wake;
    int started, sleeping;
    atomic_int armed;    /* compiled calls under way that want help */
    atomic_int spinning; /* the helper is polling */
    atomic_int busy;     /* a poster owns the half below */
    atomic_int state;    /* HALF_… */
    atomic_ulong halves; /* halves the helper has read (row_helper_halves(), for tests) */
    atomic_ulong jobs;   /* jobs the helper has run (row_helper_jobs(), for tests) */
    /* the posted task (written before HALF_POSTED, read after): a job (when `job` is set) or a half, and the
     * half's Σ (written before HALF_DONE) */
    void (*job)(void *);
    void *job_arg;
    const float *row;
    Py_ssize_t n;
    float *block_max;
    int want_sum;
    double sum;
    void (*arm)(void); /* arm it: start the thread the first time, wake it if it sleeps */
} RowHelper;

#define ROW_HELPER_CAPSULE "edgespec.decoding._rows.row_helper"

enum { TASK_NONE, TASK_HALF, TASK_JOB };

/* Take the posted task (helper or poster: whoever swaps POSTED → TAKEN) and do it; returns what it was. */
static int take_task(RowHelper *h)
{
    int posted = HALF_POSTED;
    if (!atomic_compare_exchange_strong(&h->state, &posted, HALF_TAKEN))
        return TASK_NONE;
    int task = h->job ? TASK_JOB : TASK_HALF;
    if (task == TASK_JOB)
        h->job(h->job_arg);
    else
        h->sum = blocks_pass(h->row, h->n, h->block_max, h->want_sum);
    atomic_store_explicit(&h->state, HALF_DONE, memory_order_release);
    return task;
}

#ifdef ROW_HELPER_THREAD
static void row_helper_arm_owned(void);
static RowHelper row_helper_state = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
                                     .arm = row_helper_arm_owned};
static RowHelper *row_helper = &row_helper_state;

static double row_helper_clock(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void *row_helper_main(void *unused)
{
    (void)unused;
    RowHelper *h = row_helper;
    for (;;) {
        pthread_mutex_lock(&h->lock);
        while (atomic_load(&h->armed) <= 0) {
            h->sleeping = 1;
            pthread_cond_wait(&h->wake, &h->lock);
        }
        h->sleeping = 0;
        pthread_mutex_unlock(&h->lock);
        atomic_store(&h->spinning, 1);
        double idle_since = 0.0; /* when the last call ended */
        for (;;) {
            int task = atomic_load_explicit(&h->state, memory_order_acquire) == HALF_POSTED ? take_task(h) : TASK_NONE;
            if (task != TASK_NONE) {
                atomic_fetch_add(task == TASK_JOB ? &h->jobs : &h->halves, 1);
            } else if (atomic_load(&h->armed) > 0) {
                idle_since = 0.0;
            } else if (idle_since == 0.0) {
                idle_since = row_helper_clock();
            } else if (row_helper_clock() - idle_since > ROW_HELPER_GRACE) {
                break;
            }
            cpu_relax();
        }
        atomic_store(&h->spinning, 0); /* a task posted now is done by its poster */
    }
    return NULL;
}

/* A forked child has no helper thread: start afresh. */
static void row_helper_forget(void)
{
    RowHelper *h = row_helper;
    pthread_mutex_init(&h->lock, NULL);
    pthread_cond_init(&h->wake, NULL);
    h->started = h->sleeping = 0;
    atomic_store(&h->armed, 0);
    atomic_store(&h->spinning, 0);
    atomic_store(&h->busy, 0);
    atomic_store(&h->state, HALF_NONE);
    h->job = NULL;
}

static void row_helper_arm_owned(void)
{
    RowHelper *h = row_helper;
    pthread_mutex_lock(&h->lock);
    if (!h->started) {
        pthread_t thread;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        h->started = pthread_create(&thread, &attr, row_helper_main, NULL) == 0;
        pthread_attr_destroy(&attr);
        if (h->started)
            pthread_atfork(NULL, NULL, row_helper_forget);
    }
    atomic_fetch_add(&h->armed, 1);
    if (h->sleeping)
        pthread_cond_signal(&h->wake);
    pthread_mutex_unlock(&h->lock);
}
#else
static RowHelper *row_helper; /* _rows.c's, set by row_helper_import */

/* In a module's init: the shared helper (importing edgespec.decoding._rows). -1 with an error set. */
static int row_helper_import(void)
{
    PyObject *rows = PyImport_ImportModule("edgespec.decoding._rows"); /* PyCapsule_Import only getattrs */
    if (!rows)
        return -1;
    Py_DECREF(rows);
    row_helper = PyCapsule_Import(ROW_HELPER_CAPSULE, 0);
    return row_helper ? 0 : -1;
}
#endif

/* A call that wants help (`wanted`) has it from here (call with the GIL released) … */
static inline void row_helper_arm(int wanted)
{
    if (wanted)
        row_helper->arm();
}

/* … to here, with the same `wanted`; the helper sleeps after its grace unless another call armed it. */
static inline void row_helper_disarm(int wanted)
{
    if (wanted)
        atomic_fetch_sub(&row_helper->armed, 1);
}

/* One read of a row (n ≥ 1 logits): block maxima and, when want_sum, Σ exp(l) — blocks_pass over the
 * first half of the blocks plus blocks_pass over the rest (the short last block with them), the second
 * half on the helper when it is polling and free. */
static double row_pass(const float *row, Py_ssize_t n, float *block_max, int want_sum)
{
    Py_ssize_t half = (n + BLOCK - 1) / BLOCK / 2 * BLOCK; /* whole blocks: the maxima stay per block */
    Py_ssize_t rest = n - half;
    RowHelper *h = row_helper;
    if (half == 0)
        return blocks_pass(row, n, block_max, want_sum);
    if (!h || !atomic_load(&h->spinning) || atomic_exchange(&h->busy, 1))
        return blocks_pass(row, half, block_max, want_sum) +
               blocks_pass(row + half, rest, block_max + half / BLOCK, want_sum);
    h->job = NULL, h->row = row + half, h->n = rest, h->block_max = block_max + half / BLOCK;
    h->want_sum = want_sum;
    atomic_store_explicit(&h->state, HALF_POSTED, memory_order_release);
    double first = blocks_pass(row, half, block_max, want_sum);
    /* wait for the helper's half; if it stopped polling before taking it, read it here */
    while (atomic_load_explicit(&h->state, memory_order_acquire) != HALF_DONE)
        if (atomic_load(&h->spinning) || !take_task(h))
            cpu_relax();
    double second = h->sum;
    atomic_store(&h->state, HALF_NONE);
    atomic_store(&h->busy, 0);
    return first + second;
}

/* job(arg) on the helper's core when the helper is polling and free, the caller spinning until it is done
 * (its caches keep what it was doing); here otherwise. Call with the GIL released. */
static inline void row_helper_run(void (*job)(void *), void *arg)
{
    RowHelper *h = row_helper;
    if (!h || !atomic_load(&h->spinning) || atomic_exchange(&h->busy, 1)) {
        job(arg);
        return;
    }
    h->job = job, h->job_arg = arg;
    atomic_store_explicit(&h->state, HALF_POSTED, memory_order_release);
    while (atomic_load_explicit(&h->state, memory_order_acquire) != HALF_DONE)
        if (atomic_load(&h->spinning) || !take_task(h))
            cpu_relax();
    atomic_store(&h->state, HALF_NONE);
    atomic_store(&h->busy, 0);
}

#endif
