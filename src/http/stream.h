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

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

struct thaw_stream;

struct thaw_replay;

/* A stream of `t`'s reply in `codec`'s events (it takes over the caller's
 * reference: the stream abandons the task when freed). `id` names the
 * reply (copied); `created` is its unix time. `replay` (X-Conversation-Id,
 * replay.h; NULL: none): every framed byte goes there too, and the stream
 * takes the caller's reference (it finishes the replay when freed). NULL
 * on ENOMEM (then the references are still the caller's). */
struct thaw_stream *thaw_stream_new(const struct thaw_codec *codec, struct thaw_task *t, const char *id, long created,
                                    struct thaw_replay *replay);

/* The client left: a stream with a replay, not done nor cancelled, is
 * read on to its end into the replay by the streams' thread, which then
 * calls on_end(ud) (that frees the stream: thaw_stream_free). True when
 * it took the stream; false: free it now. */
bool thaw_stream_detach(struct thaw_stream *st, void (*on_end)(void *ud), void *ud);

/* thaw_http_stream_fn: the next framed bytes into buf (> 0), 0 at the end,
 * -1 on ENOMEM (the connection is cut), or THAW_HTTP_STREAM_WAIT when the
 * engine has no news yet. Never blocks. */
ssize_t thaw_stream_read(void *stream, char *buf, size_t max);

/* Frees the stream and abandons its task (the client may be gone before
 * the reply is: the engine stops generating for it). */
void thaw_stream_free(void *stream);

/* Starts the streams' one thread: with --sse-ping-interval > 0, after
 * `interval_s` seconds without an event a stream sends an SSE comment
 * (":"), as llama-server does, so that clients and proxies with idle
 * timeouts keep a long prefill's stream open (<= 0: no pings); and it
 * reads detached streams on (thaw_stream_detach). Returns 0 or
 * THAW_ENOMEM. Stop it before the HTTP server stops: the detached streams
 * left end then. */
int thaw_stream_pinger_start(int interval_s);
void thaw_stream_pinger_stop(void);

#endif
