/* fuzz_s3_list.c — libFuzzer target: ListObjectsV2 reply pages through
 * thaw_s3_list_parse (s3.h), what `thaw cache gc --shared` trusts before
 * it deletes what a page names.
 *
 * The first byte picks the prefix asked for (bits 0-1: "", "p/", "v1/m/";
 * 3 is "") and the object at which the callback stops (bits 2-7; 0:
 * never); the rest is the page, not NUL-terminated (ASan sees a read past
 * it). Promises checked:
 *   - the answer is 0, THAW_ECORRUPT (with a reason, and no object was
 *     delivered: a page is checked whole first), THAW_ENOMEM or the
 *     callback's own value, returned exactly when it stopped;
 *   - every key delivered is non-empty, at most 4096 bytes, a C string of
 *     that length (no NUL cut it short: it would name another object) and
 *     starts with the prefix;
 *   - on 0, *next_token is set exactly when *truncated, and non-empty.
 * Any broken promise aborts: a crash to libFuzzer.
 */
#include "base/error.h"
#include "cache/s3.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define STOPPED 4242 /* the callback's "stop" value, unlike any thaw code */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok)
{
    if (!ok)
        abort();
}

struct run {
    const char *prefix;
    unsigned stop_at, n;
};

static int on_object(void *ud, const struct thaw_s3_object *o)
{
    struct run *r = ud;
    size_t len = strlen(o->key);

    check(len > 0 && len <= 4096);
    check(strncmp(o->key, r->prefix, strlen(r->prefix)) == 0);
    r->n++;
    return r->n == r->stop_at ? STOPPED : 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const prefixes[] = {"", "p/", "v1/m/"};
    struct run r;
    char err[160], *token = (char *)1, *page;
    int truncated = -1, rc;

    if (size < 1)
        return 0;
    r.prefix = prefixes[(data[0] & 3) % 3];
    r.stop_at = (unsigned)(data[0] >> 2);
    r.n = 0;
    /* a copy of exactly the page's bytes: a read past it is an overflow */
    if (!(page = malloc(size - 1 ? size - 1 : 1)))
        return 0;
    memcpy(page, data + 1, size - 1);
    rc = thaw_s3_list_parse(page, size - 1, r.prefix, on_object, &r, &truncated, &token, err, sizeof err);
    if (rc == THAW_ECORRUPT) {
        check(r.n == 0 && token == NULL && err[0] != '\0' && memchr(err, '\0', sizeof err));
    } else if (rc == STOPPED) {
        check(r.stop_at && r.n == r.stop_at && token == NULL);
    } else if (rc == 0) {
        check(!r.stop_at || r.n < r.stop_at);
        check(truncated == 0 || truncated == 1);
        check(truncated ? token != NULL && token[0] != '\0' : token == NULL);
        free(token);
    } else {
        check(rc == THAW_ENOMEM && token == NULL);
    }
    free(page);
    return 0;
}
