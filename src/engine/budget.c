/* budget.c — the reasoning budget stage (budget.h).
 *
 * Map:
 *   ---- state ----     the tags, the text tail they are matched in, the counters
 *   ---- matching ----  appending text, finding tags, the transitions they cause
 *   ---- stage ----     libllama's sampler interface: accept, apply, clone, free
 */
#include "engine/budget.h"

#include "base/log.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- state -------------------------------------------------------------------------- */

struct budget {
    const struct llama_vocab *vocab;
    char *start;
    char **ends;
    int n_ends;
    llama_token *forced;
    int n_forced;
    int budget;

    enum thaw_budget_state state;
    int remaining;  /* tokens left in this block (COUNTING) */
    int force_pos;  /* next index into forced (FORCING) */
    int n_thinking; /* tokens generated inside blocks, forced ones excluded */
    bool did_force;
    /* the text not yet matched: at most keep bytes survive a scan, enough
     * for a tag split across tokens and for the UTF-8 check */
    char *tail;
    size_t n_tail, cap_tail, keep;
};

static struct llama_sampler_i budget_iface;

static void budget_free_ctx(struct budget *b)
{
    if (!b)
        return;
    free(b->start);
    for (int i = 0; i < b->n_ends; i++)
        free(b->ends[i]);
    free(b->ends);
    free(b->forced);
    free(b->tail);
    free(b);
}

/* A deep copy of the settings (and, with `state`, the progress). */
static struct budget *budget_dup(const struct budget *src)
{
    struct budget *b = calloc(1, sizeof *b);

    if (!b)
        return NULL;
    *b = *src;
    b->start = strdup(src->start);
    b->ends = calloc((size_t)src->n_ends, sizeof *b->ends);
    b->forced = malloc((size_t)src->n_forced * sizeof *b->forced);
    b->tail = malloc(src->cap_tail);
    b->n_ends = 0;
    if (!b->start || !b->ends || !b->forced || !b->tail) {
        budget_free_ctx(b);
        return NULL;
    }
    for (; b->n_ends < src->n_ends; b->n_ends++)
        if (!(b->ends[b->n_ends] = strdup(src->ends[b->n_ends]))) {
            budget_free_ctx(b);
            return NULL;
        }
    memcpy(b->forced, src->forced, (size_t)src->n_forced * sizeof *b->forced);
    memcpy(b->tail, src->tail, src->n_tail);
    return b;
}

/* ---- matching ----------------------------------------------------------------------- */

/* Whether text ends on a whole UTF-8 character (or holds none). */
static bool utf8_complete(const char *s, size_t n)
{
    for (size_t back = 1; back <= 4 && back <= n; back++) {
        unsigned char c = (unsigned char)s[n - back];
        if ((c & 0xC0) == 0x80)
            continue; /* a continuation byte: its lead is further back */
        size_t want = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
        return back >= want;
    }
    return true;
}

static int append(struct budget *b, const char *s, size_t n)
{
    if (b->n_tail + n > b->cap_tail) {
        size_t cap = (b->n_tail + n) * 2;
        char *t = realloc(b->tail, cap);
        if (!t)
            return -1;
        b->tail = t;
        b->cap_tail = cap;
    }
    memcpy(b->tail + b->n_tail, s, n);
    b->n_tail += n;
    return 0;
}

/* Drops the tail's first n bytes (what a match consumed). */
static void consume(struct budget *b, size_t n)
{
    memmove(b->tail, b->tail + n, b->n_tail - n);
    b->n_tail -= n;
}

/* The first occurrence of tag in the tail: its offset, or -1. */
static long find(const struct budget *b, const char *tag)
{
    size_t n = strlen(tag);

    for (size_t i = 0; n && i + n <= b->n_tail; i++)
        if (memcmp(b->tail + i, tag, n) == 0)
            return (long)i;
    return -1;
}

static void enter_counting(struct budget *b)
{
    b->state = THAW_BUDGET_COUNTING;
    b->remaining = b->budget;
    if (b->remaining <= 0) {
        b->state = THAW_BUDGET_FORCING;
        b->force_pos = 0;
    }
}

/* Appends text and follows every tag in it: a start outside thinking
 * opens a block, the earliest end inside one closes it. */
static void scan(struct budget *b, const char *s, size_t n)
{
    if (append(b, s, n) != 0) {
        b->state = THAW_BUDGET_DONE; /* out of memory: stop limiting rather than guess */
        b->n_tail = 0;
        return;
    }
    for (;;) {
        if (b->state == THAW_BUDGET_IDLE || b->state == THAW_BUDGET_DONE) {
            long at = find(b, b->start);
            if (at < 0)
                break;
            consume(b, (size_t)at + strlen(b->start));
            enter_counting(b);
        } else if (b->state == THAW_BUDGET_COUNTING || b->state == THAW_BUDGET_WAIT_UTF8 ||
                   (b->state == THAW_BUDGET_FORCING && b->force_pos == 0)) {
            /* (a budget of 0 forces from the start tag on, unless the
             * same text already closes the block: thinking off renders
             * "<think></think>" in the generation prompt) */
            long best = -1;
            size_t best_len = 0;
            for (int i = 0; i < b->n_ends; i++) {
                long at = find(b, b->ends[i]);
                if (at >= 0 && (best < 0 || at < best)) {
                    best = at;
                    best_len = strlen(b->ends[i]);
                }
            }
            if (best < 0)
                break;
            consume(b, (size_t)best + best_len);
            b->state = THAW_BUDGET_DONE;
        } else {
            break;
        }
    }
    if (b->state == THAW_BUDGET_FORCING)
        b->n_tail = 0;
    else if (b->n_tail > b->keep)
        consume(b, b->n_tail - b->keep);
}

/* ---- stage -------------------------------------------------------------------------- */

static const char *budget_name(const struct llama_sampler *smpl)
{
    (void)smpl;
    return "reasoning-budget";
}

static void budget_accept(struct llama_sampler *smpl, llama_token tok)
{
    struct budget *b = smpl->ctx;
    char piece[256];

    if (b->state == THAW_BUDGET_FORCING) {
        if (b->force_pos < b->n_forced && tok == b->forced[b->force_pos] && ++b->force_pos < b->n_forced)
            return;
        /* the forced run is complete (or the chain picked another token:
         * nothing to force against) */
        b->state = THAW_BUDGET_DONE;
        b->n_tail = 0;
        return;
    }
    int n = llama_token_to_piece(b->vocab, tok, piece, sizeof piece, 0, true);
    if (n < 0)
        n = 0;
    enum thaw_budget_state before = b->state;
    scan(b, piece, (size_t)n);
    if (b->state != before || (before != THAW_BUDGET_COUNTING && before != THAW_BUDGET_WAIT_UTF8))
        return; /* a tag: the token that opens or closes a block is not inside it */
    b->n_thinking++;
    if (before == THAW_BUDGET_COUNTING)
        b->remaining--;
    if (b->remaining > 0)
        return;
    if (utf8_complete(b->tail, b->n_tail)) {
        b->state = THAW_BUDGET_FORCING;
        b->force_pos = 0;
        b->did_force = true;
        b->n_tail = 0;
    } else {
        b->state = THAW_BUDGET_WAIT_UTF8;
    }
}

static void budget_apply(struct llama_sampler *smpl, llama_token_data_array *cur)
{
    struct budget *b = smpl->ctx;

    if (b->state != THAW_BUDGET_FORCING || b->force_pos >= b->n_forced)
        return;
    llama_token want = b->forced[b->force_pos];
    bool allowed = false;
    for (size_t i = 0; i < cur->size; i++)
        if (cur->data[i].id == want)
            allowed = cur->data[i].logit != -INFINITY;
    if (!allowed) {
        /* a grammar (or a bias) ahead of this stage forbids it: the
         * grammar's word stands, thinking is left to end as it will */
        LOG_WRN("reasoning budget: the sampler forbids the end-of-thinking tag here; not forcing it");
        b->state = THAW_BUDGET_DONE;
        b->n_tail = 0;
        return;
    }
    b->did_force = true;
    for (size_t i = 0; i < cur->size; i++)
        if (cur->data[i].id != want)
            cur->data[i].logit = -INFINITY;
}

static void budget_reset(struct llama_sampler *smpl)
{
    struct budget *b = smpl->ctx;

    b->state = THAW_BUDGET_IDLE;
    b->remaining = b->budget;
    b->force_pos = 0;
    b->n_thinking = 0;
    b->did_force = false;
    b->n_tail = 0;
}

static struct llama_sampler *budget_clone(const struct llama_sampler *smpl)
{
    struct budget *b = budget_dup(smpl->ctx);
    struct llama_sampler *out = b ? llama_sampler_init(&budget_iface, b) : NULL;

    if (b && !out)
        budget_free_ctx(b);
    return out;
}

static void budget_free(struct llama_sampler *smpl)
{
    budget_free_ctx(smpl->ctx);
}

static struct llama_sampler_i budget_iface = {
    .name = budget_name,
    .accept = budget_accept,
    .apply = budget_apply,
    .reset = budget_reset,
    .clone = budget_clone,
    .free = budget_free,
};

struct llama_sampler *thaw_budget_new(const struct llama_vocab *vocab, const struct thaw_budget_params *p)
{
    struct budget src = {0}, *b;
    struct llama_sampler *out;
    size_t longest = strlen(p->start ? p->start : "");

    if (!p->start || !*p->start || p->n_ends < 1 || p->n_forced < 1 || p->budget < 0)
        return NULL;
    for (int i = 0; i < p->n_ends; i++)
        if (strlen(p->ends[i]) > longest)
            longest = strlen(p->ends[i]);
    /* a shallow view of p for budget_dup to copy */
    src.vocab = vocab;
    src.start = (char *)p->start;
    src.ends = (char **)p->ends;
    src.n_ends = p->n_ends;
    src.forced = (llama_token *)p->forced;
    src.n_forced = p->n_forced;
    src.budget = p->budget;
    src.remaining = p->budget;
    src.state = THAW_BUDGET_IDLE;
    src.keep = longest > 4 ? longest - 1 : 4;
    src.cap_tail = src.keep + 512;
    src.tail = (char *)"";
    src.n_tail = 0;
    for (int i = 0; i < p->n_ends; i++)
        if (!p->ends[i] || !*p->ends[i])
            return NULL;
    if (!(b = budget_dup(&src)))
        return NULL;
    if (!(out = llama_sampler_init(&budget_iface, b)))
        budget_free_ctx(b);
    return out;
}

void thaw_budget_feed(struct llama_sampler *smpl, const char *text)
{
    struct budget *b = smpl->ctx;

    if (text && b->state != THAW_BUDGET_FORCING)
        scan(b, text, strlen(text));
}

enum thaw_budget_state thaw_budget_state(const struct llama_sampler *smpl)
{
    return ((const struct budget *)smpl->ctx)->state;
}

int thaw_budget_n_thinking(const struct llama_sampler *smpl)
{
    return ((const struct budget *)smpl->ctx)->n_thinking;
}

bool thaw_budget_forced(const struct llama_sampler *smpl)
{
    return ((const struct budget *)smpl->ctx)->did_force;
}

bool thaw_budget_is(const struct llama_sampler *smpl)
{
    return smpl && smpl->iface == &budget_iface;
}
