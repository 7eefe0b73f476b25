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
 * A call with an output given (`gemm(a, b, out=out)`, `matmul(a, b, out=out)`
 * or a held plan's `plan(a, b, out=out)`) has its own launches, keyed by all three
 * arrays: `call(a, b, out)` writes into `out` where it is writable, aligned
 * and apart from both operands' memory; anything else goes the Python way,
 * which says what is wrong with it.
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

/* What a launch runs: the operands' (a, b and the output given, if any)
 * shapes, strides and dtype objects. */
typedef struct {
    int count; /* 2, or 3 with the output */
    PyArray_Descr* dtype[3];
    npy_intp shape[3][2], strides[3][2];
} Key;

/* A plan's launch: the calls it runs (its key), the kernel's entry point,
 * the plan's argument block with its scalars and null pointers, the
 * result's shape and dtype, and the library's status check (it raises for
 * a nonzero status). Callable: launch(a, b) or launch(a, b, out) runs a
 * call of its kind, and returns None for any other or once `clear` has
 * made it stale. */
typedef struct {
    PyObject_HEAD
    Key key;
    dispatcher_gemm_fn entry;
    dispatcher_gemm_args block;
    npy_intp dims[2];
    PyArray_Descr* out;
    PyObject* check;
    unsigned long long generation; /* `clear` calls before it was made */
} Launch;

static Launch* table[SETS][WAYS]; /* owned references; NULL: an empty way */
static unsigned long long hits, misses, generation;

/* The key of args[0..count), where they are 2 or 3 two-dimensional numpy arrays (not subclasses). */
static int key_of(PyObject* const* args, Py_ssize_t count, Key* k) {
    if (count != 2 && count != 3) return 0;
    k->count = (int)count;
    for (int i = 0; i < count; ++i) {
        if (!PyArray_CheckExact(args[i])) return 0;
        PyArrayObject* x = (PyArrayObject*)args[i];
        if (PyArray_NDIM(x) != 2) return 0;
        k->dtype[i] = PyArray_DESCR(x);
        memcpy(k->shape[i], PyArray_DIMS(x), sizeof k->shape[i]);
        memcpy(k->strides[i], PyArray_STRIDES(x), sizeof k->strides[i]);
    }
    return 1;
}

static int same(const Key* l, const Key* k) {
    if (l->count != k->count) return 0;
    for (int i = 0; i < k->count; ++i)
        if (l->dtype[i] != k->dtype[i] || memcmp(l->shape[i], k->shape[i], sizeof k->shape[i]) ||
            memcmp(l->strides[i], k->strides[i], sizeof k->strides[i]))
            return 0;
    return 1;
}

static size_t set_of(const Key* k) {
    size_t h = 1469598103934665603ull;
    for (int i = 0; i < k->count; ++i) {
        const size_t words[5] = {(size_t)k->dtype[i], (size_t)k->shape[i][0], (size_t)k->shape[i][1],
                                 (size_t)k->strides[i][0], (size_t)k->strides[i][1]};
        for (int j = 0; j < 5; ++j) h = (h ^ words[j]) * 1099511628211ull;
    }
    return (size_t)(h ^ (h >> 29)) & (SETS - 1);
}

/* The bytes an array's elements span, [*low, *high); an empty array spans none. */
static void extent(PyArrayObject* x, char** low, char** high) {
    char* data = PyArray_BYTES(x);
    *low = *high = data;
    npy_intp lo = 0, hi = PyArray_ITEMSIZE(x);
    for (int i = 0; i < PyArray_NDIM(x); ++i) {
        npy_intp d = PyArray_DIM(x, i), step = PyArray_STRIDE(x, i);
        if (d == 0) return;
        if (step < 0) lo += (d - 1) * step;
        else hi += (d - 1) * step;
    }
    *low = data + lo;
    *high = data + hi;
}

/* Whether the kernel may write `out` here: writable, aligned, and its bytes
 * apart from both operands' (bounds only: where they interleave without
 * sharing an element, the Python way decides). */
static int writable_apart(PyArrayObject* out, PyObject* a, PyObject* b) {
    if (!PyArray_ISWRITEABLE(out) || !PyArray_ISALIGNED(out)) return 0;
    char *lo, *hi;
    extent(out, &lo, &hi);
    if (lo == hi) return 1;
    PyObject* inputs[2] = {a, b};
    for (int i = 0; i < 2; ++i) {
        char *xlo, *xhi;
        extent((PyArrayObject*)inputs[i], &xlo, &xhi);
        if (xlo < hi && lo < xhi) return 0;
    }
    return 1;
}

/* Run `l` on args (a, b, and the output given where its key has one), whose
 * key is its own: the result, None for an output the Python way must check,
 * or NULL with the check's exception. */
static PyObject* run(Launch* l, PyObject* const* args) {
    PyObject *a = args[0], *b = args[1], *result;
    if (l->key.count == 3) {
        if (!writable_apart((PyArrayObject*)args[2], a, b)) Py_RETURN_NONE;
        result = args[2];
        Py_INCREF(result);
    } else {
        Py_INCREF(l->out); /* PyArray_Empty takes a reference */
        result = PyArray_Empty(2, l->dims, l->out, 0);
        if (!result) return NULL;
    }
    Py_INCREF(l); /* held until the kernel returns: another thread may drop it from the table meanwhile */
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
 * ((shape, strides, dtype) of a, of b[, of the output given]), as
 * dispatcher.api.operands_key gives; entry an address; block the argument
 * block's bytes. */
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
    k.count = (int)PyTuple_GET_SIZE(key);
    void* address = NULL;
    if (k.count != 2 && k.count != 3)
        PyErr_SetString(PyExc_ValueError, "a key of two or three (shape, strides, dtype) operands");
    else {
        int read = 1;
        for (int i = 0; i < k.count && read; ++i)
            read = read_spec(PyTuple_GET_ITEM(key, i), &k.dtype[i], k.shape[i], k.strides[i]);
        if (read) {
            address = PyLong_AsVoidPtr(entry);
            if (!address && !PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "no entry point address");
            else if (address && block.len != (Py_ssize_t)sizeof(dispatcher_gemm_args))
                PyErr_Format(PyExc_ValueError, "an argument block of %zd bytes, not %zu", block.len,
                             sizeof(dispatcher_gemm_args));
            else if (address && !PyArray_DescrCheck(out))
                PyErr_SetString(PyExc_TypeError, "out_dtype must be a numpy dtype");
            else if (address && !PyCallable_Check(check))
                PyErr_SetString(PyExc_TypeError, "check must be callable");
            else if (address && k.count == 3 && (k.shape[2][0] != dims[0] || k.shape[2][1] != dims[1] ||
                                                 (PyObject*)k.dtype[2] != out))
                PyErr_SetString(PyExc_ValueError, "the output's key must have the result's shape and dtype");
        }
    }
    Launch* l = PyErr_Occurred() ? NULL : (Launch*)type->tp_alloc(type, 0);
    if (l) {
        for (int i = 0; i < k.count; ++i) Py_INCREF(k.dtype[i]);
        l->key = k;
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
    for (int i = 0; i < l->key.count; ++i) Py_XDECREF(l->key.dtype[i]);
    Py_XDECREF(l->out);
    Py_XDECREF(l->check);
    Py_TYPE(l)->tp_free((PyObject*)l);
}

static PyObject* Launch_call(PyObject* self, PyObject* args, PyObject* kwargs) {
    Launch* l = (Launch*)self;
    Key k;
    PyObject* const* items = &PyTuple_GET_ITEM(args, 0);
    if (kwargs || l->generation != generation || !key_of(items, PyTuple_GET_SIZE(args), &k) || !same(&l->key, &k))
        Py_RETURN_NONE;
    return run(l, items);
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
    .tp_doc = "Launch(key, entry, block, rows, cols, out_dtype, check): a plan's launch; launch(a, b) or "
              "launch(a, b, out) runs a call of its kind, else returns None",
    .tp_new = Launch_new,
    .tp_dealloc = (destructor)Launch_dealloc,
    .tp_call = Launch_call,
    .tp_getset = Launch_getset,
};

/* call(a, b) or call(a, b, out): the result of a kind of call the table holds, or None. */
static PyObject* call(PyObject* self, PyObject* const* args, Py_ssize_t count) {
    Key k;
    if (!key_of(args, count, &k)) Py_RETURN_NONE;
    Launch** set = table[set_of(&k)];
    for (int w = 0; w < WAYS && set[w]; ++w)
        if (same(&set[w]->key, &k)) {
            ++hits;
            return run(set[w], args);
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
    Launch** set = table[set_of(&l->key)];
    int w = 0;
    while (w < WAYS - 1 && set[w] && !same(&set[w]->key, &l->key)) ++w;
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
    {"call", (PyCFunction)(void (*)(void))call, METH_FASTCALL,
     "call(a, b) or call(a, b, out): the result of a learned call, or None"},
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
