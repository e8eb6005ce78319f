/* _trfast: HotTier.search's fast path, a CPython extension around tr_client_search (same protocol as libtrclient).
 *
 * Through ctypes a one-query search pays microseconds of Python above the bare call: checks, a per-thread scratch,
 * struct fields set one by one, two result copies. Through this module most of that goes. One call checks
 * the arguments (numpy's C API: dtype, shape, contiguity), allocates the result arrays, reads the query straight
 * from the caller's array, writes the results straight into the new arrays (the GIL released while it waits)
 * and returns the SearchResult. Anything it does not take (wrong dtype, shape, k, a
 * namespace that is not an int, a batch too large for a slot) returns None, and Python's own path raises the
 * error that names the fix; a failed call returns (rc, status, message) for Python to raise: the messages
 * live in one place. numpy's C API, not the buffer protocol: exporting the buffer of a new array (numpy builds
 * its shape and format for it) cost more than allocating the array.
 */
#define PY_SSIZE_T_CLEAN
/* The stable ABI of Python 3.10: one build of this module serves Python 3.10 and every later version (the wheel is
 * tagged cp310-abi3). */
#ifndef Py_LIMITED_API /* CMake's USE_SABI 3.10 defines it too */
#define Py_LIMITED_API 0x030A0000
#endif
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_22_API_VERSION
#include <numpy/arrayobject.h>

#include <time.h>

#include "tiered_recall/client.h"

int tr_client_search(const tr_search_call *c); /* client.c, compiled into this module */

typedef struct {
    PyObject_HEAD
    void *base;
    int32_t pid;
    uint32_t dim, max_k, max_search_queries;
    uint64_t payload_bytes;
    int64_t timeout_ns, spin_ns, yield_ns;
    PyObject *result_type; /* sidecar.SearchResult */
    /* where result_type keeps ids, scores, hits and service_ns (its __slots__), when it is a class with those four
     * object slots: the result is then built in place, without calling the class (its argument tuple, the call
     * and __init__'s frame cost about twice the bare allocation); all 0: called */
    Py_ssize_t result_slots[4];
    int inflight;          /* searches inside the segment now, and ... */
    int closed;            /* ... set by close(): no search enters after it (seq_cst on both: either a search sees
                            * closed, or close() sees it in flight and waits) */
} FastClient; /* HotTier closes it, and waits, before it unmaps the segment at base */

/* Where instances of `type` keep each of the four names' values, found by observation: the stable ABI (this module
 * is built for it, so one build serves every Python from 3.10) hides member descriptors' offsets, so a probe
 * instance gets a fresh object set through each name and its memory is searched for that object. Fills offsets
 * and returns 1 only when every name is a plain object slot of the instance (no __dict__ behind it, no property,
 * value read back intact); else 0, and the caller calls the class instead. */
static int find_object_slots(PyObject *type, const char *const names[4], Py_ssize_t offsets[4]) {
    PyObject *size_obj = PyObject_GetAttrString(type, "__basicsize__");
    const Py_ssize_t size = size_obj ? PyLong_AsSsize_t(size_obj) : -1;
    Py_XDECREF(size_obj);
    allocfunc alloc = (allocfunc)PyType_GetSlot((PyTypeObject *)type, Py_tp_alloc);
    PyObject *probe = size > 0 && alloc ? alloc((PyTypeObject *)type, 0) : NULL;
    int found = probe != NULL;
    for (int i = 0; found && i < 4; i++) {
        PyObject *marker = PyList_New(0); /* a new object: its address appears nowhere else in the probe */
        found = marker && PyObject_SetAttrString(probe, names[i], marker) == 0;
        offsets[i] = 0;
        for (Py_ssize_t at = (Py_ssize_t)sizeof(PyObject); found && at + (Py_ssize_t)sizeof(PyObject *) <= size;
             at += (Py_ssize_t)sizeof(PyObject *))
            if (*(PyObject **)((char *)probe + at) == marker) offsets[i] = at;
        found = found && offsets[i] > 0;
        Py_XDECREF(marker);
    }
    Py_XDECREF(probe);
    PyErr_Clear();
    return found;
}

static int FastClient_init(PyObject *self_obj, PyObject *args, PyObject *kwargs) {
    FastClient *self = (FastClient *)self_obj;
    unsigned long long base;
    int pid;
    long long timeout_ns, spin_ns, yield_ns;
    PyObject *result_type;
    static char *keywords[] = {"base", "pid", "timeout_ns", "spin_ns", "yield_ns", "result_type", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KiLLLO", keywords, &base, &pid, &timeout_ns, &spin_ns,
                                     &yield_ns, &result_type))
        return -1;
    if (!PyCallable_Check(result_type)) {
        PyErr_SetString(PyExc_TypeError, "result_type must be callable as result_type(ids, scores, hits, service_ns)");
        return -1;
    }
    if (!base) {
        PyErr_SetString(PyExc_ValueError, "base must be the address of a mapped segment");
        return -1;
    }
    const tr_header *h = (const tr_header *)(uintptr_t)base;
    self->base = (void *)(uintptr_t)base;
    self->pid = pid;
    self->dim = h->dim;
    self->max_k = h->max_k;
    self->max_search_queries = h->max_search_queries;
    self->payload_bytes = h->slot_payload_bytes;
    self->timeout_ns = timeout_ns;
    self->spin_ns = spin_ns;
    self->yield_ns = yield_ns;
    PyObject *old = self->result_type; /* __init__ may run again */
    Py_INCREF(result_type);
    self->result_type = result_type;
    Py_XDECREF(old);
    static const char *const slot_names[4] = {"ids", "scores", "hits", "service_ns"};
    if (!PyType_Check(result_type) || !find_object_slots(result_type, slot_names, self->result_slots))
        memset(self->result_slots, 0, sizeof self->result_slots);
    return 0;
}

static void FastClient_dealloc(PyObject *self_obj) {
    FastClient *self = (FastClient *)self_obj;
    PyTypeObject *type = Py_TYPE(self_obj);
    Py_CLEAR(self->result_type);
    freefunc tp_free = (freefunc)PyType_GetSlot(type, Py_tp_free);
    tp_free(self_obj);
    Py_DECREF(type); /* a heap type's instances hold a reference to it */
}

/* search(queries, k, normalize, touch, namespace_hash) -> SearchResult; (rc, status, message) when the call
 * failed; None when the arguments are not for this path (Python's own path then checks them and says what is
 * wrong). */
static PyObject *FastClient_search(PyObject *self_obj, PyObject *const *args, Py_ssize_t nargs) {
    FastClient *self = (FastClient *)self_obj;
    if (!self->base) {
        PyErr_SetString(PyExc_RuntimeError, "FastClient was not initialised");
        return NULL;
    }
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "search(queries, k, normalize, touch, namespace_hash) takes 5 arguments");
        return NULL;
    }
    if (!PyLong_Check(args[1]) || (args[4] != Py_None && !PyLong_Check(args[4]))) Py_RETURN_NONE;
    const long k = PyLong_AsLong(args[1]);
    if (k == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (k < 1 || (unsigned long)k > self->max_k) Py_RETURN_NONE;
    const int normalize = PyObject_IsTrue(args[2]), touch = PyObject_IsTrue(args[3]);
    if (normalize < 0 || touch < 0) return NULL;
    uint32_t flags = (normalize ? TR_FLAG_NORMALIZE : 0u) | (touch ? 0u : TR_FLAG_NO_TOUCH);
    unsigned long long ns_hash = 0;
    if (args[4] != Py_None) {
        flags |= TR_FLAG_NS_FILTER;
        ns_hash = PyLong_AsUnsignedLongLongMask(args[4]); /* as int(h) & (2**64 - 1) */
        if (ns_hash == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    }

    if (!PyArray_Check(args[0])) Py_RETURN_NONE;
    PyArrayObject *q = (PyArrayObject *)args[0];
    const int ndim = PyArray_NDIM(q);
    /* float32 in this machine's byte order, C-contiguous and aligned */
    if (PyArray_TYPE(q) != NPY_FLOAT32 || !PyArray_ISCARRAY_RO(q) || (ndim != 1 && ndim != 2) ||
        PyArray_DIM(q, ndim - 1) != (npy_intp)self->dim)
        Py_RETURN_NONE;
    const npy_intp nq = ndim == 1 ? 1 : PyArray_DIM(q, 0);
    /* one query with any valid k always fits (HotTier checks it at attach) */
    if (nq < 1 || (nq > 1 && ((uint64_t)nq > self->max_search_queries ||
                              TR_SEARCH_BYTES(nq, self->dim, k) > self->payload_bytes)))
        Py_RETURN_NONE;

    npy_intp shape[2] = {nq, k};
    PyObject *ids = PyArray_SimpleNew(2, shape, NPY_INT64);
    if (!ids) return NULL;
    PyObject *scores = PyArray_SimpleNew(2, shape, NPY_FLOAT32);
    if (!scores) {
        Py_DECREF(ids);
        return NULL;
    }
    __atomic_add_fetch(&self->inflight, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&self->closed, __ATOMIC_SEQ_CST)) { /* closing: never touch the segment again */
        __atomic_sub_fetch(&self->inflight, 1, __ATOMIC_SEQ_CST);
        Py_DECREF(ids);
        Py_DECREF(scores);
        Py_RETURN_NONE;
    }
    tr_call_result result;
    const tr_search_call call = {
        .base = self->base, .queries = (const float *)PyArray_DATA(q),
        .ids = (int64_t *)PyArray_DATA((PyArrayObject *)ids),
        .scores = (float *)PyArray_DATA((PyArrayObject *)scores), .result = &result, .timeout_ns = self->timeout_ns,
        .spin_ns = self->spin_ns, .yield_ns = self->yield_ns, .ns_hash = ns_hash, .pid = self->pid,
        .flags = flags, .k = (uint32_t)k, .nq = (uint32_t)nq,
    };
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = tr_client_search(&call);
    Py_END_ALLOW_THREADS
    __atomic_sub_fetch(&self->inflight, 1, __ATOMIC_SEQ_CST);
    if (rc != TR_CALL_OK || result.status != TR_OK) {
        Py_DECREF(ids);
        Py_DECREF(scores);
        if (rc != TR_CALL_OK) return Py_BuildValue("(iiy)", rc, 0, "");
        result.message[TR_MESSAGE_BYTES - 1] = '\0';
        return Py_BuildValue("(iiy)", rc, result.status, result.message);
    }
    if (!self->result_slots[0]) /* "N" hands the arrays' references over */
        return PyObject_CallFunction(self->result_type, "NNIK", ids, scores, result.reply_count,
                                     (unsigned long long)result.service_ns);
    PyObject *fields[4] = {ids, scores, PyLong_FromUnsignedLong(result.reply_count),
                           PyLong_FromUnsignedLongLong((unsigned long long)result.service_ns)};
    PyTypeObject *type = (PyTypeObject *)self->result_type;
    allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
    PyObject *answer = fields[2] && fields[3] ? alloc(type, 0) : NULL;
    if (!answer) {
        for (int i = 0; i < 4; i++) Py_XDECREF(fields[i]);
        return NULL;
    }
    for (int i = 0; i < 4; i++) *(PyObject **)((char *)answer + self->result_slots[i]) = fields[i]; /* owned */
    return answer;
}

/* close(timeout_s) -> bool: no search enters after this; waits (GIL released) until none is inside the segment,
 * at most timeout_s. True when none is. */
static PyObject *FastClient_close(PyObject *self_obj, PyObject *arg) {
    FastClient *self = (FastClient *)self_obj;
    const double timeout_s = PyFloat_AsDouble(arg);
    if (timeout_s == -1.0 && PyErr_Occurred()) return NULL;
    __atomic_store_n(&self->closed, 1, __ATOMIC_SEQ_CST);
    int drained;
    Py_BEGIN_ALLOW_THREADS
    struct timespec nap = {0, 50 * 1000};
    double waited = 0;
    while (!(drained = __atomic_load_n(&self->inflight, __ATOMIC_SEQ_CST) == 0) && waited < timeout_s) {
        nanosleep(&nap, NULL);
        waited += 50e-6;
    }
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(drained);
}

static PyMethodDef FastClient_methods[] = {
    {"search", (PyCFunction)(void (*)(void))FastClient_search, METH_FASTCALL,
     "search(queries, k, normalize, touch, namespace_hash): a SearchResult, (rc, status, message) when the call "
     "failed, or None when the arguments need Python's checks (or the client is closed)"},
    {"close", FastClient_close, METH_O,
     "close(timeout_s): no search enters after it; waits until none is inside the segment (at most timeout_s); "
     "True when none is"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot FastClient_slots[] = {
    {Py_tp_doc, "One attachment's search fast path: FastClient(base, pid, timeout_ns, spin_ns, yield_ns, "
                "result_type)."},
    {Py_tp_init, FastClient_init},
    {Py_tp_dealloc, FastClient_dealloc},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_methods, FastClient_methods},
    {0, NULL},
};

static PyType_Spec FastClient_spec = {
    "tiered_recall._trfast.FastClient", sizeof(FastClient), 0, Py_TPFLAGS_DEFAULT, FastClient_slots,
};

static int module_exec(PyObject *module) {
    import_array1(-1);
    PyObject *type = PyType_FromSpec(&FastClient_spec);
    if (!type) return -1;
    if (PyModule_AddObject(module, "FastClient", type) != 0) {
        Py_DECREF(type);
        return -1;
    }
    if (PyModule_AddIntConstant(module, "LAYOUT_VERSION", TR_LAYOUT_VERSION) != 0) return -1;
    /* what FastClient offers; tiered_recall._native.FAST_SEARCH_API must match (a stale build is not used) */
    return PyModule_AddIntConstant(module, "API", 2);
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_trfast", "HotTier.search's fast path (see native/src/fastsearch.c).", 0, NULL,
    module_slots, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__trfast(void) { return PyModuleDef_Init(&module_def); }
