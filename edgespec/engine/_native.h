/* What the engine's compiled loops (_chain.c, _dyspec.c, _opt_tree.c, _verify.c) share: llama.cpp's ABI as
 * the pinned llama-cpp-python (0.3.36) declares it, the functions bound at run time, and small helpers.
 *
 * llama.cpp is not linked: engine/_backend.py passes the addresses of llama_decode, llama_synchronize,
 * llama_get_logits_ith and llama_memory_seq_cp from llama-cpp-python's loaded library to each module's
 * bind(). tests/test_chain_native.py compares struct llama_batch below with the ctypes one.
 * Each loop's last argument, `helper` (optional, false by default), arms the row helper for the call: rows
 * read on two cores (decoding/_row_split.h; the same results).
 * Include <Python.h> first. */
#ifndef EDGESPEC_NATIVE_H
#define EDGESPEC_NATIVE_H

#include <stdint.h>
#include <stdlib.h>
#include <time.h>

typedef struct llama_batch {
    int32_t n_tokens;
    int32_t *token;
    float *embd;
    int32_t *pos;
    int32_t *n_seq_id;
    int32_t **seq_id;
    int8_t *logits;
} llama_batch;

typedef int32_t (*decode_fn)(void *ctx, llama_batch batch);
typedef void (*synchronize_fn)(void *ctx);
typedef float *(*logits_ith_fn)(void *ctx, int32_t i);
typedef void (*seq_cp_fn)(void *memory, int32_t src, int32_t dst, int32_t p0, int32_t p1);

static decode_fn llama_decode = NULL;
static synchronize_fn llama_synchronize = NULL;
static logits_ith_fn llama_get_logits_ith = NULL;
static seq_cp_fn llama_memory_seq_cp = NULL;

static PyObject *bind(PyObject *self, PyObject *args)
{
    unsigned long long decode, synchronize, logits_ith, seq_cp;
    if (!PyArg_ParseTuple(args, "KKKK", &decode, &synchronize, &logits_ith, &seq_cp))
        return NULL;
    if (!decode || !synchronize || !logits_ith || !seq_cp) {
        PyErr_SetString(PyExc_ValueError, "bind() needs four function addresses");
        return NULL;
    }
    llama_decode = (decode_fn)(uintptr_t)decode;
    llama_synchronize = (synchronize_fn)(uintptr_t)synchronize;
    llama_get_logits_ith = (logits_ith_fn)(uintptr_t)logits_ith;
    llama_memory_seq_cp = (seq_cp_fn)(uintptr_t)seq_cp;
    Py_RETURN_NONE;
}

#define BIND_DOC "bind(llama_decode, llama_synchronize, llama_get_logits_ith, llama_memory_seq_cp addresses)"

/* A sequence of ints as a malloc'd int32 array (*n its length); NULL with an error set on failure. */
static inline int32_t *int32_array(PyObject *obj, const char *what, Py_ssize_t *n)
{
    PyObject *fast = PySequence_Fast(obj, what);
    if (!fast)
        return NULL;
    *n = PySequence_Fast_GET_SIZE(fast);
    int32_t *out = malloc((*n ? *n : 1) * sizeof *out);
    if (!out) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < *n; i++) {
        long value = PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, i));
        if ((value == -1 && PyErr_Occurred()) || value < INT32_MIN || value > INT32_MAX) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_OverflowError, "%s: %ld does not fit in int32", what, value);
            free(out);
            Py_DECREF(fast);
            return NULL;
        }
        out[i] = (int32_t)value;
    }
    Py_DECREF(fast);
    return out;
}

/* A sequence of floats as a malloc'd double array (*n its length); NULL with an error set on failure. */
static inline double *double_array(PyObject *obj, const char *what, Py_ssize_t *n)
{
    PyObject *fast = PySequence_Fast(obj, what);
    if (!fast)
        return NULL;
    *n = PySequence_Fast_GET_SIZE(fast);
    double *out = malloc((*n ? *n : 1) * sizeof *out);
    if (!out) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < *n; i++) {
        out[i] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(fast, i));
        if (out[i] == -1.0 && PyErr_Occurred()) {
            free(out);
            Py_DECREF(fast);
            return NULL;
        }
    }
    Py_DECREF(fast);
    return out;
}

/* Lists of n ints and of n floats for a call's result (NULL with an error set on failure). */
static inline PyObject *int32_list(const int32_t *values, Py_ssize_t n)
{
    PyObject *list = PyList_New(n);
    for (Py_ssize_t i = 0; list && i < n; i++) {
        PyObject *value = PyLong_FromLong(values[i]);
        if (!value)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, i, value);
    }
    return list;
}

static inline PyObject *double_list(const double *values, Py_ssize_t n)
{
    PyObject *list = PyList_New(n);
    for (Py_ssize_t i = 0; list && i < n; i++) {
        PyObject *value = PyFloat_FromDouble(values[i]);
        if (!value)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, i, value);
    }
    return list;
}

static double seconds_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct {
    void *ctx;
    const llama_batch *batch;
    int32_t rc;
} DecodeJob;

static void run_decode(void *arg)
{
    DecodeJob *job = arg;
    job->rc = llama_decode(job->ctx, *job->batch);
    llama_synchronize(job->ctx);
}

/* One llama_decode of the batch and the wait for it (a GPU backend computes asynchronously: the wait is
 * decode time), added to *seconds; on the row helper's core when it is polling (an armed call: the caller's
 * caches keep its state, _row_split.h), else here. Returns llama_decode's code. */
static int32_t timed_decode(void *ctx, const llama_batch *batch, double *seconds)
{
    double start = seconds_now();
    DecodeJob job = {ctx, batch, 0};
    row_helper_run(run_decode, &job);
    *seconds += seconds_now() - start;
    return job.rc;
}

/* NULL when seq_counts (n of them, each 1 … n_seq_max) take exactly the n_ids ids of seq_ids, token after
 * token, each id in 0 … n_seq_max − 1; else what is wrong. */
static inline const char *seq_ids_problem(const int32_t *counts, Py_ssize_t n, const int32_t *ids, Py_ssize_t n_ids,
                                          Py_ssize_t n_seq_max)
{
    Py_ssize_t offset = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (counts[i] < 1 || counts[i] > n_seq_max || offset + counts[i] > n_ids)
            return "seq_counts out of range (1 to n_seq_max each, seq_ids as many)";
        for (Py_ssize_t j = 0; j < counts[i]; j++)
            if (ids[offset + j] < 0 || ids[offset + j] >= n_seq_max)
                return "a sequence id outside 0 … n_seq_max − 1";
        offset += counts[i];
    }
    return offset == n_ids ? NULL : "seq_ids has more ids than seq_counts adds up to";
}

/* Put n tokens in the batch: token i at positions[i] in the counts[i] ids that follow in ids (token after
 * token; checked by seq_ids_problem), its row asked for from token first_row on. */
static inline void fill_batch(llama_batch *batch, const int32_t *tokens, const int32_t *positions,
                              const int32_t *counts, const int32_t *ids, Py_ssize_t n, Py_ssize_t first_row)
{
    for (Py_ssize_t i = 0, offset = 0; i < n; offset += counts[i], i++) {
        batch->token[i] = tokens[i];
        batch->pos[i] = positions[i];
        batch->n_seq_id[i] = counts[i];
        memcpy(batch->seq_id[i], ids + offset, counts[i] * sizeof *ids);
        batch->logits[i] = i >= first_row;
    }
    batch->n_tokens = (int32_t)n;
}

/* Put the first tokens of a drafting call in the batch: at first_position, first_position + 1, …, each in
 * every id of seq_ids, the last one's row asked for. */
static inline void fill_first(llama_batch *batch, const int32_t *tokens, Py_ssize_t n, int32_t first_position,
                              const int32_t *seq_ids, Py_ssize_t n_ids)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        batch->token[i] = tokens[i];
        batch->pos[i] = first_position + (int32_t)i;
        batch->n_seq_id[i] = (int32_t)n_ids;
        memcpy(batch->seq_id[i], seq_ids, n_ids * sizeof *seq_ids);
        batch->logits[i] = i == n - 1;
    }
    batch->n_tokens = (int32_t)n;
}

#endif
