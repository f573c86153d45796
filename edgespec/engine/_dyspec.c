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
#include "_tree_draft.h"

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

/* Algorithm 1 (planner/dyspec.py, the module docstring and dyspec_by_levels), GIL released. */
static void grow(Tree *t, Py_ssize_t budget, Py_ssize_t max_passes, Slot *heap, Slot *best, int32_t *batch_nodes)
{
    Py_ssize_t n_heap = 0, k = t->k;
    int64_t pushes = 1;
    heap_push(heap, &n_heap, (Slot){1.0, 0, 0});
    while (n_heap && t->size - 1 < budget) {
        Slot top = heap[0];
        if (t->row[top.node] < 0) {
            if (max_passes && t->decodes >= max_passes) { /* no pass left: no children for it */
                heap_pop(heap, &n_heap);
                continue;
            }
            /* draft every pending node among the best `room` slots (the rest can never be popped) */
            Py_ssize_t room = budget - (t->size - 1), n = 0;
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
        if (child < 0) {
            t->rc = TREE_FULL;
            return;
        }
        double v_child = top.v * r_y, v_next = top.v * (1.0 - r_y);
        if (t->drawn[e] < t->live[e] && v_next > 0.0)
            heap_push(heap, &n_heap, (Slot){v_next, pushes++, top.node});
        if (v_child > 0.0)
            heap_push(heap, &n_heap, (Slot){v_child, pushes++, child});
    }
}

/* greedy_tree(ctx, memory, batch, n_batch, n_seq_max, first_tokens, first_position, n_tagged, budget,
 *             max_passes, k, temperature, vocab_limit, banned[, helper]) -> see tree_result() in _tree_draft.h
 *
 * The first decode holds first_tokens (the catch-up, the root last) at first_position … in sequences
 * 0 … n_tagged − 1; the root is at the last of those positions. k: candidates per row (≤ vocab_limit);
 * banned: ascending ids never proposed. rc ≠ 0: llama_decode's code, -2: no logits row, -3: out of
 * sequence ids; the tree holds what was built before. */
static PyObject *greedy_tree(PyObject *self, PyObject *args)
{
    unsigned long long ctx, memory, batch;
    Py_ssize_t n_batch, n_seq_max, budget, max_passes, k, vocab_limit;
    int first_position, n_tagged, helper = 0;
    double temperature;
    PyObject *first_obj, *banned_obj;
    if (!PyArg_ParseTuple(args, "KKKnnOiinnndnO|p", &ctx, &memory, &batch, &n_batch, &n_seq_max, &first_obj,
                          &first_position, &n_tagged, &budget, &max_passes, &k, &temperature, &vocab_limit,
                          &banned_obj, &helper))
        return NULL;
    if (budget < 1 || budget >= n_batch || max_passes < 0 || k < 1 || k > vocab_limit || temperature <= 0.0 ||
        n_tagged < 1 || n_tagged > n_seq_max) {
        PyErr_SetString(PyExc_ValueError,
                        "greedy_tree(): budget, max_passes, k, temperature or n_tagged out of range");
        return NULL;
    }
    Tree t = {.ctx = (void *)(uintptr_t)ctx, .memory = (void *)(uintptr_t)memory,
              .batch = (llama_batch *)(uintptr_t)batch, .n_seq_max = n_seq_max, .k = k,
              .vocab_limit = vocab_limit, .temperature = temperature, .n_tagged = n_tagged};
    Py_ssize_t nodes = budget + 1, slots = 2 * budget + 1;
    Slot *heap = malloc(2 * slots * sizeof *heap);
    int32_t *batch_nodes = malloc(nodes * sizeof *batch_nodes); /* a level's nodes */
    PyObject *out = NULL;
    if (!heap || !batch_nodes)
        PyErr_NoMemory();
    else if (tree_open(&t, n_batch, first_obj, first_position, banned_obj, nodes, nodes) == 0) {
        Py_BEGIN_ALLOW_THREADS
        row_helper_arm(helper);
        grow(&t, budget, max_passes, heap, heap + slots, batch_nodes);
        row_helper_disarm(helper);
        Py_END_ALLOW_THREADS
        out = tree_result(&t);
    }
    tree_close(&t);
    free(heap);
    free(batch_nodes);
    return out;
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS, BIND_DOC},
    {"greedy_tree", greedy_tree, METH_VARARGS,
     "greedy_tree(ctx, memory, batch, n_batch, n_seq_max, first_tokens, first_position, n_tagged, budget, "
     "max_passes, k, temperature, vocab_limit, banned[, helper]) -> (rc, decodes, seconds, parents, tokens, probs, "
     "evaluated, seqs, ids, top_probs, found, taken, n_used, n_tagged)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_dyspec", "DySpec's greedy tree drafted in one call.",
                                    -1, methods};

PyMODINIT_FUNC PyInit__dyspec(void) { return row_helper_import() < 0 ? NULL : PyModule_Create(&module); }
