#include "_logscan.h"

#include <errno.h>
#include <unistd.h>

/* ================================================================== fold: shadowlab logs' replay
 *
 *   fold_new(rows) -> state
 *   fold_block(state, body, lo, n, base_line, base_offset) -> newlines | (start, stop, line_no, word) | str
 *   fold_events(state, body, n, base_offset, [(kind, event), ...]) -> None | str
 *   fold_trace(state, fd=-1, least=0) -> (bytes | None, lines)   the --trace lines so far (written to fd if given)
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
#define CHECK_TABLE 16384   /* open addressing, its most entries: > 2 * PENDING_CHECKS */
#define CHECK_FIRST 64      /* its first size: a log has a note or two per slot pending, and a
                               table sized for the most (512 KB) missed the cache at every note */
#define SAVED_CHECKPOINTS (1 << 20) /* checkpoints in all entries together; more: the Python replay */

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
    int erase_kind[N_ERASE_KINDS], n_erase_kinds; /* erase_counts' keys in first-seen order */
    int64_t erase_count[N_ERASE_KINDS];
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
    double first_time;
    int64_t clock_base, clock_last; /* microseconds (logs._Clock's base_us, last_us) */
    check_t checks[CHECK_TABLE];              /* the first checks_cap in use (a power of two) */
    check_t checks_moved[PENDING_CHECKS];     /* the live ones while the table is rebuilt */
    int checks_live, checks_used, checks_cap; /* used: entries not empty (live or removed) */
    PyObject *notes, *rows, *times, *codes; /* lists and bytearrays */
    const char *fallback;
    struct note_s *block_notes; /* the side notes of the block being read, and the next to take */
    Py_ssize_t n_block_notes, next_note, cap_block_notes;
    unsigned char *last_head; /* the head of the last check note taken (logs._Stream.last_check) */
    size_t last_len;
    held_t *held; /* Replay._held's prompt-cache lines (its slot selections change nothing) */
    Py_ssize_t n_held, cap_held, last_save; /* last_save: Replay._last_save's index in held, -1: None */
    int64_t saved_checkpoints; /* in every slot's entries */
    int search;                                /* the trigger search variant (fold_new) */
    cp (*next_hecking)(cp p, cp end, cp readable); /* the side notes' search of the same variant */
    int has_slot_filter, has_since, has_until; /* the filters (logs.Options) */
    int64_t slot_filter, piece_line;           /* piece_line: the stream line its piece starts after */
    double since, until;
    PyObject *server_json; /* --trace: the server's name as JSON (bytes); NULL: no trace */
    char *tr;              /* the trace lines not yet taken (fold_trace) */
    size_t tr_n, tr_cap;
    Py_ssize_t tr_lines;   /* the trace lines in tr */
    int64_t kinds[N_KINDS]; /* events read, per kind (logparse's ParseStats.kinds) */
    finder_t *finder;       /* fold_block's, made at its first call */
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
    uint64_t mask = (uint64_t)f->checks_cap - 1, i = check_hash(slot, task) & mask;
    check_t *free_at = NULL;
    for (;; i = (i + 1) & mask) {
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

static void checks_clear(fold_t *f) /* every restart: the table back to its first size */
{
    if (f->checks_used > 0) /* most restarts find it empty */
        memset(f->checks, 0, (size_t)f->checks_cap * sizeof *f->checks);
    f->checks_live = f->checks_used = 0;
    f->checks_cap = CHECK_FIRST;
}

/* The table again without its removed marks, sized for its live entries: at most a quarter
 * full (the insert that asked finds room), at least CHECK_FIRST. live < PENDING_CHECKS here, so
 * the size stays within CHECK_TABLE. */
static void checks_rebuild(fold_t *f)
{
    int n = 0, cap = CHECK_FIRST;
    for (int i = 0; i < f->checks_cap; i++)
        if (f->checks[i].state == 1)
            f->checks_moved[n++] = f->checks[i];
    while (cap < 4 * (n + 1))
        cap *= 2;
    memset(f->checks, 0, (size_t)f->checks_cap * sizeof *f->checks);
    f->checks_cap = cap;
    f->checks_used = f->checks_live = n;
    for (int i = 0; i < n; i++)
        *check_find(f, f->checks_moved[i].slot, f->checks_moved[i].task, 1) = f->checks_moved[i];
}

/* Replay._take_note of a CheckpointCheck: clear at the cap, then setdefault */
static void check_take(fold_t *f, int64_t slot, int64_t task, int64_t against)
{
    if (f->checks_live >= PENDING_CHECKS)
        checks_clear(f);
    if (f->checks_used >= f->checks_cap * 3 / 4)
        checks_rebuild(f);
    check_t *c = check_find(f, slot, task, 1);
    if (c->state == 1)
        return;
    if (c->state == 0)
        f->checks_used++;
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

/* The "id" of the slot prefix ending at the first '|' of [from, w) (prefix_back, as any_head
 * reads it), or NULL. The patterns below start with "id +\d+ \| task": when this "id" matches,
 * no earlier one can (an earlier match's digits and spaces hold no '|', so its bar would be this
 * first one, and the prefix read back from a bar is the only one ending there): the leftmost. */
static cp first_prefix(cp from, cp w)
{
    cp bar = first_bar(from, w), digits;
    return bar != NULL ? prefix_back(from, bar, &digits) : NULL;
}

/* the leftmost match in [from, w) of a pattern that starts with "id +\d+ \| task" (re.search):
 * first the prefix at the first bar (a slot line's), else every "id" from the left */
static int search_id(cp from, cp w, int (*at)(cp, cp, note_t *, int *), note_t *n, int *big)
{
    cp id = first_prefix(from, w);
    if (id != NULL) {
        int b = 0;
        if (at(id, w, n, &b)) {
            *big |= b;
            return 1;
        }
    }
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
 * read on to `readable`. AVX-512BW or AVX2 where the CPU has it (a filter on 'h' +0, 'k' +3,
 * ' ' +7, each hit checked whole), memmem otherwise and for the tail: the same occurrences
 * whichever runs (hecking_all() runs each for the tests). */

static cp hecking_memmem(cp p, cp end, cp readable)
{
    (void)readable;
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
    return hecking_memmem(p, end, readable);
}

__attribute__((target("avx512f,avx512bw"))) static cp hecking_v64(cp p, cp end, cp readable)
{
    const __m512i h = _mm512_set1_epi8('h'), k = _mm512_set1_epi8('k'), sp = _mm512_set1_epi8(' ');
    for (; p + 64 <= end && p + 64 + 7 <= readable; p += 64) {
        __mmask64 bits = _mm512_cmpeq_epi8_mask(_mm512_loadu_si512((const void *)p), h);
        bits = _mm512_mask_cmpeq_epi8_mask(bits, _mm512_loadu_si512((const void *)(p + 3)), k);
        bits = _mm512_mask_cmpeq_epi8_mask(bits, _mm512_loadu_si512((const void *)(p + 7)), sp);
        for (; bits != 0; bits &= bits - 1) {
            cp at = p + __builtin_ctzll(bits);
            if (at + HECKING_LEN <= end && memcmp(at, HECKING, HECKING_LEN) == 0)
                return at;
        }
    }
    return hecking_v32(p, end, readable);
}
#endif

typedef cp (*hecking_fn)(cp p, cp end, cp readable);

/* variant as scan()'s search: 0 the widest this CPU runs, 1 memmem, 3 AVX2, 4 AVX-512BW; NULL if
 * this build or CPU lacks it */
static hecking_fn pick_hecking(int variant)
{
#ifdef VECTOR_SEARCH
    int avx2 = __builtin_cpu_supports("avx2");
    int avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
    if (variant == 4 || (variant == 0 && avx512))
        return avx512 ? hecking_v64 : NULL;
    if (variant == 3 || (variant == 0 && avx2))
        return avx2 ? hecking_v32 : NULL;
#endif
    return variant == 0 || variant == 1 ? hecking_memmem : NULL;
}

/* hecking_all(body, lo, hi, variant) -> [offset, ...]: every "hecking " inside body[lo:hi), by
 * the search `variant` (for the tests: each variant the machine has must find the same) */
PyObject *hecking_all(PyObject *self, PyObject *args)
{
    Py_buffer buf;
    Py_ssize_t lo, hi;
    int variant;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*nni", &buf, &lo, &hi, &variant))
        return NULL;
    PyObject *out = NULL;
    hecking_fn next = pick_hecking(variant);
    if (next == NULL)
        PyErr_Format(PyExc_ValueError, "hecking_all: variant %d is not available here", variant);
    else if (lo < 0 || hi < lo || hi > buf.len)
        PyErr_SetString(PyExc_ValueError, "hecking_all: 0 <= lo <= hi <= len(body) expected");
    else if ((out = PyList_New(0)) != NULL) {
        cp body = buf.buf;
        for (cp h = next(body + lo, body + hi, body + buf.len); h != NULL; h = next(h + 1, body + hi, body + buf.len)) {
            PyObject *at = PyLong_FromSsize_t(h - body);
            if (at == NULL || PyList_Append(out, at) < 0) {
                Py_XDECREF(at);
                Py_CLEAR(out);
                break;
            }
            Py_DECREF(at);
        }
    }
    PyBuffer_Release(&buf);
    return out;
}

/* The note of the "hecking " at h (both side notes hold the word, at +1 and +0; neither can
 * overlap itself), appended to the block's, as _side_notes' two find() loops make them; [body,
 * end) the block's whole lines. *big: a number past int64 in it. -1: no memory. */
static int note_at(fold_t *f, cp body, cp end, cp readable, int64_t base, cp h, int *big)
{
    static const char sim_rest[] = "sim = ", check_rest[] = "checkpoint with [";
    cp after = h + HECKING_LEN;
    if (h > body && h[-1] == 'c' && (size_t)(end - after) >= sizeof sim_rest - 1 &&
        memcmp(after, sim_rest, sizeof sim_rest - 1) == 0) {
        cp i = h - 1; /* "checking sim = " */
        cp ls = line_start(body, i);
        cp w = i + 40 < readable ? i + 40 : readable;
        note_t x = {.offset = base + (ls - body), .check = 0};
        if (search_id(ls, w, sim_at, &x, big) &&
            notes_push(&f->block_notes, &f->n_block_notes, &f->cap_block_notes, &x) < 0)
            return -1;
    } else if ((size_t)(end - after) >= sizeof check_rest - 1 && memcmp(after, check_rest, sizeof check_rest - 1) == 0) {
        cp i = h; /* "hecking checkpoint with [" */
        cp ls = line_start(body, i);
        cp head = rfind(ls, i, "| task ", 7);
        size_t len = head != NULL ? (size_t)(i - head) : 0;
        if (len == f->last_len && (len == 0 || memcmp(head, f->last_head, len) == 0))
            return 0; /* the task's run of check lines: one note */
        cp w = i + 80 < readable ? i + 80 : readable;
        note_t x = {.offset = base + (ls - body), .check = 1};
        if (search_id(ls, w, check_at, &x, big)) {
            unsigned char *kept = PyMem_Realloc(f->last_head, len ? len : 1);
            if (kept == NULL)
                return -1;
            memcpy(kept, head, len);
            f->last_head = kept;
            f->last_len = len;
            if (notes_push(&f->block_notes, &f->n_block_notes, &f->cap_block_notes, &x) < 0)
                return -1;
        }
    }
    return 0;
}

/* The notes of the "hecking " words the finder found (fi->hk, in order), appended to the block's;
 * [body, body + n) the block's whole lines. A sim and a check of one line (the same offset) are
 * kept in the order they stand, not sims first as _side_notes' merge puts them: a sim sets its
 * slot's lcp, a check its task's n_past, neither reads the other. -1: an error (f->fallback: a
 * number past int64). */
static int found_notes(fold_t *f, finder_t *fi, cp body, Py_ssize_t n, cp readable, int64_t base)
{
    int big = 0;
    if (fi->hk_nomem) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; k < fi->n_hk; k++)
        if (note_at(f, body, body + n, readable, base, body + fi->hk[k], &big) < 0) {
            PyErr_NoMemory();
            return -1;
        }
    fi->n_hk = 0;
    if (big) {
        f->fallback = "a side note's number past int64";
        return -1;
    }
    return 0;
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

/* logs._Clock for b11434 elapsed times: M.SS.mmm.uuu at the line start, counted in whole
 * microseconds (the printed decimal, no float error carried into sums) and given as seconds */
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
        *t = (double)f->clock_last / 1e6;
        return f->has_clock;
    }
    if (big || m > INT64_MAX / 60000000 - 1) {
        f->fallback = "a timestamp past int64";
        return 0;
    }
    int64_t ss = (p[1] - '0') * 10 + (p[2] - '0');
    int64_t ms = (p[4] - '0') * 100 + (p[5] - '0') * 10 + (p[6] - '0');
    int64_t us = (p[8] - '0') * 100 + (p[9] - '0') * 10 + (p[10] - '0');
    int64_t elapsed = ((m * 60 + ss) * 1000 + ms) * 1000 + us, now;
    if (__builtin_add_overflow(elapsed, f->clock_base, &now)) {
        f->fallback = "a timestamp past int64";
        return 0;
    }
    if (f->has_clock && now < f->clock_last - 1000000) { /* the server restarted: time goes on */
        f->clock_base = f->clock_last;
        if (__builtin_add_overflow(elapsed, f->clock_base, &now)) {
            f->fallback = "a timestamp past int64";
            return 0;
        }
    }
    f->clock_last = now;
    f->has_clock = 1;
    *t = (double)now / 1e6;
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

static const char *const ERASE_NAMES[N_ERASE_KINDS] = ERASE_NAMES_INIT;
static const char *const SOURCE_NAMES[] = SOURCE_NAMES_INIT;
static const char *const OUTCOME_NAMES[N_OUTCOMES] = OUTCOME_NAMES_INIT;

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
        "(NNNLLNNNNNsNNNNNOLLOOON)", opt_float(o->has_time, o->time), opt_int(s->id != NO_INT, s->id),
        opt_int(o->task != NO_INT, o->task),
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

/* ------------------------------------------------------------------ --trace: logs._row as json.dumps writes it
 * Room for a whole row is reserved once (ROW_MOST: the most bytes it can take), then it is
 * written through a cursor, no piece checked for room (a check and the buffer's length in memory
 * per piece were most of the trace's cost). */

/* room for n more bytes in the trace buffer */
static __attribute__((noinline)) int reserve_grown(fold_t *f, size_t n)
{
    size_t cap = f->tr_cap ? f->tr_cap : 1 << 16;
    while (cap < f->tr_n + n)
        cap *= 2;
    char *grown = PyMem_Realloc(f->tr, cap);
    if (grown == NULL)
        return -1;
    f->tr = grown;
    f->tr_cap = cap;
    return 0;
}

static inline __attribute__((always_inline)) int reserve(fold_t *f, size_t n)
{
    return __builtin_expect(f->tr_n + n > f->tr_cap, 0) ? reserve_grown(f, n) : 0;
}

#define INT_MOST 20 /* an int64's text: '-' and 19 digits, or 20 digits of its magnitude */
#define FLOAT_MOST 32 /* float.__repr__'s: 24 at most ("-2.2250738585072014e-308") */
#define CK_MOST (3 * INT_MOST + 4) /* "[a,b,c]" and a comma */
#define NAME_MOST 24 /* a quoted name of this file's own and a separator */

/* the most bytes one row takes: its literals (under 512), its numbers, names and lists */
static size_t row_most(const fold_t *f, const req_t *o)
{
    return 512 + (size_t)PyBytes_GET_SIZE(f->server_json) + 12 * INT_MOST + 2 * FLOAT_MOST + 8 * NAME_MOST +
           (size_t)(o->alive_before.n + o->created.n + 1) * CK_MOST + (size_t)o->n_erase_kinds * (NAME_MOST + INT_MOST);
}

/* a literal's length is a constant: its copy is a few moves, not a memcpy call (w is read once) */
static inline __attribute__((always_inline)) char *w_lit(char *w, const char *lit, size_t n)
{
    memcpy(w, lit, n);
    return w + n;
}
#define W_LIT(w, lit) w_lit((w), (lit), sizeof(lit) - 1)

static const uint64_t TENS[20] = {1ull, 10ull, 100ull, 1000ull, 10000ull, 100000ull, 1000000ull, 10000000ull,
                                  100000000ull, 1000000000ull, 10000000000ull, 100000000000ull,
                                  1000000000000ull, 10000000000000ull, 100000000000000ull,
                                  1000000000000000ull, 10000000000000000ull, 100000000000000000ull,
                                  1000000000000000000ull, 10000000000000000000ull};
static const char PAIRS[201] = "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
                               "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
                               "8081828384858687888990919293949596979899";

/* u's decimal digits: how many (from its bit length: log10(2) ~ 1233 / 4096, one compare to
 * settle it, no loop), and written to out[0, len) two a step from a table */
static inline __attribute__((always_inline)) size_t uint_len(uint64_t u)
{
    size_t t = (size_t)(((64 - __builtin_clzll(u | 1)) * 1233) >> 12); /* 10^t <= u < 10^(t+1), or t one too high */
    return t + (u >= TENS[t]) + (u == 0);
}

static inline __attribute__((always_inline)) void uint_text(char *out, uint64_t u, size_t len)
{
    char *p = out + len;
    while (u >= 100) {
        unsigned i = (unsigned)(u % 100) * 2;
        u /= 100;
        *--p = PAIRS[i + 1];
        *--p = PAIRS[i];
    }
    if (u >= 10) {
        *--p = PAIRS[u * 2 + 1];
        *--p = PAIRS[u * 2];
    } else {
        *--p = (char)('0' + u);
    }
}

/* "%lld" without printf's machinery (a third of the trace's cost once) */
static inline __attribute__((always_inline)) char *w_int(char *w, int64_t v)
{
    uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
    size_t len = uint_len(u);
    if (v < 0)
        *w++ = '-';
    uint_text(w, u, len);
    return w + len;
}

static inline __attribute__((always_inline)) char *w_opt_int(char *w, int has, int64_t v)
{
    return has ? w_int(w, v) : W_LIT(w, "null");
}

/* float.__repr__ of v when a decimal of at most 6 places, 15 significant digits, is v (the log's
 * times and milliseconds): that decimal is then the shortest that reads back as v (two decimals
 * of 15 digits or fewer are two doubles), the one repr writes. (double)k / 1e6 is the correctly
 * rounded value of k * 10^-6 (k and 10^6 are exact, IEEE division rounds once), as strtod gives.
 * 0: not such a value (repr's own conversion, the bignum one, writes it). out has room for 24
 * bytes: all six places are copied, the length returned drops the trailing zeros. */
static size_t repr_short(double v, char *out)
{
    double a = v < 0 ? -v : v;
    if (!(a >= 1e-4 && a < 1e9)) /* repr's fixed notation; k below 10^15 */
        return 0;
    int64_t k = (int64_t)(a * 1e6 + 0.5);
    if ((double)k / 1e6 != a)
        return 0;
    int64_t frac = k % 1000000, whole = k / 1000000;
    char six[6]; /* frac's six places, zeros first included */
    for (int i = 4; i >= 0; i -= 2, frac /= 100) {
        six[i] = PAIRS[frac % 100 * 2];
        six[i + 1] = PAIRS[frac % 100 * 2 + 1];
    }
    int places = 6;
    while (places > 1 && six[places - 1] == '0') /* trailing zeros go; "X.0" keeps one */
        places--;
    size_t len = uint_len((uint64_t)whole), n = (size_t)(v < 0) + len + 1 + (size_t)places;
    if (v < 0)
        *out++ = '-';
    uint_text(out, (uint64_t)whole, len);
    out[len] = '.';
    memcpy(out + len + 1, six, 6);
    return n;
}

/* float.__repr__, as json.dumps writes it; NULL: no memory (repr's own conversion) */
static char *w_float(char *w, int has, double v)
{
    if (!has)
        return W_LIT(w, "null");
    size_t n = repr_short(v, w);
    if (n)
        return w + n;
    char *text = PyOS_double_to_string(v, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (text == NULL)
        return NULL;
    n = strlen(text);
    if (n > FLOAT_MOST) { /* no double's repr is this long */
        PyMem_Free(text);
        return NULL;
    }
    memcpy(w, text, n);
    PyMem_Free(text);
    return w + n;
}

static inline __attribute__((always_inline)) char *w_ck(char *w, const ck_t *c)
{
    *w++ = '[';
    w = w_int(w, c->pmin);
    *w++ = ',';
    w = w_int(w, c->pmax);
    *w++ = ',';
    w = w_int(w, c->n);
    *w++ = ']';
    return w;
}

static char *w_cks(char *w, const cks_t *a)
{
    *w++ = '[';
    for (Py_ssize_t i = 0; i < a->n; i++) {
        if (i)
            *w++ = ',';
        w = w_ck(w, &a->v[i]);
    }
    *w++ = ']';
    return w;
}

/* The names a row writes, quoted (this file's own: ASCII, nothing to escape) and padded to
 * NAME_MOST bytes: a name is one copy of NAME_MOST bytes (the row's reservation has room for the
 * rest, which the next piece overwrites), not a byte loop that mispredicts at each name's end. */
typedef struct {
    char text[NAME_MOST];
    size_t len;
} name_t;

static name_t ERASE_Q[N_ERASE_KINDS], SOURCE_Q[sizeof SOURCE_NAMES / sizeof *SOURCE_NAMES], OUTCOME_Q[N_OUTCOMES],
    FAILURE_Q[3];
static const char *const FAILURE_NAMES[3] = {"placement", "retention", "baseline_loss"};

_Static_assert(LONGEST_NAME + 2 <= NAME_MOST && sizeof "baseline_loss" + 1 <= NAME_MOST,
               "a trace name, quoted, must fit NAME_MOST (row_most reserves that much a name)");

static void quote_names(name_t *out, const char *const *names, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (names[i] == NULL) /* SOURCE_NAMES' S_NONE: written as null, never as a name */
            continue;
        size_t len = strlen(names[i]);
        out[i].text[0] = '"';
        memcpy(out[i].text + 1, names[i], len);
        out[i].text[len + 1] = '"';
        out[i].len = len + 2;
    }
}

void fold_init(void)
{
    quote_names(ERASE_Q, ERASE_NAMES, N_ERASE_KINDS);
    quote_names(SOURCE_Q, SOURCE_NAMES, sizeof SOURCE_NAMES / sizeof *SOURCE_NAMES);
    quote_names(OUTCOME_Q, OUTCOME_NAMES, N_OUTCOMES);
    quote_names(FAILURE_Q, FAILURE_NAMES, 3);
}

static inline __attribute__((always_inline)) char *w_name(char *w, const name_t *q)
{
    memcpy(w, q->text, NAME_MOST);
    return w + q->len;
}

/* One trace line (docs/trace.md), the fields of logs._row in its order. -1: no memory. */
static int trace_row(fold_t *f, const slot_t *s, const req_t *o, int64_t prompt, int has_prompt, int64_t shared,
                     int source, int64_t re_entry, int has_re, int outcome, int retention, int baseline,
                     int placement)
{
    if (reserve(f, row_most(f, o)) < 0)
        return -1;
    char *w = f->tr + f->tr_n;
    w = W_LIT(w, "{\"time\":");
    if ((w = w_float(w, o->has_time, o->time)) == NULL)
        return -1;
    w = W_LIT(w, ",\"server\":");
    memcpy(w, PyBytes_AS_STRING(f->server_json), (size_t)PyBytes_GET_SIZE(f->server_json));
    w += PyBytes_GET_SIZE(f->server_json);
    w = w_opt_int(W_LIT(w, ",\"slot\":"), s->id != NO_INT, s->id);
    w = w_opt_int(W_LIT(w, ",\"task\":"), o->task != NO_INT, o->task);
    w = w_int(W_LIT(w, ",\"line\":"), o->line - o->piece_line);
    w = w_opt_int(W_LIT(w, ",\"prompt_tokens\":"), has_prompt, prompt);
    w = w_opt_int(W_LIT(w, ",\"shared_prefix\":"), source != S_NONE, shared);
    w = W_LIT(w, ",\"shared_source\":");
    w = source != S_NONE ? w_name(w, &SOURCE_Q[source]) : W_LIT(w, "null");
    w = w_opt_int(W_LIT(w, ",\"shared_with\":"), source != S_NONE && o->shared_with != NO_INT, o->shared_with);
    w = W_LIT(w, ",\"shared_exact\":");
    w = source == S_NONE ? W_LIT(w, "null") : source != S_RE_ENTRY ? W_LIT(w, "true") : W_LIT(w, "false");
    w = w_opt_int(W_LIT(w, ",\"reused\":"), has_re, re_entry);
    w = w_opt_int(W_LIT(w, ",\"processed\":"), o->has_processed, o->processed);
    w = w_name(W_LIT(w, ",\"outcome\":"), &OUTCOME_Q[outcome]);
    if ((w = w_float(W_LIT(w, ",\"prefill_ms\":"), o->has_processed, o->ms)) == NULL)
        return -1;
    w = w_cks(W_LIT(w, ",\"checkpoints\":{\"alive_before\":"), &o->alive_before);
    w = w_cks(W_LIT(w, ",\"created\":"), &o->created);
    w = W_LIT(w, ",\"restored\":");
    w = o->has_restored ? w_ck(w, &o->restored) : W_LIT(w, "null");
    w = W_LIT(w, ",\"erased\":{");
    for (int i = 0; i < o->n_erase_kinds; i++) {
        if (i)
            *w++ = ',';
        w = w_int(W_LIT(w_name(w, &ERASE_Q[o->erase_kind[i]]), ":"), o->erase_count[i]);
    }
    w = W_LIT(w, "},\"forced\":");
    w = o->forced ? W_LIT(w, "true") : W_LIT(w, "false");
    w = w_int(W_LIT(w, ",\"cache_saved\":"), o->cache_saved);
    w = w_int(W_LIT(w, ",\"cache_loaded\":"), o->cache_loaded);
    w = W_LIT(w, "},\"failures\":[");
    int k = 0;
    int flags[3] = {placement, retention, baseline}; /* FAILURE_NAMES' order */
    for (int i = 0; i < 3; i++)
        if (flags[i]) {
            if (k++)
                *w++ = ',';
            w = w_name(w, &FAILURE_Q[i]);
        }
    w = W_LIT(w, "]}\n");
    f->tr_n = (size_t)(w - f->tr);
    f->tr_lines++;
    return 0;
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
    int source = has_lcp ? S_LCP : has_against ? S_N_PAST : has_re ? S_RE_ENTRY : S_NONE;
    int64_t shared = has_lcp ? o->lcp : has_against ? against : re_entry;
    int outcome = o->has_restored ? O_RESTORED
                  : o->forced     ? O_FORCED
                  : (has_re && re_entry != 0) ? O_EXTENDED
                  : (o->fresh && o->not_own == 0) ? O_COLD /* its own ring's evictions: still cold */
                                                 : O_SILENT_RESET;
    int warm = outcome != O_COLD;
    int retention = (outcome == O_FORCED || outcome == O_SILENT_RESET) && has_prompt && s->has_ebl && s->ebl_min < prompt;
    int baseline = source == S_RE_ENTRY ? warm && !o->forced && shared < BASELINE_TOKENS
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
    g->events[EV_CREATED] += o->created.n;
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
        g->events[EV_ERASED_INVALIDATED + o->erase_kind[i]] += o->erase_count[i];
    if (o->has_restored) {
        g->events[EV_RESTORED]++;
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
        g->events[EV_FORCED]++;
    g->events[EV_CACHE_SAVED] += o->cache_saved;
    g->events[EV_CACHE_LOADED] += o->cache_loaded;
    if (has_prompt && (vec_push(&g->prompts, prompt) < 0 || !add_ok(f, &g->prompt_tokens, prompt)))
        return f->fallback ? 0 : (PyErr_NoMemory(), -1);
    int64_t reused = has_re ? re_entry : 0;
    if (source != S_NONE && outcome != O_COLD) {
        if (vec_push(&g->shared, shared) < 0)
            return PyErr_NoMemory(), -1;
        if (source != S_RE_ENTRY)
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
        return PyErr_Occurred() ? -1 : (PyErr_NoMemory(), -1);
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
    if (s->alive.n) /* alive.v is NULL before the slot's first checkpoint: memcpy may not read NULL */
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
    if (f->finder != NULL)
        PyMem_RawFree(f->finder->hk);
    PyMem_Free(f->finder);
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

PyObject *fold_new(PyObject *self, PyObject *args)
{
    Py_ssize_t rows;
    PyObject *server_json = Py_None, *slot = Py_None, *since = Py_None, *until = Py_None;
    int search = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "n|OOOOi", &rows, &server_json, &slot, &since, &until, &search))
        return NULL;
    /* search: as scan()'s (0 the widest this CPU runs): the tests fold with each variant; the
     * side notes' search has no SSE2 copy (2 takes memmem's) */
    hecking_fn next_hecking = pick_hecking(search == 2 ? 1 : search);
    if (pick_search(search) == NULL || next_hecking == NULL) {
        PyErr_Format(PyExc_ValueError, "fold_new: search variant %d is not available here", search);
        return NULL;
    }
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
    f->search = search;
    f->next_hecking = next_hecking;
    f->checks_cap = CHECK_FIRST;
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
static inline void take_notes_before(fold_t *f, int64_t offset)
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
PyObject *fold_block(PyObject *self, PyObject *args)
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
    if (f->finder == NULL) { /* kept: a finder is ~250 KB, an mmap of its own at each call */
        f->finder = PyMem_Calloc(1, sizeof *f->finder);
        if (f->finder != NULL)
            f->finder->hk_search = f->next_hecking; /* the side notes are found with the triggers */
    }
    fi = f->finder;
    if (fi == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (lo == 0) { /* a new block: its notes are read as the finder comes to them */
        f->n_block_notes = f->next_note = 0;
        fi->n_hk = fi->hk_done = 0;
        fi->hk_nomem = 0;
    }
    const ctx_t c = {.body = body, .from = body};
    fi->p = fi->counted = body + lo;
    fi->newlines = fi->candidates = fi->ignored = 0;
    fi->max = FOLD_BATCH;
    search_fn search = pick_search(f->search);
    int finished;
    do {
        finished = find_batch(fi, &c, body + n, body + buf.len, search);
        if (found_notes(f, fi, body, n, body + buf.len, base_offset) < 0) /* before the batch's events */
            goto failed;
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
    int ok = field_int(t, F_CREATED_LINE, &ev->line) && field_int(t, F_CREATED_OFFSET, &ev->offset) &&
             field_int(t, F_CREATED_SLOT, &ev->slot) && field_int(t, F_CREATED_TASK, &ev->task);
    switch (kind) {
    case K_CREATED: case K_RESTORED: case K_ERASED: case K_ERASED_OLD: case K_TOO_CLOSE:
        ok = ok && field_int(t, F_CK_POS_MIN, &ev->pmin) && field_int(t, F_CK_POS_MAX, &ev->pmax) &&
             field_int(t, F_CK_N_TOKENS, &ev->n);
        ev->has_size = field_float(t, F_CK_SIZE_MIB, &ev->size);
        ev->has_took = field_float(t, F_CK_TOOK_MS, &ev->took);
        if (kind == K_RESTORED)
            ok = ok && field_int(t, F_RESTORED_N_PAST, &ev->extra);
        if (kind == K_ERASED)
            ok = ok && field_int(t, F_ERASED_INVALIDATED_N_SWA, &ev->extra);
        break;
    case K_SUPERSEDED:
        ok = ok && field_int(t, F_ERASED_SUPERSEDED_N_TOKENS, &ev->n);
        break;
    case K_TRIM:
        ok = ok && field_int(t, F_CACHE_TRIM_N_PAST, &ev->n);
        break;
    case K_NEW_PROMPT:
        ok = ok && field_int(t, F_NEW_PROMPT_N_TOKENS, &ev->n);
        break;
    case K_EVAL:
        field_float(t, F_PROMPT_EVAL_MS, &ev->ms);
        ok = ok && field_int(t, F_PROMPT_EVAL_N_TOKENS, &ev->n);
        break;
    case K_SAVED:
        ok = ok && field_int(t, F_CACHE_SAVED_N_TOKENS, &ev->n);
        break;
    case K_LOADED:
        ok = ok && field_int(t, F_CACHE_LOADED_N_TOKENS, &ev->n);
        break;
    case K_CLEARED:
        ok = ok && field_int(t, F_PROMPT_CLEARED_N_TOKENS, &ev->n);
        break;
    }
    return ok && !PyErr_Occurred();
}

/* fold_events(state, body, n, base_offset, [(kind index, event), ...]): the events Python read
 * from a handed-back line, in their place. None, or why the Python replay must read this server. */
PyObject *fold_events(PyObject *self, PyObject *args)
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

/* fold_trace(state, fd=-1, least=0) -> (bytes, lines): the trace lines written since the last
 * call (and forgotten here), and how many; with a file descriptor, (None, lines): they are
 * written to it (without the GIL; a short write goes on, an interrupted one too unless a signal
 * handler raised), not copied into a bytes object first (~100 MB per GB of log) - or kept for
 * a later call while fewer than `least` bytes wait (a write of 4 MiB costs the kernel less per
 * byte than one of a block's ~100 KB; (None, 0) then). OSError: not written. */
PyObject *fold_trace(PyObject *self, PyObject *args)
{
    PyObject *capsule;
    int fd = -1;
    Py_ssize_t least = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "O|in", &capsule, &fd, &least))
        return NULL;
    fold_t *f = PyCapsule_GetPointer(capsule, "shadowlab.logs._logscan.fold");
    if (f == NULL)
        return NULL;
    Py_ssize_t lines = f->tr_lines;
    if (fd < 0) {
        PyObject *out = Py_BuildValue("(y#n)", f->tr, (Py_ssize_t)f->tr_n, lines);
        if (out != NULL)
            f->tr_n = f->tr_lines = 0;
        return out;
    }
    if (least > 0 && f->tr_n < (size_t)least)
        return Py_BuildValue("(On)", Py_None, (Py_ssize_t)0);
    size_t done = 0;
    while (done < f->tr_n) {
        ssize_t w;
        Py_BEGIN_ALLOW_THREADS
        w = write(fd, f->tr + done, f->tr_n - done);
        Py_END_ALLOW_THREADS
        if (w < 0) {
            if (errno == EINTR && PyErr_CheckSignals() == 0)
                continue;
            f->tr_n = f->tr_lines = 0;
            return PyErr_Occurred() ? NULL : PyErr_SetFromErrno(PyExc_OSError);
        }
        done += (size_t)w;
    }
    f->tr_n = f->tr_lines = 0;
    return Py_BuildValue("(On)", Py_None, lines);
}

/* ascending (sorted here, in place: logs.Figures reads its ranks from them as they come and
 * merges the slots' into the server's, merge_q, without sorting again) */
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
        "{sNsNsNsNsLsNsLsLsLsLsLsLsdsLsLsLsLsLsLsLsdsdsLsLsLsdsdsNsN}", "slot", opt_int(s->id != NO_INT, s->id),
        "outcomes", outcomes,
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

PyObject *fold_finish(PyObject *self, PyObject *args)
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

