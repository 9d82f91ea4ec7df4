/* test_blob.c — shared buffers: sizes either side of the mapping threshold,
 * references dropped from another thread, the last one frees. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/blob.h"

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

/* Pages of [p, p + n) the process has in memory (mincore). */
static size_t resident(const void *p, size_t n)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)(pg - 1);
    size_t len = (uintptr_t)p + n - a, np = (len + pg - 1) / pg, in = 0;
    unsigned char *v = malloc(np);
    assert_non_null(v);
    assert_int_equal(mincore((void *)a, len, v), 0);
    for (size_t i = 0; i < np; i++)
        in += v[i] & 1;
    free(v);
    return in;
}

/* thaw_blob_pool_warm: the next alloc of that size gets pages already in
 * (a restore after a start costs its copy only); and a full pool keeps the
 * largest mappings, whose first touch would cost the most again. */
static void test_pool_warm_and_keep_the_largest(void **state)
{
    const size_t mib = 1u << 20, pg = (size_t)sysconf(_SC_PAGESIZE);

    (void)state;
    thaw_blob_pool_drain();
    uint8_t *cold = thaw_blob_alloc(48 * mib);
    assert_non_null(cold);
    assert_true(resident(cold, 48 * mib) < 48 * mib / pg / 2); /* fresh: not in yet */
    thaw_blob_unref(cold);
    thaw_blob_pool_drain();

    assert_int_equal(thaw_blob_pool_warm(64 * mib), 64 * mib);
    assert_int_equal(thaw_blob_pool_warm(1000), 0); /* malloc'd sizes are not pooled */
    uint8_t *w = thaw_blob_alloc(60 * mib);
    assert_non_null(w);
    assert_int_equal(resident(w, 60 * mib), (60 * mib + pg - 1) / pg + ((uintptr_t)w % pg != 0));

    /* four small freed mappings fill the pool; the large one freed after
     * them is kept, in place of the smallest */
    uint8_t *small[4];
    for (int i = 0; i < 4; i++) {
        assert_non_null(small[i] = thaw_blob_alloc((4 + (size_t)i) * mib));
        memset(small[i], 1, (4 + (size_t)i) * mib);
    }
    for (int i = 0; i < 4; i++)
        thaw_blob_unref(small[i]);
    thaw_blob_unref(w);
    uint8_t *again = thaw_blob_alloc(60 * mib);
    assert_ptr_equal(again, w);
    assert_true(resident(again, 60 * mib) >= 60 * mib / pg); /* the same pages, not a new mapping there */
    thaw_blob_unref(again);
    uint8_t *s5 = thaw_blob_alloc(5 * mib); /* 5, 6, 7 MiB are still there */
    assert_ptr_equal(s5, small[1]);
    thaw_blob_unref(s5);
    thaw_blob_pool_drain();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_refs),
        cmocka_unit_test(test_pool),
        cmocka_unit_test(test_pool_warm_and_keep_the_largest),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
