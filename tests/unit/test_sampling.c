/* test_sampling.c — sampler names, letters and DRY breakers as llama-server reads them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "base/error.h"
#include "base/sampling.h"

static void test_defaults_are_llama_servers(void **state)
{
    struct thaw_sampling s;
    char order[200];

    (void)state;
    thaw_sampling_default(&s);
    assert_true(s.temp == 0.8f && s.top_k == 40 && s.top_p == 0.95f && s.min_p == 0.05f);
    assert_int_equal(s.penalty_last_n, 64);
    assert_true(s.penalty_repeat == 1.0f && s.dry_multiplier == 0.0f && s.top_n_sigma < 0);
    assert_int_equal(s.seed, 0xFFFFFFFFu);
    thaw_sampling_stages_str(&s, order, sizeof order);
    assert_string_equal(order, "penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature");
    assert_int_equal(s.n_dry_breakers, 4);
}

static void test_names_aliases_and_letters(void **state)
{
    struct thaw_sampling s;
    char err[200], order[200];

    (void)state;
    thaw_sampling_default(&s);
    /* canonical, kebab-case, no-dash and the misc aliases, any case */
    assert_int_equal(thaw_sampling_set_stages(&s, "top_k;Top-P;minp;nucleus;temp;typ;adaptive_p", err, sizeof err), 0);
    thaw_sampling_stages_str(&s, order, sizeof order);
    assert_string_equal(order, "top_k;top_p;min_p;top_p;temperature;typ_p;adaptive_p");
    assert_int_equal(thaw_sampling_set_stages(&s, "top_k;bogus", err, sizeof err), THAW_EINVAL);
    assert_non_null(strstr(err, "bogus"));
    thaw_sampling_stages_str(&s, order, sizeof order); /* unchanged on error */
    assert_string_equal(order, "top_k;top_p;min_p;top_p;temperature;typ_p;adaptive_p");
    assert_int_equal(thaw_sampling_set_seq(&s, "edskypmxt", err, sizeof err), 0);
    thaw_sampling_stages_str(&s, order, sizeof order);
    assert_string_equal(order, "penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature");
    assert_int_equal(thaw_sampling_set_seq(&s, "kq", err, sizeof err), THAW_EINVAL);
}

static void test_breakers(void **state)
{
    struct thaw_sampling s;
    char err[200], big[400];

    (void)state;
    thaw_sampling_default(&s);
    assert_string_equal(s.dry_breakers, "\n");
    assert_int_equal(thaw_sampling_add_breaker(&s, true, "none", err, sizeof err), 0);
    assert_int_equal(s.n_dry_breakers, 0);
    assert_int_equal(thaw_sampling_add_breaker(&s, false, "a\\tb", err, sizeof err), 0);
    assert_string_equal(s.dry_breakers, "a\tb");
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    assert_int_equal(thaw_sampling_add_breaker(&s, false, big, err, sizeof err), THAW_EINVAL);
    assert_int_equal(s.n_dry_breakers, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_are_llama_servers),
        cmocka_unit_test(test_names_aliases_and_letters),
        cmocka_unit_test(test_breakers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
