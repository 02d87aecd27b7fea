/* shadowlab._logscan: the log parser's whole-line fast path in C (optional accelerator).
 *
 * shadowlab/logs/parse.py is the specification. For each complete line of a block this module
 * does what `_Scanner._scan_body` does in Python: it finds the line's first trigger word (the
 * same six scan words and trigger phrases as `_scan_regexes`), and tries that word's
 * whole-line shapes (`_CK_ANY`, `_CK_STRICT`, `_PROMPT_ANY`, `_PROMPT_STRICT`, `_TRIM_ANY`,
 * `_SELECTED_STRICT`), written out here as small hand parsers. A line that matches becomes an
 * event record (built like `tuple.__new__(cls, fields)`) or an ignored benign line; every other
 * candidate line is handed back to Python, which reads it with its own fast regex or tolerant
 * path. So this module may only ever be stricter than Python, never different: a number with
 * more than 18 digits, a line longer than MAX_LINE, the headless `prompt eval time` form, the
 * `kv cache rm` word, a `found better prompt` whose look-back reaches before the block and the
 * start-up line `model loaded` (once per server start) all go back to Python. tests/shadowlab/test_logscan.py compares both paths on every fixture line, on
 * mutated lines and on random garbage.
 *
 *   scan(body, lo, hi, base_line, base_offset, classes, strings, search=0) ->
 *       (events, slow, newlines, candidates, ignored, counts)
 *
 * It works in batches: the search and the line parsers write plain C records (no Python
 * object, see find_batch), then build_batch makes the objects of those records.
 *
 * body        a bytes-like object; body[lo:hi] holds complete lines (the last may lack its
 *             newline), body[lo] is at file offset base_offset and starts line base_line + 1
 * search      which trigger search runs (0: the fastest here; see pick_search)
 * classes     tuple of the 15 event classes, in the order of enum kind below
 * strings     ("lru", "lcp", "id"): the SlotSelected.method values
 * events      list of event records of the lines handled here, in line order
 * slow        list of (index, start, stop, line_no, word): a candidate line body[start:stop] for
 *             Python, to be read before events[index]
 * newlines    newlines in body[lo:hi]; candidates / ignored: lines handled here (events +
 *             benign) and benign lines; counts: events per class
 */
#define _GNU_SOURCE /* memrchr */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum kind {
    K_CREATED, K_RESTORED, K_ERASED, K_ERASED_OLD, K_TOO_CLOSE, K_SUPERSEDED, K_FORCED,
    K_NEW_PROMPT, K_TRIM, K_EVAL, K_SELECTED, K_SAVED, K_LOADED, K_CLEARED, K_STARTED, N_KINDS
};
/* the scan words of logparse._SCAN_WORDS, in its order */
enum word { W_CK, W_PROMPT, W_TRIM, W_KV, W_SELECTED, W_STARTED, W_NONE = -1 };

#define LOGSCAN_ABI 8      /* logparse._ACCEL_ABI: bump when scan()'s arguments or results change */
#define MAX_LINE (1 << 20) /* logparse.MAX_LINE */
#define LOOK_BACK (1 << 16) /* logparse.LOOK_BACK */
#define MAX_DIGITS 18      /* beyond this Python's int() reads the number */
#define MAX_FLOAT 40       /* characters of a decimal number read here */
#define NO_INT INT64_MIN   /* an optional integer group that did not match */
#define NEED_PY (INT64_MIN + 1) /* only Python can tell: the line goes back to it */

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
    case W_STARTED:
        return AFTER("model loaded");
    case W_PROMPT:
        if (!AFTER("prompt"))
            return 0;
        return BEFORE("forcing full ") || (BEFORE("new ") && AFTER("prompt,")) ||
               AFTER("prompt eval time") || AFTER("prompt cache") ||
               (BEFORE("saving ") && AFTER("prompt with length")) || BEFORE("found better ") ||
               (BEFORE("clearing ") && AFTER("prompt with"));
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
    case 'm': /* two words start with it */
        return trigger_at(s, e, at, W_TRIM) ? W_TRIM : trigger_at(s, e, at, W_STARTED) ? W_STARTED : W_NONE;
    case 'k': w = W_KV; break;
    case 's': w = W_SELECTED; break;
    default: return W_NONE;
    }
    return trigger_at(s, e, at, w) ? w : W_NONE;
}

typedef struct {
    cp at; /* where the trigger starts, NULL: none */
    int word;
} hit_t;

static hit_t search_tail(cp s, cp e, cp p)
{
    for (; p < e; p++) {
        int w = trigger_word(s, e, p);
        if (w != W_NONE)
            return (hit_t){p, w};
    }
    return (hit_t){NULL, W_NONE};
}

/* The vector search: at 16 or 32 positions at a time, each word is looked for by two of its
 * bytes (Mula's SIMD-friendly substring search), a pair chosen to be rare in real logs:
 *   checkpoint    'k' at +4, 'p' at +5        prompt   'p' at +0, 'm' at +3
 *   memory_seq_rm 'm' at +0, 'q' at +9        kv cache rm  'v' at +1, 'm' at +10
 *   selected slot by  'c' at +4, 'y' at +15   model loaded 'm' at +0, 'd' at +9
 * (the two words of 'm' at +0 share its compare: one more compare and OR per vector)
 * (on the real b11434 captures almost every pair hit is the word). Each hit is checked by
 * trigger_word(), in position order. READ_AHEAD: how far past a position the loads reach. */
#define READ_AHEAD (15 + 32)

/* MASK(hit) turns a vector of 0x00 / 0xff lanes into an integer with a bit per lane (pmovmskb). */
#define SEARCH_BODY(V, WIDTH, MASK)                                                   \
    const V zero = {0};                                                                                   \
    const V k = zero + 'k', p_ = zero + 'p', m = zero + 'm', q = zero + 'q', v = zero + 'v',              \
            c = zero + 'c', y = zero + 'y', d = zero + 'd';                                              \
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
        V hit = (V)(((a4 == k) & (a5 == p_)) | ((a0 == p_) & (a3 == m)) | ((a0 == m) & ((a9 == q) | (a9 == d))) | \
                    ((a1 == v) & (a10 == m)) | ((a4 == c) & (a15 == y)));                                \
        for (uint32_t bits = MASK(hit); bits != 0; bits &= bits - 1) {                                   \
            cp at = p + __builtin_ctz(bits);                                                             \
            if (at >= e)                                                                                 \
                return (hit_t){NULL, W_NONE};                                                          \
            int w = trigger_word(s, e, at);                                                              \
            if (w != W_NONE)                                                                             \
                return (hit_t){at, w};                                                                 \
        }                                                                                                \
    }

/* The first trigger in [p, e) of the region [s, e); the loads may read up to `readable`. */
typedef hit_t (*search_fn)(cp s, cp e, cp p, cp readable);

static hit_t search_scalar(cp s, cp e, cp p, cp readable)
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

static hit_t search_v16(cp s, cp e, cp p, cp readable)
{
    SEARCH_BODY(v16, 16, MASK16)
    return search_tail(s, e, p);
}

__attribute__((target("avx2"))) static hit_t search_v32(cp s, cp e, cp p, cp readable)
{
    SEARCH_BODY(v32, 32, MASK32)
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
    /* byte counters (a match is -1, subtracted) summed by psadbw before they can overflow */
    const __m128i nl = _mm_set1_epi8('\n'), zero = _mm_setzero_si128();
    while (e - p >= 16) {
        __m128i acc = zero;
        for (int i = 0; i < 255 && e - p >= 16; i++, p += 16)
            acc = _mm_sub_epi8(acc, _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)p), nl));
        __m128i sums = _mm_sad_epu8(acc, zero);
        n += _mm_cvtsi128_si64(sums) + _mm_cvtsi128_si64(_mm_unpackhi_epi64(sums, sums));
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

typedef struct { /* the text of a decimal number */
    cp s;
    size_t len;
} num_t;

static void push_value(rec_t *r, int type, int64_t v)
{
    if (r->n < MAX_VALUES) { /* every shape pushes at most MAX_VALUES */
        r->type[r->n] = (uint8_t)type;
        r->v[r->n++] = v;
    }
}

static void push_none(rec_t *r) { push_value(r, V_NONE, 0); }
static void push_false(rec_t *r) { push_value(r, V_FALSE, 0); }
static void push_method(rec_t *r, int type) { push_value(r, type, 0); }
static void push_int(rec_t *r, int64_t v) { push_value(r, V_INT, v); }

static void push_opt_int(rec_t *r, int64_t v)
{
    if (v == NO_INT)
        push_none(r);
    else
        push_int(r, v);
}

/* float(text) for \d+(\.\d+)? with at most 15 significant digits: m / 10^k with m and 10^k
 * exact doubles, and IEEE division rounds correctly, so this is the double Python's float()
 * gives (Clinger's fast path). 0: longer, left to CPython's conversion in build(). */
static int fast_double(cp s, size_t n, double *out)
{
    static const double pow10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                                   1e12, 1e13, 1e14, 1e15};
    if (n > 16)
        return 0;
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
    if (digits > 15)
        return 0;
    *out = (double)m / pow10[decimals < 0 ? 0 : decimals];
    return 1;
}

static void push_float(const ctx_t *c, rec_t *r, cp s, size_t n) /* float(text); s NULL: None */
{
    double d;
    if (s == NULL)
        push_none(r);
    else if (fast_double(s, n, &d)) {
        int64_t bits;
        memcpy(&bits, &d, sizeof bits);
        push_value(r, V_FLOAT, bits);
    } else {
        push_value(r, V_FLOAT_TEXT, (s - c->body) << 8 | (int64_t)n); /* n <= MAX_FLOAT < 256 */
    }
}

static void common(rec_t *r, int64_t slot, int64_t task)
{
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
static void push_checkpoint(const ctx_t *c, rec_t *r, int64_t pmin, int64_t pmax, int64_t ntok,
                            const num_t *size, const num_t *took)
{
    push_int(r, pmin);
    push_int(r, pmax);
    push_int(r, ntok);
    push_false(r);
    push_float(c, r, size->s, size->len);
    push_float(c, r, took->s, took->len);
}

/* _CK_ANY's checkpoint branch, after the slot prefix */
static int ck_any(const ctx_t *c, cp p, cp e, rec_t *r, int *kind)
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
    push_checkpoint(c, r, pmin, pmax, ntok, &size, &took);
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

static int ck_line(const ctx_t *c, cp s, cp e, rec_t *r, int *kind)
{
    head_t h;
    cp p = any_head(s, e, &h);
    if (p != NULL) {
        common(r, h.slot, h.task);
        if (ck_any(c, p, e, r, kind))
            return R_EVENT;
        if (p < e && (*p == 'c' || *p == 'C') && rest_without_bar(LIT(p + 1, e, "hecking checkpoint with ["), e))
            return R_BENIGN;
        r->n = 0; /* the regex's next alternatives */
    }
    if ((p = strict_head(s, e, &h)) != NULL) {
        common(r, h.slot, h.task < 0 ? NO_INT : h.task);
        cp q = LIT(p, e, "superseding context checkpoint at n_tokens = ");
        int64_t n = 0, pmin = 0, pmax = 0;
        if (q != NULL) {
            q = uint_(q, e, &n);
            if (!end_(q, e))
                return R_SLOW;
            *kind = K_SUPERSEDED;
            push_int(r, n);
            return R_EVENT;
        }
        if ((q = LIT(uint_(p, e, &n), e, " tokens since last checkpoint at ")) != NULL) {
            q = LIT(uint_(q, e, &n), e, ", creating new checkpoint during processing at position ");
            return end_(uint_(q, e, &n), e) ? R_KNOWN : R_SLOW;
        }
        q = LIT(p, e, "erasing context checkpoint too close to an earlier one ");
        q = ck_positions(q, e, &pmin, &pmax, &n);
        num_t size, took;
        q = ck_size_took(q, e, &size, &took);
        if (!end_(q, e))
            return R_SLOW;
        *kind = K_TOO_CLOSE;
        push_checkpoint(c, r, pmin, pmax, n, &size, &took);
        return R_EVENT;
    }
    if ((p = LIT(srv_head(s, e), e, "load_model: ")) != NULL) { /* start-up lines: none holds a phrase */
        int64_t n = 0;
        if (end_(LIT(p, e, "speculative decoding will use checkpoints"), e))
            return R_BENIGN;
        p = LIT(p, e, "context checkpoints enabled, max = ");
        p = LIT(uint_(p, e, &n), e, ", min spacing = ");
        return end_(uint_(p, e, &n), e) ? R_BENIGN : R_SLOW;
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
 * f_keep = F, f_sim = S` candidate line with the same F and S, within LOOK_BACK bytes before
 * the line. NO_INT: none; NEED_PY: Python must tell (a candidate's N has too many digits for
 * int64, or none was found and the window reaches back before this region, into text only
 * Python kept). */
static int64_t cache_entry_length(const ctx_t *c, cp line, const num_t *keep, const num_t *sim)
{
    static const char needle[] = "prompt with length";
    cp low = (line - c->from >= LOOK_BACK) ? line - LOOK_BACK : c->from;
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
        p = same_number(p, e, sim);
        /* (?=[\s,)]|\Z): a number that runs on into other text is no f_sim */
        if (p != NULL && (p == e || is_space(*p) || *p == ',' || *p == ')'))
            return n;
    }
    return low == c->from && line - c->from < LOOK_BACK ? NEED_PY : NO_INT;
}

static int prompt_line(const ctx_t *c, cp s, cp e, rec_t *r, int *kind)
{
    head_t h;
    int64_t a = 0, b = 0, n = 0;
    num_t x, y;
    cp q, p = any_head(s, e, &h);
    if (p != NULL) {
        common(r, h.slot, h.task);
        if ((q = LIT(p, e, "new prompt, n_ctx_slot = ")) != NULL) {
            q = LIT(uint_(q, e, &a), e, ", n_keep = ");
            q = LIT(sint_(q, e, &b), e, ", task.n_tokens = ");
            q = uint_(q, e, &n);
            if (!end_(q, e))
                return R_SLOW;
            *kind = K_NEW_PROMPT;
            push_int(r, a);
            push_int(r, b);
            push_int(r, n);
            return R_EVENT;
        }
        q = spaces(LIT(p, e, "prompt eval time ="), e);
        q = LIT(decimal(q, e, 0, &x.s, &x.len), e, " ms /");
        q = LIT(uint_(spaces(q, e), e, &n), e, " tokens (");
        while (q != NULL && q < e && *q != ')' && *q != '|')
            q++;
        if (end_(LIT(q, e, ")"), e)) {
            *kind = K_EVAL;
            push_float(c, r, x.s, x.len);
            push_int(r, n);
            return R_EVENT;
        }
        r->n = 0; /* the regex's next alternatives */
    }
    if ((p = strict_head(s, e, &h)) != NULL) {
        if (end_(LIT(p, e, "saving idle slot to prompt cache"), e))
            return R_KNOWN; /* --cache-idle-slots; its prompt_save line follows */
        if ((q = LIT(p, e, "clearing prompt with ")) != NULL) {
            q = LIT(uint_(q, e, &n), e, " tokens");
            if (!end_(q, e))
                return R_SLOW;
            common(r, h.slot, NO_INT); /* task -1: between tasks */
            *kind = K_CLEARED;
            push_int(r, n);
            return R_EVENT;
        }
        if (!rest_without_bar(LIT(p, e, "forcing full prompt re-processing"), e))
            return R_SLOW;
        common(r, h.slot, h.task < 0 ? NO_INT : h.task);
        *kind = K_FORCED;
        return R_EVENT;
    }
    p = srv_head(s, e);
    if (p == NULL)
        return R_SLOW;
    if ((q = LIT(p, e, "load_model: ")) != NULL) { /* start-up lines: none holds a phrase */
        if (end_(LIT(q, e, "prompt cache is disabled - use `--cache-ram N` to enable it"), e) ||
            end_(LIT(q, e, "use `--cache-ram 0` to disable the prompt cache"), e))
            return R_BENIGN;
        q = LIT(q, e, "prompt cache is enabled, size limit: ");
        q = LIT(uint_(q, e, &n), e, " MiB");
        return end_(q, e) ? R_BENIGN : R_SLOW;
    }
    if (end_(LIT(p, e, "init: idle slots will be saved to prompt cache and cleared upon starting a new task"), e))
        return R_BENIGN;
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
        common(r, NO_INT, NO_INT);
        *kind = K_SAVED;
        push_int(r, n);
        push_none(r);
        push_float(c, r, x.s, x.len);
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
        common(r, NO_INT, NO_INT);
        *kind = K_LOADED;
        push_opt_int(r, length);
        push_none(r);
        push_float(c, r, x.s, x.len);
        push_float(c, r, y.s, y.len);
        return R_EVENT;
    }
    return R_SLOW;
}

static int trim_line(cp s, cp e, rec_t *r, int *kind)
{
    head_t h;
    int64_t n = 0, p0 = 0;
    cp p = LIT(any_head(s, e, &h), e, "cached n_tokens = ");
    p = LIT(uint_(p, e, &n), e, ", memory_seq_rm [");
    p = LIT(uint_(p, e, &p0), e, ", end)");
    if (!end_(p, e))
        return R_SLOW;
    common(r, h.slot, h.task);
    *kind = K_TRIM;
    push_int(r, n);
    push_int(r, p0);
    return R_EVENT;
}

static int selected_line(const ctx_t *c, cp s, cp e, rec_t *r, int *kind)
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
        common(r, h.slot, h.task < 0 ? NO_INT : h.task);
        push_method(r, V_LCP);
        push_float(c, r, sim.s, sim.len);
        push_float(c, r, keep.s, keep.len);
    } else { /* LRU, or a request that named its slot (id_slot): no similarity, no f_keep */
        int64_t id;
        cp by_id = LIT(p, e, "id (");
        q = by_id != NULL ? LIT(uint_(by_id, e, &id), e, ")") : sint_(LIT(p, e, "LRU, t_last = "), e, &t_last);
        if (!end_(q, e))
            return R_SLOW;
        common(r, h.slot, h.task < 0 ? NO_INT : h.task);
        push_method(r, by_id != NULL ? V_ID : V_LRU);
        push_none(r);
        push_none(r);
    }
    *kind = K_SELECTED;
    return R_EVENT;
}

/* b11434's start-up line `srv  llama_server: model loaded`: the tolerant path's headless rule
 * (a level letter its head pattern takes, at most 160 characters before the phrase) */
static int started_line(cp s, cp e, rec_t *r, int *kind)
{
    static const char phrase[] = "model loaded";
    cp p = stamp(s, e);
    if (p == NULL || strchr("IWEDNTZ", p[-2]) == NULL)
        return R_SLOW;
    p = LIT(LIT(spaces(LIT(p, e, "srv"), e), e, "llama_server: "), e, phrase);
    if (!end_(p, e) || p - (sizeof phrase - 1) - s > 160)
        return R_SLOW;
    common(r, NO_INT, NO_INT);
    *kind = K_STARTED;
    return R_EVENT;
}

/* One candidate line into r: R_EVENT, R_BENIGN, R_KNOWN or R_SLOW. */
static int read_line(const ctx_t *c, cp s, cp e, int word, rec_t *r)
{
    int kind = -1, res;
    r->n = 0;
    switch (word) {
    case W_CK: res = ck_line(c, s, e, r, &kind); break;
    case W_PROMPT: res = prompt_line(c, s, e, r, &kind); break;
    case W_TRIM: res = trim_line(s, e, r, &kind); break;
    case W_SELECTED: res = selected_line(c, s, e, r, &kind); break;
    case W_STARTED: res = started_line(s, e, r, &kind); break;
    default: res = R_SLOW;
    }
    r->kind = res == R_EVENT ? kind : -1;
    if (res == R_SLOW)
        r->n = 0;
    return res;
}

/* ------------------------------------------------------------------ finding and reading lines */

#define BATCH 2048 /* records read before their objects are built: they stay in the CPU's cache */

typedef struct {
    rec_t recs[BATCH]; /* the event and slow lines of this batch, in order */
    Py_ssize_t n;
    cp p;        /* where the search goes on */
    cp counted;  /* the newlines before it are in `newlines` */
    int64_t newlines;
    Py_ssize_t candidates, ignored; /* benign lines counted here; events by the builder */
    Py_ssize_t max;                 /* records per batch: BATCH, or fewer for the fold */
} finder_t;

/* The next batch of the region [c->from, limit): the region is searched for the next trigger
 * word, its line is read, and the search goes on after that line. Lines are numbered by
 * counting the newlines skipped. The loads of the vector search may read on to `readable`.
 * Touches no Python object. Returns 1 when the region is done. */
static int find_batch(finder_t *f, const ctx_t *c, cp limit, cp readable, search_fn search)
{
    f->n = 0;
    while (f->p < limit && f->n < f->max) {
        hit_t hit = search(c->from, limit, f->p, readable);
        if (hit.at == NULL) {
            f->p = limit;
            break;
        }
        cp s = line_start(f->p, hit.at);
        cp nl = memchr(hit.at, '\n', (size_t)(limit - hit.at));
        cp e = nl != NULL ? nl : limit;
        f->newlines += count_newlines(f->counted, s);
        f->counted = s;
        rec_t *r = &f->recs[f->n];
        int res = (e - s > MAX_LINE) ? R_SLOW : read_line(c, s, e, hit.word, r);
        if (res == R_BENIGN || res == R_KNOWN) {
            f->candidates++;
            f->ignored += res == R_BENIGN;
        } else {
            r->result = (int8_t)res;
            r->word = (int8_t)hit.word;
            r->line = f->newlines;
            r->start = s - c->body;
            r->stop = e - c->body;
            f->n++;
        }
        f->p = nl != NULL ? nl + 1 : limit;
    }
    if (f->p < limit)
        return 0;
    f->newlines += count_newlines(f->counted, limit);
    f->counted = limit;
    return 1;
}

/* ------------------------------------------------------------------ building objects */

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

/* a new reference to the object for key, made by make(key) when not cached */
static PyObject *cached(cache_t *c, int64_t key, PyObject *(*make)(int64_t))
{
    unsigned i = (unsigned)(((uint64_t)key * 0x9E3779B97F4A7C15ull) >> (64 - CACHE_BITS));
    if (c->obj[i] == NULL || c->key[i] != key) {
        PyObject *o = make(key);
        if (o == NULL)
            return NULL;
        Py_XSETREF(c->obj[i], o);
        c->key[i] = key;
    }
    return Py_NewRef(c->obj[i]);
}

static PyObject *make_int(int64_t v) { return PyLong_FromLongLong(v); }

static PyObject *make_float(int64_t bits)
{
    double d;
    memcpy(&d, &bits, sizeof d);
    return PyFloat_FromDouble(d);
}

typedef struct {
    cp body;
    PyObject **classes;
    PyObject *lru, *lcp, *id;
    cache_t ints, floats;
} builder_t;

static PyObject *value_object(builder_t *b, int type, int64_t v)
{
    switch (type) {
    case V_NONE: return Py_NewRef(Py_None);
    case V_FALSE: return Py_NewRef(Py_False);
    case V_LRU: return Py_NewRef(b->lru);
    case V_LCP: return Py_NewRef(b->lcp);
    case V_ID: return Py_NewRef(b->id);
    case V_INT: return cached(&b->ints, v, make_int);
    case V_FLOAT: return cached(&b->floats, v, make_float);
    case V_FLOAT_TEXT: { /* more digits than the fast path reads: CPython's own conversion */
        char text[MAX_FLOAT + 1];
        size_t len = (size_t)(v & 0xff);
        memcpy(text, b->body + (v >> 8), len);
        text[len] = '\0';
        double d = PyOS_string_to_double(text, NULL, NULL);
        return (d == -1.0 && PyErr_Occurred()) ? NULL : PyFloat_FromDouble(d);
    }
    }
    PyErr_SetString(PyExc_SystemError, "_logscan: unknown value type");
    return NULL;
}

/* tuple.__new__(cls, (line, offset, *values)) */
static PyObject *record_object(builder_t *b, const rec_t *r, int64_t line, int64_t offset)
{
    PyTypeObject *type = (PyTypeObject *)b->classes[r->kind];
    PyObject *items[2 + MAX_VALUES];
    int n = 2 + r->n, ok = 1;
    items[0] = PyLong_FromLongLong(line);
    items[1] = PyLong_FromLongLong(offset);
    for (int i = 0; i < r->n; i++)
        items[2 + i] = value_object(b, r->type[i], r->v[i]);
    for (int i = 0; i < n; i++)
        ok &= items[i] != NULL;
    PyObject *t = ok ? type->tp_alloc(type, n) : NULL;
    if (t == NULL) {
        for (int i = 0; i < n; i++)
            Py_XDECREF(items[i]);
        return NULL;
    }
    for (int i = 0; i < n; i++)
        PyTuple_SET_ITEM(t, i, items[i]);
    /* numbers, None, bools and str only: no reference cycle is possible, and CPython's GC
     * would untrack such a tuple at its first collection anyway */
    PyObject_GC_UnTrack(t);
    return t;
}

static int check_classes(PyObject *classes, PyObject *strings)
{
    if (PyTuple_GET_SIZE(classes) != N_KINDS || PyTuple_GET_SIZE(strings) != 3) {
        PyErr_SetString(PyExc_ValueError, "15 event classes and (\"lru\", \"lcp\", \"id\") expected");
        return -1;
    }
    for (int i = 0; i < N_KINDS; i++) {
        PyObject *cls = PyTuple_GET_ITEM(classes, i);
        if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, &PyTuple_Type)) {
            PyErr_SetString(PyExc_TypeError, "event classes must be tuple subclasses");
            return -1;
        }
    }
    return 0;
}

/* Appends the objects of a batch's records to events / slow; counts events per kind. */
static int build_batch(builder_t *b, const finder_t *f, PyObject *events, PyObject *slow, long long base_line,
                       long long base_offset, cp from, Py_ssize_t *counts)
{
    for (Py_ssize_t i = 0; i < f->n; i++) {
        const rec_t *r = &f->recs[i];
        int64_t line = base_line + r->line + 1;
        PyObject *item;
        PyObject *into = r->result == R_SLOW ? slow : events;
        if (r->result == R_SLOW)
            item = Py_BuildValue("(nnnLi)", PyList_GET_SIZE(events), (Py_ssize_t)r->start, (Py_ssize_t)r->stop,
                                 (long long)line, (int)r->word);
        else
            item = record_object(b, r, line, base_offset + (b->body + r->start - from));
        if (item == NULL || PyList_Append(into, item) < 0) {
            Py_XDECREF(item);
            return -1;
        }
        Py_DECREF(item);
        if (r->result != R_SLOW)
            counts[r->kind]++;
    }
    return 0;
}

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
    PyObject *events = NULL, *slow = NULL, *result = NULL;
    finder_t *f = NULL;
    builder_t *b = NULL;
    search_fn search = pick_search(search_variant);
    if (search == NULL) {
        PyErr_Format(PyExc_ValueError, "scan: search variant %d is not available here", search_variant);
        goto done;
    }
    if (lo < 0 || hi < lo || hi > buf.len) {
        PyErr_SetString(PyExc_ValueError, "scan: 0 <= lo <= hi <= len(body) expected");
        goto done;
    }
    if (check_classes(classes, strings) < 0)
        goto done;
    f = PyMem_Malloc(sizeof *f); /* 240 KiB of records and 16 KiB of caches: not on the stack */
    b = PyMem_Calloc(1, sizeof *b);
    events = PyList_New(0);
    slow = PyList_New(0);
    if (f == NULL || b == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (events == NULL || slow == NULL)
        goto done;
    cp body = buf.buf;
    const ctx_t c = {.body = body, .from = body + lo};
    f->p = f->counted = body + lo;
    f->newlines = f->candidates = f->ignored = 0;
    f->max = BATCH;
    b->body = body;
    b->classes = &PyTuple_GET_ITEM(classes, 0);
    b->lru = PyTuple_GET_ITEM(strings, 0);
    b->lcp = PyTuple_GET_ITEM(strings, 1);
    b->id = PyTuple_GET_ITEM(strings, 2);
    Py_ssize_t counts[N_KINDS] = {0};
    int done;
    do {
        done = find_batch(f, &c, body + hi, body + buf.len, search);
        if (build_batch(b, f, events, slow, base_line, base_offset, c.from, counts) < 0)
            goto done;
    } while (!done);
    PyObject *tally = PyTuple_New(N_KINDS);
    if (tally == NULL)
        goto done;
    for (int i = 0; i < N_KINDS; i++)
        PyTuple_SET_ITEM(tally, i, PyLong_FromSsize_t(counts[i]));
    result = Py_BuildValue("(OOLnnN)", events, slow, (long long)f->newlines,
                           f->candidates + PyList_GET_SIZE(events), f->ignored, tally);
done:
    if (b != NULL) {
        cache_clear(&b->ints);
        cache_clear(&b->floats);
    }
    PyMem_Free(b);
    PyMem_Free(f);
    Py_XDECREF(events);
    Py_XDECREF(slow);
    PyBuffer_Release(&buf);
    return result;
}

/* ================================================================== fold: shadowlab logs' replay
 *
 *   fold_new(rows) -> state
 *   fold_block(state, body, lo, n, base_line, base_offset) -> newlines | (start, stop, line_no, word) | str
 *   fold_events(state, body, n, base_offset, [(kind, event), ...]) -> None | str
 *   fold_finish(state) -> dict | str
 *
 * What `shadowlab logs` does with a b11434 log, per block and without a Python object per line:
 * the lines scan() reads, the `checking sim` / `checking checkpoint ... against N` side notes of
 * logs._Stream._side_notes, lifecycle.Replay.run (rings, requests, restarts), logs._Clock
 * (b11434 elapsed times) and logs.Figures.add per slot. A start-up line (handed back, read by
 * Python: a server_start event) is a restart as Replay makes it, at the same place. lifecycle.py and logs.py are the
 * specification; tests/shadowlab/test_logscan.py compares both on every log it has. A line
 * scan() would hand back to Python is handed back here too (fold_block stops at it; Python
 * reads it with logparse's own readers and gives its events to fold_events). Anything this code
 * does not handle exactly (a prompt-cache save or load, a slot clear, a number past int64, a ring or slot
 * table past its bound) ends the fold with the reason as a str: logs.py then reads that server
 * again with the Python replay. `rows`: how many
 * of the first requests to give whole (logs.MAX_ROWS less the rows already shown). */

#define FOLD_SLOTS 256      /* distinct slot ids; more: the Python replay */
#define FOLD_BATCH 16       /* records read before they are folded: still in L1 (2048: 30% of the
                               fold's own time went to reading them back from further out) */
#define FOLD_RING 4096      /* checkpoints alive in one slot; more: the Python replay */
#define PENDING_CHECKS 4096 /* lifecycle._PENDING_CHECKS */
#define CHECK_TABLE 16384   /* open addressing, > 2 * PENDING_CHECKS */
#define TOUCHED 64
#define MAX_NOTES 20        /* lifecycle.Ring's max_notes default and Replay.notes' cap */
#define BASELINE_TOKENS 512 /* lifecycle.BASELINE_TOKENS */
#define MAX_SAVED 4096      /* lifecycle.MAX_SAVED: prompt-cache entries one slot keeps */
#define SAVED_CHECKPOINTS (1 << 20) /* checkpoints in all entries together; more: the Python replay */
#define N_OUTCOMES 5        /* lifecycle.OUTCOMES: cold extended restored forced silent_reset */
#define N_EVENT_COUNTS 9    /* logs.EVENT_COUNT_KINDS */
enum outcome { O_COLD, O_EXTENDED, O_RESTORED, O_FORCED, O_SILENT };
enum source { S_NONE, S_LCP, S_NPAST, S_REENTRY };

typedef struct {
    int64_t pmin, pmax, n, creator; /* creator: the request that made it (lifecycle._among) */
    double size, took;
    int has_size, has_took;
} ck_t;

/* The growable arrays below: `v` with room for one more item (cap doubled from `first`), NULL
 * when there is no memory (then `v` and *cap are unchanged). */
static void *room(void *v, Py_ssize_t n, Py_ssize_t *cap, size_t item, Py_ssize_t first)
{
    if (n < *cap)
        return v;
    Py_ssize_t c = *cap ? 2 * *cap : first;
    void *grown = PyMem_Realloc(v, (size_t)c * item);
    if (grown != NULL)
        *cap = c;
    return grown;
}

typedef struct {
    int64_t *v;
    Py_ssize_t n, cap;
} vec_t;

static int vec_push(vec_t *a, int64_t x)
{
    int64_t *v = room(a->v, a->n, &a->cap, sizeof *v, 256);
    if (v == NULL)
        return -1;
    a->v = v;
    a->v[a->n++] = x;
    return 0;
}

typedef struct {
    ck_t *v;
    Py_ssize_t n, cap;
} cks_t;

static int cks_push(cks_t *a, const ck_t *c)
{
    ck_t *v = room(a->v, a->n, &a->cap, sizeof *v, 16);
    if (v == NULL)
        return -1;
    a->v = v;
    a->v[a->n++] = *c;
    return 0;
}

typedef struct { /* logs.Figures of one slot */
    int64_t requests, outcomes[N_OUTCOMES], events[N_EVENT_COUNTS], shared_stated, prompt_tokens, reusable,
        reused, processed, avoidable, timed_tokens, placement, retention, baseline, create_n, create_mib_n,
        create_ms_n, restore_n, restore_mib_n, restore_ms_n;
    double prefill_ms, create_mib, create_ms, restore_mib, restore_ms, t0, t1;
    int has_t;
    vec_t shared, prompts;
} fig_t;

typedef struct { /* lifecycle.Served while it is read */
    int open, fresh, forced, has_time, has_trim, has_prompt, has_restored, has_processed, has_lcp;
    int64_t task, line, offset, serial, trim, n_prompt, processed, lcp, lcp_n, n_alive;
    double time, ms;
    ck_t restored;
    int64_t restored_npast; /* NO_INT: not printed */
    cks_t created;
    int erase_kind[4], n_erase_kinds; /* erase_counts' keys in first-seen order */
    int64_t erase_count[4];
    int erased_any;
    int64_t cache_saved, cache_loaded;
    int64_t not_own, not_own_min; /* what it erased of checkpoints made before it */
    cks_t alive_before;           /* kept only while its row may be shown, or with --trace */
    int64_t piece_line;           /* its piece's start (for the trace's line within its piece) */
    int64_t shared_with;          /* the task whose prompt the slot held, NO_INT: None */
} req_t;

typedef struct { /* a prompt-cache entry saved from a slot: Ring.saved[key] */
    int64_t key; /* the entry's n_tokens, NO_INT: None */
    int64_t owner; /* Ring.owners: the task whose prompt it holds, NO_INT: None */
    cks_t cks;
} entry_t;

typedef struct {
    int kind; /* K_SAVED or K_LOADED */
    int placed; /* applied to the slot a clear named (Replay._placed) */
    int64_t n, line;
} held_t;

typedef struct {
    int64_t id, ring_seq, lcp_epoch, lcp, lcp_n, ebl_count, ebl_min, fig_order;
    int64_t content; /* Ring.content: the task whose prompt the slot holds, NO_INT: None */
    int has_ring, has_ebl;
    cks_t alive;
    entry_t *saved; /* oldest first */
    Py_ssize_t n_saved, cap_saved;
    PyObject *notes; /* the ring's notes (a list), NULL: none yet */
    req_t req;
    fig_t fig;
} slot_t;

typedef struct {
    int64_t slot, task, against;
    int state; /* 0 empty, 1 used, 2 removed */
} check_t;

typedef struct {
    slot_t slots[FOLD_SLOTS];
    int n_slots, cur; /* cur: the slot of the request being read, -1: none */
    int64_t cur_task, last_task, n_swa, restarts, serial, ring_seq, epoch, emitted, rows_wanted, fig_order;
    int has_n_swa, has_first, has_clock, began; /* began: a start line or a request was seen */
    double first_time, clock_base, clock_last;
    check_t checks[CHECK_TABLE];
    int checks_live, checks_used; /* used: entries not empty (live or removed) */
    int touched[TOUCHED];         /* the first entries used, to clear them one by one */
    PyObject *notes, *rows, *times, *codes; /* lists and bytearrays */
    const char *fallback;
    struct note_s *block_notes; /* the side notes of the block being read, and the next to take */
    Py_ssize_t n_block_notes, next_note;
    unsigned char *last_head; /* the head of the last check note taken (logs._Stream.last_check) */
    size_t last_len;
    held_t *held; /* Replay._held's prompt-cache lines (its slot selections change nothing) */
    Py_ssize_t n_held, cap_held, last_save; /* last_save: Replay._last_save's index in held, -1: None */
    int64_t saved_checkpoints; /* in every slot's entries */
    int has_slot_filter, has_since, has_until; /* the filters (logs.Options) */
    int64_t slot_filter, piece_line;           /* piece_line: the stream line its piece starts after */
    double since, until;
    PyObject *server_json; /* --trace: the server's name as JSON (bytes); NULL: no trace */
    char *tr;              /* the trace lines not yet taken (fold_trace) */
    size_t tr_n, tr_cap;
    int64_t kinds[N_KINDS]; /* events read, per kind (logparse's ParseStats.kinds) */
} fold_t;

static slot_t *slot_find(fold_t *f, int64_t id)
{
    for (int i = 0; i < f->n_slots; i++)
        if (f->slots[i].id == id)
            return &f->slots[i];
    return NULL;
}

static slot_t *slot_of(fold_t *f, int64_t id)
{
    for (int i = 0; i < f->n_slots; i++)
        if (f->slots[i].id == id)
            return &f->slots[i];
    if (f->n_slots == FOLD_SLOTS) {
        f->fallback = "more slot ids than the C replay holds";
        return NULL;
    }
    slot_t *s = &f->slots[f->n_slots++];
    memset(s, 0, sizeof *s);
    s->id = id;
    s->content = NO_INT;
    s->lcp_epoch = -1;
    s->fig_order = -1;
    return s;
}

/* ------------------------------------------------------------------ the `checking checkpoint` notes */

static uint64_t check_hash(int64_t slot, int64_t task)
{
    return ((uint64_t)slot * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)task * 0xC2B2AE3D27D4EB4Full);
}

static check_t *check_find(fold_t *f, int64_t slot, int64_t task, int insert)
{
    uint64_t i = check_hash(slot, task) & (CHECK_TABLE - 1);
    check_t *free_at = NULL;
    for (;; i = (i + 1) & (CHECK_TABLE - 1)) {
        check_t *c = &f->checks[i];
        if (c->state == 0)
            return insert ? (free_at != NULL ? free_at : c) : NULL;
        if (c->state == 2) {
            if (free_at == NULL)
                free_at = c;
        } else if (c->slot == slot && c->task == task) {
            return c;
        }
    }
}

static void mark_used(fold_t *f, const check_t *c)
{
    if (f->checks_used < TOUCHED)
        f->touched[f->checks_used] = (int)(c - f->checks);
    f->checks_used++;
}

static void checks_clear(fold_t *f)
{
    if (f->checks_used == 0)
        return; /* every restart clears them: most find the table empty (a memset of it was the
                   fold's largest cost on logs of short sessions) */
    if (f->checks_used <= TOUCHED)
        for (int i = 0; i < f->checks_used; i++)
            f->checks[f->touched[i]].state = 0;
    else
        memset(f->checks, 0, sizeof f->checks);
    f->checks_live = f->checks_used = 0;
}

static void checks_rehash(fold_t *f) /* drop the removed marks */
{
    check_t *old = PyMem_Malloc(sizeof f->checks);
    if (old == NULL)
        return; /* probing stays correct, only slower */
    memcpy(old, f->checks, sizeof f->checks);
    checks_clear(f);
    for (int i = 0; i < CHECK_TABLE; i++)
        if (old[i].state == 1) {
            check_t *c = check_find(f, old[i].slot, old[i].task, 1);
            *c = old[i];
            f->checks_live++;
            mark_used(f, c);
        }
    PyMem_Free(old);
}

/* Replay._take_note of a CheckpointCheck: clear at the cap, then setdefault */
static void check_take(fold_t *f, int64_t slot, int64_t task, int64_t against)
{
    if (f->checks_live >= PENDING_CHECKS)
        checks_clear(f);
    if (f->checks_used >= CHECK_TABLE * 3 / 4)
        checks_rehash(f);
    check_t *c = check_find(f, slot, task, 1);
    if (c->state == 1)
        return;
    if (c->state == 0)
        mark_used(f, c);
    *c = (check_t){slot, task, against, 1};
    f->checks_live++;
}

static int check_pop(fold_t *f, int64_t slot, int64_t task, int64_t *against)
{
    check_t *c = check_find(f, slot, task, 0);
    if (c == NULL)
        return 0;
    *against = c->against;
    c->state = 2;
    f->checks_live--;
    return 1;
}

/* ------------------------------------------------------------------ side notes (logs._Stream._side_notes) */

typedef struct note_s {
    int64_t offset, a, b, c; /* sim: slot, lcp, n_tokens; check: slot, task, against */
    int check;
} note_t;

/* \d+ ; *big when it has more digits than int64 holds (Python's int() would read it) */
static cp digits_(cp p, cp w, int64_t *v, int *big)
{
    cp s = p;
    int64_t x = 0;
    while (p < w && is_digit(*p)) {
        if (p - s < MAX_DIGITS)
            x = x * 10 + (*p - '0');
        p++;
    }
    if (p == s)
        return NULL;
    if (p - s > MAX_DIGITS)
        *big = 1;
    *v = x;
    return p;
}

static cp spaces_w(cp p, cp w)
{
    return p == NULL ? NULL : spaces(p, w);
}

/* logs._SIM matched at p, within [p, w): id +(\d+) \| task -?\d+ \| +- checking sim = [\d.]+ \((\d+)/(\d+)\) */
static int sim_at(cp p, cp w, note_t *n, int *big)
{
    int64_t ignore;
    p = spaces_w(LIT(p, w, "id"), w);
    p = p ? digits_(p, w, &n->a, big) : NULL;
    p = LIT(p, w, " | task ");
    if (p != NULL && p < w && *p == '-')
        p++;
    p = p ? digits_(p, w, &ignore, &(int){0}) : NULL;
    p = LIT(spaces_w(LIT(p, w, " |"), w), w, "- checking sim = ");
    cp run = p;
    while (p != NULL && p < w && (is_digit(*p) || *p == '.'))
        p++;
    if (p == NULL || p == run)
        return 0;
    p = LIT(p, w, " (");
    p = p ? digits_(p, w, &n->b, big) : NULL;
    p = LIT(p, w, "/");
    p = p ? digits_(p, w, &n->c, big) : NULL;
    return LIT(p, w, ")") != NULL;
}

/* logs._CHECK at p: id +(\d+) \| task (\d+) \| +[Cc]hecking checkpoint with \[-?\d+, -?\d+\] against (\d+)\.\.\. */
static int check_at(cp p, cp w, note_t *n, int *big)
{
    int64_t ignore;
    int small = 0;
    p = spaces_w(LIT(p, w, "id"), w);
    p = p ? digits_(p, w, &n->a, big) : NULL;
    p = LIT(p, w, " | task ");
    p = p ? digits_(p, w, &n->b, big) : NULL;
    p = spaces_w(LIT(p, w, " |"), w);
    if (p == NULL || p >= w || (*p != 'c' && *p != 'C'))
        return 0;
    p = LIT(p + 1, w, "hecking checkpoint with [");
    for (int k = 0; k < 2 && p != NULL; k++) {
        if (p < w && *p == '-')
            p++;
        p = digits_(p, w, &ignore, &small);
        p = k ? LIT(p, w, "] against ") : LIT(p, w, ", ");
    }
    p = p ? digits_(p, w, &n->c, big) : NULL;
    return LIT(p, w, "...") != NULL;
}

/* the leftmost match in [from, w) of a pattern that starts with "id" (re.search) */
static int search_id(cp from, cp w, int (*at)(cp, cp, note_t *, int *), note_t *n, int *big)
{
    for (cp j = from; j + 1 < w; j++) {
        j = memchr(j, 'i', (size_t)(w - j));
        if (j == NULL || j + 1 >= w)
            return 0;
        if (j[1] == 'd') {
            int b = 0;
            if (at(j, w, n, &b)) {
                *big |= b;
                return 1;
            }
        }
    }
    return 0;
}

static int notes_push(note_t **v, Py_ssize_t *n, Py_ssize_t *cap, const note_t *x)
{
    note_t *grown = room(*v, *n, cap, sizeof *grown, 1024);
    if (grown == NULL)
        return -1;
    *v = grown;
    grown[(*n)++] = *x;
    return 0;
}

/* The next "hecking " (the word both side notes hold) entirely inside [p, end); the loads may
 * read on to `readable`. AVX2 where the CPU has it (a filter on 'h' +0, 'k' +3, ' ' +7, each
 * hit checked whole), memmem otherwise and for the tail: the same occurrences either way. */
static const char HECKING[] = "hecking ";
#define HECKING_LEN (sizeof HECKING - 1)

static cp hecking_memmem(cp p, cp end)
{
    return end - p < (ptrdiff_t)HECKING_LEN ? NULL : memmem(p, (size_t)(end - p), HECKING, HECKING_LEN);
}

#ifdef VECTOR_SEARCH
__attribute__((target("avx2"))) static cp hecking_v32(cp p, cp end, cp readable)
{
    const v32 zero = {0};
    const v32 h = zero + 'h', k = zero + 'k', sp = zero + ' ';
    for (; p + 32 <= end && p + 32 + 7 <= readable; p += 32) {
        v32 a0, a3, a7;
        memcpy(&a0, p, 32);
        memcpy(&a3, p + 3, 32);
        memcpy(&a7, p + 7, 32);
        v32 hit = (v32)((a0 == h) & (a3 == k) & (a7 == sp));
        for (uint32_t bits = MASK32(hit); bits != 0; bits &= bits - 1) {
            cp at = p + __builtin_ctz(bits);
            if (at + HECKING_LEN <= end && memcmp(at, HECKING, HECKING_LEN) == 0)
                return at;
        }
    }
    return hecking_memmem(p, end);
}
#endif

static cp next_hecking(cp p, cp end, cp readable)
{
#ifdef VECTOR_SEARCH
    if (__builtin_cpu_supports("avx2"))
        return hecking_v32(p, end, readable);
#endif
    (void)readable;
    return hecking_memmem(p, end);
}

/* The notes of body[0, n) in offset order (sims before checks on one line), as _side_notes
 * makes them. *big: a number past int64 in one of them. -1: no memory. */
static int side_notes(fold_t *f, cp body, Py_ssize_t n, cp readable, int64_t base, note_t **out, Py_ssize_t *count,
                      int *big)
{
    /* Both words hold "hecking " (at +1 and +0): one search for it finds every occurrence of
     * each (neither word can overlap itself), as _side_notes' two find() loops do. */
    static const char sim_rest[] = "sim = ", check_rest[] = "checkpoint with [";
    note_t *sims = NULL, *checks = NULL;
    Py_ssize_t ns = 0, nc = 0, cs = 0, cc = 0;
    cp end = body + n;
    for (cp h = next_hecking(body, end, readable); h != NULL; h = next_hecking(h + 1, end, readable)) {
        cp after = h + HECKING_LEN;
        if (h > body && h[-1] == 'c' && (size_t)(end - after) >= sizeof sim_rest - 1 &&
            memcmp(after, sim_rest, sizeof sim_rest - 1) == 0) {
            cp i = h - 1; /* "checking sim = " */
            cp ls = line_start(body, i);
            cp w = i + 40 < readable ? i + 40 : readable;
            note_t x = {.offset = base + (ls - body), .check = 0};
            if (search_id(ls, w, sim_at, &x, big) && notes_push(&sims, &ns, &cs, &x) < 0)
                goto nomem;
        } else if ((size_t)(end - after) >= sizeof check_rest - 1 &&
                   memcmp(after, check_rest, sizeof check_rest - 1) == 0) {
            cp i = h; /* "hecking checkpoint with [" */
            cp ls = line_start(body, i);
            cp head = rfind(ls, i, "| task ", 7);
            size_t len = head != NULL ? (size_t)(i - head) : 0;
            if (len == f->last_len && (len == 0 || memcmp(head, f->last_head, len) == 0))
                continue; /* the task's run of check lines: one note */
            cp w = i + 80 < readable ? i + 80 : readable;
            note_t x = {.offset = base + (ls - body), .check = 1};
            if (search_id(ls, w, check_at, &x, big)) {
                unsigned char *kept = PyMem_Realloc(f->last_head, len ? len : 1);
                if (kept == NULL)
                    goto nomem;
                memcpy(kept, head, len);
                f->last_head = kept;
                f->last_len = len;
                if (notes_push(&checks, &nc, &cc, &x) < 0)
                    goto nomem;
            }
        }
    }
    note_t *all = PyMem_Malloc((size_t)(ns + nc + 1) * sizeof *all);
    if (all == NULL)
        goto nomem;
    Py_ssize_t a = 0, b = 0, k = 0;
    while (a < ns || b < nc) /* heapq.merge(sims, checks, key=offset): sims first on a tie */
        all[k++] = (b >= nc || (a < ns && sims[a].offset <= checks[b].offset)) ? sims[a++] : checks[b++];
    PyMem_Free(sims);
    PyMem_Free(checks);
    *out = all;
    *count = k;
    return 0;
nomem:
    PyMem_Free(sims);
    PyMem_Free(checks);
    PyErr_NoMemory();
    return -1;
}

static void take_note(fold_t *f, const note_t *x)
{
    if (x->check) {
        check_take(f, x->a, x->b, x->c);
        return;
    }
    slot_t *s = slot_of(f, x->a); /* Replay._lcp[slot] = note */
    if (s != NULL) {
        s->lcp_epoch = f->epoch;
        s->lcp = x->b;
        s->lcp_n = x->c;
    }
}

/* ------------------------------------------------------------------ the replay */

typedef struct { /* one event of a line, its fields as scan() reads them */
    int kind;
    int64_t line, offset, slot, task, pmin, pmax, n, extra; /* extra: n_past / n_swa, NO_INT: None */
    double size, took, ms;
    int has_size, has_took;
    cp text, end; /* the line (for the clock) and the block's end */
} ev_t;

/* Ring._note: `what` follows "line N: " */
static int ring_note(fold_t *f, slot_t *s, const char *what, const char *kind, int64_t line)
{
    if (s->notes == NULL && (s->notes = PyList_New(0)) == NULL)
        return -1;
    if (PyList_GET_SIZE(s->notes) >= MAX_NOTES)
        return 0;
    PyObject *t = PyUnicode_FromFormat(what, (long long)line, kind);
    int r = t == NULL ? -1 : PyList_Append(s->notes, t);
    Py_XDECREF(t);
    return r;
}

static int add_ok(fold_t *f, int64_t *acc, int64_t v)
{
    if (__builtin_add_overflow(*acc, v, acc)) {
        f->fallback = "a sum past int64";
        return 0;
    }
    return 1;
}

/* logs._Clock for b11434 elapsed times: M.SS.mmm.uuu at the line start */
static int clock_at(fold_t *f, cp s, cp e, double *t)
{
    int64_t m = 0;
    int big = 0;
    cp p = digits_(s, e, &m, &big); /* the checks below stop at the line's newline */
    int ok = p != NULL && p[0] == '.' && is_digit(p[1]) && is_digit(p[2]) && p[3] == '.';
    for (int i = 4; ok && i < 7; i++)
        ok = is_digit(p[i]);
    ok = ok && p[7] == '.' && is_digit(p[8]) && is_digit(p[9]) && is_digit(p[10]) && p[11] == ' ';
    if (!ok) {
        *t = f->clock_last;
        return f->has_clock;
    }
    if (big || m > INT64_MAX / 60 - 100) {
        f->fallback = "a timestamp past int64";
        return 0;
    }
    int64_t ss = (p[1] - '0') * 10 + (p[2] - '0');
    int64_t ms = (p[4] - '0') * 100 + (p[5] - '0') * 10 + (p[6] - '0');
    int64_t us = (p[8] - '0') * 100 + (p[9] - '0') * 10 + (p[10] - '0');
    double elapsed = (double)(m * 60 + ss) + (double)ms / 1e3 + (double)us / 1e6;
    double now = elapsed + f->clock_base;
    if (f->has_clock && now < f->clock_last - 1.0) { /* the server restarted: time goes on */
        f->clock_base = f->clock_last;
        now = elapsed + f->clock_base;
    }
    f->clock_last = now;
    f->has_clock = 1;
    *t = now;
    return 1;
}

static PyObject *opt_int(int has, int64_t v) { return has ? PyLong_FromLongLong(v) : Py_NewRef(Py_None); }
static PyObject *opt_float(int has, double v) { return has ? PyFloat_FromDouble(v) : Py_NewRef(Py_None); }

static PyObject *ck_list(const cks_t *a)
{
    PyObject *l = PyList_New(a->n);
    for (int i = 0; l != NULL && i < a->n; i++) {
        PyObject *t = Py_BuildValue("(LLL)", (long long)a->v[i].pmin, (long long)a->v[i].pmax, (long long)a->v[i].n);
        if (t == NULL) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, i, t);
    }
    return l;
}

static const char *const ERASE_NAMES[4] = {"erased_invalidated", "erased_old", "erased_too_close", "erased_superseded"};
static const char *const SOURCE_NAMES[4] = {NULL, "lcp", "n_past", "re_entry"};
static const char *const OUTCOME_NAMES[N_OUTCOMES] = {"cold", "extended", "restored", "forced", "silent_reset"};

/* the fields of logs._row, in logs._FOLD_ROW's order */
static int append_row(fold_t *f, const slot_t *s, const req_t *o, int64_t prompt, int has_prompt, int64_t shared,
                      int source, int64_t re_entry, int has_re, int outcome, int retention, int baseline, int placement)
{
    PyObject *erased = PyDict_New();
    for (int i = 0; erased != NULL && i < o->n_erase_kinds; i++) {
        PyObject *v = PyLong_FromLongLong(o->erase_count[i]);
        if (v == NULL || PyDict_SetItemString(erased, ERASE_NAMES[o->erase_kind[i]], v) < 0)
            Py_CLEAR(erased);
        Py_XDECREF(v);
    }
    if (erased == NULL)
        return -1;
    PyObject *restored = o->has_restored ? Py_BuildValue("(LLL)", (long long)o->restored.pmin,
                                                         (long long)o->restored.pmax, (long long)o->restored.n)
                                         : Py_NewRef(Py_None);
    PyObject *source_obj = SOURCE_NAMES[source] ? PyUnicode_FromString(SOURCE_NAMES[source]) : Py_NewRef(Py_None);
    PyObject *row = Py_BuildValue(
        "(NLLLLNNNNNsNNNNNOLLOOON)", opt_float(o->has_time, o->time), (long long)s->id, (long long)o->task,
        (long long)o->line, (long long)o->offset, opt_int(has_prompt, prompt), opt_int(source != S_NONE, shared),
        source_obj, opt_int(has_re, re_entry), opt_int(o->has_processed, o->processed), OUTCOME_NAMES[outcome],
        opt_float(o->has_processed, o->ms), ck_list(&o->alive_before), ck_list(&o->created), restored, erased,
        o->forced ? Py_True : Py_False, (long long)o->cache_saved, (long long)o->cache_loaded, placement ? Py_True : Py_False, retention ? Py_True : Py_False,
        baseline ? Py_True : Py_False, opt_int(source != S_NONE && o->shared_with != NO_INT, o->shared_with));
    if (row == NULL)
        return -1;
    int r = PyList_Append(f->rows, row);
    Py_DECREF(row);
    return r;
}

/* logs._server_replay's filters: --slot, and --since / --until as durations since the first
 * request (the fold's families print elapsed times only: a date is never applied here) */
static int taken(const fold_t *f, const slot_t *s, const req_t *o)
{
    if (f->has_slot_filter && s->id != f->slot_filter)
        return 0;
    if (!o->has_time || !f->has_first)
        return 1;
    double value = o->time - f->first_time;
    return !(f->has_since && value < f->since) && !(f->has_until && value > f->until);
}

/* ------------------------------------------------------------------ --trace: logs._row as json.dumps writes it */

static int put(fold_t *f, const char *text, size_t n)
{
    if (f->tr_n + n > f->tr_cap) {
        size_t cap = f->tr_cap ? f->tr_cap : 1 << 16;
        while (cap < f->tr_n + n)
            cap *= 2;
        char *grown = PyMem_Realloc(f->tr, cap);
        if (grown == NULL)
            return -1;
        f->tr = grown;
        f->tr_cap = cap;
    }
    memcpy(f->tr + f->tr_n, text, n);
    f->tr_n += n;
    return 0;
}

#define PUT(f, lit) put((f), (lit), sizeof(lit) - 1)

static int put_int(fold_t *f, int64_t v)
{
    char text[24];
    int n = snprintf(text, sizeof text, "%lld", (long long)v);
    return put(f, text, (size_t)n);
}

static int put_opt_int(fold_t *f, int has, int64_t v) { return has ? put_int(f, v) : PUT(f, "null"); }

static int put_float(fold_t *f, int has, double v) /* float.__repr__, as json.dumps writes it */
{
    if (!has)
        return PUT(f, "null");
    char *text = PyOS_double_to_string(v, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (text == NULL)
        return -1;
    int r = put(f, text, strlen(text));
    PyMem_Free(text);
    return r;
}

static int put_ck(fold_t *f, const ck_t *c)
{
    return PUT(f, "[") || put_int(f, c->pmin) || PUT(f, ",") || put_int(f, c->pmax) || PUT(f, ",") ||
           put_int(f, c->n) || PUT(f, "]");
}

static int put_cks(fold_t *f, const cks_t *a)
{
    if (PUT(f, "["))
        return -1;
    for (Py_ssize_t i = 0; i < a->n; i++)
        if ((i && PUT(f, ",")) || put_ck(f, &a->v[i]))
            return -1;
    return PUT(f, "]");
}

static int put_str(fold_t *f, const char *name) /* names of this file's own: ASCII, nothing to escape */
{
    return PUT(f, "\"") || put(f, name, strlen(name)) || PUT(f, "\"");
}

/* One trace line (docs/trace.md), the fields of logs._row in its order. -1: no memory. */
static int trace_row(fold_t *f, const slot_t *s, const req_t *o, int64_t prompt, int has_prompt, int64_t shared,
                     int source, int64_t re_entry, int has_re, int outcome, int retention, int baseline,
                     int placement)
{
    if (PUT(f, "{\"time\":") || put_float(f, o->has_time, o->time) || PUT(f, ",\"server\":") ||
        put(f, PyBytes_AS_STRING(f->server_json), (size_t)PyBytes_GET_SIZE(f->server_json)) ||
        PUT(f, ",\"slot\":") || put_int(f, s->id) || PUT(f, ",\"task\":") || put_int(f, o->task) ||
        PUT(f, ",\"line\":") || put_int(f, o->line - o->piece_line) || PUT(f, ",\"prompt_tokens\":") ||
        put_opt_int(f, has_prompt, prompt) || PUT(f, ",\"shared_prefix\":") ||
        put_opt_int(f, source != S_NONE, shared) || PUT(f, ",\"shared_source\":") ||
        (source != S_NONE ? put_str(f, SOURCE_NAMES[source]) : PUT(f, "null")) || PUT(f, ",\"shared_with\":") ||
        put_opt_int(f, source != S_NONE && o->shared_with != NO_INT, o->shared_with) ||
        PUT(f, ",\"shared_exact\":") ||
        (source == S_NONE ? PUT(f, "null") : source != S_REENTRY ? PUT(f, "true") : PUT(f, "false")) ||
        PUT(f, ",\"reused\":") ||
        put_opt_int(f, has_re, re_entry) || PUT(f, ",\"processed\":") ||
        put_opt_int(f, o->has_processed, o->processed) || PUT(f, ",\"outcome\":") ||
        put_str(f, OUTCOME_NAMES[outcome]) || PUT(f, ",\"prefill_ms\":") ||
        put_float(f, o->has_processed, o->ms) || PUT(f, ",\"checkpoints\":{\"alive_before\":") ||
        put_cks(f, &o->alive_before) || PUT(f, ",\"created\":") || put_cks(f, &o->created) ||
        PUT(f, ",\"restored\":") || (o->has_restored ? put_ck(f, &o->restored) : PUT(f, "null")) ||
        PUT(f, ",\"erased\":{"))
        return -1;
    for (int i = 0; i < o->n_erase_kinds; i++)
        if ((i && PUT(f, ",")) || put_str(f, ERASE_NAMES[o->erase_kind[i]]) || PUT(f, ":") ||
            put_int(f, o->erase_count[i]))
            return -1;
    if (PUT(f, "},\"forced\":") || (o->forced ? PUT(f, "true") : PUT(f, "false")) ||
        PUT(f, ",\"cache_saved\":") || put_int(f, o->cache_saved) || PUT(f, ",\"cache_loaded\":") ||
        put_int(f, o->cache_loaded) || PUT(f, "},\"failures\":["))
        return -1;
    int k = 0;
    const char *names[3] = {"placement", "retention", "baseline_loss"};
    int flags[3] = {placement, retention, baseline};
    for (int i = 0; i < 3; i++)
        if (flags[i] && ((k++ && PUT(f, ",")) || put_str(f, names[i])))
            return -1;
    return PUT(f, "]}\n");
}

/* lifecycle.Replay._close, then logs._server's take() without filters: Figures.add, the time
 * arrays and the row. -1: a Python error; 0 also when f->fallback was set. */
static int close_emit(fold_t *f, slot_t *s)
{
    req_t *o = &s->req;
    int has_re = 1;
    int64_t re_entry = 0;
    if (o->has_restored)
        re_entry = o->restored_npast != NO_INT ? o->restored_npast : o->restored.n;
    else if (o->has_trim)
        re_entry = o->trim;
    else if (!o->forced)
        has_re = 0;
    int64_t prompt = o->n_prompt;
    int has_prompt = o->has_prompt;
    if (!has_prompt && has_re && o->has_processed) {
        if (__builtin_add_overflow(re_entry, o->processed, &prompt)) {
            f->fallback = "a sum past int64";
            return 0;
        }
        has_prompt = 1;
    }
    /* Replay._shared */
    int has_lcp = o->has_lcp;
    if (has_lcp && (o->cache_loaded || (has_prompt && o->lcp_n != prompt) || (has_re && o->lcp < re_entry)))
        has_lcp = 0;
    int64_t against = 0;
    int has_against = check_pop(f, s->id, o->task, &against);
    if (has_against && (!(f->has_n_swa && f->n_swa == 0) || (has_re && against < re_entry)))
        has_against = 0;
    if (has_lcp && has_against && has_prompt && against != (o->lcp < prompt - 1 ? o->lcp : prompt - 1))
        has_lcp = 0;
    int source = has_lcp ? S_LCP : has_against ? S_NPAST : has_re ? S_REENTRY : S_NONE;
    int64_t shared = has_lcp ? o->lcp : has_against ? against : re_entry;
    int outcome = o->has_restored ? O_RESTORED
                  : o->forced     ? O_FORCED
                  : (has_re && re_entry != 0) ? O_EXTENDED
                  : (o->fresh && o->not_own == 0) ? O_COLD /* its own ring's evictions: still cold */
                                                 : O_SILENT;
    int warm = outcome != O_COLD;
    int retention = (outcome == O_FORCED || outcome == O_SILENT) && has_prompt && s->has_ebl && s->ebl_min < prompt;
    int baseline = source == S_REENTRY ? warm && !o->forced && shared < BASELINE_TOKENS
                                       : warm && source != S_NONE && shared < BASELINE_TOKENS;
    if (o->erased_any || (s->has_ebl && s->ebl_count > 0)) {
        s->has_ebl = 1;
        s->ebl_count = o->not_own;
        s->ebl_min = o->not_own_min;
    }
    int placement = outcome == O_FORCED && o->n_alive > 0;
    o->open = 0;
    /* logs._server_replay's take(): the first time is the first request's, taken or not */
    if (o->has_time && !f->has_first) {
        f->first_time = o->time;
        f->has_first = 1;
    }
    if (!taken(f, s, o))
        return 0;
    /* Figures.add */
    fig_t *g = &s->fig;
    if (s->fig_order < 0)
        s->fig_order = f->fig_order++;
    g->requests++;
    g->outcomes[outcome]++;
    g->events[0] += o->created.n;
    g->create_n += o->created.n;
    for (int i = 0; i < o->created.n; i++) {
        const ck_t *c = &o->created.v[i];
        if (c->has_size) {
            g->create_mib += c->size;
            g->create_mib_n++;
        }
        if (c->has_took) {
            g->create_ms += c->took;
            g->create_ms_n++;
        }
    }
    for (int i = 0; i < o->n_erase_kinds; i++)
        g->events[2 + o->erase_kind[i]] += o->erase_count[i];
    if (o->has_restored) {
        g->events[1]++;
        g->restore_n++;
        if (o->restored.has_size) {
            g->restore_mib += o->restored.size;
            g->restore_mib_n++;
        }
        if (o->restored.has_took) {
            g->restore_ms += o->restored.took;
            g->restore_ms_n++;
        }
    }
    if (o->forced)
        g->events[6]++;
    g->events[7] += o->cache_saved;
    g->events[8] += o->cache_loaded;
    if (has_prompt && (vec_push(&g->prompts, prompt) < 0 || !add_ok(f, &g->prompt_tokens, prompt)))
        return f->fallback ? 0 : (PyErr_NoMemory(), -1);
    int64_t reused = has_re ? re_entry : 0;
    if (source != S_NONE && outcome != O_COLD) {
        if (vec_push(&g->shared, shared) < 0)
            return PyErr_NoMemory(), -1;
        if (source != S_REENTRY)
            g->shared_stated++;
        if (!add_ok(f, &g->reusable, shared) || (shared > reused && !add_ok(f, &g->avoidable, shared - reused)))
            return 0;
    }
    if (!add_ok(f, &g->reused, reused))
        return 0;
    if (o->has_processed) {
        if (!add_ok(f, &g->processed, o->processed) || !add_ok(f, &g->timed_tokens, o->processed))
            return 0;
        g->prefill_ms += o->ms;
    }
    g->placement += placement;
    g->retention += retention;
    g->baseline += baseline;
    if (o->has_time) {
        if (!g->has_t || o->time < g->t0)
            g->t0 = o->time;
        if (!g->has_t || o->time > g->t1)
            g->t1 = o->time;
        g->has_t = 1;
        double rel = o->time - f->first_time;
        char code = (char)outcome;
        if (PyByteArray_Resize(f->times, PyByteArray_GET_SIZE(f->times) + (Py_ssize_t)sizeof rel) < 0 ||
            PyByteArray_Resize(f->codes, PyByteArray_GET_SIZE(f->codes) + 1) < 0)
            return -1;
        memcpy(PyByteArray_AS_STRING(f->times) + PyByteArray_GET_SIZE(f->times) - sizeof rel, &rel, sizeof rel);
        PyByteArray_AS_STRING(f->codes)[PyByteArray_GET_SIZE(f->codes) - 1] = code;
    }
    if (f->emitted++ < f->rows_wanted && append_row(f, s, o, prompt, has_prompt, shared, source, re_entry, has_re,
                                                    outcome, retention, baseline, placement) < 0)
        return -1;
    if (f->server_json != NULL && trace_row(f, s, o, prompt, has_prompt, shared, source, re_entry, has_re, outcome,
                                            retention, baseline, placement) < 0)
        return PyErr_NoMemory(), -1;
    return 0;
}

/* ------------------------------------------------------------------ the prompt cache (Ring's cache_saved / cache_loaded) */

static void entry_drop(fold_t *f, slot_t *s, Py_ssize_t i)
{
    f->saved_checkpoints -= s->saved[i].cks.n;
    PyMem_Free(s->saved[i].cks.v);
    memmove(&s->saved[i], &s->saved[i + 1], (size_t)(s->n_saved - i - 1) * sizeof *s->saved);
    s->n_saved--;
}

static void entries_clear(fold_t *f, slot_t *s)
{
    while (s->n_saved > 0)
        entry_drop(f, s, s->n_saved - 1);
}

static Py_ssize_t entry_find(const slot_t *s, int64_t key)
{
    for (Py_ssize_t i = s->n_saved - 1; i >= 0; i--)
        if (s->saved[i].key == key)
            return i;
    return -1;
}

/* Ring.apply(cache_saved): the entry of that length becomes a copy of the ring, the newest;
 * past MAX_SAVED the oldest goes. -1: no memory or past SAVED_CHECKPOINTS (f->fallback). */
static int ring_save(fold_t *f, slot_t *s, int64_t key)
{
    Py_ssize_t i = entry_find(s, key);
    if (i >= 0)
        entry_drop(f, s, i);
    if (f->saved_checkpoints + s->alive.n > SAVED_CHECKPOINTS) {
        f->fallback = "more saved checkpoints than the C replay holds";
        return -1;
    }
    entry_t *v = room(s->saved, s->n_saved, &s->cap_saved, sizeof *v, 8);
    ck_t *copy = PyMem_Malloc((size_t)(s->alive.n ? s->alive.n : 1) * sizeof *copy);
    if (v == NULL || copy == NULL) {
        if (v != NULL)
            s->saved = v;
        PyMem_Free(copy);
        f->fallback = "no memory for a prompt-cache entry";
        return -1;
    }
    s->saved = v;
    memcpy(copy, s->alive.v, (size_t)s->alive.n * sizeof *copy);
    s->saved[s->n_saved++] = (entry_t){key, s->content, {copy, s->alive.n, s->alive.n ? s->alive.n : 1}};
    f->saved_checkpoints += s->alive.n;
    if (s->n_saved > MAX_SAVED)
        entry_drop(f, s, 0);
    return 0;
}

/* Ring.apply(cache_loaded): the slot takes the entry's checkpoints instead of its own */
static int ring_load(fold_t *f, slot_t *s, int64_t key, int64_t line)
{
    Py_ssize_t i = entry_find(s, key);
    if (i < 0) {
        s->alive.n = 0;
        s->content = NO_INT;
        if (ring_note(f, s, "line %lld: prompt cache load of an entry saved before the log began", "", line) < 0) {
            f->fallback = "no memory for a note";
            return -1;
        }
        return 0;
    }
    PyMem_Free(s->alive.v);
    s->alive = s->saved[i].cks;
    s->content = s->saved[i].owner;
    f->saved_checkpoints -= s->alive.n;
    memmove(&s->saved[i], &s->saved[i + 1], (size_t)(s->n_saved - i - 1) * sizeof *s->saved);
    s->n_saved--;
    return 0;
}

static int ring_cache(fold_t *f, slot_t *s, int kind, int64_t n, int64_t line)
{
    return kind == K_SAVED ? ring_save(f, s, n) : ring_load(f, s, n, line);
}

/* Replay._clear: an idle slot emptied by the server; the held save it names goes to its ring */
static int slot_clear(fold_t *f, const ev_t *ev)
{
    Py_ssize_t save = f->last_save;
    f->last_save = -1;
    slot_t *s = slot_find(f, ev->slot);
    int ring = s != NULL && s->has_ring;
    if (save >= 0 && ev->n != NO_INT && ev->n != 0 && f->held[save].n == ev->n) { /* save_of_clear */
        f->held[save].placed = 1; /* still counted by the next request, as every held save */
        if (ring && ring_save(f, s, ev->n) < 0)
            return -1;
    }
    if (ring) {
        s->alive.n = 0;
        s->content = NO_INT;
    }
    if (s != NULL)
        s->lcp_epoch = -1; /* a `checking sim` line about the content just dropped */
    return 0;
}

static int hold(fold_t *f, const ev_t *ev)
{
    held_t *v = room(f->held, f->n_held, &f->cap_held, sizeof *v, 16);
    if (v == NULL)
        return PyErr_NoMemory(), -1;
    f->held = v;
    f->last_save = ev->kind == K_SAVED ? f->n_held : -1;
    f->held[f->n_held++] = (held_t){ev->kind, 0, ev->n, ev->line};
    return 0;
}

/* Replay._finish: every open request, by the offset of its first line (a stable sort of the
 * open requests in the order they started: two may start on one line) */
static int finish_open(fold_t *f)
{
    for (;;) {
        slot_t *first = NULL;
        for (int i = 0; i < f->n_slots; i++) {
            const req_t *o = &f->slots[i].req;
            if (o->open && (first == NULL || o->offset < first->req.offset ||
                            (o->offset == first->req.offset && o->serial < first->req.serial)))
                first = &f->slots[i];
        }
        if (first == NULL)
            return 0;
        if (close_emit(f, first) < 0 || f->fallback)
            return -1;
    }
}

/* Replay._restart: why R_TASK (a task id went down), R_START (a start line after a server was
 * seen) or R_FIRST (the log's first start line: not counted, no note) */
enum restart_why { R_FIRST, R_TASK, R_START };

static int restart(fold_t *f, const ev_t *ev, int why)
{
    if (finish_open(f) < 0)
        return -1;
    for (int i = 0; i < f->n_slots; i++) {
        slot_t *s = &f->slots[i];
        s->has_ring = 0;
        s->alive.n = 0;
        entries_clear(f, s);
        Py_CLEAR(s->notes);
        s->has_ebl = 0;
    }
    f->n_held = 0;
    f->last_save = -1;
    f->epoch++; /* _lcp.clear() */
    checks_clear(f);
    f->has_n_swa = 0;
    f->began = 1;
    f->cur = -1;
    if (why != R_FIRST) {
        f->restarts++;
        if (f->has_clock) /* logs._Clock: a new process counts from 0 again, time goes on */
            f->clock_base = f->clock_last;
        PyObject *t = NULL;
        if (PyList_GET_SIZE(f->notes) < MAX_NOTES) {
            t = why == R_TASK ? PyUnicode_FromFormat("line %lld: task %lld after task %lld: server restarted",
                                                     (long long)ev->line, (long long)ev->task, (long long)f->last_task)
                              : PyUnicode_FromFormat("line %lld: the server started again", (long long)ev->line);
            if (t == NULL || PyList_Append(f->notes, t) < 0) {
                Py_XDECREF(t);
                return -1;
            }
            Py_DECREF(t);
        }
    }
    f->last_task = -1;
    return 0;
}

static int start(fold_t *f, slot_t *s, const ev_t *ev)
{
    req_t *o = &s->req;
    int fresh = !s->has_ring;
    if (fresh) {
        s->has_ring = 1;
        s->ring_seq = f->ring_seq++;
        s->alive.n = 0;
        s->content = NO_INT;
        entries_clear(f, s);
        Py_CLEAR(s->notes);
    }
    o->cache_saved = o->cache_loaded = 0;
    for (Py_ssize_t i = 0; i < f->n_held; i++) { /* prompt-cache swaps come before the restore decision */
        const held_t *h = &f->held[i];
        if (!h->placed && ring_cache(f, s, h->kind, h->n, h->line) < 0)
            return f->fallback ? 0 : -1;
        if (h->kind == K_SAVED)
            o->cache_saved++;
        else
            o->cache_loaded++;
    }
    f->n_held = 0;
    f->last_save = -1;
    o->shared_with = s->content; /* what it found; then the slot holds its own prompt */
    s->content = ev->task;
    o->open = 1;
    o->fresh = fresh;
    o->has_lcp = s->lcp_epoch == f->epoch;
    o->lcp = s->lcp;
    o->lcp_n = s->lcp_n;
    f->epoch++; /* each slot selection prints fresh lines; older ones are stale */
    o->task = ev->task;
    o->line = ev->line;
    o->offset = ev->offset;
    o->serial = f->serial++;
    o->has_time = clock_at(f, ev->text, ev->end, &o->time);
    if (f->fallback)
        return 0;
    o->forced = o->has_trim = o->has_prompt = o->has_restored = o->has_processed = 0;
    o->created.n = 0;
    o->n_erase_kinds = 0;
    o->erased_any = 0;
    o->not_own = 0;
    o->not_own_min = INT64_MAX;
    o->n_alive = s->alive.n;
    o->alive_before.n = 0;
    o->piece_line = f->piece_line;
    if (f->emitted < f->rows_wanted || f->server_json != NULL) /* it may be one of the rows shown */
        for (int i = 0; i < s->alive.n; i++)
            if (cks_push(&o->alive_before, &s->alive.v[i]) < 0)
                return PyErr_NoMemory(), -1;
    if (ev->task > f->last_task)
        f->last_task = ev->task;
    f->began = 1;
    return 0;
}

static void erase(fold_t *f, slot_t *s, const ev_t *ev, int which)
{
    req_t *o = &s->req;
    cks_t *a = &s->alive;
    int found = -1;
    for (int i = 0; i < a->n; i++)
        if (a->v[i].n == ev->n) {
            found = i;
            break;
        }
    int created_kind = 0;
    int64_t n = ev->n, creator = -1;
    if (found >= 0 && (which == 3 || (a->v[found].pmin == ev->pmin && a->v[found].pmax == ev->pmax))) {
        created_kind = 1;
        creator = a->v[found].creator;
        memmove(&a->v[found], &a->v[found + 1], (size_t)(a->n - found - 1) * sizeof *a->v);
        a->n--;
    } else if (ring_note(f, s, "line %lld: %s of a checkpoint never seen created", ERASE_NAMES[which], ev->line) < 0) {
        f->fallback = "no memory for a note";
    }
    o->erased_any = 1;
    if (!(created_kind && creator == o->serial)) { /* lifecycle._among: not one of its own */
        o->not_own++;
        if (created_kind && n < o->not_own_min)
            o->not_own_min = n;
    }
    int k = 0;
    while (k < o->n_erase_kinds && o->erase_kind[k] != which)
        k++;
    if (k == o->n_erase_kinds) {
        o->erase_kind[k] = which;
        o->erase_count[k] = 0;
        o->n_erase_kinds++;
    }
    o->erase_count[k]++;
}

/* One event, as Replay.run takes it. -1: a Python error (or f->fallback set). */
static int fold_event(fold_t *f, const ev_t *ev)
{
    int kind = ev->kind;
    f->kinds[kind]++;
    if (kind == K_STARTED) /* a new process: the next line, whatever its task, starts anew */
        return restart(f, ev, f->began ? R_START : R_FIRST);
    int held = kind == K_SELECTED || kind == K_SAVED || kind == K_LOADED || kind == K_CLEARED; /* HELD_KINDS */
    if (f->cur < 0 || ev->task != f->cur_task || ev->slot != f->slots[f->cur].id) {
        slot_t *open = NULL;
        if (held && ev->task != NO_INT && ev->task >= 0) {
            open = slot_find(f, ev->slot);
            if (open != NULL && !open->req.open)
                open = NULL;
        }
        if (ev->task == NO_INT || ev->task < 0 || (held && open == NULL)) {
            if (kind == K_CLEARED)
                return slot_clear(f, ev);
            if (kind == K_SAVED || kind == K_LOADED)
                return hold(f, ev);
            return 0; /* a slot selection (held: it changes no ring), or no task of its own: dropped */
        }
        slot_t *s = slot_of(f, ev->slot);
        if (s == NULL)
            return -1;
        req_t *cur = s->req.open ? &s->req : NULL;
        if (cur == NULL || cur->task != ev->task) {
            if (ev->task < f->last_task && (cur == NULL || ev->task < cur->task)) {
                if (restart(f, ev, R_TASK) < 0)
                    return -1;
                cur = NULL;
            }
            if (cur != NULL && (close_emit(f, s) < 0 || f->fallback))
                return -1;
            if (start(f, s, ev) < 0 || f->fallback)
                return -1;
        }
        f->cur = (int)(s - f->slots);
        f->cur_task = ev->task;
    }
    slot_t *s = &f->slots[f->cur];
    req_t *o = &s->req;
    switch (kind) {
    case K_TRIM:
        if (!o->has_trim) {
            o->has_trim = 1;
            o->trim = ev->n;
        }
        break;
    case K_CREATED: {
        ck_t c = {ev->pmin, ev->pmax, ev->n, o->serial, ev->size, ev->took, ev->has_size, ev->has_took};
        cks_t *a = &s->alive;
        for (int i = 0; i < a->n; i++)
            if (a->v[i].n == ev->n) { /* replaced: re-inserted last, as the newest */
                memmove(&a->v[i], &a->v[i + 1], (size_t)(a->n - i - 1) * sizeof *a->v);
                a->n--;
                break;
            }
        if (a->n >= FOLD_RING) {
            f->fallback = "a ring longer than the C replay holds";
            return -1;
        }
        if (cks_push(a, &c) < 0 || cks_push(&o->created, &c) < 0)
            return PyErr_NoMemory(), -1;
        break;
    }
    case K_EVAL:
        o->has_processed = 1;
        o->processed = ev->n;
        o->ms = ev->ms;
        break;
    case K_NEW_PROMPT:
        if (!o->has_prompt && ev->n != NO_INT) {
            o->has_prompt = 1;
            o->n_prompt = ev->n;
        }
        break;
    case K_ERASED:
    case K_ERASED_OLD:
    case K_TOO_CLOSE:
    case K_SUPERSEDED:
        erase(f, s, ev, kind == K_ERASED ? 0 : kind == K_ERASED_OLD ? 1 : kind == K_TOO_CLOSE ? 2 : 3);
        if (kind == K_ERASED && ev->extra != NO_INT) {
            f->n_swa = ev->extra;
            f->has_n_swa = 1;
        }
        if (f->fallback)
            return -1;
        break;
    case K_RESTORED:
        if (!o->has_restored) {
            o->has_restored = 1;
            o->restored = (ck_t){ev->pmin, ev->pmax, ev->n, -1, ev->size, ev->took, ev->has_size, ev->has_took};
            o->restored_npast = ev->extra;
        }
        break;
    case K_FORCED:
        o->forced = 1;
        break;
    case K_SAVED:
    case K_LOADED:
        if (ring_cache(f, s, kind, ev->n, ev->line) < 0)
            return -1;
        if (kind == K_SAVED) {
            o->cache_saved++;
        } else { /* the slot's content is now the entry's: what this request shares with */
            o->shared_with = s->content;
            s->content = o->task;
            o->cache_loaded++;
        }
        break;
    }
    return 0;
}

/* a record's value i as a double (V_FLOAT / V_FLOAT_TEXT); 0: None */
static int rec_float(const rec_t *r, int i, cp body, double *d)
{
    if (i >= r->n || r->type[i] == V_NONE)
        return 0;
    if (r->type[i] == V_FLOAT) {
        memcpy(d, &r->v[i], sizeof *d);
        return 1;
    }
    char text[MAX_FLOAT + 1];
    size_t len = (size_t)(r->v[i] & 0xff);
    memcpy(text, body + (r->v[i] >> 8), len);
    text[len] = '\0';
    *d = PyOS_string_to_double(text, NULL, NULL);
    return 1;
}

static int64_t rec_int(const rec_t *r, int i) /* NO_INT: None */
{
    return i < r->n && r->type[i] == V_INT ? r->v[i] : NO_INT;
}

/* a scan() record as an event (the field layouts of the builders above) */
/* the fields no kind leaves unset (plain stores: a memset here compiled to `rep stos`, whose
 * start-up was a third of the fold's own time) */
static void event_clear(ev_t *ev)
{
    ev->pmin = ev->pmax = ev->n = 0;
    ev->size = ev->took = ev->ms = 0.0;
    ev->has_size = ev->has_took = 0;
    ev->extra = NO_INT;
}

static void event_of(const rec_t *r, cp body, cp end, int64_t line, int64_t offset, ev_t *ev)
{
    event_clear(ev);
    ev->kind = r->kind;
    ev->line = line;
    ev->offset = offset;
    ev->text = body + r->start;
    ev->end = end;
    ev->slot = rec_int(r, 0);
    ev->task = rec_int(r, 1);
    switch (r->kind) {
    case K_CREATED: case K_RESTORED: case K_ERASED: case K_ERASED_OLD: case K_TOO_CLOSE:
        ev->pmin = r->v[2];
        ev->pmax = r->v[3];
        ev->n = r->v[4];
        ev->has_size = rec_float(r, 6, body, &ev->size);
        ev->has_took = rec_float(r, 7, body, &ev->took);
        if (r->kind == K_RESTORED || r->kind == K_ERASED)
            ev->extra = rec_int(r, 8);
        break;
    case K_SUPERSEDED:
    case K_TRIM:
        ev->n = r->v[2];
        break;
    case K_NEW_PROMPT:
        ev->n = rec_int(r, 4);
        break;
    case K_EVAL:
        rec_float(r, 2, body, &ev->ms);
        ev->n = r->v[3];
        break;
    case K_SAVED:
    case K_LOADED:
    case K_CLEARED:
        ev->n = rec_int(r, 2);
        break;
    }
}

static void fold_free(PyObject *capsule)
{
    fold_t *f = PyCapsule_GetPointer(capsule, "shadowlab.logs._logscan.fold");
    if (f == NULL)
        return;
    for (int i = 0; i < f->n_slots; i++) {
        slot_t *s = &f->slots[i];
        PyMem_Free(s->alive.v);
        PyMem_Free(s->req.created.v);
        PyMem_Free(s->req.alive_before.v);
        PyMem_Free(s->fig.shared.v);
        PyMem_Free(s->fig.prompts.v);
        entries_clear(f, s);
        PyMem_Free(s->saved);
        Py_XDECREF(s->notes);
    }
    PyMem_Free(f->held);
    PyMem_Free(f->tr);
    Py_XDECREF(f->server_json);
    Py_XDECREF(f->notes);
    Py_XDECREF(f->rows);
    Py_XDECREF(f->times);
    Py_XDECREF(f->codes);
    PyMem_Free(f->block_notes);
    PyMem_Free(f->last_head);
    PyMem_Free(f);
}

/* an optional number argument: 1 and *v when given, 0 for None, -1 on an error */
static int opt_arg(PyObject *o, double *v)
{
    if (o == Py_None)
        return 0;
    *v = PyFloat_AsDouble(o);
    return (*v == -1.0 && PyErr_Occurred()) ? -1 : 1;
}

static PyObject *fold_new(PyObject *self, PyObject *args)
{
    Py_ssize_t rows;
    PyObject *server_json = Py_None, *slot = Py_None, *since = Py_None, *until = Py_None;
    (void)self;
    if (!PyArg_ParseTuple(args, "n|OOOO", &rows, &server_json, &slot, &since, &until))
        return NULL;
    if (server_json != Py_None && !PyBytes_Check(server_json)) {
        PyErr_SetString(PyExc_TypeError, "fold_new: the server's JSON name must be bytes or None");
        return NULL;
    }
    long long slot_filter = 0;
    if (slot != Py_None && ((slot_filter = PyLong_AsLongLong(slot)) == -1 && PyErr_Occurred()))
        return NULL;
    double since_s = 0, until_s = 0;
    int has_since = opt_arg(since, &since_s), has_until = opt_arg(until, &until_s);
    if (has_since < 0 || has_until < 0)
        return NULL;
    fold_t *f = PyMem_Calloc(1, sizeof *f);
    if (f == NULL)
        return PyErr_NoMemory();
    f->has_slot_filter = slot != Py_None;
    f->slot_filter = slot_filter;
    f->has_since = has_since;
    f->since = since_s;
    f->has_until = has_until;
    f->until = until_s;
    if (server_json != Py_None)
        f->server_json = Py_NewRef(server_json);
    f->cur = -1;
    f->last_task = -1;
    f->last_save = -1;
    f->rows_wanted = rows;
    f->notes = PyList_New(0);
    f->rows = PyList_New(0);
    f->times = PyByteArray_FromStringAndSize(NULL, 0);
    f->codes = PyByteArray_FromStringAndSize(NULL, 0);
    PyObject *cap = PyCapsule_New(f, "shadowlab.logs._logscan.fold", fold_free);
    if (cap == NULL) {
        PyMem_Free(f);
        return NULL;
    }
    if (f->notes == NULL || f->rows == NULL || f->times == NULL || f->codes == NULL)
        Py_CLEAR(cap);
    return cap;
}

/* the notes before `offset`, taken as Replay.run drains them: before the event at offset */
static void take_notes_before(fold_t *f, int64_t offset)
{
    while (f->next_note < f->n_block_notes && f->block_notes[f->next_note].offset < offset)
        take_note(f, &f->block_notes[f->next_note++]);
}

static PyObject *fallback_reason(fold_t *f)
{
    PyErr_Clear();
    return PyUnicode_FromString(f->fallback);
}

/* fold_block(state, body, lo, n, base_line, base_offset): the whole lines of body[lo:n) (body[0]
 * is at stream offset base_offset, body[lo] starts line base_line + 1; body ends in a newline).
 * Returns the newlines read; or (start, stop, line_no, word) of a candidate line the C reader
 * hands back: Python reads it, gives its events to fold_events, and calls again with lo =
 * stop + 1; or why the Python replay must read this server (a str). The first call of a block
 * (lo 0) finds its side notes. */
static PyObject *fold_block(PyObject *self, PyObject *args)
{
    PyObject *capsule;
    Py_buffer buf;
    Py_ssize_t lo, n;
    long long base_line, base_offset, piece_line = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "Oy*nnLL|L", &capsule, &buf, &lo, &n, &base_line, &base_offset, &piece_line))
        return NULL;
    PyObject *result = NULL;
    finder_t *fi = NULL;
    fold_t *f = PyCapsule_GetPointer(capsule, "shadowlab.logs._logscan.fold");
    if (f == NULL)
        goto done;
    if (lo < 0 || n < lo || n > buf.len) {
        PyErr_SetString(PyExc_ValueError, "fold_block: 0 <= lo <= n <= len(body) expected");
        goto done;
    }
    if (f->fallback)
        goto fallback;
    f->piece_line = piece_line;
    cp body = buf.buf;
    if (lo == 0) {
        int big = 0;
        PyMem_Free(f->block_notes);
        f->block_notes = NULL;
        f->n_block_notes = f->next_note = 0;
        if (side_notes(f, body, n, body + buf.len, base_offset, &f->block_notes, &f->n_block_notes, &big) < 0)
            goto done;
        if (big) {
            f->fallback = "a side note's number past int64";
            goto fallback;
        }
    }
    fi = PyMem_Malloc(sizeof *fi);
    if (fi == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    const ctx_t c = {.body = body, .from = body};
    fi->p = fi->counted = body + lo;
    fi->newlines = fi->candidates = fi->ignored = 0;
    fi->max = FOLD_BATCH;
    search_fn search = pick_search(0);
    int finished;
    do {
        finished = find_batch(fi, &c, body + n, body + buf.len, search);
        for (Py_ssize_t i = 0; i < fi->n; i++) {
            const rec_t *r = &fi->recs[i];
            if (r->result == R_SLOW) {
                result = Py_BuildValue("(nnLi)", (Py_ssize_t)r->start, (Py_ssize_t)r->stop,
                                       (long long)(base_line + r->line + 1), (int)r->word);
                goto done;
            }
            ev_t ev;
            event_of(r, body, body + n, base_line + r->line + 1, base_offset + r->start, &ev);
            take_notes_before(f, ev.offset);
            if (fold_event(f, &ev) < 0)
                goto failed;
        }
    } while (!finished);
    take_notes_before(f, INT64_MAX);
    if (f->fallback)
        goto fallback;
    result = PyLong_FromLongLong(fi->newlines);
    goto done;
failed:
    if (!f->fallback)
        goto done;
fallback:
    result = fallback_reason(f);
done:
    PyMem_Free(fi);
    PyBuffer_Release(&buf);
    return result;
}

/* a Python int field as int64 (NO_INT: None); 0 when it is past int64 */
static int field_int(PyObject *t, Py_ssize_t i, int64_t *v)
{
    PyObject *o = i < PyTuple_GET_SIZE(t) ? PyTuple_GET_ITEM(t, i) : Py_None;
    if (o == Py_None) {
        *v = NO_INT;
        return 1;
    }
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (x == -1 && PyErr_Occurred()) || x == NO_INT || x == NEED_PY) {
        PyErr_Clear();
        return 0;
    }
    *v = x;
    return 1;
}

static int field_float(PyObject *t, Py_ssize_t i, double *d) /* 0: None */
{
    PyObject *o = i < PyTuple_GET_SIZE(t) ? PyTuple_GET_ITEM(t, i) : Py_None;
    if (o == Py_None)
        return 0;
    *d = PyFloat_AsDouble(o);
    return 1;
}

/* a Python event (logparse's records: line, offset, slot, task, then its fields) as an event */
static int event_of_tuple(int kind, PyObject *t, ev_t *ev)
{
    event_clear(ev);
    ev->text = ev->end = NULL;
    ev->kind = kind;
    int ok = field_int(t, 0, &ev->line) && field_int(t, 1, &ev->offset) && field_int(t, 2, &ev->slot) &&
             field_int(t, 3, &ev->task);
    switch (kind) {
    case K_CREATED: case K_RESTORED: case K_ERASED: case K_ERASED_OLD: case K_TOO_CLOSE:
        ok = ok && field_int(t, 4, &ev->pmin) && field_int(t, 5, &ev->pmax) && field_int(t, 6, &ev->n);
        ev->has_size = field_float(t, 8, &ev->size);
        ev->has_took = field_float(t, 9, &ev->took);
        if (kind == K_RESTORED || kind == K_ERASED)
            ok = ok && field_int(t, 10, &ev->extra);
        break;
    case K_SUPERSEDED:
    case K_TRIM:
        ok = ok && field_int(t, 4, &ev->n);
        break;
    case K_NEW_PROMPT:
        ok = ok && field_int(t, 6, &ev->n);
        break;
    case K_EVAL:
        field_float(t, 4, &ev->ms);
        ok = ok && field_int(t, 5, &ev->n);
        break;
    case K_SAVED:
    case K_LOADED:
    case K_CLEARED:
        ok = ok && field_int(t, 4, &ev->n);
        break;
    }
    return ok && !PyErr_Occurred();
}

/* fold_events(state, body, n, base_offset, [(kind index, event), ...]): the events Python read
 * from a handed-back line, in their place. None, or why the Python replay must read this server. */
static PyObject *fold_events(PyObject *self, PyObject *args)
{
    PyObject *capsule, *events;
    Py_buffer buf;
    Py_ssize_t n;
    long long base_offset;
    (void)self;
    if (!PyArg_ParseTuple(args, "Oy*nLO!", &capsule, &buf, &n, &base_offset, &PyList_Type, &events))
        return NULL;
    PyObject *result = NULL;
    fold_t *f = PyCapsule_GetPointer(capsule, "shadowlab.logs._logscan.fold");
    if (f == NULL)
        goto done;
    if (n < 0 || n > buf.len) {
        PyErr_SetString(PyExc_ValueError, "fold_events: 0 <= n <= len(body) expected");
        goto done;
    }
    cp body = buf.buf;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(events) && !f->fallback; i++) {
        PyObject *item = PyList_GET_ITEM(events, i);
        int kind;
        PyObject *t;
        if (!PyArg_ParseTuple(item, "iO!", &kind, &PyTuple_Type, &t))
            goto done;
        if (kind < 0 || kind >= N_KINDS) {
            PyErr_SetString(PyExc_ValueError, "fold_events: an unknown event kind");
            goto done;
        }
        ev_t ev;
        if (!event_of_tuple(kind, t, &ev)) {
            f->fallback = "a handed-back line's number past int64";
            break;
        }
        int64_t at = ev.offset - base_offset;
        if (at < 0 || at >= n) {
            f->fallback = "a handed-back event outside its block";
            break;
        }
        ev.text = body + at;
        ev.end = body + n;
        take_notes_before(f, ev.offset);
        if (fold_event(f, &ev) < 0 && !f->fallback)
            goto done;
    }
    result = f->fallback ? fallback_reason(f) : Py_NewRef(Py_None);
done:
    PyBuffer_Release(&buf);
    return result;
}

/* the state of fold_trace(state) / fold_finish(state); NULL: an error set */
static fold_t *state_arg(PyObject *args)
{
    PyObject *capsule;
    if (!PyArg_ParseTuple(args, "O", &capsule))
        return NULL;
    return PyCapsule_GetPointer(capsule, "shadowlab.logs._logscan.fold");
}

/* fold_trace(state) -> bytes: the trace lines written since the last call (and forgotten here) */
static PyObject *fold_trace(PyObject *self, PyObject *args)
{
    (void)self;
    fold_t *f = state_arg(args);
    if (f == NULL)
        return NULL;
    PyObject *out = PyBytes_FromStringAndSize(f->tr, (Py_ssize_t)f->tr_n);
    f->tr_n = 0;
    return out;
}

static int int64_order(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* An LSD radix sort by the bytes that differ (token counts differ in 2-3 of 8: ~5x faster
 * than qsort here); keys offset by 2^63 so that unsigned order is signed order. qsort when
 * there is no memory for the second buffer. */
static void sort_int64(int64_t *v, Py_ssize_t n)
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

/* sorted: logs.Figures only counts and ranks these, and Python's sort merges sorted runs fast */
static PyObject *vec_bytes(vec_t *a)
{
    sort_int64(a->v, a->n);
    return PyBytes_FromStringAndSize((const char *)a->v, a->n * (Py_ssize_t)sizeof(int64_t));
}

static PyObject *fig_dict(slot_t *s)
{
    fig_t *g = &s->fig;
    PyObject *outcomes = PyTuple_New(N_OUTCOMES), *events = PyTuple_New(N_EVENT_COUNTS);
    if (outcomes == NULL || events == NULL) {
        Py_XDECREF(outcomes);
        Py_XDECREF(events);
        return NULL;
    }
    for (int i = 0; i < N_OUTCOMES; i++)
        PyTuple_SET_ITEM(outcomes, i, PyLong_FromLongLong(g->outcomes[i]));
    for (int i = 0; i < N_EVENT_COUNTS; i++)
        PyTuple_SET_ITEM(events, i, PyLong_FromLongLong(g->events[i]));
    return Py_BuildValue(
        "{sLsNsNsNsLsNsLsLsLsLsLsLsdsLsLsLsLsLsLsLsdsdsLsLsLsdsdsNsN}", "slot", (long long)s->id, "outcomes", outcomes,
        "events", events, "shared", vec_bytes(&g->shared), "shared_stated", (long long)g->shared_stated, "prompts",
        vec_bytes(&g->prompts), "requests", (long long)g->requests, "prompt_tokens", (long long)g->prompt_tokens,
        "reusable", (long long)g->reusable, "reused", (long long)g->reused, "processed", (long long)g->processed,
        "avoidable", (long long)g->avoidable, "prefill_ms", g->prefill_ms, "timed_tokens", (long long)g->timed_tokens,
        "placement", (long long)g->placement, "retention", (long long)g->retention, "baseline",
        (long long)g->baseline, "create_n", (long long)g->create_n, "create_mib_n", (long long)g->create_mib_n,
        "create_ms_n", (long long)g->create_ms_n, "create_mib", g->create_mib, "create_ms", g->create_ms,
        "restore_n", (long long)g->restore_n, "restore_mib_n", (long long)g->restore_mib_n, "restore_ms_n",
        (long long)g->restore_ms_n, "restore_mib", g->restore_mib, "restore_ms", g->restore_ms, "t0",
        opt_float(g->has_t, g->t0), "t1", opt_float(g->has_t, g->t1));
}

static PyObject *fold_finish(PyObject *self, PyObject *args)
{
    (void)self;
    fold_t *f = state_arg(args);
    if (f == NULL)
        return NULL;
    if (!f->fallback && finish_open(f) < 0 && !f->fallback)
        return NULL;
    if (f->fallback) {
        PyErr_Clear();
        return PyUnicode_FromString(f->fallback);
    }
    PyObject *slots = PyList_New(0), *ring_notes = PyList_New(0);
    for (int64_t order = 0; slots != NULL && order < f->fig_order; order++) /* logs' slots dict order */
        for (int i = 0; i < f->n_slots; i++)
            if (f->slots[i].fig_order == order) {
                PyObject *d = fig_dict(&f->slots[i]);
                if (d == NULL || PyList_Append(slots, d) < 0)
                    Py_CLEAR(slots);
                Py_XDECREF(d);
            }
    int order[FOLD_SLOTS], n_rings = 0; /* Replay.rings' order: by creation since the last restart */
    for (int i = 0; i < f->n_slots; i++) {
        if (!f->slots[i].has_ring)
            continue;
        int j = n_rings++;
        for (; j > 0 && f->slots[order[j - 1]].ring_seq > f->slots[i].ring_seq; j--)
            order[j] = order[j - 1];
        order[j] = i;
    }
    for (int j = 0; ring_notes != NULL && j < n_rings; j++) {
        PyObject *notes = f->slots[order[j]].notes;
        if (notes != NULL && PyList_SetSlice(ring_notes, PY_SSIZE_T_MAX, PY_SSIZE_T_MAX, notes) < 0)
            Py_CLEAR(ring_notes);
    }
    if (slots == NULL || ring_notes == NULL) {
        Py_XDECREF(slots);
        Py_XDECREF(ring_notes);
        return NULL;
    }
    PyObject *kinds = PyTuple_New(N_KINDS);
    for (int i = 0; kinds != NULL && i < N_KINDS; i++) {
        PyObject *v = PyLong_FromLongLong(f->kinds[i]);
        if (v == NULL)
            Py_CLEAR(kinds);
        else
            PyTuple_SET_ITEM(kinds, i, v);
    }
    if (kinds == NULL) {
        Py_DECREF(slots);
        Py_DECREF(ring_notes);
        return NULL;
    }
    return Py_BuildValue("{sNsOsLsNsOsOsOsN}", "slots", slots, "notes", f->notes, "restarts", (long long)f->restarts,
                         "ring_notes", ring_notes, "rows", f->rows, "times", f->times, "codes", f->codes, "kinds",
                         kinds);
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "scan(body, lo, hi, base_line, base_offset, classes, strings, search=0) -> "
                                 "(events, slow, newlines, candidates, ignored, counts)"},
    {"fold_new", fold_new, METH_VARARGS, "fold_new(rows, server_json=None, slot=None, since=None, until=None) -> "
                                         "the state of one server's fold"},
    {"fold_block", fold_block, METH_VARARGS, "fold_block(state, body, lo, n, base_line, base_offset, piece_line=0) -> "
                                             "newlines | (start, stop, line_no, word) | str"},
    {"fold_events", fold_events, METH_VARARGS, "fold_events(state, body, n, base_offset, [(kind, event), ...]) -> "
                                               "None | str"},
    {"fold_finish", fold_finish, METH_VARARGS, "fold_finish(state) -> dict | str"},
    {"fold_trace", fold_trace, METH_VARARGS, "fold_trace(state) -> bytes: the trace lines since the last call"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "shadowlab.logs._logscan",
    .m_doc = "The log parser's whole-line fast path in C; shadowlab/logs/parse.py is the specification.",
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
