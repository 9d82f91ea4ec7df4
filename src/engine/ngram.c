/* ngram.c — drafts copied from the conversation itself (ngram.h).
 *
 * Map:
 *   ---- the index ----    n-gram start positions chained by hash
 *   ---- verdicts ----     map-k's accepted counts, per request
 *   ---- the kinds ----    simple, map-k, map-k4v, mod
 *   ---- lifecycle ----
 *
 * The index is a hash chain over positions, as deflate's: head[bucket] is
 * the latest start p whose n-gram tok[p..p+n) hashes there, prev[p] the
 * start before it in the same bucket. Starts are added in increasing
 * order and removed in decreasing order (a rollback forgets the newest
 * first), so removing p is head[bucket(p)] = prev[p]. A chain walk visits
 * the latest occurrences first; every candidate is compared token for
 * token, so a collision costs a comparison, never a wrong draft (and a
 * wrong draft would cost only time: the target verifies).
 *
 * The drafts read the "virtual" sequence V = tok[0..n) + next + out[..]:
 * what the slot holds, the token just sampled, then the draft so far. A
 * start p indexed has p + size_n <= n, so what follows it, V[p + size_n +
 * i], is always known by the time out[i] is written.
 */
#include "engine/ngram.h"

#include "base/error.h"
#include "llama/tokens.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define WALK_MAX 256 /* chain entries visited per lookup: bounds a degenerate conversation's cost */
#define K4V_VALUES 4 /* continuations counted per key (llama-server's) */

struct index {
    int n;         /* tokens per n-gram */
    int32_t *head; /* [1 << bits]: latest start in each bucket, -1 = none */
    int32_t *prev; /* [g->cap]: the start before p in p's bucket, -1 = none */
    int n_starts;  /* starts [0, n_starts) are in the chains */
};

struct stat {
    uint64_t key;     /* 0 = empty */
    int32_t accepted; /* tokens of this key's last draft the target accepted */
};

struct thaw_ngram {
    unsigned kinds; /* bit (1u << THAW_SPEC_NGRAM_*) */
    struct thaw_spec_ngram par[THAW_SPEC_N_NGRAM];
    struct index ix[THAW_SPEC_N_NGRAM]; /* one per distinct size_n, n_ix of them */
    int ix_of[THAW_SPEC_N_NGRAM];       /* kind -> its index */
    int n_ix;
    int bits; /* log2 of the buckets */

    llama_token *tok; /* what the index holds: n_tok of cap */
    int n_tok, cap;
    llama_token *w; /* the key and what follows: max size_n + THAW_NGRAM_MAX + 1 tokens */

    struct stat *stats; /* open addressing, mask + 1 entries */
    uint32_t mask;
    int n_stats;
    uint64_t last_stat; /* the stat the last draft used, 0 = none */
    int last_kind;      /* -1 = none */
    int last_n;         /* tokens of the last draft, 0 = none since the last verdict */
    int limit;          /* the next draft's most tokens (see thaw_ngram_accept), max_m at a request's start */
    int max_m;          /* the largest size_m of the kinds on */
};

static const char *const kind_names[THAW_SPEC_N_NGRAM] = {"ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod"};

/* ---- the index ------------------------------------------------------------------- */

static uint64_t hash_tokens(const llama_token *t, int n)
{
    uint64_t h = 0x9e3779b97f4a7c15ull;

    for (int i = 0; i < n; i++) {
        h ^= (uint32_t)t[i];
        h *= 0xff51afd7ed558ccdull;
        h ^= h >> 32;
    }
    return h;
}

static uint32_t bucket(const struct thaw_ngram *g, uint64_t h)
{
    return (uint32_t)(h >> (64 - g->bits));
}

static void unindex_from(struct thaw_ngram *g, struct index *ix, int keep)
{
    /* starts whose n-gram reaches position keep or past it */
    while (ix->n_starts > 0 && ix->n_starts - 1 + ix->n > keep) {
        int p = --ix->n_starts;
        ix->head[bucket(g, hash_tokens(g->tok + p, ix->n))] = ix->prev[p];
    }
}

static void index_to(struct thaw_ngram *g, struct index *ix)
{
    for (int p = ix->n_starts; p + ix->n <= g->n_tok; p++) {
        uint32_t b = bucket(g, hash_tokens(g->tok + p, ix->n));
        ix->prev[p] = ix->head[b];
        ix->head[b] = p;
        ix->n_starts = p + 1;
    }
}

/* Makes the index hold tokens[0..n). Returns 0 or THAW_ENOMEM (the index
 * then holds a prefix of them). */
static int sync(struct thaw_ngram *g, const llama_token *tokens, int n)
{
    int m = g->n_tok < n ? g->n_tok : n;
    int keep = memcmp(g->tok, tokens, (size_t)m * sizeof *tokens) == 0 ? m : thaw_lcp(g->tok, g->n_tok, tokens, n);

    for (int i = 0; i < g->n_ix; i++)
        unindex_from(g, &g->ix[i], keep);
    g->n_tok = keep;
    if (n > g->cap) {
        int cap = g->cap;
        if (thaw_tokens_reserve(&g->tok, &cap, n) != 0)
            return THAW_ENOMEM;
        for (int i = 0; i < g->n_ix; i++) {
            int32_t *p = realloc(g->ix[i].prev, (size_t)cap * sizeof *p);
            if (!p)
                return THAW_ENOMEM; /* g->cap stays: the larger tok is harmless */
            g->ix[i].prev = p;
        }
        g->cap = cap;
    }
    memcpy(g->tok + keep, tokens + keep, (size_t)(n - keep) * sizeof *tokens);
    g->n_tok = n;
    for (int i = 0; i < g->n_ix; i++)
        index_to(g, &g->ix[i]);
    return 0;
}

/* The latest start whose n-gram is key[0..ix->n) and, when `full` > 0,
 * is followed by at least `full` tokens inside tok; -1 when the key has
 * fewer than `want` such occurrences. *hits (may be NULL) gets how many
 * were seen (up to want). */
static int find(const struct thaw_ngram *g, const struct index *ix, const llama_token *key, int want, int full,
                int *hits)
{
    int first = -1, n_hits = 0, walked = 0;

    for (int32_t p = ix->head[bucket(g, hash_tokens(key, ix->n))]; p >= 0 && walked < WALK_MAX; p = ix->prev[p]) {
        walked++;
        if (p + ix->n + full > g->n_tok || memcmp(g->tok + p, key, (size_t)ix->n * sizeof *key) != 0)
            continue;
        if (first < 0)
            first = p;
        if (++n_hits >= want)
            break;
    }
    if (hits)
        *hits = n_hits;
    return n_hits >= want ? first : -1;
}

/* V[i]: tok, then the sampled token, then the draft (see the top). */
static llama_token at(const struct thaw_ngram *g, llama_token next, const llama_token *out, int i)
{
    return i < g->n_tok ? g->tok[i] : i == g->n_tok ? next : out[i - g->n_tok - 1];
}

/* ---- verdicts -------------------------------------------------------------------- */

/* The stat of `key` (inserted with `init` when new), or NULL on ENOMEM. */
static struct stat *stat_get(struct thaw_ngram *g, uint64_t key, int init)
{
    key |= 1; /* never the empty mark */
    if (!g->stats || (uint32_t)(g->n_stats + 1) * 2 > g->mask + 1) {
        uint32_t n = g->stats ? (g->mask + 1) * 2 : 256;
        struct stat *t = calloc(n, sizeof *t);
        if (!t)
            return NULL;
        for (uint32_t i = 0; g->stats && i <= g->mask; i++) {
            if (!g->stats[i].key)
                continue;
            uint32_t j = (uint32_t)g->stats[i].key & (n - 1);
            while (t[j].key)
                j = (j + 1) & (n - 1);
            t[j] = g->stats[i];
        }
        free(g->stats);
        g->stats = t;
        g->mask = n - 1;
    }
    uint32_t j = (uint32_t)key & g->mask;
    while (g->stats[j].key && g->stats[j].key != key)
        j = (j + 1) & g->mask;
    if (!g->stats[j].key) {
        g->stats[j] = (struct stat){key, init};
        g->n_stats++;
    }
    return &g->stats[j];
}

void thaw_ngram_begin(struct thaw_ngram *g)
{
    if (!g)
        return;
    if (g->stats)
        memset(g->stats, 0, (g->mask + 1) * sizeof *g->stats);
    g->n_stats = 0;
    g->last_stat = 0;
    g->last_kind = -1;
    g->last_n = 0;
    g->limit = g->max_m;
}

/* Besides the kinds' own memory (map-k), every slot bounds its next draft
 * (thaw's, not llama-server's): a draft the target rejected partway costs
 * a verify batch of every drafted token for few kept ones (on a CPU a
 * 48-token batch costs several single-token steps), so after a draft with
 * k of d tokens accepted the next is at most k + 1 long, and after one
 * accepted whole, twice as long (up to size_m). A reply that copies a file
 * drafts 48 at a time; prose whose n-grams recur with other continuations
 * drafts one token at a time, which costs about nothing more than no
 * draft. */
void thaw_ngram_accept(struct thaw_ngram *g, int n_accepted)
{
    if (!g || g->last_n == 0)
        return;
    if (n_accepted >= g->last_n)
        g->limit = g->last_n * 2 < g->max_m ? g->last_n * 2 : g->max_m;
    else
        g->limit = n_accepted + 1;
    g->last_n = 0;
    if (!g->last_stat)
        return;
    struct stat *st = stat_get(g, g->last_stat, n_accepted);
    if (st)
        st->accepted = n_accepted;
    g->last_stat = 0;
}

/* ---- the kinds ------------------------------------------------------------------- */

/* simple and map-k: what followed the key's latest occurrence */
static int draft_latest(struct thaw_ngram *g, int kind, llama_token next, int max, llama_token *out)
{
    const struct thaw_spec_ngram *par = &g->par[kind];
    const struct index *ix = &g->ix[g->ix_of[kind]];
    int p = find(g, ix, g->w, par->min_hits, 0, NULL);

    if (p < 0)
        return 0;
    if (kind == THAW_SPEC_NGRAM_MAP_K) {
        uint64_t key = hash_tokens(g->w, ix->n);
        struct stat *st = stat_get(g, key, par->size_m);
        if (!st)
            return 0;
        if (max > st->accepted)
            max = st->accepted;
        g->last_stat = key | 1;
    }
    for (int i = 0; i < max; i++)
        out[i] = at(g, next, out, p + ix->n + i);
    return max;
}

/* map-k4v: the dominant one of the key's continuations */
static int draft_k4v(struct thaw_ngram *g, llama_token next, int max, llama_token *out)
{
    const struct thaw_spec_ngram *par = &g->par[THAW_SPEC_NGRAM_MAP_K4V];
    const struct index *ix = &g->ix[g->ix_of[THAW_SPEC_NGRAM_MAP_K4V]];
    int m = par->size_m, val[K4V_VALUES], num[K4V_VALUES] = {0}, n_val = 0, hits = 0, walked = 0;

    (void)next;
    for (int32_t p = ix->head[bucket(g, hash_tokens(g->w, ix->n))]; p >= 0 && walked < WALK_MAX; p = ix->prev[p]) {
        walked++;
        if (memcmp(g->tok + p, g->w, (size_t)ix->n * sizeof *g->w) != 0)
            continue;
        hits++;
        if (p + ix->n + m > g->n_tok)
            continue; /* a continuation is counted whole */
        const llama_token *v = g->tok + p + ix->n;
        int k = 0;
        while (k < n_val && memcmp(g->tok + val[k], v, (size_t)m * sizeof *v) != 0)
            k++;
        if (k == n_val) {
            if (n_val == K4V_VALUES)
                continue;
            val[n_val++] = p + ix->n;
        }
        num[k]++;
    }
    if (hits < par->min_hits || n_val == 0)
        return 0;
    int best = 0, others = 0;
    for (int k = 1; k < n_val; k++)
        if (num[k] > num[best])
            best = k;
    for (int k = 0; k < n_val; k++)
        others += k == best ? 0 : num[k];
    if (others > 0 && num[best] < 2 * others)
        return 0; /* no continuation dominates */
    uint64_t key = hash_tokens(g->w, ix->n) ^ hash_tokens(g->tok + val[best], m);
    struct stat *st = stat_get(g, key, m);
    if (!st)
        return 0;
    if (max > st->accepted)
        max = st->accepted;
    if (max > m)
        max = m;
    g->last_stat = key | 1;
    memcpy(out, g->tok + val[best], (size_t)max * sizeof *out);
    return max;
}

/* mod: one token at a time, each after the latest occurrence of the last
 * size_n tokens (drafted ones included: g->w grows with the draft) */
static int draft_mod(struct thaw_ngram *g, llama_token next, int max, llama_token *out)
{
    const struct thaw_spec_ngram *par = &g->par[THAW_SPEC_NGRAM_MOD];
    const struct index *ix = &g->ix[g->ix_of[THAW_SPEC_NGRAM_MOD]];
    int n = 0;

    while (n < max) {
        int p = find(g, ix, g->w + n, 1, 0, NULL);
        if (p < 0)
            break;
        out[n] = at(g, next, out, p + ix->n); /* p + size_n <= n_tok: tok or next */
        g->w[ix->n + n] = out[n];
        n++;
    }
    return n >= par->n_min ? n : 0;
}

int thaw_ngram_draft(struct thaw_ngram *g, const llama_token *tokens, int n, llama_token next, int max,
                     llama_token *out)
{
    g->last_stat = 0;
    g->last_kind = -1;
    g->last_n = 0;
    if (max <= 0 || sync(g, tokens, n) != 0)
        return 0;
    for (int k = 0; k < THAW_SPEC_N_NGRAM; k++) {
        const struct thaw_spec_ngram *par = &g->par[k];
        /* the slot's limit, but never below what the kind needs (ngram-mod's n_min) */
        int lim = g->limit > par->n_min ? g->limit : par->n_min, size_n = par->size_n, got;
        if (lim > par->size_m)
            lim = par->size_m;
        if (lim > max)
            lim = max;
        if (!(g->kinds & (1u << k)) || n < size_n - 1 || lim <= 0)
            continue;
        /* the key: the last size_n - 1 tokens held, and the sampled one */
        memcpy(g->w, tokens + n - (size_n - 1), (size_t)(size_n - 1) * sizeof *tokens);
        g->w[size_n - 1] = next;
        if (k == THAW_SPEC_NGRAM_MAP_K4V)
            got = draft_k4v(g, next, lim, out);
        else if (k == THAW_SPEC_NGRAM_MOD)
            got = draft_mod(g, next, lim, out);
        else
            got = draft_latest(g, k, next, lim, out);
        if (got > 0 && got >= par->n_min) {
            g->last_kind = k;
            g->last_n = got;
            return got;
        }
        g->last_stat = 0;
    }
    return 0;
}

const char *thaw_ngram_last_kind(const struct thaw_ngram *g)
{
    return g && g->last_kind >= 0 ? kind_names[g->last_kind] : "none";
}

/* ---- lifecycle ------------------------------------------------------------------- */

bool thaw_ngram_enabled(const struct thaw_config *cfg)
{
    return (cfg->spec_types & ((1u << THAW_SPEC_N_NGRAM) - 1)) != 0;
}

int thaw_ngram_max_draft(const struct thaw_config *cfg)
{
    int m = 0;

    for (int k = 0; k < THAW_SPEC_N_NGRAM; k++)
        if ((cfg->spec_types & (1u << k)) && cfg->spec_ngram[k].size_m > m)
            m = cfg->spec_ngram[k].size_m;
    return m < THAW_NGRAM_MAX ? m : THAW_NGRAM_MAX;
}

int thaw_ngram_new(const struct thaw_config *cfg, int n_ctx, struct thaw_ngram **out)
{
    struct thaw_ngram *g;
    int max_n = 0;

    *out = NULL;
    if (!thaw_ngram_enabled(cfg))
        return 0;
    if (!(g = calloc(1, sizeof *g)))
        return THAW_ENOMEM;
    g->kinds = cfg->spec_types & ((1u << THAW_SPEC_N_NGRAM) - 1);
    memcpy(g->par, cfg->spec_ngram, sizeof g->par);
    g->bits = 10;
    while (g->bits < 22 && (1 << g->bits) < 2 * n_ctx)
        g->bits++;
    for (int k = 0; k < THAW_SPEC_N_NGRAM; k++) {
        if (!(g->kinds & (1u << k)))
            continue;
        if (g->par[k].size_m > THAW_NGRAM_MAX)
            g->par[k].size_m = THAW_NGRAM_MAX;
        if (g->par[k].size_n > max_n)
            max_n = g->par[k].size_n;
        if (g->par[k].size_m > g->max_m)
            g->max_m = g->par[k].size_m;
        int i = 0;
        while (i < g->n_ix && g->ix[i].n != g->par[k].size_n)
            i++;
        if (i == g->n_ix) {
            g->ix[i].n = g->par[k].size_n;
            if (!(g->ix[i].head = malloc(((size_t)1 << g->bits) * sizeof *g->ix[i].head)))
                goto nomem;
            memset(g->ix[i].head, 0xff, ((size_t)1 << g->bits) * sizeof *g->ix[i].head); /* -1 */
            g->n_ix++;
        }
        g->ix_of[k] = i;
    }
    if (!(g->w = malloc((size_t)(max_n + THAW_NGRAM_MAX + 1) * sizeof *g->w)))
        goto nomem;
    thaw_ngram_begin(g);
    *out = g;
    return 0;
nomem:
    thaw_ngram_free(g);
    return THAW_ENOMEM;
}

void thaw_ngram_free(struct thaw_ngram *g)
{
    if (!g)
        return;
    for (int i = 0; i < g->n_ix; i++) {
        free(g->ix[i].head);
        free(g->ix[i].prev);
    }
    free(g->tok);
    free(g->w);
    free(g->stats);
    free(g);
}
