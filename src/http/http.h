/* http.h — libmicrohttpd glue: listening, request bodies, limits, SSE.
 *
 * Connections are served by a small pool of event-loop threads (epoll), not
 * a thread each: thousands of idle or slow clients cost a socket apiece and
 * starve nobody. Nothing a handler does may block for long. A request that
 * waits for the engine is *deferred*: its connection is suspended (no thread
 * held, no timeout running) until thaw_http_wake(), then the handler's
 * resume callback fills the real response. A stream that has nothing to
 * send returns THAW_HTTP_STREAM_WAIT and is suspended the same way.
 *
 * Limits enforced here, before any handler runs: connections in all and per
 * client address, an idle timeout, a deadline for receiving a request's
 * body, and the body size: 413 before the body when the client waits for it
 * (Expect: 100-continue) or declares far more than the limit, otherwise after
 * the body is read and discarded (bounded in bytes, and by the deadline), so
 * that a client that sends before it reads sees the 413 and not a reset.
 */
#ifndef THAW_HTTP_H
#define THAW_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

struct thaw_http;
/* One request's connection. Refcounted: the handler may keep it past its
 * return (thaw_http_conn_ref) to wake it or ask whether the client is still
 * there; it stays valid (answering "gone") after the client left. */
struct thaw_http_conn;
struct thaw_replay;

struct thaw_http_request {
    const char *method;
    const char *url;           /* path only */
    const char *body;          /* NUL-terminated, n_body bytes (may be "") */
    size_t n_body;
    const char *authorization; /* header value or NULL */
    const char *x_api_key;     /* x-api-key header (Anthropic's clients) or NULL */
    const char *origin;        /* Origin header or NULL (browsers) */
    const char *cors_request_headers; /* a preflight's Access-Control-Request-Headers, or NULL */
    const char *conversation_id; /* X-Conversation-Id header or NULL (what a proxy routes on, and a
                                  * stream's replay is kept under: replay.h) */
    struct thaw_replay *replay;  /* server.c's: the replay a request opened while it waited for its
                                  * model (borrowed; the route that streams it takes a reference) */
    struct thaw_http_conn *conn; /* borrowed for the handler's duration */
};

/* A stream's producer: called from an HTTP thread, must not block. Returns
 * bytes written into buf (> 0), 0 at the end of the stream, -1 to abort the
 * connection, or THAW_HTTP_STREAM_WAIT when nothing is ready yet: the
 * connection then sleeps until thaw_http_wake() and the producer is called
 * again. A wake that races with WAIT is never lost. */
typedef ssize_t (*thaw_http_stream_fn)(void *ud, char *buf, size_t max);
#define THAW_HTTP_STREAM_WAIT ((ssize_t)-2)

struct thaw_http_response;
/* Fills the response of a deferred request after a wake (it may defer again). */
typedef void (*thaw_http_resume_fn)(void *ud, struct thaw_http_response *r);

struct thaw_http_response {
    int status;
    const char *content_type;  /* static string */
    char *body;                /* malloc'd; freed by http.c */
    size_t n_body;
    thaw_http_stream_fn stream; /* when set, body is ignored and this produces it */
    void *stream_ud;
    void (*stream_free)(void *ud); /* called once when the connection is done with the stream */
    const char *allow;         /* Allow header for 405 */
    const char *allow_origin;  /* Access-Control-Allow-Origin (+ Vary: Origin); NULL = none */
    bool cors_preflight;       /* + the preflight's Allow-Methods / Allow-Headers / Max-Age */
    const char *allow_headers; /* the preflight's Allow-Headers (valid until the handler returns);
                                * NULL = "Authorization, Content-Type" */
    const char *const *headers; /* more headers: name, value, ..., NULL (static strings); NULL = none */
    /* deferred: no response yet; `resume` fills it after thaw_http_wake().
     * `defer_free(defer_ud)` runs once when the connection is done. */
    bool defer;
    thaw_http_resume_fn resume;
    void *defer_ud;
    void (*defer_free)(void *ud);
};

typedef void (*thaw_http_handler)(void *ud, const struct thaw_http_request *req, struct thaw_http_response *resp);

struct thaw_http_params {
    const char *host;
    int port;                  /* 0 = any free port */
    size_t max_body;           /* larger bodies get 413 without reaching the handler */
    int max_connections;       /* open connections in all; more are refused at accept */
    int max_per_client;        /* open connections per client address, 0 = no limit */
    int threads;               /* event-loop threads */
    int timeout_s;             /* idle limit, and the deadline for a request's body */
    thaw_http_handler handler;
    void *ud;
    const char *tls_key, *tls_cert; /* PEM text: serve HTTPS; NULL = plain HTTP */
    /* builds the error body for statuses http.c answers itself (413, 500)
     * in the shape of the API at `url` (the request's path, no query);
     * called with `ud` */
    char *(*error_body)(void *ud, const char *url, int status, const char *message);
};

/* Starts listening. Returns 0, -errno, or THAW_EINVAL (host unresolvable). */
int thaw_http_start(const struct thaw_http_params *p, struct thaw_http **out);
/* The port actually bound. */
int thaw_http_port(const struct thaw_http *h);
/* Stops accepting new connections (existing ones finish). */
void thaw_http_quiesce(struct thaw_http *h);
/* Waits until no request is in flight (its response fully sent or the
 * client gone), at most timeout_ms. Returns true when drained. */
bool thaw_http_drain(struct thaw_http *h, int timeout_ms);
/* Closes every connection (suspended ones too) and frees. */
void thaw_http_stop(struct thaw_http *h);

/* ---- connections (any thread) ---- */
void thaw_http_conn_ref(struct thaw_http_conn *c);
void thaw_http_conn_unref(struct thaw_http_conn *c);
/* Resumes a deferred request or a waiting stream; a no-op once the
 * connection is gone. Never blocks on the network. */
void thaw_http_wake(struct thaw_http_conn *c);
/* The value of the query argument `key` of the request being handled (the
 * URL's "?key=value", decoded), or NULL when absent. Only during the
 * handler, on its thread. */
const char *thaw_http_query(struct thaw_http_conn *c, const char *key);
/* False once the client has hung up (checked on the socket without reading
 * it, so it also works while the connection is suspended). */
bool thaw_http_conn_alive(struct thaw_http_conn *c);

#endif
