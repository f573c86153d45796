/* The target's greedy verification in one call: the packed tree into the batch, the one target decode,
 * and the greedy walk down its rows (each visited row's argmax and top-1 − top-2 margin) — no Python
 * between the decode and the verdict.
 *
 * Why: after a CPU decode the interpreter runs cold (the decode streamed the target's weights through
 * the caches), and the Python path paid it for the batch fill (a loop over every node and sequence id),
 * the logits view, and the walk (a closure, a generator and a row reduction per visited node): ~0.4 ms a
 * step on a 2.6 GHz Xeon, against ~55 µs to read each visited row (issue 12). On a GPU the same Python
 * stood between the target's decode and the next step's draft passes.
 *
 * The reference is decoding/verify.py's ``verify_greedy`` through ``decoder.decide``: at node u the
 * target's argmax y of u's row (the first maximum, row_argmax_margin, the kernel ``argmax_margin`` uses);
 * the walk moves to u's first child (in index order, the order they were chosen) whose token is y, or
 * stops and emits y. A LONGEST node (mcsd-target-init, lossy by design) is not walked here: rc -4.
 *
 * llama.cpp is not linked: its functions are bound at run time (_native.h). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "../decoding/_row_kernels.h"
#include "_native.h"

#define CHILD_RULE_LONGEST 3 /* planner/tree.py's ChildRule.LONGEST */

typedef struct {
    const int32_t *tokens, *parents;
    const int32_t *child_rule;
    Py_ssize_t n, n_vocab;
    int32_t *path; /* out: accepted nodes, root first */
    double *margins; /* out: the target's top-1 − top-2 at each path node's row */
    Py_ssize_t path_length;
    int32_t next_token;
    double seconds;
    int rc; /* llama_decode's code, or -1: out of memory, -2: no logits row, -4: a LONGEST node */
} Walk;

/* The decode and the walk, GIL released: the batch already holds the tree. */
static void decode_and_walk(void *ctx, llama_batch *batch, Walk *w)
{
    float *block_max = malloc(((w->n_vocab + BLOCK - 1) / BLOCK) * sizeof *block_max);
    if (!block_max) {
        w->rc = -1;
        return;
    }
    w->rc = timed_decode(ctx, batch, &w->seconds);
    int32_t node = 0;
    while (w->rc == 0) {
        if (w->child_rule[node] == CHILD_RULE_LONGEST) {
            w->rc = -4;
            break;
        }
        const float *row = llama_get_logits_ith(ctx, node); /* every node's row was asked for */
        if (!row) {
            w->rc = -2;
            break;
        }
        Py_ssize_t best;
        row_argmax_margin(row, w->n_vocab, block_max, &best, &w->margins[w->path_length]);
        w->path[w->path_length++] = node;
        int32_t next = -1;
        for (Py_ssize_t child = node + 1; child < w->n && next < 0; child++) /* children follow their parent */
            if (w->parents[child] == node && w->tokens[child] == best)
                next = (int32_t)child;
        if (next < 0) {
            w->next_token = (int32_t)best;
            break;
        }
        node = next;
    }
    free(block_max);
}

/* greedy_verify(ctx, batch, n_batch, n_seq_max, n_vocab, tokens, parents, child_rule, first_position,
 *               seq_counts, seq_ids[, helper]) -> (rc, seconds, path, next_token, margins)
 *
 * Every column is a sequence of ints (tuples, as DraftTree and TreeLayout keep them: no array is built
 * between the draft's decodes and this call). The batch: node i (tokens[i]) at first_position + depth(i),
 * in the seq_counts[i] sequence ids that follow in seq_ids (node after node), every row asked for;
 * parents: parents[0] = -1, parents[i] < i; child_rule: ChildRule per node. Then the walk above: path (node indices, root
 * first) and margins (one per path node) as lists. rc ≠ 0: see Walk; path and margins hold what was
 * walked before. */
static PyObject *greedy_verify(PyObject *self, PyObject *args)
{
    unsigned long long ctx_address, batch_address;
    Py_ssize_t n_batch, n_seq_max, n_vocab;
    int first_position, helper = 0;
    PyObject *objects[5];
    if (!PyArg_ParseTuple(args, "KKnnnOOOiOO|p", &ctx_address, &batch_address, &n_batch, &n_seq_max, &n_vocab,
                          &objects[0], &objects[1], &objects[2], &first_position, &objects[3], &objects[4], &helper))
        return NULL;
    static const char *names[5] = {"tokens", "parents", "child_rule", "seq_counts", "seq_ids"};
    int32_t *columns[5] = {NULL};
    Py_ssize_t lengths[5];
    int converted = 0;
    while (converted < 5 && (columns[converted] = int32_array(objects[converted], names[converted],
                                                              &lengths[converted])) != NULL)
        converted++;
    PyObject *result = NULL;
    Walk w = {0};
    int32_t *position = NULL;
    if (converted < 5)
        goto out;
    Py_ssize_t n = lengths[0], n_ids = lengths[4];
    const int32_t *parents = columns[1], *counts = columns[3], *ids = columns[4];
    const char *problem = NULL;
    if (n < 1 || n > n_batch || lengths[1] != n || lengths[2] != n || lengths[3] != n)
        problem = "tokens, parents, child_rule and seq_counts need one entry per node (1 to n_batch)";
    else if (n_vocab < 1 || first_position < 0)
        problem = "n_vocab or first_position out of range";
    position = problem ? NULL : malloc(n * sizeof *position);
    w.path = problem ? NULL : malloc(n * sizeof *w.path);
    w.margins = problem ? NULL : malloc(n * sizeof *w.margins);
    if (!problem && (!position || !w.path || !w.margins)) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; !problem && i < n; i++) { /* check everything before the batch is touched */
        if (i == 0 ? parents[0] != -1 : parents[i] < 0 || parents[i] >= i)
            problem = "parents[0] must be -1 and parents[i] < i";
        else /* the batch's positions: first_position + the node's depth */
            position[i] = i == 0 ? first_position : position[parents[i]] + 1;
    }
    if (!problem)
        problem = seq_ids_problem(counts, n, ids, n_ids, n_seq_max);
    if (problem) {
        PyErr_Format(PyExc_ValueError, "greedy_verify(): %s", problem);
        goto out;
    }
    if (!llama_decode || !ctx_address || !batch_address) {
        PyErr_SetString(PyExc_RuntimeError, "greedy_verify() before bind(), or on a closed context");
        goto out;
    }
    llama_batch *batch = (llama_batch *)(uintptr_t)batch_address;
    const int32_t *tokens = columns[0];
    fill_batch(batch, tokens, position, counts, ids, n, 0);
    w.tokens = tokens;
    w.parents = parents;
    w.child_rule = columns[2];
    w.n = n;
    w.n_vocab = n_vocab;
    Py_BEGIN_ALLOW_THREADS
    row_helper_arm(helper);
    decode_and_walk((void *)(uintptr_t)ctx_address, batch, &w);
    row_helper_disarm(helper);
    Py_END_ALLOW_THREADS
    if (w.rc == -1) {
        PyErr_NoMemory();
        goto out;
    }
    result = Py_BuildValue("(idNiN)", w.rc, w.seconds, int32_list(w.path, w.path_length), (int)w.next_token,
                           double_list(w.margins, w.path_length));
out:
    while (converted > 0)
        free(columns[--converted]);
    free(position);
    free(w.path);
    free(w.margins);
    return result;
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS, BIND_DOC},
    {"greedy_verify", greedy_verify, METH_VARARGS,
     "greedy_verify(ctx, batch, n_batch, n_seq_max, n_vocab, tokens, parents, child_rule, first_position, "
     "seq_counts, seq_ids[, helper]) -> (rc, seconds, path, next_token, margins)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_verify",
                                    "The target's greedy verification of a tree in one call.", -1, methods};

PyMODINIT_FUNC PyInit__verify(void) { return row_helper_import() < 0 ? NULL : PyModule_Create(&module); }
