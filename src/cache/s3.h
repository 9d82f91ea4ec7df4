/* s3.h — a small S3 client over libcurl (SigV4 by CURLOPT_AWS_SIGV4), for
 * the shared cache tier (DESIGN §11, issue #11). Immutable objects only:
 * put (optionally "create only": If-None-Match: *), get, delete, list
 * (for eviction: `thaw cache gc --shared`), and bucket creation for
 * set-up. Every request has a deadline; nothing here retries (the
 * caller's breaker decides).
 *
 * S3-compatible stores differ in small ways; this one is tested against
 * Ceph RGW (scripts/s3store.sh), which needs the payload declared
 * unsigned (x-amz-content-sha256: UNSIGNED-PAYLOAD) on every request.
 * Path-style addressing: ENDPOINT/BUCKET/KEY.
 *
 * Keys are any bytes but NUL, 1 to 4096 of them (S3 allows 1024; others
 * are THAW_EINVAL). Each is URI-encoded as SigV4 canonicalises it (RFC
 * 3986 unreserved characters and '/' as they are, every other byte %XX),
 * and a listing's query is sent already in canonical form (parameters
 * sorted, values encoded, '/' too): libcurl 7.88 (Debian 12) signs the
 * path and query exactly as they appear in the URL (later versions sort
 * and encode the query, which leaves a canonical one as it is), and RGW
 * re-encodes what it decoded, so anything else ('+' raw, '%7e') is a 403.
 *
 * Threads: a client may be used by one thread at a time; make one per
 * thread (they are cheap: a curl handle each).
 */
#ifndef THAW_S3_H
#define THAW_S3_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct thaw_s3;

/* ---- where a store is: the one parser of s3:// URLs and the AWS environment ----
 * Both users (the shared tier's --kv-shared, `thaw cache gc --shared`)
 * read a store's location through these, so a URL one accepts the other
 * accepts too. */

struct thaw_s3_location {
    char bucket[64];        /* S3's rule: 3 to 63 lowercase letters, digits, '-' and '.' */
    char prefix[256];       /* "" or "PATH/": letters, digits and -._~/, one trailing '/' */
    char endpoint[1024];    /* http(s)://HOST[:PORT], no trailing slash */
    const char *access_key; /* AWS_ACCESS_KEY_ID, as getenv returns it (valid until the environment changes) */
    const char *secret_key; /* AWS_SECRET_ACCESS_KEY, likewise */
    const char *region;     /* AWS_REGION, else AWS_DEFAULT_REGION; NULL = neither (us-east-1) */
    bool session_token;     /* AWS_SESSION_TOKEN is set: temporary credentials, which are never sent */
};

/* Parses s3://BUCKET[/PREFIX] (trailing slashes of PREFIX dropped) into
 * loc->bucket and loc->prefix. Returns 0, or THAW_EINVAL with the rule it
 * breaks in why[n_why] ("expected s3://BUCKET[/PREFIX]", "a bucket name
 * has 3 to 63 characters", ...). */
int thaw_s3_parse_url(const char *url, struct thaw_s3_location *loc, char *why, size_t n_why);

/* loc->endpoint from `flag` (a command-line value; NULL = not given), else
 * AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL (empty values count as unset),
 * trailing slashes dropped. *from (may be NULL) names where it came from:
 * NULL for the flag, else the variable. Returns 0, THAW_ENOTFOUND (none
 * given) or THAW_EINVAL (not http(s)://HOST[:PORT], a space in it, or too
 * long). */
int thaw_s3_endpoint(const char *flag, struct thaw_s3_location *loc, const char **from);

/* Fills loc's credentials, region and session_token from the
 * environment. Returns 0, or THAW_ENOTFOUND when AWS_ACCESS_KEY_ID or
 * AWS_SECRET_ACCESS_KEY is unset or empty. */
int thaw_s3_credentials(struct thaw_s3_location *loc);

struct thaw_s3_params {
    const char *endpoint; /* http(s)://host[:port], no trailing slash */
    const char *bucket;
    const char *access_key; /* AWS_ACCESS_KEY_ID */
    const char *secret_key; /* AWS_SECRET_ACCESS_KEY */
    const char *region;     /* AWS_REGION; NULL = "us-east-1" */
    long timeout_ms;        /* per request, connect included; 0 = 10000 */
};

/* Returns 0 and *out, THAW_EINVAL (a missing field, a bucket or endpoint
 * that cannot be put in a URL) or THAW_ENOMEM. */
int thaw_s3_new(const struct thaw_s3_params *p, struct thaw_s3 **out);
void thaw_s3_free(struct thaw_s3 *s);

/* Keys per listing page (ListObjectsV2 max-keys); 0, the default, leaves
 * it to the store (1000 on S3). For tests: a few cross pages with few
 * objects. */
void thaw_s3_set_list_page(struct thaw_s3 *s, int max_keys);

/* Creates the bucket (200, or 409 when it exists: both 0). */
int thaw_s3_create_bucket(struct thaw_s3 *s);

/* Uploads n bytes under key. With create_only, an existing object is kept
 * and the call returns THAW_EEXIST (412: the first writer won).
 * Returns 0, THAW_EEXIST, THAW_ETIMEDOUT (past the deadline, or no answer),
 * THAW_ESTORE (any other failure: the HTTP status and S3 error code are in
 * thaw_s3_last_error) or THAW_ENOMEM. */
int thaw_s3_put(struct thaw_s3 *s, const char *key, const void *data, size_t n, int create_only);

/* Downloads key into *data (malloc'd, *n bytes; at most max bytes, else
 * THAW_ETOOBIG). Returns 0, THAW_ENOTFOUND (404), THAW_ETOOBIG,
 * THAW_ETIMEDOUT, THAW_ESTORE or THAW_ENOMEM. */
int thaw_s3_get(struct thaw_s3 *s, const char *key, size_t max, void **data, size_t *n);

/* Whether key exists: 0, THAW_ENOTFOUND (404), THAW_ETIMEDOUT, THAW_ESTORE
 * or THAW_ENOMEM. No body moves: the cheap check before uploading a large
 * object another writer may have stored already. */
int thaw_s3_head(struct thaw_s3 *s, const char *key);

/* Deletes key (a missing key is 0 too, as S3 answers 204 for both).
 * Returns 0, THAW_EINVAL (a bad key), THAW_ETIMEDOUT, THAW_ESTORE or
 * THAW_ENOMEM. */
int thaw_s3_delete(struct thaw_s3 *s, const char *key);

/* The deadline of the calls that follow (a caller with one deadline for
 * several requests gives each what is left of it). */
void thaw_s3_set_timeout(struct thaw_s3 *s, long timeout_ms);

/* One object of a listing. */
struct thaw_s3_object {
    const char *key;       /* the whole key (prefix included), XML entities decoded; never empty, no NUL inside;
                              valid during the callback only */
    uint64_t size;         /* bytes */
    int64_t last_modified; /* Unix seconds, UTC (the fraction dropped): when the object was written */
};

/* Called once per object; a nonzero return stops the listing. It may use
 * the same client meanwhile (delete what it is given: the page it comes
 * from is held apart, and the next page starts after its last key). */
typedef int (*thaw_s3_list_fn)(void *ud, const struct thaw_s3_object *obj);

/* Lists every object whose key starts with prefix (NULL or "" = the whole
 * bucket) with ListObjectsV2, page after page (its size:
 * thaw_s3_set_list_page) as IsTruncated / NextContinuationToken lead, in
 * the store's order (byte order of the keys on S3 and RGW). A key longer
 * than 4096 bytes or with a NUL is THAW_ESTORE (malformed). Each page is one request with the client's deadline, so a
 * listing takes as long as the bucket needs; fn can stop it. A page is
 * checked whole before fn sees any of it: one that does not parse, names a
 * key outside prefix or is truncated without a new continuation token is
 * THAW_ESTORE, with nothing of that page delivered.
 * Returns 0 (every object listed), fn's nonzero value (it stopped),
 * THAW_ETIMEDOUT, THAW_ESTORE (thaw_s3_last_error says why: "HTTP 404
 * NoSuchBucket", "malformed listing: ...") or THAW_ENOMEM. Pages before a
 * failure have been delivered. */
int thaw_s3_list(struct thaw_s3 *s, const char *prefix, thaw_s3_list_fn fn, void *ud);

/* One ListObjectsV2 reply page of n bytes (need not be NUL-terminated),
 * as thaw_s3_list reads it; for the tests and the fuzzer. Checks the page
 * whole, then calls fn per <Contents> in order. Returns 0 with *truncated
 * and *next_token (malloc'd, decoded; NULL unless truncated), fn's nonzero
 * value (it stopped; *next_token NULL), THAW_ECORRUPT (nothing delivered;
 * why in err, NUL-terminated, when n_err > 0) or THAW_ENOMEM. */
int thaw_s3_list_parse(const char *xml, size_t n, const char *prefix, thaw_s3_list_fn fn, void *ud, int *truncated,
                       char **next_token, char *err, size_t n_err);

/* The HTTP status of the last request (0: none came back, as when the
 * store was unreachable or the deadline passed). */
long thaw_s3_last_status(const struct thaw_s3 *s);

/* The last failure in words: "HTTP 403 SignatureDoesNotMatch", a curl
 * message, ... ("" after a success). */
const char *thaw_s3_last_error(const struct thaw_s3 *s);

#endif
