/* shadowlab.logs._logscan's figures: what `shadowlab logs` computes over every request once the
 * lines are read, done here instead of one Python step per request (logs.figures and
 * logs.analysis call these when the accelerator is built, and compute the same in Python when
 * it is not; tests/shadowlab/test_logscan.py compares both on random arrays).
 *
 *   sort_q(a)  sorts an array('q') in place (Figures' ranks: its shared prefixes and prompt sizes)
 *   merge_q(a, n)  merges in place the two ascending runs a[:n] and a[n:] of an array('q')
 *       (Figures.merge of two scopes whose arrays are in order: the fold's slots, the servers)
 *   bin_outcomes(times, codes, nbins, noutcomes) -> (start, width, bins): analysis._over_time's
 *       counts: times an array('d'), codes an array('b') of outcome indices; start the least
 *       time, width ((max - start) or 1.0) / nbins, bins[i][o] the requests of outcome o whose
 *       int((t - start) / width) is i (the last bin takes the end)
 */
#include "_logscan.h"

static int int64_order(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* An LSD radix sort by the bytes that differ (token counts differ in 2-3 of 8: ~5x faster
 * than qsort here); keys offset by 2^63 so that unsigned order is signed order. qsort when
 * there is no memory for the second buffer. */
void sort_int64(int64_t *v, Py_ssize_t n)
{
    const uint64_t sign = (uint64_t)1 << 63;
    uint64_t *tmp = n > 1 ? PyMem_Malloc((size_t)n * sizeof *tmp) : NULL;
    if (tmp == NULL) {
        if (n > 1)
            qsort(v, (size_t)n, sizeof *v, int64_order);
        return;
    }
    uint64_t *src = (uint64_t *)v, *dst = tmp, differ = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        src[i] ^= sign;
        differ |= src[i] ^ src[0];
    }
    for (int shift = 0; shift < 64; shift += 8) {
        if (((differ >> shift) & 0xff) == 0)
            continue;
        Py_ssize_t at[256] = {0}, sum = 0;
        for (Py_ssize_t i = 0; i < n; i++)
            at[(src[i] >> shift) & 0xff]++;
        for (int b = 0; b < 256; b++) {
            Py_ssize_t c = at[b];
            at[b] = sum;
            sum += c;
        }
        for (Py_ssize_t i = 0; i < n; i++)
            dst[at[(src[i] >> shift) & 0xff]++] = src[i];
        uint64_t *t = src;
        src = dst;
        dst = t;
    }
    if (src != (uint64_t *)v)
        memcpy(v, src, (size_t)n * sizeof *v);
    for (Py_ssize_t i = 0; i < n; i++)
        v[i] = (int64_t)((uint64_t)v[i] ^ sign);
    PyMem_Free(tmp);
}

static int buffer_of(PyObject *o, Py_buffer *b, int writable, const char *format, Py_ssize_t itemsize,
                     const char *what)
{
    if (PyObject_GetBuffer(o, b, (writable ? PyBUF_WRITABLE : 0) | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (b->itemsize != itemsize || b->format == NULL || strcmp(b->format, format) != 0) {
        PyErr_Format(PyExc_TypeError, "%s: an array('%s') expected", what, format);
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

PyObject *sort_q(PyObject *self, PyObject *arg)
{
    Py_buffer b;
    (void)self;
    if (buffer_of(arg, &b, 1, "q", 8, "sort_q") < 0)
        return NULL;
    sort_int64(b.buf, b.len / 8);
    PyBuffer_Release(&b);
    Py_RETURN_NONE;
}

/* a[:n1] and a[n1:n] ascending -> a[:n] ascending: the first run is copied aside and the two are
 * merged from the front (the write never passes the second run's read). -1: no memory. */
static int merge_runs(int64_t *a, Py_ssize_t n1, Py_ssize_t n)
{
    if (n1 == 0 || n1 == n || a[n1 - 1] <= a[n1])
        return 0; /* already in order */
    int64_t *first = PyMem_Malloc((size_t)n1 * sizeof *first);
    if (first == NULL)
        return -1;
    memcpy(first, a, (size_t)n1 * sizeof *first);
    Py_ssize_t i = 0, j = n1, k = 0;
    while (i < n1 && j < n)
        a[k++] = a[j] < first[i] ? a[j++] : first[i++];
    memcpy(a + k, first + i, (size_t)(n1 - i) * sizeof *first); /* the second run's rest is in place */
    PyMem_Free(first);
    return 0;
}

PyObject *merge_q(PyObject *self, PyObject *args)
{
    PyObject *o;
    Py_ssize_t n1;
    Py_buffer b;
    (void)self;
    if (!PyArg_ParseTuple(args, "On", &o, &n1))
        return NULL;
    if (buffer_of(o, &b, 1, "q", 8, "merge_q") < 0)
        return NULL;
    Py_ssize_t n = b.len / 8;
    int bad = n1 < 0 || n1 > n;
    if (bad)
        PyErr_SetString(PyExc_ValueError, "merge_q: 0 <= n <= len(a) expected");
    else if (merge_runs(b.buf, n1, n) < 0) {
        PyErr_NoMemory();
        bad = 1;
    }
    PyBuffer_Release(&b);
    if (bad)
        return NULL;
    Py_RETURN_NONE;
}

PyObject *bin_outcomes(PyObject *self, PyObject *args)
{
    PyObject *times_o, *codes_o;
    Py_ssize_t nbins, noutcomes;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOnn", &times_o, &codes_o, &nbins, &noutcomes))
        return NULL;
    if (nbins < 1 || noutcomes < 1 || noutcomes > 8) {
        PyErr_SetString(PyExc_ValueError, "bin_outcomes: 1 <= nbins and 1 <= noutcomes <= 8 expected");
        return NULL;
    }
    Py_buffer tb, cb;
    if (buffer_of(times_o, &tb, 0, "d", 8, "bin_outcomes times") < 0)
        return NULL;
    if (buffer_of(codes_o, &cb, 0, "b", 1, "bin_outcomes codes") < 0) {
        PyBuffer_Release(&tb);
        return NULL;
    }
    PyObject *result = NULL;
    const double *t = tb.buf;
    const int8_t *code = cb.buf;
    Py_ssize_t n = tb.len / 8;
    int64_t *counts = NULL;
    if (cb.len != n) {
        PyErr_SetString(PyExc_ValueError, "bin_outcomes: as many codes as times expected");
        goto done;
    }
    if (n == 0) {
        PyErr_SetString(PyExc_ValueError, "bin_outcomes: no times");
        goto done;
    }
    /* min() and max() keep the first of equal values, as these loops do */
    double start = t[0], end = t[0];
    for (Py_ssize_t i = 1; i < n; i++) {
        if (t[i] < start)
            start = t[i];
        if (t[i] > end)
            end = t[i];
    }
    double span = end - start;
    double width = (span != 0.0 ? span : 1.0) / (double)nbins;
    counts = PyMem_Calloc((size_t)(nbins * noutcomes), sizeof *counts);
    if (counts == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (code[i] < 0 || code[i] >= noutcomes) {
            PyErr_Format(PyExc_ValueError, "bin_outcomes: outcome code %d out of range", (int)code[i]);
            goto done;
        }
        double q = (t[i] - start) / width; /* >= 0: t >= start */
        Py_ssize_t bin = q < (double)nbins ? (Py_ssize_t)q : nbins - 1;
        counts[bin * noutcomes + code[i]]++;
    }
    PyObject *bins = PyList_New(nbins);
    if (bins == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < nbins; i++) {
        PyObject *row = PyList_New(noutcomes);
        if (row == NULL) {
            Py_DECREF(bins);
            goto done;
        }
        PyList_SET_ITEM(bins, i, row);
        for (Py_ssize_t o = 0; o < noutcomes; o++) {
            PyObject *v = PyLong_FromLongLong(counts[i * noutcomes + o]);
            if (v == NULL) {
                Py_DECREF(bins);
                goto done;
            }
            PyList_SET_ITEM(row, o, v);
        }
    }
    result = Py_BuildValue("(ddN)", start, width, bins);
done:
    PyMem_Free(counts);
    PyBuffer_Release(&tb);
    PyBuffer_Release(&cb);
    return result;
}
