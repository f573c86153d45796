/* OPT-Tree (Algorithm 1, planner/opt_tree.py) drafted in one call: each level's batched draft decode, its rows'
 * top-k, the choice of the children and of the next layer, the KV bookkeeping, and the final choice of the
 * nodes kept run here with the GIL released; Python resumes once, with the kept nodes only.
 *
 * Why: OPT-Tree picks each level from the distributions of the last, so the level-by-level path ran Python
 * after every draft decode (~0.4 ms a level on a CPU, where each decode leaves the interpreter cold; issue
 * 12), and on a GPU that Python is a gap between two draft passes. A step takes 4–10 levels.
 *
 * The reference is planner/opt_tree.py's ``opt_tree_by_levels``; this file is its loop, step for step, with
 * _tree_draft.h's levels (the engine's ``Draft._decode_level`` and ``draft_dists``), so the nodes, their
 * probabilities and the KV cells are identical:
 *   - a level's candidates are the children with q > 0 of its nodes, p̂ = p̂(parent) · q, taken in the order
 *     (p̂ descending, the parent's place in the layer, the child's rank) — the reference's tuples
 *     (−p̂, place, rank) ascending — at most n of them, while p̂ beats the smallest of the n largest p̂ so far;
 *   - the n largest p̂ are a min-heap kept across levels: it holds the same values as the reference's
 *     list of the tree's n largest, rebuilt each level (every node added was pushed, and only a node
 *     beating the heap's least is added), and E = their sum, largest first;
 *   - the next layer: the added children, the best ``capacity − evaluated`` by p̂ (ties: the lower node),
 *     then, with level costs, the m best whose Σ p̂ − c_d(m) / c_t(n + 1) is largest (the first m on ties);
 *     drafting stops when it is empty or the last level's gain in E is below δ(its size);
 *   - step 4 (``final_choice``): the n nodes with the largest p̂ (ties: the lower node), with the sizing the m
 *     of them with the best rate (1 + E_m) / (drafting + overhead + c_t(m + 1)) (the first m on ties), the
 *     drafting being the levels' c_d added in order (``FinalSizing.best_m``), kept in index order.
 * The products and sums are single roundings in the same order as the reference's (no FMA can form: no
 * product is added to), so they round as Python's floats do. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "../decoding/_row_kernels.h"
#include "_native.h"
#include "_tree_draft.h"

typedef struct {
    double phat;       /* p̂ of the child */
    int32_t place, rank; /* its parent's place in the layer, its rank in the parent's top-k */
} Child;

typedef struct {
    double phat;
    int32_t node;
} Ranked;

typedef struct {
    Py_ssize_t n, capacity, max_depth; /* the tree's draft tokens; nodes the draft may evaluate; levels */
    double *threshold;                 /* δ for a next level of m nodes, m = 0 … n */
    double *level_cost;                /* c_d(m) / c_t(n + 1), m = 0 … n; NULL: expand every layer node */
    /* step 4's sizing (NULL: keep the n best): c_d(m) and c_t(m + 1) in seconds, m = 0 … n, and the cost
     * model's Python per step */
    double *level_seconds, *verify_seconds, overhead;
    /* scratch: the layer, the children added, a level's candidates, nodes ranked by p̂ (every node, for step 4),
     * the n largest p̂, the nodes kept and their new numbers */
    int32_t *layer, *children, *keep, *renumber;
    Child *candidates;
    Ranked *ranked;
    double *top, *summed;
} Levels;

static int by_child(const void *a, const void *b)
{
    const Child *x = a, *y = b;
    if (x->phat != y->phat)
        return x->phat > y->phat ? -1 : 1;
    if (x->place != y->place)
        return x->place < y->place ? -1 : 1;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

static int by_phat(const void *a, const void *b) /* p̂ descending, then the lower node (a stable sort's order) */
{
    const Ranked *x = a, *y = b;
    if (x->phat != y->phat)
        return x->phat > y->phat ? -1 : 1;
    return (x->node > y->node) - (x->node < y->node);
}

static int by_node(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static int descending(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

/* The min-heap of the n largest p̂: add a value (heapq.heappush), or replace the least (heapq.heapreplace). */
static void sift_down(double *heap, Py_ssize_t n, Py_ssize_t at)
{
    double value = heap[at];
    for (;;) {
        Py_ssize_t child = 2 * at + 1;
        if (child >= n)
            break;
        if (child + 1 < n && heap[child + 1] < heap[child])
            child++;
        if (!(heap[child] < value))
            break;
        heap[at] = heap[child];
        at = child;
    }
    heap[at] = value;
}

static void heap_push(double *heap, Py_ssize_t *n, double value)
{
    Py_ssize_t at = (*n)++;
    while (at > 0 && value < heap[(at - 1) / 2]) {
        heap[at] = heap[(at - 1) / 2];
        at = (at - 1) / 2;
    }
    heap[at] = value;
}

/* The nodes of `nodes` (ascending) ranked by p̂; keep the first `keep`, ascending again. */
static Py_ssize_t keep_best(const Tree *t, Levels *lv, int32_t *nodes, Py_ssize_t count, Py_ssize_t keep)
{
    for (Py_ssize_t i = 0; i < count; i++)
        lv->ranked[i] = (Ranked){t->path_prob[nodes[i]], nodes[i]};
    qsort(lv->ranked, count, sizeof *lv->ranked, by_phat);
    for (Py_ssize_t i = 0; i < keep; i++)
        nodes[i] = lv->ranked[i].node;
    qsort(nodes, keep, sizeof *nodes, by_node);
    return keep;
}

/* The m best of the layer whose expansion can pay for its level: m maximises Σ_{j ≤ m} p̂(u_j) − c_d(m) /
 * c_t(n + 1) (OptTreePlanner._worth_drafting). */
static Py_ssize_t worth_drafting(const Tree *t, Levels *lv, int32_t *layer, Py_ssize_t count)
{
    if (!lv->level_cost || count <= 1)
        return count;
    for (Py_ssize_t i = 0; i < count; i++)
        lv->ranked[i] = (Ranked){t->path_prob[layer[i]], layer[i]};
    qsort(lv->ranked, count, sizeof *lv->ranked, by_phat);
    double bound = 0.0, best_net = -INFINITY;
    Py_ssize_t best_m = 1;
    for (Py_ssize_t m = 1; m <= count; m++) {
        bound += lv->ranked[m - 1].phat;
        if (bound - lv->level_cost[m] > best_net)
            best_m = m, best_net = bound - lv->level_cost[m];
    }
    for (Py_ssize_t i = 0; i < best_m; i++)
        layer[i] = lv->ranked[i].node;
    qsort(layer, best_m, sizeof *layer, by_node);
    return best_m;
}

/* Algorithm 1, level by level (opt_tree_by_levels), GIL released. */
static void grow(Tree *t, Levels *lv)
{
    Py_ssize_t n = lv->n, k = t->k, n_layer = 1, evaluated = 0, n_top = 0;
    double e_old = 0.0;
    lv->layer[0] = 0;
    for (Py_ssize_t level = 0; level < lv->max_depth; level++) {
        if ((t->rc = evaluate(t, lv->layer, n_layer)))
            return;
        evaluated += n_layer - (level == 0); /* the root is not counted */
        Py_ssize_t n_candidates = 0;
        for (Py_ssize_t place = 0; place < n_layer; place++) {
            Py_ssize_t e = t->row[lv->layer[place]];
            for (Py_ssize_t rank = 0; rank < t->live[e]; rank++) /* q > 0 */
                lv->candidates[n_candidates++] = (Child){t->path_prob[lv->layer[place]] * t->probs[e * k + rank],
                                                             (int32_t)place, (int32_t)rank};
        }
        qsort(lv->candidates, n_candidates, sizeof *lv->candidates, by_child);
        Py_ssize_t added = 0;
        for (Py_ssize_t c = 0; c < n_candidates && c < n; c++) {
            const Child *child = &lv->candidates[c];
            if (n_top == n && child->phat <= lv->top[0]) /* n older nodes beat it, and every later one */
                break;
            if (n_top < n)
                heap_push(lv->top, &n_top, child->phat);
            else {
                lv->top[0] = child->phat;
                sift_down(lv->top, n_top, 0);
            }
            int32_t parent = lv->layer[child->place];
            Py_ssize_t at = t->row[parent] * k + child->rank;
            int32_t node = add_node(t, parent, t->ids[at], t->probs[at]);
            if (node < 0) {
                t->rc = TREE_FULL;
                return;
            }
            lv->children[added++] = node;
        }
        /* E_sub(T, n): the n largest p̂ so far, summed largest first */
        memcpy(lv->summed, lv->top, n_top * sizeof *lv->top);
        qsort(lv->summed, n_top, sizeof *lv->summed, descending);
        double e_new = 0.0;
        for (Py_ssize_t i = 0; i < n_top; i++)
            e_new += lv->summed[i];
        double gain = e_new - e_old;
        e_old = e_new;
        /* the next layer: the children, as many as the draft's sequences allow, then those that pay */
        memcpy(lv->layer, lv->children, added * sizeof *lv->children);
        Py_ssize_t room = lv->capacity - evaluated;
        n_layer = added > room ? keep_best(t, lv, lv->layer, added, room) : added;
        n_layer = worth_drafting(t, lv, lv->layer, n_layer);
        if (n_layer == 0 || gain < lv->threshold[n_layer])
            return;
    }
}

/* Leave only the root and `keep` (m nodes, ascending, closed under parents) in the tree, renumbered in index
 * order (node keep[i] becomes i + 1), with the evaluations of kept nodes (in evaluation order, their rows moved
 * down). A kept node's sequence, and whether a child continued it, stay as drafted: that child's cells are in
 * the cache whether it is kept or not. `renumber`: room for the tree's size. */
static void tree_keep(Tree *t, const int32_t *keep, Py_ssize_t m, int32_t *renumber)
{
    for (Py_ssize_t node = 0; node < t->size; node++)
        renumber[node] = -1;
    renumber[0] = 0;
    for (Py_ssize_t i = 0; i < m; i++)
        renumber[keep[i]] = (int32_t)(i + 1);
    for (Py_ssize_t i = 0; i < m; i++) { /* keep[i] ≥ i + 1: every node moves down, after what it reads */
        int32_t from = keep[i], to = (int32_t)(i + 1);
        t->token[to] = t->token[from], t->parent[to] = renumber[t->parent[from]], t->depth[to] = t->depth[from];
        t->prob[to] = t->prob[from], t->path_prob[to] = t->path_prob[from], t->row[to] = t->row[from];
        t->seq[to] = t->seq[from], t->taken[to] = t->taken[from];
    }
    t->size = m + 1;
    Py_ssize_t kept = 0, k = t->k;
    for (Py_ssize_t e = 0; e < t->n_evaluated; e++) {
        int32_t node = renumber[t->evaluated[e]];
        if (node < 0)
            continue;
        if (kept != e) {
            memcpy(t->ids + kept * k, t->ids + e * k, k * sizeof *t->ids);
            memcpy(t->probs + kept * k, t->probs + e * k, k * sizeof *t->probs);
            memcpy(t->left + kept * k, t->left + e * k, k * sizeof *t->left);
            t->found[kept] = t->found[e], t->live[kept] = t->live[e], t->drawn[kept] = t->drawn[e];
        }
        t->evaluated[kept] = node;
        t->row[node] = (int32_t)kept++;
    }
    t->n_evaluated = kept;
}

/* Step 4 (final_choice in planner/opt_tree.py) into lv->keep, ascending; returns how many. */
static Py_ssize_t final_choice(const Tree *t, Levels *lv)
{
    Py_ssize_t count = t->size - 1, m = count < lv->n ? count : lv->n;
    for (Py_ssize_t i = 0; i < count; i++)
        lv->ranked[i] = (Ranked){t->path_prob[i + 1], (int32_t)(i + 1)};
    qsort(lv->ranked, count, sizeof *lv->ranked, by_phat);
    if (lv->level_seconds) {
        double spent = 0.0; /* the levels' draft seconds, added in order */
        for (Py_ssize_t level = 0; level < t->decodes; level++)
            spent += lv->level_seconds[t->level_size[level]];
        Py_ssize_t best_m = 0;
        double best_rate = 1.0 / (spent + lv->overhead + lv->verify_seconds[0]), e = 0.0;
        for (Py_ssize_t j = 1; j <= m; j++) {
            e += lv->ranked[j - 1].phat; /* E_j */
            double rate = (1.0 + e) / (spent + lv->overhead + lv->verify_seconds[j]);
            if (rate > best_rate)
                best_m = j, best_rate = rate;
        }
        m = best_m;
    }
    for (Py_ssize_t i = 0; i < m; i++)
        lv->keep[i] = lv->ranked[i].node;
    qsort(lv->keep, m, sizeof *lv->keep, by_node);
    return m;
}

/* opt_tree(ctx, memory, batch, n_batch, n_seq_max, first_tokens, first_position, n_tagged, n, capacity,
 *          max_depth, threshold, level_cost, level_seconds, overhead, verify_seconds, k, temperature, vocab_limit,
 *          banned[, helper]) -> see tree_result() (_tree_draft.h): the kept nodes, renumbered in index order,
 *          the evaluations among them, and every level's size
 *
 * The first decode holds first_tokens (the catch-up, the root last) at first_position … in sequences
 * 0 … n_tagged − 1. n: draft tokens the tree may keep (1 ≤ n ≤ capacity, n < n_batch); capacity: nodes
 * besides the root the draft may evaluate; max_depth: levels; threshold: n + 1 floats, δ for a next level of
 * m nodes; level_cost: n + 1 floats, c_d(m) / c_t(n + 1), or none (every layer node is expanded);
 * level_seconds and verify_seconds: n + 1 floats each, c_d(m) and c_t(m + 1), or none (keep the n best); k:
 * candidates per row (≤ vocab_limit); banned: ascending ids never proposed. rc ≠ 0: llama_decode's code,
 * -2: no logits row, -3: out of sequence ids; the tree then holds every node built before (nothing cut). */
static PyObject *opt_tree(PyObject *self, PyObject *args)
{
    unsigned long long ctx, memory, batch;
    Py_ssize_t n_batch, n_seq_max, k, vocab_limit;
    int first_position, n_tagged, helper = 0;
    double temperature;
    PyObject *first_obj, *floats_obj[4], *banned_obj;
    Levels lv = {0};
    if (!PyArg_ParseTuple(args, "KKKnnOiinnnOOOdOndnO|p", &ctx, &memory, &batch, &n_batch, &n_seq_max, &first_obj,
                          &first_position, &n_tagged, &lv.n, &lv.capacity, &lv.max_depth, &floats_obj[0],
                          &floats_obj[1], &floats_obj[2], &lv.overhead, &floats_obj[3], &k, &temperature,
                          &vocab_limit, &banned_obj, &helper))
        return NULL;
    if (lv.n < 1 || lv.n >= n_batch || lv.capacity < lv.n || lv.max_depth < 1 || k < 1 || k > vocab_limit ||
        temperature <= 0.0 || n_tagged < 1 || n_tagged > n_seq_max) {
        PyErr_SetString(PyExc_ValueError,
                        "opt_tree(): n, capacity, max_depth, k, temperature or n_tagged out of range");
        return NULL;
    }
    Tree t = {.ctx = (void *)(uintptr_t)ctx, .memory = (void *)(uintptr_t)memory,
              .batch = (llama_batch *)(uintptr_t)batch, .n_seq_max = n_seq_max, .k = k,
              .vocab_limit = vocab_limit, .temperature = temperature, .n_tagged = n_tagged};
    Py_ssize_t n = lv.n, nodes = 1 + n * lv.max_depth;
    PyObject *out = NULL;
    /* threshold (required), level_cost, level_seconds, verify_seconds (each n + 1 floats, or none) */
    static const char *names[4] = {"threshold", "level_cost", "level_seconds", "verify_seconds"};
    double *floats[4] = {NULL, NULL, NULL, NULL};
    Py_ssize_t counts[4] = {0, 0, 0, 0};
    for (int i = 0; i < 4; i++)
        if (!(floats[i] = double_array(floats_obj[i], names[i], &counts[i])))
            goto done;
    if (counts[0] != n + 1 || (counts[1] != 0 && counts[1] != n + 1) || (counts[2] != 0 && counts[2] != n + 1) ||
        counts[3] != counts[2]) {
        PyErr_Format(PyExc_ValueError,
                     "opt_tree(): %zd thresholds, %zd level costs, %zd level and %zd verify seconds (n + 1 = %zd; "
                     "the last three may be empty, the seconds both or neither)",
                     counts[0], counts[1], counts[2], counts[3], n + 1);
        goto done;
    }
    lv.threshold = floats[0];
    lv.level_cost = counts[1] ? floats[1] : NULL;
    lv.level_seconds = counts[2] ? floats[2] : NULL, lv.verify_seconds = counts[3] ? floats[3] : NULL;
    lv.layer = malloc((2 * n + 1 + 2 * nodes) * sizeof *lv.layer);
    lv.children = lv.layer ? lv.layer + n + 1 : NULL;
    lv.keep = lv.layer ? lv.children + n : NULL, lv.renumber = lv.layer ? lv.keep + nodes : NULL;
    lv.candidates = malloc(n * k * sizeof *lv.candidates);
    lv.ranked = malloc(nodes * sizeof *lv.ranked);
    lv.top = malloc(2 * n * sizeof *lv.top);
    lv.summed = lv.top ? lv.top + n : NULL;
    if (!lv.layer || !lv.candidates || !lv.ranked || !lv.top)
        PyErr_NoMemory();
    else if (tree_open(&t, n_batch, first_obj, first_position, banned_obj, nodes, lv.capacity + 1) == 0) {
        Py_BEGIN_ALLOW_THREADS
        row_helper_arm(helper);
        grow(&t, &lv);
        row_helper_disarm(helper);
        if (t.rc == 0)
            tree_keep(&t, lv.keep, final_choice(&t, &lv), lv.renumber);
        Py_END_ALLOW_THREADS
        out = tree_result(&t);
    }
    tree_close(&t);
done:
    for (int i = 0; i < 4; i++)
        free(floats[i]);
    free(lv.layer);
    free(lv.candidates);
    free(lv.ranked);
    free(lv.top);
    return out;
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS, BIND_DOC},
    {"opt_tree", opt_tree, METH_VARARGS,
     "opt_tree(ctx, memory, batch, n_batch, n_seq_max, first_tokens, first_position, n_tagged, n, capacity, "
     "max_depth, threshold, level_cost, level_seconds, overhead, verify_seconds, k, temperature, vocab_limit, "
     "banned[, helper]) -> (rc, decodes, seconds, sizes, parents, tokens, probs, evaluated, seqs, ids, top_probs, "
     "found, taken, n_used, n_tagged): the kept nodes"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_opt_tree", "OPT-Tree drafted in one call.",
                                    -1, methods};

PyMODINIT_FUNC PyInit__opt_tree(void) { return row_helper_import() < 0 ? NULL : PyModule_Create(&module); }
