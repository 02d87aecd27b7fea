/* shadowlab._logscan: the log parser's whole-line fast path in C (optional accelerator).
 *
 * shadowlab/logparse.py is the specification. For each complete line of a block this module
 * does what `_Scanner._scan_body` does in Python: it finds the line's first trigger word (the
 * same five scan words and trigger phrases as `_scan_regexes`), and tries that word's
 * whole-line shapes (`_CK_ANY`, `_CK_STRICT`, `_PROMPT_ANY`, `_PROMPT_STRICT`, `_TRIM_ANY`,
 * `_SELECTED_STRICT`), written out here as small hand parsers. A line that matches becomes an
 * event record (built like `tuple.__new__(cls, fields)`) or an ignored benign line; every other
 * candidate line is handed back to Python, which reads it with its own fast regex or tolerant
 * path. So this module may only ever be stricter than Python, never different: a number with
 * more than 18 digits, a line longer than MAX_LINE, the headless `prompt eval time` form and the
 * `kv cache rm` word all go back to Python. tests/shadowlab/test_logscan.py compares both paths
 * on every fixture line and on mutated lines.
 *
 *   scan(body, lo, hi, base_line, base_offset, classes, strings, search=0) ->
 *       (events, slow, newlines, candidates, ignored, counts)
 *
 * body        a bytes-like object; body[lo:hi] holds complete lines (the last may lack its
 *             newline), body[lo] is at file offset base_offset and starts line base_line + 1
 * classes     tuple of the 13 event classes, in the order of enum kind below
 * strings     ("lru", "lcp"): the SlotSelected.method values
 * search      which trigger search runs (0: the fastest here; see pick_search)
 * events      list of event records of the lines handled here, in line order
 * slow        list of (index, start, stop, line_no, word): a candidate line body[start:stop] for
 *             Python, to be read before events[index]
 * newlines    newlines in body; candidates / ignored: lines handled here (events + benign) and
 *             benign lines; counts: events per class
 */
#define _GNU_SOURCE /* memrchr */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum kind {
    K_CREATED, K_RESTORED, K_ERASED, K_ERASED_OLD, K_TOO_CLOSE, K_SUPERSEDED, K_FORCED,
    K_NEW_PROMPT, K_TRIM, K_EVAL, K_SELECTED, K_SAVED, K_LOADED, N_KINDS
};
/* the scan words of logparse._SCAN_WORDS, in its order */
enum word { W_CK, W_PROMPT, W_TRIM, W_KV, W_SELECTED, W_NONE = -1 };

#define LOGSCAN_ABI 1      /* logparse._ACCEL_ABI: bump when scan()'s arguments or records change */
#define MAX_LINE (1 << 20) /* logparse.MAX_LINE */
#define MAX_DIGITS 18      /* beyond this Python's int() reads the number */
#define MAX_FLOAT 40       /* characters of a decimal number read here */
#define NO_INT INT64_MIN   /* an optional integer group that did not match */
#define NEED_PY (INT64_MIN + 1) /* only Python can tell (a number too long for int64) */

typedef const unsigned char *cp;

/* ------------------------------------------------------------------ small matchers
 * Each takes the cursor and the line end and returns the cursor after what it matched, or
 * NULL. NULL propagates, so a shape reads as a chain of calls. */

static cp lit(cp p, cp e, const char *s, size_t n)
{
    if (p == NULL || (size_t)(e - p) < n || memcmp(p, s, n) != 0)
        return NULL;
    return p + n;
}
#define LIT(p, e, s) lit((p), (e), (s), sizeof(s) - 1)

static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
static int is_word(unsigned char c)
{
    return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

/* \d+ into *v (at most MAX_DIGITS digits, else NULL: Python reads it) */
static cp uint_(cp p, cp e, int64_t *v)
{
    if (p == NULL || p >= e || !is_digit(*p))
        return NULL;
    int64_t x = 0;
    cp s = p;
    while (p < e && is_digit(*p)) {
        if (p - s >= MAX_DIGITS)
            return NULL;
        x = x * 10 + (*p - '0');
        p++;
    }
    *v = x;
    return p;
}

/* -?\d+ */
static cp sint_(cp p, cp e, int64_t *v)
{
    if (p != NULL && p < e && *p == '-') {
        p = uint_(p + 1, e, v);
        if (p != NULL)
            *v = -*v;
        return p;
    }
    return uint_(p, e, v);
}

/* one or more spaces */
static cp spaces(cp p, cp e)
{
    if (p == NULL || p >= e || *p != ' ')
        return NULL;
    while (p < e && *p == ' ')
        p++;
    return p;
}

/* \d+\.\d+ (need_dot) or \d+(?:\.\d+)? ; the text is kept in *s / *n for float() */
static cp decimal(cp p, cp e, int need_dot, cp *s, size_t *n)
{
    if (p == NULL || p >= e || !is_digit(*p))
        return NULL;
    cp start = p;
    while (p < e && is_digit(*p))
        p++;
    if (p + 1 < e && *p == '.' && is_digit(p[1])) {
        p++;
        while (p < e && is_digit(*p))
            p++;
    } else if (need_dot) {
        return NULL;
    }
    if (p - start > MAX_FLOAT)
        return NULL;
    *s = start;
    *n = (size_t)(p - start);
    return p;
}

/* [ \t\r]*\Z */
static int end_(cp p, cp e)
{
    if (p == NULL)
        return 0;
    while (p < e && (*p == ' ' || *p == '\t' || *p == '\r'))
        p++;
    return p == e;
}

/* [^|\n]* then [ \t\r]*\Z: the rest of the line holds no '|' */
static int rest_without_bar(cp p, cp e)
{
    return p != NULL && memchr(p, '|', (size_t)(e - p)) == NULL;
}

/* ------------------------------------------------------------------ line heads */

typedef struct {
    int64_t slot, task;
} head_t;

/* _ANY_HEAD: [^|\n]*\bid +(\d+) \| task (\d+) \| . The text before the prefix holds no '|',
 * so the prefix ends at the line's first '|' and is read backwards from it. */
static cp any_head(cp s, cp e, head_t *h)
{
    cp bar = memchr(s, '|', (size_t)(e - s));
    if (bar == NULL || bar - s < 5 || bar[-1] != ' ')
        return NULL;
    cp d = bar - 1; /* digits end here */
    cp q = d;
    while (q > s && is_digit(q[-1]))
        q--;
    if (q == d || d - q > MAX_DIGITS)
        return NULL;
    if (uint_(q, d, &h->slot) != d)
        return NULL;
    cp sp = q; /* one or more spaces before the digits */
    while (sp > s && sp[-1] == ' ')
        sp--;
    if (sp == q || sp - s < 2 || sp[-2] != 'i' || sp[-1] != 'd')
        return NULL;
    cp id = sp - 2;
    if (id > s && is_word(id[-1]))
        return NULL; /* \b */
    cp p = LIT(bar, e, "| task ");
    p = uint_(p, e, &h->task);
    return LIT(p, e, " | ");
}

/* \d+\.\d+\.\d+\.\d+ [A-Z]  (a b11434 timestamp and level letter) */
static cp stamp(cp s, cp e)
{
    cp p = s;
    for (int i = 0; i < 4 && p != NULL; i++) {
        if (i)
            p = LIT(p, e, ".");
        /* a timestamp field may be long: skip digits without converting */
        if (p == NULL || p >= e || !is_digit(*p))
            return NULL;
        while (p < e && is_digit(*p))
            p++;
    }
    p = LIT(p, e, " ");
    if (p == NULL || p >= e || *p < 'A' || *p > 'Z')
        return NULL;
    return LIT(p + 1, e, " ");
}

/* _STRICT_HEAD: stamp (?:slot|srv ) +[\w()]+: id +(\d+) \| task (-?\d+) \| */
static cp strict_head(cp s, cp e, head_t *h)
{
    cp p = stamp(s, e);
    if (p == NULL)
        return NULL;
    cp q = LIT(p, e, "slot");
    if (q == NULL)
        q = LIT(p, e, "srv ");
    p = spaces(q, e);
    if (p == NULL)
        return NULL;
    cp name = p;
    while (p < e && (is_word(*p) || *p == '(' || *p == ')'))
        p++;
    if (p == name)
        return NULL;
    p = LIT(p, e, ": id");
    p = spaces(p, e);
    p = uint_(p, e, &h->slot);
    p = LIT(p, e, " | task ");
    p = sint_(p, e, &h->task);
    return LIT(p, e, " | ");
}

/* _SRV_HEAD: stamp srv + */
static cp srv_head(cp s, cp e)
{
    return spaces(LIT(stamp(s, e), e, "srv"), e);
}

/* ------------------------------------------------------------------ finding trigger words */

/* Is there a trigger of `word` at p (p holds the word's first byte)? The phrases around
 * "prompt" are logparse._TRIGGERS. [s, e) is the region searched: no trigger holds a newline,
 * so comparing across the region instead of the line finds the same triggers. */
static int trigger_at(cp s, cp e, cp p, int word)
{
    size_t left = (size_t)(p - s), right = (size_t)(e - p);
#define AFTER(str) (right >= sizeof(str) - 1 && memcmp(p, str, sizeof(str) - 1) == 0)
#define BEFORE(str) (left >= sizeof(str) - 1 && memcmp(p - (sizeof(str) - 1), str, sizeof(str) - 1) == 0)
    switch (word) {
    case W_CK:
        return AFTER("checkpoint");
    case W_TRIM:
        return AFTER("memory_seq_rm");
    case W_KV:
        return AFTER("kv cache rm");
    case W_SELECTED:
        return AFTER("selected slot by");
    case W_PROMPT:
        if (!AFTER("prompt"))
            return 0;
        return BEFORE("forcing full ") || (BEFORE("new ") && AFTER("prompt,")) ||
               AFTER("prompt eval time") || AFTER("prompt cache") ||
               (BEFORE("saving ") && AFTER("prompt with length")) || BEFORE("found better ");
    }
    return 0;
#undef AFTER
#undef BEFORE
}

/* The scan word whose trigger starts at `at` in [s, e), or W_NONE. */
static int trigger_word(cp s, cp e, cp at)
{
    int w;
    switch (*at) {
    case 'c': w = W_CK; break;
    case 'p': w = W_PROMPT; break;
    case 'm': w = W_TRIM; break;
    case 'k': w = W_KV; break;
    case 's': w = W_SELECTED; break;
    default: return W_NONE;
    }
    return trigger_at(s, e, at, w) ? w : W_NONE;
}

typedef struct {
    cp at; /* where the trigger starts, NULL: none */
    int word;
} found_t;

static found_t search_tail(cp s, cp e, cp p)
{
    for (; p < e; p++) {
        int w = trigger_word(s, e, p);
        if (w != W_NONE)
            return (found_t){p, w};
    }
    return (found_t){NULL, W_NONE};
}

/* The vector search: at 16 or 32 positions at a time, each word is looked for by two of its
 * bytes (Mula's SIMD-friendly substring search), a pair chosen to be rare in real logs:
 *   checkpoint    'k' at +4, 'p' at +5        prompt   'p' at +0, 'm' at +3
 *   memory_seq_rm 'm' at +0, 'q' at +9        kv cache rm  'v' at +1, 'm' at +10
 *   selected slot by  'c' at +4, 'y' at +15
 * (on the real b11434 captures almost every pair hit is the word). Each hit is checked by
 * trigger_word(), in position order. READ_AHEAD: how far past a position the loads reach. */
#define READ_AHEAD (15 + 32)

/* MASK(hit) turns a vector of 0x00 / 0xff lanes into an integer with LANE_BITS bits per lane:
 * one instruction on x86 (pmovmskb), two 64-bit words elsewhere. */
#define SEARCH_BODY(V, WIDTH, MASK_T, MASK, LANE_BITS)                                                   \
    const V zero = {0};                                                                                   \
    const V k = zero + 'k', p_ = zero + 'p', m = zero + 'm', q = zero + 'q', v = zero + 'v',              \
            c = zero + 'c', y = zero + 'y';                                                              \
    for (; p < e && p + READ_AHEAD <= readable; p += WIDTH) {                                            \
        V a0, a1, a3, a4, a5, a9, a10, a15;                                                               \
        memcpy(&a0, p, WIDTH);                                                                           \
        memcpy(&a1, p + 1, WIDTH);                                                                       \
        memcpy(&a3, p + 3, WIDTH);                                                                       \
        memcpy(&a4, p + 4, WIDTH);                                                                       \
        memcpy(&a5, p + 5, WIDTH);                                                                       \
        memcpy(&a9, p + 9, WIDTH);                                                                       \
        memcpy(&a10, p + 10, WIDTH);                                                                     \
        memcpy(&a15, p + 15, WIDTH);                                                                     \
        V hit = (V)(((a4 == k) & (a5 == p_)) | ((a0 == p_) & (a3 == m)) | ((a0 == m) & (a9 == q)) |         \
                    ((a1 == v) & (a10 == m)) | ((a4 == c) & (a15 == y)));                                \
        for (MASK_T bits = MASK(hit); bits != 0; bits &= bits - 1) {                                     \
            cp at = p + __builtin_ctzll(bits) / LANE_BITS;                                               \
            if (at >= e)                                                                                 \
                return (found_t){NULL, W_NONE};                                                          \
            int w = trigger_word(s, e, at);                                                              \
            if (w != W_NONE)                                                                             \
                return (found_t){at, w};                                                                 \
        }                                                                                                \
    }

/* The first trigger in [p, e) of the region [s, e); the loads may read up to `readable`. */
typedef found_t (*search_fn)(cp s, cp e, cp p, cp readable);

static found_t search_scalar(cp s, cp e, cp p, cp readable)
{
    (void)readable;
    return search_tail(s, e, p);
}

#if defined(__GNUC__) && defined(__x86_64__)
/* SSE2 is part of x86-64; AVX2 is compiled separately and picked at run time. Elsewhere the
 * scalar search runs (same results, slower). */
#define VECTOR_SEARCH 1
#include <immintrin.h>
typedef unsigned char v16 __attribute__((vector_size(16)));
typedef unsigned char v32 __attribute__((vector_size(32)));
#define MASK16(hit) ((uint32_t)_mm_movemask_epi8((__m128i)(hit)))
#define MASK32(hit) ((uint32_t)_mm256_movemask_epi8((__m256i)(hit)))

static found_t search_v16(cp s, cp e, cp p, cp readable)
{
    SEARCH_BODY(v16, 16, uint32_t, MASK16, 1)
    return search_tail(s, e, p);
}

__attribute__((target("avx2"))) static found_t search_v32(cp s, cp e, cp p, cp readable)
{
    SEARCH_BODY(v32, 32, uint32_t, MASK32, 1)
    return search_tail(s, e, p);
}
#endif

/* search: 0 the widest this CPU runs, 1 scalar, 2 16 lanes (SSE2), 3 32 lanes (AVX2); NULL if
 * this build or CPU lacks it. Tests run every variant the machine has against the others. */
static search_fn pick_search(int search)
{
#ifdef VECTOR_SEARCH
    int avx2 = __builtin_cpu_supports("avx2");
    if (search == 3 || (search == 0 && avx2))
        return avx2 ? search_v32 : NULL;
    if (search == 0 || search == 2)
        return search_v16;
#else
    if (search == 0)
        search = 1;
#endif
    return search == 1 ? search_scalar : NULL;
}

/* newlines in [p, e) */
static int64_t count_newlines(cp p, cp e)
{
    int64_t n = 0;
#ifdef VECTOR_SEARCH
    const v16 nl = (v16){0} + '\n';
    for (; e - p >= 16; p += 16) {
        v16 a;
        memcpy(&a, p, 16);
        uint32_t bits = MASK16(a == nl);
        /* popcount without assuming the instruction: the multiply sums the four bytes of
         * (bits as nibble sums) into the top byte */
        bits = bits - ((bits >> 1) & 0x5555u);
        bits = (bits & 0x3333u) + ((bits >> 2) & 0x3333u);
        bits = (bits + (bits >> 4)) & 0x0f0fu;
        n += (bits * 0x0101u) >> 8 & 0xff;
    }
#endif
    for (; p < e; p++)
        n += *p == '\n';
    return n;
}

/* the start of the line holding `at`, no earlier than `low` */
static cp line_start(cp low, cp at)
{
#ifdef __GLIBC__
    cp nl = memrchr(low, '\n', (size_t)(at - low));
    return nl != NULL ? nl + 1 : low;
#else
    while (at > low && at[-1] != '\n')
        at--;
    return at;
#endif
}

/* ------------------------------------------------------------------ building records */

/* Numbers repeat: a task's id on each of its lines, the same checkpoint positions and sizes on
 * its created / restored / erased lines. A small direct-mapped cache per scan() call shares
 * one object per value (ints and floats are immutable), which halves the allocations. */
#define CACHE_BITS 9
typedef struct {
    int64_t key[1 << CACHE_BITS];
    PyObject *obj[1 << CACHE_BITS];
} cache_t;

static void cache_clear(cache_t *cache)
{
    for (int i = 0; i < (1 << CACHE_BITS); i++)
        Py_CLEAR(cache->obj[i]);
}

static unsigned slot_of(int64_t key)
{
    return (unsigned)(((uint64_t)key * 0x9E3779B97F4A7C15ull) >> (64 - CACHE_BITS));
}

typedef struct {
    PyObject *items[12];
    int n;
    int failed;
    cache_t *ints, *floats;
} rec_t;

static void push(rec_t *r, PyObject *o)
{
    if (o == NULL)
        r->failed = 1;
    r->items[r->n++] = o;
}

static void push_int(rec_t *r, int64_t v) /* unique values (line numbers, offsets) */
{
    push(r, PyLong_FromLongLong(v));
}

/* the cached object for key, borrowed; NULL: not cached */
static PyObject *cache_get(cache_t *c, int64_t key)
{
    unsigned i = slot_of(key);
    return (c->obj[i] != NULL && c->key[i] == key) ? c->obj[i] : NULL;
}

/* caches a new object (NULL: allocation failed, passed on); returns it borrowed */
static PyObject *cache_put(cache_t *c, int64_t key, PyObject *o)
{
    if (o != NULL) {
        unsigned i = slot_of(key);
        Py_XSETREF(c->obj[i], o);
        c->key[i] = key;
    }
    return o;
}

static void push_shared_int(rec_t *r, int64_t v)
{
    PyObject *o = cache_get(r->ints, v);
    if (o == NULL)
        o = cache_put(r->ints, v, PyLong_FromLongLong(v));
    push(r, o != NULL ? Py_NewRef(o) : NULL);
}

static void push_opt_int(rec_t *r, int64_t v)
{
    if (v == NO_INT)
        push(r, Py_NewRef(Py_None));
    else
        push_shared_int(r, v);
}

/* float(text) for \d+(\.\d+)?. Up to 15 significant digits the value is m / 10^k with m and
 * 10^k exact doubles, and IEEE division rounds correctly: the same double as Python's float()
 * (Clinger's fast path). Longer texts go through CPython's own conversion. */
static double to_double(cp s, size_t n)
{
    static const double pow10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                                   1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
    if (n <= 16) {
        uint64_t m = 0;
        int decimals = -1, digits = 0;
        for (size_t i = 0; i < n; i++) {
            if (s[i] == '.') {
                decimals = 0;
                continue;
            }
            m = m * 10 + (uint64_t)(s[i] - '0');
            digits++;
            if (decimals >= 0)
                decimals++;
        }
        if (digits <= 15)
            return (double)m / pow10[decimals < 0 ? 0 : decimals];
    }
    char buf[MAX_FLOAT + 1];
    memcpy(buf, s, n); /* decimal() keeps n <= MAX_FLOAT */
    buf[n] = '\0';
    return PyOS_string_to_double(buf, NULL, NULL);
}

static void push_float(rec_t *r, cp s, size_t n) /* float(text); s NULL: None */
{
    if (s == NULL) {
        push(r, Py_NewRef(Py_None));
        return;
    }
    double d = to_double(s, n);
    if (d == -1.0 && PyErr_Occurred()) {
        push(r, NULL);
        return;
    }
    int64_t bits;
    memcpy(&bits, &d, sizeof bits);
    PyObject *o = cache_get(r->floats, bits);
    if (o == NULL)
        o = cache_put(r->floats, bits, PyFloat_FromDouble(d));
    push(r, o != NULL ? Py_NewRef(o) : NULL);
}

static void reset(rec_t *r)
{
    for (int i = 0; i < r->n; i++)
        Py_XDECREF(r->items[i]);
    r->n = 0;
    r->failed = 0;
}

/* tuple.__new__(cls, items): the record takes the references */
static PyObject *build(PyObject *cls, rec_t *r)
{
    if (r->failed) {
        reset(r);
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)cls;
    PyObject *t = type->tp_alloc(type, r->n);
    if (t == NULL) {
        for (int i = 0; i < r->n; i++)
            Py_DECREF(r->items[i]);
        return NULL;
    }
    for (int i = 0; i < r->n; i++)
        PyTuple_SET_ITEM(t, i, r->items[i]);
    /* numbers, None, bools and str only: no reference cycle is possible, and CPython's GC
     * would untrack such a tuple at its first collection anyway */
    PyObject_GC_UnTrack(t);
    return t;
}

/* ------------------------------------------------------------------ shapes */

typedef struct { /* the text of a decimal number */
    cp s;
    size_t len;
} num_t;

typedef struct {
    cp body; /* the whole buffer, for `found better prompt` */
    PyObject **classes;
    PyObject *lru, *lcp;
    cache_t ints, floats;
} ctx_t;

enum result { R_SLOW, R_EVENT, R_BENIGN, R_ERROR };

static void common(rec_t *r, int64_t line_no, int64_t offset, int64_t slot, int64_t task)
{
    push_int(r, line_no);
    push_int(r, offset);
    push_opt_int(r, slot);
    push_opt_int(r, task);
}

/* "(pos_min = D, pos_max = D, n_tokens = D" ... ", size = F MiB(, took F ms)?)" tail pieces */
static cp ck_positions(cp p, cp e, int64_t *pmin, int64_t *pmax, int64_t *ntok)
{
    p = LIT(p, e, "(pos_min = ");
    p = uint_(p, e, pmin);
    p = LIT(p, e, ", pos_max = ");
    p = uint_(p, e, pmax);
    p = LIT(p, e, ", n_tokens = ");
    return uint_(p, e, ntok);
}

static cp ck_size_took(cp p, cp e, num_t *size, num_t *took)
{
    p = LIT(p, e, ", size = ");
    p = decimal(p, e, 1, &size->s, &size->len);
    p = LIT(p, e, " MiB");
    took->s = NULL;
    if (p != NULL && e - p >= 7 && memcmp(p, ", took ", 7) == 0) {
        p = decimal(p + 7, e, 1, &took->s, &took->len);
        p = LIT(p, e, " ms");
    }
    return LIT(p, e, ")");
}

/* CheckpointEvent's fields after Event's: pos_min .. took_ms (n_tokens_derived: False) */
static void push_checkpoint(rec_t *r, int64_t pmin, int64_t pmax, int64_t ntok, const num_t *size,
                            const num_t *took)
{
    push_shared_int(r, pmin);
    push_shared_int(r, pmax);
    push_shared_int(r, ntok);
    push(r, Py_NewRef(Py_False));
    push_float(r, size->s, size->len);
    push_float(r, took->s, took->len);
}

/* _CK_ANY's checkpoint branch, after the slot prefix */
static int ck_any(cp p, cp e, rec_t *r, int *kind)
{
    cp q;
    if ((q = LIT(p, e, "created")) != NULL)
        *kind = K_CREATED;
    else if ((q = LIT(p, e, "restored")) != NULL)
        *kind = K_RESTORED;
    else if ((q = LIT(p, e, "erased invalidated")) != NULL)
        *kind = K_ERASED;
    else if ((q = LIT(p, e, "erasing old")) != NULL)
        *kind = K_ERASED_OLD;
    else
        return 0;
    p = LIT(q, e, " context checkpoint ");
    int64_t index = NO_INT, capacity = NO_INT, pmin = 0, pmax = 0, ntok = 0, n_past = NO_INT, n_swa = NO_INT,
            pos_next = NO_INT;
    if (p != NULL && p < e && is_digit(*p)) {
        p = uint_(p, e, &index);
        p = LIT(p, e, " of ");
        p = uint_(p, e, &capacity);
        p = LIT(p, e, " ");
    }
    p = ck_positions(p, e, &pmin, &pmax, &ntok);
    if ((q = LIT(p, e, ", n_past = ")) != NULL)
        p = uint_(q, e, &n_past);
    if ((q = LIT(p, e, ", n_swa = ")) != NULL) {
        p = uint_(q, e, &n_swa);
        p = LIT(p, e, ", pos_next = ");
        p = uint_(p, e, &pos_next);
    }
    num_t size, took;
    p = ck_size_took(p, e, &size, &took);
    if (!end_(p, e))
        return 0;
    push_checkpoint(r, pmin, pmax, ntok, &size, &took);
    if (*kind == K_CREATED) {
        push_opt_int(r, index);
        push_opt_int(r, capacity);
    } else if (*kind == K_RESTORED) {
        push_opt_int(r, n_past);
    } else if (*kind == K_ERASED) {
        push_opt_int(r, n_swa);
        push_opt_int(r, pos_next);
    }
    return 1;
}

static int ck_line(cp s, cp e, int64_t ln, int64_t off, rec_t *r, int *kind)
{
    head_t h;
    cp p = any_head(s, e, &h);
    if (p != NULL) {
        common(r, ln, off, h.slot, h.task);
        if (ck_any(p, e, r, kind))
            return R_EVENT;
        if (p < e && (*p == 'c' || *p == 'C') && rest_without_bar(LIT(p + 1, e, "hecking checkpoint with ["), e))
            return R_BENIGN;
        reset(r); /* the regex's next alternatives */
    }
    if ((p = strict_head(s, e, &h)) != NULL) {
        common(r, ln, off, h.slot, h.task < 0 ? NO_INT : h.task);
        cp q = LIT(p, e, "superseding context checkpoint at n_tokens = ");
        int64_t n = 0, pmin = 0, pmax = 0;
        if (q != NULL) {
            q = uint_(q, e, &n);
            if (!end_(q, e))
                return R_SLOW;
            *kind = K_SUPERSEDED;
            push_shared_int(r, n);
            return R_EVENT;
        }
        q = LIT(p, e, "erasing context checkpoint too close to an earlier one ");
        q = ck_positions(q, e, &pmin, &pmax, &n);
        num_t size, took;
        q = ck_size_took(q, e, &size, &took);
        if (!end_(q, e))
            return R_SLOW;
        *kind = K_TOO_CLOSE;
        push_checkpoint(r, pmin, pmax, n, &size, &took);
        return R_EVENT;
    }
    /* srv + update: +- prompt 0x[0-9a-f]+: +\d+ tokens, checkpoints: +\d+, +\d+\.\d+ MiB */
    p = LIT(srv_head(s, e), e, "update:");
    p = LIT(spaces(p, e), e, "- prompt 0x");
    if (p == NULL)
        return R_SLOW;
    cp hex = p;
    while (p < e && (is_digit(*p) || (*p >= 'a' && *p <= 'f')))
        p++;
    if (p == hex)
        return R_SLOW;
    int64_t ignore;
    num_t mib;
    p = spaces(LIT(p, e, ":"), e);
    p = LIT(uint_(p, e, &ignore), e, " tokens, checkpoints:");
    p = LIT(uint_(spaces(p, e), e, &ignore), e, ",");
    p = LIT(decimal(spaces(p, e), e, 1, &mib.s, &mib.len), e, " MiB");
    return end_(p, e) ? R_BENIGN : R_SLOW;
}

static int is_space(unsigned char c) /* \s of a bytes regex */
{
    return c == ' ' || (c >= '\t' && c <= '\r');
}

/* the last occurrence of needle entirely inside [low, end), or NULL (bytes.rfind) */
static cp rfind(cp low, cp end, const char *needle, size_t n)
{
    if (end - low < (ptrdiff_t)n)
        return NULL;
    for (cp q = end - n;; q--) {
        if (*q == (unsigned char)needle[0] && memcmp(q, needle, n) == 0)
            return q;
        if (q == low)
            return NULL;
    }
}

/* [\d.]+ equal to the text of *want */
static cp same_number(cp p, cp e, const num_t *want)
{
    cp start = p;
    while (p != NULL && p < e && (is_digit(*p) || *p == '.'))
        p++;
    if (p == NULL || p == start || (size_t)(p - start) != want->len || memcmp(start, want->s, want->len) != 0)
        return NULL;
    return p;
}

/* logparse._Scanner.cache_entry_length: the length N of the last `prompt with length N, lcp = L,
 * f_keep = F, f_sim = S` candidate line with the same F and S, within 64 KiB before the line.
 * NO_INT: none; NEED_PY: a candidate's N has too many digits for int64. */
static int64_t cache_entry_length(const ctx_t *c, cp line, const num_t *keep, const num_t *sim)
{
    static const char needle[] = "prompt with length";
    cp low = (line - c->body > 65536) ? line - 65536 : c->body;
    for (cp at = rfind(low, line, needle, sizeof(needle) - 1); at != NULL;
         at = rfind(low, at, needle, sizeof(needle) - 1)) {
        /* prompt with length\s+(\d+), lcp =\s*\d+, f_keep = ([\d.]+), f_sim = ([\d.]+) */
        cp p = at + sizeof(needle) - 1, e = line, digits;
        int64_t n = 0, ignore;
        if (p >= e || !is_space(*p))
            continue;
        while (p < e && is_space(*p))
            p++;
        for (digits = p; digits < e && is_digit(*digits); digits++)
            ;
        if (digits - p > MAX_DIGITS)
            return NEED_PY;
        p = LIT(uint_(p, e, &n), e, ", lcp =");
        while (p != NULL && p < e && is_space(*p))
            p++;
        p = LIT(uint_(p, e, &ignore), e, ", f_keep = ");
        p = LIT(same_number(p, e, keep), e, ", f_sim = ");
        if (same_number(p, e, sim) != NULL)
            return n;
    }
    return NO_INT;
}

static int prompt_line(const ctx_t *c, cp s, cp e, int64_t ln, int64_t off, rec_t *r, int *kind)
{
    head_t h;
    int64_t a = 0, b = 0, n = 0;
    num_t x, y;
    cp q, p = any_head(s, e, &h);
    if (p != NULL) {
        common(r, ln, off, h.slot, h.task);
        if ((q = LIT(p, e, "new prompt, n_ctx_slot = ")) != NULL) {
            q = LIT(uint_(q, e, &a), e, ", n_keep = ");
            q = LIT(sint_(q, e, &b), e, ", task.n_tokens = ");
            q = uint_(q, e, &n);
            if (!end_(q, e))
                return R_SLOW;
            *kind = K_NEW_PROMPT;
            push_shared_int(r, a);
            push_shared_int(r, b);
            push_shared_int(r, n);
            return R_EVENT;
        }
        q = spaces(LIT(p, e, "prompt eval time ="), e);
        q = LIT(decimal(q, e, 0, &x.s, &x.len), e, " ms /");
        q = LIT(uint_(spaces(q, e), e, &n), e, " tokens (");
        while (q != NULL && q < e && *q != ')' && *q != '|')
            q++;
        if (end_(LIT(q, e, ")"), e)) {
            *kind = K_EVAL;
            push_float(r, x.s, x.len);
            push_shared_int(r, n);
            return R_EVENT;
        }
        reset(r); /* the regex's next alternatives */
    }
    if ((p = strict_head(s, e, &h)) != NULL) {
        if (!rest_without_bar(LIT(p, e, "forcing full prompt re-processing"), e))
            return R_SLOW;
        common(r, ln, off, h.slot, h.task < 0 ? NO_INT : h.task);
        *kind = K_FORCED;
        return R_EVENT;
    }
    p = srv_head(s, e);
    if (p == NULL)
        return R_SLOW;
    if ((q = LIT(p, e, "get_availabl: ")) != NULL) {
        if (end_(LIT(q, e, "updating prompt cache"), e))
            return R_BENIGN;
        q = LIT(q, e, "prompt cache update took ");
        q = LIT(decimal(q, e, 1, &x.s, &x.len), e, " ms");
        return end_(q, e) ? R_BENIGN : R_SLOW;
    }
    if ((q = LIT(p, e, "prompt_save:")) != NULL) {
        q = LIT(spaces(q, e), e, "- saving prompt with length ");
        q = LIT(uint_(q, e, &n), e, ", total state size = ");
        q = LIT(decimal(q, e, 1, &x.s, &x.len), e, " MiB");
        cp draft = LIT(q, e, " (draft: ");
        if (draft != NULL) {
            draft = LIT(decimal(draft, e, 1, &y.s, &y.len), e, " MiB)");
            if (draft != NULL)
                q = draft; /* the optional group, else the end check fails on " (draft" */
        }
        if (!end_(q, e))
            return R_SLOW;
        common(r, ln, off, NO_INT, NO_INT);
        *kind = K_SAVED;
        push_shared_int(r, n);
        push(r, Py_NewRef(Py_None));
        push_float(r, x.s, x.len);
        return R_EVENT;
    }
    if ((q = LIT(p, e, "load:")) != NULL) {
        /* read by the tolerant path in Python: its head rule takes these level letters and at
         * most 160 characters before the phrase */
        unsigned char level = stamp(s, e)[-2];
        q = spaces(q, e);
        if (strchr("IWEDNTZ", level) == NULL || q == NULL || q + 2 - s > 160)
            return R_SLOW;
        q = LIT(q, e, "- found better prompt with f_keep = ");
        q = LIT(decimal(q, e, 1, &x.s, &x.len), e, ", f_sim = ");
        q = decimal(q, e, 1, &y.s, &y.len);
        if (!end_(q, e))
            return R_SLOW;
        int64_t length = cache_entry_length(c, s, &x, &y);
        if (length == NEED_PY)
            return R_SLOW;
        common(r, ln, off, NO_INT, NO_INT);
        *kind = K_LOADED;
        push_opt_int(r, length);
        push(r, Py_NewRef(Py_None));
        push_float(r, x.s, x.len);
        push_float(r, y.s, y.len);
        return R_EVENT;
    }
    return R_SLOW;
}

static int trim_line(cp s, cp e, int64_t ln, int64_t off, rec_t *r, int *kind)
{
    head_t h;
    int64_t n = 0, p0 = 0;
    cp p = LIT(any_head(s, e, &h), e, "cached n_tokens = ");
    p = LIT(uint_(p, e, &n), e, ", memory_seq_rm [");
    p = LIT(uint_(p, e, &p0), e, ", end)");
    if (!end_(p, e))
        return R_SLOW;
    common(r, ln, off, h.slot, h.task);
    *kind = K_TRIM;
    push_shared_int(r, n);
    push_shared_int(r, p0);
    return R_EVENT;
}

static int selected_line(const ctx_t *c, cp s, cp e, int64_t ln, int64_t off, rec_t *r, int *kind)
{
    head_t h;
    num_t sim, thold, keep;
    int64_t t_last;
    cp p = LIT(strict_head(s, e, &h), e, "selected slot by ");
    if (p == NULL)
        return R_SLOW;
    cp q = LIT(p, e, "LCP similarity, ");
    if (q != NULL) {
        cp f = LIT(q, e, "f_");
        q = LIT(f != NULL ? f : q, e, "sim_best = ");
        q = LIT(decimal(q, e, 1, &sim.s, &sim.len), e, " (> ");
        q = LIT(decimal(q, e, 1, &thold.s, &thold.len), e, " thold), f_keep = ");
        q = decimal(q, e, 1, &keep.s, &keep.len);
        if (!end_(q, e))
            return R_SLOW;
        common(r, ln, off, h.slot, h.task < 0 ? NO_INT : h.task);
        push(r, Py_NewRef(c->lcp));
        push_float(r, sim.s, sim.len);
        push_float(r, keep.s, keep.len);
    } else {
        q = sint_(LIT(p, e, "LRU, t_last = "), e, &t_last);
        if (!end_(q, e))
            return R_SLOW;
        common(r, ln, off, h.slot, h.task < 0 ? NO_INT : h.task);
        push(r, Py_NewRef(c->lru));
        push(r, Py_NewRef(Py_None));
        push(r, Py_NewRef(Py_None));
    }
    *kind = K_SELECTED;
    return R_EVENT;
}

/* One candidate line: R_EVENT (record in *out), R_BENIGN, R_SLOW or R_ERROR. */
static int read_line(ctx_t *c, cp s, cp e, int word, int64_t ln, int64_t off, PyObject **out,
                     int *kind_out)
{
    rec_t r = {.n = 0, .failed = 0, .ints = &c->ints, .floats = &c->floats};
    int kind = -1, res;
    switch (word) {
    case W_CK: res = ck_line(s, e, ln, off, &r, &kind); break;
    case W_PROMPT: res = prompt_line(c, s, e, ln, off, &r, &kind); break;
    case W_TRIM: res = trim_line(s, e, ln, off, &r, &kind); break;
    case W_SELECTED: res = selected_line(c, s, e, ln, off, &r, &kind); break;
    default: res = R_SLOW;
    }
    if (res != R_EVENT) {
        reset(&r);
        return res;
    }
    *kind_out = kind;
    *out = build(c->classes[kind], &r);
    return *out == NULL ? R_ERROR : R_EVENT;
}

/* ------------------------------------------------------------------ scan() */

static PyObject *scan(PyObject *self, PyObject *args)
{
    Py_buffer buf;
    Py_ssize_t lo, hi;
    long long base_line, base_offset;
    PyObject *classes, *strings;
    int search_variant = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*nnLLO!O!|i", &buf, &lo, &hi, &base_line, &base_offset, &PyTuple_Type,
                          &classes, &PyTuple_Type, &strings, &search_variant))
        return NULL;
    search_fn search = pick_search(search_variant);
    PyObject *result = NULL, *events = NULL, *slow = NULL;
    ctx_t *ctx = NULL;
    if (search == NULL) {
        PyErr_Format(PyExc_ValueError, "scan: search variant %d is not available here", search_variant);
        goto done;
    }
    if (lo < 0 || hi < lo || hi > buf.len) {
        PyErr_SetString(PyExc_ValueError, "scan: 0 <= lo <= hi <= len(body) expected");
        goto done;
    }
    if (PyTuple_GET_SIZE(classes) != N_KINDS || PyTuple_GET_SIZE(strings) != 2) {
        PyErr_SetString(PyExc_ValueError, "scan: 13 event classes and (\"lru\", \"lcp\") expected");
        goto done;
    }
    for (int i = 0; i < N_KINDS; i++) {
        PyObject *cls = PyTuple_GET_ITEM(classes, i);
        if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, &PyTuple_Type)) {
            PyErr_SetString(PyExc_TypeError, "scan: event classes must be tuple subclasses");
            goto done;
        }
    }
    /* the number caches (zeroed here) live for this call only */
    ctx_t c = {.body = buf.buf,
               .classes = &PyTuple_GET_ITEM(classes, 0),
               .lru = PyTuple_GET_ITEM(strings, 0), .lcp = PyTuple_GET_ITEM(strings, 1)};
    ctx = &c;
    events = PyList_New(0);
    slow = PyList_New(0);
    if (events == NULL || slow == NULL)
        goto done;
    Py_ssize_t counts[N_KINDS] = {0}, candidates = 0, ignored = 0;
    int64_t newlines = 0;
    /* The region is searched for the next trigger word; its line is read, and the search goes
     * on after that line. Lines are numbered by counting the newlines skipped. The loads of the
     * vector search may read on to the end of the buffer. */
    cp body = buf.buf, from = body + lo, limit = body + hi, readable = body + buf.len;
    cp counted = from; /* newlines before `counted` are in `newlines` */
    for (cp p = from; p < limit;) {
        found_t hit = search(from, limit, p, readable);
        if (hit.at == NULL)
            break;
        cp s = line_start(p, hit.at);
        cp nl = memchr(hit.at, '\n', (size_t)(limit - hit.at));
        cp e = nl != NULL ? nl : limit;
        newlines += count_newlines(counted, s);
        counted = s;
        int64_t ln = base_line + newlines + 1, off = base_offset + (s - from);
        PyObject *ev = NULL;
        int kind = 0;
        int res = (e - s > MAX_LINE) ? R_SLOW : read_line(&c, s, e, hit.word, ln, off, &ev, &kind);
        if (res == R_ERROR)
            goto done;
        if (res == R_SLOW) {
            PyObject *item = Py_BuildValue("(nnnLi)", PyList_GET_SIZE(events), (Py_ssize_t)(s - body),
                                           (Py_ssize_t)(e - body), (long long)ln, hit.word);
            if (item == NULL || PyList_Append(slow, item) < 0) {
                Py_XDECREF(item);
                goto done;
            }
            Py_DECREF(item);
        } else if (res == R_BENIGN) {
            candidates++;
            ignored++;
        } else {
            candidates++;
            counts[kind]++;
            int failed = PyList_Append(events, ev);
            Py_DECREF(ev);
            if (failed < 0)
                goto done;
        }
        if (nl == NULL)
            break;
        p = nl + 1;
    }
    newlines += count_newlines(counted, limit);
    PyObject *tally = PyTuple_New(N_KINDS);
    if (tally == NULL)
        goto done;
    for (int i = 0; i < N_KINDS; i++)
        PyTuple_SET_ITEM(tally, i, PyLong_FromSsize_t(counts[i]));
    result = Py_BuildValue("(OOLnnN)", events, slow, (long long)newlines, candidates, ignored, tally);
done:
    if (ctx != NULL) {
        cache_clear(&ctx->ints);
        cache_clear(&ctx->floats);
    }
    Py_XDECREF(events);
    Py_XDECREF(slow);
    PyBuffer_Release(&buf);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "scan(body, lo, hi, base_line, base_offset, classes, strings, search=0) -> "
                                 "(events, slow, newlines, candidates, ignored, counts)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "shadowlab._logscan",
    .m_doc = "The log parser's whole-line fast path in C; shadowlab/logparse.py is the specification.",
    .m_size = 0,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__logscan(void)
{
#if defined(__GNUC__) && defined(__x86_64__)
    __builtin_cpu_init(); /* before __builtin_cpu_supports, as GCC documents */
#endif
    PyObject *m = PyModule_Create(&module);
    /* logparse.py uses this module only when ABI is the one it was written for: a stale build
     * left in the tree after an update must not mislabel fields */
    if (m != NULL && PyModule_AddIntConstant(m, "ABI", LOGSCAN_ABI) < 0)
        Py_CLEAR(m);
    return m;
}
