/* cache_ram.c — LRU + TTL map of key -> blobs, engine thread only.
 * A flat array: entries are tens to hundreds of MiB-sized states, so their
 * count under any sane budget is small and a linear scan is the cheap part. */
#include "cache_ram.h"

#include "blob.h"
#include "error.h"

#include <stdlib.h>
#include <string.h>

struct thaw_ram_cache {
    uint64_t budget, bytes;
    int64_t ttl_s;
    struct thaw_ram_entry *v;
    int n, cap;
};

int thaw_ram_cache_new(uint64_t budget_bytes, int64_t ttl_s, struct thaw_ram_cache **out)
{
    struct thaw_ram_cache *c = calloc(1, sizeof *c);

    if (!c)
        return THAW_ENOMEM;
    c->budget = budget_bytes;
    c->ttl_s = ttl_s;
    *out = c;
    return 0;
}

static void drop(struct thaw_ram_cache *c, int i)
{
    c->bytes -= c->v[i].n_kv + c->v[i].n_ckpt + c->v[i].n_dft;
    thaw_blob_unref(c->v[i].kv);
    thaw_blob_unref(c->v[i].ckpt);
    thaw_blob_unref(c->v[i].dft);
    c->v[i] = c->v[--c->n];
}

void thaw_ram_cache_free(struct thaw_ram_cache *c)
{
    if (!c)
        return;
    while (c->n > 0)
        drop(c, 0);
    free(c->v);
    free(c);
}

static int find(const struct thaw_ram_cache *c, const uint8_t key[THAW_KEY_BYTES])
{
    for (int i = 0; i < c->n; i++)
        if (memcmp(c->v[i].key, key, THAW_KEY_BYTES) == 0)
            return i;
    return -1;
}

int thaw_ram_cache_put(struct thaw_ram_cache *c, const uint8_t key[THAW_KEY_BYTES], void *kv, size_t n_kv,
                       void *ckpt, size_t n_ckpt, void *dft, size_t n_dft, int64_t now)
{
    uint64_t size = (uint64_t)n_kv + n_ckpt + n_dft;
    int i;

    if ((i = find(c, key)) >= 0)
        drop(c, i);
    if (size > c->budget) {
        thaw_blob_unref(kv);
        thaw_blob_unref(ckpt);
        thaw_blob_unref(dft);
        return THAW_ETOOBIG;
    }
    while (c->bytes + size > c->budget && c->n > 0) {
        int lru = 0;
        for (i = 1; i < c->n; i++)
            if (c->v[i].last_used < c->v[lru].last_used)
                lru = i;
        drop(c, lru);
    }
    if (c->n == c->cap) {
        int cap = c->cap ? c->cap * 2 : 8;
        struct thaw_ram_entry *nv = realloc(c->v, (size_t)cap * sizeof *nv);
        if (!nv) {
            thaw_blob_unref(kv);
            thaw_blob_unref(ckpt);
            thaw_blob_unref(dft);
            return THAW_ENOMEM;
        }
        c->v = nv;
        c->cap = cap;
    }
    struct thaw_ram_entry *e = &c->v[c->n++];
    memcpy(e->key, key, THAW_KEY_BYTES);
    e->kv = kv;
    e->n_kv = n_kv;
    e->ckpt = ckpt;
    e->n_ckpt = n_ckpt;
    e->dft = dft;
    e->n_dft = n_dft;
    e->last_used = now;
    c->bytes += size;
    return 0;
}

const struct thaw_ram_entry *thaw_ram_cache_get(struct thaw_ram_cache *c, const uint8_t key[THAW_KEY_BYTES],
                                                int64_t now)
{
    int i = find(c, key);

    if (i < 0)
        return NULL;
    c->v[i].last_used = now;
    return &c->v[i];
}

void thaw_ram_cache_remove(struct thaw_ram_cache *c, const uint8_t key[THAW_KEY_BYTES])
{
    int i = find(c, key);

    if (i >= 0)
        drop(c, i);
}

int thaw_ram_cache_evict(struct thaw_ram_cache *c, int64_t now)
{
    int n = 0;

    if (c->ttl_s <= 0)
        return 0;
    for (int i = c->n - 1; i >= 0; i--) {
        if (now - c->v[i].last_used > c->ttl_s) {
            drop(c, i);
            n++;
        }
    }
    return n;
}

uint64_t thaw_ram_cache_bytes(const struct thaw_ram_cache *c) { return c->bytes; }
int thaw_ram_cache_count(const struct thaw_ram_cache *c) { return c->n; }
