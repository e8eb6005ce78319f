/* _trstages: the coordinator's per-search loops, compiled: the retrieval stages' per-candidate work over a pool
 * (tiered_recall/coordinator/stages.py), the placement's count of a search's uses (coordinator/placement.py), the
 * hits of a hot answer (coordinator/records.py's hit_of) and the query's unit vector (coordinator/validate.py).
 *
 * rank_pool's Python reads each pooled memory's features one by one: a set lookup per question word and memory, a
 * dict of places and two lookups per memory for its neighbours. Those loops, the score arithmetic that IEEE 754 fixes
 * exactly (scaling, additions, products, maxima) and the stable ordering are done here; what numpy might compute
 * otherwise than plain C does (log1p of the word weights, the matrix product, a sum) stays in numpy, so a ranking
 * and its scores are bit for bit those of the Python path (tests/coordinator/test_stages_identical.py compares both
 * with the reference on every dev question). */
#define PY_SSIZE_T_CLEAN
#ifndef Py_LIMITED_API /* CMake's USE_SABI 3.10 defines it too */
#define Py_LIMITED_API 0x030A0000
#endif
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_22_API_VERSION
#include <numpy/arrayobject.h>

#include <math.h>
#include <stdlib.h>

/* A TurnFeatures tuple's fields (stages.TurnFeatures: terms, timed, place, before, after). */
enum { F_TERMS, F_TIMED, F_PLACE, F_BEFORE, F_AFTER, F_COUNT };

/* The rows of the pool by place number: open addressing over a power-of-two table of at least twice the pool. */
typedef struct {
    long long *keys;
    Py_ssize_t *rows; /* -1: empty */
    size_t mask;
} place_table;

static size_t place_slot(long long key, size_t mask) {
    unsigned long long x = (unsigned long long)key + 0x9E3779B97F4A7C15ull; /* splitmix64's finaliser */
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return (size_t)(x ^ (x >> 31)) & mask;
}

static void place_put(place_table *t, long long key, Py_ssize_t row) {
    size_t at = place_slot(key, t->mask);
    while (t->rows[at] >= 0 && t->keys[at] != key) at = (at + 1) & t->mask;
    t->keys[at] = key;
    t->rows[at] = row; /* a later row replaces an earlier */
}

static Py_ssize_t place_get(const place_table *t, long long key, Py_ssize_t missing) {
    for (size_t at = place_slot(key, t->mask); t->rows[at] >= 0; at = (at + 1) & t->mask)
        if (t->keys[at] == key) return t->rows[at];
    return missing;
}

/* pool_lookups(features, words) -> (holds, neighbours, timed)
 * holds: bool (len(words), len(features)), C order: whether each memory's terms hold a word; the caller takes its
 * transpose, the layout the Python path's matrix product reads (a product over another layout may sum in another
 * order). neighbours: intp (2, len(features)): the pool row of the turn before and of the turn after each memory
 * (place numbers: the later row where a place is pooled twice), len(features) where it is not pooled.
 * timed: bool (len(features),). */
static PyObject *pool_lookups(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 2 || !PyList_Check(args[0]) || !PyTuple_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "pool_lookups(features: list, words: tuple)");
        return NULL;
    }
    PyObject *features = args[0], *words = args[1];
    const Py_ssize_t count = PyList_Size(features), width = PyTuple_Size(words);
    npy_intp holds_shape[2] = {width, count}, neighbours_shape[2] = {2, count}, timed_shape[1] = {count};
    PyObject *holds = PyArray_SimpleNew(2, holds_shape, NPY_BOOL);
    PyObject *neighbours = PyArray_SimpleNew(2, neighbours_shape, NPY_INTP);
    PyObject *timed = PyArray_SimpleNew(1, timed_shape, NPY_BOOL);
    size_t slots = 8;
    while (slots < 2 * (size_t)count) slots *= 2;
    place_table table = {PyMem_Malloc(slots * sizeof(long long)), PyMem_Malloc(slots * sizeof(Py_ssize_t)),
                         slots - 1};
    long long *sides = PyMem_Malloc(2 * (size_t)(count ? count : 1) * sizeof(long long)); /* before, after */
    PyObject *result = NULL;
    if (!holds || !neighbours || !timed) goto done;
    if (!table.keys || !table.rows || !sides) {
        PyErr_NoMemory();
        goto done;
    }
    for (size_t at = 0; at < slots; at++) table.rows[at] = -1;
    npy_bool *hold = (npy_bool *)PyArray_DATA((PyArrayObject *)holds);
    npy_intp *before = (npy_intp *)PyArray_DATA((PyArrayObject *)neighbours), *after = before + count;
    npy_bool *is_timed = (npy_bool *)PyArray_DATA((PyArrayObject *)timed);
    for (Py_ssize_t row = 0; row < count; row++) {
        PyObject *item = PyList_GetItem(features, row); /* borrowed */
        if (!PyTuple_Check(item) || PyTuple_Size(item) < F_COUNT) {
            PyErr_SetString(PyExc_TypeError, "pool_lookups: features must be TurnFeatures tuples");
            goto done;
        }
        PyObject *terms = PyTuple_GetItem(item, F_TERMS);
        const int frozen = PyFrozenSet_Check(terms);
        for (Py_ssize_t column = 0; column < width; column++) {
            PyObject *word = PyTuple_GetItem(words, column);
            const int holds_word = frozen ? PySet_Contains(terms, word) : PySequence_Contains(terms, word);
            if (holds_word < 0) goto done;
            hold[column * count + row] = (npy_bool)holds_word;
        }
        const int truth = PyObject_IsTrue(PyTuple_GetItem(item, F_TIMED));
        if (truth < 0) goto done;
        is_timed[row] = (npy_bool)truth;
        const long long place = PyLong_AsLongLong(PyTuple_GetItem(item, F_PLACE));
        sides[2 * row] = PyLong_AsLongLong(PyTuple_GetItem(item, F_BEFORE));
        sides[2 * row + 1] = PyLong_AsLongLong(PyTuple_GetItem(item, F_AFTER));
        if (PyErr_Occurred()) goto done; /* a place that is not an int: TypeError, or OverflowError */
        place_put(&table, place, row);
    }
    for (Py_ssize_t row = 0; row < count; row++) {
        before[row] = (npy_intp)place_get(&table, sides[2 * row], count);
        after[row] = (npy_intp)place_get(&table, sides[2 * row + 1], count);
    }
    result = PyTuple_Pack(3, holds, neighbours, timed);
done:
    PyMem_Free(table.keys);
    PyMem_Free(table.rows);
    PyMem_Free(sides);
    Py_XDECREF(holds);
    Py_XDECREF(neighbours);
    Py_XDECREF(timed);
    return result;
}

/* numpy's maximum and minimum: a NaN in either operand is the result */
static double np_maximum(double a, double b) { return (a >= b || a != a) ? a : b; }
static double np_minimum(double a, double b) { return (a <= b || a != a) ? a : b; }

/* The data of a C-contiguous 1-D numpy array of dtype type, of length elements (any length where length < 0) and
 * writeable where asked; else NULL with the TypeError "function: name must be what". */
static void *column_data(PyObject *array, int type, Py_ssize_t length, int writeable, const char *function,
                         const char *name, const char *what) {
    PyArrayObject *column = (PyArrayObject *)array;
    if (!PyArray_Check(array) || PyArray_TYPE(column) != type || PyArray_NDIM(column) != 1 ||
        (length >= 0 && PyArray_DIM(column, 0) != length) || !PyArray_IS_C_CONTIGUOUS(column) ||
        (writeable && !PyArray_ISWRITEABLE(column))) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be %s", function, name, what);
        return NULL;
    }
    return PyArray_DATA(column);
}

/* pool_adjusted(pool_scores, keyword, keyword_weight, neighbours, neighbour_weight, timed, temporal_weight)
 *   -> float64 (len(pool_scores),)
 * What rank_pool's numpy computes before it orders the pool: the pool's scores scaled to [0, 1] (all 1 when they
 * span nothing), plus keyword_weight * keyword (None: nothing), plus neighbour_weight times how much the better
 * pooled neighbour (pool_lookups' rows; None: nothing) scores above the memory, plus temporal_weight where timed
 * (None: nothing). Each operation in numpy's order, so each rounding is the same. */
static PyObject *pool_adjusted(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 7 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "pool_adjusted(pool_scores: list, keyword, keyword_weight, neighbours, "
                                         "neighbour_weight, timed, temporal_weight)");
        return NULL;
    }
    const Py_ssize_t count = PyList_Size(args[0]);
    const double keyword_weight = PyFloat_AsDouble(args[2]), neighbour_weight = PyFloat_AsDouble(args[4]),
                 temporal_weight = PyFloat_AsDouble(args[6]);
    if (PyErr_Occurred()) return NULL;
    const double *keyword = NULL;
    if (args[1] != Py_None && !(keyword = column_data(args[1], NPY_FLOAT64, count, 0, "pool_adjusted", "keyword",
                                                      "a contiguous float64 array of the pool's length")))
        return NULL;
    const npy_intp *before = NULL, *after = NULL;
    if (args[3] != Py_None) {
        PyArrayObject *rows = (PyArrayObject *)args[3];
        if (!PyArray_Check(args[3]) || PyArray_TYPE(rows) != NPY_INTP || PyArray_NDIM(rows) != 2 ||
            PyArray_DIM(rows, 0) != 2 || PyArray_DIM(rows, 1) != count || !PyArray_IS_C_CONTIGUOUS(rows)) {
            PyErr_SetString(PyExc_TypeError, "pool_adjusted: neighbours must be pool_lookups' (2, count) rows");
            return NULL;
        }
        before = (const npy_intp *)PyArray_DATA(rows);
        after = before + count;
        for (Py_ssize_t i = 0; i < 2 * count; i++)
            if (before[i] < 0 || before[i] > count) {
                PyErr_SetString(PyExc_ValueError, "pool_adjusted: a neighbour row is outside the pool");
                return NULL;
            }
    }
    const npy_bool *timed = NULL;
    if (args[5] != Py_None && !(timed = column_data(args[5], NPY_BOOL, count, 0, "pool_adjusted", "timed",
                                                    "pool_lookups' bool column")))
        return NULL;
    npy_intp shape[1] = {count};
    PyObject *out = PyArray_SimpleNew(1, shape, NPY_FLOAT64);
    double *scores = count ? PyMem_Malloc((size_t)count * sizeof(double)) : NULL;
    if (!out || (count && !scores)) {
        Py_XDECREF(out);
        PyMem_Free(scores);
        return PyErr_NoMemory();
    }
    double *adjusted = (double *)PyArray_DATA((PyArrayObject *)out);
    double low = 0, high = 0;
    for (Py_ssize_t row = 0; row < count; row++) {
        const double raw = PyFloat_AsDouble(PyList_GetItem(args[0], row));
        if (raw == -1.0 && PyErr_Occurred()) {
            Py_DECREF(out);
            PyMem_Free(scores);
            return NULL;
        }
        scores[row] = raw;
        low = row ? np_minimum(low, raw) : raw;
        high = row ? np_maximum(high, raw) : raw;
    }
    const double span = high - low;
    for (Py_ssize_t row = 0; row < count; row++) {
        double score = span > 0 ? (scores[row] - low) / span : 1.0;
        if (keyword) score = score + keyword_weight * keyword[row];
        scores[row] = score;
    }
    for (Py_ssize_t row = 0; row < count; row++) {
        double value = scores[row];
        if (before) {
            const double before_score = before[row] < count ? scores[before[row]] : 0.0;
            const double after_score = after[row] < count ? scores[after[row]] : 0.0;
            value += neighbour_weight * np_maximum(np_maximum(before_score, after_score) - scores[row], 0.0);
        }
        if (timed) value += temporal_weight * (timed[row] ? 1.0 : 0.0);
        adjusted[row] = value;
    }
    PyMem_Free(scores);
    return out;
}

/* numpy's stable argsort of -adjusted: the higher first, NaN last, ties (and NaNs) in pool order */
static const double *order_keys;
static int by_score(const void *a, const void *b) {
    const npy_intp left = *(const npy_intp *)a, right = *(const npy_intp *)b;
    const double x = -order_keys[left], y = -order_keys[right];
    const int x_nan = x != x, y_nan = y != y;
    if (x_nan != y_nan) return x_nan ? 1 : -1;
    if (!x_nan && x != y) return x < y ? -1 : 1;
    return left < right ? -1 : 1;
}

/* top_k(adjusted, k) -> (places, scores): the rows of the best k (lists of int and float), as
 * order = np.argsort(-adjusted, kind="stable")[:k]; order.tolist(), adjusted[order].tolist(). The GIL is held: the
 * comparison reads a static. */
static PyObject *top_k(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "top_k(adjusted, k)");
        return NULL;
    }
    const Py_ssize_t k = PyLong_AsSsize_t(args[1]);
    if (k == -1 && PyErr_Occurred()) return NULL;
    const double *adjusted = column_data(args[0], NPY_FLOAT64, -1, 0, "top_k", "adjusted",
                                         "a contiguous 1-D float64 array");
    if (!adjusted) return NULL;
    const Py_ssize_t count = PyArray_DIM((PyArrayObject *)args[0], 0);
    const Py_ssize_t taken = k < 0 ? 0 : (k < count ? k : count);
    npy_intp *order = PyMem_Malloc((size_t)(count ? count : 1) * sizeof(npy_intp));
    if (!order) return PyErr_NoMemory();
    for (Py_ssize_t row = 0; row < count; row++) order[row] = row;
    order_keys = adjusted;
    qsort(order, (size_t)count, sizeof(npy_intp), by_score); /* a total order: the same as any stable sort */
    PyObject *places = PyList_New(taken), *scores = PyList_New(taken), *result = NULL;
    if (!places || !scores) goto done;
    for (Py_ssize_t i = 0; i < taken; i++) {
        PyObject *place = PyLong_FromSsize_t(order[i]), *score = PyFloat_FromDouble(adjusted[order[i]]);
        if (!place || !score) {
            Py_XDECREF(place);
            Py_XDECREF(score);
            goto done;
        }
        PyList_SetItem(places, i, place); /* steals */
        PyList_SetItem(scores, i, score);
    }
    result = PyTuple_Pack(2, places, scores);
done:
    PyMem_Free(order);
    Py_XDECREF(places);
    Py_XDECREF(scores);
    return result;
}

static int by_slot(const void *a, const void *b) {
    const Py_ssize_t x = *(const Py_ssize_t *)a, y = *(const Py_ssize_t *)b;
    return (x > y) - (x < y);
}

/* count_uses(slot_of, ids, freq, freq_at, last_use, now) -> None, or NotImplemented (nothing changed) for an id
 * that is not a Python int (numpy's integers among them: HotSet.use's numpy path takes those).
 * HotSet.use without a half-life: each distinct id of the list that slot_of (a dict of int to slot) tracks counts
 * one use at tick now: freq[slot] += 1.0, freq_at[slot] = last_use[slot] = now, as numpy's fancy indexing does it
 * (an id given twice counts once). */
static PyObject *count_uses(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 6 || !PyDict_Check(args[0]) || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "count_uses(slot_of: dict, ids: list, freq, freq_at, last_use, now)");
        return NULL;
    }
    static const char column[] = "a HotSet's writeable column";
    double *freq = column_data(args[2], NPY_FLOAT64, -1, 1, "count_uses", "freq", column);
    if (!freq) return NULL;
    const Py_ssize_t capacity = PyArray_DIM((PyArrayObject *)args[2], 0);
    npy_int64 *freq_at = column_data(args[3], NPY_INT64, capacity, 1, "count_uses", "freq_at", column);
    npy_int64 *last_use = freq_at ? column_data(args[4], NPY_INT64, capacity, 1, "count_uses", "last_use", column)
                                  : NULL;
    if (!last_use) return NULL;
    const long long now = PyLong_AsLongLong(args[5]);
    if (now == -1 && PyErr_Occurred()) return NULL;
    PyObject *ids = args[1];
    const Py_ssize_t count = PyList_Size(ids);
    Py_ssize_t local[64], *slots = count <= 64 ? local : PyMem_Malloc((size_t)count * sizeof(Py_ssize_t));
    if (!slots) return PyErr_NoMemory();
    PyObject *result = NULL;
    Py_ssize_t found = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *id = PyList_GetItem(ids, i); /* borrowed */
        if (!PyLong_CheckExact(id)) {
            result = Py_NewRef(Py_NotImplemented);
            goto done;
        }
        PyObject *slot = PyDict_GetItemWithError(args[0], id); /* borrowed */
        if (!slot) {
            if (PyErr_Occurred()) goto done;
            continue; /* not tracked */
        }
        const Py_ssize_t at = PyLong_AsSsize_t(slot);
        if (at == -1 && PyErr_Occurred()) goto done;
        if (at < 0 || at >= capacity) {
            PyErr_SetString(PyExc_ValueError, "count_uses: a tracked slot is outside the HotSet's columns");
            goto done;
        }
        slots[found++] = at;
    }
    qsort(slots, (size_t)found, sizeof(Py_ssize_t), by_slot); /* an id given twice: its slot counts once */
    for (Py_ssize_t i = 0; i < found; i++) {
        if (i && slots[i] == slots[i - 1]) continue;
        freq[slots[i]] += 1.0;
        freq_at[slots[i]] = (npy_int64)now;
        last_use[slots[i]] = (npy_int64)now;
    }
    result = Py_NewRef(Py_None);
done:
    if (slots != local) PyMem_Free(slots);
    return result;
}

/* scaled_to_unit(vector) -> float32 array, or None
 * validate.scaled_to_unit: a 1-D float32 vector (any stride) divided by its length, the length's square summed in
 * float64 over eight running sums in a fixed order, the division in float32 by the length rounded to float32. None
 * where the length is not within (1e-30, 1e30): zero, NaN, infinite, or far outside float32's comfortable range (a
 * square of float32 values neither overflows nor underflows in float64). Every search that normalises a query goes
 * through this one function, so the hot answer's one pass and the general path read the same unit vector. */
static PyObject *scaled_to_unit(PyObject *module, PyObject *vector) {
    (void)module;
    PyArrayObject *array = (PyArrayObject *)vector;
    if (!PyArray_Check(vector) || PyArray_TYPE(array) != NPY_FLOAT32 || PyArray_NDIM(array) != 1) {
        PyErr_SetString(PyExc_TypeError, "scaled_to_unit: the vector must be a 1-D float32 array");
        return NULL;
    }
    const npy_intp count = PyArray_DIM(array, 0), stride = PyArray_STRIDE(array, 0);
    const char *data = (const char *)PyArray_DATA(array);
    double sums[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (npy_intp i = 0; i < count; i++) {
        const double value = *(const float *)(data + i * stride);
        sums[i & 7] += value * value;
    }
    const double square = ((sums[0] + sums[1]) + (sums[2] + sums[3])) + ((sums[4] + sums[5]) + (sums[6] + sums[7]));
    const double norm = sqrt(square);
    if (!(norm > 1e-30 && norm < 1e30)) Py_RETURN_NONE;
    npy_intp shape[1] = {count};
    PyObject *out = PyArray_SimpleNew(1, shape, NPY_FLOAT32);
    if (!out) return NULL;
    float *unit = (float *)PyArray_DATA((PyArrayObject *)out);
    const float length = (float)norm;
    for (npy_intp i = 0; i < count; i++) unit[i] = *(const float *)(data + i * stride) / length;
    return out;
}

/* The attribute and key names hot_hits reads and sets, interned once when the module loads. */
static PyObject *name_dict, *name_expires_at, *name_score, *name_tier;

/* hot_hits(rows, ids, scores, memory_type, hit_type, tier) -> list of hits, or None
 * records.hit_of of each cached memory, for a hot answer: rows maps an id to its cached memory; each hit is a
 * hit_type allocated as object.__new__ allocates it (a frozen dataclass's __init__ does not run) and given a copy of
 * its memory's attribute dict with "score" and "tier" set. None, having built nothing, where an id is not cached, is
 * cached as anything but exactly memory_type, or its memory has a time to live (expires_at is not None: the caller's
 * Python path reads the expiry), or past 64 ids. */
static PyObject *hot_hits(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 6 || !PyDict_Check(args[0]) || !PyList_Check(args[1]) || !PyList_Check(args[2]) ||
        !PyType_Check(args[3]) || !PyType_Check(args[4]) || !PyUnicode_Check(args[5]) ||
        PyList_Size(args[1]) != PyList_Size(args[2])) {
        PyErr_SetString(PyExc_TypeError, "hot_hits(rows: dict, ids: list, scores: list of the same length, "
                                         "memory_type: type, hit_type: type, tier: str)");
        return NULL;
    }
    PyObject *rows = args[0], *ids = args[1], *scores = args[2], *memory_type = args[3], *tier = args[5];
    PyTypeObject *hit_type = (PyTypeObject *)args[4];
    allocfunc allocate = (allocfunc)PyType_GetSlot(hit_type, Py_tp_alloc);
    if (!allocate) {
        if (PyErr_Occurred()) return NULL;
        allocate = PyType_GenericAlloc;
    }
    const Py_ssize_t count = PyList_Size(ids);
    PyObject *dicts[64];
    if (count > 64) Py_RETURN_NONE; /* the hot tier's k is at most 64 on its fast paths: Python builds the rest */
    Py_ssize_t taken = 0;
    PyObject *result = NULL;
    for (; taken < count; taken++) {
        PyObject *memory = PyDict_GetItemWithError(rows, PyList_GetItem(ids, taken)); /* borrowed */
        if (!memory) {
            if (!PyErr_Occurred()) result = Py_NewRef(Py_None);
            goto done;
        }
        if ((PyObject *)Py_TYPE(memory) != memory_type) {
            result = Py_NewRef(Py_None);
            goto done;
        }
        PyObject *fields = PyObject_GetAttr(memory, name_dict);
        if (!fields) goto done;
        dicts[taken] = fields;
        if (!PyDict_Check(fields)) {
            taken++;
            PyErr_SetString(PyExc_TypeError, "hot_hits: a memory's __dict__ is not a dict");
            goto done;
        }
        PyObject *expires_at = PyDict_GetItemWithError(fields, name_expires_at); /* borrowed */
        if (!expires_at && PyErr_Occurred()) {
            taken++;
            goto done;
        }
        if (expires_at && expires_at != Py_None) {
            taken++;
            result = Py_NewRef(Py_None);
            goto done;
        }
    }
    PyObject *hits = PyList_New(count);
    if (!hits) goto done;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *copy = PyDict_Copy(dicts[i]);
        PyObject *hit = copy ? allocate(hit_type, 0) : NULL;
        const int ok = hit && PyDict_SetItem(copy, name_score, PyList_GetItem(scores, i)) == 0 &&
                       PyDict_SetItem(copy, name_tier, tier) == 0 &&
                       PyObject_GenericSetAttr(hit, name_dict, copy) == 0;
        Py_XDECREF(copy);
        if (!ok) {
            Py_XDECREF(hit);
            Py_DECREF(hits);
            goto done;
        }
        PyList_SetItem(hits, i, hit); /* steals */
    }
    result = hits;
done:
    for (Py_ssize_t i = 0; i < taken; i++) Py_DECREF(dicts[i]);
    return result;
}

static PyMethodDef methods[] = {
    {"pool_lookups", (PyCFunction)(void (*)(void))pool_lookups, METH_FASTCALL,
     "pool_lookups(features, words) -> (holds, neighbours, timed): the pool's word, neighbour and time lookups"},
    {"pool_adjusted", (PyCFunction)(void (*)(void))pool_adjusted, METH_FASTCALL,
     "pool_adjusted(pool_scores, keyword, keyword_weight, neighbours, neighbour_weight, timed, temporal_weight) -> "
     "the stages' scores"},
    {"top_k", (PyCFunction)(void (*)(void))top_k, METH_FASTCALL,
     "top_k(adjusted, k) -> (places, scores): the best k, ties in pool order"},
    {"count_uses", (PyCFunction)(void (*)(void))count_uses, METH_FASTCALL,
     "count_uses(slot_of, ids, freq, freq_at, last_use, now): HotSet.use without a half-life"},
    {"hot_hits", (PyCFunction)(void (*)(void))hot_hits, METH_FASTCALL,
     "hot_hits(rows, ids, scores, memory_type, hit_type, tier): a hot answer's hits, or None"},
    {"scaled_to_unit", scaled_to_unit, METH_O, "scaled_to_unit(vector): the float32 unit vector, or None"},
    {NULL, NULL, 0, NULL},
};

static int module_exec(PyObject *module) {
    import_array1(-1);
    if (!name_dict) {
        name_dict = PyUnicode_InternFromString("__dict__");
        name_expires_at = PyUnicode_InternFromString("expires_at");
        name_score = PyUnicode_InternFromString("score");
        name_tier = PyUnicode_InternFromString("tier");
        if (!name_dict || !name_expires_at || !name_score || !name_tier) return -1;
    }
    /* what the module offers; tiered_recall.coordinator.stages.COMPILED_STAGES_API must match */
    return PyModule_AddIntConstant(module, "API", 4);
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_trstages", "The coordinator's per-search loops (see native/src/stagefast.c).", 0,
    methods, module_slots, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__trstages(void) { return PyModuleDef_Init(&module_def); }
