/* s3.c — the S3 client (s3.h). */
#include "s3.h"

#include "error.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct thaw_s3 {
    CURL *h;
    char *endpoint, *bucket, *userpwd, *sigv4;
    long timeout_ms;
    char err[256];
};

struct body {
    char *data;
    size_t n, max;
    int too_big;
    size_t cap; /* allocated: grows geometrically (a block is megabytes, sent in 16 KiB pieces) */
};

static int url_safe(const char *s)
{
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || strchr("-._~/", *s)))
            return 0;
    return 1;
}

int thaw_s3_new(const struct thaw_s3_params *p, struct thaw_s3 **out)
{
    static int global_done;
    struct thaw_s3 *s;

    if (!p || !p->endpoint || !p->bucket || !p->access_key || !p->secret_key || !*p->bucket || !url_safe(p->bucket) ||
        strchr(p->endpoint, ' '))
        return THAW_EINVAL;
    if (!global_done) { /* once, before any thread makes a client (s3.h) */
        curl_global_init(CURL_GLOBAL_DEFAULT);
        global_done = 1;
    }
    if (!(s = calloc(1, sizeof *s)))
        return THAW_ENOMEM;
    const char *region = p->region && *p->region ? p->region : "us-east-1";
    size_t nu = strlen(p->access_key) + strlen(p->secret_key) + 2, ns = strlen(region) + 16;
    s->endpoint = strdup(p->endpoint);
    s->bucket = strdup(p->bucket);
    s->userpwd = malloc(nu);
    s->sigv4 = malloc(ns);
    s->h = curl_easy_init();
    if (!s->endpoint || !s->bucket || !s->userpwd || !s->sigv4 || !s->h) {
        thaw_s3_free(s);
        return THAW_ENOMEM;
    }
    snprintf(s->userpwd, nu, "%s:%s", p->access_key, p->secret_key);
    snprintf(s->sigv4, ns, "aws:amz:%s:s3", region);
    s->timeout_ms = p->timeout_ms > 0 ? p->timeout_ms : 10000;
    *out = s;
    return 0;
}

void thaw_s3_free(struct thaw_s3 *s)
{
    if (!s)
        return;
    if (s->h)
        curl_easy_cleanup(s->h);
    free(s->endpoint);
    free(s->bucket);
    free(s->userpwd);
    free(s->sigv4);
    free(s);
}

const char *thaw_s3_last_error(const struct thaw_s3 *s)
{
    return s->err;
}

void thaw_s3_set_timeout(struct thaw_s3 *s, long timeout_ms)
{
    s->timeout_ms = timeout_ms > 0 ? timeout_ms : 1;
}

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *ud)
{
    struct body *b = ud;
    size_t n = size * nmemb;

    if (b->n + n > b->max) {
        b->too_big = 1;
        return 0; /* curl stops: CURLE_WRITE_ERROR */
    }
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 65536;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d)
            return 0;
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->n, ptr, n);
    b->n += n;
    b->data[b->n] = '\0';
    return n;
}

/* The S3 error code of an XML error body (<Code>...</Code>), for the message. */
static void s3_code(const struct body *b, char *out, size_t n)
{
    const char *c = b->data ? strstr(b->data, "<Code>") : NULL, *e = c ? strstr(c, "</Code>") : NULL;

    out[0] = '\0';
    if (c && e && (size_t)(e - c - 6) < n)
        snprintf(out, n, "%.*s", (int)(e - c - 6), c + 6);
}

/* One request: method on /bucket[/key], an optional body to send, the
 * reply body into rx (up to rx->max). *status gets the HTTP status. */
static int request(struct thaw_s3 *s, const char *method, const char *key, const void *tx, size_t n_tx,
                   const char *extra_header, struct body *rx, long *status)
{
    char url[2048];
    struct curl_slist *hdr = NULL;
    CURLcode cc;
    int rc = 0;

    s->err[0] = '\0';
    *status = 0;
    if (key && (!*key || !url_safe(key)))
        return THAW_EINVAL;
    if ((size_t)snprintf(url, sizeof url, "%s/%s%s%s", s->endpoint, s->bucket, key ? "/" : "", key ? key : "") >=
        sizeof url)
        return THAW_EINVAL;
    curl_easy_reset(s->h);
    /* RGW checks a signed payload hash it cannot compute from a stream */
    hdr = curl_slist_append(hdr, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
    if (hdr && extra_header)
        hdr = curl_slist_append(hdr, extra_header);
    if (hdr && tx)
        hdr = curl_slist_append(hdr, "Content-Type: application/octet-stream");
    if (!hdr) {
        curl_slist_free_all(hdr);
        return THAW_ENOMEM;
    }
    curl_easy_setopt(s->h, CURLOPT_URL, url);
    curl_easy_setopt(s->h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(s->h, CURLOPT_TIMEOUT_MS, s->timeout_ms);
    curl_easy_setopt(s->h, CURLOPT_CONNECTTIMEOUT_MS, s->timeout_ms);
    curl_easy_setopt(s->h, CURLOPT_AWS_SIGV4, s->sigv4);
    curl_easy_setopt(s->h, CURLOPT_USERPWD, s->userpwd);
    curl_easy_setopt(s->h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(s->h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(s->h, CURLOPT_WRITEDATA, rx);
    if (tx) {
        curl_easy_setopt(s->h, CURLOPT_POSTFIELDS, (const char *)tx);
        curl_easy_setopt(s->h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)n_tx);
    }
    curl_easy_setopt(s->h, CURLOPT_CUSTOMREQUEST, method);
    if (strcmp(method, "HEAD") == 0)
        curl_easy_setopt(s->h, CURLOPT_NOBODY, 1L);
    cc = curl_easy_perform(s->h);
    curl_easy_getinfo(s->h, CURLINFO_RESPONSE_CODE, status);
    if (cc == CURLE_OPERATION_TIMEDOUT || (cc == CURLE_COULDNT_CONNECT && *status == 0)) {
        snprintf(s->err, sizeof s->err, "%s", curl_easy_strerror(cc));
        rc = cc == CURLE_OPERATION_TIMEDOUT ? THAW_ETIMEDOUT : THAW_ESTORE;
    } else if (cc == CURLE_WRITE_ERROR && rx->too_big && *status != 200) {
        rc = 0; /* an error document longer than the cap: the status says it all */
    } else if (cc == CURLE_WRITE_ERROR && rx->too_big) {
        snprintf(s->err, sizeof s->err, "object larger than %zu bytes", rx->max);
        rc = THAW_ETOOBIG;
    } else if (cc != CURLE_OK) {
        snprintf(s->err, sizeof s->err, "%s", curl_easy_strerror(cc));
        rc = THAW_ESTORE;
    }
    curl_slist_free_all(hdr);
    return rc;
}

/* A status outside `ok` becomes THAW_ESTORE with "HTTP N Code" as the error. */
static int status_rc(struct thaw_s3 *s, long status, const struct body *b)
{
    char code[64];

    s3_code(b, code, sizeof code);
    snprintf(s->err, sizeof s->err, "HTTP %ld%s%s", status, *code ? " " : "", code);
    return THAW_ESTORE;
}

int thaw_s3_create_bucket(struct thaw_s3 *s)
{
    struct body b = {NULL, 0, 1 << 16, 0, 0};
    long st;
    int rc = request(s, "PUT", NULL, NULL, 0, NULL, &b, &st);

    if (rc == 0 && st != 200 && st != 409)
        rc = status_rc(s, st, &b);
    free(b.data);
    return rc;
}

int thaw_s3_put(struct thaw_s3 *s, const char *key, const void *data, size_t n, int create_only)
{
    static const char empty[1];
    struct body b = {NULL, 0, 1 << 16, 0, 0};
    long st;
    int rc = request(s, "PUT", key, n ? data : empty, n, create_only ? "If-None-Match: *" : NULL, &b, &st);

    if (rc == 0 && st == 412 && create_only)
        rc = THAW_EEXIST;
    else if (rc == 0 && st != 200)
        rc = status_rc(s, st, &b);
    free(b.data);
    return rc;
}

int thaw_s3_get(struct thaw_s3 *s, const char *key, size_t max, void **data, size_t *n)
{
    struct body b = {NULL, 0, max, 0, 0};
    long st;
    int rc = request(s, "GET", key, NULL, 0, NULL, &b, &st);

    *data = NULL;
    *n = 0;
    if (rc == 0 && st == 404)
        rc = THAW_ENOTFOUND;
    else if (rc == 0 && st != 200)
        rc = status_rc(s, st, &b);
    if (rc == 0) {
        *data = b.data ? b.data : calloc(1, 1);
        *n = b.n;
        return *data ? 0 : THAW_ENOMEM;
    }
    free(b.data);
    return rc;
}

int thaw_s3_delete(struct thaw_s3 *s, const char *key)
{
    struct body b = {NULL, 0, 1 << 16, 0, 0};
    long st;
    int rc = request(s, "DELETE", key, NULL, 0, NULL, &b, &st);

    if (rc == 0 && st != 204 && st != 200 && st != 404)
        rc = status_rc(s, st, &b);
    free(b.data);
    return rc;
}
