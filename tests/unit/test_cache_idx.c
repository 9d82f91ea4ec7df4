/* test_cache_idx.c — the .idx record's codec on its own: what is encoded
 * parses back field for field, and a record is refused for each way it
 * can lie (version, kind, sizes, checksum). The store's use of it, and a
 * fuzz of a real record, are in test_cache_disk.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "base/error.h"
#include "cache/cache_idx.h"

#include <stdlib.h>
#include <xxhash.h>

static void fill(struct thaw_disk_idx *idx, const uint8_t *meta, uint32_t n_meta, const uint8_t *refs, uint32_t n_refs)
{
    memset(idx, 0, sizeof *idx);
    memset(idx->key, 0x11, sizeof idx->key);
    memset(idx->fingerprint, 0x22, sizeof idx->fingerprint);
    idx->n_tokens = 4097;
    idx->created = 1764000000;
    idx->size[THAW_PART_KV] = 123456;
    idx->xxh3[THAW_PART_KV] = 0x0123456789abcdefull;
    idx->size[THAW_PART_DFT] = 7;
    idx->xxh3[THAW_PART_DFT] = 99;
    idx->n_meta = n_meta;
    idx->meta = meta;
    idx->n_refs = n_refs;
    idx->refs = refs;
}

/* Rewrites the trailing checksum after a deliberate change. */
static void reseal(uint8_t *b, size_t n)
{
    uint64_t h = XXH3_64bits(b, n - THAW_DISK_IDX_TRAILER);

    for (int i = 0; i < 8; i++)
        b[n - 8 + i] = (uint8_t)(h >> (8 * i));
}

static void test_round_trip_keeps_every_field(void **state)
{
    uint8_t meta[5] = {1, 2, 3, 4, 5}, refs[3 * THAW_KEY_BYTES];
    struct thaw_disk_idx in, out;
    uint8_t *rec;
    size_t n;

    (void)state;
    for (size_t i = 0; i < sizeof refs; i++)
        refs[i] = (uint8_t)i;
    fill(&in, meta, sizeof meta, refs, 3);
    assert_int_equal(thaw_disk_idx_encode(&in, &rec, &n), 0);
    assert_int_equal(n, THAW_DISK_IDX_SIZE(5, 3));
    assert_int_equal(thaw_disk_idx_parse(rec, n, &out), 0);
    assert_memory_equal(out.key, in.key, THAW_KEY_BYTES);
    assert_memory_equal(out.fingerprint, in.fingerprint, THAW_DISK_FINGERPRINT_SIZE);
    assert_int_equal(out.n_tokens, 4097);
    assert_int_equal(out.created, 1764000000);
    assert_int_equal(out.size[THAW_PART_KV], 123456);
    assert_int_equal(out.xxh3[THAW_PART_KV], 0x0123456789abcdefull);
    assert_int_equal(out.size[THAW_PART_CKPT], 0);
    assert_int_equal(out.xxh3[THAW_PART_CKPT], 0);
    assert_int_equal(out.size[THAW_PART_DFT], 7);
    assert_int_equal(out.n_meta, 5);
    assert_memory_equal(out.meta, meta, 5);
    assert_int_equal(out.n_refs, 3);
    assert_memory_equal(out.refs, refs, sizeof refs);
    assert_false(out.is_block);
    /* a record one byte short or long is not a record */
    assert_int_equal(thaw_disk_idx_parse(rec, n - 1, &out), THAW_ECORRUPT);
    free(rec);
}

static void test_refuses_a_block_that_names_blocks_another_version_and_a_bad_seal(void **state)
{
    uint8_t ref[THAW_KEY_BYTES] = {7};
    struct thaw_disk_idx in, out;
    uint8_t *rec;
    size_t n;

    (void)state;
    fill(&in, NULL, 0, ref, 1);
    in.is_block = 1; /* blocks name nothing */
    assert_int_equal(thaw_disk_idx_encode(&in, &rec, &n), 0);
    assert_int_equal(thaw_disk_idx_parse(rec, n, &out), THAW_ECORRUPT);
    free(rec);

    fill(&in, NULL, 0, NULL, 0);
    in.is_block = 1;
    assert_int_equal(thaw_disk_idx_encode(&in, &rec, &n), 0);
    assert_int_equal(thaw_disk_idx_parse(rec, n, &out), 0);
    assert_true(out.is_block);
    rec[8] = 1; /* format version 1, resealed: thaw's, but not this version */
    reseal(rec, n);
    assert_int_equal(thaw_disk_idx_parse(rec, n, &out), THAW_EVERSION);
    rec[8] = 2;
    rec[20] ^= 1; /* a key bit, not resealed */
    assert_int_equal(thaw_disk_idx_parse(rec, n, &out), THAW_ECORRUPT);
    free(rec);

    fill(&in, NULL, 0, NULL, 0);
    in.size[THAW_PART_KV] = 0; /* the .kv is mandatory */
    assert_int_equal(thaw_disk_idx_encode(&in, &rec, &n), 0);
    assert_int_equal(thaw_disk_idx_parse(rec, n, &out), THAW_ECORRUPT);
    free(rec);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_keeps_every_field),
        cmocka_unit_test(test_refuses_a_block_that_names_blocks_another_version_and_a_bad_seal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
