/* stream.h — one streamed reply: the engine's task followed, its codec's
 * events framed as SSE, and pings.
 *
 * A stream follows one task (task.h). Each time the HTTP layer asks for
 * bytes it reads the task's news and hands it to the codec's step
 * (api/codec.h), which turns the reply into that API's events; this side
 * frames each as "event:" / "data:" lines and knows no API. Thread safety:
 * one stream belongs to one connection; calls on it never overlap
 * (libmicrohttpd calls a connection's reader from one thread at a time).
 */
#ifndef THAW_STREAM_H
#define THAW_STREAM_H

#include "api/codec.h"
#include "engine/task.h"

#include <stddef.h>
#include <sys/types.h>

struct thaw_stream;

/* A stream of `t`'s reply in `codec`'s events (it takes over the caller's
 * reference: the stream abandons the task when freed). `id` names the
 * reply (copied); `created` is its unix time. NULL on ENOMEM (then the
 * reference is still the caller's). */
struct thaw_stream *thaw_stream_new(const struct thaw_codec *codec, struct thaw_task *t, const char *id, long created);

/* thaw_http_stream_fn: the next framed bytes into buf (> 0), 0 at the end,
 * -1 on ENOMEM (the connection is cut), or THAW_HTTP_STREAM_WAIT when the
 * engine has no news yet. Never blocks. */
ssize_t thaw_stream_read(void *stream, char *buf, size_t max);

/* Frees the stream and abandons its task (the client may be gone before
 * the reply is: the engine stops generating for it). */
void thaw_stream_free(void *stream);

/* --sse-ping-interval: after `interval_s` seconds without an event, a
 * stream sends an SSE comment (":"), as llama-server does, so that clients
 * and proxies with idle timeouts keep a long prefill's stream open. Starts
 * the one thread that wakes silent streams (<= 0: none). Returns 0 or
 * THAW_ENOMEM. Stop it before the HTTP server stops. */
int thaw_stream_pinger_start(int interval_s);
void thaw_stream_pinger_stop(void);

#endif
