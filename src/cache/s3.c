/* s3.c — the S3 client (s3.h).
 *
 * Map:
 *   ---- location ----   s3:// URLs, the endpoint and credentials from the
 *                        environment
 *   ---- client ----     new, free, URI encoding, one request
 *   ---- objects ----    create_bucket, put, get, delete
 *   ---- listing ----    ListObjectsV2: the page parser (a bounded scanner,
 *                        no XML library), pagination
 */
#include "cache/s3.h"

#include "base/buf.h"
#include "base/error.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KEY_MAX 4096               /* bytes of a listed key; S3 allows 1024, RGW as configured */
#define LIST_REPLY_MAX (32u << 20) /* a page: 1000 keys of 1024 bytes, each byte up to 6 as an entity, and tags */

/* ---- location -------------------------------------------------------------------- */

static const char *env_nonempty(const char *name)
{
    const char *v = getenv(name);

    return v && *v ? v : NULL;
}

int thaw_s3_parse_url(const char *url, struct thaw_s3_location *loc, char *why, size_t n_why)
{
    const char *b, *slash, *p;
    size_t nb, np;

    loc->bucket[0] = loc->prefix[0] = '\0';
    if (!url || strncmp(url, "s3://", 5) != 0) {
        snprintf(why, n_why, "expected s3://BUCKET[/PREFIX]");
        return THAW_EINVAL;
    }
    b = url + 5;
    slash = strchr(b, '/');
    nb = slash ? (size_t)(slash - b) : strlen(b);
    if (nb < 3 || nb > 63) {
        snprintf(why, n_why, "a bucket name has 3 to 63 characters");
        return THAW_EINVAL;
    }
    for (size_t i = 0; i < nb; i++)
        if (!((b[i] >= 'a' && b[i] <= 'z') || (b[i] >= '0' && b[i] <= '9') || b[i] == '-' || b[i] == '.')) {
            snprintf(why, n_why, "a bucket name has lowercase letters, digits, '-' and '.' only");
            return THAW_EINVAL;
        }
    p = slash ? slash + 1 : "";
    np = strlen(p);
    while (np > 0 && p[np - 1] == '/')
        np--;
    for (size_t i = 0; i < np; i++)
        if (!((p[i] >= 'a' && p[i] <= 'z') || (p[i] >= 'A' && p[i] <= 'Z') || (p[i] >= '0' && p[i] <= '9') ||
              strchr("-._~/", p[i]))) {
            snprintf(why, n_why, "a prefix has letters, digits and -._~/ only");
            return THAW_EINVAL;
        }
    if (np + 2 > sizeof loc->prefix) {
        snprintf(why, n_why, "the prefix is too long (%zu characters at most)", sizeof loc->prefix - 2);
        return THAW_EINVAL;
    }
    memcpy(loc->bucket, b, nb);
    loc->bucket[nb] = '\0';
    snprintf(loc->prefix, sizeof loc->prefix, "%.*s%s", (int)np, p, np ? "/" : "");
    return 0;
}

int thaw_s3_endpoint(const char *flag, struct thaw_s3_location *loc, const char **from)
{
    const char *src = NULL, *v = flag;
    size_t n;

    loc->endpoint[0] = '\0';
    if (!v && (v = env_nonempty("AWS_ENDPOINT_URL_S3")) != NULL)
        src = "AWS_ENDPOINT_URL_S3";
    if (!v && (v = env_nonempty("AWS_ENDPOINT_URL")) != NULL)
        src = "AWS_ENDPOINT_URL";
    if (from)
        *from = src;
    if (!v)
        return THAW_ENOTFOUND;
    n = strlen(v);
    while (n > 0 && v[n - 1] == '/')
        n--;
    size_t scheme = strncmp(v, "http://", 7) == 0 ? 7 : strncmp(v, "https://", 8) == 0 ? 8 : 0;
    if (!scheme || n <= scheme || n >= sizeof loc->endpoint || memchr(v, ' ', n))
        return THAW_EINVAL;
    memcpy(loc->endpoint, v, n);
    loc->endpoint[n] = '\0';
    return 0;
}

int thaw_s3_credentials(struct thaw_s3_location *loc)
{
    loc->access_key = env_nonempty("AWS_ACCESS_KEY_ID");
    loc->secret_key = env_nonempty("AWS_SECRET_ACCESS_KEY");
    loc->region = env_nonempty("AWS_REGION") ? env_nonempty("AWS_REGION") : env_nonempty("AWS_DEFAULT_REGION");
    loc->session_token = env_nonempty("AWS_SESSION_TOKEN") != NULL;
    return loc->access_key && loc->secret_key ? 0 : THAW_ENOTFOUND;
}

struct thaw_s3 {
    CURL *h;
    char *endpoint, *bucket, *userpwd, *sigv4;
    long timeout_ms;
    int list_max_keys;
    long status; /* of the last request; 0 when none came back */
    char err[256];
};

struct body {
    struct thaw_buf buf; /* grows geometrically (a block is megabytes, sent in 16 KiB pieces) */
    size_t max;
    int too_big;
};

/* ---- client ------------------------------------------------------------ */

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

void thaw_s3_set_list_page(struct thaw_s3 *s, int max_keys)
{
    s->list_max_keys = max_keys > 0 ? max_keys : 0;
}

long thaw_s3_last_status(const struct thaw_s3 *s)
{
    return s->status;
}

/* Appends s URI-encoded as SigV4 wants it (AWS "UriEncode"): A-Z a-z 0-9
 * - . _ ~ as they are, '/' too when keep_slash (a key in the path), every
 * other byte %XX with upper-case digits. RGW re-encodes what it decoded
 * the same way, so anything else ('+' or '=' raw, %7e) is a 403
 * SignatureDoesNotMatch. out has room for 3 * strlen(s) + 1. */
static char *uri_encode(char *out, const char *s, int keep_slash)
{
    static const char hex[] = "0123456789ABCDEF";

    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '.' ||
            c == '_' || c == '~' || (c == '/' && keep_slash)) {
            *out++ = (char)c;
        } else {
            *out++ = '%';
            *out++ = hex[c >> 4];
            *out++ = hex[c & 15];
        }
    }
    *out = '\0';
    return out;
}

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *ud)
{
    struct body *b = ud;
    size_t n = size * nmemb;

    if (b->buf.len + n > b->max) {
        b->too_big = 1;
        return 0; /* curl stops: CURLE_WRITE_ERROR */
    }
    if (thaw_buf_append(&b->buf, ptr, n) != 0)
        return 0;
    return n;
}

/* The S3 error code of an XML error body (<Code>...</Code>), for the message. */
static void s3_code(const struct body *b, char *out, size_t n)
{
    const char *c = b->buf.data ? strstr(b->buf.data, "<Code>") : NULL, *e = c ? strstr(c, "</Code>") : NULL;

    out[0] = '\0';
    if (c && e && (size_t)(e - c - 6) < n)
        snprintf(out, n, "%.*s", (int)(e - c - 6), c + 6);
}

/* One request: method on /bucket[/key][?query] (query already canonical:
 * see list_query), an optional body to send, the reply body into rx (up
 * to rx->max). *status gets the HTTP status. */
static int request(struct thaw_s3 *s, const char *method, const char *key, const char *query, const void *tx,
                   size_t n_tx, const char *extra_header, struct body *rx, long *status)
{
    char *url, *at;
    struct curl_slist *hdr = NULL;
    CURLcode cc;
    int rc = 0;

    s->err[0] = '\0';
    s->status = *status = 0;
    if (key && (!*key || strlen(key) > KEY_MAX))
        return THAW_EINVAL;
    if (!(url = malloc(strlen(s->endpoint) + strlen(s->bucket) + (key ? 3 * strlen(key) : 0) +
                       (query ? strlen(query) : 0) + 4)))
        return THAW_ENOMEM;
    at = url + sprintf(url, "%s/%s", s->endpoint, s->bucket);
    if (key) {
        *at++ = '/';
        at = uri_encode(at, key, 1);
    }
    if (query)
        sprintf(at, "?%s", query);
    curl_easy_reset(s->h);
    /* RGW checks a signed payload hash it cannot compute from a stream */
    const char *lines[] = {"x-amz-content-sha256: UNSIGNED-PAYLOAD", extra_header,
                           tx ? "Content-Type: application/octet-stream" : NULL};
    for (size_t i = 0; i < sizeof lines / sizeof *lines; i++) {
        struct curl_slist *more = lines[i] ? curl_slist_append(hdr, lines[i]) : hdr;
        if (!more) {
            curl_slist_free_all(hdr);
            free(url);
            return THAW_ENOMEM;
        }
        hdr = more;
    }
    curl_easy_setopt(s->h, CURLOPT_URL, url);
    /* a key "a/../b" names that object, not "b": no dot-segment removal */
    curl_easy_setopt(s->h, CURLOPT_PATH_AS_IS, 1L);
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
    s->status = *status;
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
    free(url);
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

/* ---- objects ----------------------------------------------------------- */

int thaw_s3_create_bucket(struct thaw_s3 *s)
{
    struct body b = {.max = 1 << 16};
    long st;
    int rc = request(s, "PUT", NULL, NULL, NULL, 0, NULL, &b, &st);

    if (rc == 0 && st != 200 && st != 409)
        rc = status_rc(s, st, &b);
    thaw_buf_free(&b.buf);
    return rc;
}

int thaw_s3_put(struct thaw_s3 *s, const char *key, const void *data, size_t n, int create_only)
{
    static const char empty[1];
    struct body b = {.max = 1 << 16};
    long st;
    int rc = request(s, "PUT", key, NULL, n ? data : empty, n, create_only ? "If-None-Match: *" : NULL, &b, &st);

    if (rc == 0 && st == 412 && create_only)
        rc = THAW_EEXIST;
    else if (rc == 0 && st != 200)
        rc = status_rc(s, st, &b);
    thaw_buf_free(&b.buf);
    return rc;
}

int thaw_s3_get(struct thaw_s3 *s, const char *key, size_t max, void **data, size_t *n)
{
    struct body b = {.max = max};
    long st;
    int rc = request(s, "GET", key, NULL, NULL, 0, NULL, &b, &st);

    *data = NULL;
    *n = 0;
    if (rc == 0 && st == 404)
        rc = THAW_ENOTFOUND;
    else if (rc == 0 && st != 200)
        rc = status_rc(s, st, &b);
    if (rc == 0) {
        *n = b.buf.len;
        *data = b.buf.data ? thaw_buf_steal(&b.buf) : calloc(1, 1);
        return *data ? 0 : THAW_ENOMEM;
    }
    thaw_buf_free(&b.buf);
    return rc;
}

int thaw_s3_delete(struct thaw_s3 *s, const char *key)
{
    struct body b = {.max = 1 << 16};
    long st;
    int rc = request(s, "DELETE", key, NULL, NULL, 0, NULL, &b, &st);

    if (rc == 0 && st != 204 && st != 200 && st != 404)
        rc = status_rc(s, st, &b);
    thaw_buf_free(&b.buf);
    return rc;
}

int thaw_s3_head(struct thaw_s3 *s, const char *key)
{
    struct body b = {.max = 1 << 16};
    long st;
    int rc = request(s, "HEAD", key, NULL, NULL, 0, NULL, &b, &st);

    if (rc == 0 && st == 404)
        rc = THAW_ENOTFOUND;
    else if (rc == 0 && st != 200)
        rc = status_rc(s, st, &b);
    thaw_buf_free(&b.buf);
    return rc;
}

/* ---- listing -------------------------------------------------------------
 *
 * A ListObjectsV2 page is
 *   <ListBucketResult ...><IsTruncated>true</IsTruncated>
 *     <Contents><Key>k</Key><LastModified>2026-11-30T08:59:32.123Z</LastModified>
 *               <Size>5</Size>...</Contents>...
 *     <NextContinuationToken>t</NextContinuationToken>...</ListBucketResult>
 * Text never holds a raw '<' (XML escapes it), so looking for "<Name>" and
 * the next "</Name>" finds each element; every search is bounded by the
 * page or the <Contents> it is in, and the page may hold NULs (memmem, no
 * str* on it). Text is decoded: the five named entities and &#N; / &#xH;
 * (RGW writes control bytes so); a NUL, raw or as &#0;, makes the page
 * malformed, since the key would name another object once it is a C
 * string. */

struct scan {
    const char *p, *end;
    char *err;
    size_t n_err;
};

static int scan_fail(struct scan *sc, const char *why)
{
    if (sc->n_err)
        snprintf(sc->err, sc->n_err, "%s", why);
    return THAW_ECORRUPT;
}

/* The text of the first <name>...</name> (or <name/>, empty) in [p, end).
 * 1 found, 0 absent, -1 opened and never closed. */
static int element(const char *p, const char *end, const char *name, const char **text, size_t *len)
{
    char open[48], close[48], empty[48];
    size_t n = strlen(name);
    const char *a, *b, *e;

    snprintf(open, sizeof open, "<%s>", name);
    snprintf(close, sizeof close, "</%s>", name);
    snprintf(empty, sizeof empty, "<%s/>", name);
    a = memmem(p, (size_t)(end - p), open, n + 2);
    e = memmem(p, (size_t)(end - p), empty, n + 3);
    if (e && (!a || e < a)) {
        *text = e;
        *len = 0;
        return 1;
    }
    if (!a)
        return 0;
    a += n + 2;
    if (!(b = memmem(a, (size_t)(end - a), close, n + 3)))
        return -1;
    *text = a;
    *len = (size_t)(b - a);
    return 1;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f')
        return (c | 0x20) - 'a' + 10;
    return -1;
}

/* Decodes XML text of n bytes into out (cap bytes, the NUL included).
 * Returns the decoded length, or -1 (a NUL, a '<', an unknown or bad
 * entity, or more than cap - 1 bytes). */
static long decode_text(const char *t, size_t n, char *out, size_t cap)
{
    static const struct {
        const char *name;
        char c;
    } named[] = {{"amp;", '&'}, {"lt;", '<'}, {"gt;", '>'}, {"quot;", '"'}, {"apos;", '\''}};
    size_t o = 0;

    for (size_t i = 0; i < n;) {
        unsigned long cp = 0;
        size_t k;

        if (t[i] == '\0' || t[i] == '<')
            return -1;
        if (t[i] != '&') {
            cp = (unsigned char)t[i++]; /* a byte of UTF-8 as it is */
            k = 1;
        } else {
            size_t left = n - ++i, m;
            for (m = 0; m < sizeof named / sizeof *named; m++) {
                size_t len = strlen(named[m].name);
                if (left >= len && !memcmp(t + i, named[m].name, len)) {
                    cp = (unsigned char)named[m].c;
                    i += len;
                    break;
                }
            }
            if (m == sizeof named / sizeof *named) { /* &#N; or &#xH; */
                int base = 10, ndig = 0;
                if (left < 3 || t[i] != '#')
                    return -1;
                if (t[++i] == 'x') {
                    base = 16;
                    i++;
                }
                for (; i < n && t[i] != ';'; i++, ndig++) {
                    int d = base == 16 ? hexval(t[i]) : (t[i] >= '0' && t[i] <= '9' ? t[i] - '0' : -1);
                    if (d < 0 || ndig >= 8)
                        return -1;
                    cp = cp * (unsigned)base + (unsigned)d;
                }
                if (i == n || ndig == 0 || cp == 0 || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
                    return -1;
                i++; /* ';' */
            }
            k = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
        }
        if (o + k >= cap)
            return -1;
        if (k == 1) {
            out[o++] = (char)cp;
        } else if (k == 2) {
            out[o++] = (char)(0xC0 | (cp >> 6));
            out[o++] = (char)(0x80 | (cp & 0x3F));
        } else if (k == 3) {
            out[o++] = (char)(0xE0 | (cp >> 12));
            out[o++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            out[o++] = (char)(0x80 | (cp & 0x3F));
        } else {
            out[o++] = (char)(0xF0 | (cp >> 18));
            out[o++] = (char)(0x80 | ((cp >> 12) & 0x3F));
            out[o++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            out[o++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    if (cap == 0)
        return -1;
    out[o] = '\0';
    return (long)o;
}

/* n decimal digits at t into *v; 0, or -1 (not all digits, too many,
 * beyond max). */
static int digits(const char *t, size_t n, uint64_t max, uint64_t *v)
{
    *v = 0;
    if (n == 0 || n > 20)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (t[i] < '0' || t[i] > '9' || *v > (max - (uint64_t)(t[i] - '0')) / 10)
            return -1;
        *v = *v * 10 + (uint64_t)(t[i] - '0');
    }
    return 0;
}

/* Days from 1970-01-01 to y-m-d in the proleptic Gregorian calendar
 * (H. Hinnant's days_from_civil; no timegm, which reads no TZ but is not
 * in C11). */
static int64_t days_from_civil(int64_t y, int64_t m, int64_t d)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

/* "2026-11-30T08:59:32.123Z" (the fraction optional, any length) into Unix
 * seconds. 0, or -1 when it is not that form or a field is out of range. */
static int parse_iso8601(const char *t, size_t n, int64_t *out)
{
    static const char shape[] = "dddd-dd-ddTdd:dd:dd"; /* d: a digit */
    static const uint8_t mdays[] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    uint64_t y, mo, d, h, mi, s;
    size_t i = sizeof shape - 1;

    if (n < i + 1 || t[n - 1] != 'Z')
        return -1;
    for (size_t k = 0; k < i; k++)
        if (shape[k] == 'd' ? !(t[k] >= '0' && t[k] <= '9') : t[k] != shape[k])
            return -1;
    if (t[i] == '.') {
        size_t f = ++i;
        while (i < n - 1 && t[i] >= '0' && t[i] <= '9')
            i++;
        if (i == f)
            return -1;
    }
    if (i != n - 1)
        return -1;
    digits(t, 4, 9999, &y);
    digits(t + 5, 2, 99, &mo);
    digits(t + 8, 2, 99, &d);
    digits(t + 11, 2, 99, &h);
    digits(t + 14, 2, 99, &mi);
    digits(t + 17, 2, 99, &s);
    if (y < 1970 || mo < 1 || mo > 12 || d < 1 || d > mdays[mo - 1] || h > 23 || mi > 59 || s > 60)
        return -1;
    if (mo == 2 && d == 29 && !(y % 4 == 0 && (y % 100 != 0 || y % 400 == 0)))
        return -1;
    *out = days_from_civil((int64_t)y, (int64_t)mo, (int64_t)d) * 86400 + (int64_t)(h * 3600 + mi * 60 + s);
    return 0;
}

/* One <Contents> body [p, end) into o (key decoded into buf, KEY_MAX + 1). */
static int parse_object(struct scan *sc, const char *p, const char *end, const char *prefix, char *buf,
                        struct thaw_s3_object *o)
{
    const char *t;
    size_t n;
    uint64_t size;
    long len;

    if (element(p, end, "Key", &t, &n) != 1)
        return scan_fail(sc, "an object without <Key>");
    if ((len = decode_text(t, n, buf, KEY_MAX + 1)) <= 0)
        return scan_fail(sc, "a <Key> that is empty, too long or not text");
    if (strncmp(buf, prefix, strlen(prefix)) != 0)
        return scan_fail(sc, "a key outside the prefix asked for");
    if (element(p, end, "Size", &t, &n) != 1 || digits(t, n, UINT64_MAX, &size))
        return scan_fail(sc, "an object without a decimal <Size>");
    if (element(p, end, "LastModified", &t, &n) != 1 || parse_iso8601(t, n, &o->last_modified))
        return scan_fail(sc, "an object without an ISO-8601 <LastModified>");
    o->key = buf;
    o->size = size;
    return 0;
}

/* Walks the page's <Contents>, calling fn for each when fn is set (else
 * only checks them). 0, fn's nonzero value, THAW_ECORRUPT. */
static int each_object(struct scan *sc, const char *prefix, char *buf, thaw_s3_list_fn fn, void *ud)
{
    const char *p = sc->p;

    for (;;) {
        struct thaw_s3_object o;
        const char *a = memmem(p, (size_t)(sc->end - p), "<Contents>", 10), *b;
        int rc;

        if (!a)
            return 0;
        a += 10;
        if (!(b = memmem(a, (size_t)(sc->end - a), "</Contents>", 11)))
            return scan_fail(sc, "a <Contents> never closed");
        if ((rc = parse_object(sc, a, b, prefix, buf, &o)) != 0)
            return rc;
        if (fn && (rc = fn(ud, &o)) != 0)
            return rc;
        p = b + 11;
    }
}

int thaw_s3_list_parse(const char *xml, size_t n, const char *prefix, thaw_s3_list_fn fn, void *ud, int *truncated,
                       char **next_token, char *err, size_t n_err)
{
    struct scan sc = {xml, xml + n, err, n_err};
    const char *t;
    size_t len;
    char *buf = NULL, *token = NULL;
    int rc;

    *truncated = 0;
    *next_token = NULL;
    if (n_err)
        err[0] = '\0';
    if (!prefix)
        prefix = "";
    if (!memmem(xml, n, "<ListBucketResult", 17))
        return scan_fail(&sc, "not a <ListBucketResult>");
    rc = element(sc.p, sc.end, "IsTruncated", &t, &len);
    if (rc != 1 || !((len == 4 && !memcmp(t, "true", 4)) || (len == 5 && !memcmp(t, "false", 5))))
        return scan_fail(&sc, "no <IsTruncated>true|false</IsTruncated>");
    *truncated = len == 4;
    if (*truncated) {
        rc = element(sc.p, sc.end, "NextContinuationToken", &t, &len);
        if (rc != 1 || len == 0 || len > 6 * (size_t)KEY_MAX + 1024)
            return scan_fail(&sc, "truncated without a <NextContinuationToken>");
        if (!(token = malloc(len + 1)))
            return THAW_ENOMEM;
        if (decode_text(t, len, token, len + 1) <= 0) {
            free(token);
            return scan_fail(&sc, "a <NextContinuationToken> that is not text");
        }
    }
    if (!(buf = malloc(KEY_MAX + 1))) {
        free(token);
        return THAW_ENOMEM;
    }
    /* all of the page is checked before fn sees any of it */
    if ((rc = each_object(&sc, prefix, buf, NULL, NULL)) == 0)
        rc = each_object(&sc, prefix, buf, fn, ud);
    free(buf);
    if (rc) {
        free(token);
        *truncated = 0;
        return rc;
    }
    *next_token = token;
    return 0;
}

/* The query of one page, in SigV4's canonical form so that the URL's own
 * query is what gets signed (s3.h): parameters in byte order, values
 * encoded with '/' as %2F. malloc'd, or NULL. */
static char *list_query(const char *prefix, const char *token, int max_keys)
{
    size_t np = strlen(prefix), nt = token ? strlen(token) : 0;
    char *q = malloc(3 * np + 3 * nt + 96), *at = q;

    if (!q)
        return NULL;
    *at = '\0';
    if (token) {
        at += sprintf(at, "continuation-token=");
        at = uri_encode(at, token, 0);
        *at++ = '&';
    }
    at += sprintf(at, "list-type=2");
    if (max_keys > 0)
        at += sprintf(at, "&max-keys=%d", max_keys);
    if (np) {
        at += sprintf(at, "&prefix=");
        uri_encode(at, prefix, 0);
    }
    return q;
}

int thaw_s3_list(struct thaw_s3 *s, const char *prefix, thaw_s3_list_fn fn, void *ud)
{
    char *token = NULL, why[160];
    int rc;

    if (!prefix)
        prefix = "";
    if (strlen(prefix) > KEY_MAX)
        return THAW_EINVAL;
    for (;;) {
        struct body b = {.max = LIST_REPLY_MAX};
        char *query = list_query(prefix, token, s->list_max_keys), *next = NULL;
        int truncated = 0;
        long st;

        if (!query) {
            rc = THAW_ENOMEM;
            break;
        }
        rc = request(s, "GET", NULL, query, NULL, 0, NULL, &b, &st);
        free(query);
        if (rc == THAW_ETOOBIG)
            rc = THAW_ESTORE; /* the message says "larger than" */
        else if (rc == 0 && st != 200)
            rc = status_rc(s, st, &b);
        else if (rc == 0) {
            rc = thaw_s3_list_parse(b.buf.data ? b.buf.data : "", b.buf.len, prefix, fn, ud, &truncated, &next, why, sizeof why);
            if (rc == THAW_ECORRUPT) {
                snprintf(s->err, sizeof s->err, "malformed listing: %s", why);
                rc = THAW_ESTORE;
            }
        }
        thaw_buf_free(&b.buf);
        if (rc || !truncated)
            break;
        if (token && !strcmp(next, token)) { /* no progress: it would list the same page for ever */
            snprintf(s->err, sizeof s->err, "malformed listing: the same continuation token twice");
            free(next);
            rc = THAW_ESTORE;
            break;
        }
        free(token);
        token = next;
    }
    free(token);
    return rc;
}
