/* stream.h — one streamed reply: SSE framing, the deltas of the reply as
 * the template's parser sees it grow, and each wire format's event shapes.
 *
 * A stream follows one task (task.h). Each time the HTTP layer asks for
 * bytes it reads the task's news, turns the reply text into the template
 * parser's deltas (content, reasoning, tool-call pieces: thaw_tmpl_diffs)
 * and hands each delta to the wire's writer, which frames it as that API's
 * events:
 *
 *   THAW_WIRE_CHAT       OpenAI chat.completion.chunk data lines, [DONE]
 *   THAW_WIRE_MESSAGES   Anthropic message_start, content_block_*,
 *                        message_delta, message_stop (with event: lines)
 *   THAW_WIRE_RESPONSES  OpenAI Responses response.created, output items
 *                        (reasoning, message, function_call) with their
 *                        deltas and done events, response.completed
 *
 * The deltas are taken against the engine's final parse at the end, so the
 * streamed pieces always assemble to the message a non-streaming request
 * gets. Thread safety: one stream belongs to one connection; calls on it
 * never overlap (libmicrohttpd calls a connection's reader from one thread
 * at a time).
 */
#ifndef THAW_STREAM_H
#define THAW_STREAM_H

#include "engine/task.h"

#include <stddef.h>
#include <sys/types.h>

enum thaw_wire {
    THAW_WIRE_CHAT,     /* POST /v1/chat/completions */
    THAW_WIRE_MESSAGES, /* POST /v1/messages */
    THAW_WIRE_RESPONSES, /* POST /v1/responses */
    THAW_WIRE_COMPLETIONS, /* POST /v1/completions: text_completion chunks, [DONE] */
    THAW_WIRE_COMPLETION,  /* POST /completion: llama-server's {"content", "stop"} pieces, no [DONE] */
};

struct thaw_stream;

/* A stream over `t` (it takes over the caller's reference: the stream
 * abandons the task when freed). `id` names the reply (copied); `model`
 * must outlive the stream. NULL on ENOMEM (then the reference is still the
 * caller's). */
struct thaw_stream *thaw_stream_new(enum thaw_wire wire, struct thaw_task *t, const char *id, const char *model,
                                    long created);

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
