/* test_manifest.c — the manifest codec (cache/manifest.h) on its own, no
 * model and no disk: what the encoder writes parses back field for field in
 * each of its three shapes (a dense model's tail and window, version 2's SWA
 * blocks, a hybrid's snapshots); the named ids are one run in that order;
 * the encoder refuses what would not parse back; the parser refuses every
 * truncation and another version (tests/fuzz/fuzz_manifest.c tries the
 * rest). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "base/blob.h"
#include "base/error.h"
#include "cache/manifest.h"

#include <string.h>

enum { B = 32 };

static int32_t g_toks[200];
static uint8_t g_ids[16][THAW_KEY_BYTES];

static int setup(void **state)
{
    (void)state;
    for (int i = 0; i < 200; i++)
        g_toks[i] = 1000 + i;
    for (int k = 0; k < 16; k++)
        memset(g_ids[k], 0x10 + k, THAW_KEY_BYTES);
    return 0;
}

/* Encodes m, parses it back and checks every field; returns the blob
 * (thaw_blob_unref) and its size. */
static void *round_trip(const struct thaw_manifest *m, size_t *n, struct thaw_manifest *got)
{
    void *blob = NULL;

    assert_int_equal(thaw_manifest_encode(m, &blob, n, NULL), 0);
    assert_true(thaw_manifest_is(blob, *n));
    assert_int_equal(thaw_manifest_parse(blob, *n, got), 0);
    assert_int_equal(got->version, m->version);
    assert_int_equal(got->n_tokens, m->n_tokens);
    assert_int_equal(got->block_tokens, m->block_tokens);
    assert_int_equal(got->n_blocks, m->n_blocks);
    assert_memory_equal(got->tokens, m->tokens, (size_t)m->n_tokens * 4);
    assert_memory_equal(got->ids, m->ids, (size_t)m->n_blocks * THAW_KEY_BYTES);
    assert_int_equal(got->n_snaps, m->n_snaps);
    if (m->n_snaps)
        assert_memory_equal(got->snaps, m->snaps, (size_t)m->n_snaps * THAW_KEY_BYTES);
    assert_int_equal(got->tail_size, m->tail_size);
    if (m->tail_size)
        assert_memory_equal(got->tail, m->tail, m->tail_size);
    assert_int_equal(got->swa_size, m->swa_size);
    if (m->swa_size)
        assert_memory_equal(got->swa, m->swa, m->swa_size);
    assert_int_equal(got->swa_tail_size, m->swa_tail_size);
    if (m->swa_tail_size)
        assert_memory_equal(got->swa_tail, m->swa_tail, m->swa_tail_size);
    /* every shorter prefix is refused */
    for (size_t cut = 0; cut < *n; cut += 1 + cut / 8)
        assert_int_not_equal(thaw_manifest_parse(blob, cut, got), 0);
    assert_int_equal(thaw_manifest_parse(blob, *n, got), 0);
    return blob;
}

static void test_a_dense_models_tail_and_window(void **state)
{
    static const uint8_t tail[100] = {1, 2, 3}, window[60] = {9, 8, 7};
    struct thaw_manifest m = {
        .version = THAW_MANIFEST_V1,
        .n_tokens = 200,
        .block_tokens = B,
        .n_blocks = 200 / B,
        .tokens = g_toks,
        .ids = g_ids[0],
        .tail = tail,
        .tail_size = sizeof tail,
        .swa = window,
        .swa_size = sizeof window,
    }, got;
    const uint8_t *ids, *snaps;
    uint32_t n_ids, n_snaps;
    size_t n;

    (void)state;
    void *blob = round_trip(&m, &n, &got);
    assert_int_equal(n, 40 + 4 * 200 + 6 * THAW_KEY_BYTES + sizeof tail + sizeof window);
    assert_null(got.sids);
    assert_null(got.snaps);
    assert_int_equal(thaw_manifest_ids(blob, n, &ids, &n_ids), 0);
    assert_ptr_equal(ids, got.ids);
    assert_int_equal(n_ids, 6);
    assert_int_equal(thaw_manifest_snaps(blob, n, &snaps, &n_snaps), 0);
    assert_int_equal(n_snaps, 0);
    assert_false(thaw_manifest_swa_rows(blob, n));
    thaw_blob_unref(blob);

    /* a tail exactly when B does not divide n_tokens */
    m.n_tokens = 192;
    m.n_blocks = 6;
    assert_int_equal(thaw_manifest_encode(&m, &blob, &n, NULL), THAW_EINVAL);
    assert_null(blob);
    m.tail = NULL;
    m.tail_size = 0;
    thaw_blob_unref(round_trip(&m, &n, &got));
    /* n_blocks is n_tokens / B */
    m.n_blocks = 5;
    assert_int_equal(thaw_manifest_encode(&m, &blob, &n, NULL), THAW_EINVAL);
}

static void test_version_2_names_its_swa_blocks_after_its_blocks(void **state)
{
    static const uint8_t tail[100] = {1}, swa_tail[40] = {2};
    const uint32_t W = 64; /* a restore at 200 needs blocks (200 - 64) / B = 4 on */
    struct thaw_manifest m = {
        .version = THAW_MANIFEST_V2_SWA,
        .n_tokens = 200,
        .block_tokens = B,
        .n_blocks = 6,
        .tokens = g_toks,
        .ids = g_ids[0],
        .swa_first = 4,
        .n_window = W,
        .sids = g_ids[8],
        .tail = tail,
        .tail_size = sizeof tail,
        .swa_tail = swa_tail,
        .swa_tail_size = sizeof swa_tail,
    }, got;
    struct thaw_manifest_sections at;
    const uint8_t *ids;
    uint32_t n_ids;
    size_t n;
    void *blob;

    (void)state;
    assert_int_equal(thaw_manifest_swa_first(200, W, B), 4);
    assert_int_equal(thaw_manifest_swa_first(50, W, B), 0);
    blob = round_trip(&m, &n, &got);
    assert_true(thaw_manifest_swa_rows(blob, n));
    assert_int_equal(got.swa_first, 4);
    assert_int_equal(got.n_window, W);
    assert_memory_equal(got.sids, g_ids[8], 2 * THAW_KEY_BYTES);
    assert_int_equal(thaw_manifest_ids(blob, n, &ids, &n_ids), 0);
    assert_int_equal(n_ids, 6 + 2);
    assert_ptr_equal(ids + 6 * THAW_KEY_BYTES, got.sids);
    thaw_blob_unref(blob);

    /* sections given as NULL are the caller's to write, where `at` says */
    m.tail = m.swa_tail = NULL;
    assert_int_equal(thaw_manifest_encode(&m, &blob, &n, &at), 0);
    assert_non_null(at.tail);
    assert_non_null(at.swa_tail);
    assert_null(at.swa);
    memset(at.tail, 0x11, sizeof tail);
    memset(at.swa_tail, 0x22, sizeof swa_tail);
    assert_int_equal(thaw_manifest_parse(blob, n, &got), 0);
    assert_ptr_equal(got.tail, at.tail);
    assert_ptr_equal(got.swa_tail, at.swa_tail);
    thaw_blob_unref(blob);

    /* the run must reach back to the window's start */
    m.swa_first = 5;
    assert_int_equal(thaw_manifest_encode(&m, &blob, &n, NULL), THAW_EINVAL);
    /* nor carry a window copy, nor snapshots */
    m.swa_first = 4;
    m.swa_size = 8;
    assert_int_equal(thaw_manifest_encode(&m, &blob, &n, NULL), THAW_EINVAL);
    m.swa_size = 0;
    m.n_snaps = 1;
    m.snaps = g_ids[15];
    assert_int_equal(thaw_manifest_encode(&m, &blob, &n, NULL), THAW_EINVAL);
}

static void test_a_hybrids_snapshots_end_the_named_run(void **state)
{
    struct thaw_manifest m = {
        .version = THAW_MANIFEST_V1,
        .n_tokens = 200,
        .block_tokens = B,
        .n_blocks = 6,
        .tokens = g_toks,
        .ids = g_ids[0],
        .n_snaps = 2,
        .snaps = g_ids[10],
    }, got;
    const uint8_t *ids, *snaps;
    uint32_t n_ids, n_snaps;
    size_t n;
    void *blob;

    (void)state;
    blob = round_trip(&m, &n, &got);
    assert_int_equal(thaw_manifest_ids(blob, n, &ids, &n_ids), 0);
    assert_int_equal(n_ids, 6 + 2); /* the collector keeps the snapshots too */
    assert_int_equal(thaw_manifest_snaps(blob, n, &snaps, &n_snaps), 0);
    assert_int_equal(n_snaps, 2);
    assert_ptr_equal(snaps, ids + 6 * THAW_KEY_BYTES);
    /* read as version 2 it is no manifest */
    uint8_t *bad = thaw_blob_alloc(n);
    memcpy(bad, blob, n);
    bad[4] = 2;
    assert_int_equal(thaw_manifest_parse(bad, n, &got), THAW_ECORRUPT);
    bad[4] = 3;
    assert_int_equal(thaw_manifest_parse(bad, n, &got), THAW_EVERSION);
    thaw_blob_unref(bad);
    thaw_blob_unref(blob);

    /* the last snapshot holds the tail and the window: neither inline */
    static const uint8_t tail[10];
    m.tail = tail;
    m.tail_size = sizeof tail;
    assert_int_equal(thaw_manifest_encode(&m, &blob, &n, NULL), THAW_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_dense_models_tail_and_window),
        cmocka_unit_test(test_version_2_names_its_swa_blocks_after_its_blocks),
        cmocka_unit_test(test_a_hybrids_snapshots_end_the_named_run),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
