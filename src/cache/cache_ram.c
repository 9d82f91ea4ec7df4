/* cache_ram.c — LRU + TTL map of key -> blobs, and the blocks that
 * manifests name, engine thread only.
 * Entries: a flat array: they are tens to hundreds of MiB-sized states (or
 * manifests), so their count under any sane budget is small and a linear
 * scan is the cheap part. Blocks: in a keymap by id (thousands
 * under a budget of GiBs, each looked up per restore). One mutex around
 * every call: the engine thread puts, gets and evicts; a restore
 * assembled off it (kvcache.h) reads blocks. */
#include "cache/cache_ram.h"

#include "base/blob.h"
#include "base/error.h"
#include "base/keymap.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct rblock {
    uint8_t id[THAW_KEY_BYTES];
    void *data; /* one reference */
    size_t size;
    uint32_t refs; /* entries naming it; 0 = an orphan, the first to go */
    struct thaw_keymap_node hn; /* in blocks, under id */
};

struct thaw_ram_cache {
    pthread_mutex_t mu; /* held by every public call */
    uint64_t budget, bytes;
    int64_t ttl_s;
    int64_t now; /* the clock of the last put or retain: what a retention is judged by */
    struct thaw_ram_entry *v;
    int n, cap;
    struct thaw_keymap blocks; /* id -> struct rblock */
    uint32_t n_blocks, n_orphans;
};

static struct rblock *block_find(const struct thaw_ram_cache *c, const uint8_t id[THAW_KEY_BYTES])
{
    struct thaw_keymap_node *n = thaw_keymap_find(&c->blocks, id);

    return n ? THAW_KEYMAP_OF(n, struct rblock, hn) : NULL;
}

static void block_free(struct thaw_ram_cache *c, struct rblock *b)
{
    thaw_keymap_remove(&c->blocks, &b->hn);
    c->bytes -= b->size;
    c->n_blocks--;
    if (b->refs == 0)
        c->n_orphans--;
    thaw_blob_unref(b->data);
    free(b);
}

/* Frees every block no entry names. */
static void sweep_orphans(struct thaw_ram_cache *c)
{
    THAW_KEYMAP_EACH(&c->blocks, i, n, nx)
    {
        struct rblock *b = THAW_KEYMAP_OF(n, struct rblock, hn);

        if (c->n_orphans == 0)
            return;
        if (b->refs == 0)
            block_free(c, b);
    }
}

/* Counts (d = +1) or uncounts (-1) an entry's names of blocks; a block
 * left unnamed goes. Names of blocks not held are ignored. */
static void refs_apply(struct thaw_ram_cache *c, const uint8_t *refs, uint32_t n_refs, int d)
{
    for (uint32_t k = 0; k < n_refs; k++) {
        struct rblock *b = block_find(c, refs + (size_t)k * THAW_KEY_BYTES);
        if (!b)
            continue;
        if (d > 0 && b->refs++ == 0)
            c->n_orphans--;
        if (d < 0 && b->refs > 0 && --b->refs == 0) {
            c->n_orphans++;
            block_free(c, b);
        }
    }
}

int thaw_ram_cache_new(uint64_t budget_bytes, int64_t ttl_s, struct thaw_ram_cache **out)
{
    struct thaw_ram_cache *c = calloc(1, sizeof *c);

    if (!c)
        return THAW_ENOMEM;
    if (thaw_keymap_init(&c->blocks) != 0) {
        free(c);
        return THAW_ENOMEM;
    }
    pthread_mutex_init(&c->mu, NULL);
    c->budget = budget_bytes;
    c->ttl_s = ttl_s;
    *out = c;
    return 0;
}

static uint64_t parts_size(const struct thaw_part_blob parts[THAW_PART_COUNT])
{
    uint64_t n = 0;

    for (int p = 0; p < THAW_PART_COUNT; p++)
        n += parts[p].size;
    return n;
}

static void parts_unref(const struct thaw_part_blob parts[THAW_PART_COUNT])
{
    for (int p = 0; p < THAW_PART_COUNT; p++)
        thaw_blob_unref(parts[p].data);
}

static void drop(struct thaw_ram_cache *c, int i)
{
    c->bytes -= parts_size(c->v[i].parts);
    parts_unref(c->v[i].parts);
    refs_apply(c, c->v[i].refs, c->v[i].n_refs, -1);
    free(c->v[i].refs);
    c->v[i] = c->v[--c->n];
}

void thaw_ram_cache_free(struct thaw_ram_cache *c)
{
    if (!c)
        return;
    while (c->n > 0)
        drop(c, 0);
    sweep_orphans(c);
    thaw_keymap_fini(&c->blocks);
    pthread_mutex_destroy(&c->mu);
    free(c->v);
    free(c);
}

/* Whether a should go before b for room: entries no retention holds
 * first, least recently used first; then the held ones, the earliest
 * deadline first. */
static bool goes_before(const struct thaw_ram_cache *c, const struct thaw_ram_entry *a, const struct thaw_ram_entry *b)
{
    bool ka = a->kept_until > c->now, kb = b->kept_until > c->now;

    if (ka != kb)
        return kb;
    return ka ? a->kept_until < b->kept_until : a->last_used < b->last_used;
}

/* Evicts entries other than `keep` (-1: none), in goes_before() order,
 * until `need` more bytes fit. Orphan blocks are not touched: between puts
 * they are the blocks of the entry about to be put. */
static void make_room(struct thaw_ram_cache *c, uint64_t need, int keep)
{
    while (c->bytes + need > c->budget) {
        int lru = -1;
        for (int i = 0; i < c->n; i++)
            if (i != keep && (lru < 0 || goes_before(c, &c->v[i], &c->v[lru])))
                lru = i;
        if (lru < 0)
            return;
        if (keep == c->n - 1)
            keep = lru; /* drop() moves the last entry into lru's place */
        drop(c, lru);
    }
}

static int find(const struct thaw_ram_cache *c, const uint8_t key[THAW_KEY_BYTES])
{
    for (int i = 0; i < c->n; i++)
        if (memcmp(c->v[i].key, key, THAW_KEY_BYTES) == 0)
            return i;
    return -1;
}

static int put_refs(struct thaw_ram_cache *c, const uint8_t key[THAW_KEY_BYTES],
                    const struct thaw_part_blob parts[THAW_PART_COUNT], const uint8_t *refs, uint32_t n_refs,
                    int64_t now)
{
    uint64_t size = parts_size(parts);
    uint8_t *own = NULL;

    if (size > c->budget || (n_refs && !(own = malloc((size_t)n_refs * THAW_KEY_BYTES)))) {
        parts_unref(parts);
        sweep_orphans(c); /* blocks put for this entry */
        return size > c->budget ? THAW_ETOOBIG : THAW_ENOMEM;
    }
    if (c->n == c->cap) {
        int cap = c->cap ? c->cap * 2 : 8;
        struct thaw_ram_entry *nv = realloc(c->v, (size_t)cap * sizeof *nv);
        if (!nv) {
            parts_unref(parts);
            free(own);
            sweep_orphans(c);
            return THAW_ENOMEM;
        }
        c->v = nv;
        c->cap = cap;
    }
    if (now > c->now)
        c->now = now;
    int prev = find(c, key);
    struct thaw_ram_entry *e = &c->v[c->n++];
    memset(e, 0, sizeof *e);
    memcpy(e->key, key, THAW_KEY_BYTES);
    if (prev >= 0)
        e->kept_until = c->v[prev].kept_until; /* the key stored again keeps its hint */
    for (int p = 0; p < THAW_PART_COUNT; p++) {
        e->parts[p] = parts[p];
        if (!parts[p].size) { /* absent: no buffer held for it */
            thaw_blob_unref(parts[p].data);
            e->parts[p].data = NULL;
        }
    }
    if (n_refs)
        memcpy(own, refs, (size_t)n_refs * THAW_KEY_BYTES);
    e->refs = own;
    e->n_refs = n_refs;
    e->last_used = now;
    c->bytes += size;
    /* named before making room: its own blocks are not orphans; what is
     * still an orphan was left by a store that never put its entry */
    refs_apply(c, own, n_refs, +1);
    /* the key stored again (the reply as generated, then its canonical
     * form): the old entry goes only now, so that the blocks both name,
     * which the new store found held and did not put again, stay */
    int old = find(c, key);
    if (old < c->n - 1)
        drop(c, old); /* moves the new entry, the last, into old's place */
    sweep_orphans(c);
    make_room(c, 0, find(c, key));
    if (c->bytes > c->budget) { /* it alone, with its blocks, does not fit */
        drop(c, find(c, key));
        sweep_orphans(c);
        return THAW_ETOOBIG;
    }
    return 0;
}

static int put_block(struct thaw_ram_cache *c, const uint8_t id[THAW_KEY_BYTES], void *data, size_t size)
{
    struct rblock *b = block_find(c, id);

    if (b || size > c->budget) { /* held already / never fits */
        thaw_blob_unref(data);
        return b ? 0 : THAW_ETOOBIG;
    }
    make_room(c, size, -1);
    if (!(b = calloc(1, sizeof *b))) {
        thaw_blob_unref(data);
        return THAW_ENOMEM;
    }
    memcpy(b->id, id, THAW_KEY_BYTES);
    b->data = data;
    b->size = size;
    thaw_keymap_insert(&c->blocks, &b->hn, b->id);
    c->bytes += size;
    c->n_blocks++;
    c->n_orphans++;
    return 0;
}

void *thaw_ram_cache_block(struct thaw_ram_cache *c, const uint8_t id[THAW_KEY_BYTES], size_t *size)
{
    struct rblock *b;
    void *ref = NULL;

    if (!c)
        return NULL;
    pthread_mutex_lock(&c->mu);
    if ((b = block_find(c, id)) != NULL) {
        *size = b->size;
        ref = thaw_blob_ref(b->data);
    }
    pthread_mutex_unlock(&c->mu);
    return ref;
}

int thaw_ram_cache_has_block(struct thaw_ram_cache *c, const uint8_t id[THAW_KEY_BYTES])
{
    if (!c)
        return 0;
    pthread_mutex_lock(&c->mu);
    int has = block_find(c, id) != NULL;
    pthread_mutex_unlock(&c->mu);
    return has;
}

uint32_t thaw_ram_cache_blocks(const struct thaw_ram_cache *c) { return c->n_blocks; }

const struct thaw_ram_entry *thaw_ram_cache_get(struct thaw_ram_cache *c, const uint8_t key[THAW_KEY_BYTES],
                                                int64_t now)
{
    pthread_mutex_lock(&c->mu);
    int i = find(c, key);
    const struct thaw_ram_entry *e = NULL;

    if (i >= 0 && c->v[i].parts[THAW_PART_KV].data) { /* not a retention's entry (no state of its own) */
        c->v[i].last_used = now;
        e = &c->v[i];
    }
    pthread_mutex_unlock(&c->mu);
    return e;
}

void thaw_ram_cache_remove(struct thaw_ram_cache *c, const uint8_t key[THAW_KEY_BYTES])
{
    pthread_mutex_lock(&c->mu);
    int i = find(c, key);

    if (i >= 0)
        drop(c, i);
    pthread_mutex_unlock(&c->mu);
}

static int retain(struct thaw_ram_cache *c, const uint8_t key[THAW_KEY_BYTES], const uint8_t *refs, uint32_t n_refs,
                  int64_t until, int64_t now)
{
    int i = find(c, key);

    if (now > c->now)
        c->now = now;
    if (i < 0) {
        uint8_t *own;

        if (!n_refs)
            return THAW_ENOTFOUND;
        if (c->n == c->cap) {
            int cap = c->cap ? c->cap * 2 : 8;
            struct thaw_ram_entry *nv = realloc(c->v, (size_t)cap * sizeof *nv);
            if (!nv)
                return THAW_ENOMEM;
            c->v = nv;
            c->cap = cap;
        }
        if (!(own = malloc((size_t)n_refs * THAW_KEY_BYTES)))
            return THAW_ENOMEM;
        memcpy(own, refs, (size_t)n_refs * THAW_KEY_BYTES);
        i = c->n++;
        memset(&c->v[i], 0, sizeof c->v[i]);
        memcpy(c->v[i].key, key, THAW_KEY_BYTES);
        c->v[i].refs = own;
        c->v[i].n_refs = n_refs;
        c->v[i].last_used = now;
        refs_apply(c, own, n_refs, +1);
    }
    if (until > c->v[i].kept_until)
        c->v[i].kept_until = until;
    return 0;
}

static int evict(struct thaw_ram_cache *c, int64_t now)
{
    int n = 0;

    if (now > c->now)
        c->now = now;
    for (int i = c->n - 1; i >= 0; i--) {
        if (c->v[i].kept_until > now) /* a retention hint outlives the TTL */
            continue;
        bool hint_only = !c->v[i].parts[THAW_PART_KV].data; /* a retention's entry, its hint over */
        if (hint_only || (c->ttl_s > 0 && now - c->v[i].last_used > c->ttl_s)) {
            drop(c, i);
            n++;
        }
    }
    return n;
}

/* ---- the locked entry points -------------------------------------------------- */

int thaw_ram_cache_put(struct thaw_ram_cache *c, const uint8_t key[THAW_KEY_BYTES],
                       const struct thaw_part_blob parts[THAW_PART_COUNT], int64_t now)
{
    return thaw_ram_cache_put_refs(c, key, parts, NULL, 0, now);
}

int thaw_ram_cache_put_refs(struct thaw_ram_cache *c, const uint8_t key[THAW_KEY_BYTES],
                            const struct thaw_part_blob parts[THAW_PART_COUNT], const uint8_t *refs, uint32_t n_refs,
                            int64_t now)
{
    pthread_mutex_lock(&c->mu);
    int rc = put_refs(c, key, parts, refs, n_refs, now);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int thaw_ram_cache_put_block(struct thaw_ram_cache *c, const uint8_t id[THAW_KEY_BYTES], void *data,
                             size_t size)
{
    pthread_mutex_lock(&c->mu);
    int rc = put_block(c, id, data, size);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int thaw_ram_cache_retain(struct thaw_ram_cache *c, const uint8_t key[THAW_KEY_BYTES], const uint8_t *refs,
                          uint32_t n_refs, int64_t until, int64_t now)
{
    pthread_mutex_lock(&c->mu);
    int rc = retain(c, key, refs, n_refs, until, now);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int thaw_ram_cache_evict(struct thaw_ram_cache *c, int64_t now)
{
    pthread_mutex_lock(&c->mu);
    int n = evict(c, now);
    pthread_mutex_unlock(&c->mu);
    return n;
}

uint64_t thaw_ram_cache_bytes(const struct thaw_ram_cache *c) { return c->bytes; }
int thaw_ram_cache_count(const struct thaw_ram_cache *c) { return c->n; }
