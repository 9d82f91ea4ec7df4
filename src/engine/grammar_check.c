/* grammar_check.c — a chain's grammar asked late (grammar_check.h).
 *
 * Map:
 *   ---- a greedy pick ----   the best candidates ranked, asked in groups
 *   ---- a sampled pick ----  the drawn token checked, a redraw when refused
 */
#include "engine/grammar_check.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* ---- a greedy pick: the best candidates first -------------------------------------- */

/* the groups asked before the whole vocabulary, best first; a candidate
 * array no larger than the last is asked whole at once */
static const size_t GROUPS[] = {1, 64, 1024};
#define N_GROUPS (sizeof GROUPS / sizeof GROUPS[0])
#define GROUP_MAX 1024

struct gg {
    struct llama_sampler *grammar;
    llama_token_data heap[GROUP_MAX];
};

/* a ranks above b: a higher logit, or the same and a lower id (the first
 * a scan in id order keeps, as the greedy pick does) */
static bool above(const llama_token_data *a, const llama_token_data *b)
{
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

/* heap[0] is the lowest-ranked of the n kept */
static void sift_down(llama_token_data *h, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && above(&h[m], &h[l]))
            m = l;
        if (r < n && above(&h[m], &h[r]))
            m = r;
        if (m == i)
            return;
        llama_token_data t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

static void sift_up(llama_token_data *h, size_t i)
{
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!above(&h[p], &h[i]))
            return;
        llama_token_data t = h[i];
        h[i] = h[p];
        h[p] = t;
        i = p;
    }
}

/* The best m (<= GROUP_MAX) candidates of cur with a finite logit, into
 * h (in no order). Returns how many: fewer than m when fewer are finite. */
static size_t best_of(const llama_token_data_array *cur, size_t m, llama_token_data *h)
{
    size_t n = 0;

    for (size_t i = 0; i < cur->size; i++) {
        const llama_token_data *c = &cur->data[i];
        if (!isfinite(c->logit))
            continue;
        if (n < m) {
            h[n] = *c;
            sift_up(h, n++);
        } else if (above(c, &h[0])) {
            h[0] = *c;
            sift_down(h, n, 0);
        }
    }
    return n;
}

static const char *gg_name(const struct llama_sampler *smpl)
{
    (void)smpl;
    return "thaw-grammar-greedy";
}

static void gg_accept(struct llama_sampler *smpl, llama_token token)
{
    llama_sampler_accept(((struct gg *)smpl->ctx)->grammar, token);
}

static int by_rank(const void *a, const void *b)
{
    return above(a, b) ? -1 : above(b, a) ? 1 : 0;
}

/* Asks the grammar about h[from, to) (ranked best first); leaves the first
 * allowed one as cur's only candidate. Returns whether there was one. */
static bool ask(struct gg *g, size_t from, size_t to, llama_token_data_array *cur)
{
    llama_token_data_array group = {g->heap + from, to - from, -1, false};

    llama_sampler_apply(g->grammar, &group);
    for (size_t i = from; i < to; i++) {
        if (isfinite(g->heap[i].logit)) { /* ranked: the first allowed is the pick */
            cur->data[0] = g->heap[i];
            cur->size = 1;
            cur->selected = -1;
            cur->sorted = false;
            return true;
        }
    }
    return false;
}

static void gg_apply(struct llama_sampler *smpl, llama_token_data_array *cur)
{
    struct gg *g = smpl->ctx;

    if (cur->size > GROUP_MAX) {
        /* the best alone first: one plain pass, and a real model's usual case */
        size_t n = best_of(cur, 1, g->heap), done = 1;

        if (n == 0) { /* every candidate at -inf: the whole array decides */
            llama_sampler_apply(g->grammar, cur);
            return;
        }
        if (ask(g, 0, 1, cur))
            return;
        /* then one pass keeps the best GROUP_MAX, ranked; the groups are its
         * prefixes, each asking only about the candidates the last did not
         * (the first is the best, refused above) */
        n = best_of(cur, GROUP_MAX, g->heap);
        qsort(g->heap, n, sizeof g->heap[0], by_rank);
        for (size_t k = 1; k < N_GROUPS && done < n; k++) {
            size_t end = GROUPS[k] < n ? GROUPS[k] : n;
            if (ask(g, done, end, cur))
                return;
            done = end;
        }
    }
    llama_sampler_apply(g->grammar, cur);
}

static void gg_reset(struct llama_sampler *smpl)
{
    llama_sampler_reset(((struct gg *)smpl->ctx)->grammar);
}

static struct llama_sampler *gg_clone(const struct llama_sampler *smpl);

static void gg_free(struct llama_sampler *smpl)
{
    struct gg *g = smpl->ctx;

    llama_sampler_free(g->grammar);
    free(g);
}

static struct llama_sampler_i gg_iface = {
    .name = gg_name,
    .accept = gg_accept,
    .apply = gg_apply,
    .reset = gg_reset,
    .clone = gg_clone,
    .free = gg_free,
};

struct llama_sampler *thaw_grammar_greedy_new(struct llama_sampler *grammar)
{
    struct gg *g;
    struct llama_sampler *s;

    if (grammar == NULL)
        return NULL;
    if ((g = malloc(sizeof *g)) == NULL) {
        llama_sampler_free(grammar);
        return NULL;
    }
    g->grammar = grammar;
    if ((s = llama_sampler_init(&gg_iface, g)) == NULL)
        gg_free(&(struct llama_sampler){.iface = &gg_iface, .ctx = g});
    return s;
}

static struct llama_sampler *gg_clone(const struct llama_sampler *smpl)
{
    return thaw_grammar_greedy_new(llama_sampler_clone(((const struct gg *)smpl->ctx)->grammar));
}

/* ---- a sampled pick: the drawn token checked ---------------------------------------- */

struct gc {
    struct llama_sampler *grammar, *rest;
    llama_token_data *saved; /* the candidates as they came, for a redraw */
    size_t cap;
};

static const char *gc_name(const struct llama_sampler *smpl)
{
    (void)smpl;
    return "thaw-grammar-check";
}

static void gc_accept(struct llama_sampler *smpl, llama_token token)
{
    struct gc *g = smpl->ctx;

    llama_sampler_accept(g->grammar, token);
    llama_sampler_accept(g->rest, token);
}

static void gc_apply(struct llama_sampler *smpl, llama_token_data_array *cur)
{
    struct gc *g = smpl->ctx;
    const size_t n = cur->size;
    const bool sorted = cur->sorted;

    if (n > g->cap) {
        llama_token_data *p = realloc(g->saved, n * sizeof *p);
        if (p == NULL) { /* no copy to redraw from: the grammar goes first */
            llama_sampler_apply(g->grammar, cur);
            llama_sampler_apply(g->rest, cur);
            return;
        }
        g->saved = p;
        g->cap = n;
    }
    memcpy(g->saved, cur->data, n * sizeof *cur->data);
    llama_sampler_apply(g->rest, cur);
    if (cur->selected >= 0 && (size_t)cur->selected < cur->size) {
        llama_token_data one = cur->data[cur->selected];
        llama_token_data_array single = {&one, 1, -1, false};
        llama_sampler_apply(g->grammar, &single);
        if (isfinite(one.logit))
            return; /* allowed: the draw stands */
    }
    memcpy(cur->data, g->saved, n * sizeof *cur->data);
    cur->size = n;
    cur->sorted = sorted;
    cur->selected = -1;
    llama_sampler_apply(g->grammar, cur);
    llama_sampler_apply(g->rest, cur);
}

static void gc_reset(struct llama_sampler *smpl)
{
    struct gc *g = smpl->ctx;

    llama_sampler_reset(g->grammar);
    llama_sampler_reset(g->rest);
}

static void gc_free(struct llama_sampler *smpl)
{
    struct gc *g = smpl->ctx;

    llama_sampler_free(g->grammar);
    llama_sampler_free(g->rest);
    free(g->saved);
    free(g);
}

static struct llama_sampler *gc_clone(const struct llama_sampler *smpl);

static struct llama_sampler_i gc_iface = {
    .name = gc_name,
    .accept = gc_accept,
    .apply = gc_apply,
    .reset = gc_reset,
    .clone = gc_clone,
    .free = gc_free,
};

struct llama_sampler *thaw_grammar_check_new(struct llama_sampler *grammar, struct llama_sampler *rest)
{
    struct gc *g;

    if (grammar == NULL || rest == NULL || (g = calloc(1, sizeof *g)) == NULL) {
        llama_sampler_free(grammar);
        llama_sampler_free(rest);
        return NULL;
    }
    g->grammar = grammar;
    g->rest = rest;
    return llama_sampler_init(&gc_iface, g);
}

static struct llama_sampler *gc_clone(const struct llama_sampler *smpl)
{
    const struct gc *g = smpl->ctx;

    return thaw_grammar_check_new(llama_sampler_clone(g->grammar), llama_sampler_clone(g->rest));
}
