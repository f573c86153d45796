/* Python bindings of the logits-row kernels (_row_kernels.h: what they compute, why in C, and how exact):
 * numpy arrays through the buffer protocol, no numpy headers needed. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "_row_kernels.h"

/* -- Python bindings (buffer protocol: numpy arrays, no numpy headers needed) ------------------------ */

static int get_buffer(PyObject *obj, Py_buffer *view, const char *format, int ndim, int writable,
                      const char *name)
{
    int flags = PyBUF_STRIDES | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0)
        return -1;
    Py_ssize_t item = view->itemsize;
    const char *got = view->format;
    if (got[0] && strchr("@=<", got[0]) && got[1]) /* native or little-endian (ctypes-backed arrays say '<') */
        got++;
    int ok = view->ndim == ndim && strcmp(got, format) == 0 && view->strides[ndim - 1] == item;
    for (int d = 0; ok && d < ndim - 1; d++)
        ok = view->shape[d] < 2 || view->strides[d] >= view->shape[d + 1] * item; /* rows do not overlap */
    if (!ok) {
        const char *type = format[0] == 'f' ? "float32" : format[0] == 'd' ? "float64" : "int32";
        PyErr_Format(PyExc_ValueError, "%s: expected a %d-d %s array with contiguous rows", name, ndim, type);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *top_k(PyObject *self, PyObject *args)
{
    PyObject *rows_obj, *banned_obj, *ids_obj, *probs_obj;
    Py_ssize_t k;
    double temperature;
    if (!PyArg_ParseTuple(args, "OndOOO", &rows_obj, &k, &temperature, &banned_obj, &ids_obj, &probs_obj))
        return NULL;
    /* rows, banned, ids, probs: acquired in order; on a refusal, the ones acquired are released */
    PyObject *objects[4] = {rows_obj, banned_obj, ids_obj, probs_obj};
    static const char *formats[4] = {"f", "i", "i", "d"}, *names[4] = {"rows", "banned", "ids", "probs"};
    static const int dims[4] = {2, 1, 2, 2}, writable[4] = {0, 0, 1, 1};
    Py_buffer views[4];
    int acquired = 0;
    while (acquired < 4 && get_buffer(objects[acquired], &views[acquired], formats[acquired], dims[acquired],
                                      writable[acquired], names[acquired]) == 0)
        acquired++;
    if (acquired < 4) {
        while (acquired > 0)
            PyBuffer_Release(&views[--acquired]);
        return NULL;
    }
    Py_buffer rows = views[0], banned = views[1], ids = views[2], probs = views[3];
    Py_ssize_t n_rows = rows.shape[0], n = rows.shape[1], n_banned = banned.shape[0];
    Py_ssize_t taken = 0;
    const char *problem = NULL;
    if (n < 1 || k < 1 || !(temperature > 0.0))
        problem = "top_k needs a non-empty row, k >= 1 and a temperature > 0";
    else if (ids.shape[0] < n_rows || probs.shape[0] < n_rows || ids.shape[1] < k || probs.shape[1] < k)
        problem = "top_k: the output arrays are smaller than (rows, k)";
    float *scratch = problem ? NULL : malloc(row_scratch_floats(n, k, n_banned) * sizeof(float));
    if (!problem && !scratch)
        problem = "top_k: out of memory";
    if (!problem) {
        Py_BEGIN_ALLOW_THREADS;
        for (Py_ssize_t r = 0; r < n_rows; r++)
            taken = row_top_k((const float *)((const char *)rows.buf + r * rows.strides[0]), n, k, temperature,
                              banned.buf, n_banned, scratch, (int32_t *)((char *)ids.buf + r * ids.strides[0]),
                              (double *)((char *)probs.buf + r * probs.strides[0]));
        Py_END_ALLOW_THREADS;
    }
    free(scratch);
    for (int v = 0; v < 4; v++)
        PyBuffer_Release(&views[v]);
    if (problem) {
        PyErr_SetString(PyExc_ValueError, problem);
        return NULL;
    }
    return PyLong_FromSsize_t(taken);
}

static PyObject *argmax_margin(PyObject *self, PyObject *arg)
{
    Py_buffer row;
    if (get_buffer(arg, &row, "f", 1, 0, "row") < 0)
        return NULL;
    Py_ssize_t n = row.shape[0], best = -1;
    double margin = 0.0;
    float *block_max = n > 0 ? malloc(((n + BLOCK - 1) / BLOCK) * sizeof(float)) : NULL;
    if (block_max) {
        Py_BEGIN_ALLOW_THREADS;
        row_argmax_margin(row.buf, n, block_max, &best, &margin);
        Py_END_ALLOW_THREADS;
        free(block_max);
    }
    PyBuffer_Release(&row);
    if (!block_max) {
        PyErr_SetString(PyExc_ValueError, n > 0 ? "argmax_margin: out of memory" : "argmax_margin: empty row");
        return NULL;
    }
    return Py_BuildValue("(nd)", best, margin);
}

static PyMethodDef methods[] = {
    {"top_k", top_k, METH_VARARGS,
     "top_k(rows, k, temperature, banned, ids, probs) -> n: each float32 row's top k ids not in banned "
     "(int32, ascending) into ids (int32) and their full-softmax probabilities at temperature into probs "
     "(float64); n ids per row (k unless a row has fewer allowed ids)."},
    {"argmax_margin", argmax_margin, METH_O,
     "argmax_margin(row) -> (id, margin): the first maximum of a float32 row and top-1 minus top-2."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_rows", "Logits rows reduced in one compiled pass.",
                                    -1, methods};

/* The calling convention above, as engine/rows.py expects it: a build of another version (a stale
 * extension left by an older install) is refused there, and the numpy path used instead. */
#define KERNEL_ABI 2

PyMODINIT_FUNC PyInit__rows(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddIntConstant(m, "ABI", KERNEL_ABI) < 0)
        Py_CLEAR(m);
    return m;
}
