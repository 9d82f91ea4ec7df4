/* test_webui.c — the embedded page's table: what is found, and that nothing
 * outside the table is. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "http/webui.h"

static void test_table_serves_the_page_and_nothing_else(void **state)
{
    (void)state;
    if (thaw_webui_n_files == 0)
        skip(); /* built without the page's libraries (scripts/setup.sh) */
    const struct thaw_webui_file *f = thaw_webui_find("/");
    assert_non_null(f);
    assert_string_equal(f->content_type, "text/html; charset=utf-8");
    assert_non_null(strstr((const char *)f->data, "<script type=\"module\" src=\"webui/app.js\">"));
    assert_int_equal(f->data[f->n_data], 0); /* NUL past the end: a C string */
    f = thaw_webui_find("/webui/app.js");
    assert_non_null(f);
    assert_string_equal(f->content_type, "text/javascript; charset=utf-8");
    assert_non_null(thaw_webui_find("/webui/vendor/purify.js"));
    assert_string_equal(thaw_webui_find("/webui/vendor/uPlot.css")->content_type, "text/css; charset=utf-8");
    assert_null(thaw_webui_find("/index.html"));
    assert_null(thaw_webui_find("/webui/"));
    assert_null(thaw_webui_find("/webui/../CMakeLists.txt"));
    assert_null(thaw_webui_find("/webui/app.js/"));
    assert_null(thaw_webui_find(""));
}

static void test_headers_carry_a_strict_csp(void **state)
{
    const char *csp = NULL;

    (void)state;
    for (const char *const *h = thaw_webui_headers; h[0]; h += 2)
        if (strcmp(h[0], "Content-Security-Policy") == 0)
            csp = h[1];
    assert_non_null(csp);
    assert_non_null(strstr(csp, "script-src 'self'"));
    assert_non_null(strstr(csp, "connect-src 'self'"));
    assert_null(strstr(csp, "unsafe"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_serves_the_page_and_nothing_else),
        cmocka_unit_test(test_headers_carry_a_strict_csp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
