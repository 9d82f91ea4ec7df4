/* test_blob.c — shared buffers: sizes either side of the mapping threshold,
 * references dropped from another thread, the last one frees. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <string.h>

#include "blob.h"

static void test_sizes(void **state)
{
    const size_t sizes[] = {1, 4096, (2u << 20) - 64, (2u << 20) - 63, (2u << 20) + 1, 19u << 20};

    (void)state;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        uint8_t *b = thaw_blob_alloc(sizes[i]);
        assert_non_null(b);
        assert_int_equal((uintptr_t)b % 64, 0);
        memset(b, 0xa5, sizes[i]); /* all of it is writable */
        assert_int_equal(b[sizes[i] - 1], 0xa5);
        thaw_blob_unref(b);
    }
    assert_null(thaw_blob_alloc(0));
    assert_null(thaw_blob_alloc(SIZE_MAX));
    thaw_blob_unref(NULL);
}

static void *drop(void *p)
{
    thaw_blob_unref(p);
    return NULL;
}

static void test_refs(void **state)
{
    pthread_t th;

    (void)state;
    for (int big = 0; big < 2; big++) {
        size_t n = big ? 8u << 20 : 100;
        uint8_t *b = thaw_blob_alloc(n);
        assert_non_null(b);
        memset(b, 7, n);
        assert_ptr_equal(thaw_blob_ref(b), b);
        assert_int_equal(pthread_create(&th, NULL, drop, b), 0);
        assert_int_equal(pthread_join(th, NULL), 0);
        /* one reference is left: the bytes are still ours (ASan/valgrind
         * would flag a use after free here) */
        assert_int_equal(b[n - 1], 7);
        thaw_blob_unref(b);
    }
}

/* A freed mapping comes back for the next alloc it fits, headroom
 * included; one too small is not used. */
static void test_pool(void **state)
{
    const size_t mib = 1u << 20;

    (void)state;
    thaw_blob_pool_drain();
    uint8_t *a = thaw_blob_alloc(8 * mib);
    assert_non_null(a);
    memset(a, 1, 8 * mib);
    thaw_blob_unref(a);
    uint8_t *b = thaw_blob_alloc(9 * mib); /* a turn later: a little longer */
    assert_ptr_equal(b, a);
    memset(b, 2, 9 * mib);
    uint8_t *c = thaw_blob_alloc(8 * mib); /* the pool is empty again */
    assert_ptr_not_equal(c, a);
    thaw_blob_unref(b);
    uint8_t *d = thaw_blob_alloc(64 * mib); /* does not fit the pooled one */
    assert_ptr_not_equal(d, a);
    memset(d, 3, 64 * mib);
    thaw_blob_unref(c);
    thaw_blob_unref(d);
    thaw_blob_pool_drain();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_refs),
        cmocka_unit_test(test_pool),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
