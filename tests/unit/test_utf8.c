/* test_utf8.c — stream boundaries and sanitising. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"

static void test_complete_len(void **state)
{
    const char *s = "a\xC3\xA9\xE6\x97\xA5"; /* a é 日 */

    (void)state;
    assert_int_equal(thaw_utf8_complete_len(s, 6), 6);
    assert_int_equal(thaw_utf8_complete_len(s, 5), 3); /* 日 cut after 2 of 3 bytes */
    assert_int_equal(thaw_utf8_complete_len(s, 2), 1); /* é cut */
    assert_int_equal(thaw_utf8_complete_len("\xFF" "a", 2), 2); /* invalid counts as complete */
    assert_int_equal(thaw_utf8_complete_len("\xF0\x9F\x98", 3), 0);
}

static void test_sanitize(void **state)
{
    char *o;

    (void)state;
    o = thaw_utf8_sanitize("ok\xC3\xA9", 4);
    assert_string_equal(o, "ok\xC3\xA9");
    free(o);
    o = thaw_utf8_sanitize("a\xFF" "b\xE6\x97", 5);
    assert_string_equal(o, "a\xEF\xBF\xBD" "b\xEF\xBF\xBD\xEF\xBF\xBD");
    free(o);
    o = thaw_utf8_sanitize("\xED\xA0\x80", 3); /* surrogate: invalid */
    assert_int_equal(strlen(o), 9);
    free(o);
    o = thaw_utf8_sanitize("\xC0\xAF", 2); /* overlong */
    assert_int_equal(strlen(o), 6);
    free(o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_complete_len),
        cmocka_unit_test(test_sanitize),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
