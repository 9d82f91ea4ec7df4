/* test_s3.c — the S3 client against a real store: a single-node Ceph RGW
 * started here by scripts/s3store.sh (installed by scripts/setup.sh), never
 * a mock. Create-only puts (the first writer wins: 412), gets, a missing
 * key, a size cap, deletes, a wrong secret, and a store that stops
 * answering (SIGSTOP) costing no more than the deadline. Listings: keys
 * that need encoding (in the path, the prefix and continuation tokens),
 * pages of every size, deleting while listing, a missing bucket; and the
 * page parser on garbled replies no real store sends. */
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

#include "base/error.h"
#include "cache/s3.h"

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
    /* no object has an empty key */
    assert_int_equal(thaw_s3_put(s, "", "x", 1, 0), THAW_EINVAL);
    thaw_s3_free(s);
}

/* ---- listings ----------------------------------------------------------- */

/* Keys that need encoding: in a path, SigV4 signs them %XX-encoded
 * except unreserved bytes and '/', and RGW hands back '+' '/' '=' in the
 * continuation token (it is the last key) and &amp; &apos; &#x01; in XML. */
static const char *const g_odd[] = {
    "ls/a",        "ls/a+b=c/d", "ls/dir/./x/../y",      "ls/s p&q", "ls/t*~!'()", "ls/x y",
    "ls/\x01\x1f", "ls/\"<>#?%", "ls/\xc3\xa9t\xc3\xa9", /* été */
};
#define N_ODD (sizeof g_odd / sizeof *g_odd)

struct seen {
    char keys[64][64];
    uint64_t size[64];
    int64_t mtime[64];
    size_t n, stop_at;   /* stop_at: return 7 from the callback at this object (0: never) */
    struct thaw_s3 *del; /* delete each object as it is listed */
};

static int on_object(void *ud, const struct thaw_s3_object *o)
{
    struct seen *v = ud;
    assert_true(v->n < 64 && strlen(o->key) < 64);
    snprintf(v->keys[v->n], sizeof v->keys[v->n], "%s", o->key);
    v->size[v->n] = o->size;
    v->mtime[v->n] = o->last_modified;
    v->n++;
    if (v->del)
        assert_int_equal(thaw_s3_delete(v->del, o->key), 0);
    return v->n == v->stop_at ? 7 : 0;
}

static int strcmp_p(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void test_list(void **state)
{
    (void)state;
    struct thaw_s3_params p = {g_endpoint, "thaw-list", g_access, g_secret, g_region, 5000};
    struct thaw_s3 *s = NULL;
    struct seen v;
    const char *sorted[N_ODD];
    int64_t t0 = (int64_t)time(NULL);

    assert_int_equal(thaw_s3_new(&p, &s), 0);
    /* a bucket that does not exist: the store's answer, in words */
    memset(&v, 0, sizeof v);
    assert_int_equal(thaw_s3_list(s, "", on_object, &v), THAW_ESTORE);
    assert_non_null(strstr(thaw_s3_last_error(s), "HTTP 404 NoSuchBucket"));
    assert_int_equal(thaw_s3_last_status(s), 404);
    assert_int_equal(thaw_s3_create_bucket(s), 0);
    /* empty: the whole bucket, a prefix */
    assert_int_equal(thaw_s3_list(s, "", on_object, &v), 0);
    assert_int_equal(thaw_s3_list(s, NULL, on_object, &v), 0);
    assert_int_equal(thaw_s3_list(s, "ls/", on_object, &v), 0);
    assert_int_equal(v.n, 0);

    for (size_t i = 0; i < N_ODD; i++) {
        void *got;
        size_t n;
        assert_int_equal(thaw_s3_put(s, g_odd[i], g_odd[i], i + 1, 1), 0);
        /* each is its own object, reached by its name */
        assert_int_equal(thaw_s3_get(s, g_odd[i], 100, &got, &n), 0);
        assert_int_equal(n, i + 1);
        assert_memory_equal(got, g_odd[i], n);
        free(got);
        sorted[i] = g_odd[i];
    }
    /* near the prefix, not under it */
    assert_int_equal(thaw_s3_put(s, "ls", "x", 1, 0), 0);
    assert_int_equal(thaw_s3_put(s, "lsx/a", "x", 1, 0), 0);
    assert_int_equal(thaw_s3_put(s, "other/ls/a", "x", 1, 0), 0);
    qsort(sorted, N_ODD, sizeof *sorted, strcmp_p); /* S3 lists in byte order */

    /* every page size gives the same listing: 1 makes every key a token */
    for (int page = 0; page <= 4; page++) {
        thaw_s3_set_list_page(s, page);
        memset(&v, 0, sizeof v);
        assert_int_equal(thaw_s3_list(s, "ls/", on_object, &v), 0);
        assert_int_equal(v.n, N_ODD);
        for (size_t i = 0; i < N_ODD; i++) {
            assert_string_equal(v.keys[i], sorted[i]);
            size_t at = 0;
            while (strcmp(g_odd[at], sorted[i]))
                at++;
            assert_int_equal(v.size[i], at + 1);
            /* the store's clock is this machine's */
            assert_true(v.mtime[i] >= t0 - 5 && v.mtime[i] <= (int64_t)time(NULL) + 5);
        }
    }
    /* the whole bucket; a prefix that is a key's own prefix of bytes */
    thaw_s3_set_list_page(s, 3);
    memset(&v, 0, sizeof v);
    assert_int_equal(thaw_s3_list(s, "", on_object, &v), 0);
    assert_int_equal(v.n, N_ODD + 3);
    memset(&v, 0, sizeof v);
    assert_int_equal(thaw_s3_list(s, "ls", on_object, &v), 0);
    assert_int_equal(v.n, N_ODD + 2);
    /* a prefix that matches nothing, one that needs encoding */
    memset(&v, 0, sizeof v);
    assert_int_equal(thaw_s3_list(s, "ls/zz", on_object, &v), 0);
    assert_int_equal(thaw_s3_list(s, "nothing here/+=&", on_object, &v), 0);
    assert_int_equal(v.n, 0);
    assert_int_equal(thaw_s3_list(s, "ls/s p&", on_object, &v), 0);
    assert_int_equal(v.n, 1);
    assert_string_equal(v.keys[0], "ls/s p&q");
    /* the callback stops it, on a page boundary and inside a page */
    for (size_t stop = 2; stop <= 3; stop++) {
        memset(&v, 0, sizeof v);
        v.stop_at = stop;
        assert_int_equal(thaw_s3_list(s, "ls/", on_object, &v), 7);
        assert_int_equal(v.n, stop);
    }
    /* deleting what it was given, with the same client, as gc does */
    memset(&v, 0, sizeof v);
    v.del = s;
    assert_int_equal(thaw_s3_list(s, "ls/", on_object, &v), 0);
    assert_int_equal(v.n, N_ODD);
    memset(&v, 0, sizeof v);
    assert_int_equal(thaw_s3_list(s, "", on_object, &v), 0);
    assert_int_equal(v.n, 3); /* only those outside the prefix are left */
    assert_string_equal(v.keys[0], "ls");
    assert_string_equal(v.keys[1], "lsx/a");
    assert_string_equal(v.keys[2], "other/ls/a");
    thaw_s3_free(s);
}

/* ---- the page parser on replies no real store sends ---- */

static int parse(const char *xml, const char *prefix, struct seen *v, int *truncated, char **token)
{
    char err[128];
    memset(v, 0, sizeof *v);
    int rc = thaw_s3_list_parse(xml, strlen(xml), prefix, on_object, v, truncated, token, err, sizeof err);
    if (rc == THAW_ECORRUPT) {
        assert_true(err[0] != '\0'); /* says why */
        assert_int_equal(v->n, 0);   /* nothing of a bad page is delivered */
        assert_null(*token);
    }
    return rc;
}

#define HEAD "<?xml version=\"1.0\"?><ListBucketResult xmlns=\"x\"><Name>b</Name>"
#define OBJ(k, t, n) "<Contents><Key>" k "</Key><LastModified>" t "</LastModified><Size>" n "</Size></Contents>"
#define T0 "2026-11-30T08:59:32.123Z"
#define T1970 "1970-01-01T00:00:00Z"
#define TOKEN "<NextContinuationToken>a+b/c=&amp;</NextContinuationToken></ListBucketResult>"

static void test_list_parse(void **state)
{
    (void)state;
    struct seen v;
    int tr;
    char *tok;

    /* good pages */
    assert_int_equal(parse(HEAD "<IsTruncated>false</IsTruncated>" OBJ("p/a", T0, "5")
                               OBJ("p/&amp;&lt;&gt;&quot;&apos;&#65;&#x42;&#xe9;&#x1F600;", "2024-02-29T23:59:59Z",
                                   "18446744073709551615") "</ListBucketResult>",
                           "p/", &v, &tr, &tok),
                     0);
    assert_int_equal(tr, 0);
    assert_null(tok);
    assert_int_equal(v.n, 2);
    assert_string_equal(v.keys[0], "p/a");
    assert_int_equal(v.size[0], 5);
    assert_int_equal(v.mtime[0], 1796029172);
    assert_string_equal(v.keys[1], "p/&<>\"'AB\xc3\xa9\xf0\x9f\x98\x80");
    assert_int_equal(v.size[1], UINT64_MAX);
    assert_int_equal(v.mtime[1], 1709251199);
    static const char truncated[] = HEAD "<IsTruncated>true</IsTruncated>" OBJ("a", T1970, "0") TOKEN;
    assert_int_equal(parse(truncated, "", &v, &tr, &tok), 0);
    assert_int_equal(tr, 1);
    assert_string_equal(tok, "a+b/c=&");
    assert_int_equal(v.mtime[0], 0);
    free(tok);
    assert_int_equal(parse(HEAD "<IsTruncated>false</IsTruncated></ListBucketResult>", "", &v, &tr, &tok), 0);
    assert_int_equal(v.n, 0);

    /* garbled: each is refused whole */
    static const char *const bad[] = {
        "",
        "<Error><Code>NoSuchBucket</Code></Error>",
        HEAD "</ListBucketResult>",                                     /* no IsTruncated */
        HEAD "<IsTruncated>yes</IsTruncated>",                          /* neither true nor false */
        HEAD "<IsTruncated>true</IsTruncated>" OBJ("p/a", T0, "1"),     /* truncated, no token */
        HEAD "<IsTruncated>true</IsTruncated><NextContinuationToken/>", /* an empty token */
        HEAD "<IsTruncated>false</IsTruncated>" OBJ("p/a", T0, "1") "<Contents><Key>p/b</Key>", /* cut off */
        HEAD "<IsTruncated>false</IsTruncated><Contents><Key>p/a</Contents>",
        HEAD "<IsTruncated>false</IsTruncated>" OBJ("", T0, "1"),          /* an empty key */
        HEAD "<IsTruncated>false</IsTruncated>" OBJ("q/a", T0, "1"),       /* outside the prefix */
        HEAD "<IsTruncated>false</IsTruncated>" OBJ("p/a&#0;b", T0, "1"),  /* a NUL would cut the key */
        HEAD "<IsTruncated>false</IsTruncated>" OBJ("p/a&nbsp;", T0, "1"), /* not an XML entity */
        HEAD "<IsTruncated>false</IsTruncated>" OBJ("p/a&amp", T0, "1"),
        HEAD "<IsTruncated>false</IsTruncated>" OBJ("p/a&#xD800;", T0, "1"), /* a surrogate */
        HEAD "<IsTruncated>false</IsTruncated>" OBJ("p/a&#x110000;", T0, "1"),
        HEAD "<IsTruncated>false</IsTruncated>" OBJ("p/a&#;", T0, "1"),
        HEAD "<IsTruncated>false</IsTruncated>" OBJ("p/a&#x999999999;", T0, "1"),
        HEAD "<IsTruncated>false</IsTruncated>" OBJ("p/a", T0, "18446744073709551616"), /* 2^64 */
        HEAD "<IsTruncated>false</IsTruncated>" OBJ("p/a", T0, "-1"),
        HEAD "<IsTruncated>false</IsTruncated>" OBJ("p/a", T0, ""),
        HEAD "<IsTruncated>false</IsTruncated>" OBJ("p/a", "2026-11-30 08:59:32Z", "1"),
        HEAD "<IsTruncated>false</IsTruncated>" OBJ("p/a", "2026-11-30T08:59:32", "1"), /* no zone */
        HEAD "<IsTruncated>false</IsTruncated>" OBJ("p/a", "2026-11-30T08:59:32.Z", "1"),
        HEAD "<IsTruncated>false</IsTruncated>" OBJ("p/a", "2026-13-30T08:59:32Z", "1"),
        HEAD "<IsTruncated>false</IsTruncated>" OBJ("p/a", "2023-02-29T08:59:32Z", "1"), /* not a leap year */
        HEAD "<IsTruncated>false</IsTruncated>" OBJ("p/a", "1969-12-31T23:59:59Z", "1"),
        HEAD "<IsTruncated>false</IsTruncated>" OBJ("p/a", "2026-11-30T24:00:00Z", "1"),
        HEAD "<IsTruncated>false</IsTruncated><Contents><Key>p/a</Key><Size>1</Size></Contents>",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        tok = NULL;
        if (parse(bad[i], "p/", &v, &tr, &tok) != THAW_ECORRUPT)
            fail_msg("accepted bad page %zu: %s", i, bad[i]);
    }
    /* a NUL byte inside the page (not a C string) */
    static const char nul[] = HEAD "<IsTruncated>false</IsTruncated>" OBJ("p/a\0b", T0, "1");
    char err[64];
    memset(&v, 0, sizeof v);
    assert_int_equal(thaw_s3_list_parse(nul, sizeof nul - 1, "p/", on_object, &v, &tr, &tok, err, sizeof err),
                     THAW_ECORRUPT);
    assert_int_equal(v.n, 0);
    /* a key longer than any store keeps */
    size_t big = 5000;
    char *xml = malloc(5 * 4096 + 512); /* room for the entity key below */
    assert_non_null(xml);
    int at = sprintf(xml, HEAD "<IsTruncated>false</IsTruncated><Contents><Key>p/");
    memset(xml + at, 'k', big);
    sprintf(xml + at + big, "</Key><LastModified>" T0 "</LastModified><Size>1</Size></Contents>");
    assert_int_equal(parse(xml, "p/", &v, &tr, &tok), THAW_ECORRUPT);
    /* ... and one of exactly 4096 bytes, every one an entity, is fine */
    at = sprintf(xml, HEAD "<IsTruncated>false</IsTruncated><Contents><Key>");
    for (int i = 0; i < 4096; i++)
        at += sprintf(xml + at, "&amp;");
    sprintf(xml + at, "</Key><LastModified>" T0 "</LastModified><Size>1</Size></Contents>");
    memset(&v, 0, sizeof v);
    assert_int_equal(thaw_s3_list_parse(xml, strlen(xml), "", NULL, NULL, &tr, &tok, err, sizeof err), 0);
    free(xml);
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
    int rc_list = thaw_s3_list(s, "", on_object, &(struct seen){0});
    clock_gettime(CLOCK_MONOTONIC, &b);
    assert_int_equal(kill((pid_t)pid, SIGCONT), 0);
    assert_int_equal(rc, THAW_ETIMEDOUT);
    assert_int_equal(rc_list, THAW_ETIMEDOUT);
    assert_int_equal(thaw_s3_last_status(s), 0);
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

/* ---- location: the one s3:// parser and environment lookup ---- */

static void test_url_rules(void **state)
{
    struct thaw_s3_location loc;
    char why[128];

    (void)state;
    assert_int_equal(thaw_s3_parse_url("s3://thaw-gc.1/a/b//", &loc, why, sizeof why), 0);
    assert_string_equal(loc.bucket, "thaw-gc.1");
    assert_string_equal(loc.prefix, "a/b/"); /* trailing slashes become one */
    assert_int_equal(thaw_s3_parse_url("s3://abc", &loc, why, sizeof why), 0);
    assert_string_equal(loc.prefix, ""); /* no prefix: the caller decides whether that is allowed */
    assert_int_equal(thaw_s3_parse_url("s3://abc/", &loc, why, sizeof why), 0);
    assert_string_equal(loc.prefix, "");
    assert_int_equal(thaw_s3_parse_url("s3://abc/p-._~/Q9", &loc, why, sizeof why), 0);
    assert_string_equal(loc.prefix, "p-._~/Q9/");
    /* S3's bucket rule: 3 to 63, lowercase letters, digits, '-' and '.' */
    static const char *const bad[] = {"http://abc/p", "abc/p", NULL, "s3:///p", "s3://ab/p", "s3://Abc/p",
                                      "s3://a_c/p", "s3://a c/p", "s3://abc/p q", "s3://abc/p%20"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        why[0] = '\0';
        assert_int_equal(thaw_s3_parse_url(bad[i], &loc, why, sizeof why), THAW_EINVAL);
        assert_true(why[0] != '\0');
    }
    assert_int_equal(thaw_s3_parse_url("s3://ab/p", &loc, why, sizeof why), THAW_EINVAL);
    assert_non_null(strstr(why, "3 to 63"));
    assert_int_equal(thaw_s3_parse_url("x", &loc, why, sizeof why), THAW_EINVAL);
    assert_non_null(strstr(why, "s3://BUCKET"));
    char url[128];
    snprintf(url, sizeof url, "s3://%s/p", "abcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabc"); /* 63 */
    assert_int_equal(thaw_s3_parse_url(url, &loc, why, sizeof why), 0);
    snprintf(url, sizeof url, "s3://%s/p", "abcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabcd"); /* 64 */
    assert_int_equal(thaw_s3_parse_url(url, &loc, why, sizeof why), THAW_EINVAL);
    char longp[400] = "s3://abc/";
    memset(longp + 9, 'x', 300);
    longp[309] = '\0';
    assert_int_equal(thaw_s3_parse_url(longp, &loc, why, sizeof why), THAW_EINVAL);
}

/* the AWS variables this test sets, put back afterwards */
static const char *const aws_vars[] = {"AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID",
                                       "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "AWS_DEFAULT_REGION",
                                       "AWS_SESSION_TOKEN"};
#define N_AWS (sizeof aws_vars / sizeof aws_vars[0])

static void aws_save(char *saved[N_AWS])
{
    for (size_t i = 0; i < N_AWS; i++) {
        const char *v = getenv(aws_vars[i]);
        saved[i] = v ? strdup(v) : NULL;
        unsetenv(aws_vars[i]);
    }
}

static void aws_restore(char *saved[N_AWS])
{
    for (size_t i = 0; i < N_AWS; i++) {
        if (saved[i])
            setenv(aws_vars[i], saved[i], 1);
        else
            unsetenv(aws_vars[i]);
        free(saved[i]);
    }
}

static void test_endpoint_and_credentials_from_the_environment(void **state)
{
    struct thaw_s3_location loc;
    const char *from = "x";
    char *saved[N_AWS];

    (void)state;
    aws_save(saved);
    assert_int_equal(thaw_s3_endpoint(NULL, &loc, &from), THAW_ENOTFOUND);
    setenv("AWS_ENDPOINT_URL", "http://generic:1//", 1);
    assert_int_equal(thaw_s3_endpoint(NULL, &loc, &from), 0);
    assert_string_equal(loc.endpoint, "http://generic:1");
    assert_string_equal(from, "AWS_ENDPOINT_URL");
    setenv("AWS_ENDPOINT_URL_S3", "https://s3only", 1); /* the service's own variable first */
    assert_int_equal(thaw_s3_endpoint(NULL, &loc, &from), 0);
    assert_string_equal(loc.endpoint, "https://s3only");
    assert_string_equal(from, "AWS_ENDPOINT_URL_S3");
    assert_int_equal(thaw_s3_endpoint("http://flag:9/", &loc, &from), 0); /* the flag before either */
    assert_string_equal(loc.endpoint, "http://flag:9");
    assert_null(from);
    setenv("AWS_ENDPOINT_URL_S3", "", 1); /* empty is unset */
    assert_int_equal(thaw_s3_endpoint(NULL, &loc, &from), 0);
    assert_string_equal(from, "AWS_ENDPOINT_URL");
    static const char *const bad[] = {"ftp://x", "http://", "https:///", "http://a b", "x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(thaw_s3_endpoint(bad[i], &loc, NULL), THAW_EINVAL);

    assert_int_equal(thaw_s3_credentials(&loc), THAW_ENOTFOUND);
    setenv("AWS_ACCESS_KEY_ID", "ak", 1);
    assert_int_equal(thaw_s3_credentials(&loc), THAW_ENOTFOUND);
    setenv("AWS_SECRET_ACCESS_KEY", "sk", 1);
    assert_int_equal(thaw_s3_credentials(&loc), 0);
    assert_string_equal(loc.access_key, "ak");
    assert_string_equal(loc.secret_key, "sk");
    assert_null(loc.region);
    assert_false(loc.session_token);
    setenv("AWS_DEFAULT_REGION", "eu-west-1", 1);
    assert_int_equal(thaw_s3_credentials(&loc), 0);
    assert_string_equal(loc.region, "eu-west-1");
    setenv("AWS_REGION", "us-west-2", 1); /* AWS_REGION wins */
    setenv("AWS_SESSION_TOKEN", "t", 1);
    assert_int_equal(thaw_s3_credentials(&loc), 0);
    assert_string_equal(loc.region, "us-west-2");
    assert_true(loc.session_token);
    aws_restore(saved);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_put_get_delete),
        cmocka_unit_test(test_list),
        cmocka_unit_test(test_list_parse),
        cmocka_unit_test(test_wrong_secret_is_refused),
        cmocka_unit_test(test_a_stopped_store_costs_the_deadline),
        cmocka_unit_test(test_bad_params),
        cmocka_unit_test(test_url_rules),
        cmocka_unit_test(test_endpoint_and_credentials_from_the_environment),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
