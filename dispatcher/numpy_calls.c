/* Plain `dispatcher.gemm(a, b)` and `dispatcher.matmul(a, b)` calls on numpy
 * arrays, in C (dispatcher/numpy_calls.py builds this file into the build
 * cache and loads it).
 *
 * A warm plain call through Python costs a few microseconds of key, lookup
 * and argument block, which a small product's kernel does not. Once the
 * Python way has planned and bound a kind of call, its launch is learned
 * here: `call(a, b)` finds it by what the plan depends on (both arrays'
 * shapes, strides and dtype objects), allocates the row-major result,
 * copies the argument block onto the stack, points it at the arrays and
 * runs the kernel's entry point without the GIL. A call it has no launch
 * for returns None, and the caller goes the Python way.
 *
 * The table is direct-mapped with a few ways: a kind of call that is
 * pushed out only goes the Python way again until it is learned again.
 * Dtypes are matched by identity (the table holds a reference to each, so
 * an address is never reused while it is in the table): an equal dtype of
 * another object misses, which is slower but never wrong.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <string.h>

#include "dispatcher_abi.h"

#define SETS 256 /* a power of two */
#define WAYS 4

typedef struct {
    PyArray_Descr* dtype[2]; /* NULL: an empty slot; else owned, as `out` and `check` */
    npy_intp shape[2][2], strides[2][2];
    dispatcher_gemm_fn entry;
    dispatcher_gemm_args block; /* the plan's argument block, its pointers null */
    npy_intp dims[2];           /* the result's */
    PyArray_Descr* out;
    PyObject* check;            /* the library's status check: raises for a nonzero status */
} Launch;

static Launch table[SETS][WAYS];
static unsigned long long hits, misses;

static size_t set_of(PyArray_Descr* const dtype[2], npy_intp const shape[2][2], npy_intp const strides[2][2]) {
    size_t h = 1469598103934665603ull;
    const size_t words[10] = {(size_t)dtype[0], (size_t)dtype[1], (size_t)shape[0][0], (size_t)shape[0][1],
                              (size_t)shape[1][0], (size_t)shape[1][1], (size_t)strides[0][0],
                              (size_t)strides[0][1], (size_t)strides[1][0], (size_t)strides[1][1]};
    for (int i = 0; i < 10; ++i) h = (h ^ words[i]) * 1099511628211ull;
    return (size_t)(h ^ (h >> 29)) & (SETS - 1);
}

static int same(const Launch* l, PyArray_Descr* const dtype[2], npy_intp const shape[2][2],
                npy_intp const strides[2][2]) {
    return l->dtype[0] == dtype[0] && l->dtype[1] == dtype[1] && !memcmp(l->shape, shape, sizeof l->shape) &&
           !memcmp(l->strides, strides, sizeof l->strides);
}

static void empty(Launch* l) {
    Py_CLEAR(l->dtype[0]);
    Py_CLEAR(l->dtype[1]);
    Py_CLEAR(l->out);
    Py_CLEAR(l->check);
}

/* call(a, b): the result of a learned kind of call, or None. */
static PyObject* call(PyObject* self, PyObject* const* args, Py_ssize_t count) {
    if (count != 2 || !PyArray_CheckExact(args[0]) || !PyArray_CheckExact(args[1])) Py_RETURN_NONE;
    PyArrayObject* x[2] = {(PyArrayObject*)args[0], (PyArrayObject*)args[1]};
    if (PyArray_NDIM(x[0]) != 2 || PyArray_NDIM(x[1]) != 2) Py_RETURN_NONE;
    PyArray_Descr* dtype[2] = {PyArray_DESCR(x[0]), PyArray_DESCR(x[1])};
    npy_intp shape[2][2], strides[2][2];
    for (int i = 0; i < 2; ++i) {
        memcpy(shape[i], PyArray_DIMS(x[i]), sizeof shape[i]);
        memcpy(strides[i], PyArray_STRIDES(x[i]), sizeof strides[i]);
    }
    Launch* set = table[set_of(dtype, shape, strides)];
    Launch* l = NULL;
    for (int w = 0; w < WAYS && !l; ++w)
        if (set[w].dtype[0] && same(&set[w], dtype, shape, strides)) l = &set[w];
    if (!l) {
        ++misses;
        Py_RETURN_NONE;
    }
    ++hits;
    Py_INCREF(l->out); /* PyArray_Empty takes a reference */
    PyObject* result = PyArray_Empty(2, l->dims, l->out, 0);
    if (!result) return NULL;
    dispatcher_gemm_args block = l->block;
    block.a = PyArray_DATA(x[0]);
    block.b = PyArray_DATA(x[1]);
    block.c = PyArray_DATA((PyArrayObject*)result);
    dispatcher_gemm_fn entry = l->entry;
    PyObject* check = l->check; /* held: another thread may replace the slot while the kernel runs */
    Py_INCREF(check);
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = entry(&block);
    Py_END_ALLOW_THREADS
    if (status != 0) {
        PyObject* raised = PyObject_CallFunction(check, "i", status);
        Py_XDECREF(raised);
        Py_DECREF(result);
        Py_DECREF(check);
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_RuntimeError, "a gemm-dispatcher kernel failed with status %d", status);
        return NULL;
    }
    Py_DECREF(check);
    return result;
}

/* Read one operand's (shape, strides, dtype) key. */
static int read_spec(PyObject* spec, PyArray_Descr** dtype, npy_intp shape[2], npy_intp strides[2]) {
    PyObject *s, *t, *d;
    if (!PyArg_ParseTuple(spec, "OOO", &s, &t, &d)) return 0;
    if (!PyArray_DescrCheck(d)) {
        PyErr_SetString(PyExc_TypeError, "an operand's key ends with its numpy dtype");
        return 0;
    }
    if (!PyArg_ParseTuple(s, "nn", &shape[0], &shape[1]) || !PyArg_ParseTuple(t, "nn", &strides[0], &strides[1]))
        return 0;
    *dtype = (PyArray_Descr*)d;
    return 1;
}

/* learn(key, entry, block, rows, cols, out_dtype, check): run the calls of
 * `key` (((shape, strides, dtype) of a, of b), as dispatcher.api.operands_key
 * gives) with `entry` (an address) on copies of `block` (the argument block's
 * bytes) into new (rows x cols) arrays of `out_dtype`. */
static PyObject* learn(PyObject* self, PyObject* args) {
    PyObject *key, *entry, *out, *check;
    Py_buffer block;
    npy_intp dims[2];
    if (!PyArg_ParseTuple(args, "O!Oy*nnOO", &PyTuple_Type, &key, &entry, &block, &dims[0], &dims[1], &out, &check))
        return NULL;
    PyArray_Descr* dtype[2];
    npy_intp shape[2][2], strides[2][2];
    int ok = PyTuple_GET_SIZE(key) == 2 && read_spec(PyTuple_GET_ITEM(key, 0), &dtype[0], shape[0], strides[0]) &&
             read_spec(PyTuple_GET_ITEM(key, 1), &dtype[1], shape[1], strides[1]);
    void* address = ok ? PyLong_AsVoidPtr(entry) : NULL;
    if (ok && !address && !PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "no entry point address");
    if (ok && address && block.len != (Py_ssize_t)sizeof(dispatcher_gemm_args))
        PyErr_Format(PyExc_ValueError, "an argument block of %zd bytes, not %zu", block.len,
                     sizeof(dispatcher_gemm_args));
    if (ok && address && !PyErr_Occurred() && !PyArray_DescrCheck(out))
        PyErr_SetString(PyExc_TypeError, "out_dtype must be a numpy dtype");
    if (ok && address && !PyErr_Occurred() && !PyCallable_Check(check))
        PyErr_SetString(PyExc_TypeError, "check must be callable");
    if (PyErr_Occurred() || !ok) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a key of two (shape, strides, dtype) operands");
        PyBuffer_Release(&block);
        return NULL;
    }
    Launch* set = table[set_of(dtype, shape, strides)];
    Launch* l = NULL;
    for (int w = 0; w < WAYS && !l; ++w)
        if (set[w].dtype[0] && same(&set[w], dtype, shape, strides)) l = &set[w];
    for (int w = 0; w < WAYS && !l; ++w)
        if (!set[w].dtype[0]) l = &set[w];
    if (!l) { /* a full set: the oldest way goes, the others move down */
        empty(&set[WAYS - 1]);
        memmove(&set[1], &set[0], (WAYS - 1) * sizeof(Launch));
        memset(&set[0], 0, sizeof(Launch));
        l = &set[0];
    }
    empty(l);
    Py_INCREF(dtype[0]);
    Py_INCREF(dtype[1]);
    Py_INCREF(out);
    Py_INCREF(check);
    l->dtype[0] = dtype[0];
    l->dtype[1] = dtype[1];
    memcpy(l->shape, shape, sizeof shape);
    memcpy(l->strides, strides, sizeof strides);
    l->entry = (dispatcher_gemm_fn)address;
    memcpy(&l->block, block.buf, sizeof l->block);
    l->dims[0] = dims[0];
    l->dims[1] = dims[1];
    l->out = (PyArray_Descr*)out;
    l->check = check;
    PyBuffer_Release(&block);
    Py_RETURN_NONE;
}

/* clear(): forget every learned call (a plugin registration may change
 * what selection chooses). */
static PyObject* clear(PyObject* self, PyObject* unused) {
    for (int s = 0; s < SETS; ++s)
        for (int w = 0; w < WAYS; ++w) empty(&table[s][w]);
    Py_RETURN_NONE;
}

/* counts(): (calls run here, calls that went back to Python), since the module loaded. */
static PyObject* counts(PyObject* self, PyObject* unused) {
    return Py_BuildValue("(KK)", hits, misses);
}

static PyMethodDef methods[] = {
    {"call", (PyCFunction)(void (*)(void))call, METH_FASTCALL, "call(a, b): the result of a learned call, or None"},
    {"learn", learn, METH_VARARGS, "learn(key, entry, block, rows, cols, out_dtype, check)"},
    {"clear", clear, METH_NOARGS, "forget every learned call"},
    {"counts", counts, METH_NOARGS, "(calls run here, calls that went back to Python)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "dispatcher_numpy_calls", NULL, -1, methods};

PyMODINIT_FUNC PyInit_dispatcher_numpy_calls(void) {
    import_array();
    PyObject* m = PyModule_Create(&module);
    if (m && PyModule_AddIntConstant(m, "ARGS_BYTES", (long)sizeof(dispatcher_gemm_args)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
