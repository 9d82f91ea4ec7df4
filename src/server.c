/* server.c — the routes and the `thaw serve` lifecycle.
 *
 * Map:
 *   ---- auth ----          Bearer keys -> namespace
 *   ---- chat route ----    parse, template, keys, submit, answer or stream
 *   ---- other routes ----  /v1/models, /health, /metrics
 *   ---- serve ----         start-up, signal wait, orderly shutdown
 */
#include "server.h"

#include "api.h"
#include "config.h"
#include "engine.h"
#include "error.h"
#include "http.h"
#include "log.h"
#include "metrics.h"
#include "utf8.h"

#include <signal.h>
#include <sys/resource.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct server {
    struct thaw_config cfg;
    struct thaw_metrics metrics;
    struct thaw_engine *engine;
    struct thaw_http *http;
    long started;
    uint8_t key_ns[THAW_MAX_API_KEYS][THAW_KEY_BYTES]; /* thaw_chat_namespace of each --api-key */
    uint8_t anon_ns[THAW_KEY_BYTES];                   /* the namespace without keys */
};

static void set_json(struct thaw_http_response *r, int status, char *body)
{
    r->status = status;
    r->content_type = "application/json";
    r->body = body;
    r->n_body = body ? strlen(body) : 0;
}

static void set_error(struct server *srv, struct thaw_http_response *r, int status, const char *msg)
{
    (void)srv;
    set_json(r, status, thaw_api_error_json(status, msg));
}

/* ---- auth ----------------------------------------------------------------------- */

/* Finds the tenant of a request: 0 and its namespace in `ns`, or -1 (no or
 * a wrong key). The presented key is hashed and the hash compared with every
 * key's, all of them, in constant time: neither a key's bytes nor its length
 * show in the timing. */
static int authenticate(const struct server *srv, const char *header, uint8_t ns[THAW_KEY_BYTES])
{
    uint8_t h[THAW_KEY_BYTES];
    int found = -1;

    if (srv->cfg.n_api_keys == 0) {
        memcpy(ns, srv->anon_ns, THAW_KEY_BYTES);
        return 0;
    }
    if (!header || strncmp(header, "Bearer ", 7) != 0 || !header[7])
        return -1;
    thaw_chat_namespace(header + 7, strlen(header + 7), h);
    for (int i = 0; i < srv->cfg.n_api_keys; i++)
        if (sodium_memcmp(h, srv->key_ns[i], THAW_KEY_BYTES) == 0)
            found = i;
    if (found >= 0)
        memcpy(ns, srv->key_ns[found], THAW_KEY_BYTES);
    return found >= 0 ? 0 : -1;
}

/* ---- chat route ------------------------------------------------------------------ */

struct stream {
    struct server *srv;
    struct thaw_task *task;
    char id[40];
    long created;
    size_t n_seen;      /* bytes of task->text already sent */
    char *pending;      /* framed SSE bytes not yet handed to the socket */
    size_t n_pending, off_pending;
    bool sent_role, finished;
};

static void make_id(char out[40])
{
    unsigned char r[12];

    randombytes_buf(r, sizeof r);
    memcpy(out, "chatcmpl-", 9);
    for (int i = 0; i < 12; i++)
        snprintf(out + 9 + 2 * i, 3, "%02x", r[i]);
}

static int pending_add(struct stream *st, char *json)
{
    if (!json)
        return THAW_ENOMEM;
    size_t n = strlen(json);
    char *nb = realloc(st->pending, st->n_pending + n + 9);
    if (!nb) {
        free(json);
        return THAW_ENOMEM;
    }
    st->pending = nb;
    st->n_pending += (size_t)sprintf(st->pending + st->n_pending, "data: %s\n\n", json);
    free(json);
    return 0;
}

/* Produces the next SSE events: role, content deltas, then the closing
 * chunk (finish_reason + timings), usage, [DONE] — or an error event.
 * Returns 0, STREAM_NOTHING_YET (the engine has no news: wait for its wake)
 * or THAW_ENOMEM. Never blocks. */
#define STREAM_NOTHING_YET 1

static int stream_refill(struct stream *st)
{
    struct thaw_task *t = st->task;
    const char *model = thaw_engine_model_name(st->srv->engine);

    if (!st->sent_role) {
        st->sent_role = true;
        return pending_add(st, thaw_api_chunk_json(st->id, model, st->created, "assistant", "", NULL, NULL, 0, false));
    }
    pthread_mutex_lock(&t->mu);
    size_t n_text = t->n_text;
    bool done = t->done;
    if (!done && n_text <= st->n_seen) {
        pthread_mutex_unlock(&t->mu);
        return STREAM_NOTHING_YET;
    }
    char *delta = n_text > st->n_seen ? thaw_utf8_sanitize(t->text + st->n_seen, n_text - st->n_seen) : NULL;
    pthread_mutex_unlock(&t->mu);
    st->n_seen = n_text;
    if (delta) {
        int rc = pending_add(st, thaw_api_chunk_json(st->id, model, st->created, NULL, delta, NULL, NULL, 0, false));
        free(delta);
        if (rc != 0)
            return rc;
    }
    if (!done)
        return 0;
    st->finished = true;
    if (t->http_status != 200) {
        int rc = pending_add(st, thaw_api_error_json(t->http_status, t->error ? t->error : "error"));
        return rc;
    }
    int rc = pending_add(st, thaw_api_chunk_json(st->id, model, st->created, NULL, NULL, t->finish_reason,
                                                 &t->timings, t->n_prompt, false));
    if (rc == 0 && t->req.include_usage)
        rc = pending_add(st, thaw_api_chunk_json(st->id, model, st->created, NULL, NULL, NULL, &t->timings,
                                                 t->n_prompt, true));
    if (rc == 0) {
        char *nb = realloc(st->pending, st->n_pending + 15);
        if (!nb)
            return THAW_ENOMEM;
        st->pending = nb;
        memcpy(st->pending + st->n_pending, "data: [DONE]\n\n", 14);
        st->n_pending += 14;
    }
    return rc;
}

static ssize_t stream_read(void *ud, char *buf, size_t max)
{
    struct stream *st = ud;

    while (st->off_pending == st->n_pending) {
        st->n_pending = st->off_pending = 0;
        if (st->finished)
            return 0;
        int rc = stream_refill(st);
        if (rc == STREAM_NOTHING_YET)
            return THAW_HTTP_STREAM_WAIT;
        if (rc != 0)
            return -1;
    }
    size_t n = st->n_pending - st->off_pending;
    if (n > max)
        n = max;
    memcpy(buf, st->pending + st->off_pending, n);
    st->off_pending += n;
    return (ssize_t)n;
}

static void stream_free(void *ud)
{
    struct stream *st = ud;

    /* the client may be gone before the reply is: stop generating for it */
    atomic_store(&st->task->cancelled, true);
    thaw_task_release(st->task);
    free(st->pending);
    free(st);
}

/* The engine reaches the HTTP connection through these (task.h). */
static void client_wake(void *ud) { thaw_http_wake(ud); }
static bool client_alive(void *ud) { return thaw_http_conn_alive(ud); }
static void client_release(void *ud) { thaw_http_conn_unref(ud); }
static const struct thaw_task_client http_client = {client_wake, client_alive, client_release};

/* The connection is done with a deferred request (answered, or the client
 * gone): nobody is left to read what the engine would still produce. */
static void task_release_cb(void *ud)
{
    struct thaw_task *t = ud;

    atomic_store(&t->cancelled, true);
    thaw_task_release(t);
}

/* A non-streaming reply, once the engine is done (the request was deferred
 * until then; a wake before the end only defers it again). */
static void chat_resume(void *ud, struct thaw_http_response *r)
{
    struct thaw_task *t = ud;

    pthread_mutex_lock(&t->mu);
    bool done = t->done;
    pthread_mutex_unlock(&t->mu);
    if (!done) {
        r->defer = true;
        r->resume = chat_resume;
        r->defer_ud = t;
        return;
    }
    if (t->http_status != 200) {
        set_json(r, t->http_status, thaw_api_error_json(t->http_status, t->error ? t->error : "error"));
        return;
    }
    char id[40];
    char *content = thaw_utf8_sanitize(t->text ? t->text : "", t->n_text);
    make_id(id);
    set_json(r, 200,
             content ? thaw_api_completion_json(id, t->model_name, time(NULL), content, t->finish_reason,
                                                t->n_prompt, &t->timings)
                     : NULL);
    free(content);
    if (!r->body)
        set_json(r, 500, thaw_api_error_json(500, "out of memory"));
}

static void route_chat(struct server *srv, const struct thaw_http_request *hr, const uint8_t ns[THAW_KEY_BYTES],
                       struct thaw_http_response *r)
{
    struct thaw_chat_request req;
    const struct thaw_chat *chat = thaw_engine_chat(srv->engine);
    llama_token *prompt = NULL;
    struct thaw_task *t = NULL;
    char err[256];
    int n_prompt = 0, rc;

    rc = thaw_api_parse_chat(hr->body, hr->n_body, srv->cfg.cache_prompt, &req, err, sizeof err);
    if (rc != 0) {
        set_error(srv, r, rc == THAW_EINVAL ? 400 : 500, rc == THAW_EINVAL ? err : thaw_strerror(rc));
        return;
    }
    /* cheap bounds first: no template or tokenizer work for what cannot fit */
    if ((rc = thaw_api_admit(&req, thaw_engine_n_ctx_slot(srv->engine), thaw_engine_max_token_bytes(srv->engine),
                             err, sizeof err)) != 0) {
        set_error(srv, r, 400, err);
        thaw_chat_request_free(&req);
        return;
    }
    if ((rc = thaw_chat_prompt_tokens(chat, &req, &prompt, &n_prompt)) != 0) {
        set_error(srv, r, 400, rc == THAW_EINVAL ? "the chat template could not render these messages"
                                                 : thaw_strerror(rc));
        thaw_chat_request_free(&req);
        return;
    }
    if (!(t = thaw_task_new(&req, prompt, n_prompt))) {
        free(prompt);
        thaw_chat_request_free(&req);
        set_error(srv, r, 500, "out of memory");
        return;
    }
    t->model_name = thaw_engine_model_name(srv->engine);
    /* max_tokens 0: nothing to generate, answered after one token as OpenAI does */
    t->max_tokens = t->req.max_tokens > 0 ? t->req.max_tokens : t->req.max_tokens == 0 ? 1 : srv->cfg.n_predict;
    memcpy(t->ns, ns, THAW_KEY_BYTES);
    thaw_engine_binding(srv->engine, ns, t->binding);
    long last_asst = thaw_chat_last_assistant(t->req.messages, t->req.n_messages);
    if (last_asst >= 0) {
        t->has_lookup_key = true;
        thaw_chat_key(t->binding, t->req.messages, (size_t)last_asst + 1, NULL, t->lookup_key);
    }
    /* before submit: the engine may finish (and wake) at once */
    thaw_http_conn_ref(hr->conn);
    t->client = &http_client;
    t->client_ud = hr->conn;

    rc = thaw_engine_submit(srv->engine, t);
    if (rc != 0) {
        char msg[160];
        int status = 500;
        if (rc == THAW_ECTXFULL) {
            status = 400;
            snprintf(msg, sizeof msg, "the prompt is %d tokens; a slot's context holds %d (-c / -np)", n_prompt,
                     thaw_engine_n_ctx_slot(srv->engine));
        } else if (rc == THAW_EBUSY) {
            status = 503;
            snprintf(msg, sizeof msg, "the server is busy: every slot is working and the queue is full; retry later");
        } else if (rc == THAW_ESHUTDOWN) {
            status = 503;
            snprintf(msg, sizeof msg, "the server is shutting down");
        } else {
            snprintf(msg, sizeof msg, "%s", thaw_strerror(rc));
        }
        set_error(srv, r, status, msg);
        thaw_task_release(t);
        return;
    }
    atomic_fetch_add(&srv->metrics.chat_requests, 1);

    if (t->req.stream) {
        struct stream *st = calloc(1, sizeof *st);
        if (!st) {
            atomic_store(&t->cancelled, true);
            thaw_task_release(t);
            set_error(srv, r, 500, "out of memory");
            return;
        }
        st->srv = srv;
        st->task = t;
        st->created = time(NULL);
        make_id(st->id);
        r->status = 200;
        r->content_type = "text/event-stream; charset=utf-8";
        r->stream = stream_read;
        r->stream_ud = st;
        r->stream_free = stream_free;
        return;
    }
    /* the connection sleeps until the engine is done (no thread waits) */
    r->defer = true;
    r->resume = chat_resume;
    r->defer_ud = t;
    r->defer_free = task_release_cb;
}

/* ---- other routes ---------------------------------------------------------------- */

static void route_metrics(struct server *srv, struct thaw_http_response *r)
{
    r->status = 200;
    r->content_type = "text/plain; version=0.0.4";
    r->body = thaw_metrics_render(&srv->metrics, thaw_engine_metrics, srv->engine);
    if (!r->body)
        set_error(srv, r, 500, "out of memory");
}

static void handle(void *ud, const struct thaw_http_request *hr, struct thaw_http_response *r)
{
    struct server *srv = ud;
    const char *url = hr->url;
    bool get = strcmp(hr->method, "GET") == 0;
    bool post = strcmp(hr->method, "POST") == 0;

    atomic_fetch_add(&srv->metrics.requests_total, 1);
    if (strcmp(url, "/health") == 0 || strcmp(url, "/v1/health") == 0) {
        if (!get) {
            r->allow = "GET";
            set_error(srv, r, 405, "use GET for /health");
        } else {
            set_json(r, 200, strdup("{\"status\":\"ok\"}"));
        }
        goto out;
    }
    uint8_t ns[THAW_KEY_BYTES];
    if (authenticate(srv, hr->authorization, ns) != 0) {
        set_error(srv, r, 401, "missing or invalid API key: send 'Authorization: Bearer <key>'");
        goto out;
    }
    if (strcmp(url, "/v1/chat/completions") == 0 || strcmp(url, "/chat/completions") == 0) {
        if (!post) {
            r->allow = "POST";
            set_error(srv, r, 405, "use POST for /v1/chat/completions");
        } else {
            route_chat(srv, hr, ns, r);
        }
    } else if (strcmp(url, "/v1/models") == 0 || strcmp(url, "/models") == 0) {
        if (!get) {
            r->allow = "GET";
            set_error(srv, r, 405, "use GET for /v1/models");
        } else {
            set_json(r, 200,
                     thaw_api_models_json(thaw_engine_model_name(srv->engine), srv->started,
                                          thaw_engine_n_params(srv->engine), thaw_engine_n_ctx_train(srv->engine)));
        }
    } else if (strcmp(url, "/metrics") == 0) {
        if (!get) {
            r->allow = "GET";
            set_error(srv, r, 405, "use GET for /metrics");
        } else {
            route_metrics(srv, r);
        }
    } else {
        char msg[128];
        snprintf(msg, sizeof msg, "no route for %s %.80s", hr->method, url);
        set_error(srv, r, 404, msg);
    }
out:
    if (r->status >= 400)
        atomic_fetch_add(&srv->metrics.requests_errors, 1);
    LOG_DBG("%s %s -> %d", hr->method, url, r->status);
}

/* ---- serve ------------------------------------------------------------------------ */

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

int thaw_serve_main(int argc, char **argv)
{
    struct server *srv = calloc(1, sizeof *srv);
    sigset_t sigs;
    int sig = 0, rc, code = 1;

    if (!srv)
        return 1;
    thaw_config_init(&srv->cfg);
    rc = thaw_config_parse(&srv->cfg, argc, argv);
    if (rc != 0) {
        code = rc == 1 ? 0 : 2;
        goto out;
    }
    thaw_log_set_verbosity(srv->cfg.verbosity);
    if (sodium_init() < 0) {
        LOG_ERR("libsodium failed to initialise");
        goto out;
    }
    thaw_chat_namespace(NULL, 0, srv->anon_ns);
    for (int i = 0; i < srv->cfg.n_api_keys; i++)
        thaw_chat_namespace(srv->cfg.api_keys[i], strlen(srv->cfg.api_keys[i]), srv->key_ns[i]);
    fit_connection_limit(&srv->cfg);
    /* Signals are taken synchronously by this thread alone (sigwait below);
     * every thread started from here on inherits the blocked mask. */
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    srv->started = time(NULL);
    if ((rc = thaw_engine_new(&srv->cfg, &srv->metrics, &srv->engine)) != 0)
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
        .error_body = thaw_api_error_json,
    };
    if ((rc = thaw_http_start(&hp, &srv->http)) != 0)
        goto out_engine;
    LOG_INF("listening on http://%s:%d (%d slots, %s)", srv->cfg.host, thaw_http_port(srv->http),
            srv->cfg.n_parallel, srv->cfg.n_api_keys ? "API key required" : "no API key");

    sigwait(&sigs, &sig);
    LOG_INF("%s: shutting down (in-flight requests get an error, nothing new is accepted)",
            sig == SIGINT ? "SIGINT" : "SIGTERM");
    thaw_http_quiesce(srv->http);
    thaw_engine_stop(srv->engine); /* every waiting request now has its answer */
    if (!thaw_http_drain(srv->http, 10000))
        LOG_WRN("some responses were still being sent after 10 s; closing their connections");
    thaw_http_stop(srv->http);
    code = 0;
out_engine:
    thaw_engine_free(srv->engine);
out:
    thaw_config_free(&srv->cfg);
    free(srv);
    return code;
}
