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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_refs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
