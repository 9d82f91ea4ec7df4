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

int thaw_ram_cache_put(struct thaw_ram_cache *c, const uint8_t key[THAW_KEY_BYTES],
                       const struct thaw_part_blob parts[THAW_PART_COUNT], int64_t now)
{
    uint64_t size = parts_size(parts);
    int i;

    if ((i = find(c, key)) >= 0)
        drop(c, i);
    if (size > c->budget) {
        parts_unref(parts);
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
            parts_unref(parts);
            return THAW_ENOMEM;
        }
        c->v = nv;
        c->cap = cap;
    }
    struct thaw_ram_entry *e = &c->v[c->n++];
    memcpy(e->key, key, THAW_KEY_BYTES);
    for (int p = 0; p < THAW_PART_COUNT; p++) {
        e->parts[p] = parts[p];
        if (!parts[p].size) { /* absent: no buffer held for it */
            thaw_blob_unref(parts[p].data);
            e->parts[p].data = NULL;
        }
    }
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
