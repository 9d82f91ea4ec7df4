/* http.c — libmicrohttpd: bind, collect bodies under limits, answer, defer.
 *
 * Map:
 *   ---- connections ----  the per-request struct, refcount, wake, alive
 *   ---- responses ----    MHD responses from thaw's, the stream adapter
 *   ---- requests ----     body collection, limits, dispatch, deferral
 *   ---- daemon ----       start, quiesce, drain, stop
 *
 * Suspension protocol (the one subtle part). A request or stream that has to
 * wait is suspended by the HTTP thread serving it; the engine wakes it from
 * its own thread. A wake may arrive before the suspension does, so each
 * connection counts wakes: the HTTP thread reads the count *before* asking
 * the handler or stream for news, and suspends only if no wake came in the
 * meantime (checked under the connection's lock, the same lock thaw_http_wake
 * takes to decide whether to resume). Lock order: conn->mu, then MHD's own
 * mutexes (MHD_suspend/resume take them); MHD never calls back into thaw
 * while holding one, so the order cannot invert.
 */
#include "http/http.h"

#include "base/buf.h"
#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"

#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

struct thaw_http {
    struct MHD_Daemon *d;
    struct thaw_http_params p;
    int port;
    atomic_int in_flight;      /* requests between their first byte and their last response byte */
    pthread_mutex_t mu;        /* guards the list below */
    struct thaw_http_conn *conns; /* every request in flight, for shutdown */
    atomic_bool closing;       /* thaw_http_stop: no more suspensions, waiting requests end */
};

/* ---- connections ----------------------------------------------------------------- */

struct thaw_http_conn {
    atomic_int refs;           /* MHD's (until completion) + each holder's */
    struct thaw_http *h;
    pthread_mutex_t mu;
    struct MHD_Connection *c;  /* NULL once MHD is done with the request */
    int fd;                    /* the client socket, valid while c != NULL */
    bool suspended;
    unsigned wakes;
    struct thaw_http_conn *prev, *next; /* h->conns, under h->mu */
    const char *url;           /* the request's path: MHD's, valid until the request completes */

    /* request body, collected by the HTTP thread alone */
    struct thaw_buf body;      /* at most --max-body bytes, then a NUL */
    size_t n_read;             /* body bytes taken so far, kept or discarded */
    bool too_big;              /* over --max-body: the rest is discarded, then 413 */
    int64_t t_start_us;        /* headers complete: the body deadline runs from here */

    /* a deferred request: resume() fills the response after a wake */
    bool deferred;
    thaw_http_resume_fn resume;
    void *defer_ud;
    void (*defer_free)(void *);
    const char *allow_origin;  /* the handler's CORS answer, kept for the resumed response */

    /* a stream in progress */
    thaw_http_stream_fn stream;
    void *stream_ud;
    void (*stream_free)(void *);
};

void thaw_http_conn_ref(struct thaw_http_conn *c) { atomic_fetch_add(&c->refs, 1); }

void thaw_http_conn_unref(struct thaw_http_conn *c)
{
    if (!c || atomic_fetch_sub(&c->refs, 1) != 1)
        return;
    thaw_buf_free(&c->body);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

void thaw_http_wake(struct thaw_http_conn *c)
{
    pthread_mutex_lock(&c->mu);
    c->wakes++;
    if (c->suspended && c->c) {
        c->suspended = false;
        MHD_resume_connection(c->c);
    }
    pthread_mutex_unlock(&c->mu);
}

const char *thaw_http_query(struct thaw_http_conn *c, const char *key)
{
    return c->c ? MHD_lookup_connection_value(c->c, MHD_GET_ARGUMENT_KIND, key) : NULL;
}

bool thaw_http_conn_alive(struct thaw_http_conn *c)
{
    bool alive;

    pthread_mutex_lock(&c->mu);
    alive = c->c != NULL;
    if (alive && c->fd >= 0) {
        /* the socket stays open while the request is in MHD's hands, so the
         * fd cannot have been reused; a hang-up shows without reading */
        struct pollfd pfd = {.fd = c->fd, .events = POLLRDHUP};
        if (poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)))
            alive = false;
    }
    pthread_mutex_unlock(&c->mu);
    return alive;
}

/* Suspends the request unless a wake arrived since `seen` was read (then
 * returns false: ask again). Called on the connection's HTTP thread. */
static bool suspend_unless_woken(struct thaw_http_conn *c, unsigned seen)
{
    bool suspended = false;

    pthread_mutex_lock(&c->mu);
    /* `closing` is read under c->mu, and thaw_http_stop sets it before it
     * wakes each connection under c->mu: either this sees it, or the wake
     * that follows finds the connection suspended and resumes it */
    if (c->wakes == seen && c->c && !atomic_load(&c->h->closing)) {
        c->suspended = true;
        MHD_suspend_connection(c->c);
        suspended = true;
    }
    pthread_mutex_unlock(&c->mu);
    return suspended;
}

static unsigned wakes_now(struct thaw_http_conn *c)
{
    pthread_mutex_lock(&c->mu);
    unsigned w = c->wakes;
    pthread_mutex_unlock(&c->mu);
    return w;
}

static bool closing(struct thaw_http *h) { return atomic_load(&h->closing); }

/* ---- responses ------------------------------------------------------------------- */

static ssize_t adapter_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct thaw_http_conn *c = cls;

    (void)pos;
    for (;;) {
        if (closing(c->h))
            return MHD_CONTENT_READER_END_WITH_ERROR;
        unsigned seen = wakes_now(c);
        ssize_t n = c->stream(c->stream_ud, buf, max);
        if (n > 0)
            return n;
        if (n == 0)
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (n != THAW_HTTP_STREAM_WAIT)
            return MHD_CONTENT_READER_END_WITH_ERROR;
        if (suspend_unless_woken(c, seen))
            return 0; /* MHD asks again once resumed */
    }
}

static void adapter_free(void *cls)
{
    struct thaw_http_conn *c = cls;

    if (c->stream_free)
        c->stream_free(c->stream_ud);
    c->stream_free = NULL;
    thaw_http_conn_unref(c);
}

static enum MHD_Result queue(struct thaw_http_conn *hc, struct MHD_Connection *c, struct thaw_http_response *r)
{
    struct MHD_Response *resp;
    enum MHD_Result ret;

    if (r->stream) {
        hc->stream = r->stream;
        hc->stream_ud = r->stream_ud;
        hc->stream_free = r->stream_free;
        thaw_http_conn_ref(hc); /* the response's: dropped by adapter_free */
        resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, adapter_read, hc, adapter_free);
        if (!resp) {
            adapter_free(hc);
            return MHD_NO;
        }
    } else {
        resp = MHD_create_response_from_buffer(r->n_body, r->body ? r->body : (char *)"",
                                               r->body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
        if (!resp) {
            free(r->body);
            r->body = NULL;
            return MHD_NO;
        }
        r->body = NULL;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, r->content_type ? r->content_type : "application/json");
    if (r->stream) {
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    }
    if (r->allow)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, r->allow);
    if (r->allow_origin) {
        MHD_add_response_header(resp, "Access-Control-Allow-Origin", r->allow_origin);
        MHD_add_response_header(resp, "Vary", "Origin");
    }
    if (r->cors_preflight) {
        MHD_add_response_header(resp, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        MHD_add_response_header(resp, "Access-Control-Allow-Headers",
                                r->allow_headers ? r->allow_headers : "Authorization, Content-Type");
        MHD_add_response_header(resp, "Access-Control-Max-Age", "600");
    }
    for (const char *const *h = r->headers; h && h[0] && h[1]; h += 2)
        MHD_add_response_header(resp, h[0], h[1]);
    ret = MHD_queue_response(c, (unsigned)r->status, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result answer_error(struct thaw_http_conn *hc, struct MHD_Connection *c, int status, const char *msg)
{
    struct thaw_http_response r = {.status = status};
    struct thaw_http *h = hc->h;

    r.body = h->p.error_body ? h->p.error_body(h->p.ud, hc->url, status, msg) : strdup(msg);
    r.n_body = r.body ? strlen(r.body) : 0;
    return queue(hc, c, &r);
}

/* ---- requests -------------------------------------------------------------------- */

/* How much of a refused body is read and thrown away, past --max-body, before
 * the 413. Most clients (urllib, requests, the OpenAI SDKs) send the whole
 * body before they read: answered from Content-Length and closed with the
 * rest unread, the connection is reset by the kernel and the client sees
 * ECONNRESET, never the 413. (A lingering close after an early 413 is not an
 * option: MHD closes the socket itself once that response is out, and cannot
 * queue one mid-body.) Reading the body costs no more than accepting it: the
 * connection stays in MHD's connection limits and under the same --timeout
 * deadline as an accepted body, on its event-loop thread. 64 MiB is a fraction
 * of a second on loopback and ~5 s at 100 Mbit/s; a body declared larger is
 * answered at once, which spares the upload to a client that reads while it
 * sends, and a chunked one is dropped when it passes the bound. */
#define DISCARD_MAX ((size_t)64 << 20)

static enum MHD_Result answer_413(struct thaw_http_conn *hc, struct MHD_Connection *c)
{
    char msg[96];

    snprintf(msg, sizeof msg, "request body exceeds the limit of %zu bytes (--max-body)", hc->h->p.max_body);
    return answer_error(hc, c, 413, msg);
}

/* For a Content-Length over --max-body: true when the 413 goes out now,
 * before the body (MHD then closes), false when the body is to be read and
 * discarded first. */
static bool refuse_before_body(struct MHD_Connection *c, uint64_t n_declared, size_t max_body)
{
    const char *expect = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);

    /* the client waits for a 100 Continue before it sends: the 413 instead
     * of the 100 means the body never comes */
    if (expect && strcasecmp(expect, "100-continue") == 0)
        return true;
    return n_declared - max_body > DISCARD_MAX;
}

static struct thaw_http_conn *conn_new(struct thaw_http *h, struct MHD_Connection *c)
{
    struct thaw_http_conn *hc = calloc(1, sizeof *hc);

    if (!hc)
        return NULL;
    atomic_init(&hc->refs, 1);
    hc->h = h;
    hc->c = c;
    hc->fd = -1;
    pthread_mutex_init(&hc->mu, NULL);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci)
        hc->fd = ci->connect_fd;
    hc->t_start_us = thaw_now_us();
    pthread_mutex_lock(&h->mu);
    hc->next = h->conns;
    if (h->conns)
        h->conns->prev = hc;
    h->conns = hc;
    pthread_mutex_unlock(&h->mu);
    atomic_fetch_add(&h->in_flight, 1);
    return hc;
}

/* Collects one upload chunk. False: the connection is to be dropped. */
static bool take_upload(struct thaw_http_conn *hc, const char *upload, size_t n)
{
    struct thaw_http *h = hc->h;

    if (thaw_now_us() - hc->t_start_us > (int64_t)h->p.timeout_s * 1000000) {
        LOG_INF("http: dropping a client that took over %d s to send its request body (--timeout)",
                h->p.timeout_s);
        return false;
    }
    hc->n_read += n;
    if (!hc->too_big && n > h->p.max_body - hc->body.len)
        hc->too_big = true;
    if (hc->too_big) {
        if (hc->n_read <= h->p.max_body + DISCARD_MAX) /* no overflow: --max-body <= 4 GiB */
            return true; /* discarded; answered with 413 at the end */
        LOG_INF("http: dropping a client that sent over %zu MiB past --max-body", DISCARD_MAX >> 20);
        return false;
    }
    if (thaw_buf_append(&hc->body, upload, n) != 0) /* bounded: body + n <= max_body */
        return false;
    return true;
}

/* Sends the handler's (or resume's) answer, or suspends a deferral. `seen`
 * is the wake count read before the response was produced. */
static enum MHD_Result respond(struct thaw_http_conn *hc, struct MHD_Connection *c, struct thaw_http_response *r,
                               unsigned seen)
{
    while (r->defer) {
        if (!hc->deferred) {
            hc->deferred = true;
            hc->resume = r->resume;
            hc->defer_ud = r->defer_ud;
            hc->defer_free = r->defer_free;
            hc->allow_origin = r->allow_origin;
        }
        if (!hc->resume)
            return answer_error(hc, c, 500, "internal error: deferred without a resume callback");
        if (closing(hc->h))
            return MHD_NO;
        if (suspend_unless_woken(hc, seen))
            return MHD_YES; /* MHD calls on_request again once resumed */
        seen = wakes_now(hc);
        *r = (struct thaw_http_response){.status = 500, .allow_origin = hc->allow_origin};
        hc->resume(hc->defer_ud, r);
    }
    if (r->body && !r->n_body)
        r->n_body = strlen(r->body);
    return queue(hc, c, r);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    struct thaw_http *h = cls;
    struct thaw_http_conn *hc = *con_cls;

    (void)version;
    if (!hc) {
        if (!(hc = conn_new(h, c)))
            return MHD_NO;
        *con_cls = hc;
        hc->url = url;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        uint64_t n_declared = cl ? strtoull(cl, NULL, 10) : 0;
        if (n_declared > h->p.max_body) {
            hc->too_big = true; /* none of it is kept */
            if (refuse_before_body(c, n_declared, h->p.max_body))
                return answer_413(hc, c);
        }
        return MHD_YES;
    }
    if (*upload_size > 0) {
        bool ok = take_upload(hc, upload, *upload_size);
        *upload_size = 0; /* consumed (or discarded, when too big) */
        return ok ? MHD_YES : MHD_NO;
    }
    if (closing(h))
        return MHD_NO;

    unsigned seen = wakes_now(hc);
    struct thaw_http_response resp = {.status = 500, .allow_origin = hc->allow_origin};
    if (hc->deferred) {
        hc->resume(hc->defer_ud, &resp);
        return respond(hc, c, &resp, seen);
    }
    if (hc->too_big)
        return answer_413(hc, c);
    struct thaw_http_request req = {
        .method = method,
        .url = url,
        .body = hc->body.data ? hc->body.data : "",
        .n_body = hc->body.len,
        .authorization = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION),
        .x_api_key = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key"),
        .origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin"),
        .cors_request_headers = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers"),
        .conversation_id = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Conversation-Id"),
        .conn = hc,
    };
    h->p.handler(h->p.ud, &req, &resp);
    return respond(hc, c, &resp, seen);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    struct thaw_http *h = cls;
    struct thaw_http_conn *hc = *con_cls;

    (void)c;
    (void)toe;
    if (!hc)
        return;
    *con_cls = NULL;
    pthread_mutex_lock(&hc->mu);
    hc->c = NULL; /* wakes and liveness checks from now on see a closed request */
    hc->fd = -1;
    pthread_mutex_unlock(&hc->mu);
    pthread_mutex_lock(&h->mu);
    if (hc->prev)
        hc->prev->next = hc->next;
    else
        h->conns = hc->next;
    if (hc->next)
        hc->next->prev = hc->prev;
    pthread_mutex_unlock(&h->mu);
    if (hc->defer_free)
        hc->defer_free(hc->defer_ud);
    hc->defer_free = NULL;
    thaw_buf_free(&hc->body);
    atomic_fetch_sub(&h->in_flight, 1);
    thaw_http_conn_unref(hc);
}

static void mhd_log(void *cls, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    char line[512];

    (void)cls;
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n > 0 && line[n - 1] == '\n')
        line[--n] = '\0';
    LOG_DBG("http: %s", line);
}

/* ---- daemon ------------------------------------------------------------------------ */

int thaw_http_start(const struct thaw_http_params *p, struct thaw_http **out)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *ai = NULL;
    struct thaw_http *h;
    char port[16];
    int rc;

    snprintf(port, sizeof port, "%d", p->port);
    if ((rc = getaddrinfo(p->host, port, &hints, &ai)) != 0) {
        LOG_ERR("cannot resolve --host %s: %s", p->host, gai_strerror(rc));
        return THAW_EINVAL;
    }
    h = calloc(1, sizeof *h);
    if (!h) {
        freeaddrinfo(ai);
        return THAW_ENOMEM;
    }
    h->p = *p;
    if (h->p.threads < 1)
        h->p.threads = 1;
    if (h->p.timeout_s < 1)
        h->p.timeout_s = 1;
    pthread_mutex_init(&h->mu, NULL);
    unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG | MHD_USE_ITC;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    /* HTTPS: libmicrohttpd's GnuTLS; a plain-HTTP client fails the handshake */
    struct MHD_OptionItem tls[] = {
        {p->tls_key ? MHD_OPTION_HTTPS_MEM_KEY : MHD_OPTION_END, 0, (void *)p->tls_key},
        {MHD_OPTION_HTTPS_MEM_CERT, 0, (void *)p->tls_cert},
        {MHD_OPTION_END, 0, NULL},
    };
    if (p->tls_key)
        flags |= MHD_USE_TLS;
    h->d = MHD_start_daemon(flags, (uint16_t)p->port, NULL, NULL, on_request, h, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_THREAD_POOL_SIZE,
                            (unsigned)h->p.threads, MHD_OPTION_CONNECTION_LIMIT, (unsigned)p->max_connections,
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)(p->max_per_client > 0 ? p->max_per_client : 0),
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)h->p.timeout_s,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024), MHD_OPTION_LISTEN_BACKLOG_SIZE,
                            (unsigned)1024, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_ARRAY, tls,
                            MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!h->d) {
        rc = errno ? -errno : -EADDRINUSE;
        LOG_ERR("cannot listen on %s:%d: %s", p->host, p->port, thaw_strerror(rc));
        pthread_mutex_destroy(&h->mu);
        free(h);
        return rc;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = info ? info->port : p->port;
    *out = h;
    return 0;
}

int thaw_http_port(const struct thaw_http *h) { return h->port; }

void thaw_http_quiesce(struct thaw_http *h)
{
    MHD_socket s = MHD_quiesce_daemon(h->d);
    if (s != MHD_INVALID_SOCKET)
        close(s);
}

bool thaw_http_drain(struct thaw_http *h, int timeout_ms)
{
    for (int waited = 0; atomic_load(&h->in_flight) > 0; waited += 10) {
        if (waited >= timeout_ms)
            return false;
        usleep(10000);
    }
    return true;
}

void thaw_http_stop(struct thaw_http *h)
{
    if (!h)
        return;
    /* MHD refuses to stop with suspended connections (it panics): wake them
     * all; with `closing` set none suspends again, and MHD_stop_daemon
     * resumes the woken ones before it closes everything */
    atomic_store(&h->closing, true);
    pthread_mutex_lock(&h->mu);
    for (struct thaw_http_conn *hc = h->conns; hc; hc = hc->next)
        thaw_http_wake(hc);
    pthread_mutex_unlock(&h->mu);
    MHD_stop_daemon(h->d);
    pthread_mutex_destroy(&h->mu);
    free(h);
}
