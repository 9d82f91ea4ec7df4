/* test_tokens.c — token-array growth cannot overflow, common prefixes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <limits.h>
#include <stdlib.h>

#include "base/error.h"
#include "llama/tokens.h"

static void test_reserve_grows_and_keeps(void **state)
{
    llama_token *v = NULL;
    int cap = 0;

    (void)state;
    assert_int_equal(thaw_tokens_reserve(&v, &cap, 10), 0);
    assert_int_equal(cap, 256);
    v[9] = 7;
    assert_int_equal(thaw_tokens_reserve(&v, &cap, 1000), 0);
    assert_int_equal(cap, 1024);
    assert_int_equal(v[9], 7);
    assert_int_equal(thaw_tokens_reserve(&v, &cap, 5), 0); /* never shrinks */
    assert_int_equal(cap, 1024);
    free(v);
}

/* The old doubling (`c *= 2` from 256) overflowed for n > 2^30 and looped
 * forever: a request's max_tokens reached it. */
static void test_reserve_near_int_max_terminates(void **state)
{
    llama_token *v = NULL;
    int cap = 0;

    (void)state;
    int rc = thaw_tokens_reserve(&v, &cap, (1 << 30) + 1);
    /* 4 GiB may or may not be granted here; either way it returns */
    assert_true(rc == 0 || rc == THAW_ENOMEM);
    if (rc == 0)
        assert_true(cap >= (1 << 30) + 1);
    free(v);
    v = NULL;
    cap = 1 << 30;
    rc = thaw_tokens_reserve(&v, &cap, INT_MAX);
    assert_true(rc == 0 || rc == THAW_ENOMEM);
    if (rc == 0) {
        assert_int_equal(cap, INT_MAX);
        free(v);
    }
    v = NULL;
    cap = 0;
    assert_int_equal(thaw_tokens_reserve(&v, &cap, -5), 0); /* nothing to do: n <= cap */
    assert_null(v);
}

static void test_lcp(void **state)
{
    const llama_token a[] = {1, 2, 3, 4}, b[] = {1, 2, 9};

    (void)state;
    assert_int_equal(thaw_lcp(a, 4, b, 3), 2);
    assert_int_equal(thaw_lcp(a, 4, a, 4), 4);
    assert_int_equal(thaw_lcp(a, 0, b, 3), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reserve_grows_and_keeps),
        cmocka_unit_test(test_reserve_near_int_max_terminates),
        cmocka_unit_test(test_lcp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
