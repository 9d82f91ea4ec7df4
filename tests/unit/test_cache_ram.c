/* test_cache_ram.c — the RAM tier: budget, LRU order, TTL, replacement. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "blob.h"
#include "cache_ram.h"
#include "error.h"

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lru_and_budget),
        cmocka_unit_test(test_ttl),
        cmocka_unit_test(test_off),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
