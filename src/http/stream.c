/* stream.c — a streamed reply on its way to the client: the engine's task
 * followed, its codec's events framed as SSE, and the pinger that keeps a
 * silent stream open.
 *
 * Map:
 *   ---- framing ----    the pending bytes: "event:" / "data:" lines (the codec's put)
 *   ---- the reply ----  the task's news -> the codec's step (api/codec.h) -> framed bytes
 *   ---- the thread ---- one thread: wakes silent streams (--sse-ping-interval), which send ":",
 *                        and reads on the replies whose client left (replay.h) to their end
 *
 * What the events are and say is the codec's: this file names no API.
 */
#include "http/stream.h"

#include "base/buf.h"
#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "http/http.h"
#include "http/replay.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct thaw_stream {
    struct thaw_codec_stream cs;  /* the codec's view of the stream (codec.h) */
    struct thaw_task *task;
    struct thaw_reply_reader rd;  /* the task's, for the codec */
    struct thaw_reply reply;      /* once the task is done */
    struct thaw_buf pending;      /* framed bytes; those before off_pending went to the socket */
    size_t off_pending;
    struct thaw_replay *replay;   /* X-Conversation-Id: every framed byte goes there too; NULL: none */
    void (*on_end)(void *ud);     /* detached (its client left): called once the drainer is done */
    void *on_end_ud;
    bool detached;                /* the thread reads it on (under the thread's lock) */
    struct thaw_stream *ended;    /* the thread's list of detached streams done with */

    _Atomic int64_t last_out_us; /* when bytes last went to the socket (the pinger reads it) */
    struct thaw_stream *prev, *next; /* the pinger's list */
};

static void pinger_add(struct thaw_stream *st);
static void pinger_remove(struct thaw_stream *st);
static int64_t ping_us(void);

/* ---- framing ------------------------------------------------------------------------ */

/* thaw_codec_stream.put: one SSE event, "event: <name>\n" when named, then
 * "data: <data>\n\n". */
static int frame(void *sink, const char *event, const char *data)
{
    struct thaw_buf *b = &((struct thaw_stream *)sink)->pending;

    if (event) {
        thaw_buf_puts(b, "event: ");
        thaw_buf_puts(b, event);
        thaw_buf_puts(b, "\n");
    }
    thaw_buf_puts(b, "data: ");
    thaw_buf_puts(b, data);
    return thaw_buf_puts(b, "\n\n");
}

/* The bytes framed since `from` into the replay, if any (pings are not:
 * they say nothing of the reply). */
static void tee(struct thaw_stream *st, size_t from)
{
    if (st->replay && st->pending.len > from)
        thaw_replay_append(st->replay, st->pending.data + from, st->pending.len - from);
}

/* ---- the reply ---------------------------------------------------------------------- */

/* Turns the task's news into events. Returns 0, THAW_CODEC_WAIT (the
 * engine has no news: wait for its wake) or THAW_ENOMEM. Never blocks. */
static int refill(struct thaw_stream *st)
{
    struct thaw_task *t = st->task;
    struct thaw_task_news tn;
    int rc;

    if ((rc = thaw_task_news(t, thaw_codec_stream_from(&st->cs), &tn)) != 0)
        return rc;
    struct thaw_codec_news nw = {
        .done = tn.done,
        .started = tn.started,
        .cache_n = tn.cache_n,
        .cache_new_n = tn.cache_new_n,
        .n_text = tn.n_text,
        .n_progress = tn.n_progress,
        .live = tn.live,
        .text = tn.text,
    };
    if (tn.done) { /* the task's outcome is final: read as it stands (task.h) */
        nw.status = t->http_status;
        nw.error = t->error;
        if (t->http_status == 200) {
            thaw_task_reply(t, &st->rd, &st->reply);
            st->reply.id = st->cs.id;
            st->reply.created = st->cs.created;
            nw.reply = &st->reply;
        }
    }
    size_t from = st->pending.len;
    rc = thaw_codec_stream_step(&st->cs, &nw);
    tee(st, from);
    free(tn.text);
    return rc;
}

ssize_t thaw_stream_read(void *ud, char *buf, size_t max)
{
    struct thaw_stream *st = ud;

    while (st->off_pending == st->pending.len) {
        thaw_buf_truncate(&st->pending, 0);
        st->off_pending = 0;
        if (st->cs.finished)
            return 0;
        int rc = refill(st);
        if (rc == THAW_CODEC_WAIT && ping_us() > 0 && thaw_now_us() - atomic_load(&st->last_out_us) >= ping_us())
            rc = thaw_buf_puts(&st->pending, ":\n\n"); /* an SSE comment: every client skips it */
        else if (rc == THAW_CODEC_WAIT)
            return THAW_HTTP_STREAM_WAIT;
        if (rc != 0)
            return -1;
    }
    size_t n = st->pending.len - st->off_pending;
    if (n > max)
        n = max;
    memcpy(buf, st->pending.data + st->off_pending, n);
    st->off_pending += n;
    atomic_store(&st->last_out_us, thaw_now_us());
    return (ssize_t)n;
}

struct thaw_stream *thaw_stream_new(const struct thaw_codec *codec, struct thaw_task *t, const char *id, long created,
                                    struct thaw_replay *replay)
{
    struct thaw_stream *st = calloc(1, sizeof *st);

    if (!st)
        return NULL;
    st->task = t;
    thaw_task_reader(t, &st->rd);
    st->cs.codec = codec;
    snprintf(st->cs.id, sizeof st->cs.id, "%s", id);
    st->cs.model = t->model_name;
    st->cs.created = created;
    st->cs.req = &t->req;
    st->cs.n_prompt = t->n_prompt;
    st->cs.parser = t->gen.parser;
    st->cs.call_prefix = t->id_prefix;
    st->cs.rd = &st->rd;
    st->cs.put = frame;
    st->cs.sink = st;
    st->replay = replay;
    atomic_store(&st->last_out_us, thaw_now_us());
    pinger_add(st);
    return st;
}

void thaw_stream_free(void *ud)
{
    struct thaw_stream *st = ud;

    pinger_remove(st);
    if (st->replay) {
        thaw_replay_finish(st->replay);
        thaw_replay_unref(st->replay);
    }
    thaw_task_abandon(st->task);
    thaw_buf_free(&st->pending);
    thaw_codec_stream_free(&st->cs);
    free(st);
}

/* ---- the thread --------------------------------------------------------------------- */

/* Every open stream is on one list; once a second the thread wakes those
 * that have sent nothing for the interval (a long prefill, a slow queue),
 * and their read sends the comment. A stream whose client left with a
 * replay to fill is detached: the thread reads its reply on (every
 * DRAIN_MS while there is one: its client is gone, so nothing wakes it)
 * into the replay, to the end or a cancel. Lock order: list, then a
 * task's mu. */
#define DRAIN_MS 50
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct thaw_stream *head;
    _Atomic int64_t interval_us; /* 0 = off */
    bool running, stop;
    pthread_t thread;
} pinger = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, 0, false, false, 0};

static int64_t ping_us(void) { return atomic_load(&pinger.interval_us); }

static void pinger_add(struct thaw_stream *st)
{
    pthread_mutex_lock(&pinger.mu);
    st->next = pinger.head;
    if (pinger.head)
        pinger.head->prev = st;
    pinger.head = st;
    pthread_mutex_unlock(&pinger.mu);
}

/* Takes st off the list. With pinger.mu held. */
static void unlist_locked(struct thaw_stream *st)
{
    if (st->prev)
        st->prev->next = st->next;
    else
        pinger.head = st->next;
    if (st->next)
        st->next->prev = st->prev;
    st->prev = st->next = NULL;
}

/* A detached stream done with: off the list, onto `*ended`. With pinger.mu held. */
static void end_locked(struct thaw_stream *st, struct thaw_stream **ended)
{
    st->detached = false; /* its end frees it: off the list first */
    unlist_locked(st);
    st->ended = *ended;
    *ended = st;
}

static void pinger_remove(struct thaw_stream *st)
{
    pthread_mutex_lock(&pinger.mu);
    if (st->prev || pinger.head == st) /* else not listed: a detached stream, ended */
        unlist_locked(st);
    pthread_mutex_unlock(&pinger.mu);
}

/* A detached stream's news into its replay (the framed bytes go nowhere
 * else). True when it is done: ended, cancelled, or out of memory. */
static bool drain(struct thaw_stream *st)
{
    for (;;) {
        thaw_buf_truncate(&st->pending, 0);
        st->off_pending = 0;
        if (st->cs.finished || thaw_replay_cancelled(st->replay))
            return true;
        int rc = refill(st);
        if (rc == THAW_CODEC_WAIT)
            return false;
        if (rc != 0)
            return true;
    }
}

bool thaw_stream_detach(struct thaw_stream *st, void (*on_end)(void *ud), void *ud)
{
    if (!st->replay || st->cs.finished || thaw_replay_cancelled(st->replay))
        return false;
    pthread_mutex_lock(&pinger.mu);
    bool ok = pinger.running && !pinger.stop;
    if (ok) {
        st->on_end = on_end;
        st->on_end_ud = ud;
        st->detached = true;
        pthread_cond_signal(&pinger.cv);
    }
    pthread_mutex_unlock(&pinger.mu);
    if (ok)
        LOG_INF("a stream's client left: its reply goes on into its replay (GET /v1/stream)");
    return ok;
}

/* Ends the streams on `ended` (without the list's lock: ending frees). */
static void end_all(struct thaw_stream *ended)
{
    while (ended) {
        struct thaw_stream *st = ended;
        ended = st->ended;
        st->on_end(st->on_end_ud);
    }
}

static void *pinger_main(void *ud)
{
    bool draining = false;

    (void)ud;
    pthread_mutex_lock(&pinger.mu);
    while (!pinger.stop) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        if (draining) {
            until.tv_nsec += DRAIN_MS * 1000000L;
            if (until.tv_nsec >= 1000000000L) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000L;
            }
        } else {
            until.tv_sec += 1;
        }
        pthread_cond_timedwait(&pinger.cv, &pinger.mu, &until);
        int64_t now = thaw_now_us();
        struct thaw_stream *ended = NULL, *next;
        draining = false;
        for (struct thaw_stream *st = pinger.head; st && !pinger.stop; st = next) {
            struct thaw_task *t = st->task;
            next = st->next;
            if (st->detached) {
                if (drain(st))
                    end_locked(st, &ended);
                else
                    draining = true;
                continue;
            }
            if (ping_us() <= 0 || now - atomic_load(&st->last_out_us) < ping_us() || !t->client || !t->client->wake)
                continue;
            pthread_mutex_lock(&t->mu); /* wake's contract: called with the task's mu held */
            t->client->wake(t->client_ud);
            pthread_mutex_unlock(&t->mu);
        }
        if (ended) {
            pthread_mutex_unlock(&pinger.mu);
            end_all(ended);
            pthread_mutex_lock(&pinger.mu);
        }
    }
    pthread_mutex_unlock(&pinger.mu);
    return NULL;
}

int thaw_stream_pinger_start(int interval_s)
{
    atomic_store(&pinger.interval_us, interval_s > 0 ? (int64_t)interval_s * 1000000 : 0);
    pinger.stop = false;
    if (pthread_create(&pinger.thread, NULL, pinger_main, NULL) != 0) {
        atomic_store(&pinger.interval_us, 0);
        return THAW_ENOMEM;
    }
    pinger.running = true;
    return 0;
}

void thaw_stream_pinger_stop(void)
{
    if (!pinger.running)
        return;
    pthread_mutex_lock(&pinger.mu);
    pinger.stop = true;
    pthread_cond_signal(&pinger.cv);
    pthread_mutex_unlock(&pinger.mu);
    pthread_join(pinger.thread, NULL);
    /* the detached streams left end now (their replays finish) */
    struct thaw_stream *ended = NULL;
    pthread_mutex_lock(&pinger.mu);
    for (struct thaw_stream *st = pinger.head, *next; st; st = next) {
        next = st->next;
        if (st->detached)
            end_locked(st, &ended);
    }
    pinger.running = false;
    pthread_mutex_unlock(&pinger.mu);
    end_all(ended);
    atomic_store(&pinger.interval_us, 0);
}
