/* cache_idx.h — the .idx record of an on-disk entry: what cache_disk.c
 * writes last (the commit) and trusts first. Exposed for the store, the
 * tests and the fuzzer; the layout is in cache_idx.c. */
#ifndef THAW_CACHE_IDX_H
#define THAW_CACHE_IDX_H

#include "base/blob.h" /* THAW_PART_COUNT */
#include "base/key.h"

#include <stddef.h>
#include <stdint.h>

#define THAW_DISK_FINGERPRINT_SIZE 32
#define THAW_DISK_META_MAX 4096       /* bytes of caller meta per entry */
#define THAW_DISK_REFS_MAX (1u << 16) /* block keys one entry may name */

/* Bytes of a record: a fixed head, the meta, the refs, a checksum. */
#define THAW_DISK_IDX_HEAD 152
#define THAW_DISK_IDX_TRAILER 8
#define THAW_DISK_IDX_SIZE(n_meta, n_refs)                                                                            \
    ((size_t)THAW_DISK_IDX_HEAD + (n_meta) + (size_t)(n_refs)*THAW_KEY_BYTES + THAW_DISK_IDX_TRAILER)
#define THAW_DISK_IDX_SIZE_MAX THAW_DISK_IDX_SIZE(THAW_DISK_META_MAX, THAW_DISK_REFS_MAX)

struct thaw_disk_idx {
    uint8_t key[THAW_KEY_BYTES];
    uint8_t fingerprint[THAW_DISK_FINGERPRINT_SIZE];
    uint32_t n_tokens;
    int64_t created;                /* Unix seconds */
    uint64_t size[THAW_PART_COUNT]; /* 0 = absent */
    uint64_t xxh3[THAW_PART_COUNT]; /* XXH3-64 of the part's bytes */
    uint32_t n_meta;
    const uint8_t *meta; /* points into the parsed buffer */
    int is_block;        /* THAW_DISK_KIND_BLOCK (flags bit 8) */
    uint32_t n_refs;     /* <= THAW_DISK_REFS_MAX; 0 for a block */
    const uint8_t *refs; /* n_refs keys; points into the buffer */
};

/* Parses an .idx record of n bytes. Returns 0 and fills *out (out->meta
 * points into buf); THAW_ECORRUPT for anything malformed (size, magic,
 * self-checksum, flags, sizes); THAW_EVERSION for thaw's magic with another
 * format version (the store treats both alike). Any input is safe. */
int thaw_disk_idx_parse(const void *buf, size_t n, struct thaw_disk_idx *out);

/* Encodes idx (with meta of idx->n_meta bytes and idx->n_refs refs) into a
 * malloc'd buffer of THAW_DISK_IDX_SIZE(n_meta, n_refs) bytes, which the
 * caller frees. 0, or THAW_ENOMEM. */
int thaw_disk_idx_encode(const struct thaw_disk_idx *idx, uint8_t **out, size_t *n);

#endif
