/* server.c — the routes and the `thaw serve` lifecycle.
 *
 * Map:
 *   ---- auth ----          Bearer / x-api-key keys -> namespace
 *   ---- chat route ----    the route's codec parses, the engine answers, the codec replies (whole, or
 *                           streamed: stream.c frames it); the APIs are the codecs' (api/codec.h)
 *   ---- embeddings ----    --embedding's /embedding(s), /v1/embeddings and /rerank & co.: one task per
 *                           input through the engine's queue and slots (api/api_embed.h has the shapes)
 *   ---- other routes ----  /v1/models, /health, /metrics, /cache, the page (/, /webui/); llama-server's
 *                           /tokenize, /detokenize, /apply-template, /props (their bodies: api/api_llamaserver.h)
 *   ---- serve ----         start-up, signal wait, orderly shutdown
 */
#include "http/server.h"

#include "api/api.h"
#include "api/api_embed.h"
#include "api/api_llamaserver.h"
#include "api/codec.h"
#include "base/clock.h"
#include "base/config.h"
#include "base/error.h"
#include "base/fmt.h"
#include "base/log.h"
#include "base/metrics.h"
#include "base/testhooks.h"
#include "engine/engine.h"
#include "engine/models.h"
#include "engine/prepare.h"
#include "engine/slots_view.h"
#include "engine/task.h"
#include "http/http.h"
#include "http/replay.h"
#include "http/stream.h"
#include "http/webui.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct server {
    struct thaw_config cfg;
    struct thaw_metrics metrics;
    struct thaw_models *models; /* -m's one, or --models-dir's (models.h) */
    struct thaw_http *http;
    long started;
    char started_text[24]; /* `started` in decimal, for /metrics' Process-Start-Time-Unix */
    const char *metrics_headers[3];
    uint8_t key_ns[THAW_MAX_API_KEYS][THAW_KEY_BYTES]; /* thaw_keys_namespace of each --api-key */
    uint8_t anon_ns[THAW_KEY_BYTES];                   /* the namespace without keys */
    /* AIP_MODE=PREDICTION (Vertex AI): AIP_PREDICT_ROUTE's path, and
     * AIP_HEALTH_ROUTE's ("" = /health only); predict[0] == '\0': off */
    char predict[128], health[128];
};

static void set_json(struct thaw_http_response *r, int status, char *body)
{
    r->status = status;
    r->content_type = "application/json";
    r->body = body;
    r->n_body = body ? strlen(body) : 0;
}

/* A 200 whose body is an event stream `read` produces from `ud` (freed by `free_fn`). */
static void set_sse(struct thaw_http_response *r, thaw_http_stream_fn read, void *ud, void (*free_fn)(void *))
{
    r->status = 200;
    r->content_type = "text/event-stream; charset=utf-8";
    r->stream = read;
    r->stream_ud = ud;
    r->stream_free = free_fn;
}

static void set_error(struct server *srv, struct thaw_http_response *r, int status, const char *msg)
{
    (void)srv;
    set_json(r, status, thaw_api_error_json(status, msg));
}

static void set_codec_error(struct thaw_http_response *r, const struct thaw_codec *c, int status, const char *msg)
{
    set_json(r, status, c->error_json(status, msg));
}

/* ---- auth ----------------------------------------------------------------------- */

/* Finds the tenant of a request: 0 and its namespace in `ns`, or -1 (no or
 * a wrong key). The key is the Bearer token, else the x-api-key header
 * (Anthropic's clients). The presented key is hashed and the hash compared
 * with every key's, all of them, in constant time: neither a key's bytes
 * nor its length show in the timing. */
static int authenticate(const struct server *srv, const struct thaw_http_request *hr, uint8_t ns[THAW_KEY_BYTES])
{
    const char *header = hr->authorization, *key = NULL;
    uint8_t h[THAW_KEY_BYTES];
    int found = -1;

    if (srv->cfg.n_api_keys == 0) {
        memcpy(ns, srv->anon_ns, THAW_KEY_BYTES);
        return 0;
    }
    if (header && strncmp(header, "Bearer ", 7) == 0 && header[7])
        key = header + 7;
    else if (!header && hr->x_api_key && hr->x_api_key[0])
        key = hr->x_api_key;
    if (!key)
        return -1;
    thaw_keys_namespace(key, strlen(key), h);
    for (int i = 0; i < srv->cfg.n_api_keys; i++)
        if (sodium_memcmp(h, srv->key_ns[i], THAW_KEY_BYTES) == 0)
            found = i;
    if (found >= 0)
        memcpy(ns, srv->key_ns[found], THAW_KEY_BYTES);
    return found >= 0 ? 0 : -1;
}

/* ---- chat route ------------------------------------------------------------------ */

static void make_id(const char *prefix, char out[48])
{
    unsigned char r[12];
    size_t n = strlen(prefix);

    randombytes_buf(r, sizeof r);
    memcpy(out, prefix, n);
    thaw_hex(r, sizeof r, out + n);
}

/* The engine reaches the HTTP connection through these (task.h). */
static void client_wake(void *ud) { thaw_http_wake(ud); }
static bool client_alive(void *ud) { return thaw_http_conn_alive(ud); }
static void client_release(void *ud) { thaw_http_conn_unref(ud); }
static const struct thaw_task_client http_client = {client_wake, client_alive, client_release};

/* A stream kept for replay (X-Conversation-Id, replay.h) reaches its
 * connection the same way, but lives while its replay is not cancelled:
 * the reply goes on when the client leaves (a page reload). */
struct replay_client {
    struct thaw_http_conn *conn;
    struct thaw_replay *replay;
};
static void replay_wake(void *ud) { thaw_http_wake(((struct replay_client *)ud)->conn); }
static bool replay_alive(void *ud) { return !thaw_replay_cancelled(((struct replay_client *)ud)->replay); }
static void replay_release(void *ud)
{
    struct replay_client *rc = ud;

    thaw_http_conn_unref(rc->conn);
    thaw_replay_unref(rc->replay);
    free(rc);
}
static const struct thaw_task_client replay_client = {replay_wake, replay_alive, replay_release};

/* What a server started with --embedding answers on the chat routes, in
 * each API's error shape (llama-server's --embedding is "restricted to
 * the embedding use case" too: its context computes vectors, not logits). */
#define EMBEDDING_ONLY                                                                                                 \
    "This server serves embeddings only (started with --embedding): chat and completions need a server started "  \
    "without it"

/* A non-streaming request waiting for the engine: its task and its API. */
struct deferred {
    struct thaw_task *task[THAW_API_MAX_N]; /* n_tasks: one per choice ('n'), or per prompt (split) */
    int n_tasks;
    bool split;                             /* one per prompt of a split body: merge_split answers */
    const struct thaw_codec *codec;
    struct server *srv;
    struct thaw_model *mdl; /* held until the connection is done */
};

/* The connection is done with a deferred request (answered, or the client
 * gone): nobody is left to read what the engine would still produce. */
static void deferred_free(void *ud)
{
    struct deferred *d = ud;

    for (int i = 0; i < d->n_tasks; i++)
        thaw_task_abandon(d->task[i]);
    thaw_models_release(d->srv->models, d->mdl);
    free(d);
}

/* One task's whole reply in its codec's shape; NULL on ENOMEM. */
static char *reply_body(struct server *srv, struct thaw_model *mdl, struct thaw_task *t, const struct thaw_codec *c,
                        const char *id)
{
    struct thaw_reply_reader rd;
    struct thaw_reply reply;
    char *prompt = NULL, *body;

    thaw_task_reader(t, &rd);
    thaw_task_reply(t, &rd, &reply);
    reply.id = id;
    reply.created = time(NULL);
    /* llama-server's __verbose: the request's "verbose", else the server's -v */
    reply.verbose = (c->caps & THAW_CODEC_VERBOSE) &&
                    (t->req.verbose >= 0 ? t->req.verbose > 0 : srv->cfg.verbosity >= THAW_LOG_DEBUG);
    if (t->message_json && (reply.verbose || (c->caps & THAW_CODEC_PROMPT)))
        reply.prompt = prompt = thaw_chat_prompt_text(thaw_engine_chat(thaw_model_engine(mdl)), t->prompt, t->n_prompt);
    int32_t *bias_tok = NULL;
    float *bias_val = NULL;
    if (t->message_json && (c->caps & THAW_CODEC_PROMPT)) {
        int n = thaw_engine_biases(thaw_model_engine(mdl), &t->req, &bias_tok, &bias_val);
        if (n < 0) {
            free(prompt);
            return NULL;
        }
        reply.bias_tok = bias_tok, reply.bias_val = bias_val, reply.n_bias = n;
    }
    body = t->message_json ? c->reply(&reply) : NULL;
    free(prompt);
    free(bias_tok);
    free(bias_val);
    return body;
}

/* A non-streaming reply, once the engine is done with every choice (the
 * request was deferred until then; a wake before the end only defers it
 * again). */
static void chat_resume(void *ud, struct thaw_http_response *r)
{
    struct deferred *d = ud;
    char id[48];

    for (int i = 0; i < d->n_tasks; i++)
        if (!thaw_task_done(d->task[i])) {
            r->defer = true;
            r->resume = chat_resume;
            r->defer_ud = d;
            return;
        }
    for (int i = 0; i < d->n_tasks; i++) {
        struct thaw_task *t = d->task[i];
        if (t->http_status != 200) {
            set_codec_error(r, d->codec, t->http_status, t->error ? t->error : "error");
            return;
        }
    }
    make_id(d->codec->id_prefix, id);
    if (d->split) {
        char *bodies[THAW_API_MAX_N];
        for (int i = 0; i < d->n_tasks; i++)
            bodies[i] = reply_body(d->srv, d->mdl, d->task[i], d->codec, id);
        set_json(r, 200, d->codec->merge_split(bodies, d->n_tasks));
        if (!r->body)
            set_codec_error(r, d->codec, 500, "out of memory");
        return;
    }
    char *body = reply_body(d->srv, d->mdl, d->task[0], d->codec, id);
    for (int i = 1; i < d->n_tasks && body; i++) /* n > 1: only with merge_choice (serve_chat) */
        body = d->codec->merge_choice(body, reply_body(d->srv, d->mdl, d->task[i], d->codec, id), i);
    set_json(r, 200, body);
    if (!r->body)
        set_codec_error(r, d->codec, 500, "out of memory");
}

/* The body through the route's codec: 0 and the request, or an answered
 * error (nonzero; nothing to free). */
static int parse(struct server *srv, const struct thaw_http_request *hr, const struct thaw_codec *c,
                 struct thaw_http_response *r, struct thaw_chat_request *req)
{
    char err[512];
    int rc;

    /* the proxy in front routes on it; thaw's cache keys come from the
     * messages, so it is only bounded (as prompt_cache_key) and logged */
    if (hr->conversation_id && strlen(hr->conversation_id) > THAW_API_MAX_CONVERSATION_ID) {
        snprintf(err, sizeof err, "the 'X-Conversation-Id' header is longer than %d bytes",
                 THAW_API_MAX_CONVERSATION_ID);
        set_codec_error(r, c, 400, err);
        return THAW_EINVAL;
    }
    if ((rc = c->parse(hr->body, hr->n_body, srv->cfg.cache_prompt, req, err, sizeof err)) != 0)
        set_codec_error(r, c, rc == THAW_EINVAL ? 400 : 500, rc == THAW_EINVAL ? err : thaw_strerror(rc));
    return rc;
}

/* Parse, prepare (prepare.h) and set up one task for the request, not
 * submitted, the connection referenced for it. NULL when the request was
 * answered (an error in r). */
static struct thaw_task *build_task(struct server *srv, struct thaw_model *mdl, const struct thaw_http_request *hr,
                                    const uint8_t ns[THAW_KEY_BYTES], struct thaw_http_response *r,
                                    const struct thaw_codec *c)
{
    struct thaw_chat_request req;
    struct thaw_task *t;
    char err[512];
    int rc;

    if (parse(srv, hr, c, r, &req) != 0)
        return NULL;
    if ((rc = thaw_prepare_task(thaw_model_engine(mdl), &req, ns, hr->conversation_id, &t, err, sizeof err)) != 0) {
        set_codec_error(r, c, rc == THAW_EINVAL ? 400 : 500, rc == THAW_EINVAL ? err : thaw_strerror(rc));
        return NULL;
    }
    /* before submit: the engine may finish (and wake) at once */
    thaw_http_conn_ref(hr->conn);
    t->client = &http_client;
    t->client_ud = hr->conn;
    return t;
}

/* Submits t, or answers the engine's refusal in r (then t's reference is
 * dropped). Returns the engine's rc. */
static int submit(struct server *srv, struct thaw_model *mdl, struct thaw_task *t, struct thaw_http_response *r,
                  const struct thaw_codec *c)
{
    int rc = thaw_engine_submit(thaw_model_engine(mdl), t);

    if (rc == 0) {
        atomic_fetch_add(&srv->metrics.chat_requests, 1);
        return 0;
    }
    char msg[160];
    int status = 500;
    if (rc == THAW_ECTXFULL) {
        set_json(r, 400, c->too_long_json(t->n_prompt, thaw_engine_n_ctx_slot(thaw_model_engine(mdl))));
        thaw_task_release(t);
        return rc;
    }
    if (rc == THAW_EBUSY) {
        status = 503;
        snprintf(msg, sizeof msg, "the server is busy: every slot is working and the queue is full; retry later");
    } else if (rc == THAW_ESHUTDOWN) {
        status = 503;
        snprintf(msg, sizeof msg, "the server is shutting down");
    } else {
        snprintf(msg, sizeof msg, "%s", thaw_strerror(rc));
    }
    set_codec_error(r, c, status, msg);
    thaw_task_release(t);
    return rc;
}

/* A stream and the hold on its model: the model is not unloaded while
 * the stream's task may still read its engine. */
struct held_stream {
    struct thaw_stream *st;
    struct server *srv;
    struct thaw_model *mdl;
};

static ssize_t held_stream_read(void *ud, char *buf, size_t max)
{
    return thaw_stream_read(((struct held_stream *)ud)->st, buf, max);
}

static void held_stream_end(void *ud)
{
    struct held_stream *hs = ud;

    thaw_stream_free(hs->st);
    thaw_models_release(hs->srv->models, hs->mdl);
    free(hs);
}

/* The connection is done with it: a stream kept for replay whose client
 * left goes on (its model held) until its reply ends. */
static void held_stream_free(void *ud)
{
    struct held_stream *hs = ud;

    if (!thaw_stream_detach(hs->st, held_stream_end, hs))
        held_stream_end(hs);
}

/* A replay no stream will fill (its request failed): forgotten, its reference dropped. */
static void replay_drop(struct thaw_replay *rp)
{
    if (rp) {
        thaw_replay_forget(rp);
        thaw_replay_unref(rp);
    }
}

/* The replay a streamed request with X-Conversation-Id fills (the one it
 * opened while its model loaded, or a new one), its task's client made to
 * live while the replay does. NULL: none (no id), or out of memory (then
 * the stream is not kept: it still streams). */
static struct thaw_replay *replay_for(const struct thaw_http_request *hr, struct thaw_task *t)
{
    struct thaw_replay *rp;
    struct replay_client *rc;

    if (!hr->conversation_id || !*hr->conversation_id)
        return NULL;
    if (hr->replay)
        thaw_replay_ref(rp = hr->replay);
    else if (!(rp = thaw_replay_open(hr->conversation_id, false)))
        return NULL;
    if (!(rc = calloc(1, sizeof *rc))) {
        replay_drop(rp);
        return NULL;
    }
    thaw_replay_loaded(rp);
    thaw_replay_ref(rp);
    rc->conn = t->client_ud; /* build_task's reference, now the replay client's */
    rc->replay = rp;
    t->client = &replay_client;
    t->client_ud = rc;
    return rp;
}

/* A body with several prompts (codec.h's split): a task per prompt, each
 * its own request through the slots, answered together once all are done
 * (merge_split), never streamed. Takes `bodies`. */
static void route_split(struct server *srv, struct thaw_model *mdl, const struct thaw_http_request *hr,
                        const uint8_t ns[THAW_KEY_BYTES], struct thaw_http_response *r, const struct thaw_codec *c,
                        char **bodies, int n)
{
    struct deferred *d = NULL;
    char msg[160];

    if (n > THAW_API_MAX_N) {
        snprintf(msg, sizeof msg, "'prompt' holds %d prompts: at most %d are served in one request", n,
                 THAW_API_MAX_N);
        set_codec_error(r, c, 400, msg);
        goto out;
    }
    if (!(d = calloc(1, sizeof *d))) {
        set_codec_error(r, c, 500, "out of memory");
        goto out;
    }
    d->split = true;
    d->codec = c;
    d->srv = srv;
    d->mdl = mdl;
    thaw_models_hold(srv->models, mdl);
    for (int i = 0; i < n; i++) {
        struct thaw_http_request one = *hr;
        one.body = bodies[i];
        one.n_body = strlen(bodies[i]);
        struct thaw_task *t = build_task(srv, mdl, &one, ns, r, c);
        if (!t)
            goto out_free; /* r holds the answer */
        if (t->req.stream || t->req.n_choices > 1) {
            set_codec_error(r, c, 400, t->req.stream ? "several prompts are served without streaming: send "
                                                       "'stream': false, or one request per prompt"
                                                     : "'n' > 1 is served with one prompt per request");
            thaw_task_release(t);
            goto out_free;
        }
        if (submit(srv, mdl, t, r, c) != 0)
            goto out_free;
        d->task[d->n_tasks++] = t;
    }
    r->defer = true;
    r->resume = chat_resume;
    r->defer_ud = d;
    r->defer_free = deferred_free;
    goto out;
out_free:
    deferred_free(d);
out:
    for (int i = 0; i < n; i++)
        free(bodies[i]);
    free(bodies);
}

/* POST /v1/chat/completions, /v1/messages (Claude Code adds ?beta=true: the
 * path is all that is matched), /v1/responses (Codex: {base_url}/responses),
 * /v1/completions (OpenAI's legacy API) and /completion (llama-server's): one
 * route, the route's codec */
static void route_chat(struct server *srv, struct thaw_model *mdl, const struct thaw_http_request *hr,
                       const uint8_t ns[THAW_KEY_BYTES], struct thaw_http_response *r, const struct thaw_codec *c)
{
    struct thaw_task *t;
    struct deferred *d = NULL;

    if (srv->cfg.embedding) {
        set_codec_error(r, c, 501, EMBEDDING_ONLY);
        return;
    }
    if (c->split) {
        char **bodies;
        int n_bodies;
        if (c->split(hr->body, hr->n_body, &bodies, &n_bodies) != 0) {
            set_codec_error(r, c, 500, "out of memory");
            return;
        }
        if (n_bodies > 0) {
            route_split(srv, mdl, hr, ns, r, c, bodies, n_bodies);
            return;
        }
    }
    if (!(t = build_task(srv, mdl, hr, ns, r, c)))
        return;
    int n = t->req.n_choices;
    if (n > 1 && (t->req.stream || !c->merge_choice)) {
        set_codec_error(r, c, 400,
                       t->req.stream ? "'n' > 1 is served without streaming: send 'stream': false, or one request per choice"
                                     : "'n' > 1 is for /v1/chat/completions and /v1/completions");
        thaw_task_release(t);
        return;
    }
    struct thaw_replay *rp = t->req.stream ? replay_for(hr, t) : NULL;
    if (submit(srv, mdl, t, r, c) != 0) {
        replay_drop(rp);
        return;
    }

    if (t->req.stream) {
        char id[48];
        make_id(c->id_prefix, id);
        struct held_stream *hs = calloc(1, sizeof *hs);
        if (!hs || !(hs->st = thaw_stream_new(c, t, id, time(NULL), rp))) {
            free(hs);
            thaw_task_abandon(t);
            replay_drop(rp);
            set_codec_error(r, c, 500, "out of memory");
            return;
        }
        hs->srv = srv;
        hs->mdl = mdl;
        thaw_models_hold(srv->models, mdl);
        set_sse(r, held_stream_read, hs, held_stream_free);
        return;
    }
    /* the connection sleeps until the engine is done (no thread waits) */
    if (!(d = calloc(1, sizeof *d))) {
        thaw_task_abandon(t);
        set_codec_error(r, c, 500, "out of memory");
        return;
    }
    d->task[d->n_tasks++] = t;
    d->codec = c;
    d->srv = srv;
    d->mdl = mdl;
    thaw_models_hold(srv->models, mdl);
    /* n > 1: each further choice is a task of its own, built from the same
     * body (its own sampler and seed); they queue for slots like any
     * request, and after the first the prompt is usually a cache hit */
    while (d->n_tasks < n) {
        struct thaw_task *ti = build_task(srv, mdl, hr, ns, r, c);
        if (!ti || submit(srv, mdl, ti, r, c) != 0) {
            deferred_free(d); /* r holds the answer */
            return;
        }
        d->task[d->n_tasks++] = ti;
    }
    r->defer = true;
    r->resume = chat_resume;
    r->defer_ud = d;
    r->defer_free = deferred_free;
}

/* POST /v1/messages/count_tokens (Claude Code's /context), and llama-server's
 * /v1/chat/completions/input_tokens and /v1/responses/input_tokens: the
 * prompt the request renders to, counted ({"input_tokens": n}); nothing is
 * generated. */
static void route_count(struct server *srv, struct thaw_model *mdl, const struct thaw_http_request *hr,
                        const uint8_t *ns, struct thaw_http_response *r, const struct thaw_codec *c)
{
    struct thaw_chat_request req;
    char err[512], buf[48];
    int n_prompt = 0, rc;

    (void)ns;
    if (srv->cfg.embedding) {
        set_codec_error(r, c, 501, EMBEDDING_ONLY);
        return;
    }
    if (parse(srv, hr, c, r, &req) != 0)
        return;
    if ((rc = thaw_prepare_count(thaw_model_engine(mdl), &req, &n_prompt, err, sizeof err)) != 0) {
        set_codec_error(r, c, rc == THAW_EINVAL ? 400 : 500, rc == THAW_EINVAL ? err : thaw_strerror(rc));
        return;
    }
    snprintf(buf, sizeof buf, "{\"input_tokens\":%d}", n_prompt);
    set_json(r, 200, strdup(buf));
    if (!r->body)
        set_codec_error(r, c, 500, "out of memory");
}

/* ---- embeddings ------------------------------------------------------------------ */

/* An embeddings or rerank request waiting for the engine: one task per
 * prompt, submitted at most -np at a time (a request with many inputs
 * neither fills the queue nor keeps other requests from the slots). */
struct embed_wait {
    struct server *srv;
    struct thaw_model *mdl; /* held until the connection is done */
    struct thaw_http_conn *conn;
    bool rerank;
    struct thaw_embed_request er;  /* !rerank */
    struct thaw_rerank_request rr; /* rerank */
    llama_token **prompts;         /* er's or rr's: taken by each task as it is submitted */
    int *n_prompt, n, normalize;
    struct thaw_task **task;       /* n; NULL until submitted */
    int n_submitted;
};

static void embed_wait_free(void *ud)
{
    struct embed_wait *w = ud;

    for (int i = 0; i < w->n_submitted; i++)
        thaw_task_abandon(w->task[i]);
    free(w->task);
    thaw_api_embed_request_free(&w->er);
    thaw_api_rerank_request_free(&w->rr);
    thaw_models_release(w->srv->models, w->mdl);
    free(w);
}

/* Submits prompts until -np of the request's tasks are in the engine.
 * 0, or an error answered in r. */
static int embed_submit_more(struct embed_wait *w, struct thaw_http_response *r)
{
    int in_flight = 0;

    for (int i = 0; i < w->n_submitted; i++)
        in_flight += !thaw_task_done(w->task[i]);
    while (w->n_submitted < w->n && in_flight < w->srv->cfg.n_parallel) {
        int i = w->n_submitted;
        struct thaw_task *t = thaw_task_new_embed(w->rerank ? THAW_TASK_RERANK : THAW_TASK_EMBED, w->prompts[i],
                                                  w->n_prompt[i], w->normalize);
        if (!t) {
            set_error(w->srv, r, 500, "out of memory");
            return THAW_ENOMEM;
        }
        w->prompts[i] = NULL; /* the task's now */
        t->model_name = thaw_engine_model_name(thaw_model_engine(w->mdl));
        thaw_http_conn_ref(w->conn);
        t->client = &http_client;
        t->client_ud = w->conn;
        int rc = thaw_engine_submit(thaw_model_engine(w->mdl), t);
        if (rc != 0) {
            thaw_task_release(t);
            set_error(w->srv, r, rc == THAW_ESHUTDOWN || rc == THAW_EBUSY ? 503 : 500,
                      rc == THAW_EBUSY     ? "the server is busy: every slot is working and the queue is full; retry later"
                      : rc == THAW_ESHUTDOWN ? "the server is shutting down"
                                             : thaw_strerror(rc));
            return rc;
        }
        w->task[w->n_submitted++] = t;
        in_flight++;
    }
    return 0;
}

/* The reply once every prompt's task is done; an error as soon as one
 * failed. */
static void embed_resume(void *ud, struct thaw_http_response *r)
{
    struct embed_wait *w = ud;
    bool all_done = w->n_submitted == w->n;

    for (int i = 0; i < w->n_submitted; i++) {
        struct thaw_task *t = w->task[i];
        if (!thaw_task_done(t)) {
            all_done = false;
            continue;
        }
        if (t->http_status != 200) {
            set_error(w->srv, r, t->http_status, t->error ? t->error : "error");
            return;
        }
    }
    if (!all_done) {
        if (embed_submit_more(w, r) != 0)
            return;
        r->defer = true;
        r->resume = embed_resume;
        r->defer_ud = w;
        return;
    }
    const char *model = thaw_engine_model_name(thaw_model_engine(w->mdl));
    char *body = NULL;
    if (w->rerank) {
        float *scores = malloc((size_t)w->n * sizeof *scores);
        int *n_tokens = malloc((size_t)w->n * sizeof *n_tokens);
        for (int i = 0; scores && n_tokens && i < w->n; i++) {
            scores[i] = w->task[i]->n_embd > 0 ? w->task[i]->embd[0] : -1e6f;
            n_tokens[i] = w->task[i]->n_prompt;
        }
        if (scores && n_tokens)
            body = thaw_api_rerank_reply(&w->rr, model, scores, n_tokens);
        free(scores);
        free(n_tokens);
    } else {
        struct thaw_embed_vec *v = malloc((size_t)w->n * sizeof *v);
        for (int i = 0; v && i < w->n; i++)
            v[i] = (struct thaw_embed_vec){w->task[i]->embd, w->task[i]->n_embd_rows, w->task[i]->n_embd,
                                           w->task[i]->n_prompt};
        if (v)
            body = thaw_api_embed_reply(&w->er, model, v);
        free(v);
    }
    set_json(r, 200, body);
    if (!r->body)
        set_error(w->srv, r, 500, "out of memory");
}

/* Checks each prompt against what one embedding can take, then submits
 * the first ones and defers (w is r's from here on, or freed). */
static void embed_start(struct embed_wait *w, const struct thaw_http_request *hr, struct thaw_http_response *r)
{
    int max_batch = thaw_engine_max_embed_tokens(thaw_model_engine(w->mdl)),
        n_ctx = thaw_engine_n_ctx_slot(thaw_model_engine(w->mdl));
    char msg[200];

    for (int i = 0; i < w->n; i++) {
        if (w->n_prompt[i] > max_batch || w->n_prompt[i] > n_ctx) {
            /* llama-server's words (the upstream tests look for "too large") */
            if (w->n_prompt[i] > max_batch)
                snprintf(msg, sizeof msg,
                         "input (%d tokens) is too large to process. increase the physical batch size (current "
                         "batch size: %d)",
                         w->n_prompt[i], max_batch);
            else
                snprintf(msg, sizeof msg, "input (%d tokens) is larger than the max context size (%d tokens)",
                         w->n_prompt[i], n_ctx);
            set_error(w->srv, r, 400, msg);
            embed_wait_free(w);
            return;
        }
    }
    w->conn = hr->conn;
    if (!(w->task = calloc((size_t)w->n, sizeof *w->task))) {
        set_error(w->srv, r, 500, "out of memory");
        embed_wait_free(w);
        return;
    }
    if (embed_submit_more(w, r) != 0) {
        embed_wait_free(w);
        return;
    }
    r->defer = true;
    r->resume = embed_resume;
    r->defer_ud = w;
    r->defer_free = embed_wait_free;
}

/* A new wait for one embedding or rerank request on mdl (held until the
 * wait is freed); NULL after answering 500. */
static struct embed_wait *embed_wait_new(struct server *srv, struct thaw_model *mdl, struct thaw_http_response *r)
{
    struct embed_wait *w = calloc(1, sizeof *w);

    if (!w) {
        set_error(srv, r, 500, "out of memory");
        return NULL;
    }
    w->srv = srv;
    w->mdl = mdl;
    thaw_models_hold(srv->models, mdl);
    return w;
}

/* Answers a request body embed/rerank parsing refused (rc), and frees w. */
static void embed_refused(struct embed_wait *w, struct thaw_http_response *r, int rc, const char *err)
{
    set_error(w->srv, r, rc == THAW_EINVAL ? 400 : 500, rc == THAW_EINVAL ? err : thaw_strerror(rc));
    embed_wait_free(w);
}

/* POST /embedding, /embeddings (llama-server's shape) and /v1/embeddings
 * (OpenAI's) */
static void route_embed(struct server *srv, struct thaw_model *mdl, const struct thaw_http_request *hr,
                        struct thaw_http_response *r, bool oai)
{
    struct embed_wait *w;
    char err[512];
    int rc;

    if (!srv->cfg.embedding) {
        set_error(srv, r, 501, "This server does not support embeddings. Start it with `--embeddings`");
        return;
    }
    if (oai && thaw_engine_pooling(thaw_model_engine(mdl)) == LLAMA_POOLING_TYPE_NONE) {
        set_error(srv, r, 400, "Pooling type 'none' is not OAI compatible. Please use a different pooling type");
        return;
    }
    if (!(w = embed_wait_new(srv, mdl, r)))
        return;
    if ((rc = thaw_api_parse_embed(hr->body, hr->n_body, oai, thaw_engine_chat(thaw_model_engine(mdl)),
                                   srv->cfg.embd_normalize, &w->er, err, sizeof err)) != 0) {
        embed_refused(w, r, rc, err);
        return;
    }
    w->prompts = w->er.prompts;
    w->n_prompt = w->er.n_prompt;
    w->n = w->er.n_prompts;
    w->normalize = w->er.embd_normalize;
    embed_start(w, hr, r);
}

static void route_embeddings(struct server *srv, struct thaw_model *mdl, const struct thaw_http_request *hr,
                             const uint8_t *ns, struct thaw_http_response *r)
{
    (void)ns;
    route_embed(srv, mdl, hr, r, false);
}

static void route_embeddings_oai(struct server *srv, struct thaw_model *mdl, const struct thaw_http_request *hr,
                                 const uint8_t *ns, struct thaw_http_response *r)
{
    (void)ns;
    route_embed(srv, mdl, hr, r, true);
}

/* POST /rerank, /reranking, /v1/rerank, /v1/reranking */
static void route_rerank(struct server *srv, struct thaw_model *mdl, const struct thaw_http_request *hr,
                         const uint8_t *ns, struct thaw_http_response *r)
{
    struct embed_wait *w;
    char err[512];
    int rc;

    (void)ns;
    if (!srv->cfg.embedding || thaw_engine_pooling(thaw_model_engine(mdl)) != LLAMA_POOLING_TYPE_RANK) {
        set_error(srv, r, 501, "This server does not support reranking. Start it with `--reranking`");
        return;
    }
    if (!(w = embed_wait_new(srv, mdl, r)))
        return;
    w->rerank = true;
    if ((rc = thaw_api_parse_rerank(hr->body, hr->n_body, thaw_engine_chat(thaw_model_engine(mdl)), &w->rr, err,
                                    sizeof err)) != 0) {
        embed_refused(w, r, rc, err);
        return;
    }
    w->prompts = w->rr.prompts;
    w->n_prompt = w->rr.n_prompt;
    w->n = w->rr.n_docs;
    embed_start(w, hr, r);
}

/* ---- other routes ---------------------------------------------------------------- */

static void route_health(struct server *srv, struct thaw_model *mdl, const struct thaw_http_request *hr,
                         const uint8_t *ns, struct thaw_http_response *r)
{
    (void)mdl;
    (void)srv;
    (void)hr;
    (void)ns;
    set_json(r, 200, strdup("{\"status\":\"ok\"}"));
}

/* GET /v1/models, /models: -m's model with its numbers; with --models-dir
 * every model and its status (llama-server's router list) */
static void route_models(struct server *srv, struct thaw_model *mdl, const struct thaw_http_request *hr,
                         const uint8_t *ns, struct thaw_http_response *r)
{
    struct thaw_model_meta m;

    (void)ns;
    (void)hr;
    (void)mdl;
    if (thaw_models_many(srv->models)) {
        int n = thaw_models_count(srv->models);
        struct thaw_api_router_model *list = calloc((size_t)n, sizeof *list);
        for (int i = 0; list && i < n; i++) {
            struct thaw_model_info mi;
            thaw_models_get(srv->models, i, &mi);
            list[i] = (struct thaw_api_router_model){mi.name,   mi.aliases, thaw_model_status_name(mi.status),
                                                     mi.stage,  mi.progress, mi.vision,
                                                     mi.failed, mi.waiting};
        }
        set_json(r, 200, list ? thaw_api_router_models_json(n, list, srv->started) : NULL);
        free(list);
        if (!r->body)
            set_error(srv, r, 500, "out of memory");
        return;
    }
    struct thaw_model *one;
    if (thaw_models_peek(srv->models, NULL, &one) != 0) { /* asleep (--sleep-idle-seconds): its name only */
        struct thaw_model_info mi;
        thaw_models_get(srv->models, 0, &mi);
        memset(&m, 0, sizeof m);
        set_json(r, 200, thaw_api_models_json(mi.name, srv->cfg.tags, srv->started, &m));
    } else {
        thaw_engine_model_meta(thaw_model_engine(one), &m);
        set_json(r, 200,
                 thaw_api_models_json(thaw_engine_model_name(thaw_model_engine(one)), srv->cfg.tags, srv->started,
                                      &m));
        thaw_models_unpeek(srv->models, one);
    }
}

/* POST /models/unload ({"model": NAME}), with --models-dir: llama-server's
 * router answer ({"success": true}) once the model's conversations are
 * stored and its memory freed; it waits (on this HTTP thread, up to
 * --timeout) for the requests holding the model to end. */
static void route_models_unload(struct server *srv, struct thaw_model *mdl, const struct thaw_http_request *hr,
                                const uint8_t *ns, struct thaw_http_response *r)
{
    char *name = thaw_api_request_model(hr->body, hr->n_body), msg[512];
    int rc;

    (void)mdl;
    (void)ns;
    if (!thaw_models_many(srv->models)) {
        set_error(srv, r, 501,
                  "this server serves one model (-m): start it with --models-dir to load and unload models");
        goto out;
    }
    if (!name || !*name) {
        set_error(srv, r, 400, "model name is missing from the request");
        goto out;
    }
    rc = thaw_models_unload(srv->models, name, srv->cfg.timeout_s);
    if (rc == 0) {
        set_json(r, 200, strdup("{\"success\":true}"));
    } else if (rc == THAW_ENOTFOUND) {
        char names[384];
        thaw_models_names(srv->models, names, sizeof names);
        snprintf(msg, sizeof msg, "model '%.64s' not found; the models are: %s", name, names);
        set_error(srv, r, 404, msg);
    } else if (rc == THAW_EINVAL) {
        set_error(srv, r, 400, "model is not loaded");
    } else {
        snprintf(msg, sizeof msg, "model '%.64s': %s", name, thaw_strerror(rc));
        set_error(srv, r, rc == THAW_ETIMEDOUT || rc == THAW_ESHUTDOWN ? 503 : 500, msg);
    }
out:
    free(name);
}

/* POST /models/load ({"model": NAME}): a model route (serve_with_model
 * loads it, --no-models-autoload or not, the request deferred meanwhile);
 * then llama-server's router answer ({"success": true}). */
/* GET /models/sse (llama-server's router): every model's status moves and
 * load progress from now on, one "data: {...}" event each (models.h). With
 * -m nothing ever moves: the stream stays open and quiet. */
struct models_sse {
    struct thaw_models *models;
    struct thaw_http_conn *conn;
    struct thaw_models_sub sub;
    uint64_t cursor;
    char *out; /* the event being sent */
    size_t n_out, off;
};

static ssize_t models_sse_read(void *ud, char *buf, size_t max)
{
    struct models_sse *st = ud;

    if (st->off == st->n_out) {
        char *ev = thaw_models_event_next(st->models, &st->cursor);
        free(st->out);
        st->out = NULL;
        st->off = st->n_out = 0;
        if (!ev)
            return THAW_HTTP_STREAM_WAIT; /* the next event wakes it */
        size_t cap = strlen(ev) + 9;
        if (!(st->out = malloc(cap))) {
            free(ev);
            return -1;
        }
        st->n_out = (size_t)snprintf(st->out, cap, "data: %s\n\n", ev);
        free(ev);
    }
    size_t k = st->n_out - st->off < max ? st->n_out - st->off : max;
    memcpy(buf, st->out + st->off, k);
    st->off += k;
    return (ssize_t)k;
}

static void models_sse_free(void *ud)
{
    struct models_sse *st = ud;

    thaw_models_unsubscribe(st->models, &st->sub);
    thaw_http_conn_unref(st->conn);
    free(st->out);
    free(st);
}

static void route_models_sse(struct server *srv, struct thaw_model *mdl, const struct thaw_http_request *hr,
                             const uint8_t *ns, struct thaw_http_response *r)
{
    struct models_sse *st = calloc(1, sizeof *st);

    (void)mdl;
    (void)ns;
    if (!st) {
        set_error(srv, r, 500, "out of memory");
        return;
    }
    st->models = srv->models;
    st->conn = hr->conn;
    thaw_http_conn_ref(hr->conn);
    st->sub.wake = client_wake;
    st->sub.ud = hr->conn;
    st->cursor = thaw_models_subscribe(srv->models, &st->sub);
    set_sse(r, models_sse_read, st, models_sse_free);
}

/* ---- resumable streams (replay.h) ---- */

/* GET /v1/stream?conv_id=ID&from=N: the stream kept under ID from byte N
 * (what the client had received), then live to the reply's end. */
static void route_stream_get(struct server *srv, struct thaw_model *mdl, const struct thaw_http_request *hr,
                             const uint8_t *ns, struct thaw_http_response *r)
{
    const char *id = thaw_http_query(hr->conn, "conv_id"), *from_s = thaw_http_query(hr->conn, "from");
    struct thaw_replay_reader *rd;
    unsigned long long from = 0;
    char *end;

    (void)mdl;
    (void)ns;
    if (!id || !*id) {
        set_error(srv, r, 400, "Missing conversation id: GET /v1/stream?conv_id=ID&from=N");
        return;
    }
    if (from_s && *from_s) {
        errno = 0;
        from = strtoull(from_s, &end, 10);
        if (errno || *end || *from_s == '-') {
            set_error(srv, r, 400, "Invalid 'from' offset: a byte count of the stream");
            return;
        }
    }
    int rc = thaw_replay_reader_new(id, (size_t)from, hr->conn, &rd);
    if (rc == THAW_ENOTFOUND)
        set_error(srv, r, 404, "Stream not found or expired");
    else if (rc == THAW_EBUSY)
        set_error(srv, r, 503, "Its model is loading: retry");
    else if (rc == THAW_EINVAL)
        set_error(srv, r, 400, "Stream offset lost, please restart");
    else if (rc != 0)
        set_error(srv, r, 500, "out of memory");
    if (rc != 0)
        return;
    set_sse(r, thaw_replay_reader_read, rd, thaw_replay_reader_free);
}

/* DELETE /v1/stream?conv_id=ID: the user's Stop. The reply is cancelled
 * (a request still waiting for its model too) and its stream forgotten;
 * 204 whether there was one or not, as llama-server's. */
static void route_stream_delete(struct server *srv, struct thaw_model *mdl, const struct thaw_http_request *hr,
                                const uint8_t *ns, struct thaw_http_response *r)
{
    const char *id = thaw_http_query(hr->conn, "conv_id");

    (void)mdl;
    (void)ns;
    if (!id || !*id) {
        set_error(srv, r, 400, "Missing conversation id: DELETE /v1/stream?conv_id=ID");
        return;
    }
    (void)thaw_replay_cancel(id);
    set_json(r, 204, strdup(""));
}

/* POST /v1/streams/lookup {"conversation_ids": [...]}: the streams kept
 * under the ids the client names (never any other). */
static void route_streams_lookup(struct server *srv, struct thaw_model *mdl, const struct thaw_http_request *hr,
                                 const uint8_t *ns, struct thaw_http_response *r)
{
    json_error_t jerr;
    json_t *root = json_loadb(hr->body, hr->n_body, 0, &jerr), *ids = json_object_get(root, "conversation_ids"), *v;
    const char *names[64];
    int n = 0;
    size_t i;

    (void)mdl;
    (void)ns;
    if (!json_is_object(root) || (ids && !json_is_array(ids))) {
        set_error(srv, r, 400, "invalid body: {\"conversation_ids\": [\"id\", ...]}");
        json_decref(root);
        return;
    }
    json_array_foreach(ids, i, v)
        if (json_is_string(v) && n < (int)(sizeof names / sizeof names[0]))
            names[n++] = json_string_value(v);
    set_json(r, 200, thaw_replay_lookup_json(names, n));
    json_decref(root);
    if (!r->body)
        set_error(srv, r, 500, "out of memory");
}

/* GET /props with many models and no ?model=: llama-server's router
 * answer (its role, --models-max, --models-autoload; placeholders where a
 * model's own props would be, as there). */
static void route_router_props(struct server *srv, struct thaw_http_response *r)
{
    set_json(r, 200, thaw_api_router_props_json(srv->cfg.models_max, srv->cfg.models_autoload));
    if (!r->body)
        set_error(srv, r, 500, "out of memory");
}

static void route_models_load(struct server *srv, struct thaw_model *mdl, const struct thaw_http_request *hr,
                              const uint8_t *ns, struct thaw_http_response *r)
{
    (void)mdl;
    (void)hr;
    (void)ns;
    if (!thaw_models_many(srv->models))
        set_error(srv, r, 501, "this server serves one model (-m): start it with --models-dir to load and unload models");
    else
        set_json(r, 200, strdup("{\"success\":true}"));
}


/* What /metrics and /cache render (llama-server's router answers /metrics
 * per model, ?model=NAME). -m: the server's counters and its model's
 * engine lines. --models-dir: each model counts in its own struct
 * (models.h), so ?model=NAME is that model's counters (kept across its
 * unloads) with its engine's lines when it is loaded, and no ?model= is
 * every model's counters added up, with the first loaded model's engine
 * lines (the disk tier's are the one store's, whichever model's). The
 * HTTP counters are the server's in both. A scrape never loads a model. */
struct metrics_view {
    struct server *srv;
    const char *model; /* NULL: the first loaded */
};

static void engine_metrics(void *ud, char *buf, size_t cap, size_t *len)
{
    const struct metrics_view *v = ud;
    struct server *srv = v->srv;
    bool many = thaw_models_many(srv->models);
    struct thaw_model *m;

    for (int i = 0; i < thaw_models_count(srv->models); i++) {
        struct thaw_model_info mi;
        thaw_models_get(srv->models, i, &mi);
        if (mi.status != THAW_MODEL_LOADED || (v->model && many && strcmp(v->model, mi.name) != 0) ||
            thaw_models_peek(srv->models, many ? mi.name : NULL, &m) != 0)
            continue;
        thaw_engine_metrics(thaw_model_engine(m), buf, cap, len);
        thaw_models_unpeek(srv->models, m);
        return;
    }
    /* none awake: a sleeping model's lines as it fell asleep */
    (void)thaw_models_asleep_metrics(srv->models, v->model && many ? v->model : NULL, buf, cap, len);
}

/* Renders the view (scrape: as thaw_metrics_render) into a new string, or
 * NULL: out of memory, or *unknown set: no such model. */
static char *render_metrics(struct server *srv, const char *model, bool scrape, bool *unknown)
{
    struct metrics_view v = {srv, NULL};
    struct thaw_metrics *m = &srv->metrics, *own = NULL;
    struct thaw_metrics *window = &srv->metrics; /* whose scrape window the rate gauges use */
    char *text;

    *unknown = false;
    if (thaw_models_many(srv->models)) {
        if (!(own = calloc(1, sizeof *own)))
            return NULL;
        if (model && *model) {
            if (!(window = thaw_models_metrics(srv->models, model))) {
                *unknown = true;
                free(own);
                return NULL;
            }
            thaw_metrics_add(own, window);
            v.model = model;
        } else {
            thaw_models_metrics_sum(srv->models, own);
        }
        atomic_store(&own->requests_total, atomic_load(&srv->metrics.requests_total));
        atomic_store(&own->requests_errors, atomic_load(&srv->metrics.requests_errors));
        atomic_store(&own->chat_requests, atomic_load(&srv->metrics.chat_requests));
        /* the rate gauges' window: a model's own, or the server's for the totals */
        atomic_store(&own->scraped_prompt_tokens, atomic_load(&window->scraped_prompt_tokens));
        atomic_store(&own->scraped_prompt_us, atomic_load(&window->scraped_prompt_us));
        atomic_store(&own->scraped_predicted_steps, atomic_load(&window->scraped_predicted_steps));
        atomic_store(&own->scraped_predicted_us, atomic_load(&window->scraped_predicted_us));
        m = own;
    }
    text = thaw_metrics_render(m, scrape, engine_metrics, &v);
    if (own && scrape) {
        atomic_store(&window->scraped_prompt_tokens, atomic_load(&own->scraped_prompt_tokens));
        atomic_store(&window->scraped_prompt_us, atomic_load(&own->scraped_prompt_us));
        atomic_store(&window->scraped_predicted_steps, atomic_load(&own->scraped_predicted_steps));
        atomic_store(&window->scraped_predicted_us, atomic_load(&own->scraped_predicted_us));
    }
    free(own);
    return text;
}

static void route_metrics(struct server *srv, struct thaw_model *mdl, const struct thaw_http_request *hr,
                          const uint8_t *ns, struct thaw_http_response *r)
{
    bool unknown;

    (void)mdl;
    (void)ns;
    if (!srv->cfg.metrics) {
        set_error(srv, r, 501, "This server does not support metrics endpoint. Start it with `--metrics`");
        return;
    }
    r->body = render_metrics(srv, thaw_http_query(hr->conn, "model"), true, &unknown);
    if (unknown) {
        char names[512], msg[640];
        thaw_models_names(srv->models, names, sizeof names);
        snprintf(msg, sizeof msg, "model '%.64s' not found; the models: %s", thaw_http_query(hr->conn, "model"),
                 names);
        set_error(srv, r, 404, msg);
        return;
    }
    if (!r->body) {
        set_error(srv, r, 500, "out of memory");
        return;
    }
    r->status = 200;
    r->content_type = "text/plain; version=0.0.4";
    r->headers = srv->metrics_headers; /* llama-server's Process-Start-Time-Unix */
}

/* The cache's counts and sizes as JSON for the page's cache view: the very
 * numbers /metrics renders (one place computes them), never text or keys. */
static void route_cache(struct server *srv, struct thaw_model *mdl, const struct thaw_http_request *hr,
                        const uint8_t *ns, struct thaw_http_response *r)
{
    bool unknown;
    char *text = render_metrics(srv, thaw_http_query(hr->conn, "model"), false, &unknown);

    (void)mdl;
    (void)ns;
    if (unknown) {
        set_error(srv, r, 404, "no such model (GET /models lists them)");
        return;
    }
    set_json(r, 200, text ? thaw_api_cache_json(text) : NULL);
    free(text);
    if (!r->body)
        set_error(srv, r, 500, "out of memory");
}

/* The chat page and its files (webui.h), public like /health: the page asks
 * for the key when the API answers 401. --no-webui: 404, as before it existed. */
static void route_webui(struct server *srv, struct thaw_model *mdl, const struct thaw_http_request *hr,
                        const uint8_t *ns, struct thaw_http_response *r)
{
    (void)mdl;
    const struct thaw_webui_file *f = srv->cfg.webui ? thaw_webui_find(hr->url) : NULL;
    char msg[160];

    (void)ns;
    if (!f) {
        if (srv->cfg.webui && thaw_webui_n_files == 0)
            snprintf(msg, sizeof msg,
                     "this thaw was built without its page: scripts/setup.sh installs its "
                     "libraries, then rebuild");
        else
            snprintf(msg, sizeof msg, "no route for %s %.80s", hr->method, hr->url);
        set_error(srv, r, 404, msg);
        return;
    }
    if (!(r->body = malloc(f->n_data ? f->n_data : 1))) {
        set_error(srv, r, 500, "out of memory");
        return;
    }
    memcpy(r->body, f->data, f->n_data);
    r->n_body = f->n_data;
    r->status = 200;
    r->content_type = f->content_type;
    r->headers = thaw_webui_headers;
}

static void route_tokenize(struct server *srv, struct thaw_model *mdl, const struct thaw_http_request *hr,
                           const uint8_t *ns, struct thaw_http_response *r)
{
    const struct thaw_chat *chat = thaw_engine_chat(thaw_model_engine(mdl));
    char err[256], *content = NULL, **pieces = NULL;
    bool add_special, with_pieces;
    llama_token *toks = NULL;
    int n = 0, rc;

    (void)ns;
    if ((rc = thaw_api_parse_tokenize(hr->body, hr->n_body, &content, &add_special, &with_pieces, err, sizeof err))) {
        set_error(srv, r, rc == THAW_EINVAL ? 400 : 500, rc == THAW_EINVAL ? err : thaw_strerror(rc));
        return;
    }
    if ((rc = thaw_chat_tokenize_text(chat, content, add_special, &toks, &n)) != 0) {
        set_error(srv, r, rc == THAW_ENOMEM ? 500 : 400, thaw_strerror(rc));
        goto out;
    }
    if (with_pieces && !(pieces = calloc((size_t)n + 1, sizeof *pieces))) {
        set_error(srv, r, 500, "out of memory");
        goto out;
    }
    for (int i = 0; with_pieces && i < n; i++)
        if (!(pieces[i] = thaw_chat_token_piece(chat, toks[i]))) {
            set_error(srv, r, 500, "out of memory");
            goto out;
        }
    set_json(r, 200, thaw_api_tokens_json(toks, (size_t)n, pieces));
out:
    for (int i = 0; pieces && i < n; i++)
        free(pieces[i]);
    free(pieces);
    free(toks);
    free(content);
}

static void route_detokenize(struct server *srv, struct thaw_model *mdl, const struct thaw_http_request *hr,
                             const uint8_t *ns, struct thaw_http_response *r)
{
    const struct thaw_chat *chat = thaw_engine_chat(thaw_model_engine(mdl));
    char err[256], *text;
    int32_t *toks;
    size_t n;
    int rc;

    (void)ns;
    if ((rc = thaw_api_parse_detokenize(hr->body, hr->n_body, thaw_chat_n_vocab(chat), &toks, &n, err, sizeof err))) {
        set_error(srv, r, rc == THAW_EINVAL ? 400 : 500, rc == THAW_EINVAL ? err : thaw_strerror(rc));
        return;
    }
    if ((text = thaw_chat_detokenize(chat, toks, (int)n)))
        set_json(r, 200, thaw_api_string_json("content", text));
    else
        set_error(srv, r, 500, "out of memory");
    free(text);
    free(toks);
}

static void route_apply_template(struct server *srv, struct thaw_model *mdl, const struct thaw_http_request *hr,
                                 const uint8_t *ns, struct thaw_http_response *r)
{
    struct thaw_chat_request req;
    char err[512], *prompt = NULL;
    int rc;

    (void)ns;
    if ((rc = thaw_api_parse_chat(hr->body, hr->n_body, srv->cfg.cache_prompt, &req, err, sizeof err)) != 0) {
        set_error(srv, r, rc == THAW_EINVAL ? 400 : 500, rc == THAW_EINVAL ? err : thaw_strerror(rc));
        return;
    }
    if ((rc = thaw_api_admit(&req, thaw_engine_n_ctx_slot(thaw_model_engine(mdl)),
                             thaw_engine_max_token_bytes(thaw_model_engine(mdl)), err, sizeof err)) != 0 ||
        (rc = thaw_chat_render_prompt(thaw_engine_chat(thaw_model_engine(mdl)), &req, &prompt, err, sizeof err)) != 0)
        set_error(srv, r, rc == THAW_ENOMEM ? 500 : 400, rc == THAW_ENOMEM ? thaw_strerror(rc) : err);
    else
        set_json(r, 200, thaw_api_string_json("prompt", prompt));
    free(prompt);
    thaw_chat_request_free(&req);
}

static void route_props(struct server *srv, struct thaw_model *mdl, const struct thaw_http_request *hr,
                        const uint8_t *ns, struct thaw_http_response *r)
{
    static const char *const poolings[] = {"none", "mean", "cls", "last", "rank"};
    int pooling = thaw_engine_pooling(thaw_model_engine(mdl));
    const struct thaw_props_embedding embd = {pooling >= 0 && pooling <= 4 ? poolings[pooling] : "none",
                                              srv->cfg.embd_normalize, pooling == LLAMA_POOLING_TYPE_RANK};
    const struct thaw_config *mc = thaw_model_config(mdl); /* its own: a preset's settings */
    struct thaw_api_props_live live = {srv->cfg.props, -1, NULL, mc->mmproj_path != NULL};
    char *msg = NULL;

    (void)hr;
    (void)ns;
    if (thaw_engine_reasoning_get(thaw_model_engine(mdl), &live.reasoning_budget, &msg) != 0) {
        set_error(srv, r, 500, "out of memory");
        return;
    }
    live.reasoning_budget_message = msg;
    set_json(r, 200,
             thaw_api_props_json(&live, thaw_engine_model_name(thaw_model_engine(mdl)), mc->model_path,
                                 thaw_chat_template(thaw_engine_chat(thaw_model_engine(mdl))), mc->n_parallel,
                                 thaw_engine_n_ctx_slot(thaw_model_engine(mdl)), mc->jinja,
                                 srv->cfg.kv_cache_dir != NULL && !srv->cfg.embedding, &mc->sampling,
                                 mc->n_predict, thaw_engine_placement(thaw_model_engine(mdl)),
                                 srv->cfg.embedding ? &embd : NULL));
    free(msg);
    if (!r->body)
        set_error(srv, r, 500, "out of memory");
}

/* GET /props of -m's model with --sleep-idle-seconds: its props when it
 * is awake, a sleeping model's few when not (llama-server's is_sleeping). */
static void route_props_peek(struct server *srv, const struct thaw_http_request *hr, const uint8_t *ns,
                             struct thaw_http_response *r)
{
    struct thaw_model *m;

    if (thaw_models_peek(srv->models, NULL, &m) == 0) {
        route_props(srv, m, hr, ns, r);
        thaw_models_unpeek(srv->models, m);
        return;
    }
    struct thaw_model_info mi;
    thaw_models_get(srv->models, 0, &mi);
    set_json(r, 200, thaw_api_sleeping_props_json(mi.name, mi.path));
    if (!r->body)
        set_error(srv, r, 500, "out of memory");
}

/* POST /props (llama-server's, with --props): changes the settings thaw
 * can change at run time (the reasoning budget requests default to, and
 * its message); any other key is a 400 naming it. Without --props, 501 as
 * llama-server answers. */
static void route_props_set(struct server *srv, struct thaw_model *mdl, const struct thaw_http_request *hr,
                            const uint8_t *ns, struct thaw_http_response *r)
{
    struct thaw_api_props_live set;
    bool has_budget, has_message;
    char err[256];
    int rc, budget;
    char *cur = NULL;

    (void)ns;
    if (!srv->cfg.props) {
        set_error(srv, r, 501, "This server does not support changing global properties. Start it with `--props`");
        return;
    }
    if ((rc = thaw_api_parse_props(hr->body, hr->n_body, &has_budget, &has_message, &set, err, sizeof err)) != 0) {
        set_error(srv, r, rc == THAW_EINVAL ? 400 : 500, rc == THAW_EINVAL ? err : thaw_strerror(rc));
        return;
    }
    if ((rc = thaw_engine_reasoning_get(thaw_model_engine(mdl), &budget, &cur)) == 0)
        rc = thaw_engine_reasoning_set(thaw_model_engine(mdl), has_budget ? set.reasoning_budget : budget,
                                       has_message ? set.reasoning_budget_message : NULL);
    free(cur);
    free((char *)set.reasoning_budget_message);
    if (rc != 0) {
        set_error(srv, r, 500, thaw_strerror(rc));
        return;
    }
    if (has_budget || has_message)
        LOG_INF("POST /props: requests now default to reasoning budget %d%s", has_budget ? set.reasoning_budget : budget,
                has_message ? " (message changed)" : "");
    set_json(r, 200, strdup("{\"success\":true}"));
}

/* GET /slots: llama-server's array, each slot's conversation (the
 * caller's own tenant's text only), phase and cache tier. --no-slots: 501
 * as llama-server answers. */
static void route_slots(struct server *srv, struct thaw_model *mdl, const struct thaw_http_request *hr,
                        const uint8_t *ns, struct thaw_http_response *r)
{
    (void)hr;
    if (!srv->cfg.slots) {
        set_error(srv, r, 501, "This server does not support slots endpoint. Start it with `--slots`");
        return;
    }
    set_json(r, 200,
             thaw_slots_view_json(thaw_engine_slots_view(thaw_model_engine(mdl)),
                                  thaw_engine_chat(thaw_model_engine(mdl)), ns));
    if (!r->body)
        set_error(srv, r, 500, "out of memory");
}

typedef void (*route_fn)(struct server *srv, struct thaw_model *mdl, const struct thaw_http_request *hr,
                         const uint8_t *ns, struct thaw_http_response *r);
typedef void (*codec_route_fn)(struct server *srv, struct thaw_model *mdl, const struct thaw_http_request *hr,
                               const uint8_t *ns, struct thaw_http_response *r, const struct thaw_codec *c);

/* Every route: its paths, its one method, what serves it (a function of
 * its own, or one that speaks the route's codec), whether it needs a key,
 * whether `path` is a prefix (the page's files) and whether a model's
 * engine serves it. */
static const struct route {
    const char *path, *alias;
    const char *method;
    route_fn fn;
    codec_route_fn serve;           /* with codec: fn is NULL */
    const struct thaw_codec *codec; /* the API it speaks, whose shape its errors take; NULL: OpenAI's */
    bool public, prefix;
    bool model; /* served by the engine of the request's model (models.h) */
} routes[] = {
    {"/health", "/v1/health", "GET", route_health, NULL, NULL, true, false, false},
    {"/v1/chat/completions", "/chat/completions", "POST", NULL, route_chat, &thaw_codec_chat, false, false, true},
    {"/v1/messages", NULL, "POST", NULL, route_chat, &thaw_codec_messages, false, false, true},
    {"/v1/completions", NULL, "POST", NULL, route_chat, &thaw_codec_completions, false, false, true},
    /* llama-server's own shape at both, as there; only /v1/completions is OpenAI's */
    {"/completion", "/completions", "POST", NULL, route_chat, &thaw_codec_completion, false, false, true},
    {"/v1/chat/completions/input_tokens", "/chat/completions/input_tokens", "POST", NULL, route_count, &thaw_codec_chat,
     false, false, true},
    {"/v1/responses/input_tokens", "/responses/input_tokens", "POST", NULL, route_count, &thaw_codec_responses, false,
     false, true},
    {"/v1/responses", "/responses", "POST", NULL, route_chat, &thaw_codec_responses, false, false, true},
    {"/v1/messages/count_tokens", NULL, "POST", NULL, route_count, &thaw_codec_messages, false, false, true},
    {"/v1/models", "/models", "GET", route_models, NULL, NULL, false, false, false},
    /* llama-server's shape at both; only /v1/embeddings is OpenAI's */
    {"/embeddings", "/embedding", "POST", route_embeddings, NULL, NULL, false, false, true},
    {"/v1/embeddings", NULL, "POST", route_embeddings_oai, NULL, NULL, false, false, true},
    {"/rerank", "/reranking", "POST", route_rerank, NULL, NULL, false, false, true},
    {"/v1/rerank", "/v1/reranking", "POST", route_rerank, NULL, NULL, false, false, true},
    {"/metrics", NULL, "GET", route_metrics, NULL, NULL, false, false, false},
    {"/tokenize", NULL, "POST", route_tokenize, NULL, NULL, false, false, true},
    {"/detokenize", NULL, "POST", route_detokenize, NULL, NULL, false, false, true},
    {"/apply-template", NULL, "POST", route_apply_template, NULL, NULL, false, false, true},
    {"/props", NULL, "GET", route_props, NULL, NULL, false, false, true},
    {"/props", NULL, "POST", route_props_set, NULL, NULL, false, false, true},
    {"/cache", NULL, "GET", route_cache, NULL, NULL, false, false, false},
    {"/slots", NULL, "GET", route_slots, NULL, NULL, false, false, true},
    {"/", NULL, "GET", route_webui, NULL, NULL, true, false, false},
    {"/webui/", NULL, "GET", route_webui, NULL, NULL, true, true, false},
    {"/models/load", NULL, "POST", route_models_load, NULL, NULL, false, false, true},
    {"/models/unload", NULL, "POST", route_models_unload, NULL, NULL, false, false, false},
    {"/models/sse", NULL, "GET", route_models_sse, NULL, NULL, false, false, false},
    {"/v1/stream", NULL, "GET", route_stream_get, NULL, NULL, false, false, false},
    {"/v1/stream", NULL, "DELETE", route_stream_delete, NULL, NULL, false, false, false},
    {"/v1/streams/lookup", NULL, "POST", route_streams_lookup, NULL, NULL, false, false, false},
};

/* The shape a route's errors take: its codec's, else OpenAI's. */
static const struct thaw_codec *errors_of(const struct route *rt)
{
    return rt && rt->codec ? rt->codec : &thaw_codec_chat;
}

/* Whose error shape a path's errors take when no route answers them (a
 * 404, or what http.c refuses before any route: 413): the codec of the
 * route the path is under (Anthropic's under /v1/messages, where its SDKs
 * and Claude Code read them), else OpenAI's. */
static const struct thaw_codec *errors_for(const char *url)
{
    for (size_t i = 0; url && i < sizeof routes / sizeof routes[0]; i++) {
        size_t n = strlen(routes[i].path);
        if (routes[i].codec && strncmp(url, routes[i].path, n) == 0 && (url[n] == '\0' || url[n] == '/'))
            return routes[i].codec;
    }
    return &thaw_codec_chat;
}

/* http.c's error bodies (thaw_http_params.error_body) */
static char *http_error_body(void *ud, const char *url, int status, const char *msg)
{
    (void)ud;
    return errors_for(url)->error_json(status, msg);
}

/* An origin on this machine: http(s)://localhost, 127.0.0.1 or [::1],
 * with any port or none, nothing after (llama-server's origin_is_localhost). */
static bool origin_is_localhost(const char *origin)
{
    static const char *const schemes[] = {"http://", "https://"};
    static const char *const hosts[] = {"localhost", "127.0.0.1", "[::1]"};
    const char *p = NULL;

    for (int i = 0; i < 2 && !p; i++)
        if (strncmp(origin, schemes[i], strlen(schemes[i])) == 0)
            p = origin + strlen(schemes[i]);
    if (!p)
        return false;
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(hosts[i]);
        if (strncmp(p, hosts[i], n) != 0)
            continue;
        const char *q = p + n;
        if (*q == '\0')
            return true;
        if (*q != ':' || !q[1])
            return false;
        while (*++q)
            if (*q < '0' || *q > '9')
                return false;
        return true;
    }
    return false;
}

/* The origin to allow for a browser's request, or NULL (--cors-origin):
 * "*", an origin of the list, echoed, or any of this machine's origins
 * when the list says `localhost` (as llama-server's --cors-origins). */
static const char *cors_allow(const struct server *srv, const char *origin)
{
    const char *list = srv->cfg.cors_origin;

    if (!list || !origin)
        return NULL;
    if (strcmp(list, "*") == 0)
        return "*";
    size_t n = strlen(origin);
    for (const char *p = list; *p;) {
        size_t len = strcspn(p, ",");
        if (len == n && strncmp(p, origin, n) == 0)
            return origin; /* echoed: it is one of ours */
        if (len == 9 && strncmp(p, "localhost", 9) == 0 && origin_is_localhost(origin))
            return origin;
        p += len;
        if (*p == ',')
            p++;
    }
    return NULL;
}

/* The headers a preflight asked for, when they are header names (a
 * browser SDK sends its own: x-api-key, anthropic-version, x-stainless-*;
 * a fixed list would refuse them, and "*" does not cover Authorization in
 * the Fetch standard). NULL = the default list. */
static const char *cors_headers(const char *asked)
{
    if (!asked || !*asked || strlen(asked) > 1024)
        return NULL;
    for (const char *p = asked; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '-' ||
              *p == '_' || *p == ',' || *p == ' '))
            return NULL;
    return asked;
}

/* ---- the request's model ------------------------------------------------------------- */

/* Answers a request whose model cannot serve it (rc: thaw_models_try's). */
static void model_error(const struct route *rt, struct server *srv, const char *name, int rc,
                        struct thaw_http_response *r)
{
    char msg[512], names[384];

    if (rc == THAW_ENOTFOUND) {
        thaw_models_names(srv->models, names, sizeof names);
        if (name)
            snprintf(msg, sizeof msg, "model '%.64s' not found; the models are: %s", name, names);
        else
            snprintf(msg, sizeof msg, "model name is missing from the request; the models are: %s", names);
        set_codec_error(r, errors_of(rt), name ? 404 : 400, msg);
    } else if (rc == THAW_EBUSY) {
        snprintf(msg, sizeof msg, "model '%.64s' is not loaded (--no-models-autoload): POST /models/load loads it",
                 name);
        set_codec_error(r, errors_of(rt), 400, msg); /* llama-server's router: 400 "model is not loaded" */
    } else if (rc == THAW_ESHUTDOWN) {
        set_codec_error(r, errors_of(rt), 503, "the server is shutting down");
    } else {
        snprintf(msg, sizeof msg, "model '%.64s': %s", name ? name : "",
                 rc == THAW_ELLAMA ? "cannot be loaded" : thaw_strerror(rc));
        set_codec_error(r, errors_of(rt), rc == THAW_ETIMEDOUT ? 503 : 500, msg);
    }
}

/* A --models-dir request and the model it waits for: the connection is
 * deferred (no HTTP thread waits) until the model is loaded, then the
 * route runs; a route that defers in turn is resumed through this one. */
struct model_wait {
    struct server *srv;
    const struct route *rt;
    struct thaw_http_request hr; /* its strings are MHD's and the body http.c's, until the request completes */
    uint8_t ns[THAW_KEY_BYTES];
    char *name;                  /* NULL: none given */
    bool autoload;
    bool deferred;               /* http.c holds it (model_wait_free ends it) */
    int64_t deadline_us;         /* --timeout from the request's start */
    struct thaw_models_watch watch;
    struct thaw_model *held;     /* acquired, its route not run yet (THAW_TEST_ROUTE_HOLD_MS) */
    thaw_http_resume_fn resume;  /* the route's own deferral, once it runs */
    void *resume_ud;
    void (*resume_free)(void *);
    struct thaw_replay *replay;  /* a chat request with X-Conversation-Id: its replay, loading while it
                                  * waits (GET /v1/stream answers 503; DELETE cancels the wait) */
};

static void model_wait_free(void *ud)
{
    struct model_wait *w = ud;

    if (w->watch.want && !thaw_http_conn_alive(w->hr.conn))
        LOG_INF("a request for model '%.64s' gave up waiting for its load (its client left)", w->name ? w->name : "");
    thaw_models_unwatch(w->srv->models, &w->watch);
    if (w->held)
        thaw_models_release(w->srv->models, w->held);
    if (w->resume_free)
        w->resume_free(w->resume_ud);
    if (w->replay) {
        thaw_replay_abort(w->replay); /* no stream took it */
        thaw_replay_unref(w->replay);
    }
    thaw_http_conn_unref(w->hr.conn);
    free(w->name);
    free(w);
}

static void model_resume(void *ud, struct thaw_http_response *r);

/* Defers r on w (from the handler, the first time: http.c owns w then). */
static void model_defer(struct model_wait *w, struct thaw_http_response *r)
{
    r->defer = true;
    r->resume = model_resume;
    r->defer_ud = w;
    r->defer_free = model_wait_free;
    w->deferred = true;
}

/* THAW_TEST_ROUTE_HOLD_MS: wakes a request after its hold. */
static void *hold_main(void *arg)
{
    struct thaw_http_conn *conn = arg;

    long ms = thaw_test_hook(THAW_HOOK_ROUTE_HOLD_MS);
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

    while (nanosleep(&ts, &ts) != 0)
        ;
    thaw_http_wake(conn);
    thaw_http_conn_unref(conn);
    return NULL;
}

/* Holds mdl for w without running its route yet, until a thread wakes it
 * (THAW_TEST_ROUTE_HOLD_MS). False: no thread, run it now. */
static bool hold_model(struct model_wait *w, struct thaw_model *mdl)
{
    pthread_attr_t attr;
    pthread_t t;
    bool ok;

    thaw_http_conn_ref(w->hr.conn);
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    ok = pthread_create(&t, &attr, hold_main, w->hr.conn) == 0;
    pthread_attr_destroy(&attr);
    if (!ok)
        thaw_http_conn_unref(w->hr.conn);
    else
        w->held = mdl;
    return ok;
}

/* One try at the model: the route served, an error answered, or r
 * deferred again until the loader wakes it. A request whose client left
 * while it waited stops waiting: a load no one waits for is not started,
 * and no model is unloaded for it. */
static void model_step(struct model_wait *w, struct thaw_http_response *r)
{
    struct thaw_model *mdl = w->held;
    bool gone = false, cancelled = false;
    int rc = 0;

    if (mdl) {
        w->held = NULL; /* held: its hold is over */
        if (w->replay && (cancelled = thaw_replay_cancelled(w->replay))) {
            thaw_models_release(w->srv->models, mdl);
            mdl = NULL;
        }
    } else {
        rc = thaw_models_try(w->srv->models, w->name, w->autoload, &w->watch, &mdl);
        if (rc == THAW_EPENDING && w->replay && (cancelled = thaw_replay_cancelled(w->replay))) {
            thaw_models_unwatch(w->srv->models, &w->watch);
            rc = THAW_ETIMEDOUT;
        } else if (rc == THAW_EPENDING && (gone = !thaw_http_conn_alive(w->hr.conn))) {
            rc = THAW_ETIMEDOUT; /* its watch ends with it (model_wait_free), ignored by the loader meanwhile */
        } else if (rc == THAW_EPENDING && thaw_now_us() >= w->deadline_us) {
            thaw_models_unwatch(w->srv->models, &w->watch);
            rc = THAW_ETIMEDOUT;
        }
        if (rc == THAW_EPENDING) {
            model_defer(w, r);
            return;
        }
        if (rc == 0 && thaw_test_hook(THAW_HOOK_ROUTE_HOLD_MS) > 0 && w->rt->fn != route_models_load &&
            hold_model(w, mdl)) {
            model_defer(w, r);
            return;
        }
    }
    if (cancelled) {
        set_codec_error(r, errors_of(w->rt), 400,
                        "the request was cancelled (DELETE /v1/stream) while its model was loading");
    } else if (gone) {
        set_codec_error(r, errors_of(w->rt), 503, "the client left while its model was loading");
    } else if (rc != 0) {
        model_error(w->rt, w->srv, w->name, rc, r);
    } else {
        if (w->rt->serve)
            w->rt->serve(w->srv, mdl, &w->hr, w->ns, r, w->rt->codec);
        else
            w->rt->fn(w->srv, mdl, &w->hr, w->ns, r);
        thaw_models_release(w->srv->models, mdl); /* what outlives the route took its own hold */
        if (r->defer) {
            w->resume = r->resume;
            w->resume_ud = r->defer_ud;
            w->resume_free = r->defer_free;
            model_defer(w, r);
            return;
        }
    }
    if (!w->deferred)
        model_wait_free(w);
}

static void model_resume(void *ud, struct thaw_http_response *r)
{
    struct model_wait *w = ud;

    if (w->resume) {
        w->resume(w->resume_ud, r);
        r->resume = model_resume; /* http.c keeps the first deferral's; for clarity */
        r->defer_ud = w;
        r->defer_free = model_wait_free;
    } else {
        model_step(w, r);
    }
}

/* --models-dir: the request's model from its body's "model", else its
 * query's ?model= (a GET: /props, /slots, as llama-server's router takes
 * it), loaded unless --no-models-autoload (llama-server's ?autoload=true|1
 * overrides it; anything else there is false); then the route. */
static void serve_with_model(struct server *srv, const struct route *rt, const struct thaw_http_request *hr,
                             const uint8_t ns[THAW_KEY_BYTES], struct thaw_http_response *r)
{
    struct model_wait *w = calloc(1, sizeof *w);
    const char *q;

    if (!w) {
        set_codec_error(r, errors_of(rt), 500, "out of memory");
        return;
    }
    w->srv = srv;
    w->rt = rt;
    w->hr = *hr;
    memcpy(w->ns, ns, THAW_KEY_BYTES);
    w->name = thaw_api_request_model(hr->body, hr->n_body);
    if (!w->name && (q = thaw_http_query(hr->conn, "model")) && *q)
        w->name = strdup(q);
    if (rt->fn == route_props && (!w->name || !thaw_models_many(srv->models))) {
        /* llama-server's router answers for itself; -m's model is looked
         * at, not woken nor kept awake */
        free(w->name);
        free(w);
        if (thaw_models_many(srv->models))
            route_router_props(srv, r);
        else
            route_props_peek(srv, hr, ns, r);
        return;
    }
    q = thaw_http_query(hr->conn, "autoload");
    w->autoload = q && *q ? strcmp(q, "true") == 0 || strcmp(q, "1") == 0 : srv->cfg.models_autoload;
    if (rt->fn == route_models_load || !thaw_models_many(srv->models))
        w->autoload = true; /* what it is for; -m's model asleep wakes */
    w->deadline_us = thaw_now_us() + (int64_t)srv->cfg.timeout_s * 1000000;
    w->watch.wake = client_wake;
    w->watch.alive = client_alive;
    w->watch.ud = hr->conn;
    thaw_http_conn_ref(hr->conn);
    if (rt->serve == route_chat && hr->conversation_id && *hr->conversation_id)
        w->hr.replay = w->replay = thaw_replay_open(hr->conversation_id, true);
    model_step(w, r);
}

/* An authenticated request on its route: with the model it names (or
 * -m's), then the route's function. */
static void serve_route(struct server *srv, const struct route *rt, const struct thaw_http_request *hr,
                        const uint8_t ns[THAW_KEY_BYTES], struct thaw_http_response *r)
{
    struct thaw_model *mdl = NULL;
    int rc = 0;

    if (rt->model && thaw_models_dynamic(srv->models)) {
        serve_with_model(srv, rt, hr, ns, r);
    } else if (!rt->model || (rc = thaw_models_acquire(srv->models, NULL, false, 0, &mdl)) == 0) {
        if (rt->serve)
            rt->serve(srv, mdl, hr, ns, r, rt->codec);
        else
            rt->fn(srv, mdl, hr, ns, r);
    } else {
        model_error(rt, srv, NULL, rc, r); /* -m: only at shutdown */
    }
    if (mdl) /* what outlives the handler took its own hold */
        thaw_models_release(srv->models, mdl);
}

/* ---- Vertex AI prediction (AIP_MODE=PREDICTION) ------------------------------------ */

/* Google Cloud's custom containers are told their routes by the
 * environment (AIP_PREDICT_ROUTE, AIP_HEALTH_ROUTE, AIP_HTTP_PORT) and are
 * sent {"instances": [...]}, answered {"predictions": [...]}: as in
 * llama-server, each instance names the route it is for in
 * "@requestFormat" (the path, or its camelCase: "chatCompletions" for
 * /v1/chat/completions) and is that route's body; it is served there, not
 * streamed, every instance at once, and its prediction is the route's JSON
 * answer, an error included. */
#define PREDICT_MAX_INSTANCES 128 /* llama-server's bound */

/* One instance on its way through its route. */
struct predict_one {
    char *body;                  /* the route's body (malloc'd) */
    struct thaw_http_request hr; /* points at body; the rest is the /predict request's */
    bool pending;                /* deferred by its route: resume/defer_ud until done */
    thaw_http_resume_fn resume;
    void *defer_ud;
    void (*defer_free)(void *ud);
    json_t *prediction;          /* once answered */
};

struct predict {
    int n;
    struct predict_one one[];
};

static void predict_free(void *ud)
{
    struct predict *p = ud;

    for (int i = 0; i < p->n; i++) {
        if (p->one[i].defer_free)
            p->one[i].defer_free(p->one[i].defer_ud);
        free(p->one[i].body);
        json_decref(p->one[i].prediction);
    }
    free(p);
}

/* camelCase of a route's path, as llama-server names it in @requestFormat:
 * without "/v1", each '/', '-' or '_' capitalising what follows
 * ("/v1/chat/completions" -> "chatCompletions", "/apply-template" ->
 * "applyTemplate"). */
static void predict_format_name(const char *path, char *out, size_t cap)
{
    size_t n = 0;
    bool up = false;

    if (strncmp(path, "/v1", 3) == 0 && path[3])
        path += 3;
    if (*path == '/')
        path++;
    for (; *path && n + 1 < cap; path++) {
        if (*path == '/' || *path == '-' || *path == '_') {
            up = true;
            continue;
        }
        out[n++] = up && *path >= 'a' && *path <= 'z' ? (char)(*path - 'a' + 'A') : *path;
        up = false;
    }
    out[n] = '\0';
}

/* The route an instance's @requestFormat names (a POST one before a GET
 * one of the same path), or NULL. */
static const struct route *predict_route_of(const char *format)
{
    const struct route *found = NULL;
    char name[64];

    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        const struct route *rt = &routes[i];
        bool match = strcmp(format, rt->path) == 0 || (rt->alias && strcmp(format, rt->alias) == 0);
        if (!match && !rt->prefix) {
            predict_format_name(rt->path, name, sizeof name);
            match = strcmp(format, name) == 0;
            if (!match && rt->alias) {
                predict_format_name(rt->alias, name, sizeof name);
                match = strcmp(format, name) == 0;
            }
        }
        if (match && (!found || strcmp(rt->method, "POST") == 0))
            found = rt;
        if (found && strcmp(found->method, "POST") == 0)
            break;
    }
    return found;
}

/* An error as a prediction: the error object the route would answer. */
static json_t *predict_error(int status, const char *msg)
{
    char *text = thaw_api_error_json(status, msg);
    json_t *j = text ? json_loads(text, 0, NULL) : NULL;

    free(text);
    return j ? j : json_null();
}

/* A route's answer as a prediction (its JSON, else its text, else null);
 * takes what r holds. */
static json_t *predict_take(struct thaw_http_response *r)
{
    json_t *j;

    if (r->stream) {
        if (r->stream_free)
            r->stream_free(r->stream_ud);
        free(r->body);
        return predict_error(400, "predict route does not support streaming responses");
    }
    if (!r->body || r->n_body == 0)
        j = json_null();
    else if (!(j = json_loadb(r->body, r->n_body, 0, NULL)))
        j = json_stringn(r->body, r->n_body);
    free(r->body);
    r->body = NULL;
    return j ? j : json_null();
}

/* Records what one instance's route answered in r (or that it waits). */
static void predict_settle(struct predict_one *o, struct thaw_http_response *r)
{
    if (r->defer) {
        if (!o->pending) { /* the first deferral's callbacks hold its state, as http.c keeps them */
            o->resume = r->resume;
            o->defer_ud = r->defer_ud;
            o->defer_free = r->defer_free;
        }
        o->pending = true;
        return;
    }
    o->pending = false;
    o->prediction = predict_take(r);
}

/* {"predictions": [...]} once no instance waits; else r deferred again. */
static void predict_answer(struct predict *p, struct thaw_http_response *r)
{
    for (int i = 0; i < p->n; i++)
        if (p->one[i].pending) {
            r->defer = true;
            return;
        }
    json_t *preds = json_array();
    for (int i = 0; preds && i < p->n; i++)
        json_array_append(preds, p->one[i].prediction ? p->one[i].prediction : json_null());
    json_t *root = preds ? json_pack("{s:o}", "predictions", preds) : NULL;
    char *body = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    if (body)
        set_json(r, 200, body);
    else
        set_error(NULL, r, 500, "out of memory");
}

static void predict_resume(void *ud, struct thaw_http_response *r);

/* The answer so far; while an instance still waits, r is deferred and p
 * handed to http.c with it (true), to be resumed and freed there. */
static bool predict_reply(struct predict *p, struct thaw_http_response *r)
{
    predict_answer(p, r);
    if (!r->defer)
        return false;
    r->resume = predict_resume;
    r->defer_ud = p;
    r->defer_free = predict_free;
    return true;
}

static void predict_resume(void *ud, struct thaw_http_response *r)
{
    struct predict *p = ud;

    for (int i = 0; i < p->n; i++) {
        struct predict_one *o = &p->one[i];
        if (!o->pending)
            continue;
        struct thaw_http_response sub = {0};
        o->resume(o->defer_ud, &sub);
        predict_settle(o, &sub);
    }
    (void)predict_reply(p, r);
}

/* POST AIP_PREDICT_ROUTE (/predict): each instance through its route */
static void route_predict(struct server *srv, struct thaw_model *mdl, const struct thaw_http_request *hr,
                          const uint8_t *ns, struct thaw_http_response *r)
{
    json_error_t jerr;
    json_t *root = json_loadb(hr->body, hr->n_body, 0, &jerr), *inst;
    struct predict *p = NULL;
    char msg[160];

    (void)mdl;
    if (!root || !json_is_object(root)) {
        set_error(srv, r, 400, root ? "request body must be a JSON object" : jerr.text);
        goto out;
    }
    inst = json_object_get(root, "instances");
    if (!json_is_array(inst)) {
        set_error(srv, r, 400, "request body must include an array field named instances");
        goto out;
    }
    if (json_array_size(inst) > PREDICT_MAX_INSTANCES) {
        snprintf(msg, sizeof msg, "instances array exceeds maximum size of %d", PREDICT_MAX_INSTANCES);
        set_error(srv, r, 400, msg);
        goto out;
    }
    p = calloc(1, sizeof *p + json_array_size(inst) * sizeof p->one[0]);
    if (!p) {
        set_error(srv, r, 500, "out of memory");
        goto out;
    }
    p->n = (int)json_array_size(inst);
    for (int i = 0; i < p->n; i++) {
        struct predict_one *o = &p->one[i];
        json_t *in = json_array_get(inst, (size_t)i), *fmt = json_object_get(in, "@requestFormat");
        const struct route *rt;
        if (!json_is_object(in)) {
            o->prediction = predict_error(400, "each instance must be a JSON object");
            continue;
        }
        if (!json_is_string(fmt)) {
            o->prediction = predict_error(400, "each instance must include a string @requestFormat");
            continue;
        }
        if (!(rt = predict_route_of(json_string_value(fmt)))) {
            snprintf(msg, sizeof msg, "no handler registered for @requestFormat: %.80s", json_string_value(fmt));
            o->prediction = predict_error(400, msg);
            continue;
        }
        json_t *payload = json_copy(in); /* shallow: only its own keys change */
        if (payload) {
            json_object_del(payload, "@requestFormat");
            if (json_object_get(payload, "stream"))
                json_object_set_new(payload, "stream", json_false()); /* one JSON answer per instance */
        }
        o->body = payload ? json_dumps(payload, JSON_COMPACT) : NULL;
        json_decref(payload);
        if (!o->body) {
            o->prediction = predict_error(500, "out of memory");
            continue;
        }
        o->hr = *hr;
        o->hr.method = rt->method;
        o->hr.url = rt->path;
        o->hr.body = o->body;
        o->hr.n_body = strlen(o->body);
        struct thaw_http_response sub = {0};
        serve_route(srv, rt, &o->hr, ns, &sub);
        predict_settle(o, &sub);
    }
    if (predict_reply(p, r))
        p = NULL; /* http.c's now */
out:
    if (p)
        predict_free(p);
    json_decref(root);
}

/* A read of the server's own state (health checks, scrapes, /props and
 * /slots polls, the model list): not counted in thaw_requests_total, so
 * the counter says what clients asked of the model and stays still on an
 * idle server however often something watches it (llama-server's sleep
 * test compares a sleeping server's /metrics with an earlier scrape). */
static bool watches(const struct route *rt, const char *method)
{
    return rt && strcmp(method, rt->method) == 0 &&
           (rt->fn == route_health || rt->fn == route_metrics || rt->fn == route_props || rt->fn == route_slots ||
            rt->fn == route_cache || rt->fn == route_models || rt->fn == route_models_sse);
}

/* llama-server's route for it (POST only; no key needed: none of the
 * routes' flags but its function are read) */
static const struct route predict_rt = {"/predict", NULL, "POST", route_predict, NULL, NULL, false, false, false};

static void handle(void *ud, const struct thaw_http_request *hr, struct thaw_http_response *r)
{
    struct server *srv = ud;
    const struct route *rt = NULL;
    uint8_t ns[THAW_KEY_BYTES];

    /* --api-prefix: the routes live under it, and nowhere else */
    const char *url = hr->url;
    size_t np = strlen(srv->cfg.api_prefix);
    if (np && strncmp(url, srv->cfg.api_prefix, np) == 0 && (url[np] == '/' || url[np] == '\0'))
        url = url[np] ? url + np : "/";
    else if (np)
        url = NULL;
    /* Vertex AI's routes, as the environment names them */
    if (url && srv->health[0] && strcmp(url, srv->health) == 0)
        url = "/health";
    if (url && srv->predict[0] && strcmp(url, srv->predict) == 0)
        rt = &predict_rt;
    /* the route for the path and method; else the path's first (a 405) */
    bool preset = rt != NULL;
    for (size_t i = 0; url && !preset && i < sizeof routes / sizeof routes[0]; i++)
        if (strcmp(url, routes[i].path) == 0 || (routes[i].alias && strcmp(url, routes[i].alias) == 0) ||
            (routes[i].prefix && strncmp(url, routes[i].path, strlen(routes[i].path)) == 0)) {
            if (!rt || strcmp(hr->method, routes[i].method) == 0)
                rt = &routes[i];
            if (strcmp(hr->method, routes[i].method) == 0)
                break;
        }
    if (!watches(rt, hr->method))
        atomic_fetch_add(&srv->metrics.requests_total, 1);
    r->allow_origin = cors_allow(srv, hr->origin);
    if (strcmp(hr->method, "OPTIONS") == 0) {
        /* a browser's preflight, on any path (it carries no key): an empty
         * 200 as llama-server answers; without an allowed origin it has no
         * Access-Control-Allow-Origin, and the browser refuses the call */
        set_json(r, 200, strdup(""));
        r->content_type = "text/plain";
        r->cors_preflight = r->allow_origin != NULL;
        r->allow_headers = cors_headers(hr->cors_request_headers);
        r->allow = rt ? rt->method : NULL;
    } else if (!rt && srv->cfg.n_api_keys > 0 && authenticate(srv, hr, ns) != 0) {
        /* as llama-server: without a key, no path is told apart from another */
        set_codec_error(r, errors_of(NULL), 401, errors_of(NULL)->auth_hint);
    } else if (!rt) {
        char msg[128];
        snprintf(msg, sizeof msg, "no route for %s %.80s", hr->method, hr->url);
        set_codec_error(r, errors_for(hr->url), 404, msg);
    } else if (strcmp(hr->method, rt->method) != 0) {
        char msg[96];
        snprintf(msg, sizeof msg, "use %s for %s", rt->method, rt->path);
        r->allow = rt->method;
        set_codec_error(r, errors_of(rt), 405, msg);
    } else if (!rt->public && authenticate(srv, hr, ns) != 0) {
        set_codec_error(r, errors_of(rt), 401, errors_of(rt)->auth_hint);
    } else {
        struct thaw_http_request under = *hr; /* the path as the routes know it */
        under.url = url;
        serve_route(srv, rt, &under, ns, r);
    }
    if (r->status >= 400 && !r->defer)
        atomic_fetch_add(&srv->metrics.requests_errors, 1);
    if (r->defer)
        LOG_DBG("%s %s -> waiting for the engine", hr->method, hr->url);
    else
        LOG_DBG("%s %s -> %d", hr->method, hr->url, r->status);
}

/* ---- serve ------------------------------------------------------------------------ */

/* A route from the environment, with its leading '/' ("" when unset). */
static void env_route(const char *name, const char *def, char *out, size_t cap)
{
    const char *v = getenv(name);

    if (!v || !*v)
        v = def;
    snprintf(out, cap, "%s%s", *v && *v != '/' ? "/" : "", v);
}

/* Vertex AI's custom-container contract, as llama-server reads it:
 * AIP_MODE=PREDICTION turns it on; AIP_PREDICT_ROUTE (default /predict),
 * AIP_HEALTH_ROUTE (besides /health) and AIP_HTTP_PORT (default 8080,
 * over --port) say where. */
static void predict_setup(struct server *srv)
{
    const char *mode = getenv("AIP_MODE"), *port = getenv("AIP_HTTP_PORT");

    if (!mode || strcmp(mode, "PREDICTION") != 0)
        return;
    env_route("AIP_PREDICT_ROUTE", "/predict", srv->predict, sizeof srv->predict);
    env_route("AIP_HEALTH_ROUTE", "", srv->health, sizeof srv->health);
    int p = port && *port ? atoi(port) : 8080;
    if (p != srv->cfg.port)
        LOG_WRN("Vertex AI (AIP_MODE=PREDICTION): port %d from AIP_HTTP_PORT, not --port %d", p, srv->cfg.port);
    srv->cfg.port = p;
    LOG_INF("Vertex AI (AIP_MODE=PREDICTION): POST %s takes instances, health at %s", srv->predict,
            srv->health[0] ? srv->health : "/health");
}

/* Each connection is a file descriptor: raise the soft limit to the hard
 * one, and keep --max-connections within it (with room for the cache's
 * files), so a flood is refused at accept instead of failing open() calls. */
static void fit_connection_limit(struct thaw_config *cfg)
{
    struct rlimit rl;

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        (void)setrlimit(RLIMIT_NOFILE, &rl);
        (void)getrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur != RLIM_INFINITY && (rlim_t)cfg->max_connections + 128 > rl.rlim_cur) {
        int fit = rl.rlim_cur > 256 ? (int)(rl.rlim_cur - 128) : 128;
        LOG_WRN("--max-connections %d does not fit the open-file limit (%llu): using %d", cfg->max_connections,
                (unsigned long long)rl.rlim_cur, fit);
        cfg->max_connections = fit;
    }
}

/* After the first SIGTERM/SIGINT: a second one means now. What the writer
 * still holds is lost; what it committed is not (cache_disk.c). */
static void *second_signal(void *arg)
{
    const sigset_t *sigs = arg;
    int sig;

    if (sigwait(sigs, &sig) == 0) {
        LOG_WRN("%s again: exiting now; finished turns not yet written are lost (those on disk are safe)",
                sig == SIGINT ? "SIGINT" : "SIGTERM");
        _exit(1);
    }
    return NULL;
}

int thaw_serve(const struct thaw_config *cfg)
{
    struct server *srv = calloc(1, sizeof *srv);
    static sigset_t sigs; /* second_signal's, for as long as the process lives */
    pthread_t second;
    int sig = 0, rc, code = 1;

    if (!srv)
        return 1;
    srv->cfg = *cfg; /* its strings stay the caller's */
    if (thaw_log_setup(srv->cfg.verbosity, srv->cfg.log_file, srv->cfg.log_colors, srv->cfg.log_prefix,
                       srv->cfg.log_timestamps) != 0)
        goto out;
    if (sodium_init() < 0) {
        LOG_ERR("libsodium failed to initialise");
        goto out;
    }
    thaw_keys_namespace(NULL, 0, srv->anon_ns);
    for (int i = 0; i < srv->cfg.n_api_keys; i++)
        thaw_keys_namespace(srv->cfg.api_keys[i], strlen(srv->cfg.api_keys[i]), srv->key_ns[i]);
    fit_connection_limit(&srv->cfg);
    predict_setup(srv);
    /* Signals are taken synchronously by this thread alone (sigwait below);
     * every thread started from here on inherits the blocked mask. */
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    srv->started = time(NULL);
    snprintf(srv->started_text, sizeof srv->started_text, "%ld", srv->started);
    srv->metrics_headers[0] = "Process-Start-Time-Unix";
    srv->metrics_headers[1] = srv->started_text;
    if ((rc = thaw_models_new(&srv->cfg, &srv->metrics, &srv->models)) != 0)
        goto out;
    struct thaw_http_params hp = {
        .host = srv->cfg.host,
        .port = srv->cfg.port,
        .max_body = srv->cfg.max_body,
        .max_connections = srv->cfg.max_connections,
        .max_per_client = srv->cfg.max_per_client,
        .threads = srv->cfg.threads_http,
        .timeout_s = srv->cfg.timeout_s,
        .handler = handle,
        .ud = srv,
        .error_body = http_error_body,
        .tls_key = srv->cfg.ssl_key,
        .tls_cert = srv->cfg.ssl_cert,
    };
    if ((rc = thaw_stream_pinger_start(srv->cfg.sse_ping_s)) != 0)
        goto out_engine;
    if ((rc = thaw_http_start(&hp, &srv->http)) != 0)
        goto out_engine;
    LOG_INF("listening on %s://%s:%d%s (%d slots, %s)", srv->cfg.ssl_key ? "https" : "http", srv->cfg.host,
            thaw_http_port(srv->http), srv->cfg.api_prefix,
            srv->cfg.n_parallel, srv->cfg.n_api_keys ? "API key required" : "no API key");
    if (srv->cfg.webui && thaw_webui_n_files > 0)
        LOG_INF("chat page: %s://%s:%d%s/", srv->cfg.ssl_key ? "https" : "http", srv->cfg.host,
                thaw_http_port(srv->http), srv->cfg.api_prefix);

    sigwait(&sigs, &sig);
    int64_t t_stop = thaw_now_us();
    int drain_ms = srv->cfg.shutdown_timeout_s * 1000 / 4;
    LOG_INF("%s: shutting down within --shutdown-timeout %d s (in-flight requests get an error, nothing new is "
            "accepted; a second signal exits at once)",
            sig == SIGINT ? "SIGINT" : "SIGTERM", srv->cfg.shutdown_timeout_s);
    if (pthread_create(&second, NULL, second_signal, &sigs) == 0)
        pthread_detach(second);
    thaw_http_quiesce(srv->http);
    thaw_models_stop(srv->models); /* every waiting request now has its answer */
    if (!thaw_http_drain(srv->http, drain_ms))
        LOG_WRN("some responses were still being sent after %d ms; closing their connections", drain_ms);
    thaw_http_stop(srv->http);
    code = 0;
out_engine:
    thaw_stream_pinger_stop();
    thaw_replay_shutdown();
    thaw_models_free(srv->models);
    if (code == 0)
        LOG_INF("shut down in %.1f s", (double)(thaw_now_us() - t_stop) / 1e6);
out:
    free(srv);
    return code;
}
