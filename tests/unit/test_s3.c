/* test_s3.c — the S3 client against a real store: a single-node Ceph RGW
 * started here by scripts/s3store.sh (installed by scripts/setup.sh), never
 * a mock. Create-only puts (the first writer wins: 412), gets, a missing
 * key, a size cap, deletes, a wrong secret, and a store that stops
 * answering (SIGSTOP) costing no more than the deadline. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "s3.h"

static char g_dir[] = "/tmp/thaw_s3_XXXXXX";
static char g_access[128], g_secret[128], g_region[64], g_endpoint[128];

static void env_value(const char *text, const char *name, char *out, size_t n)
{
    char pat[64];
    snprintf(pat, sizeof pat, "export %s=", name);
    const char *p = strstr(text, pat);
    out[0] = '\0';
    if (p) {
        p += strlen(pat);
        size_t len = strcspn(p, "\n");
        snprintf(out, n, "%.*s", (int)(len < n ? len : n - 1), p);
    }
}

static int group_setup(void **state)
{
    char cmd[1024], text[4096] = "";
    (void)state;
    if (!mkdtemp(g_dir))
        return -1;
    snprintf(cmd, sizeof cmd, "bash '%s/scripts/s3store.sh' start '%s/store' > '%s/out' 2>&1", THAW_SOURCE_DIR, g_dir,
             g_dir);
    int rc = system(cmd);
    snprintf(cmd, sizeof cmd, "%s/out", g_dir);
    FILE *f = fopen(cmd, "r");
    if (f) {
        size_t n = fread(text, 1, sizeof text - 1, f);
        text[n] = '\0';
        fclose(f);
    }
    if (rc != 0) {
        fprintf(stderr, "scripts/s3store.sh start failed (packages: scripts/setup.sh):\n%s\n", text);
        return -1;
    }
    env_value(text, "AWS_ACCESS_KEY_ID", g_access, sizeof g_access);
    env_value(text, "AWS_SECRET_ACCESS_KEY", g_secret, sizeof g_secret);
    env_value(text, "AWS_REGION", g_region, sizeof g_region);
    env_value(text, "THAW_S3_ENDPOINT", g_endpoint, sizeof g_endpoint);
    return *g_access && *g_secret && *g_endpoint ? 0 : -1;
}

static int group_teardown(void **state)
{
    char cmd[1024];
    (void)state;
    snprintf(cmd, sizeof cmd, "bash '%s/scripts/s3store.sh' stop '%s/store' >/dev/null 2>&1; rm -rf '%s'",
             THAW_SOURCE_DIR, g_dir, g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static struct thaw_s3 *client(const char *secret, long timeout_ms)
{
    struct thaw_s3_params p = {g_endpoint, "thaw-unit", g_access, secret, g_region, timeout_ms};
    struct thaw_s3 *s = NULL;
    assert_int_equal(thaw_s3_new(&p, &s), 0);
    return s;
}

static void test_put_get_delete(void **state)
{
    (void)state;
    struct thaw_s3 *s = client(g_secret, 5000);
    uint8_t data[3000];
    void *got;
    size_t n;
    for (size_t i = 0; i < sizeof data; i++)
        data[i] = (uint8_t)(i * 7);
    assert_int_equal(thaw_s3_create_bucket(s), 0);
    assert_int_equal(thaw_s3_create_bucket(s), 0); /* exists: fine */
    assert_int_equal(thaw_s3_put(s, "ns/blocks/ab", data, sizeof data, 1), 0);
    /* the first writer won: a second create-only put is refused, the object kept */
    assert_int_equal(thaw_s3_put(s, "ns/blocks/ab", "other", 5, 1), THAW_EEXIST);
    assert_int_equal(thaw_s3_get(s, "ns/blocks/ab", 1 << 20, &got, &n), 0);
    assert_int_equal(n, sizeof data);
    assert_memory_equal(got, data, sizeof data);
    free(got);
    assert_int_equal(thaw_s3_get(s, "ns/blocks/ab", 100, &got, &n), THAW_ETOOBIG);
    assert_null(got);
    assert_int_equal(thaw_s3_get(s, "ns/blocks/none", 1 << 20, &got, &n), THAW_ENOTFOUND);
    assert_int_equal(thaw_s3_delete(s, "ns/blocks/ab"), 0);
    assert_int_equal(thaw_s3_get(s, "ns/blocks/ab", 1 << 20, &got, &n), THAW_ENOTFOUND);
    /* an empty object, a plain (overwriting) put */
    assert_int_equal(thaw_s3_put(s, "empty", "", 0, 0), 0);
    assert_int_equal(thaw_s3_put(s, "empty", "", 0, 0), 0);
    assert_int_equal(thaw_s3_get(s, "empty", 10, &got, &n), 0);
    assert_int_equal(n, 0);
    free(got);
    /* keys that cannot go in a URL as they are */
    assert_int_equal(thaw_s3_put(s, "a b", "x", 1, 0), THAW_EINVAL);
    assert_int_equal(thaw_s3_put(s, "", "x", 1, 0), THAW_EINVAL);
    thaw_s3_free(s);
}

static void test_wrong_secret_is_refused(void **state)
{
    (void)state;
    struct thaw_s3 *s = client("not-the-secret", 5000);
    void *got;
    size_t n;
    assert_int_equal(thaw_s3_get(s, "empty", 10, &got, &n), THAW_ESTORE);
    assert_non_null(strstr(thaw_s3_last_error(s), "HTTP 403"));
    thaw_s3_free(s);
}

static void test_a_stopped_store_costs_the_deadline(void **state)
{
    (void)state;
    char path[512];
    long pid = 0;
    snprintf(path, sizeof path, "%s/store/run/rgw.pid", g_dir);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    assert_int_equal(fscanf(f, "%ld", &pid), 1);
    fclose(f);
    struct thaw_s3 *s = client(g_secret, 400);
    assert_int_equal(kill((pid_t)pid, SIGSTOP), 0);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    int rc = thaw_s3_put(s, "late", "x", 1, 1);
    clock_gettime(CLOCK_MONOTONIC, &b);
    assert_int_equal(kill((pid_t)pid, SIGCONT), 0);
    assert_int_equal(rc, THAW_ETIMEDOUT);
    /* behaviour, not speed: it gave up rather than waiting for the store */
    assert_true(b.tv_sec - a.tv_sec < 30);
    thaw_s3_free(s);
    s = client(g_secret, 10000);
    void *got;
    size_t n;
    assert_int_equal(thaw_s3_get(s, "empty", 10, &got, &n), 0); /* answers again */
    free(got);
    thaw_s3_free(s);
}

static void test_bad_params(void **state)
{
    (void)state;
    struct thaw_s3 *s = NULL;
    struct thaw_s3_params p = {g_endpoint, "bad bucket", "a", "b", NULL, 0};
    assert_int_equal(thaw_s3_new(&p, &s), THAW_EINVAL);
    p.bucket = NULL;
    assert_int_equal(thaw_s3_new(&p, &s), THAW_EINVAL);
    assert_null(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_put_get_delete),
        cmocka_unit_test(test_wrong_secret_is_refused),
        cmocka_unit_test(test_a_stopped_store_costs_the_deadline),
        cmocka_unit_test(test_bad_params),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
