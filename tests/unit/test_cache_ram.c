/* test_cache_ram.c — the RAM tier: budget, LRU order, TTL, replacement,
 * blocks held once for every manifest that names them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "base/blob.h"
#include "base/error.h"
#include "cache/cache_ram.h"

/* One entry of the given parts (NULL/0 = absent). */
static int put(struct thaw_ram_cache *c, const uint8_t k[THAW_KEY_BYTES], void *kv, size_t n_kv, void *ckpt,
               size_t n_ckpt, void *dft, size_t n_dft, int64_t now)
{
    const struct thaw_part_blob parts[THAW_PART_COUNT] = {{kv, n_kv}, {ckpt, n_ckpt}, {dft, n_dft}};

    return thaw_ram_cache_put(c, k, parts, now);
}

static void key(uint8_t k[THAW_KEY_BYTES], int i)
{
    memset(k, 0, THAW_KEY_BYTES);
    k[0] = (uint8_t)i;
}

static void *blob(size_t n)
{
    void *b = thaw_blob_alloc(n);

    assert_non_null(b);
    memset(b, 0, n);
    return b;
}

static void test_lru_and_budget(void **state)
{
    struct thaw_ram_cache *c;
    uint8_t k[THAW_KEY_BYTES];

    (void)state;
    assert_int_equal(thaw_ram_cache_new(300, 0, &c), 0);
    for (int i = 0; i < 3; i++) {
        key(k, i);
        assert_int_equal(put(c, k, blob(100), 100, NULL, 0, NULL, 0, 10 + i), 0);
    }
    key(k, 0);
    assert_non_null(thaw_ram_cache_get(c, k, 20)); /* 0 is now the most recent */
    key(k, 3);
    assert_int_equal(put(c, k, blob(100), 100, NULL, 0, NULL, 0, 21), 0);
    key(k, 1);
    assert_null(thaw_ram_cache_get(c, k, 22)); /* 1 was least recently used */
    key(k, 0);
    assert_non_null(thaw_ram_cache_get(c, k, 22));
    assert_int_equal(thaw_ram_cache_bytes(c), 300);
    key(k, 9);
    assert_int_equal(put(c, k, blob(400), 400, NULL, 0, NULL, 0, 23), THAW_ETOOBIG);
    assert_int_equal(thaw_ram_cache_count(c), 3);
    /* same key replaces */
    key(k, 0);
    assert_int_equal(put(c, k, blob(50), 50, blob(10), 10, NULL, 0, 24), 0);
    assert_int_equal(thaw_ram_cache_get(c, k, 25)->parts[THAW_PART_CKPT].size, 10);
    assert_int_equal(thaw_ram_cache_bytes(c), 260);
    thaw_ram_cache_free(c);
}

static void test_ttl(void **state)
{
    struct thaw_ram_cache *c;
    uint8_t k[THAW_KEY_BYTES];

    (void)state;
    assert_int_equal(thaw_ram_cache_new(1000, 5, &c), 0);
    key(k, 1);
    put(c, k, blob(10), 10, NULL, 0, NULL, 0, 100);
    key(k, 2);
    put(c, k, blob(10), 10, NULL, 0, NULL, 0, 104);
    assert_int_equal(thaw_ram_cache_evict(c, 106), 1);
    assert_null(thaw_ram_cache_get(c, (key(k, 1), k), 106));
    assert_non_null(thaw_ram_cache_get(c, (key(k, 2), k), 106));
    thaw_ram_cache_free(c);
}

static void test_off(void **state)
{
    struct thaw_ram_cache *c;
    uint8_t k[THAW_KEY_BYTES];

    (void)state;
    assert_int_equal(thaw_ram_cache_new(0, 0, &c), 0);
    key(k, 1);
    assert_int_equal(put(c, k, blob(1), 1, NULL, 0, NULL, 0, 1), THAW_ETOOBIG);
    assert_null(thaw_ram_cache_get(c, k, 1));
    thaw_ram_cache_free(c);
}

static void bid(uint8_t id[THAW_KEY_BYTES], int i)
{
    memset(id, 0, THAW_KEY_BYTES);
    id[0] = (uint8_t)i;
    id[5] = (uint8_t)(i * 7); /* spread over the buckets */
}

/* An entry naming blocks ids[0..n) (their numbers) with a manifest of m bytes. */
static int put_man(struct thaw_ram_cache *c, int k_i, size_t m, const int *blocks, int n, int64_t now)
{
    uint8_t k[THAW_KEY_BYTES], refs[8][THAW_KEY_BYTES];
    const struct thaw_part_blob parts[THAW_PART_COUNT] = {{blob(m), m}, {NULL, 0}, {NULL, 0}};

    key(k, k_i);
    for (int i = 0; i < n; i++)
        bid(refs[i], blocks[i]);
    return thaw_ram_cache_put_refs(c, k, parts, refs[0], (uint32_t)n, now);
}

static int has(struct thaw_ram_cache *c, int i)
{
    uint8_t id[THAW_KEY_BYTES];

    bid(id, i);
    return thaw_ram_cache_has_block(c, id);
}

static void put_blk(struct thaw_ram_cache *c, int i, size_t n)
{
    uint8_t id[THAW_KEY_BYTES];

    bid(id, i);
    assert_int_equal(thaw_ram_cache_put_block(c, id, blob(n), n), 0);
}

static void test_blocks_held_once(void **state)
{
    struct thaw_ram_cache *c;
    uint8_t k[THAW_KEY_BYTES], id[THAW_KEY_BYTES];

    (void)state;
    assert_int_equal(thaw_ram_cache_new(1000, 0, &c), 0);
    /* two conversations sharing block 1: it counts once */
    put_blk(c, 1, 100);
    put_blk(c, 2, 100);
    assert_int_equal(put_man(c, 1, 10, (int[]){1, 2}, 2, 1), 0);
    put_blk(c, 1, 100); /* held already: the new copy is dropped */
    put_blk(c, 3, 100);
    assert_int_equal(put_man(c, 2, 10, (int[]){1, 3}, 2, 2), 0);
    assert_int_equal(thaw_ram_cache_bytes(c), 3 * 100 + 2 * 10);
    assert_int_equal(thaw_ram_cache_blocks(c), 3);
    /* a reader's reference outlives the block */
    size_t n;
    bid(id, 2);
    void *two = thaw_ram_cache_block(c, id, &n);
    assert_non_null(two);
    assert_int_equal(n, 100);
    /* removing conversation 1 frees the block only it named */
    thaw_ram_cache_remove(c, (key(k, 1), k));
    assert_false(has(c, 2));
    assert_true(has(c, 1) && has(c, 3));
    assert_int_equal(thaw_ram_cache_bytes(c), 2 * 100 + 10);
    memset(two, 0xab, 100); /* still ours */
    thaw_blob_unref(two);
    /* blocks put for an entry that does not fit go with it */
    put_blk(c, 4, 100);
    assert_int_equal(put_man(c, 3, 2000, (int[]){4}, 1, 3), THAW_ETOOBIG);
    assert_false(has(c, 4));
    assert_int_equal(thaw_ram_cache_bytes(c), 2 * 100 + 10);
    /* left over by a store that never put its entry: gone at the next put */
    put_blk(c, 5, 100);
    assert_int_equal(put_man(c, 4, 10, (int[]){1}, 1, 4), 0);
    assert_false(has(c, 5));
    thaw_ram_cache_free(c);
}

static void test_blocks_evicted_with_their_last_entry(void **state)
{
    struct thaw_ram_cache *c;

    (void)state;
    assert_int_equal(thaw_ram_cache_new(400, 0, &c), 0);
    put_blk(c, 1, 100); /* a shared prefix */
    put_blk(c, 2, 100);
    assert_int_equal(put_man(c, 1, 10, (int[]){1, 2}, 2, 1), 0);
    put_blk(c, 3, 100);
    assert_int_equal(put_man(c, 2, 10, (int[]){1, 3}, 2, 2), 0); /* 320 bytes */
    /* a third conversation needs room: the least recently used goes, with
     * the block only it named; the shared one stays */
    put_blk(c, 4, 100);
    assert_int_equal(put_man(c, 3, 10, (int[]){1, 4}, 2, 3), 0);
    assert_false(has(c, 2));
    assert_true(has(c, 1) && has(c, 3) && has(c, 4));
    assert_int_equal(thaw_ram_cache_bytes(c), 3 * 100 + 2 * 10);
    assert_int_equal(thaw_ram_cache_count(c), 2);
    /* TTL eviction frees blocks too */
    thaw_ram_cache_free(c);
    assert_int_equal(thaw_ram_cache_new(1000, 5, &c), 0);
    put_blk(c, 1, 100);
    assert_int_equal(put_man(c, 1, 10, (int[]){1}, 1, 100), 0);
    assert_int_equal(thaw_ram_cache_evict(c, 200), 1);
    assert_false(has(c, 1));
    assert_int_equal(thaw_ram_cache_bytes(c), 0);
    thaw_ram_cache_free(c);
}

/* A conversation stored again under its key (the reply as generated, then
 * its canonical form): the new entry's blocks that the old one held stay,
 * though the new store did not put them again (held already). */
static void test_same_key_again_keeps_the_blocks_both_name(void **state)
{
    struct thaw_ram_cache *c;
    uint8_t k[THAW_KEY_BYTES];

    (void)state;
    assert_int_equal(thaw_ram_cache_new(1000, 0, &c), 0);
    put_blk(c, 1, 100);
    put_blk(c, 2, 100);
    assert_int_equal(put_man(c, 1, 10, (int[]){1, 2}, 2, 1), 0);
    put_blk(c, 1, 100); /* held already: not put again */
    put_blk(c, 3, 100);
    assert_int_equal(put_man(c, 1, 20, (int[]){1, 3}, 2, 2), 0);
    assert_true(has(c, 1) && has(c, 3));
    assert_false(has(c, 2)); /* only the old entry named it */
    assert_int_equal(thaw_ram_cache_count(c), 1);
    assert_int_equal(thaw_ram_cache_bytes(c), 2 * 100 + 20);
    const struct thaw_ram_entry *e = thaw_ram_cache_get(c, (key(k, 1), k), 3);
    assert_non_null(e);
    assert_int_equal(e->parts[THAW_PART_KV].size, 20);
    /* one that does not fit leaves the old entry as it was */
    assert_int_equal(put_man(c, 1, 2000, (int[]){1}, 1, 4), THAW_ETOOBIG);
    e = thaw_ram_cache_get(c, k, 5);
    assert_non_null(e);
    assert_int_equal(e->parts[THAW_PART_KV].size, 20);
    assert_true(has(c, 1) && has(c, 3));
    thaw_ram_cache_free(c);
}

/* A retention hint (an Anthropic cache_control mark) holds an entry
 * against LRU and TTL while it lasts, within the budget; a hint over a
 * prefix is an entry of its own naming the prefix's blocks, which stay
 * after the conversation that put them has gone. */
static void test_retention(void **state)
{
    struct thaw_ram_cache *c;
    uint8_t k[THAW_KEY_BYTES], r[THAW_KEY_BYTES], refs[1][THAW_KEY_BYTES];

    (void)state;
    assert_int_equal(thaw_ram_cache_new(300, 50, &c), 0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(put(c, (key(k, i), k), blob(100), 100, NULL, 0, NULL, 0, 10 + i), 0);
    assert_int_equal(thaw_ram_cache_retain(c, (key(k, 0), k), NULL, 0, 1000, 13), 0);
    assert_int_equal(thaw_ram_cache_retain(c, (key(k, 7), k), NULL, 0, 1000, 13), THAW_ENOTFOUND);
    /* room for 3 and 4: 1 and 2 go, though 0 is the least recently used */
    assert_int_equal(put(c, (key(k, 3), k), blob(100), 100, NULL, 0, NULL, 0, 14), 0);
    assert_int_equal(put(c, (key(k, 4), k), blob(100), 100, NULL, 0, NULL, 0, 15), 0);
    assert_non_null(thaw_ram_cache_get(c, (key(k, 0), k), 16));
    assert_null(thaw_ram_cache_get(c, (key(k, 1), k), 16));
    assert_null(thaw_ram_cache_get(c, (key(k, 2), k), 16));
    /* past the TTL, held by the hint; the others go */
    assert_int_equal(thaw_ram_cache_evict(c, 500), 2);
    assert_non_null(thaw_ram_cache_get(c, (key(k, 0), k), 500));
    /* the budget wins: held entries go for room when nothing else is left,
     * the earliest deadline first */
    assert_int_equal(put(c, (key(k, 5), k), blob(100), 100, NULL, 0, NULL, 0, 501), 0);
    assert_int_equal(thaw_ram_cache_retain(c, (key(k, 5), k), NULL, 0, 900, 501), 0);
    assert_int_equal(put(c, (key(k, 6), k), blob(100), 100, NULL, 0, NULL, 0, 502), 0);
    assert_int_equal(put(c, (key(k, 8), k), blob(200), 200, NULL, 0, NULL, 0, 503), 0);
    assert_null(thaw_ram_cache_get(c, (key(k, 5), k), 504)); /* 900 < 1000 */
    assert_non_null(thaw_ram_cache_get(c, (key(k, 0), k), 504));
    /* the hint over: TTL as ever */
    assert_int_equal(thaw_ram_cache_evict(c, 1100), 2);
    assert_int_equal(thaw_ram_cache_count(c), 0);
    thaw_ram_cache_free(c);

    /* a prefix's hint keeps its blocks after their conversation goes */
    assert_int_equal(thaw_ram_cache_new(1000, 0, &c), 0);
    put_blk(c, 1, 100);
    put_blk(c, 2, 100);
    assert_int_equal(put_man(c, 1, 10, (int[]){1, 2}, 2, 1), 0);
    bid(refs[0], 1);
    key(r, 200);
    assert_int_equal(thaw_ram_cache_retain(c, r, refs[0], 1, 100, 2), 0);
    assert_int_equal(thaw_ram_cache_bytes(c), 2 * 100 + 10);
    thaw_ram_cache_remove(c, (key(k, 1), k));
    assert_true(has(c, 1));
    assert_false(has(c, 2));
    assert_null(thaw_ram_cache_get(c, r, 3)); /* no state of its own */
    assert_int_equal(thaw_ram_cache_evict(c, 50), 0);
    assert_true(has(c, 1));
    assert_int_equal(thaw_ram_cache_evict(c, 101), 1); /* over: it goes, and the block */
    assert_false(has(c, 1));
    assert_int_equal(thaw_ram_cache_bytes(c), 0);
    thaw_ram_cache_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lru_and_budget),
        cmocka_unit_test(test_ttl),
        cmocka_unit_test(test_off),
        cmocka_unit_test(test_blocks_held_once),
        cmocka_unit_test(test_blocks_evicted_with_their_last_entry),
        cmocka_unit_test(test_same_key_again_keeps_the_blocks_both_name),
        cmocka_unit_test(test_retention),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
