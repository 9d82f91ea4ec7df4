/* cache_ram.h — the in-memory tier: recent conversations' blobs by key.
 *
 * Same keys and blobs as the disk tier (kvstate.h), held in RAM under a byte
 * budget (--cache-ram), least recently used evicted first, TTL like the
 * disk. It spares a disk read when a conversation returns to a slot that
 * was reused meanwhile. Engine thread only: no locking.
 */
#ifndef THAW_CACHE_RAM_H
#define THAW_CACHE_RAM_H

#include "blob.h" /* the parts of an entry */
#include "keys.h" /* THAW_KEY_BYTES */

#include <stddef.h>
#include <stdint.h>


struct thaw_ram_cache;

struct thaw_ram_entry {
    uint8_t key[THAW_KEY_BYTES];
    struct thaw_part_blob parts[THAW_PART_COUNT]; /* one reference owned to each present part */
    int64_t last_used; /* Unix seconds */
};

/* budget 0 = the tier is off (every put is refused, lookups miss).
 * Returns 0 or THAW_ENOMEM. */
int thaw_ram_cache_new(uint64_t budget_bytes, int64_t ttl_s, struct thaw_ram_cache **out);
void thaw_ram_cache_free(struct thaw_ram_cache *c);

/* Takes the caller's reference to each present part's blob (dropped on
 * eviction, or at once when the entry alone exceeds the budget: then
 * THAW_ETOOBIG); parts[THAW_PART_KV] must be present. Replaces an entry of
 * the same key. Evicts LRU entries to fit. Returns 0 or THAW_ETOOBIG /
 * THAW_ENOMEM (the references are taken in every case). */
int thaw_ram_cache_put(struct thaw_ram_cache *c, const uint8_t key[THAW_KEY_BYTES],
                       const struct thaw_part_blob parts[THAW_PART_COUNT], int64_t now);

/* The entry or NULL; marks it used. Valid until the next put/remove/evict. */
const struct thaw_ram_entry *thaw_ram_cache_get(struct thaw_ram_cache *c, const uint8_t key[THAW_KEY_BYTES],
                                                int64_t now);

void thaw_ram_cache_remove(struct thaw_ram_cache *c, const uint8_t key[THAW_KEY_BYTES]);

/* Drops entries unused for more than the TTL. Returns how many. */
int thaw_ram_cache_evict(struct thaw_ram_cache *c, int64_t now);

uint64_t thaw_ram_cache_bytes(const struct thaw_ram_cache *c);
int thaw_ram_cache_count(const struct thaw_ram_cache *c);

#endif
