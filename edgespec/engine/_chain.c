/* The draft's greedy chain in one call: decode, take the row's top token (with its full-softmax
 * probability), decode that token, and so on — no Python between the draft decodes.
 *
 * Why: on a CPU every decode streams the model's weights through the caches and the Python after it
 * runs cold, so each draft level of a chain paid ~0.2 ms of Python (the logits view, the top-k call,
 * its SparseDist, the tree and batch bookkeeping) for one token; a chain of γ levels paid it γ times.
 * Here the levels run in C (GIL released) and Python resumes once. On a GPU the same Python stood
 * between two draft passes the GPU could have run back to back.
 *
 * Same tokens and probabilities as the level-by-level path: the row's top allowed id (ties: the
 * lower id) and p = exp(l − m − log Z) from the kernels of decoding/_row_kernels.h that draft_dists
 * uses (k = 1 there is the first of its k candidates).
 *
 * llama.cpp is not linked: its functions are bound at run time (_native.h).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "../decoding/_row_kernels.h"
#include "_native.h"

typedef struct {
    Py_ssize_t length, vocab_limit, n_banned;
    double p_min, temperature;
    const int32_t *banned;
    int32_t chain_seq;
    int32_t *tokens; /* out: the chain, `drafted` of them */
    double *probs;
    Py_ssize_t drafted, decodes;
    double seconds;
    int rc; /* llama_decode's return code, or -1: out of memory, -2: no logits row */
} Chain;

/* The loop, GIL released: the batch already holds the first decode (the root and any catch-up). */
static void run_chain(void *ctx, llama_batch *batch, int32_t position, Chain *c)
{
    float *scratch = malloc(row_scratch_floats(c->vocab_limit, 1, c->n_banned) * sizeof *scratch);
    if (!scratch) {
        c->rc = -1;
        goto done;
    }
    for (;;) {
        c->rc = timed_decode(ctx, batch, &c->seconds);
        c->decodes++;
        if (c->rc != 0)
            break;
        const float *row = llama_get_logits_ith(ctx, -1);
        if (!row) {
            c->rc = -2;
            break;
        }
        int32_t id;
        double p;
        Py_ssize_t found = row_top_k(row, c->vocab_limit, 1, c->temperature, c->banned, c->n_banned, scratch, &id, &p);
        if (found == 0) /* every id banned: nothing to draft */
            break;
        c->tokens[c->drafted] = id;
        c->probs[c->drafted] = p;
        c->drafted++;
        if (c->drafted >= c->length || p < c->p_min) /* the last token is not decoded */
            break;
        batch->n_tokens = 1; /* the next level: the token just drafted, in the chain's sequence */
        batch->token[0] = id;
        batch->pos[0] = ++position;
        batch->n_seq_id[0] = 1;
        batch->seq_id[0][0] = c->chain_seq;
        batch->logits[0] = 1;
    }
done:
    free(scratch);
}

/* greedy_chain(ctx, batch, n_batch, n_seq_max, first_tokens, first_position, first_seq_ids, chain_seq,
 *              length, p_min, temperature, vocab_limit, banned[, helper]) -> (rc, decodes, seconds, tokens, probs)
 *
 * First decode: first_tokens at first_position, first_position + 1, …, each in first_seq_ids, the last
 * one's row asked for. Then up to `length` tokens: each the top allowed id of the last row (banned:
 * ascending ids never proposed; ids ≥ vocab_limit neither), decoded into chain_seq at the next position
 * unless it is the length-th or its probability is below p_min. rc ≠ 0: llama_decode failed (its code),
 * -2: llama.cpp returned no row; tokens and probs hold what was drafted before. */
static PyObject *greedy_chain(PyObject *self, PyObject *args)
{
    unsigned long long ctx_address, batch_address;
    Py_ssize_t n_batch, n_seq_max, length, vocab_limit, n_first, n_ids;
    int first_position, chain_seq, helper = 0;
    double p_min, temperature;
    PyObject *first_obj, *ids_obj, *banned_obj;
    if (!PyArg_ParseTuple(args, "KKnnOiOinddnO|p", &ctx_address, &batch_address, &n_batch, &n_seq_max, &first_obj,
                          &first_position, &ids_obj, &chain_seq, &length, &p_min, &temperature, &vocab_limit,
                          &banned_obj, &helper))
        return NULL;
    if (length < 1 || vocab_limit < 1 || temperature <= 0.0 || chain_seq < 0 || chain_seq >= n_seq_max) {
        PyErr_SetString(PyExc_ValueError, "greedy_chain(): length, vocab_limit, temperature or chain_seq out of range");
        return NULL;
    }
    Chain c = {.length = length, .vocab_limit = vocab_limit, .p_min = p_min, .temperature = temperature,
               .chain_seq = chain_seq};
    int32_t *first = int32_array(first_obj, "first_tokens", &n_first);
    int32_t *ids = first ? int32_array(ids_obj, "first_seq_ids", &n_ids) : NULL;
    int32_t *banned = ids ? int32_array(banned_obj, "banned", &c.n_banned) : NULL;
    c.banned = banned;
    c.tokens = malloc(length * sizeof *c.tokens);
    c.probs = malloc(length * sizeof *c.probs);
    PyObject *result = NULL;
    if (!banned)
        goto out;
    if (!c.tokens || !c.probs) {
        PyErr_NoMemory();
        goto out;
    }
    if (n_first < 1 || n_first > n_batch || n_ids < 1 || n_ids > n_seq_max) {
        PyErr_Format(PyExc_ValueError, "greedy_chain(): %zd first tokens (1 to %zd) in %zd sequences (1 to %zd)",
                     n_first, n_batch, n_ids, n_seq_max);
        goto out;
    }
    if (!llama_decode || !ctx_address || !batch_address) {
        PyErr_SetString(PyExc_RuntimeError, "greedy_chain() before bind(), or on a closed context");
        goto out;
    }
    llama_batch *batch = (llama_batch *)(uintptr_t)batch_address;
    fill_first(batch, first, n_first, first_position, ids, n_ids);
    Py_BEGIN_ALLOW_THREADS
    row_helper_arm(helper);
    run_chain((void *)(uintptr_t)ctx_address, batch, first_position + (int32_t)n_first - 1, &c);
    row_helper_disarm(helper);
    Py_END_ALLOW_THREADS
    if (c.rc == -1) {
        PyErr_NoMemory();
        goto out;
    }
    result = Py_BuildValue("(indNN)", c.rc, c.decodes, c.seconds, int32_list(c.tokens, c.drafted),
                           double_list(c.probs, c.drafted));
out:
    free(first);
    free(ids);
    free(banned);
    free(c.tokens);
    free(c.probs);
    return result;
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS, BIND_DOC},
    {"greedy_chain", greedy_chain, METH_VARARGS,
     "greedy_chain(ctx, batch, n_batch, n_seq_max, first_tokens, first_position, first_seq_ids, chain_seq, "
     "length, p_min, temperature, vocab_limit, banned[, helper]) -> (rc, decodes, seconds, tokens, probs)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_chain", "The draft's greedy chain in one call.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__chain(void) { return row_helper_import() < 0 ? NULL : PyModule_Create(&module); }
