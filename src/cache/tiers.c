/* tiers.c — the tier order for a content-addressed object (tiers.h). */
#include "cache/tiers.h"

#include "base/blob.h"
#include "base/error.h"

#include <string.h>

int thaw_tiers_held(struct thaw_disk_cache *c, struct thaw_ram_cache *ram, const uint8_t id[THAW_KEY_BYTES],
                    void **blob, size_t *n)
{
    struct thaw_part_blob pend[THAW_PART_COUNT];

    *n = 0;
    if ((*blob = thaw_ram_cache_block(ram, id, n)) != NULL)
        return 0;
    if (thaw_disk_cache_pending(c, id, pend) != 0)
        return THAW_ENOTFOUND;
    for (int p = 1; p < THAW_PART_COUNT; p++)
        thaw_blob_unref(pend[p].data);
    *blob = pend[THAW_PART_KV].data;
    *n = pend[THAW_PART_KV].size;
    return *blob ? 0 : THAW_ENOTFOUND;
}

int thaw_tiers_fetch(struct thaw_disk_cache *c, struct thaw_ram_cache *ram, const uint8_t id[THAW_KEY_BYTES],
                     void **blob, size_t *n)
{
    struct thaw_disk_entry *e = NULL;
    size_t size = 0;
    int rc;

    if (thaw_tiers_held(c, ram, id, blob, n) == 0)
        return 0;
    if ((rc = thaw_disk_cache_lookup(c, id, &e)) != 0)
        return rc; /* a bad one was removed (THAW_ECORRUPT) */
    const void *kv = thaw_disk_entry_part(e, THAW_PART_KV, &size);
    if (!kv || !(*blob = thaw_blob_alloc(size))) {
        thaw_disk_entry_release(e);
        return kv ? THAW_ENOMEM : THAW_ECORRUPT;
    }
    memcpy(*blob, kv, size);
    *n = size;
    thaw_disk_entry_release(e);
    return 0;
}

bool thaw_tiers_has(struct thaw_disk_cache *c, struct thaw_ram_cache *ram, const uint8_t id[THAW_KEY_BYTES])
{
    /* the disk first: its check marks the block used (cache_disk.h) */
    return thaw_disk_cache_has(c, id) || thaw_ram_cache_has_block(ram, id);
}
