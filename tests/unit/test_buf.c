/* test_buf.c — the growable buffer and the whole-file read. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/error.h"

static void test_append_grows_and_terminates(void **state)
{
    struct thaw_buf b = {0};

    (void)state;
    assert_int_equal(thaw_buf_append(&b, NULL, 0), 0);
    assert_non_null(b.data);
    assert_string_equal(b.data, "");
    for (int i = 0; i < 1000; i++)
        assert_int_equal(thaw_buf_puts(&b, "abc"), 0);
    assert_int_equal(b.len, 3000);
    assert_int_equal(b.data[3000], '\0');
    assert_true(b.cap > b.len);
    assert_int_equal(thaw_buf_printf(&b, "-%d-%s", 42, "x"), 0);
    assert_string_equal(b.data + 3000, "-42-x");
    thaw_buf_truncate(&b, 2);
    assert_string_equal(b.data, "ab");
    char *s = thaw_buf_steal(&b);
    assert_string_equal(s, "ab");
    assert_null(b.data);
    assert_int_equal(b.len, 0);
    free(s);
    thaw_buf_free(&b);
}

static void test_oom_sticks(void **state)
{
    struct thaw_buf b = {0};

    (void)state;
    assert_int_equal(thaw_buf_puts(&b, "x"), 0);
    assert_int_equal(thaw_buf_reserve(&b, (size_t)-1 / 2), THAW_ENOMEM);
    assert_true(b.oom);
    assert_int_equal(thaw_buf_puts(&b, "y"), THAW_ENOMEM);
    assert_string_equal(b.data, "x"); /* kept what it had */
    thaw_buf_free(&b);
    assert_false(b.oom);
}

static void test_read_file(void **state)
{
    char path[] = "/tmp/thaw_buf_XXXXXX";
    int fd = mkstemp(path);
    char *d;
    size_t n;

    (void)state;
    assert_true(fd >= 0);
    char big[40000];
    for (size_t i = 0; i < sizeof big; i++)
        big[i] = (char)('a' + i % 26);
    assert_int_equal(write(fd, big, sizeof big), (ssize_t)sizeof big);
    close(fd);
    assert_int_equal(thaw_read_file(path, 0, &d, &n), 0);
    assert_int_equal(n, sizeof big);
    assert_memory_equal(d, big, sizeof big);
    assert_int_equal(d[n], '\0');
    free(d);
    assert_int_equal(thaw_read_file(path, 1000, &d, &n), THAW_ETOOBIG);
    assert_null(d);
    assert_int_equal(truncate(path, 0), 0);
    assert_int_equal(thaw_read_file(path, 0, &d, &n), 0);
    assert_int_equal(n, 0);
    assert_string_equal(d, "");
    free(d);
    unlink(path);
    assert_int_equal(thaw_read_file(path, 0, &d, NULL), -ENOENT);
    assert_null(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_append_grows_and_terminates),
        cmocka_unit_test(test_oom_sticks),
        cmocka_unit_test(test_read_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
