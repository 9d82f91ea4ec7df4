/* test_preset.c — the --models-preset INI reader (cli/preset.h): sections
 * and their key/value lines with their line numbers, comments, blanks and
 * CRLF, and each malformed line refused with its FILE:LINE. Applying a
 * section's keys as flags is cli/config.c's (tests/e2e/test_models.py). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

#include "base/error.h"
#include "cli/preset.h"

static char path[64];

static void write_file(const char *text)
{
    FILE *f;

    snprintf(path, sizeof path, "/tmp/thaw_test_preset_%d.ini", (int)getpid());
    f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* Parses text; 0 or the error, with what it printed on stderr in err. */
static int parse(const char *text, struct thaw_preset **out, char *err, size_t cap)
{
    char errpath[80];
    int rc, saved, fd;

    write_file(text);
    snprintf(errpath, sizeof errpath, "%s.err", path);
    fflush(stderr);
    saved = dup(2);
    fd = open(errpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(saved >= 0 && fd >= 0);
    dup2(fd, 2);
    close(fd);
    rc = thaw_preset_read(path, out);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    FILE *f = fopen(errpath, "r");
    size_t n = f ? fread(err, 1, cap - 1, f) : 0;
    err[n] = '\0';
    if (f)
        fclose(f);
    unlink(errpath);
    unlink(path);
    return rc;
}

static void test_sections_keys_and_lines(void **state)
{
    struct thaw_preset *p;
    char err[512];

    (void)state;
    assert_int_equal(parse("version = 1\n"
                           "; a comment\n"
                           "# another\n"
                           "\n"
                           "[*]\r\n"
                           "c = 8192 ; trailing comment\n"
                           "  [ alpha ]  \n"
                           "n_gpu_layers=99\n"
                           "alias = a, claude-3-5-haiku-latest\n"
                           "model = /m/x.gguf",
                           &p, err, sizeof err),
                     0);
    assert_int_equal(p->n, 2);
    assert_string_equal(p->sections[0].name, "*");
    assert_int_equal(p->sections[0].line, 5);
    assert_int_equal(p->sections[0].n_kv, 1);
    assert_string_equal(p->sections[0].kv[0].key, "c");
    assert_string_equal(p->sections[0].kv[0].value, "8192");
    assert_int_equal(p->sections[0].kv[0].line, 6);
    const struct thaw_preset_section *a = thaw_preset_section(p, "alpha");
    assert_non_null(a);
    assert_int_equal(a->line, 7);
    assert_int_equal(a->n_kv, 3);
    assert_string_equal(a->kv[0].key, "n_gpu_layers");
    assert_string_equal(a->kv[0].value, "99");
    assert_string_equal(a->kv[1].value, "a, claude-3-5-haiku-latest");
    assert_string_equal(a->kv[2].value, "/m/x.gguf"); /* the last line has no newline */
    assert_int_equal(a->kv[2].line, 10);
    assert_null(thaw_preset_section(p, "beta"));
    thaw_preset_free(p);
}

static void test_malformed_lines_name_file_and_line(void **state)
{
    static const struct {
        const char *text, *says;
    } bad[] = {
        {"[alpha]\nc = 1\nnot a setting\n", ":3: expected KEY = VALUE"},
        {"[alpha\n", ":1: a section header is [NAME]"},
        {"[]\n", ":1: a section needs a name"},
        {"c = 4096\n", ":1: a setting before any section"},
        {"[a]\n9c = 1\n", ":2: not a key"},
        {"[a]\nc = 1\n[b]\n[a]\n", ":4: section [a] again (first at line 1)"},
    };
    char err[512];

    (void)state;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct thaw_preset *p = (struct thaw_preset *)1;
        assert_int_equal(parse(bad[i].text, &p, err, sizeof err), THAW_EINVAL);
        assert_null(p);
        if (!strstr(err, bad[i].says) || !strstr(err, path))
            fail_msg("%s: got '%s', want '%s'", bad[i].text, err, bad[i].says);
    }
}

static void test_a_missing_file_is_an_error(void **state)
{
    struct thaw_preset *p;

    (void)state;
    assert_int_equal(thaw_preset_read("/nonexistent/thaw.ini", &p), THAW_EINVAL);
    assert_null(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sections_keys_and_lines),
        cmocka_unit_test(test_malformed_lines_name_file_and_line),
        cmocka_unit_test(test_a_missing_file_is_an_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
