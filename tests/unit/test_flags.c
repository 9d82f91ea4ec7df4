/* test_flags.c — the table-driven command-line parser (cli/flags.h): every
 * kind, the value syntaxes, positional arguments, errors, and --help from
 * the table. serve's own table is test_config.c's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "cli/flags.h"

struct opts {
    int n;
    uint64_t big;
    size_t bytes;
    float f;
    const char *name;
    bool on, off;
    int fn_calls;
    const char *fn_value;
    int noops;
    const char *pos[4];
    int n_pos;
};

static int fn_count(void *dst, const struct thaw_flag *f, const char *flag, const char *v)
{
    struct opts *o = dst;

    assert_non_null(f);
    if (v && !strcmp(v, "bad")) {
        fprintf(stderr, "test: %s: bad\n", flag);
        return THAW_EINVAL;
    }
    o->fn_calls++;
    o->fn_value = v;
    return 0;
}

static int take_pos(void *dst, const char *arg)
{
    struct opts *o = dst;

    if (o->n_pos == 4)
        return THAW_EINVAL;
    o->pos[o->n_pos++] = arg;
    return 0;
}

static void count_noop(void *dst, const struct thaw_flag *f)
{
    (void)f;
    ((struct opts *)dst)->noops++;
}

#define OFF(f) offsetof(struct opts, f)

static const struct thaw_flag table[] = {
    {"-n,--number", "N", THAW_FLAG_INT, OFF(n), -1, 10, "a number", NULL},
    {"--big", "N", THAW_FLAG_U64, OFF(big), 0, 1e12, "a big one", NULL},
    {"--bytes", "B", THAW_FLAG_SIZE, OFF(bytes), 1, 1 << 20, "bytes", NULL},
    {"--ratio", "F", THAW_FLAG_FLOAT, OFF(f), 0, 1, "a ratio", NULL},
    {"--name", "NAME", THAW_FLAG_STR, OFF(name), 0, 0, "a name\non two lines", NULL},
    {"--on", NULL, THAW_FLAG_TRUE, OFF(on), 0, 0, "switch on", NULL},
    {"--no-off", NULL, THAW_FLAG_FALSE, OFF(off), 0, 0, "switch off", NULL},
    {"--fn", "V", THAW_FLAG_FN, 0, 0, 0, "its own", fn_count},
    {"--fn-switch", NULL, THAW_FLAG_FN, 0, 0, 0, "its own, no value", fn_count},
    {"--old", NULL, THAW_FLAG_NOOP, 0, 0, 0, "does nothing here", NULL},
    {"--never", "X", THAW_FLAG_REFUSE, 0, 0, 0, "not on this command", NULL},
};

static const struct thaw_flags t = {
    .prog = "test",
    .see = "test cmd",
    .flags = table,
    .n_flags = sizeof table / sizeof table[0],
    .positional = take_pos,
    .noop = count_noop,
    .width = 16,
};

static int parse(const struct thaw_flags *tab, struct opts *o, int argc, const char **argv)
{
    memset(o, 0, sizeof *o);
    o->off = true;
    return thaw_flags_parse(tab, o, argc, (char **)argv);
}

static void test_every_kind(void **state)
{
    struct opts o;
    const char *argv[] = {
        "cmd",      "-n",   "-1", "--big=1000000000000", "--bytes", "4096", "--ratio", "0.5", "--name", "x", "--on",
        "--no_off", "--fn", "v",  "--fn-switch",         "--old",   "DIR",  "-",       "KEY"};

    (void)state;
    assert_int_equal(parse(&t, &o, sizeof argv / sizeof *argv, argv), 0);
    assert_int_equal(o.n, -1);
    assert_true(o.big == 1000000000000ull);
    assert_int_equal(o.bytes, 4096);
    assert_true(o.f == 0.5f);
    assert_string_equal(o.name, "x");
    assert_true(o.on);
    assert_false(o.off); /* --no_off reads as --no-off */
    assert_int_equal(o.fn_calls, 2);
    assert_null(o.fn_value); /* the switch's: no value */
    assert_int_equal(o.noops, 1);
    assert_int_equal(o.n_pos, 3); /* "-" is an argument, not a flag */
    assert_string_equal(o.pos[0], "DIR");
    assert_string_equal(o.pos[1], "-");
    assert_string_equal(o.pos[2], "KEY");
}

static void test_help_anywhere(void **state)
{
    static const char *const helps[] = {"-h", "--help", "--usage"};
    struct opts o;

    (void)state;
    for (size_t i = 0; i < 3; i++) {
        const char *argv[] = {"cmd", "--on", helps[i], "--bogus"};
        assert_int_equal(parse(&t, &o, 4, argv), 1);
    }
}

static void test_rejects(void **state)
{
    static const char *const bad[][3] = {
        {"--bogus", NULL},      {"-n", "11", NULL},     {"-n", "1.5", NULL},  {"-n", "x", NULL},
        {"--bytes", "0", NULL}, {"--ratio", "2", NULL}, {"--name", "", NULL}, {"--name", NULL},
        {"--on=1", NULL},       {"--fn", "bad", NULL},  {"--never", NULL},    {"--never=x", NULL},
    };
    struct opts o;

    (void)state;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *argv[4] = {"cmd"};
        int n = 1;
        for (int j = 0; bad[i][j]; j++)
            argv[n++] = bad[i][j];
        if (parse(&t, &o, n, argv) != THAW_EINVAL)
            fail_msg("accepted: %s %s", bad[i][0], bad[i][1] ? bad[i][1] : "");
    }
}

static void test_no_positional(void **state)
{
    struct thaw_flags strict = t;
    struct opts o;
    const char *argv[] = {"cmd", "stray"};

    (void)state;
    strict.positional = NULL;
    assert_int_equal(parse(&strict, &o, 2, argv), THAW_EINVAL);
}

static void test_usage_from_the_table(void **state)
{
    static char buf[8192];
    struct opts d = {.n = 3, .name = "dflt", .f = 0.25f};
    FILE *f = fmemopen(buf, sizeof buf, "w");

    (void)state;
    thaw_flags_usage(f, &t, NULL, &d, NULL);
    fclose(f);
    /* the names padded to 16 columns, the help after two spaces */
    assert_non_null(strstr(buf, "  -n,--number N     a number [default: 3]\n"));
    assert_non_null(strstr(buf, "  --name NAME       a name\n                    on two lines [default: dflt]\n"));
    assert_non_null(strstr(buf, "  --ratio F         a ratio [default: 0.25]\n"));
    assert_non_null(strstr(buf, "  --on              switch on\n"));
    assert_null(strstr(buf, "--old")); /* NOOP and REFUSE: not among the flags */
    assert_null(strstr(buf, "--never"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_kind),
        cmocka_unit_test(test_help_anywhere),
        cmocka_unit_test(test_rejects),
        cmocka_unit_test(test_no_positional),
        cmocka_unit_test(test_usage_from_the_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
