/* DySpec's tree under a greedy target (Algorithm 1, draft decodes batched) drafted in one call: the heap
 * of "next draw" slots, the draft's decodes, each row's top-k and the KV bookkeeping of every level run
 * here, with the GIL released; Python resumes once, with the finished tree.
 *
 * Why: DySpec picks each level from the distributions of the last, so the level-by-level path runs
 * Python after every draft decode — ~0.3 ms a level on a CPU, where each decode leaves the interpreter
 * cold (issue 12), and on a GPU a gap between two draft passes. A step takes 5–15 levels.
 *
 * The reference is planner/dyspec.py's ``dyspec_by_levels`` without a seed; this file is that loop, the
 * engine's ``Draft._decode_level`` (which sequence each node is decoded in) and ``draft_dists`` (the same
 * kernels, decoding/_row_kernels.h), step for step, so trees, probabilities and KV cells are identical:
 *   - a slot is (v, push order, node), popped largest v first, ties to the earlier push (heapq's order);
 *   - when the top slot's node has no distribution yet, every such node among the heap's best r slots
 *     (r: budget left) is evaluated in one decode, in ascending node order;
 *   - the i-th draw at a node takes its i-th most likely token y, with R[y] = p_i / left_i, where
 *     left_i = Σ_{j ≥ i} p_j over its positive probabilities, summed from the last one back (the
 *     reference's reversed cumsum), and pushes v·(1 − R[y]) for the node and v·R[y] for y.
 * No FMA contraction is possible in these expressions (a product of a difference), so they round as
 * Python's floats do. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "../decoding/_row_kernels.h"
#include "_native.h"

typedef struct {
    double v;      /* the value of the next draw at node */
    int64_t order; /* push order: heapq breaks ties in v by it */
    int32_t node;
} Slot;

static inline int before(const Slot *a, const Slot *b)
{
    return a->v > b->v || (a->v == b->v && a->order < b->order);
}

static int by_priority(const void *a, const void *b) { return before(a, b) ? -1 : before(b, a) ? 1 : 0; }

static int by_node(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static void heap_push(Slot *heap, Py_ssize_t *n, Slot slot)
{
    Py_ssize_t at = (*n)++;
    while (at > 0 && before(&slot, &heap[(at - 1) / 2])) {
        heap[at] = heap[(at - 1) / 2];
        at = (at - 1) / 2;
    }
    heap[at] = slot;
}

static void heap_pop(Slot *heap, Py_ssize_t *n)
{
    Slot last = heap[--(*n)];
    Py_ssize_t at = 0;
    for (;;) {
        Py_ssize_t child = 2 * at + 1;
        if (child >= *n)
            break;
        if (child + 1 < *n && before(&heap[child + 1], &heap[child]))
            child++;
        if (!before(&heap[child], &last))
            break;
        heap[at] = heap[child];
        at = child;
    }
    if (*n)
        heap[at] = last;
}

/* rc values besides llama_decode's own codes */
#define OUT_OF_MEMORY -1
#define NO_ROW -2
#define NO_SEQUENCE -3 /* the tree needs more sequence ids than the context has */

typedef struct {
    void *ctx, *memory;
    llama_batch *batch;
    Py_ssize_t n_seq_max, budget, max_passes, k, vocab_limit, n_banned;
    double temperature;
    const int32_t *banned;
    /* the tree, node 0 the root; per node: its evaluation (-1: none), its sequence (-2: not decoded,
     * -1: the committed root) and whether a child already continues that sequence */
    Py_ssize_t size;
    int32_t *token, *parent, *depth, *row, *seq;
    double *prob;
    int8_t *taken;
    /* per evaluation, in order: the node, its top-k (found of them, `live` positive), the mass left
     * before each draw, the draws made */
    Py_ssize_t n_evaluated;
    int32_t *evaluated, *ids;
    double *probs, *left;
    Py_ssize_t *found, *live, *drawn;
    int32_t root_pos, n_used, n_tagged;
    Py_ssize_t decodes;
    double seconds;
    int rc;
    float *block_max, *pool_heap; /* row_top_k's scratch */
} Tree;

/* The draft's top-k of `row` as node's evaluation, with the mass left before each draw. */
static int reduce_row(Tree *t, int32_t node, const float *row)
{
    Py_ssize_t e = t->n_evaluated, k = t->k;
    int32_t *ids = t->ids + e * k;
    double *p = t->probs + e * k, *left = t->left + e * k;
    Py_ssize_t found = row_top_k(row, t->vocab_limit, k, t->temperature, t->banned, t->n_banned, t->block_max,
                                 t->pool_heap, ids, p);
    if (found < 0)
        return OUT_OF_MEMORY;
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
        if (reduce_row(t, nodes[i], row))
            return OUT_OF_MEMORY;
    }
    return 0;
}

static int32_t add_node(Tree *t, int32_t parent, int32_t token, double prob)
{
    int32_t node = (int32_t)t->size++;
    t->token[node] = token;
    t->parent[node] = parent;
    t->depth[node] = t->depth[parent] + 1;
    t->prob[node] = prob;
    t->row[node] = -1;
    t->seq[node] = -2;
    t->taken[node] = 0;
    return node;
}

/* Algorithm 1 (planner/dyspec.py, the module docstring and dyspec_by_levels), GIL released. */
static void grow(Tree *t, Slot *heap, Slot *best, int32_t *batch_nodes)
{
    Py_ssize_t n_heap = 0, k = t->k;
    int64_t pushes = 1;
    heap_push(heap, &n_heap, (Slot){1.0, 0, 0});
    while (n_heap && t->size - 1 < t->budget) {
        Slot top = heap[0];
        if (t->row[top.node] < 0) {
            if (t->max_passes && t->decodes >= t->max_passes) { /* no pass left: no children for it */
                heap_pop(heap, &n_heap);
                continue;
            }
            /* draft every pending node among the best `room` slots (the rest can never be popped) */
            Py_ssize_t room = t->budget - (t->size - 1), n = 0;
            memcpy(best, heap, n_heap * sizeof *heap);
            qsort(best, n_heap, sizeof *best, by_priority);
            for (Py_ssize_t i = 0; i < room && i < n_heap; i++) {
                int32_t node = best[i].node, seen = 0;
                for (Py_ssize_t j = 0; j < n && !seen; j++)
                    seen = batch_nodes[j] == node;
                if (t->row[node] < 0 && !seen)
                    batch_nodes[n++] = node;
            }
            qsort(batch_nodes, n, sizeof *batch_nodes, by_node);
            t->rc = evaluate(t, batch_nodes, n);
            if (t->rc)
                return;
            continue;
        }
        heap_pop(heap, &n_heap);
        Py_ssize_t e = t->row[top.node];
        if (t->drawn[e] >= t->live[e]) /* an empty distribution: nothing to draw */
            continue;
        Py_ssize_t i = t->drawn[e]++;
        double r_y = t->probs[e * k + i] / t->left[e * k + i]; /* R[y]: y's share of what is left */
        int32_t child = add_node(t, top.node, t->ids[e * k + i], t->probs[e * k + i]);
        double v_child = top.v * r_y, v_next = top.v * (1.0 - r_y);
        if (t->drawn[e] < t->live[e] && v_next > 0.0)
            heap_push(heap, &n_heap, (Slot){v_next, pushes++, top.node});
        if (v_child > 0.0)
            heap_push(heap, &n_heap, (Slot){v_child, pushes++, child});
    }
}

/* The result: (rc, decodes, seconds, parents, tokens, probs, evaluated, seqs, ids, top_probs, found,
 * taken, n_used, n_tagged) — nodes 1 … size − 1; per evaluation its node, sequence (-1: the root) and
 * top-k (ids and probabilities as bytes, k per row, `found` of them valid); the nodes whose sequence a
 * child continued; the fresh sequence ids used and the ids the committed prefix carries now. */
static PyObject *result(const Tree *t)
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
        out = Py_BuildValue("(indNNNNOy#y#OOii)", t->rc, t->decodes, t->seconds, int32_list(t->parent + 1, n),
                            int32_list(t->token + 1, n), double_list(t->prob + 1, n), int32_list(t->evaluated, e),
                            seqs, (const char *)t->ids, (Py_ssize_t)(e * t->k * sizeof *t->ids),
                            (const char *)t->probs, (Py_ssize_t)(e * t->k * sizeof *t->probs), found, taken, t->n_used, t->n_tagged);
    Py_XDECREF(seqs);
    Py_XDECREF(found);
    Py_XDECREF(taken);
    return out;
}

/* greedy_tree(ctx, memory, batch, n_batch, n_seq_max, first_tokens, first_position, n_tagged, budget,
 *             max_passes, k, temperature, vocab_limit, banned) -> see result()
 *
 * The first decode holds first_tokens (the catch-up, the root last) at first_position … in sequences
 * 0 … n_tagged − 1; the root is at the last of those positions. k: candidates per row (≤ vocab_limit);
 * banned: ascending ids never proposed. rc ≠ 0: llama_decode's code, -2: no logits row, -3: out of
 * sequence ids; the tree holds what was built before. */
static PyObject *greedy_tree(PyObject *self, PyObject *args)
{
    unsigned long long ctx, memory, batch_address;
    Py_ssize_t n_batch, n_seq_max, budget, max_passes, k, vocab_limit, n_first = 0;
    int first_position, n_tagged;
    double temperature;
    PyObject *first_obj, *banned_obj;
    if (!PyArg_ParseTuple(args, "KKKnnOiinnndnO", &ctx, &memory, &batch_address, &n_batch, &n_seq_max, &first_obj,
                          &first_position, &n_tagged, &budget, &max_passes, &k, &temperature, &vocab_limit,
                          &banned_obj))
        return NULL;
    if (budget < 1 || budget >= n_batch || max_passes < 0 || k < 1 || k > vocab_limit || temperature <= 0.0 ||
        n_tagged < 1 || n_tagged > n_seq_max) {
        PyErr_SetString(PyExc_ValueError,
                        "greedy_tree(): budget, max_passes, k, temperature or n_tagged out of range");
        return NULL;
    }
    Tree t = {.ctx = (void *)(uintptr_t)ctx, .memory = (void *)(uintptr_t)memory,
              .batch = (llama_batch *)(uintptr_t)batch_address, .n_seq_max = n_seq_max, .budget = budget,
              .max_passes = max_passes, .k = k, .vocab_limit = vocab_limit, .temperature = temperature,
              .n_tagged = n_tagged};
    int32_t *first = int32_array(first_obj, "first_tokens", &n_first);
    int32_t *banned = first ? int32_array(banned_obj, "banned", &t.n_banned) : NULL;
    int32_t *tagged = banned ? malloc(n_tagged * sizeof *tagged) : NULL;
    t.banned = banned;
    Py_ssize_t nodes = budget + 1, slots = 2 * budget + 1, n_blocks = (vocab_limit + BLOCK - 1) / BLOCK;
    /* one allocation per type, carved below */
    int32_t *ints = malloc((7 * nodes + nodes * k) * sizeof *ints);
    double *doubles = malloc((nodes + 2 * nodes * k) * sizeof *doubles);
    Py_ssize_t *counts = malloc(3 * nodes * sizeof *counts);
    t.taken = malloc(nodes);
    float *scratch = malloc((n_blocks + k + t.n_banned) * sizeof *scratch);
    Slot *heap = malloc(2 * slots * sizeof *heap);
    PyObject *out = NULL;
    if (!tagged)
        goto done;
    if (!ints || !doubles || !counts || !t.taken || !scratch || !heap) {
        PyErr_NoMemory();
        goto done;
    }
    if (n_first < 1 || n_first > n_batch) {
        PyErr_Format(PyExc_ValueError, "greedy_tree(): %zd first tokens (1 to %zd)", n_first, n_batch);
        goto done;
    }
    if (!llama_decode || !ctx || !memory || !batch_address) {
        PyErr_SetString(PyExc_RuntimeError, "greedy_tree() before bind(), or on a closed context");
        goto done;
    }
    t.token = ints, t.parent = ints + nodes, t.depth = ints + 2 * nodes, t.row = ints + 3 * nodes;
    t.seq = ints + 4 * nodes, t.evaluated = ints + 5 * nodes, t.ids = ints + 7 * nodes;
    t.prob = doubles, t.probs = doubles + nodes, t.left = doubles + nodes + nodes * k;
    t.found = counts, t.live = counts + nodes, t.drawn = counts + 2 * nodes;
    t.block_max = scratch, t.pool_heap = scratch + n_blocks;
    t.root_pos = first_position + (int32_t)n_first - 1;
    t.size = 1;
    t.token[0] = first[n_first - 1], t.parent[0] = -1, t.depth[0] = 0, t.prob[0] = 1.0;
    t.row[0] = -1, t.seq[0] = -2, t.taken[0] = 0;
    for (int32_t id = 0; id < n_tagged; id++)
        tagged[id] = id;
    fill_first(t.batch, first, n_first, first_position, tagged, n_tagged);
    Py_BEGIN_ALLOW_THREADS
    grow(&t, heap, heap + slots, ints + 6 * nodes); /* a level's nodes */
    Py_END_ALLOW_THREADS
    if (t.rc == OUT_OF_MEMORY)
        PyErr_NoMemory();
    else
        out = result(&t);
done:
    free(first);
    free(banned);
    free(tagged);
    free(ints);
    free(doubles);
    free(counts);
    free(t.taken);
    free(scratch);
    free(heap);
    return out;
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS, BIND_DOC},
    {"greedy_tree", greedy_tree, METH_VARARGS,
     "greedy_tree(ctx, memory, batch, n_batch, n_seq_max, first_tokens, first_position, n_tagged, budget, "
     "max_passes, k, temperature, vocab_limit, banned) -> (rc, decodes, seconds, parents, tokens, probs, "
     "evaluated, seqs, ids, top_probs, found, taken, n_used, n_tagged)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_dyspec", "DySpec's greedy tree drafted in one call.",
                                    -1, methods};

PyMODINIT_FUNC PyInit__dyspec(void) { return PyModule_Create(&module); }
