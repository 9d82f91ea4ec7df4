/* replay.h — streamed replies kept for a client that comes back
 * (llama-server's resumable streams, /v1/stream).
 *
 * A streamed request sent with an X-Conversation-Id header tees the SSE
 * bytes it sends into a session under that id. The reply goes on when the
 * client leaves (a page reload), and GET /v1/stream?conv_id=ID&from=N
 * reads the session again from byte N of the stream, then follows it live
 * until the reply ends; DELETE /v1/stream?conv_id=ID stops the reply and
 * forgets the session; POST /v1/streams/lookup says which of the ids a
 * client names have a session (it never lists ids it was not asked for).
 *
 * Invariants:
 *   1. One id, at most one session: a new stream under an id replaces the
 *      one before and cancels it.
 *   2. A session keeps the last THAW_REPLAY_MAX_BYTES of its stream; an
 *      offset before them is lost (thaw_replay_reader_new says so).
 *   3. A finished session is forgotten THAW_REPLAY_TTL_S after it finished
 *      (swept whenever sessions are opened or looked up: no thread).
 *   4. Readers never block: one with nothing new parks its connection on
 *      the session and is woken by the next append, finish or cancel.
 *
 * Every function may be called from any thread (one lock for all). The
 * session ids are the clients' own strings: they are never logged.
 */
#ifndef THAW_REPLAY_H
#define THAW_REPLAY_H

#include "http/http.h"

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#define THAW_REPLAY_MAX_BYTES (4u << 20) /* per session, as llama-server's */
#define THAW_REPLAY_TTL_S 300            /* after the reply ended, as llama-server's */
#define THAW_REPLAY_MAX_ID 1024          /* bytes of an id (THAW_API_MAX_CONVERSATION_ID); longer: refused */

struct thaw_replay;

/* A new session under `id` (replacing and cancelling the one before it),
 * `loading`: its request waits for its model (readers get THAW_EBUSY until
 * thaw_replay_loaded). The producer's reference: drop it with
 * thaw_replay_unref. NULL on ENOMEM or an id too long or empty. */
struct thaw_replay *thaw_replay_open(const char *id, bool loading);
void thaw_replay_ref(struct thaw_replay *r);
void thaw_replay_unref(struct thaw_replay *r);

/* The producer's calls. Append keeps the newest THAW_REPLAY_MAX_BYTES;
 * finish marks the end of the stream (the TTL starts); forget drops the
 * session from the table (its request failed before streaming: nothing
 * to replay). Each wakes the parked readers. */
void thaw_replay_append(struct thaw_replay *r, const char *data, size_t n);
void thaw_replay_loaded(struct thaw_replay *r);
void thaw_replay_finish(struct thaw_replay *r);
void thaw_replay_forget(struct thaw_replay *r);
/* Its request ended before a stream took it (thaw_replay_loaded): an
 * error, a refusal, a reply not streamed. Forgotten then; else nothing. */
void thaw_replay_abort(struct thaw_replay *r);
/* True once DELETE /v1/stream (or a newer session under its id) stopped it. */
bool thaw_replay_cancelled(const struct thaw_replay *r);

/* DELETE /v1/stream: cancels and forgets the session under `id`, if any.
 * True when there was one. */
bool thaw_replay_cancel(const char *id);

/* GET /v1/stream: a reader of the session under `id` from byte `from`,
 * waking `conn` (ref'd until the reader is freed) when it has more. 0 and
 * *out; THAW_ENOTFOUND (no such session, or expired), THAW_EBUSY (its
 * model is loading: retry), THAW_EINVAL (from is before the bytes kept),
 * THAW_ENOMEM. */
struct thaw_replay_reader;
int thaw_replay_reader_new(const char *id, size_t from, struct thaw_http_conn *conn,
                           struct thaw_replay_reader **out);
/* thaw_http_stream_fn over the reader */
ssize_t thaw_replay_reader_read(void *reader, char *buf, size_t max);
void thaw_replay_reader_free(void *reader);

/* POST /v1/streams/lookup: a JSON array with one object per session whose
 * id is one of ids[n] or starts with "<one of them>::" (llama-server's
 * per-model variants): conversation_id, is_done, total_bytes, started_at,
 * completed_at (unix seconds, 0 while going). Malloc'd; NULL on ENOMEM. */
char *thaw_replay_lookup_json(const char *const *ids, int n);

/* At shutdown: every session finished and forgotten, readers woken. */
void thaw_replay_shutdown(void);

#endif
