/* cache_gc_shared.c — `thaw cache gc --shared s3://BUCKET/PREFIX`: the
 * shared tier's objects expired by age (cache_gc_shared.h), on stores
 * without a lifecycle rule.
 *
 * Map:
 *   ---- the run: two listings, manifests first ----  why that order is
 *                           safe; objects by kind, keys made printable,
 *                           hints per HTTP status, progress, deletes
 *   ---- the command ----   the store's location and credentials, the two
 *                           passes, the summary line
 */
#include "cli/cache_gc_shared.h"

#include "base/error.h"
#include "base/fmt.h"
#include "base/testhooks.h"
#ifdef THAW_HAVE_S3
#include "cache/s3.h"
#endif

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- the run: two listings, manifests first ----------------------------------
 *
 * `thaw cache gc --shared s3://BUCKET/PREFIX` expires the shared tier's
 * objects (DESIGN §11) on stores without a lifecycle rule. Objects are
 * immutable (written once, If-None-Match: *), so LastModified is when an
 * object was first written, and age is all there is to go by (a store
 * counts no reads). Deleting is safe next to running servers: a missing
 * manifest is a miss, and so is a manifest whose block is gone (the fetch
 * finds it incomplete and the server prefills). Manifests (.../m/<hex>)
 * still go first, in a pass of their own, so that no manifest is left
 * naming blocks already deleted: a listing is in key order, where a
 * tenant's b/ comes before its m/. The cut is taken once, so both passes
 * agree on what is old; the second pass retries an old manifest the first
 * could not delete. Memory stays flat: each page is acted on as it comes,
 * nothing is collected. */

#define PROGRESS_S 5     /* seconds between progress lines */
#define SHOW_FAILURES 10 /* failed deletes named one by one, then only counted */
#define GIVE_UP_AFTER 20 /* failed deletes in a row that stop the run */
#define GC_TIMEOUT_MS 30000

#ifdef THAW_HAVE_S3
enum obj_kind { OBJ_MANIFEST, OBJ_BLOCK, OBJ_OTHER };

/* By the segment before the last: PREFIX/v1/<model>/<tenant>/m/<hex>. */
static enum obj_kind obj_kind_of(const char *key)
{
    const char *last = strrchr(key, '/'), *p = last;

    if (!last)
        return OBJ_OTHER;
    while (p > key && p[-1] != '/')
        p--;
    if (last - p == 1 && *p == 'm')
        return OBJ_MANIFEST;
    if (last - p == 1 && *p == 'b')
        return OBJ_BLOCK;
    return OBJ_OTHER;
}

/* Length of the valid UTF-8 sequence at c (a character U+00A0 or above:
 * no C1 control, which some terminals obey), or 0. */
static size_t utf8_printable(const unsigned char *c)
{
    size_t n = c[0] >= 0xF0 && c[0] <= 0xF4 ? 4 : c[0] >= 0xE0 ? 3 : c[0] >= 0xC2 && c[0] < 0xE0 ? 2 : 0;
    uint32_t cp;

    if (n == 0 || c[0] > 0xF4)
        return 0;
    cp = c[0] & (0x7F >> n);
    for (size_t i = 1; i < n; i++) {
        if ((c[i] & 0xC0) != 0x80) /* a NUL ends the string here too */
            return 0;
        cp = cp << 6 | (c[i] & 0x3F);
    }
    if (cp < 0xA0 || (n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return n;
}

/* A key for a terminal: control bytes (a newline, an escape sequence),
 * invalid UTF-8 and '\' as \xNN, so one object is one line and nothing
 * in a key can drive the terminal. */
static void print_key(FILE *f, const char *key)
{
    for (const unsigned char *c = (const unsigned char *)key; *c;) {
        size_t n = *c >= 0x80 ? utf8_printable(c) : 0;
        if (n) {
            fwrite(c, 1, n, f);
            c += n;
        } else if (*c < 0x20 || *c >= 0x7f || *c == '\\') {
            fprintf(f, "\\x%02x", *c++);
        } else {
            fputc(*c++, f);
        }
    }
}

/* What to do about a failed request, by its HTTP status (0: no answer). */
static const char *store_hint(long status)
{
    switch (status) {
    case 0:
        return "check --endpoint (or AWS_ENDPOINT_URL) and that the store is up";
    case 301:
    case 307:
    case 400:
        return "check AWS_REGION and --endpoint";
    case 401:
    case 403:
        return "check AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_REGION";
    case 404:
        return "check the bucket's name and --endpoint";
    case 200:
        return "the store's listing could not be read";
    default:
        return "the store refused the request";
    }
}

struct gc_run {
    struct thaw_s3 *s3;
    const char *url;            /* s3://BUCKET/PREFIX/, for messages */
    int64_t cut;                /* Unix seconds: written before it is old */
    int64_t now, next_progress; /* next_progress: monotonic seconds */
    int dry_run, verbose, pass; /* pass 1: old manifests; 2: the rest (a dry run: one pass, all) */
    uint64_t listed;            /* in this pass */
    uint64_t deleted[3], bytes; /* by enum obj_kind; bytes of them (a dry run: would be) */
    uint64_t kept, failed, in_a_row, deleted_in_pass1;
    char give_up[320]; /* why the run stopped early, "" if it did not */
};

static void gc_progress(struct gc_run *g)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    if (ts.tv_sec < g->next_progress)
        return;
    g->next_progress = ts.tv_sec + PROGRESS_S;
    if (g->dry_run)
        fprintf(stderr, "thaw cache gc: %" PRIu64 " objects listed, %" PRIu64 " would go\n", g->listed,
                g->deleted[0] + g->deleted[1] + g->deleted[2]);
    else
        fprintf(stderr, "thaw cache gc: pass %d/2 (%s): %" PRIu64 " objects listed, %" PRIu64 " deleted so far\n",
                g->pass, g->pass == 1 ? "manifests" : "blocks and the rest", g->listed,
                g->deleted[0] + g->deleted[1] + g->deleted[2]);
}

/* Deletes one old object. 0 to go on, 1 to stop the listing (give_up). */
static int gc_delete(struct gc_run *g, const struct thaw_s3_object *o, enum obj_kind kind)
{
    if (thaw_s3_delete(g->s3, o->key) == 0) {
        g->deleted[kind]++;
        g->bytes += o->size;
        g->in_a_row = 0;
        if (g->verbose) {
            printf("deleted ");
            print_key(stdout, o->key);
            printf("\n");
        }
        return 0;
    }
    g->failed++;
    if (g->failed <= SHOW_FAILURES) {
        fprintf(stderr, "thaw cache gc: cannot delete ");
        print_key(stderr, o->key);
        fprintf(stderr, ": %s%s\n", thaw_s3_last_error(g->s3),
                g->failed == SHOW_FAILURES ? " (further failures only counted)" : "");
    }
    if (thaw_s3_last_status(g->s3) == 0) {
        snprintf(g->give_up, sizeof g->give_up, "the store stopped answering (%s): %s", thaw_s3_last_error(g->s3),
                 store_hint(0));
        return 1;
    }
    if (++g->in_a_row >= GIVE_UP_AFTER) {
        snprintf(g->give_up, sizeof g->give_up, "%d deletes in a row failed (last: %s): %s", GIVE_UP_AFTER,
                 thaw_s3_last_error(g->s3), store_hint(thaw_s3_last_status(g->s3)));
        return 1;
    }
    return 0;
}

static int gc_object(void *ud, const struct thaw_s3_object *o)
{
    struct gc_run *g = ud;
    enum obj_kind kind = obj_kind_of(o->key);
    int old = o->last_modified < g->cut;
    char size[24], ago[24];

    g->listed++;
    gc_progress(g);
    if (g->dry_run && old) {
        g->deleted[kind]++;
        g->bytes += o->size;
        thaw_fmt_bytes(o->size, size);
        thaw_fmt_ago(o->last_modified, g->now, ago);
        printf("would delete ");
        print_key(stdout, o->key);
        printf("  %s, written %s\n", size, ago);
        return 0;
    }
    if (g->pass == 1)
        return old && kind == OBJ_MANIFEST ? gc_delete(g, o, kind) : 0;
    if (old)
        return gc_delete(g, o, kind);
    g->kept++;
    return 0;
}

/* One listing of the run. 0, or 2 with the reason printed. */
static int gc_pass(struct gc_run *g, const char *prefix)
{
    int r;

    g->listed = 0;
    r = thaw_s3_list(g->s3, prefix, gc_object, g);
    if (r == 0)
        return 0;
    if (r == 1)
        fprintf(stderr, "thaw cache gc: stopped: %s\n", g->give_up);
    else if (r == THAW_ESTORE || r == THAW_ETIMEDOUT)
        fprintf(stderr, "thaw cache gc: cannot list %s: %s: %s\n", g->url,
                r == THAW_ETIMEDOUT ? "no answer within the deadline" : thaw_s3_last_error(g->s3),
                store_hint(thaw_s3_last_status(g->s3)));
    else
        fprintf(stderr, "thaw cache gc: cannot list %s: %s\n", g->url, thaw_strerror(r));
    return 2;
}
#endif

/* ---- the command --------------------------------------------------------------- */

int thaw_cache_gc_shared(const char *url, const char *endpoint_opt, int64_t ttl_s, int dry_run, int verbose)
{
#ifndef THAW_HAVE_S3
    (void)url;
    (void)endpoint_opt;
    (void)ttl_s;
    (void)dry_run;
    (void)verbose;
    fprintf(stderr, "thaw cache gc: --shared: this thaw was built without libcurl (install it, then build again)\n");
    return 2;
#else
    /* where the store is: s3.c's one parser, as for the servers' --kv-shared */
    struct thaw_s3_location loc;
    char where[1400], why[128];
    const char *from;
    /* tests only: a clock that has moved on (LastModified cannot be set
     * back), pages of a few keys (deleting while listing across pages) */
    long test_now = thaw_test_hook(THAW_HOOK_NOW_S), test_page = thaw_test_hook(THAW_HOOK_LIST_PAGE);

    int urc = thaw_s3_parse_url(url, &loc, why, sizeof why);
    if (urc != 0 || !loc.prefix[0]) {
        fprintf(stderr,
                "thaw cache gc: --shared %s: want s3://BUCKET/PREFIX (the --kv-shared of the servers; "
                "a prefix is required)%s%s\n",
                url, urc ? ": " : "", urc ? why : "");
        return 2;
    }
    int erc = thaw_s3_endpoint(endpoint_opt, &loc, &from);
    if (erc == THAW_ENOTFOUND) {
        fprintf(stderr, "thaw cache gc: no store endpoint: give --endpoint URL or set AWS_ENDPOINT_URL\n");
        return 2;
    }
    if (erc != 0) {
        fprintf(stderr, "thaw cache gc: endpoint %s: want http(s)://HOST[:PORT]\n", from ? getenv(from) : endpoint_opt);
        return 2;
    }
    if (thaw_s3_credentials(&loc) != 0) {
        fprintf(stderr, "thaw cache gc: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (the store's credentials)\n");
        return 2;
    }
    snprintf(where, sizeof where, "s3://%s/%s at %s", loc.bucket, loc.prefix, loc.endpoint);
    struct thaw_s3_params p = {loc.endpoint, loc.bucket, loc.access_key, loc.secret_key, loc.region, GC_TIMEOUT_MS};
    struct gc_run g = {0};
    char freed[24];
    uint64_t deleted;
    int ret;

    if (loc.session_token)
        fprintf(stderr, "thaw cache gc: AWS_SESSION_TOKEN is set but not sent (temporary credentials are not "
                        "supported): use a key pair\n");
    if (thaw_s3_new(&p, &g.s3)) {
        fprintf(stderr, "thaw cache gc: %s: cannot make a client for it\n", where);
        return 2;
    }
    if (test_page)
        thaw_s3_set_list_page(g.s3, (int)test_page);
    g.url = where;
    g.dry_run = dry_run;
    g.verbose = verbose;
    g.now = test_now ? (int64_t)test_now : (int64_t)time(NULL);
    g.cut = g.now - ttl_s;
    const char *list_prefix = loc.prefix; /* "PREFIX/": gc never sweeps a whole bucket */
    {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        g.next_progress = ts.tv_sec + PROGRESS_S;
    }
    if (dry_run) {
        g.pass = 0;
        ret = gc_pass(&g, list_prefix);
    } else {
        g.pass = 1;
        ret = gc_pass(&g, list_prefix);
        g.deleted_in_pass1 = g.deleted[OBJ_MANIFEST];
        if (ret == 0) {
            g.pass = 2;
            g.failed = 0; /* the first pass's failures are tried again */
            g.in_a_row = 0;
            ret = gc_pass(&g, list_prefix);
        }
    }
    deleted = g.deleted[0] + g.deleted[1] + g.deleted[2];
    thaw_fmt_bytes(g.bytes, freed);
    if (ret && (deleted || g.pass == 2 || g.listed)) { /* what was done before it stopped */
        printf("%s %" PRIu64 " objects (%" PRIu64 " manifests, %" PRIu64 " blocks, %" PRIu64
               " other; %s) before stopping\n",
               dry_run ? "would have deleted" : "deleted", deleted, g.deleted[0], g.deleted[1], g.deleted[2], freed);
    } else if (!ret) {
        /* every object was seen once: deleted in pass 1, or listed in pass 2 (the dry run's only pass) */
        uint64_t scanned = g.deleted_in_pass1 + g.listed;
        printf("%sscanned %" PRIu64 " objects under %s: %s %" PRIu64 " (%" PRIu64 " manifests, %" PRIu64
               " blocks, %" PRIu64 " other; %s), kept %" PRIu64,
               dry_run ? "dry run: " : "", scanned, where, dry_run ? "would delete" : "deleted", deleted, g.deleted[0],
               g.deleted[1], g.deleted[2], freed, dry_run ? scanned - deleted : g.kept);
        if (g.failed)
            printf(", %" PRIu64 " could not be deleted", g.failed);
        time_t cut = (time_t)g.cut;
        struct tm tm;
        char when[32] = "?";
        if (gmtime_r(&cut, &tm))
            strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
        printf("; old: written before %s (--ttl %" PRId64 ")\n", when, ttl_s);
        ret = g.failed ? 1 : 0;
    }
    thaw_s3_free(g.s3);
    return ret;
#endif
}
