/* s3.h — a small S3 client over libcurl (SigV4 by CURLOPT_AWS_SIGV4), for
 * the shared cache tier (DESIGN §11, issue #11). Immutable objects only:
 * put (optionally "create only": If-None-Match: *), get, delete, and
 * bucket creation for set-up. Every call has a deadline; nothing here
 * retries (the caller's breaker decides).
 *
 * S3-compatible stores differ in small ways; this one is tested against
 * Ceph RGW (scripts/s3store.sh), which needs the payload declared
 * unsigned (x-amz-content-sha256: UNSIGNED-PAYLOAD) on every request.
 * Path-style addressing: ENDPOINT/BUCKET/KEY.
 *
 * Threads: a client may be used by one thread at a time; make one per
 * thread (they are cheap: a curl handle each).
 */
#ifndef THAW_S3_H
#define THAW_S3_H

#include <stddef.h>

struct thaw_s3;

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

/* Deletes key (a missing key is 0 too, as S3 answers 204 for both). */
int thaw_s3_delete(struct thaw_s3 *s, const char *key);

/* The deadline of the calls that follow (a caller with one deadline for
 * several requests gives each what is left of it). */
void thaw_s3_set_timeout(struct thaw_s3 *s, long timeout_ms);

/* The last failure in words: "HTTP 403 SignatureDoesNotMatch", a curl
 * message, ... ("" after a success). */
const char *thaw_s3_last_error(const struct thaw_s3 *s);

#endif
