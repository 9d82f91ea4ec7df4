/* http.h — libmicrohttpd glue: listening, request bodies, limits, SSE.
 *
 * Every connection gets its own thread (MHD thread-per-connection), so a
 * handler may block while the engine works and a streaming body may block
 * until the next chunk exists. The handler sees a whole request (body
 * collected, size-checked) and fills a response: a complete body, or a
 * stream reader.
 */
#ifndef THAW_HTTP_H
#define THAW_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

struct thaw_http;

struct thaw_http_request {
    const char *method;
    const char *url;           /* path only */
    const char *body;          /* NUL-terminated, n_body bytes (may be "") */
    size_t n_body;
    const char *authorization; /* header value or NULL */
};

/* Streaming body: called from the connection's thread; may block. Returns
 * bytes written into buf (> 0), 0 at the end of the stream, -1 to abort the
 * connection. */
typedef ssize_t (*thaw_http_stream_fn)(void *ud, char *buf, size_t max);

struct thaw_http_response {
    int status;
    const char *content_type;  /* static string */
    char *body;                /* malloc'd; freed by http.c */
    size_t n_body;
    thaw_http_stream_fn stream; /* when set, body is ignored and this produces it */
    void *stream_ud;
    void (*stream_free)(void *ud); /* called once when the connection is done with the stream */
    const char *allow;         /* Allow header for 405 */
};

typedef void (*thaw_http_handler)(void *ud, const struct thaw_http_request *req, struct thaw_http_response *resp);

struct thaw_http_params {
    const char *host;
    int port;                  /* 0 = any free port */
    size_t max_body;           /* larger bodies get 413 without reaching the handler */
    int max_connections;
    thaw_http_handler handler;
    void *ud;
    /* builds the error body for statuses http.c answers itself (413) */
    char *(*error_body)(int status, const char *message);
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
/* Closes every connection and frees. */
void thaw_http_stop(struct thaw_http *h);

#endif
