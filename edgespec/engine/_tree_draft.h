/* What the compiled tree drafters (_dyspec.c, _opt_tree.c) share: a draft tree grown level by level, each
 * level one batched draft decode, each node decoded in the sequence the engine's ``Draft._decode_level``
 * gives it, each row reduced to its top-k with the kernels of ``draft_dists`` (decoding/_row_kernels.h);
 * and the result Python rebuilds the tree from (``Draft._adopt``).
 *
 * A drafter's entry point parses its own arguments, then ``tree_open`` (checks, allocations, the root and the
 * first batch), its loop with the GIL released, ``tree_result`` and ``tree_close``.
 * Include <Python.h>, ../decoding/_row_kernels.h and _native.h first. */
#ifndef EDGESPEC_TREE_DRAFT_H
#define EDGESPEC_TREE_DRAFT_H

/* rc values besides llama_decode's own codes */
#define NO_ROW -2
#define NO_SEQUENCE -3 /* the tree needs more sequence ids than the context has */
#define TREE_FULL -5   /* more nodes or evaluations than the call was sized for (a bug) */

typedef struct {
    void *ctx, *memory;
    llama_batch *batch;
    Py_ssize_t n_seq_max, k, vocab_limit, n_banned;
    double temperature;
    int32_t *banned;
    /* the tree, node 0 the root; per node: its evaluation (-1: none), its sequence (-2: not decoded, -1: the
     * committed root), whether a child already continues that sequence, and p̂ = Π q along its path */
    Py_ssize_t size, max_nodes;
    int32_t *token, *parent, *depth, *row, *seq;
    double *prob, *path_prob;
    int8_t *taken;
    /* per evaluation, in order: the node, its top-k (found of them, `live` positive), the mass left before
     * each draw (DySpec's residuals), the draws made */
    Py_ssize_t n_evaluated, max_rows;
    int32_t *evaluated, *ids;
    double *probs, *left;
    Py_ssize_t *found, *live, *drawn;
    int32_t root_pos, n_used, n_tagged;
    Py_ssize_t decodes;
    int32_t *level_size; /* per decode: the nodes it evaluated */
    double seconds;
    int rc;
    float *scratch;          /* row_top_k's */
    int32_t *first, *tagged; /* the first batch's tokens and sequence ids */
} Tree;

/* The draft's top-k of `row` as node's evaluation, with the mass left before each draw. */
static int reduce_row(Tree *t, int32_t node, const float *row)
{
    Py_ssize_t e = t->n_evaluated, k = t->k;
    if (e >= t->max_rows)
        return TREE_FULL;
    int32_t *ids = t->ids + e * k;
    double *p = t->probs + e * k, *left = t->left + e * k;
    Py_ssize_t found = row_top_k(row, t->vocab_limit, k, t->temperature, t->banned, t->n_banned, t->scratch, ids, p);
    Py_ssize_t live = 0; /* the probabilities are descending: the positive ones come first */
    while (live < found && p[live] > 0.0)
        live++;
    double mass = 0.0;
    for (Py_ssize_t i = live - 1; i >= 0; i--) {
        mass += p[i];
        left[i] = mass;
    }
    t->evaluated[e] = node;
    t->found[e] = found;
    t->live[e] = live;
    t->drawn[e] = 0;
    t->row[node] = (int32_t)e;
    t->n_evaluated++;
    return 0;
}

/* One draft decode of `nodes` (ascending), each in a sequence that sees its path (Draft._decode_level):
 * the first child of a decoded node continues its sequence; any other node takes a fresh id, the
 * committed prefix tagged with it first (once per id, ever), and its parent's path copied into it. The
 * root (the first evaluation) is already in the batch with the tokens the draft has to catch up on. */
static int evaluate(Tree *t, const int32_t *nodes, Py_ssize_t n)
{
    llama_batch *batch = t->batch;
    int root = n == 1 && nodes[0] == 0;
    for (Py_ssize_t i = 0; i < n && !root; i++) {
        int32_t node = nodes[i], parent = t->parent[node], parent_seq = t->seq[parent], s;
        if (parent_seq >= 0 && !t->taken[parent]) {
            s = parent_seq;
            t->taken[parent] = 1;
        } else {
            s = t->n_used;
            if (s >= t->n_seq_max)
                return NO_SEQUENCE;
            for (int32_t id = t->n_tagged; id <= s; id++)
                llama_memory_seq_cp(t->memory, 0, id, 0, t->root_pos + 1);
            t->n_tagged = t->n_tagged > s + 1 ? t->n_tagged : s + 1;
            t->n_used++;
            if (parent_seq >= 0)
                llama_memory_seq_cp(t->memory, parent_seq, s, t->root_pos + 1, t->root_pos + t->depth[parent] + 1);
        }
        t->seq[node] = s;
        batch->token[i] = t->token[node];
        batch->pos[i] = t->root_pos + t->depth[node];
        batch->n_seq_id[i] = 1;
        batch->seq_id[i][0] = s;
        batch->logits[i] = 1;
    }
    if (!root)
        batch->n_tokens = (int32_t)n;
    t->level_size[t->decodes] = (int32_t)n; /* decodes ≤ evaluations so far ≤ max_rows */
    int rc = timed_decode(t->ctx, batch, &t->seconds);
    t->decodes++;
    if (rc != 0)
        return rc;
    if (root)
        t->seq[0] = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        const float *row = llama_get_logits_ith(t->ctx, root ? -1 : (int32_t)i);
        if (!row)
            return NO_ROW;
        if ((rc = reduce_row(t, nodes[i], row)))
            return rc;
    }
    return 0;
}

/* A child of `parent`: token with the draft's probability; -1 when the tree is full (a planner bug). */
static int32_t add_node(Tree *t, int32_t parent, int32_t token, double prob)
{
    if (t->size >= t->max_nodes)
        return -1;
    int32_t node = (int32_t)t->size++;
    t->token[node] = token;
    t->parent[node] = parent;
    t->depth[node] = t->depth[parent] + 1;
    t->prob[node] = prob;
    t->path_prob[node] = t->path_prob[parent] * prob;
    t->row[node] = -1;
    t->seq[node] = -2;
    t->taken[node] = 0;
    return node;
}

/* Convert, check and allocate (room for max_nodes nodes and max_rows evaluations), put the first tokens in
 * the batch (first_tokens at first_position … in sequences 0 … n_tagged − 1, the root last) and make the
 * root node 0. Returns 0, or -1 with a Python error set (then tree_close still frees). */
static int tree_open(Tree *t, Py_ssize_t n_batch, PyObject *first_obj, int first_position, PyObject *banned_obj,
                     Py_ssize_t max_nodes, Py_ssize_t max_rows)
{
    Py_ssize_t n_first = 0, k = t->k, nodes = max_nodes;
    t->first = int32_array(first_obj, "first_tokens", &n_first);
    t->banned = t->first ? int32_array(banned_obj, "banned", &t->n_banned) : NULL;
    if (!t->banned)
        return -1;
    if (n_first < 1 || n_first > n_batch) {
        PyErr_Format(PyExc_ValueError, "%zd first tokens (1 to %zd)", n_first, n_batch);
        return -1;
    }
    if (!llama_decode || !t->ctx || !t->memory || !t->batch) {
        PyErr_SetString(PyExc_RuntimeError, "drafting before bind(), or on a closed context");
        return -1;
    }
    t->max_nodes = max_nodes, t->max_rows = max_rows;
    /* one allocation per type, carved below */
    t->token = malloc((5 * nodes + 2 * max_rows + 1 + max_rows * k) * sizeof *t->token);
    t->prob = malloc((2 * nodes + 2 * max_rows * k) * sizeof *t->prob);
    t->found = malloc(3 * max_rows * sizeof *t->found);
    t->taken = malloc(nodes);
    t->scratch = malloc(row_scratch_floats(t->vocab_limit, k, t->n_banned) * sizeof *t->scratch);
    t->tagged = malloc(t->n_tagged * sizeof *t->tagged);
    if (!t->token || !t->prob || !t->found || !t->taken || !t->scratch || !t->tagged) {
        PyErr_NoMemory();
        return -1;
    }
    t->parent = t->token + nodes, t->depth = t->token + 2 * nodes, t->row = t->token + 3 * nodes;
    t->seq = t->token + 4 * nodes, t->evaluated = t->token + 5 * nodes, t->level_size = t->evaluated + max_rows;
    t->ids = t->level_size + max_rows + 1;
    t->path_prob = t->prob + nodes, t->probs = t->prob + 2 * nodes, t->left = t->probs + max_rows * k;
    t->live = t->found + max_rows, t->drawn = t->found + 2 * max_rows;
    t->root_pos = first_position + (int32_t)n_first - 1;
    t->size = 1;
    t->token[0] = t->first[n_first - 1], t->parent[0] = -1, t->depth[0] = 0, t->prob[0] = 1.0;
    t->path_prob[0] = 1.0, t->row[0] = -1, t->seq[0] = -2, t->taken[0] = 0;
    for (int32_t id = 0; id < t->n_tagged; id++)
        t->tagged[id] = id;
    fill_first(t->batch, t->first, n_first, first_position, t->tagged, t->n_tagged);
    return 0;
}

static void tree_close(Tree *t)
{
    free(t->first);
    free(t->banned);
    free(t->tagged);
    free(t->token);
    free(t->prob);
    free(t->found);
    free(t->taken);
    free(t->scratch);
}

/* The result: (rc, decodes, seconds, sizes, parents, tokens, probs, evaluated, seqs, ids, top_probs, found,
 * taken, n_used, n_tagged) — the nodes each decode evaluated; nodes 1 … size − 1; per evaluation its node,
 * sequence (-1: the root) and top-k (ids and probabilities as bytes, k per row, `found` of them valid); the
 * nodes whose sequence a child continued; the fresh sequence ids used and the ids the committed prefix carries
 * now. NULL with an error set on failure. */
static PyObject *tree_result(const Tree *t)
{
    Py_ssize_t n = t->size - 1, e = t->n_evaluated;
    PyObject *seqs = PyList_New(e), *found = PyList_New(e), *taken = PyList_New(0);
    for (Py_ssize_t i = 0; seqs && found && i < e; i++) {
        PyList_SET_ITEM(seqs, i, PyLong_FromLong(t->seq[t->evaluated[i]]));
        PyList_SET_ITEM(found, i, PyLong_FromSsize_t(t->found[i]));
    }
    for (Py_ssize_t node = 0; taken && node < t->size; node++)
        if (t->taken[node]) {
            PyObject *value = PyLong_FromSsize_t(node);
            if (!value || PyList_Append(taken, value) < 0)
                Py_CLEAR(taken);
            Py_XDECREF(value);
        }
    PyObject *out = NULL;
    if (seqs && found && taken && !PyErr_Occurred())
        out = Py_BuildValue("(indNNNNNOy#y#OOii)", t->rc, t->decodes, t->seconds,
                            int32_list(t->level_size, t->decodes), int32_list(t->parent + 1, n),
                            int32_list(t->token + 1, n), double_list(t->prob + 1, n), int32_list(t->evaluated, e),
                            seqs, (const char *)t->ids, (Py_ssize_t)(e * t->k * sizeof *t->ids),
                            (const char *)t->probs, (Py_ssize_t)(e * t->k * sizeof *t->probs), found, taken,
                            t->n_used, t->n_tagged);
    Py_XDECREF(seqs);
    Py_XDECREF(found);
    Py_XDECREF(taken);
    return out;
}

#endif
