/* One draft level in one call: the level's tokens into the batch, the draft's decode, and each asked row
 * reduced to the draft's top-k with full-softmax probabilities (the kernel of ``draft_dists``,
 * decoding/_row_kernels.h) — no Python between the decode and the level's distributions.
 *
 * Why: the planners that grow their tree in Python (TSD, GSD, MCSD, auto, the copiers) expand it a level per
 * ``Drafter.expand``. On the Python path each level paid, besides reading its rows, the batch fill (ctypes
 * stores per node and sequence id), the logits view and draft_dists' array set-up, all run cold right after
 * the draft's decode: ~0.2 ms a level on a 2.6 GHz Xeon (issue 12).
 *
 * The reference is ``Context.decode`` + ``logits_rows`` + ``draft_dists``: the same batch, the same decode,
 * the same kernel on the same rows, so the same ids and the same probabilities, bit for bit.
 *
 * llama.cpp is not linked: its functions are bound at run time (_native.h). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "../decoding/_row_kernels.h"
#include "_native.h"

typedef struct {
    Py_ssize_t n, n_rows, k, vocab_limit, n_banned;
    double temperature;
    const int32_t *banned;
    int32_t *ids;    /* out: n_rows × k */
    double *probs;   /* out: n_rows × k */
    Py_ssize_t *found; /* out: per row, how many of its k are valid */
    double seconds;
    int rc; /* llama_decode's code, or -1: out of memory, -2: no logits row */
} Level;

/* The decode and the rows, GIL released: the batch already holds the level; its last n_rows tokens' rows. */
static void decode_and_reduce(void *ctx, llama_batch *batch, Level *l)
{
    float *scratch = malloc(row_scratch_floats(l->vocab_limit, l->k, l->n_banned) * sizeof *scratch);
    if (!scratch) {
        l->rc = -1;
        return;
    }
    l->rc = timed_decode(ctx, batch, &l->seconds);
    for (Py_ssize_t r = 0; l->rc == 0 && r < l->n_rows; r++) {
        const float *row = llama_get_logits_ith(ctx, (int32_t)(l->n - l->n_rows + r));
        if (!row) {
            l->rc = -2;
            break;
        }
        l->found[r] = row_top_k(row, l->vocab_limit, l->k, l->temperature, l->banned, l->n_banned, scratch,
                                l->ids + r * l->k, l->probs + r * l->k);
    }
    free(scratch);
}

/* decode_top_k(ctx, batch, n_batch, n_seq_max, n_vocab, tokens, positions, seq_counts, seq_ids, n_rows, k,
 *              temperature, vocab_limit, banned[, helper]) -> (rc, seconds, ids, probs, found)
 *
 * The batch: token i at positions[i] in the seq_counts[i] sequence ids that follow in seq_ids (token after
 * token); the rows of the last n_rows tokens asked for. Each such row's top k ids below vocab_limit and not
 * in banned (ascending, unique) with their probabilities under the softmax at `temperature`: ids (int32) and
 * probs (float64) as bytes, k per row, found[r] of row r valid. rc ≠ 0: see Level; nothing else is valid. */
static PyObject *decode_top_k(PyObject *self, PyObject *args)
{
    unsigned long long ctx_address, batch_address;
    Py_ssize_t n_batch, n_seq_max, n_vocab, n_rows, k, vocab_limit;
    double temperature;
    int helper = 0;
    PyObject *objects[5];
    if (!PyArg_ParseTuple(args, "KKnnnOOOOnndnO|p", &ctx_address, &batch_address, &n_batch, &n_seq_max, &n_vocab,
                          &objects[0], &objects[1], &objects[2], &objects[3], &n_rows, &k, &temperature,
                          &vocab_limit, &objects[4], &helper))
        return NULL;
    static const char *names[5] = {"tokens", "positions", "seq_counts", "seq_ids", "banned"};
    int32_t *columns[5] = {NULL};
    Py_ssize_t lengths[5];
    int converted = 0;
    while (converted < 5 && (columns[converted] = int32_array(objects[converted], names[converted],
                                                              &lengths[converted])) != NULL)
        converted++;
    PyObject *result = NULL;
    Level l = {0};
    if (converted < 5)
        goto out;
    Py_ssize_t n = lengths[0], n_ids = lengths[3];
    const int32_t *positions = columns[1], *counts = columns[2], *ids = columns[3], *banned = columns[4];
    const char *problem = NULL;
    if (n < 1 || n > n_batch || lengths[1] != n || lengths[2] != n)
        problem = "tokens, positions and seq_counts need one entry per token (1 to n_batch)";
    else if (n_rows < 1 || n_rows > n || k < 1 || vocab_limit < 1 || vocab_limit > n_vocab || !(temperature > 0.0))
        problem = "n_rows (1 to the tokens), k, vocab_limit (1 to n_vocab) or temperature out of range";
    for (Py_ssize_t i = 0; !problem && i < n; i++) /* check everything before the batch is touched */
        if (positions[i] < 0)
            problem = "a negative position";
    if (!problem)
        problem = seq_ids_problem(counts, n, ids, n_ids, n_seq_max);
    for (Py_ssize_t b = 1; !problem && b < lengths[4]; b++)
        if (banned[b] <= banned[b - 1])
            problem = "banned must be ascending and unique";
    if (problem) {
        PyErr_Format(PyExc_ValueError, "decode_top_k(): %s", problem);
        goto out;
    }
    if (!llama_decode || !ctx_address || !batch_address) {
        PyErr_SetString(PyExc_RuntimeError, "decode_top_k() before bind(), or on a closed context");
        goto out;
    }
    l.ids = malloc(n_rows * k * sizeof *l.ids);
    l.probs = malloc(n_rows * k * sizeof *l.probs);
    l.found = malloc(n_rows * sizeof *l.found);
    if (!l.ids || !l.probs || !l.found) {
        PyErr_NoMemory();
        goto out;
    }
    llama_batch *batch = (llama_batch *)(uintptr_t)batch_address;
    fill_batch(batch, columns[0], positions, counts, ids, n, n - n_rows);
    l.n = n, l.n_rows = n_rows, l.k = k, l.vocab_limit = vocab_limit, l.temperature = temperature;
    l.banned = banned, l.n_banned = lengths[4];
    Py_BEGIN_ALLOW_THREADS
    row_helper_arm(helper);
    decode_and_reduce((void *)(uintptr_t)ctx_address, batch, &l);
    row_helper_disarm(helper);
    Py_END_ALLOW_THREADS
    if (l.rc == -1) {
        PyErr_NoMemory();
        goto out;
    }
    PyObject *found = PyList_New(l.rc == 0 ? n_rows : 0);
    for (Py_ssize_t r = 0; found && l.rc == 0 && r < n_rows; r++)
        PyList_SET_ITEM(found, r, PyLong_FromSsize_t(l.found[r]));
    Py_ssize_t valid = l.rc == 0 ? n_rows * k : 0;
    if (found && !PyErr_Occurred())
        result = Py_BuildValue("(idy#y#O)", l.rc, l.seconds, (const char *)l.ids, valid * (Py_ssize_t)sizeof *l.ids,
                               (const char *)l.probs, valid * (Py_ssize_t)sizeof *l.probs, found);
    Py_XDECREF(found);
out:
    while (converted > 0)
        free(columns[--converted]);
    free(l.ids);
    free(l.probs);
    free(l.found);
    return result;
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS, BIND_DOC},
    {"decode_top_k", decode_top_k, METH_VARARGS,
     "decode_top_k(ctx, batch, n_batch, n_seq_max, n_vocab, tokens, positions, seq_counts, seq_ids, n_rows, k, "
     "temperature, vocab_limit, banned[, helper]) -> (rc, seconds, ids, probs, found)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_level",
                                    "One draft level (batch, decode, each row's top-k) in one call.", -1, methods};

PyMODINIT_FUNC PyInit__level(void) { return row_helper_import() < 0 ? NULL : PyModule_Create(&module); }
