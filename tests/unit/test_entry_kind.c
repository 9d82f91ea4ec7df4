/* test_entry_kind.c — the one function that names a disk entry's kind
 * (cache/entry_kind.h), and the classify callback the disk tier's
 * collector gets from it: each of the four formats is named from its
 * bytes and from a head of THAW_ENTRY_HEAD bytes alone (what `thaw cache`
 * reads); what no format claims, or is shorter than its header, is
 * OTHER; a manifest is a root naming its ids (none when it does not
 * parse), a snapshot a block, a block a block only when it parses whole,
 * a whole state a root naming nothing. Real blocks cut from a model's
 * state: test_blocks.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "base/blob.h"
#include "cache/cache_disk.h"
#include "cache/entry_kind.h"
#include "cache/manifest.h"
#include "llama/kvstate.h"

#include <string.h>

enum { B = 32 };

static int32_t g_toks[200];
static uint8_t g_ids[8][THAW_KEY_BYTES];

/* A manifest of n tokens naming n / B blocks and, when snaps, one snapshot;
 * version 2 (SWA blocks of every block) when v2. */
static void *manifest(uint32_t n, int snaps, int v2, size_t *size)
{
    static const uint8_t tail[48];
    struct thaw_manifest m = {
        .version = v2 ? THAW_MANIFEST_V2_SWA : THAW_MANIFEST_V1,
        .n_tokens = n,
        .block_tokens = B,
        .n_blocks = n / B,
        .tokens = g_toks,
        .ids = g_ids[0],
        .n_window = v2 ? B : 0,
        .sids = v2 ? g_ids[0] : NULL,
        .n_snaps = snaps ? 1 : 0,
        .snaps = snaps ? g_ids[7] : NULL,
        .tail = n % B && !snaps ? tail : NULL,
        .tail_size = n % B && !snaps ? sizeof tail : 0,
        .swa_tail = v2 && n % B ? tail : NULL,
        .swa_tail_size = v2 && n % B ? sizeof tail : 0,
    };
    void *blob = NULL;

    assert_int_equal(thaw_manifest_encode(&m, &blob, size, NULL), 0);
    return blob;
}

static void test_each_format_is_named_from_its_head(void **state)
{
    uint8_t buf[256] = {0};
    const uint8_t *refs;
    uint32_t n_refs;
    size_t n;

    (void)state;
    for (int k = 0; k < 8; k++)
        memset(g_ids[k], 0x20 + k, THAW_KEY_BYTES);

    /* a manifest, of either version: whole, and from its head alone */
    void *man = manifest(150, 0, 0, &n);
    assert_int_equal(thaw_entry_kind(man, n), THAW_ENTRY_MANIFEST);
    assert_int_equal(thaw_entry_kind(man, THAW_ENTRY_HEAD), THAW_ENTRY_MANIFEST);
    refs = NULL;
    n_refs = 0;
    assert_int_equal(thaw_entry_classify(NULL, man, n, &refs, &n_refs), THAW_DISK_KIND_ROOT);
    assert_int_equal(n_refs, 150 / B);
    assert_memory_equal(refs, g_ids[0], (size_t)n_refs * THAW_KEY_BYTES);
    /* a head is not a manifest that names anything */
    assert_int_equal(thaw_entry_classify(NULL, man, THAW_ENTRY_HEAD, &refs, &n_refs), THAW_DISK_KIND_ROOT);
    assert_null(refs);
    assert_int_equal(n_refs, 0);
    thaw_blob_unref(man);
    man = manifest(150, 0, 1, &n);
    assert_int_equal(thaw_entry_kind(man, THAW_ENTRY_HEAD), THAW_ENTRY_MANIFEST);
    assert_int_equal(thaw_entry_classify(NULL, man, n, &refs, &n_refs), THAW_DISK_KIND_ROOT);
    assert_int_equal(n_refs, 2 * (150 / B)); /* the SWA blocks too */
    thaw_blob_unref(man);
    /* a hybrid's names its snapshot last: the collector keeps it */
    man = manifest(150, 1, 0, &n);
    assert_int_equal(thaw_entry_classify(NULL, man, n, &refs, &n_refs), THAW_DISK_KIND_ROOT);
    assert_int_equal(n_refs, 150 / B + 1);
    assert_memory_equal(refs + (size_t)(n_refs - 1) * THAW_KEY_BYTES, g_ids[7], THAW_KEY_BYTES);
    thaw_blob_unref(man);

    /* a snapshot (snapshots.h's header): a block to the collector */
    const uint32_t snap[] = {0x314e5354u, 1, 40, B, 8, 0, 16, 0}; /* u64 tail 8, rec 16 */
    memcpy(buf, snap, sizeof snap);
    assert_int_equal(thaw_entry_kind(buf, sizeof snap + 24), THAW_ENTRY_SNAPSHOT);
    assert_int_equal(thaw_entry_kind(buf, THAW_ENTRY_HEAD), THAW_ENTRY_SNAPSHOT);
    assert_int_equal(thaw_entry_classify(NULL, buf, sizeof snap + 24, &refs, &n_refs), THAW_DISK_KIND_BLOCK);

    /* a block's magic on bytes that do not parse: it claims to be one
     * (thaw cache counts it), but the collector keeps it as a root */
    memset(buf, 0, sizeof buf);
    memcpy(buf, "TKB1", 4);
    assert_int_equal(thaw_entry_kind(buf, THAW_ENTRY_HEAD), THAW_ENTRY_BLOCK);
    assert_int_equal(thaw_entry_classify(NULL, buf, sizeof buf, &refs, &n_refs), THAW_DISK_KIND_ROOT);

    /* a whole state (kvstate.h): a root naming nothing */
    memset(buf, 0, sizeof buf);
    thaw_kvstate_write_head(buf, g_toks, 10, 100);
    assert_int_equal(thaw_entry_kind(buf, sizeof buf), THAW_ENTRY_STATE);
    assert_int_equal(thaw_entry_kind(buf, THAW_ENTRY_HEAD), THAW_ENTRY_STATE);
    refs = NULL;
    n_refs = 0;
    assert_int_equal(thaw_entry_classify(NULL, buf, sizeof buf, &refs, &n_refs), THAW_DISK_KIND_ROOT);
    assert_null(refs);
    assert_int_equal(n_refs, 0);
}

static void test_what_no_format_claims_is_other(void **state)
{
    uint8_t buf[THAW_ENTRY_HEAD];
    const uint8_t *refs = NULL;
    uint32_t n_refs = 0;

    (void)state;
    assert_int_equal(thaw_entry_kind(NULL, 0), THAW_ENTRY_OTHER);
    memset(buf, 'x', sizeof buf);
    assert_int_equal(thaw_entry_kind(buf, sizeof buf), THAW_ENTRY_OTHER);
    assert_int_equal(thaw_entry_classify(NULL, buf, sizeof buf, &refs, &n_refs), THAW_DISK_KIND_ROOT);
    assert_null(refs);
    /* each magic, shorter than its format's header */
    static const char *const magics[] = {"TKV1", "TMF1", "TKB1", "TSN1"};
    for (int i = 0; i < 4; i++) {
        memcpy(buf, magics[i], 4);
        assert_int_equal(thaw_entry_kind(buf, 4), THAW_ENTRY_OTHER);
        assert_int_equal(thaw_entry_kind(buf, 23), THAW_ENTRY_OTHER);
        assert_int_not_equal(thaw_entry_kind(buf, sizeof buf), THAW_ENTRY_OTHER);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_format_is_named_from_its_head),
        cmocka_unit_test(test_what_no_format_claims_is_other),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
