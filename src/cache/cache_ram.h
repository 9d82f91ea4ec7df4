/* cache_ram.h — the in-memory tier: recent conversations' blobs by key.
 *
 * Same keys and blobs as the disk tier (kvstate.h), held in RAM under a byte
 * budget (--cache-ram), least recently used evicted first, TTL like the
 * disk. It spares a disk read when a conversation returns to a slot that
 * was reused meanwhile. With blocks (--kv-cache-block and the disk tier)
 * an entry is a manifest and the blocks it names are held once each,
 * shared by every entry naming them. The engine thread puts, gets and
 * evicts; a restore assembled off it reads blocks (thaw_ram_cache_block,
 * _has_block), so every call takes the tier's mutex. The blobs are
 * reference-counted: a reader on another thread holds its own.
 */
#ifndef THAW_CACHE_RAM_H
#define THAW_CACHE_RAM_H

#include "base/blob.h" /* the parts of an entry */
#include "base/key.h"

#include <stddef.h>
#include <stdint.h>


struct thaw_ram_cache;


struct thaw_ram_entry {
    uint8_t key[THAW_KEY_BYTES];
    struct thaw_part_blob parts[THAW_PART_COUNT]; /* one reference owned to each present part */
    uint8_t *refs;     /* the block ids its .kv part (a manifest) names, n_refs x 32 bytes */
    uint32_t n_refs;
    int64_t last_used; /* Unix seconds */
    int64_t kept_until; /* Unix seconds: a retention hint (thaw_ram_cache_retain) holds it until then
                         * against LRU and TTL, within the budget; 0 = none */
};

/* budget 0 = the tier is off (every put is refused, lookups miss).
 * Returns 0 or THAW_ENOMEM. */
int thaw_ram_cache_new(uint64_t budget_bytes, int64_t ttl_s, struct thaw_ram_cache **out);
void thaw_ram_cache_free(struct thaw_ram_cache *c);

/* Takes the caller's reference to each present part's blob (dropped on
 * eviction, or at once when the entry alone exceeds the budget: then
 * THAW_ETOOBIG); parts[THAW_PART_KV] must be present. Replaces an entry of
 * the same key (kept when the new one is refused before it is in). Evicts LRU entries to fit. Returns 0 or THAW_ETOOBIG /
 * THAW_ENOMEM (the references are taken in every case). */
int thaw_ram_cache_put(struct thaw_ram_cache *c, const uint8_t key[THAW_KEY_BYTES],
                       const struct thaw_part_blob parts[THAW_PART_COUNT], int64_t now);

/* thaw_ram_cache_put of an entry whose .kv part is a manifest naming the
 * n_refs block ids at refs (copied): each of those blocks the tier holds
 * stays while an entry names it, and is counted once in the budget however
 * many entries name it. When the entry with its blocks exceeds the budget
 * alone: THAW_ETOOBIG. */
int thaw_ram_cache_put_refs(struct thaw_ram_cache *c, const uint8_t key[THAW_KEY_BYTES],
                            const struct thaw_part_blob parts[THAW_PART_COUNT], const uint8_t *refs, uint32_t n_refs,
                            int64_t now);

/* ---- blocks (DESIGN §9): one copy of each, shared by the manifests --------
 * A block put here is an orphan until an entry naming it is put (put it
 * just before its manifest's entry); orphans are the first to go when room
 * is needed, and go at once if that entry's put fails. An entry's removal
 * frees the blocks only it named. */

/* Takes the caller's reference to data (size bytes). 0 (also when the block
 * is held already: the reference is dropped), THAW_ETOOBIG or THAW_ENOMEM. */
int thaw_ram_cache_put_block(struct thaw_ram_cache *c, const uint8_t id[THAW_KEY_BYTES], void *data,
                             size_t size);
/* A new reference to block id's bytes (*size set), or NULL. NULL c: NULL. */
void *thaw_ram_cache_block(struct thaw_ram_cache *c, const uint8_t id[THAW_KEY_BYTES], size_t *size);
int thaw_ram_cache_has_block(struct thaw_ram_cache *c, const uint8_t id[THAW_KEY_BYTES]);
uint32_t thaw_ram_cache_blocks(const struct thaw_ram_cache *c);

/* The entry or NULL; marks it used. Valid until the next put/remove/evict. */
const struct thaw_ram_entry *thaw_ram_cache_get(struct thaw_ram_cache *c, const uint8_t key[THAW_KEY_BYTES],
                                                int64_t now);

void thaw_ram_cache_remove(struct thaw_ram_cache *c, const uint8_t key[THAW_KEY_BYTES]);

/* A retention hint (an Anthropic cache_control mark: what it covers is
 * kept at least ttl): the entry `key` is kept until `until` (Unix
 * seconds) against TTL and least-recently-used eviction, and goes for room
 * only once every entry not kept has gone (the earliest deadline first).
 * When key is not held and n_refs > 0, it is put as an entry with no parts
 * that names the n_refs blocks at refs (the prefix a mark covers: its
 * blocks stay while the hint lasts, counted once in the budget); such an
 * entry is never returned by get(). A later call extends, never shortens.
 * 0, THAW_ENOTFOUND (nothing held, nothing to name) or THAW_ENOMEM. */
int thaw_ram_cache_retain(struct thaw_ram_cache *c, const uint8_t key[THAW_KEY_BYTES], const uint8_t *refs,
                          uint32_t n_refs, int64_t until, int64_t now);

/* Drops entries unused for more than the TTL. Returns how many. */
int thaw_ram_cache_evict(struct thaw_ram_cache *c, int64_t now);

/* Bytes held: entries and blocks. */
uint64_t thaw_ram_cache_bytes(const struct thaw_ram_cache *c);
int thaw_ram_cache_count(const struct thaw_ram_cache *c);

#endif
