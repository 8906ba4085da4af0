/* prefix_router.routing._chain: chained xxh3-64 block hashes in one pass (the compiled build's loop).
 *
 * chain(data, block_size, seed, end) -> tuple of ints: h[i] = XXH3_64bits_withSeed(block i, h[i-1]),
 * h[-1] = seed, over the full blocks of data[:end] (end a multiple of block_size, <= len(data)); the same
 * values as hashing.chain_blocks' Python loop over xxhash.xxh3_64_intdigest, held to it by a property test.
 * The hash is the system's libxxhash (its published API, declared here; no xxHash source is included).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>

/* libxxhash's public function (xxhash.h, XXH3 family), stable output since xxHash 0.8.0. */
extern uint64_t XXH3_64bits_withSeed(const void *input, size_t length, uint64_t seed);

static PyObject *chain(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "chain(data, block_size, seed, end)");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    Py_ssize_t block = PyLong_AsSsize_t(args[1]);
    uint64_t prev = (uint64_t)PyLong_AsUnsignedLongLongMask(args[2]);
    Py_ssize_t end = PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred()) goto fail;
    if (block <= 0 || end < 0 || end > view.len || end % block != 0) {
        PyErr_SetString(PyExc_ValueError, "chain: block_size > 0, 0 <= end <= len(data), end % block_size == 0");
        goto fail;
    }
    Py_ssize_t n = end / block;
    PyObject *out = PyTuple_New(n);
    if (out == NULL) goto fail;
    const char *base = (const char *)view.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        prev = XXH3_64bits_withSeed(base + i * block, (size_t)block, prev);
        PyObject *item = PyLong_FromUnsignedLongLong(prev);
        if (item == NULL) {
            Py_DECREF(out);
            goto fail;
        }
        PyTuple_SET_ITEM(out, i, item);
    }
    PyBuffer_Release(&view);
    return out;
fail:
    PyBuffer_Release(&view);
    return NULL;
}

static PyMethodDef methods[] = {
    {"chain", (PyCFunction)(void (*)(void))chain, METH_FASTCALL, "Chained xxh3-64 hashes of full blocks."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_chain", NULL, 0, methods};

PyMODINIT_FUNC PyInit__chain(void) { return PyModule_Create(&module); }
