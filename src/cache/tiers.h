/* tiers.h — the tier order for a content-addressed object (a block,
 * blocks.h; a snapshot, snapshots.h): the RAM tier's copy, then the disk
 * writer's queue (submitted, not yet committed), then its file.
 *
 * Every read and every "is it stored?" of such an object goes through
 * here, so the order is written once: block_reader.c reads a run of blocks
 * into place, snapshots.c and blocks.c fetch snapshots and manifests'
 * objects, and a store skips what a tier has. Keyed entries (a
 * conversation's whole state or manifest, with its parts) have their own
 * one path, kvcache.c's lookup, since the RAM tier keeps them apart.
 */
#ifndef THAW_TIERS_H
#define THAW_TIERS_H

#include "base/key.h"
#include "cache/cache_disk.h"
#include "cache/cache_ram.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The object's bytes if a memory tier holds them: the RAM tier's copy,
 * else the writer's queued one. 0 with *blob a blob reference
 * (thaw_blob_unref) of *n bytes, or THAW_ENOTFOUND: read its file. ram
 * may be NULL. */
int thaw_tiers_held(struct thaw_disk_cache *c, struct thaw_ram_cache *ram, const uint8_t id[THAW_KEY_BYTES],
                    void **blob, size_t *n);

/* thaw_tiers_held, else the file's bytes copied out (its checksum
 * verified). 0 as above, THAW_ENOTFOUND, THAW_ECORRUPT (the file was bad:
 * removed), THAW_ENOMEM or a disk error. */
int thaw_tiers_fetch(struct thaw_disk_cache *c, struct thaw_ram_cache *ram, const uint8_t id[THAW_KEY_BYTES],
                     void **blob, size_t *n);

/* Whether any tier has it (the RAM tier, the writer's queue, the files):
 * a store of it would be redundant, a restore can count on it. */
bool thaw_tiers_has(struct thaw_disk_cache *c, struct thaw_ram_cache *ram, const uint8_t id[THAW_KEY_BYTES]);

#endif
