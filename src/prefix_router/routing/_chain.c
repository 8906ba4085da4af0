/* prefix_router.routing._chain: the compiled build's per-block and per-byte loops.
 *
 * chained xxh3-64 block hashes in one pass:
 *
 * chain(data, block_size, seed, end) -> tuple of ints: h[i] = XXH3_64bits_withSeed(block i, h[i-1]),
 * h[-1] = seed, over the full blocks of data[:end] (end a multiple of block_size, <= len(data)); the same
 * values as hashing.chain_blocks' Python loop over xxhash.xxh3_64_intdigest, held to it by a property test.
 * The hash is the system's libxxhash (its published API, declared here; no xxHash source is included).
 *
 * count_classes(data) -> (word, punct, space, media): a text key's bytes by class, in one pass
 * (units.count_classes_py, the reference it is held to by a property test): word bytes are ASCII letters
 * and digits and every byte >= 0x80, whitespace is one of " \t\n\v\f\r", an image placeholder is 0x1a,
 * punctuation is every other byte.
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

/* The word, whitespace and placeholder bytes of p[:n], branch-free: in byte lanes (a run of at most 255
 * bytes counts at most 255 of a class, so no lane's sum wraps), which -O3 turns into 16 bytes per step. */
static void count_span(const unsigned char *p, size_t n, unsigned long long counts[3]) {
    for (size_t start = 0; start < n; start += 255) {
        const unsigned char *run = p + start;
        size_t len = n - start < 255 ? n - start : 255;
        uint8_t word = 0, space = 0, media = 0;
        for (size_t i = 0; i < len; i++) {
            unsigned char c = run[i];
            unsigned char lower = (unsigned char)(c | 0x20);
            word += ((unsigned char)(c - '0') < 10) | ((unsigned char)(lower - 'a') < 26) | (c >= 0x80);
            space += (c == ' ') | ((unsigned char)(c - '\t') < 5);
            media += c == 0x1a;
        }
        counts[0] += word, counts[1] += space, counts[2] += media;
    }
}

static PyObject *count_classes(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "count_classes(data)");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    unsigned long long counts[3] = {0, 0, 0}, total = (unsigned long long)view.len;
    count_span((const unsigned char *)view.buf, (size_t)view.len, counts);
    unsigned long long word = counts[0], space = counts[1], media = counts[2];
    PyBuffer_Release(&view);
    return Py_BuildValue("(KKKK)", word, total - word - space - media, space, media);
}

static PyMethodDef methods[] = {
    {"chain", (PyCFunction)(void (*)(void))chain, METH_FASTCALL, "Chained xxh3-64 hashes of full blocks."},
    {"count_classes", (PyCFunction)(void (*)(void))count_classes, METH_FASTCALL,
     "A text key's bytes by class: (word, punctuation, whitespace, images) (units.count_classes_py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_chain", NULL, 0, methods};

PyMODINIT_FUNC PyInit__chain(void) { return PyModule_Create(&module); }
