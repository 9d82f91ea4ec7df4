/* test_keymap.c — the one map of 32-byte keys: find after insert across
 * growth, removal (linked or not), colliding prefixes, and the walk that
 * frees as it goes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "base/keymap.h"

#include <stdlib.h>

struct item {
    uint8_t key[THAW_KEY_BYTES];
    int value;
    struct thaw_keymap_node hn;
};

static void key_of(int i, uint8_t key[THAW_KEY_BYTES])
{
    memset(key, 0xab, THAW_KEY_BYTES); /* equal but for the last bytes: no early memcmp exit */
    key[THAW_KEY_BYTES - 2] = (uint8_t)(i >> 8);
    key[THAW_KEY_BYTES - 1] = (uint8_t)i;
}

static struct item *find(const struct thaw_keymap *m, int i)
{
    uint8_t key[THAW_KEY_BYTES];
    struct thaw_keymap_node *n;

    key_of(i, key);
    n = thaw_keymap_find(m, key);
    return n ? THAW_KEYMAP_OF(n, struct item, hn) : NULL;
}

static void test_finds_every_key_across_growth_and_forgets_removed_ones(void **state)
{
    enum { N = 5000 }; /* 64 buckets at first: grows seven times */
    struct thaw_keymap m;
    struct item *v = calloc(N, sizeof *v);

    (void)state;
    assert_non_null(v);
    assert_int_equal(thaw_keymap_init(&m), 0);
    assert_null(find(&m, 1));
    for (int i = 0; i < N; i++) {
        key_of(i, v[i].key);
        v[i].value = i;
        thaw_keymap_insert(&m, &v[i].hn, v[i].key);
    }
    assert_int_equal(m.n, N);
    assert_true(m.n_b >= N && (m.n_b & (m.n_b - 1)) == 0);
    for (int i = 0; i < N; i++) {
        struct item *it = find(&m, i);
        assert_non_null(it);
        assert_int_equal(it->value, i);
    }
    assert_null(find(&m, N)); /* a key never inserted */
    for (int i = 0; i < N; i += 2)
        assert_int_equal(thaw_keymap_remove(&m, &v[i].hn), 1);
    assert_int_equal(thaw_keymap_remove(&m, &v[0].hn), 0); /* not linked any more */
    assert_int_equal(m.n, N / 2);
    for (int i = 0; i < N; i++)
        assert_true((find(&m, i) != NULL) == (i % 2 == 1));
    thaw_keymap_fini(&m);
    assert_null(find(&m, 1)); /* a finished map finds nothing, and does not crash */
    free(v);
}

static void test_walk_may_free_the_node_it_stands_on(void **state)
{
    enum { N = 300 };
    struct thaw_keymap m;
    int seen = 0, sum = 0;

    (void)state;
    assert_int_equal(thaw_keymap_init(&m), 0);
    for (int i = 0; i < N; i++) {
        struct item *it = calloc(1, sizeof *it);
        assert_non_null(it);
        key_of(i, it->key);
        it->value = i;
        thaw_keymap_insert(&m, &it->hn, it->key);
    }
    THAW_KEYMAP_EACH(&m, b, n, nx)
    {
        struct item *it = THAW_KEYMAP_OF(n, struct item, hn);

        seen++;
        sum += it->value;
        if (it->value % 3 == 0) {
            assert_int_equal(thaw_keymap_remove(&m, n), 1);
            free(it);
        }
    }
    assert_int_equal(seen, N); /* each node once, removals included */
    assert_int_equal(sum, N * (N - 1) / 2);
    assert_int_equal(m.n, N - (N + 2) / 3);
    THAW_KEYMAP_EACH(&m, b, n, nx)
    {
        thaw_keymap_remove(&m, n);
        free(THAW_KEYMAP_OF(n, struct item, hn));
    }
    assert_int_equal(m.n, 0);
    thaw_keymap_fini(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_finds_every_key_across_growth_and_forgets_removed_ones),
        cmocka_unit_test(test_walk_may_free_the_node_it_stands_on),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
