/* replay.c — streamed replies kept for a client that comes back: the
 * sessions table, each session's bytes, its readers. replay.h has the
 * contract and the invariants.
 *
 * Map:
 *   ---- the table ----    one lock, a list of sessions, the TTL sweep
 *   ---- producers ----    open, append, loaded, finish, forget, cancel
 *   ---- readers ----      GET /v1/stream's byte stream
 *   ---- lookup ----       POST /v1/streams/lookup's answer
 *
 * Memory: a session's bytes sit in one buffer of at most
 * THAW_REPLAY_MAX_BYTES (the oldest dropped first: `dropped` counts them,
 * so an offset is a byte of the whole stream); the session is freed when
 * the table, its producer and its readers have all let go.
 */
#include "http/replay.h"

#include "base/buf.h"
#include "base/error.h"

#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct thaw_replay {
    char *id;
    int refs;                 /* the table's (while listed), the producer's, each reader's */
    bool listed;              /* in the table */
    bool loading, done, cancelled;
    long started_s, completed_s; /* unix seconds; completed_s 0 until done */
    struct thaw_buf bytes;    /* the stream's bytes [dropped, dropped + bytes.len) */
    size_t dropped;           /* bytes dropped from the front (the cap) */
    struct thaw_http_conn **parked; /* readers waiting for more (a ref each) */
    int n_parked, cap_parked;
    struct thaw_replay *next;
};

struct thaw_replay_reader {
    struct thaw_replay *r;
    struct thaw_http_conn *conn;
    size_t offset;            /* the next byte of the stream to send */
};

/* ---- the table ---------------------------------------------------------------------- */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct thaw_replay *sessions;

static long now_s(void) { return (long)time(NULL); }

/* Wakes and drops every parked reader. With mu held. */
static void wake_locked(struct thaw_replay *r)
{
    for (int i = 0; i < r->n_parked; i++) {
        thaw_http_wake(r->parked[i]);
        thaw_http_conn_unref(r->parked[i]);
    }
    r->n_parked = 0;
}

static void free_session(struct thaw_replay *r)
{
    thaw_buf_free(&r->bytes);
    free(r->parked);
    free(r->id);
    free(r);
}

/* The stream's end (the TTL starts); readers end where it stops. With mu held. */
static void end_locked(struct thaw_replay *r)
{
    if (!r->done) {
        r->done = true;
        r->completed_s = now_s();
    }
}

/* Drops a reference; frees on the last. With mu held. */
static void unref_locked(struct thaw_replay *r)
{
    if (--r->refs == 0)
        free_session(r);
}

/* Takes r out of the table (its reference with it). With mu held. */
static void unlist_locked(struct thaw_replay *r)
{
    struct thaw_replay **p = &sessions;

    while (*p && *p != r)
        p = &(*p)->next;
    if (!*p)
        return;
    *p = r->next;
    r->next = NULL;
    r->listed = false;
    end_locked(r); /* nobody will read on: readers end */
    wake_locked(r);
    unref_locked(r);
}

/* Invariant 3: forgets the sessions that ended more than the TTL ago. With mu held. */
static void sweep_locked(void)
{
    long cutoff = now_s() - THAW_REPLAY_TTL_S;

    for (struct thaw_replay *r = sessions, *next; r; r = next) {
        next = r->next;
        if (r->done && r->completed_s <= cutoff)
            unlist_locked(r);
    }
}

static struct thaw_replay *find_locked(const char *id)
{
    for (struct thaw_replay *r = sessions; r; r = r->next)
        if (strcmp(r->id, id) == 0)
            return r;
    return NULL;
}

/* ---- producers ---------------------------------------------------------------------- */

struct thaw_replay *thaw_replay_open(const char *id, bool loading)
{
    size_t n = id ? strlen(id) : 0;
    struct thaw_replay *r, *old;

    if (n == 0 || n > THAW_REPLAY_MAX_ID || !(r = calloc(1, sizeof *r)))
        return NULL;
    if (!(r->id = strdup(id))) {
        free(r);
        return NULL;
    }
    r->refs = 2; /* the table's, the producer's */
    r->listed = true;
    r->loading = loading;
    r->started_s = now_s();
    pthread_mutex_lock(&mu);
    sweep_locked();
    if ((old = find_locked(id))) { /* invariant 1 */
        old->cancelled = true;
        unlist_locked(old);
    }
    r->next = sessions;
    sessions = r;
    pthread_mutex_unlock(&mu);
    return r;
}

void thaw_replay_ref(struct thaw_replay *r)
{
    pthread_mutex_lock(&mu);
    r->refs++;
    pthread_mutex_unlock(&mu);
}

void thaw_replay_unref(struct thaw_replay *r)
{
    if (!r)
        return;
    pthread_mutex_lock(&mu);
    unref_locked(r);
    pthread_mutex_unlock(&mu);
}

void thaw_replay_append(struct thaw_replay *r, const char *data, size_t n)
{
    pthread_mutex_lock(&mu);
    if (!r->done && n > 0) {
        if (n >= THAW_REPLAY_MAX_BYTES) { /* invariant 2: only the tail fits */
            r->dropped += r->bytes.len + (n - THAW_REPLAY_MAX_BYTES);
            thaw_buf_truncate(&r->bytes, 0);
            data += n - THAW_REPLAY_MAX_BYTES;
            n = THAW_REPLAY_MAX_BYTES;
        } else if (r->bytes.len + n > THAW_REPLAY_MAX_BYTES) {
            size_t drop = r->bytes.len + n - THAW_REPLAY_MAX_BYTES;
            memmove(r->bytes.data, r->bytes.data + drop, r->bytes.len - drop);
            thaw_buf_truncate(&r->bytes, r->bytes.len - drop);
            r->dropped += drop;
        }
        if (thaw_buf_append(&r->bytes, data, n) != 0)
            end_locked(r); /* out of memory: readers end here rather than skip bytes */
        wake_locked(r);
    }
    pthread_mutex_unlock(&mu);
}

void thaw_replay_loaded(struct thaw_replay *r)
{
    pthread_mutex_lock(&mu);
    r->loading = false;
    pthread_mutex_unlock(&mu);
}

void thaw_replay_finish(struct thaw_replay *r)
{
    pthread_mutex_lock(&mu);
    r->loading = false;
    end_locked(r);
    wake_locked(r);
    pthread_mutex_unlock(&mu);
}

void thaw_replay_forget(struct thaw_replay *r)
{
    pthread_mutex_lock(&mu);
    if (r->listed)
        unlist_locked(r);
    pthread_mutex_unlock(&mu);
}

void thaw_replay_abort(struct thaw_replay *r)
{
    pthread_mutex_lock(&mu);
    if (r->listed && r->loading)
        unlist_locked(r);
    pthread_mutex_unlock(&mu);
}

bool thaw_replay_cancelled(const struct thaw_replay *r)
{
    pthread_mutex_lock(&mu);
    bool c = r->cancelled;
    pthread_mutex_unlock(&mu);
    return c;
}

bool thaw_replay_cancel(const char *id)
{
    struct thaw_replay *r;

    pthread_mutex_lock(&mu);
    if ((r = find_locked(id))) {
        r->cancelled = true;
        unlist_locked(r);
    }
    pthread_mutex_unlock(&mu);
    return r != NULL;
}

void thaw_replay_shutdown(void)
{
    pthread_mutex_lock(&mu);
    while (sessions)
        unlist_locked(sessions);
    pthread_mutex_unlock(&mu);
}

/* ---- readers ------------------------------------------------------------------------ */

int thaw_replay_reader_new(const char *id, size_t from, struct thaw_http_conn *conn,
                           struct thaw_replay_reader **out)
{
    struct thaw_replay_reader *rd;
    struct thaw_replay *r;
    int rc = 0;

    if (!(rd = calloc(1, sizeof *rd)))
        return THAW_ENOMEM;
    pthread_mutex_lock(&mu);
    sweep_locked();
    if (!(r = find_locked(id)))
        rc = THAW_ENOTFOUND;
    else if (r->loading)
        rc = THAW_EBUSY;
    else if (from < r->dropped)
        rc = THAW_EINVAL;
    else
        r->refs++;
    pthread_mutex_unlock(&mu);
    if (rc != 0) {
        free(rd);
        return rc;
    }
    thaw_http_conn_ref(conn);
    rd->r = r;
    rd->conn = conn;
    rd->offset = from;
    *out = rd;
    return 0;
}

/* Room for one more parked reader. 0 or THAW_ENOMEM. With mu held. */
static int park_room(struct thaw_replay *r)
{
    if (r->n_parked < r->cap_parked)
        return 0;
    int cap = r->cap_parked ? 2 * r->cap_parked : 4;
    struct thaw_http_conn **p = realloc(r->parked, (size_t)cap * sizeof *p);
    if (!p)
        return THAW_ENOMEM;
    r->parked = p;
    r->cap_parked = cap;
    return 0;
}

ssize_t thaw_replay_reader_read(void *ud, char *buf, size_t max)
{
    struct thaw_replay_reader *rd = ud;
    struct thaw_replay *r = rd->r;
    ssize_t got;

    pthread_mutex_lock(&mu);
    size_t end = r->dropped + r->bytes.len;
    if (rd->offset < r->dropped) {
        got = -1; /* dropped under it: the client starts again (cut the connection) */
    } else if (rd->offset < end) {
        size_t n = end - rd->offset < max ? end - rd->offset : max;
        memcpy(buf, r->bytes.data + (rd->offset - r->dropped), n);
        rd->offset += n;
        got = (ssize_t)n;
    } else if (r->done || rd->offset > end) {
        got = 0;
    } else if (park_room(r) != 0) {
        got = -1;
    } else {
        thaw_http_conn_ref(rd->conn);
        r->parked[r->n_parked++] = rd->conn;
        got = THAW_HTTP_STREAM_WAIT;
    }
    pthread_mutex_unlock(&mu);
    return got;
}

void thaw_replay_reader_free(void *ud)
{
    struct thaw_replay_reader *rd = ud;

    thaw_replay_unref(rd->r);
    thaw_http_conn_unref(rd->conn);
    free(rd);
}

/* ---- lookup ------------------------------------------------------------------------- */

static bool named(const struct thaw_replay *r, const char *const *ids, int n)
{
    for (int i = 0; i < n; i++) {
        size_t k = strlen(ids[i]);
        if (k == 0)
            continue;
        if (strcmp(r->id, ids[i]) == 0 || (strncmp(r->id, ids[i], k) == 0 && strncmp(r->id + k, "::", 2) == 0))
            return true;
    }
    return false;
}

char *thaw_replay_lookup_json(const char *const *ids, int n)
{
    json_t *a = json_array();
    char *s = NULL;

    if (!a)
        return NULL;
    pthread_mutex_lock(&mu);
    sweep_locked();
    for (struct thaw_replay *r = sessions; r; r = r->next)
        if (named(r, ids, n) &&
            json_array_append_new(a, json_pack("{s:s, s:b, s:I, s:I, s:I}", "conversation_id", r->id, "is_done",
                                               r->done, "total_bytes", (json_int_t)(r->dropped + r->bytes.len),
                                               "started_at", (json_int_t)r->started_s, "completed_at",
                                               (json_int_t)r->completed_s)) != 0)
            break;
    pthread_mutex_unlock(&mu);
    s = json_dumps(a, JSON_COMPACT);
    json_decref(a);
    return s;
}
