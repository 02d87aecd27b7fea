/* The parts of shadowlab.logs._logscan shared by its three files (the accelerator of the log
 * parser; shadowlab/logs/parse.py, lifecycle.py and analysis.py are its specification):
 *
 *   _logscan.c        the module: its functions and its ABI number
 *   _logscan_scan.c   scan(): the line scanner (trigger search, line shapes, event records)
 *   _logscan_fold.c   fold_*(): `shadowlab logs`' replay of a b11434 log over the scanner
 *
 * Their shared constants (event kinds, scan words, ABI, limits, field positions) are in
 * _logscan_constants.h, generated from shadowlab/logs/accel.py by
 * scripts/gen_logscan_constants.py. Functions shared between the files are hidden from other
 * shared objects (-fvisibility=hidden in setup.py): only PyInit__logscan is exported. */
#ifndef SHADOWLAB_LOGSCAN_H
#define SHADOWLAB_LOGSCAN_H

#define _GNU_SOURCE /* memrchr */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "_logscan_constants.h" /* kinds, words, ABI, limits, field positions: from accel.py */

#define MAX_FLOAT 40       /* characters of a decimal number read here */
#define NO_INT INT64_MIN   /* an optional integer group that did not match */
#define NEED_PY (INT64_MIN + 1) /* only Python can tell: the line goes back to it */

typedef const unsigned char *cp;

static inline cp lit(cp p, cp e, const char *s, size_t n)
{
    if (p == NULL || (size_t)(e - p) < n || memcmp(p, s, n) != 0)
        return NULL;
    return p + n;
}
#define LIT(p, e, s) lit((p), (e), (s), sizeof(s) - 1)

static inline int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
/* one or more spaces */
static inline cp spaces(cp p, cp e)
{
    if (p == NULL || p >= e || *p != ' ')
        return NULL;
    while (p < e && *p == ' ')
        p++;
    return p;
}

typedef struct {
    cp at; /* where the trigger starts, NULL: none */
    int word;
} hit_t;

/* the word both side notes hold ("checking sim", "[Cc]hecking checkpoint"): the fold's notes
 * are found by it, in the finder's pass (_logscan_scan.c) or by its own search (_logscan_fold.c) */
#define HECKING "hecking "
#define HECKING_LEN (sizeof HECKING - 1)

/* The first trigger in [p, e) of the region [s, e); the loads may read up to `readable`. */
typedef hit_t (*search_fn)(cp s, cp e, cp p, cp readable);

#if defined(__GNUC__) && defined(__x86_64__)
/* SSE2 is part of x86-64; AVX2 is compiled separately and picked at run time. Elsewhere the
 * scalar search runs (same results, slower). */
#define VECTOR_SEARCH 1
#include <immintrin.h>
typedef unsigned char v16 __attribute__((vector_size(16)));
typedef unsigned char v32 __attribute__((vector_size(32)));
#define MASK16(hit) ((uint32_t)_mm_movemask_epi8((__m128i)(hit)))
#define MASK32(hit) ((uint32_t)_mm256_movemask_epi8((__m256i)(hit)))
typedef unsigned char v64 __attribute__((vector_size(64)));
#define MASK64(hit) ((uint64_t)_mm512_movepi8_mask((__m512i)(hit)))
#endif

/* memchr(s, '|', e - s), inline: a slot line's first bar is ~35 bytes in, two or three 16-byte
 * compares, where the library call cost more than the search (~2% of the fold's time; any_head
 * and the side notes' search_id read a slot prefix back from it) */
static inline cp first_bar(cp s, cp e)
{
#ifdef VECTOR_SEARCH
    const __m128i bar = _mm_set1_epi8('|');
    for (; e - s >= 16; s += 16) {
        unsigned m = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)s), bar));
        if (m)
            return s + __builtin_ctz(m);
    }
#endif
    for (; s < e; s++)
        if (*s == '|')
            return s;
    return NULL;
}

/* "id +\d+ " read back from the '|' at bar, no earlier than s: where its "id" starts (NULL: no
 * such prefix), its digits in [*digits, bar - 1). A prefix read back from a bar is the only one
 * ending there (digits, then spaces, then "id"). */
static inline cp prefix_back(cp s, cp bar, cp *digits)
{
    if (bar - s < 5 || bar[-1] != ' ')
        return NULL;
    cp q = bar - 1;
    while (q > s && is_digit(q[-1]))
        q--;
    cp sp = q;
    while (sp > s && sp[-1] == ' ')
        sp--;
    if (q == bar - 1 || sp == q || sp - s < 2 || sp[-2] != 'i' || sp[-1] != 'd')
        return NULL;
    *digits = q;
    return sp - 2;
}

/* ------------------------------------------------------------------ records
 * The search and the line parsers run without the GIL (find()): a line's fields become typed
 * values in a record, and build() turns records into Python objects later. */

enum vtype { V_NONE, V_FALSE, V_INT, V_FLOAT, V_FLOAT_TEXT, V_LRU, V_LCP, V_ID };

#define MAX_VALUES 10 /* the fields after line and offset (CheckpointCreated has 10) */

/* R_BENIGN: a line Python's tolerant path does not understand but knows harmless (ignored);
 * R_KNOWN: one it understands as no event (a candidate, not ignored) */
enum result { R_SLOW, R_EVENT, R_BENIGN, R_KNOWN };

/* A record is small (a block holds ~50,000): each value is a type and 64 bits, the integer, the
 * double's bits, or for V_FLOAT_TEXT the text's position in the buffer << 8 | its length. */
typedef struct {
    int64_t line;                 /* newlines before the line in its region */
    int64_t start, stop;          /* the line in the buffer */
    int8_t result, kind, word, n; /* result: R_SLOW or R_EVENT */
    uint8_t type[MAX_VALUES];
    int64_t v[MAX_VALUES];
} rec_t;

typedef struct {
    cp body; /* the buffer: float texts point into it */
    cp from; /* the region's start: `found better prompt` looks back to it, Python further */
} ctx_t;

#define BATCH 2048 /* records read before their objects are built: they stay in the CPU's cache */

typedef struct {
    rec_t recs[BATCH]; /* the event and slow lines of this batch, in order */
    Py_ssize_t n;
    cp p;        /* where the search goes on */
    cp counted;  /* the newlines before it are in `newlines` */
    int64_t newlines;
    Py_ssize_t candidates, ignored; /* benign lines counted here; events by the builder */
    Py_ssize_t max;                 /* records per batch: BATCH, or fewer for the fold */
    /* The fold's side notes: where every "hecking " of the region stands (offsets from ctx_t's
     * body, in order), found in the same pass as the triggers. hk_search NULL: not looked for
     * (scan()). Every one starting before body + hk_done is in hk[0, n_hk) or was taken; the
     * fold takes them after each batch. hk_nomem: hk could not grow (the fold raises
     * MemoryError). */
    cp (*hk_search)(cp p, cp end, cp readable); /* the next "hecking " inside [p, end) */
    Py_ssize_t *hk, n_hk, cap_hk, hk_done;
    int hk_nomem;
} finder_t;

/* ------------------------------------------------------------------ shared between the files */

/* _logscan_scan.c */
search_fn pick_search(int search);
cp line_start(cp low, cp at);
cp rfind(cp low, cp end, const char *needle, size_t n);
int find_batch(finder_t *f, const ctx_t *c, cp limit, cp readable, search_fn search);
PyObject *scan(PyObject *self, PyObject *args);
/* _logscan_fold.c */
PyObject *fold_new(PyObject *self, PyObject *args);
PyObject *fold_block(PyObject *self, PyObject *args);
PyObject *fold_events(PyObject *self, PyObject *args);
PyObject *fold_finish(PyObject *self, PyObject *args);
PyObject *fold_trace(PyObject *self, PyObject *args);
PyObject *hecking_all(PyObject *self, PyObject *args);
void fold_init(void); /* the module's init: the trace's quoted names */
/* _logscan_figures.c */
PyObject *sort_q(PyObject *self, PyObject *arg);
PyObject *merge_q(PyObject *self, PyObject *args);
void sort_int64(int64_t *v, Py_ssize_t n); /* ascending; qsort when there is no memory for its buffer */
PyObject *bin_outcomes(PyObject *self, PyObject *args);

#endif
