/* fuzz_idx.c — libFuzzer target: .idx records through their parser, the
 * first thing a lookup reads from disk (layout: top of cache_disk.c).
 *
 * Each input is parsed twice:
 *   1. as it is, the way open and lookup read a file;
 *   2. with its last 8 bytes replaced by the XXH3-64 of the rest, when its
 *      size is one the parser accepts. A mutation almost never keeps the
 *      self-checksum right, so without this pass every check behind it
 *      (n_meta, n_refs, flags, part sizes) would go unfuzzed.
 * The parser must answer 0, THAW_ECORRUPT or THAW_EVERSION. An accepted
 * record must be canonical: encoding what it parsed (after the layout, here)
 * gives back the input byte for byte, so no two files mean the same entry
 * and every byte is checked. Any failure aborts: a crash to libFuzzer.
 */
#include "base/error.h"
#include "cache/cache_disk.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "base/le.h"

#define IDX_OFF_META 152 /* cache_disk.c: the fixed part */
#define IDX_TRAILER 8

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);



/* Encodes idx after the format-2 layout into b[n]; n = 152 + n_meta +
 * 32 n_refs + 8, which check() has made sure of. */
static void encode(const struct thaw_disk_idx *idx, uint8_t *b, size_t n)
{
    uint32_t flags = 0;

    memset(b, 0, n);
    memcpy(b, "THAWIDX", 8);
    put_u32(b + 8, 2);
    for (int p = 0; p < THAW_PART_COUNT; p++) {
        flags |= idx->size[p] ? 1u << p : 0;
        put_u64(b + 96 + 16 * p, idx->size[p]);
        put_u64(b + 96 + 16 * p + 8, idx->xxh3[p]);
    }
    if (idx->is_block)
        flags |= 1u << 8;
    put_u32(b + 12, flags);
    memcpy(b + 16, idx->key, THAW_KEY_BYTES);
    memcpy(b + 48, idx->fingerprint, THAW_DISK_FINGERPRINT_SIZE);
    put_u32(b + 80, idx->n_tokens);
    put_u32(b + 84, idx->n_meta);
    put_u64(b + 88, (uint64_t)idx->created);
    put_u32(b + 144, idx->n_refs);
    if (idx->n_meta)
        memcpy(b + IDX_OFF_META, idx->meta, idx->n_meta);
    if (idx->n_refs)
        memcpy(b + IDX_OFF_META + idx->n_meta, idx->refs, (size_t)idx->n_refs * THAW_KEY_BYTES);
    put_u64(b + n - IDX_TRAILER, XXH3_64bits(b, n - IDX_TRAILER));
}

static void check(const uint8_t *buf, size_t n)
{
    struct thaw_disk_idx idx;
    int rc = thaw_disk_idx_parse(buf, n, &idx);

    if (rc == THAW_ECORRUPT || rc == THAW_EVERSION)
        return;
    if (rc != 0)
        abort(); /* a code the header does not promise */
    if (n != (size_t)IDX_OFF_META + idx.n_meta + (size_t)idx.n_refs * THAW_KEY_BYTES + IDX_TRAILER ||
        idx.n_meta > THAW_DISK_META_MAX || idx.n_refs > THAW_DISK_REFS_MAX || (idx.is_block && idx.n_refs) ||
        idx.size[THAW_PART_KV] == 0 || (idx.n_meta ? idx.meta != buf + IDX_OFF_META : idx.meta != NULL) ||
        (idx.n_refs ? idx.refs != buf + IDX_OFF_META + idx.n_meta : idx.refs != NULL))
        abort();
    uint8_t *again = malloc(n);
    if (!again)
        return;
    encode(&idx, again, n);
    if (memcmp(again, buf, n) != 0)
        abort(); /* accepted a record the writer would never produce */
    free(again);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check(data, size);
    if (size >= (size_t)IDX_OFF_META + IDX_TRAILER &&
        size <= (size_t)IDX_OFF_META + THAW_DISK_META_MAX + (size_t)THAW_DISK_REFS_MAX * THAW_KEY_BYTES + IDX_TRAILER) {
        uint8_t *fixed = malloc(size);
        if (!fixed)
            return 0;
        memcpy(fixed, data, size);
        put_u64(fixed + size - IDX_TRAILER, XXH3_64bits(fixed, size - IDX_TRAILER));
        check(fixed, size);
        free(fixed);
    }
    return 0;
}
