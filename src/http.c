/* http.c — libmicrohttpd: bind, collect bodies under a size limit, answer. */
#include "http.h"

#include "error.h"
#include "log.h"

#include <errno.h>
#include <stdatomic.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <stdarg.h>
#include <stdio.h>

struct thaw_http {
    struct MHD_Daemon *d;
    struct thaw_http_params p;
    int port;
    atomic_int in_flight; /* requests between their first byte and their last response byte */
};

/* Per-request state, lives from the first header callback to completion. */
struct conn {
    char *body;
    size_t n_body, cap_body;
    bool too_big;
};

static enum MHD_Result queue(struct MHD_Connection *c, struct thaw_http_response *r)
{
    struct MHD_Response *resp;
    enum MHD_Result ret;

    if (r->stream) {
        resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, (MHD_ContentReaderCallback)(void *)r->stream,
                                                 r->stream_ud, (MHD_ContentReaderFreeCallback)r->stream_free);
    } else {
        resp = MHD_create_response_from_buffer(r->n_body, r->body ? r->body : (char *)"",
                                               r->body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
        r->body = NULL;
    }
    if (!resp) {
        if (r->stream && r->stream_free)
            r->stream_free(r->stream_ud);
        free(r->body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, r->content_type ? r->content_type : "application/json");
    if (r->stream) {
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    }
    if (r->allow)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, r->allow);
    ret = MHD_queue_response(c, (unsigned)r->status, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* The stream reader's signature differs from MHD's only in types; this
 * adapter keeps the public header free of microhttpd.h. */
struct stream_adapter {
    thaw_http_stream_fn fn;
    void *ud;
    void (*free_fn)(void *);
};

static ssize_t adapter_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct stream_adapter *a = cls;
    ssize_t n;

    (void)pos;
    n = a->fn(a->ud, buf, max);
    if (n > 0)
        return n;
    return n == 0 ? MHD_CONTENT_READER_END_OF_STREAM : MHD_CONTENT_READER_END_WITH_ERROR;
}

static void adapter_free(void *cls)
{
    struct stream_adapter *a = cls;

    if (a->free_fn)
        a->free_fn(a->ud);
    free(a);
}

static enum MHD_Result answer_error(struct thaw_http *h, struct MHD_Connection *c, int status, const char *msg)
{
    struct thaw_http_response r = {.status = status};

    r.body = h->p.error_body ? h->p.error_body(status, msg) : strdup(msg);
    r.n_body = r.body ? strlen(r.body) : 0;
    return queue(c, &r);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    struct thaw_http *h = cls;
    struct conn *st = *con_cls;

    (void)version;
    if (!st) {
        st = calloc(1, sizeof *st);
        if (!st)
            return MHD_NO;
        *con_cls = st;
        atomic_fetch_add(&h->in_flight, 1);
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > h->p.max_body)
            st->too_big = true;
        return MHD_YES;
    }
    if (*upload_size > 0) {
        if (!st->too_big && st->n_body + *upload_size > h->p.max_body)
            st->too_big = true;
        if (!st->too_big) {
            if (st->n_body + *upload_size + 1 > st->cap_body) {
                size_t cap = st->cap_body ? st->cap_body : 4096;
                while (cap < st->n_body + *upload_size + 1)
                    cap *= 2;
                char *nb = realloc(st->body, cap);
                if (!nb)
                    return MHD_NO;
                st->body = nb;
                st->cap_body = cap;
            }
            memcpy(st->body + st->n_body, upload, *upload_size);
            st->n_body += *upload_size;
        }
        *upload_size = 0; /* consumed (or discarded, when too big) */
        return MHD_YES;
    }
    if (st->too_big) {
        char msg[96];
        snprintf(msg, sizeof msg, "request body exceeds the limit of %zu bytes (--max-body)", h->p.max_body);
        return answer_error(h, c, 413, msg);
    }

    struct thaw_http_request req = {
        .method = method,
        .url = url,
        .body = st->body ? st->body : "",
        .n_body = st->n_body,
        .authorization = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION),
    };
    if (st->body)
        st->body[st->n_body] = '\0';
    struct thaw_http_response resp = {.status = 500};
    h->p.handler(h->p.ud, &req, &resp);
    if (resp.stream) {
        struct stream_adapter *a = malloc(sizeof *a);
        if (!a) {
            resp.stream_free(resp.stream_ud);
            return MHD_NO;
        }
        *a = (struct stream_adapter){resp.stream, resp.stream_ud, resp.stream_free};
        resp.stream = (thaw_http_stream_fn)(void *)adapter_read;
        resp.stream_ud = a;
        resp.stream_free = adapter_free;
    }
    if (resp.body && !resp.n_body)
        resp.n_body = strlen(resp.body);
    return queue(c, &resp);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    struct thaw_http *h = cls;
    struct conn *st = *con_cls;

    (void)c;
    (void)toe;
    if (st) {
        free(st->body);
        free(st);
        *con_cls = NULL;
        atomic_fetch_sub(&h->in_flight, 1);
    }
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
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ERROR_LOG | MHD_USE_ITC;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    h->d = MHD_start_daemon(flags, (uint16_t)p->port, NULL, NULL, on_request, h, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_CONNECTION_LIMIT,
                            (unsigned)p->max_connections, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)600,
                            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!h->d) {
        rc = errno ? -errno : -EADDRINUSE;
        LOG_ERR("cannot listen on %s:%d: %s", p->host, p->port, thaw_strerror(rc));
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
    MHD_stop_daemon(h->d);
    free(h);
}
