/* shadowlab.logs._logscan's line scanner: the log parser's whole-line fast path in C.
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
#include "_logscan.h"

/* ------------------------------------------------------------------ small matchers
 * Each takes the cursor and the line end and returns the cursor after what it matched, or
 * NULL. NULL propagates, so a shape reads as a chain of calls. */

static int is_word(unsigned char c)
{
    return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

/* \d+ into *v (at most MAX_DIGITS digits, else NULL: Python reads it). The digits are read up
 * to a limit set once (no count kept per digit: this loop was ~6% of the fold's instructions) */
static cp uint_(cp p, cp e, int64_t *v)
{
    if (p == NULL || p >= e || !is_digit(*p))
        return NULL;
    cp lim = e - p > MAX_DIGITS ? p + MAX_DIGITS : e;
    uint64_t x = (uint64_t)(*p++ - '0');
    while (p < lim && is_digit(*p))
        x = x * 10 + (uint64_t)(*p++ - '0');
    if (p < e && is_digit(*p)) /* a digit past the MAX_DIGITS read */
        return NULL;
    *v = (int64_t)x;
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

/* \d+\.\d+ (need_dot) or \d+(?:\.\d+)? ; the text is kept in *s / *n for float(). More than
 * MAX_DIGITS digits before the point: NULL (Python judges the value, events.believable). */
static cp decimal(cp p, cp e, int need_dot, cp *s, size_t *n)
{
    if (p == NULL || p >= e || !is_digit(*p))
        return NULL;
    cp start = p;
    while (p < e && is_digit(*p))
        p++;
    if (p - start > MAX_DIGITS)
        return NULL;
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
    cp bar = first_bar(s, e), q;
    cp id = bar != NULL ? prefix_back(s, bar, &q) : NULL;
    if (id == NULL || bar - 1 - q > MAX_DIGITS || uint_(q, bar - 1, &h->slot) != bar - 1)
        return NULL;
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
static inline __attribute__((always_inline)) int trigger_at(cp s, cp e, cp p, int word)
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
static inline __attribute__((always_inline)) int trigger_word(cp s, cp e, cp at)
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
/* The pair hits of the WIDTH positions from `at` (a 0x00 / 0xff lane each) into `hit`, its
 * first load into `a0`: the search's and the fused finder's chunk (chunk_v32); chunk_v64 writes
 * the same pairs with AVX-512 mask compares. */
#define PAIR_HITS(V, WIDTH, at, hit, a0)                                                                    \
    const V zero_ = {0};                                                                                   \
    V a0, a1_, a3_, a4_, a5_, a9_, a10_, a15_;                                                              \
    memcpy(&a0, (at), WIDTH);                                                                              \
    memcpy(&a1_, (at) + 1, WIDTH);                                                                         \
    memcpy(&a3_, (at) + 3, WIDTH);                                                                         \
    memcpy(&a4_, (at) + 4, WIDTH);                                                                         \
    memcpy(&a5_, (at) + 5, WIDTH);                                                                         \
    memcpy(&a9_, (at) + 9, WIDTH);                                                                         \
    memcpy(&a10_, (at) + 10, WIDTH);                                                                       \
    memcpy(&a15_, (at) + 15, WIDTH);                                                                       \
    V hit = (V)(((a4_ == zero_ + 'k') & (a5_ == zero_ + 'p')) | ((a0 == zero_ + 'p') & (a3_ == zero_ + 'm')) | \
                ((a0 == zero_ + 'm') & ((a9_ == zero_ + 'q') | (a9_ == zero_ + 'd'))) |                    \
                ((a1_ == zero_ + 'v') & (a10_ == zero_ + 'm')) | ((a4_ == zero_ + 'c') & (a15_ == zero_ + 'y')))

#define SEARCH_BODY(V, WIDTH, MASK)                                                   \
    for (; p < e && p + (15 + WIDTH > READ_AHEAD ? 15 + WIDTH : READ_AHEAD) <= readable; p += WIDTH) {  \
        PAIR_HITS(V, WIDTH, p, hit, a0);                                                                 \
        (void)a0;                                                                                        \
        for (uint64_t bits = MASK(hit); bits != 0; bits &= bits - 1) {                                   \
            cp at = p + __builtin_ctzll(bits);                                                           \
            if (at >= e)                                                                                 \
                return (hit_t){NULL, W_NONE};                                                          \
            int w = trigger_word(s, e, at);                                                              \
            if (w != W_NONE)                                                                             \
                return (hit_t){at, w};                                                                 \
        }                                                                                                \
    }

static hit_t search_scalar(cp s, cp e, cp p, cp readable)
{
    (void)readable;
    return search_tail(s, e, p);
}

#if defined(__GNUC__) && defined(__x86_64__)

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

/* 64 lanes (AVX-512BW): the loads then reach 15 + 64 bytes past a position */
__attribute__((target("avx512f,avx512bw"))) static hit_t search_v64(cp s, cp e, cp p, cp readable)
{
    SEARCH_BODY(v64, 64, MASK64)
    return search_tail(s, e, p);
}
#endif

/* search: 0 the widest this CPU runs, 1 scalar, 2 16 lanes (SSE2), 3 32 lanes (AVX2), 4 64 lanes
 * (AVX-512BW); NULL if this build or CPU lacks it. Tests run every variant the machine has
 * against the others. */
search_fn pick_search(int search)
{
#ifdef VECTOR_SEARCH
    int avx2 = __builtin_cpu_supports("avx2");
    int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
    if (search == 4 || (search == 0 && avx512))
        return avx512 ? search_v64 : NULL;
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

#ifdef VECTOR_SEARCH
/* count_newlines at 32 bytes a time: the spans between two trigger lines are short (a few
 * lines), so the tail is one more load ending at e, its lanes before the 32-byte steps' end
 * masked off (a span under 32 bytes goes the scalar way). */
__attribute__((target("avx2,popcnt"))) static int64_t count_newlines_v32(cp p, cp e)
{
    int64_t n = 0;
    const __m256i nl = _mm256_set1_epi8('\n');
    if (e - p < 32) {
        for (; p < e; p++)
            n += *p == '\n';
        return n;
    }
    for (; e - p >= 32; p += 32)
        n += __builtin_popcount((uint32_t)_mm256_movemask_epi8(
            _mm256_cmpeq_epi8(_mm256_loadu_si256((const __m256i *)p), nl)));
    if (p < e) {
        uint32_t bits = (uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_loadu_si256((const __m256i *)(e - 32)), nl));
        n += __builtin_popcount(bits >> (32 - (e - p)));
    }
    return n;
}
#endif

/* newlines in [p, e) */
static int64_t count_newlines(cp p, cp e)
{
    int64_t n = 0;
#ifdef VECTOR_SEARCH
    static int avx2 = -1;
    if (avx2 < 0)
        avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt");
    if (avx2)
        return count_newlines_v32(p, e);
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

/* the start of the line holding `at`, no earlier than `low`: 16 bytes a step back from `at`
 * where the vector search is built (the side notes ask it of lines a few dozen bytes long, where
 * memrchr's call cost more than the search) */
cp line_start(cp low, cp at)
{
#ifdef VECTOR_SEARCH
    const __m128i nl = _mm_set1_epi8('\n');
    while (at - low >= 16) {
        at -= 16;
        unsigned m = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)at), nl));
        if (m)
            return at + (31 - __builtin_clz(m)) + 1;
    }
    while (at > low && at[-1] != '\n')
        at--;
    return at;
#elif defined(__GLIBC__)
    cp nl = memrchr(low, '\n', (size_t)(at - low));
    return nl != NULL ? nl + 1 : low;
#else
    while (at > low && at[-1] != '\n')
        at--;
    return at;
#endif
}

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
    /* common/arg.cpp's warning for an option given twice (`-ctxcp 8 --ctx-checkpoints 32`), once
     * per start: stamp DEPRECATED: argument '--ctx-checkpoints' specified multiple times, use
     * comma-separated values instead (only last value will be used). The tolerant path knows it
     * by _BENIGN's "ctx-checkpoints"; it holds no event phrase. */
    if (end_(LIT(LIT(stamp(s, e), e, "DEPRECATED: argument '--ctx-checkpoints' specified multiple times, "),
                 e, "use comma-separated values instead (only last value will be used)"), e))
        return R_BENIGN;
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
cp rfind(cp low, cp end, const char *needle, size_t n)
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

#ifdef VECTOR_SEARCH
/* memchr(p, '\n', e - p) inside the fused finders: the span is the rest of a line (a hundred
 * bytes or so), shorter than the library call costs. The loads stay inside the span. */
__attribute__((target("avx2"))) static inline cp next_newline_v32(cp p, cp e)
{
    const __m256i nl = _mm256_set1_epi8('\n');
    for (; e - p >= 32; p += 32) {
        uint32_t m = (uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_loadu_si256((const __m256i *)p), nl));
        if (m)
            return p + __builtin_ctz(m);
    }
    for (; p < e; p++)
        if (*p == '\n')
            return p;
    return NULL;
}
#endif

/* the "hecking " at `at`, kept unless it is already (in order, each once) */
static inline void hk_push(finder_t *f, const ctx_t *c, cp at)
{
    Py_ssize_t off = at - c->body;
    if (off < f->hk_done)
        return;
    if (f->n_hk == f->cap_hk) {
        Py_ssize_t cap = f->cap_hk ? 2 * f->cap_hk : 1024;
        Py_ssize_t *grown = PyMem_RawRealloc(f->hk, (size_t)cap * sizeof *grown);
        if (grown == NULL) {
            f->hk_nomem = 1;
            return;
        }
        f->hk = grown;
        f->cap_hk = cap;
    }
    f->hk[f->n_hk++] = off;
    f->hk_done = off + 1;
}

/* every "hecking " starting in [p, to) not kept yet (entirely inside [p, limit)), by the
 * generic search */
static void hk_span(finder_t *f, const ctx_t *c, cp p, cp to, cp limit, cp readable)
{
    if (c->body + f->hk_done > p)
        p = c->body + f->hk_done;
    if (p >= to)
        return;
    /* a word starting before `to` ends by to + HECKING_LEN - 1 */
    cp stop = limit - to > (ptrdiff_t)HECKING_LEN - 1 ? to + HECKING_LEN - 1 : limit;
    for (cp h = f->hk_search(p, stop, readable); h != NULL; h = f->hk_search(h + 1, stop, readable))
        hk_push(f, c, h);
    if (to - c->body > f->hk_done)
        f->hk_done = to - c->body;
}

/* The next batch of the region [c->from, limit) (f->n records so far: f->max at most): the
 * region is searched for the next trigger word, its line is read, and the search goes on after
 * that line. Lines are numbered by counting the newlines skipped. The loads of the vector search
 * may read on to `readable`. Touches no Python object. Returns 1 when the region is done. The
 * generic way: the picked search, the library's memchr / memrchr, then the newline count. It
 * may take over from a fused finder near `readable` with the batch part full; either leaves
 * f->counted at f->p. */
static int find_generic(finder_t *f, const ctx_t *c, cp limit, cp readable, search_fn search)
{
    if (f->hk_search != NULL)
        hk_span(f, c, f->p, limit, limit, readable);
    while (f->p < limit && f->n < f->max) {
        hit_t hit = search(c->from, limit, f->p, readable);
        if (hit.at == NULL) {
            f->p = limit;
            break;
        }
        cp s = line_start(f->p, hit.at);
        cp nl = memchr(hit.at, '\n', (size_t)(limit - hit.at));
        f->newlines += count_newlines(f->counted, s);
        cp e = nl != NULL ? nl : limit;
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
    /* between batches f->counted == f->p, whichever finder ran last (the fused ones start so) */
    f->newlines += count_newlines(f->counted, f->p);
    f->counted = f->p;
    return f->p >= limit;
}

#ifdef VECTOR_SEARCH
/* The fused finder of the AVX2 and AVX-512 machines: the trigger search and the newline count in
 * one pass over the region, from the same loads. A chunk of WIDTH positions gives two masks: the
 * pair hits of SEARCH_BODY (checked by trigger_word, in position order) and its newlines. A
 * chunk without a trigger adds its newlines to the count and, when it has one, moves the start of
 * the current line; at a trigger the line's start is the last newline before it in the chunk (or
 * that start), its end the next newline after it (in the chunk, or searched on), and its number
 * the count plus the newlines before it in the chunk. The search goes on after the line's
 * newline (the counted point, so no span is counted twice). Near `readable` (the loads would pass
 * it) the rest goes the generic way, from the start of the current line (the chunks already
 * searched held no trigger: searching them again finds none). For the fold (f->hk_search set)
 * a third mask gives the side notes' "hecking " at +1 from the lanes with 'k' at +4 and 'i' at +5
 * (the 'k' compare is the "checkpoint" pair's), and the newline search over a trigger line's tail
 * looks for it too (NEXT_NEWLINE_HK), so every byte of the region is looked at for it once, with
 * no pass of its own. Same records, same counts, same words as find_generic's; the tests run
 * every search variant against the others. */
#define FUSED_BODY(WIDTH, CHUNK, SEARCH, NEXT_NEWLINE, NEXT_NEWLINE_HK)                                        \
    cp p = f->p, begin = f->p; /* begin: the start of the line holding p */                                    \
    int64_t nls = f->newlines; /* newlines before p (f->counted == f->p here) */                               \
    int hk = f->hk_search != NULL;                                                                              \
    while (p < limit && f->n < f->max) {                                                                        \
        if (p + 15 + WIDTH > readable) { /* the generic way for the rest, from the current line */             \
            f->p = f->counted = begin;                                                                          \
            f->newlines = nls;                                                                                  \
            return find_generic(f, c, limit, readable, SEARCH);                                                 \
        }                                                                                                       \
        uint64_t nlm, hkm, hits = CHUNK(p, &nlm, &hkm);                                                         \
        if (limit - p < WIDTH) { /* the region ends inside the chunk */                                        \
            uint64_t valid = (1ull << (limit - p)) - 1;                                                         \
            hits &= valid;                                                                                      \
            nlm &= valid;                                                                                       \
        }                                                                                                       \
        if (hk) { /* the chunk's words start at +1 from its lanes; one at p itself only when not seen */      \
            if (p - c->body >= f->hk_done)                                                                      \
                hk_lanes(f, c, p, 1, limit);                                                                    \
            hk_lanes(f, c, p + 1, hkm, limit);                                                                  \
            if (p + WIDTH + 1 - c->body > f->hk_done)                                                           \
                f->hk_done = p + WIDTH + 1 - c->body;                                                           \
        }                                                                                                       \
        int w = W_NONE, i = 0;                                                                                  \
        for (; hits != 0; hits &= hits - 1) {                                                                   \
            i = __builtin_ctzll(hits);                                                                          \
            if ((w = trigger_word(c->from, limit, p + i)) != W_NONE)                                            \
                break;                                                                                          \
        }                                                                                                       \
        if (w == W_NONE) { /* no trigger in the chunk */                                                       \
            if (nlm) {                                                                                          \
                nls += __builtin_popcountll(nlm);                                                               \
                begin = p + (63 - __builtin_clzll(nlm)) + 1;                                                    \
            }                                                                                                   \
            p += WIDTH;                                                                                         \
            continue;                                                                                           \
        }                                                                                                       \
        uint64_t before = nlm & ((1ull << i) - 1), after = i == 63 ? 0 : nlm & ~((2ull << i) - 1);              \
        cp s = before ? p + (63 - __builtin_clzll(before)) + 1 : begin;                                         \
        int64_t line = nls + __builtin_popcountll(before);                                                      \
        cp nl = after ? p + __builtin_ctzll(after)                                                              \
                      : hk ? NEXT_NEWLINE_HK(f, c, p + WIDTH, limit, readable) : NEXT_NEWLINE(p + WIDTH, limit);    \
        cp e = nl != NULL ? nl : limit;                                                                         \
        rec_t *r = &f->recs[f->n];                                                                              \
        int res = (e - s > MAX_LINE) ? R_SLOW : read_line(c, s, e, w, r);                                       \
        if (res == R_BENIGN || res == R_KNOWN) {                                                                \
            f->candidates++;                                                                                    \
            f->ignored += res == R_BENIGN;                                                                      \
        } else {                                                                                                \
            r->result = (int8_t)res;                                                                            \
            r->word = (int8_t)w;                                                                                \
            r->line = line;                                                                                     \
            r->start = s - c->body;                                                                             \
            r->stop = e - c->body;                                                                              \
            f->n++;                                                                                             \
        }                                                                                                       \
        if (nl == NULL) { /* the line runs to the region's end: no newline left to count */                    \
            f->p = f->counted = limit;                                                                          \
            f->newlines = line;                                                                                 \
            return 1;                                                                                           \
        }                                                                                                       \
        p = begin = nl + 1;                                                                                     \
        nls = line + 1;                                                                                         \
    }                                                                                                           \
    f->p = f->counted = p < limit ? p : limit;                                                                  \
    f->newlines = nls;                                                                                          \
    return p >= limit;

/* the words "hecking " at `base` + each lane of `lanes` that lie inside [.., limit) */
static inline void hk_lanes(finder_t *f, const ctx_t *c, cp base, uint64_t lanes, cp limit)
{
    for (; lanes != 0; lanes &= lanes - 1) {
        cp at = base + __builtin_ctzll(lanes);
        if (limit - at >= (ptrdiff_t)HECKING_LEN && memcmp(at, HECKING, HECKING_LEN) == 0)
            hk_push(f, c, at);
    }
}

/* the rest of a line as next_newline's, when the side notes are looked for: the words starting
 * in [p, its newline + 1] are kept too (the next chunk, at newline + 1, sees them from +1 on), 'k'
 * at +3 and 'i' at +4 from the same loop; near `readable` and for the tail, memchr and the
 * search. */
#define NEXT_NEWLINE_HK_BODY(WIDTH, NL, KI)                                                                    \
    for (; e - p >= WIDTH && p + WIDTH + 4 <= readable; p += WIDTH) {                                          \
        uint64_t m = NL(p), ki = KI(p);                                                                        \
        if (m) {                                                                                               \
            int at = __builtin_ctzll(m), seen = at + 2 < WIDTH ? at + 2 : WIDTH; /* lanes to the newline + 1 */ \
            hk_lanes(f, c, p, seen == 64 ? ki : ki & ((1ull << seen) - 1), e);                                 \
            if (p + seen - c->body > f->hk_done)                                                               \
                f->hk_done = p + seen - c->body;                                                               \
            return p + at;                                                                                     \
        }                                                                                                      \
        hk_lanes(f, c, p, ki, e);                                                                              \
        if (p + WIDTH - c->body > f->hk_done)                                                                  \
            f->hk_done = p + WIDTH - c->body;                                                                  \
    }                                                                                                          \
    cp nl = p < e ? memchr(p, '\n', (size_t)(e - p)) : NULL;                                                  \
    hk_span(f, c, p, nl != NULL && nl + 2 < e ? nl + 2 : e, e, readable);                                      \
    return nl;

#define NL32(q) ((uint64_t)(uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_loadu_si256((const __m256i *)(q)), \
                                                                            _mm256_set1_epi8('\n'))))
#define KI32(q)                                                                                                \
    ((uint64_t)(uint32_t)_mm256_movemask_epi8(                                                                 \
        _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_loadu_si256((const __m256i *)((q) + 3)), _mm256_set1_epi8('k')), \
                         _mm256_cmpeq_epi8(_mm256_loadu_si256((const __m256i *)((q) + 4)), _mm256_set1_epi8('i')))))
#define NL64(q) _mm512_cmpeq_epi8_mask(_mm512_loadu_si512((const void *)(q)), _mm512_set1_epi8('\n'))
#define KI64(q)                                                                                                \
    _mm512_mask_cmpeq_epi8_mask(_mm512_cmpeq_epi8_mask(_mm512_loadu_si512((const void *)((q) + 3)), _mm512_set1_epi8('k')), \
                                _mm512_loadu_si512((const void *)((q) + 4)), _mm512_set1_epi8('i'))

__attribute__((target("avx2"))) static cp next_newline_hk_v32(finder_t *f, const ctx_t *c, cp p, cp e, cp readable)
{
    NEXT_NEWLINE_HK_BODY(32, NL32, KI32)
}

__attribute__((target("avx512f,avx512bw"))) static cp next_newline_hk_v64(finder_t *f, const ctx_t *c, cp p, cp e,
                                                                          cp readable)
{
    NEXT_NEWLINE_HK_BODY(64, NL64, KI64)
}

/* next_newline at 64 bytes a time */
__attribute__((target("avx512f,avx512bw"))) static inline cp next_newline_v64(cp p, cp e)
{
    const __m512i nl = _mm512_set1_epi8('\n');
    for (; e - p >= 64; p += 64) {
        uint64_t m = _mm512_cmpeq_epi8_mask(_mm512_loadu_si512((const void *)p), nl);
        if (m)
            return p + __builtin_ctzll(m);
    }
    return next_newline_v32(p, e);
}

/* A chunk's pair hits (SEARCH_BODY's pairs), in *nl its newlines and in *hk the lanes with 'k'
 * at +4 and 'i' at +5 (a "hecking " at +1: checked whole): a bit per position. */
__attribute__((target("avx2"))) static inline uint64_t chunk_v32(cp p, uint64_t *nl, uint64_t *hk)
{
    PAIR_HITS(v32, 32, p, hit, a0);
    *nl = MASK32((v32)(a0 == zero_ + '\n'));
    *hk = MASK32((v32)((a4_ == zero_ + 'k') & (a5_ == zero_ + 'i')));
    return MASK32(hit);
}

/* the same with AVX-512BW's compares into mask registers, each pair's second compare masked by
 * its first */
__attribute__((target("avx512f,avx512bw"))) static inline uint64_t chunk_v64(cp p, uint64_t *nl, uint64_t *hk)
{
#define AT(i) _mm512_loadu_si512((const void *)(p + (i)))
#define B(ch) _mm512_set1_epi8(ch)
    __m512i a0 = AT(0), a4 = AT(4), a5 = AT(5), a9 = AT(9);
    __mmask64 k4 = _mm512_cmpeq_epi8_mask(a4, B('k'));
    __mmask64 ck = _mm512_mask_cmpeq_epi8_mask(k4, a5, B('p'));
    *hk = _mm512_mask_cmpeq_epi8_mask(k4, a5, B('i'));
    __mmask64 pr = _mm512_mask_cmpeq_epi8_mask(_mm512_cmpeq_epi8_mask(a0, B('p')), AT(3), B('m'));
    __mmask64 m0 = _mm512_cmpeq_epi8_mask(a0, B('m'));
    __mmask64 mq = _mm512_mask_cmpeq_epi8_mask(m0, a9, B('q')) | _mm512_mask_cmpeq_epi8_mask(m0, a9, B('d'));
    __mmask64 kv = _mm512_mask_cmpeq_epi8_mask(_mm512_cmpeq_epi8_mask(AT(1), B('v')), AT(10), B('m'));
    __mmask64 sel = _mm512_mask_cmpeq_epi8_mask(_mm512_cmpeq_epi8_mask(a4, B('c')), AT(15), B('y'));
    *nl = _mm512_cmpeq_epi8_mask(a0, B('\n'));
    return ck | pr | mq | kv | sel;
#undef AT
#undef B
}

__attribute__((target("avx2,popcnt"))) static int find_batch_v32(finder_t *f, const ctx_t *c, cp limit, cp readable)
{
    FUSED_BODY(32, chunk_v32, search_v32, next_newline_v32, next_newline_hk_v32)
}

__attribute__((target("avx512f,avx512bw,avx2,popcnt"))) static int find_batch_v64(finder_t *f, const ctx_t *c, cp limit,
                                                                                 cp readable)
{
    FUSED_BODY(64, chunk_v64, search_v64, next_newline_v64, next_newline_hk_v64)
}
#endif

int find_batch(finder_t *f, const ctx_t *c, cp limit, cp readable, search_fn search)
{
    f->n = 0;
#ifdef VECTOR_SEARCH
    static int popcnt = -1;
    if (popcnt < 0)
        popcnt = __builtin_cpu_supports("popcnt");
    /* pick_search gives these only where the CPU runs them */
    if (search == search_v32 && popcnt)
        return find_batch_v32(f, c, limit, readable);
    if (search == search_v64 && popcnt)
        return find_batch_v64(f, c, limit, readable);
#endif
    return find_generic(f, c, limit, readable, search);
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
    if (PyTuple_GET_SIZE(classes) != N_KINDS || PyTuple_GET_SIZE(strings) != N_METHODS) {
        PyErr_Format(PyExc_ValueError, "%d event classes and %d method names expected (logparse._ACCEL_CLASSES, "
                     "_ACCEL_METHODS)", (int)N_KINDS, (int)N_METHODS);
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

PyObject *scan(PyObject *self, PyObject *args)
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
    f->hk_search = NULL;
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

