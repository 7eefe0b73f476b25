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
 * A held plan (`dispatcher.plan`) calls its own `Launch`. The table of
 * `call` is set-associative, 4 ways: a kind of call pushed out of it goes
 * the Python way again until it is learned again.
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

/* A plan's launch: the calls it runs (both operands' shapes, strides and
 * dtype objects), the kernel's entry point, the plan's argument block with
 * its scalars and null pointers, the result's shape and dtype, and the
 * library's status check (it raises for a nonzero status). Callable:
 * launch(a, b) runs a call of its kind, and returns None for any other or
 * once `clear` has made it stale. */
typedef struct {
    PyObject_HEAD
    PyArray_Descr* dtype[2];
    npy_intp shape[2][2], strides[2][2];
    dispatcher_gemm_fn entry;
    dispatcher_gemm_args block;
    npy_intp dims[2];
    PyArray_Descr* out;
    PyObject* check;
    unsigned long long generation; /* `clear` calls before it was made */
} Launch;

static Launch* table[SETS][WAYS]; /* owned references; NULL: an empty way */
static unsigned long long hits, misses, generation;

typedef struct {
    PyArray_Descr* dtype[2];
    npy_intp shape[2][2], strides[2][2];
} Key;

/* The key of (a, b), where both are 2-D numpy arrays (not subclasses). */
static int key_of(PyObject* a, PyObject* b, Key* k) {
    if (!PyArray_CheckExact(a) || !PyArray_CheckExact(b)) return 0;
    PyArrayObject* x[2] = {(PyArrayObject*)a, (PyArrayObject*)b};
    for (int i = 0; i < 2; ++i) {
        if (PyArray_NDIM(x[i]) != 2) return 0;
        k->dtype[i] = PyArray_DESCR(x[i]);
        memcpy(k->shape[i], PyArray_DIMS(x[i]), sizeof k->shape[i]);
        memcpy(k->strides[i], PyArray_STRIDES(x[i]), sizeof k->strides[i]);
    }
    return 1;
}

static int same(const Launch* l, const Key* k) {
    return l->dtype[0] == k->dtype[0] && l->dtype[1] == k->dtype[1] && !memcmp(l->shape, k->shape, sizeof l->shape) &&
           !memcmp(l->strides, k->strides, sizeof l->strides);
}

static size_t set_of(const Key* k) {
    size_t h = 1469598103934665603ull;
    const size_t words[10] = {(size_t)k->dtype[0],     (size_t)k->dtype[1],     (size_t)k->shape[0][0],
                              (size_t)k->shape[0][1],  (size_t)k->shape[1][0],  (size_t)k->shape[1][1],
                              (size_t)k->strides[0][0], (size_t)k->strides[0][1], (size_t)k->strides[1][0],
                              (size_t)k->strides[1][1]};
    for (int i = 0; i < 10; ++i) h = (h ^ words[i]) * 1099511628211ull;
    return (size_t)(h ^ (h >> 29)) & (SETS - 1);
}

/* Run `l` on (a, b), whose key is its own: the new result, or NULL with the check's exception. */
static PyObject* run(Launch* l, PyObject* a, PyObject* b) {
    Py_INCREF(l); /* held until the kernel returns: another thread may drop it from the table meanwhile */
    Py_INCREF(l->out); /* PyArray_Empty takes a reference */
    PyObject* result = PyArray_Empty(2, l->dims, l->out, 0);
    if (!result) {
        Py_DECREF(l);
        return NULL;
    }
    dispatcher_gemm_args block = l->block;
    block.a = PyArray_DATA((PyArrayObject*)a);
    block.b = PyArray_DATA((PyArrayObject*)b);
    block.c = PyArray_DATA((PyArrayObject*)result);
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = l->entry(&block);
    Py_END_ALLOW_THREADS
    if (status != 0) {
        Py_XDECREF(PyObject_CallFunction(l->check, "i", status));
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_RuntimeError, "a gemm-dispatcher kernel failed with status %d", status);
        Py_CLEAR(result);
    }
    Py_DECREF(l);
    return result;
}

/* One operand's (shape, strides, dtype) of a Launch's key. */
static int read_spec(PyObject* spec, PyArray_Descr** dtype, npy_intp shape[2], npy_intp strides[2]) {
    PyObject *s, *t, *d;
    if (!PyTuple_Check(spec) || !PyArg_ParseTuple(spec, "OOO", &s, &t, &d)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "an operand's key is (shape, strides, dtype)");
        return 0;
    }
    if (!PyArray_DescrCheck(d)) {
        PyErr_SetString(PyExc_TypeError, "an operand's key ends with its numpy dtype");
        return 0;
    }
    if (!PyArg_ParseTuple(s, "nn", &shape[0], &shape[1]) || !PyArg_ParseTuple(t, "nn", &strides[0], &strides[1]))
        return 0;
    *dtype = (PyArray_Descr*)d;
    return 1;
}

/* Launch(key, entry, block, rows, cols, out_dtype, check): key is
 * ((shape, strides, dtype) of a, of b), as dispatcher.api.operands_key
 * gives; entry an address; block the argument block's bytes. */
static PyObject* Launch_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
    PyObject *key, *entry, *out, *check;
    Py_buffer block;
    npy_intp dims[2];
    if (kwargs && PyDict_Size(kwargs)) {
        PyErr_SetString(PyExc_TypeError, "Launch takes positional arguments only");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O!Oy*nnOO", &PyTuple_Type, &key, &entry, &block, &dims[0], &dims[1], &out, &check))
        return NULL;
    Key k;
    void* address = NULL;
    if (PyTuple_GET_SIZE(key) != 2)
        PyErr_SetString(PyExc_ValueError, "a key of two (shape, strides, dtype) operands");
    else if (read_spec(PyTuple_GET_ITEM(key, 0), &k.dtype[0], k.shape[0], k.strides[0]) &&
             read_spec(PyTuple_GET_ITEM(key, 1), &k.dtype[1], k.shape[1], k.strides[1])) {
        address = PyLong_AsVoidPtr(entry);
        if (!address && !PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "no entry point address");
        else if (address && block.len != (Py_ssize_t)sizeof(dispatcher_gemm_args))
            PyErr_Format(PyExc_ValueError, "an argument block of %zd bytes, not %zu", block.len,
                         sizeof(dispatcher_gemm_args));
        else if (address && !PyArray_DescrCheck(out))
            PyErr_SetString(PyExc_TypeError, "out_dtype must be a numpy dtype");
        else if (address && !PyCallable_Check(check))
            PyErr_SetString(PyExc_TypeError, "check must be callable");
    }
    Launch* l = PyErr_Occurred() ? NULL : (Launch*)type->tp_alloc(type, 0);
    if (l) {
        for (int i = 0; i < 2; ++i) {
            Py_INCREF(k.dtype[i]);
            l->dtype[i] = k.dtype[i];
        }
        memcpy(l->shape, k.shape, sizeof k.shape);
        memcpy(l->strides, k.strides, sizeof k.strides);
        l->entry = (dispatcher_gemm_fn)address;
        memcpy(&l->block, block.buf, sizeof l->block);
        l->dims[0] = dims[0];
        l->dims[1] = dims[1];
        Py_INCREF(out);
        l->out = (PyArray_Descr*)out;
        Py_INCREF(check);
        l->check = check;
        l->generation = generation;
    }
    PyBuffer_Release(&block);
    return (PyObject*)l;
}

static void Launch_dealloc(Launch* l) {
    Py_XDECREF(l->dtype[0]);
    Py_XDECREF(l->dtype[1]);
    Py_XDECREF(l->out);
    Py_XDECREF(l->check);
    Py_TYPE(l)->tp_free((PyObject*)l);
}

static PyObject* Launch_call(PyObject* self, PyObject* args, PyObject* kwargs) {
    Launch* l = (Launch*)self;
    Key k;
    if (kwargs || PyTuple_GET_SIZE(args) != 2 || l->generation != generation ||
        !key_of(PyTuple_GET_ITEM(args, 0), PyTuple_GET_ITEM(args, 1), &k) || !same(l, &k))
        Py_RETURN_NONE;
    return run(l, PyTuple_GET_ITEM(args, 0), PyTuple_GET_ITEM(args, 1));
}

static PyObject* Launch_current(PyObject* self, void* unused) {
    return PyBool_FromLong(((Launch*)self)->generation == generation);
}

static PyGetSetDef Launch_getset[] = {
    {"current", Launch_current, NULL, "False once `clear` has made it stale", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject LaunchType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dispatcher_numpy_calls.Launch",
    .tp_basicsize = sizeof(Launch),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Launch(key, entry, block, rows, cols, out_dtype, check): a plan's launch; launch(a, b) runs a "
              "call of its kind, else returns None",
    .tp_new = Launch_new,
    .tp_dealloc = (destructor)Launch_dealloc,
    .tp_call = Launch_call,
    .tp_getset = Launch_getset,
};

/* call(a, b): the result of a kind of call the table holds, or None. */
static PyObject* call(PyObject* self, PyObject* const* args, Py_ssize_t count) {
    Key k;
    if (count != 2 || !key_of(args[0], args[1], &k)) Py_RETURN_NONE;
    Launch** set = table[set_of(&k)];
    for (int w = 0; w < WAYS && set[w]; ++w)
        if (same(set[w], &k)) {
            ++hits;
            return run(set[w], args[0], args[1]);
        }
    ++misses;
    Py_RETURN_NONE;
}

/* learn(launch): `call` runs the calls of its kind with it, unless it is
 * stale (a registration came between its plan's check and now). A full
 * set drops its oldest way. */
static PyObject* learn(PyObject* self, PyObject* launch) {
    if (!PyObject_TypeCheck(launch, &LaunchType)) {
        PyErr_SetString(PyExc_TypeError, "learn takes a Launch");
        return NULL;
    }
    Launch* l = (Launch*)launch;
    if (l->generation != generation) Py_RETURN_NONE;
    Key k;
    memcpy(k.dtype, l->dtype, sizeof k.dtype);
    memcpy(k.shape, l->shape, sizeof k.shape);
    memcpy(k.strides, l->strides, sizeof k.strides);
    Launch** set = table[set_of(&k)];
    int w = 0;
    while (w < WAYS - 1 && set[w] && !same(set[w], &k)) ++w;
    Launch* gone = set[w];
    memmove(&set[1], &set[0], w * sizeof(Launch*)); /* the new one first, the others after it in their order */
    Py_INCREF(l);
    set[0] = l;
    Py_XDECREF(gone);
    Py_RETURN_NONE;
}

/* clear(): forget every learned launch and make every Launch stale (a
 * plugin registration may change what selection chooses). */
static PyObject* clear(PyObject* self, PyObject* unused) {
    ++generation;
    for (int s = 0; s < SETS; ++s)
        for (int w = 0; w < WAYS; ++w) Py_CLEAR(table[s][w]);
    Py_RETURN_NONE;
}

/* counts(): (calls `call` ran, calls it sent back to Python), since the module loaded. */
static PyObject* counts(PyObject* self, PyObject* unused) {
    return Py_BuildValue("(KK)", hits, misses);
}

static PyMethodDef methods[] = {
    {"call", (PyCFunction)(void (*)(void))call, METH_FASTCALL, "call(a, b): the result of a learned call, or None"},
    {"learn", learn, METH_O, "learn(launch): call runs the calls of its kind with it"},
    {"clear", clear, METH_NOARGS, "forget every learned launch, and make every Launch stale"},
    {"counts", counts, METH_NOARGS, "(calls run here, calls that went back to Python)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "dispatcher_numpy_calls", NULL, -1, methods};

PyMODINIT_FUNC PyInit_dispatcher_numpy_calls(void) {
    import_array();
    if (PyType_Ready(&LaunchType) < 0) return NULL;
    PyObject* m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&LaunchType);
    if (PyModule_AddObject(m, "Launch", (PyObject*)&LaunchType) < 0 ||
        PyModule_AddIntConstant(m, "ARGS_BYTES", (long)sizeof(dispatcher_gemm_args)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
