/* test_config.c — flag parsing, bounds and defaults. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "error.h"

static int parse(struct thaw_config *c, int argc, const char **argv)
{
    thaw_config_init(c);
    return thaw_config_parse(c, argc, (char **)argv);
}

static void test_defaults_and_values(void **state)
{
    struct thaw_config c;
    const char *argv[] = {"serve", "-m", "x.gguf", "-c", "8192", "-np", "2", "--port=9000", "--api-key", "a,b",
                          "--api-key", "c", "--no-cache-prompt", "--kv-cache-dir", "/tmp/k", "--kv-cache-max", "100",
                          "--slot-prompt-similarity", "0.5", "--metrics"};

    (void)state;
    assert_int_equal(parse(&c, sizeof argv / sizeof *argv, argv), 0);
    assert_string_equal(c.model_path, "x.gguf");
    assert_int_equal(c.n_ctx, 8192);
    assert_int_equal(c.n_parallel, 2);
    assert_int_equal(c.port, 9000);
    assert_int_equal(c.n_api_keys, 3);
    assert_string_equal(c.api_keys[1], "b");
    assert_string_equal(c.api_keys[2], "c");
    assert_false(c.cache_prompt);
    assert_string_equal(c.kv_cache_dir, "/tmp/k");
    assert_int_equal(c.kv_cache_max_mib, 100);
    assert_int_equal(c.kv_cache_ttl_s, 259200);
    assert_int_equal(c.kv_cache_min_tokens, 256);
    assert_int_equal(c.cache_ram_mib, 8192);
    assert_true(c.n_threads >= 1 && c.n_threads_batch == c.n_threads);
    thaw_config_free(&c);
}

static void test_rejects(void **state)
{
    static const char *const bad[][4] = {
        {"-np", "0", NULL},      {"-c", "abc", NULL},         {"--port", "70000", NULL},
        {"--bogus", NULL},       {"-c", NULL},                {"--slot-prompt-similarity", "2", NULL},
        {"--metrics=1", NULL},   {"-t", "1.5", NULL},
    };
    struct thaw_config c;

    (void)state;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *argv[8] = {"serve", "-m", "x.gguf"};
        int n = 3;
        for (int j = 0; bad[i][j]; j++)
            argv[n++] = bad[i][j];
        if (parse(&c, n, argv) != THAW_EINVAL)
            fail_msg("case %zu accepted", i);
        thaw_config_free(&c);
    }
    const char *nomodel[] = {"serve", "-c", "100"};
    assert_int_equal(parse(&c, 3, nomodel), THAW_EINVAL);
    thaw_config_free(&c);
}

static void test_empty_api_keys_refused(void **state)
{
    struct thaw_config c;
    static const char *const bad[] = {"", ",", "a,", ",a", "a,,b"};

    (void)state;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *argv[] = {"serve", "-m", "x.gguf", "--api-key", bad[i]};
        if (parse(&c, 5, argv) != THAW_EINVAL)
            fail_msg("--api-key '%s' was accepted", bad[i]);
        thaw_config_free(&c);
    }
    const char *ok[] = {"serve", "-m", "x.gguf", "--api-key", "a,b"};
    assert_int_equal(parse(&c, 5, ok), 0);
    assert_int_equal(c.n_api_keys, 2);
    thaw_config_free(&c);
}

static void test_http_limits(void **state)
{
    struct thaw_config c;
    const char *argv[] = {"serve", "-m", "x.gguf", "--threads-http", "2", "--max-connections", "50",
                          "--max-connections-per-client", "0", "-to", "5"};

    (void)state;
    assert_int_equal(parse(&c, sizeof argv / sizeof *argv, argv), 0);
    assert_int_equal(c.threads_http, 2);
    assert_int_equal(c.max_connections, 50);
    assert_int_equal(c.max_per_client, 0);
    assert_int_equal(c.timeout_s, 5);
    const char *zero[] = {"serve", "-m", "x.gguf", "--timeout", "0"};
    assert_int_equal(parse(&c, 5, zero), THAW_EINVAL);
    thaw_config_free(&c);
}

static void test_help_lists_every_flag(void **state)
{
    char buf[16384];
    FILE *f = fmemopen(buf, sizeof buf, "w");

    (void)state;
    thaw_config_usage(f);
    fclose(f);
    static const char *const flags[] = {"--kv-cache-dir", "--kv-cache-ttl", "--cache-ram", "--ctx-checkpoints",
                                        "-np,--parallel", "--api-key", "--max-queue", "[default: 259200]"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (!strstr(buf, flags[i]))
            fail_msg("--help lacks %s", flags[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_and_values),
        cmocka_unit_test(test_rejects),
        cmocka_unit_test(test_empty_api_keys_refused),
        cmocka_unit_test(test_http_limits),
        cmocka_unit_test(test_help_lists_every_flag),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
