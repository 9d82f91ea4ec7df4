/* cache_idx.c — the .idx record of an on-disk entry (cache_disk.c): its
 * byte layout, encoder and parser. The record is the entry's commit
 * marker (cache_disk.c, invariants 1 and 2): everything the store knows
 * of an entry without reading its parts.
 *
 * Format version 2, little-endian:
 *
 *   off  size
 *     0     8  magic "THAWIDX\0"
 *     8     4  format version (2)
 *    12     4  flags: bit p = part p present (THAW_PART_*); bit 8 = a block;
 *              other bits 0
 *    16    32  key (must equal the file name's)
 *    48    32  model fingerprint
 *    80     4  n_tokens
 *    84     4  n_meta (<= THAW_DISK_META_MAX)
 *    88     8  created, Unix seconds (int64)
 *    96  3x16  per part p: size (u64; 0 iff absent), XXH3-64 (u64; 0 if absent)
 *   144     4  n_refs (<= THAW_DISK_REFS_MAX; 0 for a block)
 *   148     4  reserved, 0
 *   152  n_meta  caller's meta bytes
 *   152+n_meta  32*n_refs  keys of the blocks the entry names
 *   end-8   8  XXH3-64 of every byte before it
 *
 * Another version is THAW_EVERSION: version 1 had no kind nor refs, and
 * the store treats it as corrupt (cache_disk.c, "Format versions").
 */
#include "cache/cache_idx.h"

#include "base/error.h"
#include "base/le.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define IDX_MAGIC "THAWIDX" /* 8 bytes with its NUL */
#define IDX_VERSION 2u
#define IDX_OFF_VERSION 8
#define IDX_OFF_FLAGS 12
#define IDX_OFF_KEY 16
#define IDX_OFF_FP 48
#define IDX_OFF_NTOK 80
#define IDX_OFF_NMETA 84
#define IDX_OFF_CREATED 88
#define IDX_OFF_PARTS 96 /* THAW_PART_COUNT x { u64 size; u64 xxh3; } */
#define IDX_OFF_NREFS 144
#define IDX_OFF_RESERVED 148
#define IDX_OFF_META 152
#define IDX_PART_MASK ((1u << THAW_PART_COUNT) - 1)
#define IDX_FLAG_BLOCK (1u << 8)
#define IDX_TRAILER THAW_DISK_IDX_TRAILER

_Static_assert(IDX_OFF_PARTS + 16 * THAW_PART_COUNT == IDX_OFF_NREFS, "idx layout");
_Static_assert(IDX_OFF_META == THAW_DISK_IDX_HEAD, "idx layout");
_Static_assert(sizeof IDX_MAGIC == 8, "idx magic");

int thaw_disk_idx_encode(const struct thaw_disk_idx *idx, uint8_t **out, size_t *n)
{
    size_t len = THAW_DISK_IDX_SIZE(idx->n_meta, idx->n_refs);
    uint8_t *b = calloc(1, len);
    uint32_t flags = 0;

    if (!b)
        return THAW_ENOMEM;
    memcpy(b, IDX_MAGIC, 8);
    put_u32(b + IDX_OFF_VERSION, IDX_VERSION);
    for (int p = 0; p < THAW_PART_COUNT; p++) {
        if (idx->size[p])
            flags |= 1u << p;
        put_u64(b + IDX_OFF_PARTS + 16 * p, idx->size[p]);
        put_u64(b + IDX_OFF_PARTS + 16 * p + 8, idx->size[p] ? idx->xxh3[p] : 0);
    }
    if (idx->is_block)
        flags |= IDX_FLAG_BLOCK;
    put_u32(b + IDX_OFF_FLAGS, flags);
    memcpy(b + IDX_OFF_KEY, idx->key, THAW_KEY_BYTES);
    memcpy(b + IDX_OFF_FP, idx->fingerprint, THAW_DISK_FINGERPRINT_SIZE);
    put_u32(b + IDX_OFF_NTOK, idx->n_tokens);
    put_u32(b + IDX_OFF_NMETA, idx->n_meta);
    put_u64(b + IDX_OFF_CREATED, (uint64_t)idx->created);
    put_u32(b + IDX_OFF_NREFS, idx->n_refs);
    if (idx->n_meta)
        memcpy(b + IDX_OFF_META, idx->meta, idx->n_meta);
    if (idx->n_refs)
        memcpy(b + IDX_OFF_META + idx->n_meta, idx->refs, (size_t)idx->n_refs * THAW_KEY_BYTES);
    put_u64(b + len - IDX_TRAILER, XXH3_64bits(b, len - IDX_TRAILER));
    *out = b;
    *n = len;
    return 0;
}

int thaw_disk_idx_parse(const void *buf, size_t n, struct thaw_disk_idx *out)
{
    const uint8_t *b = buf;
    uint32_t flags, n_meta, n_refs;

    if (!b || n < IDX_OFF_VERSION + 4 || memcmp(b, IDX_MAGIC, 8) != 0)
        return THAW_ECORRUPT;
    if (get_u32(b + IDX_OFF_VERSION) != IDX_VERSION)
        return THAW_EVERSION;
    if (n < THAW_DISK_IDX_SIZE(0, 0) || n > THAW_DISK_IDX_SIZE_MAX)
        return THAW_ECORRUPT;
    n_meta = get_u32(b + IDX_OFF_NMETA);
    n_refs = get_u32(b + IDX_OFF_NREFS);
    if (n_meta > THAW_DISK_META_MAX || n_refs > THAW_DISK_REFS_MAX || THAW_DISK_IDX_SIZE(n_meta, n_refs) != n ||
        get_u32(b + IDX_OFF_RESERVED) != 0)
        return THAW_ECORRUPT;
    if (get_u64(b + n - IDX_TRAILER) != XXH3_64bits(b, n - IDX_TRAILER))
        return THAW_ECORRUPT;
    flags = get_u32(b + IDX_OFF_FLAGS);
    if ((flags & ~(IDX_PART_MASK | IDX_FLAG_BLOCK)) || !(flags & (1u << THAW_PART_KV)))
        return THAW_ECORRUPT;
    if ((flags & IDX_FLAG_BLOCK) && n_refs) /* blocks name nothing: no chains to follow */
        return THAW_ECORRUPT;
    for (int p = 0; p < THAW_PART_COUNT; p++) {
        uint64_t size = get_u64(b + IDX_OFF_PARTS + 16 * p);
        uint64_t h = get_u64(b + IDX_OFF_PARTS + 16 * p + 8);
        int present = (flags >> p) & 1;

        /* A part must be mappable: fit size_t and off_t. */
        if (present != (size != 0) || (!present && h != 0) || size > (uint64_t)INT64_MAX || size > (uint64_t)SIZE_MAX)
            return THAW_ECORRUPT;
        out->size[p] = size;
        out->xxh3[p] = h;
    }
    memcpy(out->key, b + IDX_OFF_KEY, THAW_KEY_BYTES);
    memcpy(out->fingerprint, b + IDX_OFF_FP, THAW_DISK_FINGERPRINT_SIZE);
    out->n_tokens = get_u32(b + IDX_OFF_NTOK);
    out->created = (int64_t)get_u64(b + IDX_OFF_CREATED);
    out->n_meta = n_meta;
    out->meta = n_meta ? b + IDX_OFF_META : NULL;
    out->is_block = (flags & IDX_FLAG_BLOCK) != 0;
    out->n_refs = n_refs;
    out->refs = n_refs ? b + IDX_OFF_META + n_meta : NULL;
    return 0;
}
