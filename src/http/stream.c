/* stream.c — a streamed reply on its way to the client: the engine's task
 * followed, its codec's events framed as SSE, and the pinger that keeps a
 * silent stream open.
 *
 * Map:
 *   ---- framing ----    the pending bytes: "event:" / "data:" lines (the codec's put)
 *   ---- the reply ----  the task's news -> the codec's step (api/codec.h) -> framed bytes
 *   ---- pings ----      --sse-ping-interval: one thread wakes silent streams, which send ":"
 *
 * What the events are and say is the codec's: this file names no API.
 */
#include "http/stream.h"

#include "base/buf.h"
#include "base/clock.h"
#include "base/error.h"
#include "http/http.h"

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
    rc = thaw_codec_stream_step(&st->cs, &nw);
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

struct thaw_stream *thaw_stream_new(const struct thaw_codec *codec, struct thaw_task *t, const char *id, long created)
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
    atomic_store(&st->last_out_us, thaw_now_us());
    pinger_add(st);
    return st;
}

void thaw_stream_free(void *ud)
{
    struct thaw_stream *st = ud;

    pinger_remove(st);
    thaw_task_abandon(st->task);
    thaw_buf_free(&st->pending);
    thaw_codec_stream_free(&st->cs);
    free(st);
}

/* ---- pings -------------------------------------------------------------------------- */

/* Every open stream is on one list; once a second the pinger wakes those
 * that have sent nothing for the interval (a long prefill, a slow queue),
 * and their read sends the comment. Lock order: list, then a task's mu. */
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

static void pinger_remove(struct thaw_stream *st)
{
    pthread_mutex_lock(&pinger.mu);
    if (st->prev)
        st->prev->next = st->next;
    else
        pinger.head = st->next;
    if (st->next)
        st->next->prev = st->prev;
    st->prev = st->next = NULL;
    pthread_mutex_unlock(&pinger.mu);
}

static void *pinger_main(void *ud)
{
    (void)ud;
    pthread_mutex_lock(&pinger.mu);
    while (!pinger.stop) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 1;
        pthread_cond_timedwait(&pinger.cv, &pinger.mu, &until);
        int64_t now = thaw_now_us();
        for (struct thaw_stream *st = pinger.head; st && !pinger.stop; st = st->next) {
            struct thaw_task *t = st->task;
            if (now - atomic_load(&st->last_out_us) < ping_us() || !t->client || !t->client->wake)
                continue;
            pthread_mutex_lock(&t->mu); /* wake's contract: called with the task's mu held */
            t->client->wake(t->client_ud);
            pthread_mutex_unlock(&t->mu);
        }
    }
    pthread_mutex_unlock(&pinger.mu);
    return NULL;
}

int thaw_stream_pinger_start(int interval_s)
{
    if (interval_s <= 0)
        return 0;
    atomic_store(&pinger.interval_us, (int64_t)interval_s * 1000000);
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
    pinger.running = false;
    atomic_store(&pinger.interval_us, 0);
}
