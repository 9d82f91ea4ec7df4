/* server.c — the routes and the `thaw serve` lifecycle.
 *
 * Map:
 *   ---- wire formats ----  each API's codec: parse, reply, errors (chat completions, Anthropic Messages,
 *                           OpenAI Responses)
 *   ---- auth ----          Bearer / x-api-key keys -> namespace
 *   ---- chat route ----    parse, template, keys, submit, answer or stream (stream.c frames it)
 *   ---- other routes ----  /v1/models, /health, /metrics, /cache, the page (/, /webui/)
 *   ---- serve ----         start-up, signal wait, orderly shutdown
 */
#include "http/server.h"

#include "api/api.h"
#include "api/api_anthropic.h"
#include "api/api_completions.h"
#include "api/api_responses.h"
#include "api/keys_request.h"
#include "api/template.h"
#include "base/clock.h"
#include "base/config.h"
#include "base/error.h"
#include "base/log.h"
#include "base/metrics.h"
#include "base/utf8.h"
#include "engine/engine.h"
#include "engine/slots_view.h"
#include "engine/task.h"
#include "http/http.h"
#include "http/stream.h"
#include "http/webui.h"

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
    struct thaw_engine *engine;
    struct thaw_http *http;
    long started;
    uint8_t key_ns[THAW_MAX_API_KEYS][THAW_KEY_BYTES]; /* thaw_keys_namespace of each --api-key */
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

/* ---- wire formats ------------------------------------------------------------------ */

/* One API's codec as the routes see it: the body -> the internal request,
 * and the internal results -> that API's JSON. Everything between (template,
 * keys, slots, every cache tier) is the same for all of them. */
struct wire {
    enum thaw_wire stream; /* stream.h's writer */
    const char *id_prefix; /* of a reply's id */
    int (*parse)(const char *body, size_t len, bool default_cache_prompt, struct thaw_chat_request *out, char *err,
                 size_t errlen);
    char *(*error_json)(int status, const char *message);
    /* the non-streaming reply of a task done with status 200 */
    char *(*reply_json)(const struct thaw_task *t, const char *id);
    /* the 400 of a prompt longer than a slot's context */
    void (*too_long)(char *buf, size_t n, int n_prompt, int n_ctx_slot);
    const char *auth_hint; /* the 401's message */
    bool raw;              /* a raw prompt (completions): no template */
};

static char *chat_reply(const struct thaw_task *t, const char *id)
{
    return thaw_api_completion_json(id, t->model_name, time(NULL), t->message_json, t->finish_reason, t->n_prompt,
                                    &t->timings);
}

static void chat_too_long(char *buf, size_t n, int n_prompt, int n_ctx_slot)
{
    snprintf(buf, n, "the prompt is %d tokens; a slot's context holds %d (-c / -np)", n_prompt, n_ctx_slot);
}

static char *messages_reply(const struct thaw_task *t, const char *id)
{
    return thaw_anthropic_message_json(id, t->model_name, t->message_json, t->finish_reason, t->stop_sequence,
                                       t->n_prompt, &t->timings);
}

/* Claude Code reads the two numbers out of exactly this sentence */
static void messages_too_long(char *buf, size_t n, int n_prompt, int n_ctx_slot)
{
    snprintf(buf, n, "prompt is too long: %d tokens > %d maximum", n_prompt, n_ctx_slot - 1);
}

static char *responses_reply(const struct thaw_task *t, const char *id)
{
    return thaw_responses_json(id, t->model_name, time(NULL), t->message_json, t->finish_reason, t->n_prompt,
                               &t->timings);
}

static const struct wire wire_chat = {
    THAW_WIRE_CHAT, "chatcmpl-", thaw_api_parse_chat, thaw_api_error_json, chat_reply, chat_too_long,
    "missing or invalid API key: send 'Authorization: Bearer <key>'", false,
};
static const struct wire wire_messages = {
    THAW_WIRE_MESSAGES, "msg_", thaw_anthropic_parse, thaw_anthropic_error_json, messages_reply, messages_too_long,
    "missing or invalid API key: send 'x-api-key: <key>' or 'Authorization: Bearer <key>'", false,
};

static const struct wire wire_responses = {
    THAW_WIRE_RESPONSES, "resp_", thaw_responses_parse, thaw_api_error_json, responses_reply, chat_too_long,
    "missing or invalid API key: send 'Authorization: Bearer <key>'", false,
};

static char *completions_reply(const struct thaw_task *t, const char *id)
{
    char *text = thaw_api_message_content(t->message_json);
    char *out = text ? thaw_api_text_completion_json(id, t->model_name, time(NULL), text, t->finish_reason,
                                                     t->n_prompt, &t->timings)
                     : NULL;

    free(text);
    return out;
}

static char *completion_reply(const struct thaw_task *t, const char *id)
{
    char *text = thaw_api_message_content(t->message_json);
    char *out = text ? thaw_api_llama_completion_json(t->model_name, text, true, t->finish_reason,
                                                      t->stop_sequence, t->n_prompt, &t->timings)
                     : NULL;

    (void)id;
    free(text);
    return out;
}

static const struct wire wire_completions = {
    THAW_WIRE_COMPLETIONS, "cmpl-", thaw_api_parse_completion, thaw_api_error_json, completions_reply, chat_too_long,
    "missing or invalid API key: send 'Authorization: Bearer <key>'", true,
};
static const struct wire wire_completion = {
    THAW_WIRE_COMPLETION, "cmpl-", thaw_api_parse_completion, thaw_api_error_json, completion_reply, chat_too_long,
    "missing or invalid API key: send 'Authorization: Bearer <key>'", true,
};

static void set_wire_error(struct thaw_http_response *r, const struct wire *w, int status, const char *msg)
{
    set_json(r, status, w->error_json(status, msg));
}

/* Whose error shape a path's errors take when no route answers them (a
 * 404, or what http.c refuses before any route: 413): Anthropic's under
 * /v1/messages, where its SDKs and Claude Code read them, else OpenAI's. */
static const struct wire *errors_for(const char *url)
{
    static const char anthropic[] = "/v1/messages";
    size_t n = sizeof anthropic - 1;

    if (url && strncmp(url, anthropic, n) == 0 && (url[n] == '\0' || url[n] == '/'))
        return &wire_messages;
    return &wire_chat;
}

/* http.c's error bodies (thaw_http_params.error_body) */
static char *http_error_body(void *ud, const char *url, int status, const char *msg)
{
    (void)ud;
    return errors_for(url)->error_json(status, msg);
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
    for (int i = 0; i < 12; i++)
        snprintf(out + n + 2 * i, 3, "%02x", r[i]);
}

/* The engine reaches the HTTP connection through these (task.h). */
static void client_wake(void *ud) { thaw_http_wake(ud); }
static bool client_alive(void *ud) { return thaw_http_conn_alive(ud); }
static void client_release(void *ud) { thaw_http_conn_unref(ud); }
static const struct thaw_task_client http_client = {client_wake, client_alive, client_release};

/* A non-streaming request waiting for the engine: its task and its API. */
struct deferred {
    struct thaw_task *task[THAW_API_MAX_N]; /* n_tasks: one per choice ('n') */
    int n_tasks;
    const struct wire *wire;
    struct server *srv;
};

/* The prompt as the model read it: each token's text as the vocabulary
 * has it (special tokens rendered), made valid UTF-8, as llama-server
 * shows it ("<s> " + text). malloc'd; NULL on ENOMEM. */
static char *prompt_text(const struct server *srv, const struct thaw_task *t)
{
    const struct thaw_chat *chat = thaw_engine_chat(srv->engine);
    char *prompt = malloc(1), *out;
    size_t n = 0, cap = 1;

    if (!prompt)
        return NULL;
    prompt[0] = '\0';
    for (int i = 0; i < t->n_prompt; i++) {
        char *piece = thaw_chat_token_piece(chat, t->prompt[i]), *np;
        size_t len = piece ? strlen(piece) : 0;
        if (!piece || !(np = n + len + 1 > cap ? realloc(prompt, cap = 2 * (n + len + 1)) : prompt)) {
            free(piece);
            free(prompt);
            return NULL;
        }
        prompt = np;
        memcpy(prompt + n, piece, len + 1);
        n += len;
        free(piece);
    }
    out = thaw_utf8_sanitize(prompt, n);
    free(prompt);
    return out;
}

/* llama-server's __verbose (a request's "verbose": true, or the server's
 * -v when the request does not say): the prompt as the model read it and
 * the reply's text and counts. Added to `body` (a reply object's JSON);
 * the body is left as it was when anything fails. */
static char *add_verbose(const struct server *srv, const struct thaw_task *t, char *body)
{
    json_t *root = json_loads(body, 0, NULL);
    char *prompt = prompt_text(srv, t), *content = thaw_api_message_content(t->message_json), *out = NULL;
    char *cclean = content ? thaw_utf8_sanitize(content, strlen(content)) : NULL;

    if (json_is_object(root) && prompt && cclean)
        json_object_set_new(root, "__verbose",
                            json_pack("{s:s, s:s, s:i, s:i, s:i, s:s}", "prompt", prompt, "content", cclean,
                                      "tokens_evaluated", t->n_prompt, "tokens_predicted", t->timings.predicted_n,
                                      "tokens_cached", t->timings.cache_n, "finish_reason",
                                      t->finish_reason ? t->finish_reason : ""));
    out = json_object_get(root, "__verbose") ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    free(prompt);
    free(content);
    free(cclean);
    if (!out)
        return body;
    free(body);
    return out;
}

/* /completion's whole reply, as llama-server's: with the prompt the model
 * read and generation_settings; then, with response_fields, only the named
 * fields, each "a/b" path read from that whole reply and keyed by the path
 * (a path that names nothing is left out). Takes `body`; NULL on ENOMEM. */
static char *completion_fields(const struct server *srv, const struct thaw_task *t, char *body)
{
    json_t *root = json_loads(body, 0, NULL), *out = NULL, *f;
    json_t *fields = t->req.response_fields ? json_loads(t->req.response_fields, 0, NULL) : NULL;
    char *prompt = prompt_text(srv, t), *text = NULL;
    size_t i;

    free(body);
    if (!json_is_object(root) || !prompt || !(out = json_object()))
        goto done;
    json_object_set_new(root, "prompt", json_string(prompt));
    json_object_set_new(root, "generation_settings",
                        json_pack("{s:i, s:i, s:b, s:b}", "n_predict", t->max_tokens, "n_probs", t->req.n_probs,
                                  "post_sampling_probs", t->req.post_sampling_probs, "stream", t->req.stream));
    if (!json_is_array(fields)) {
        text = json_dumps(root, JSON_COMPACT);
        goto done;
    }
    json_array_foreach(fields, i, f) {
        const char *path = json_string_value(f);
        json_t *v = root;
        for (const char *p = path; v && *p;) {
            size_t n = strcspn(p, "/");
            char key[256];
            snprintf(key, sizeof key, "%.*s", (int)(n < 255 ? n : 255), p);
            v = json_object_get(v, key);
            p += n;
            if (*p == '/')
                p++;
        }
        if (v)
            json_object_set(out, path, v);
    }
    text = json_dumps(out, JSON_COMPACT);
done:
    json_decref(out);
    json_decref(fields);
    json_decref(root);
    free(prompt);
    return text;
}

/* The reply's per-token probabilities (logprobs.h) in its API's place:
 * choices[0].logprobs {"content"} (chat), OpenAI completions' legacy
 * object, /completion's completion_probabilities. Takes `body`; NULL on
 * ENOMEM. */
static char *add_logprobs(struct thaw_task *t, const struct wire *w, char *body)
{
    json_t *root = json_loads(body, 0, NULL), *choice = json_array_get(json_object_get(root, "choices"), 0);
    size_t to;
    json_t *lp = thaw_task_logprobs(t, 0, t->n_text, true, w == &wire_completions, &to);
    char *out = NULL;

    free(body);
    if (!json_is_object(root) || !lp)
        goto done;
    if (w == &wire_completion)
        json_object_set(root, "completion_probabilities", lp);
    else if (w == &wire_completions && choice)
        json_object_set(choice, "logprobs", lp);
    else if (choice)
        json_object_set_new(choice, "logprobs", json_pack("{s:O}", "content", lp));
    out = json_dumps(root, JSON_COMPACT);
done:
    json_decref(lp);
    json_decref(root);
    return out;
}

static bool wants_verbose(const struct server *srv, const struct thaw_task *t, const struct wire *w)
{
    bool on = t->req.verbose >= 0 ? t->req.verbose > 0 : srv->cfg.verbosity >= THAW_LOG_DEBUG;
    return on && (w == &wire_chat || w == &wire_completions || w == &wire_completion);
}

/* The connection is done with a deferred request (answered, or the client
 * gone): nobody is left to read what the engine would still produce. */
static void deferred_free(void *ud)
{
    struct deferred *d = ud;

    for (int i = 0; i < d->n_tasks; i++)
        thaw_task_abandon(d->task[i]);
    free(d);
}

/* A non-streaming reply, once the engine is done (the request was deferred
 * until then; a wake before the end only defers it again). */
/* One task's whole reply in its wire's shape (logprobs and __verbose
 * added); NULL on ENOMEM. */
static char *reply_body(struct server *srv, struct thaw_task *t, const struct wire *w, const char *id)
{
    char *body = t->message_json ? w->reply_json(t, id) : NULL;

    if (body && wants_verbose(srv, t, w))
        body = add_verbose(srv, t, body);
    if (body && t->req.logprobs)
        body = add_logprobs(t, w, body);
    if (body && w == &wire_completion)
        body = completion_fields(srv, t, body);
    return body;
}

/* n > 1: choice 0 of `other` (taken) appended to body's choices as
 * choice `index`, its completion tokens added to the usage. Takes body;
 * NULL on ENOMEM. */
static char *merge_choice(char *body, char *other, int index)
{
    json_t *a = json_loads(body, 0, NULL), *b = other ? json_loads(other, 0, NULL) : NULL;
    json_t *choice = json_array_get(json_object_get(b, "choices"), 0);
    json_t *ua = json_object_get(a, "usage"), *ub = json_object_get(b, "usage");
    char *out = NULL;

    free(body);
    free(other);
    if (json_is_object(a) && json_is_object(choice) && json_is_array(json_object_get(a, "choices"))) {
        json_object_set_new(choice, "index", json_integer(index));
        json_array_append(json_object_get(a, "choices"), choice);
        if (ua && ub) {
            json_int_t ct = json_integer_value(json_object_get(ua, "completion_tokens")) +
                            json_integer_value(json_object_get(ub, "completion_tokens"));
            json_object_set_new(ua, "completion_tokens", json_integer(ct));
            json_object_set_new(ua, "total_tokens",
                                json_integer(json_integer_value(json_object_get(ua, "prompt_tokens")) + ct));
        }
        out = json_dumps(a, JSON_COMPACT);
    }
    json_decref(a);
    json_decref(b);
    return out;
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
            set_wire_error(r, d->wire, t->http_status, t->error ? t->error : "error");
            return;
        }
    }
    make_id(d->wire->id_prefix, id);
    char *body = reply_body(d->srv, d->task[0], d->wire, id);
    for (int i = 1; i < d->n_tasks && body; i++)
        body = merge_choice(body, reply_body(d->srv, d->task[i], d->wire, id), i);
    set_json(r, 200, body);
    if (!r->body)
        set_wire_error(r, d->wire, 500, "out of memory");
}

/* A client's conversation id made fit for one log line: printable ASCII as
 * is, every other byte as \xNN (a newline in an id must not forge a line of
 * its own), "-" when absent. buf holds 4 * THAW_API_MAX_CONVERSATION_ID + 1. */
static const char *log_id(const char *id, char *buf)
{
    static const char hex[] = "0123456789abcdef";
    size_t n = 0;

    if (!id)
        return "-";
    for (const unsigned char *p = (const unsigned char *)id; *p; p++) {
        if (*p >= 0x20 && *p < 0x7f && *p != '\\') {
            buf[n++] = (char)*p;
        } else {
            buf[n++] = '\\';
            buf[n++] = 'x';
            buf[n++] = hex[*p >> 4];
            buf[n++] = hex[*p & 15];
        }
    }
    buf[n] = '\0';
    return buf;
}

/* The server's --grammar / --json-schema for a request that constrains
 * nothing itself (no grammar, schema, or tools). 0 or THAW_ENOMEM. */
static int apply_defaults(const struct thaw_config *cfg, struct thaw_chat_request *req)
{
    if (req->grammar || req->json_schema || req->tools_json)
        return 0;
    if (cfg->json_schema && !(req->json_schema = strdup(cfg->json_schema)))
        return THAW_ENOMEM;
    if (cfg->grammar && !(req->grammar = strdup(cfg->grammar)))
        return THAW_ENOMEM;
    return 0;
}

/* A logit_bias text's tokens (thaw_api_resolve_bias): as the text reads
 * inside a reply, no BOS, special tokens not parsed. */
static int32_t *bias_tokenize(void *ud, const char *text, int *n)
{
    const struct thaw_chat *chat = ud;
    llama_token *toks = NULL;

    *n = 0;
    if (thaw_chat_tokenize_plain(chat, text, &toks, n) != 0)
        return NULL;
    return toks;
}

/* Parse, the cheap bounds, the template: the request and its prompt, or an
 * answered error (then returns nonzero and nothing needs freeing). */
static int prepare(struct server *srv, const struct thaw_http_request *hr, const struct wire *w,
                   struct thaw_http_response *r, struct thaw_chat_request *req, llama_token **prompt, int *n_prompt,
                   struct thaw_chat_gen *gen)
{
    const struct thaw_chat *chat = thaw_engine_chat(srv->engine);
    char err[512];
    int rc;

    /* the proxy in front routes on it; thaw's cache keys come from the
     * messages, so it is only bounded (as prompt_cache_key) and logged */
    if (hr->conversation_id && strlen(hr->conversation_id) > THAW_API_MAX_CONVERSATION_ID) {
        snprintf(err, sizeof err, "the 'X-Conversation-Id' header is longer than %d bytes",
                 THAW_API_MAX_CONVERSATION_ID);
        set_wire_error(r, w, 400, err);
        return THAW_EINVAL;
    }
    rc = w->parse(hr->body, hr->n_body, srv->cfg.cache_prompt, req, err, sizeof err);
    if (rc != 0) {
        set_wire_error(r, w, rc == THAW_EINVAL ? 400 : 500, rc == THAW_EINVAL ? err : thaw_strerror(rc));
        return rc;
    }
    if (req->n_bias > 0 &&
        (rc = thaw_api_resolve_bias(req, thaw_chat_n_vocab(chat), bias_tokenize, (void *)chat, err, sizeof err)) != 0) {
        set_wire_error(r, w, rc == THAW_EINVAL ? 400 : 500, rc == THAW_EINVAL ? err : thaw_strerror(rc));
        thaw_chat_request_free(req);
        return rc;
    }
    if (req->id_slot >= srv->cfg.n_parallel) {
        snprintf(err, sizeof err, "'id_slot' %d: the server has %d slots (-np), 0 to %d", req->id_slot,
                 srv->cfg.n_parallel, srv->cfg.n_parallel - 1);
        set_wire_error(r, w, 400, err);
        thaw_chat_request_free(req);
        return THAW_EINVAL;
    }
    /* cheap bounds first: no template or tokenizer work for what cannot fit */
    if ((rc = thaw_api_admit(req, thaw_engine_n_ctx_slot(srv->engine), thaw_engine_max_token_bytes(srv->engine),
                             err, sizeof err)) != 0) {
        set_wire_error(r, w, 400, err);
        thaw_chat_request_free(req);
        return rc;
    }
    if ((rc = apply_defaults(&srv->cfg, req)) != 0) {
        set_wire_error(r, w, 500, thaw_strerror(rc));
        thaw_chat_request_free(req);
        return rc;
    }
    if ((rc = w->raw ? thaw_chat_raw_prompt(chat, req, prompt, n_prompt, gen, err, sizeof err)
                     : thaw_chat_prompt(chat, req, prompt, n_prompt, gen, err, sizeof err)) != 0) {
        set_wire_error(r, w, rc == THAW_EINVAL ? 400 : 500, rc == THAW_EINVAL ? err : thaw_strerror(rc));
        thaw_chat_request_free(req);
        return rc;
    }
    return 0;
}

/* Parse, prepare and set up one task for the request (not submitted; the
 * connection referenced for it). NULL when the request was answered
 * (an error in r). */
static struct thaw_task *build_task(struct server *srv, const struct thaw_http_request *hr,
                                    const uint8_t ns[THAW_KEY_BYTES], struct thaw_http_response *r,
                                    const struct wire *w)
{
    struct thaw_chat_request req;
    llama_token *prompt = NULL;
    struct thaw_chat_gen gen;
    struct thaw_task *t = NULL;
    int n_prompt = 0;

    if (prepare(srv, hr, w, r, &req, &prompt, &n_prompt, &gen) != 0)
        return NULL;
    if (!(t = thaw_task_new(&req, prompt, n_prompt))) {
        free(prompt);
        thaw_chat_request_free(&req);
        thaw_chat_gen_free(&gen);
        set_wire_error(r, w, 500, "out of memory");
        return NULL;
    }
    t->gen = gen;
    if (gen.grammar)
        LOG_DBG("chat: grammar of %zu bytes (%s, %d trigger patterns, %d trigger tokens, %d prefill tokens), %d stops",
                strlen(gen.grammar), gen.grammar_lazy ? "lazy" : "from the first token", gen.n_triggers,
                gen.n_trigger_tokens, gen.n_prefill, gen.n_stops);
    {
        unsigned char rnd[6];
        randombytes_buf(rnd, sizeof rnd);
        for (int i = 0; i < 6; i++)
            snprintf(t->id_prefix + 2 * i, 3, "%02x", rnd[i]);
    }
    t->model_name = thaw_engine_model_name(srv->engine);
    bool branch_remembered;
    t->n_branch =
        thaw_chat_branch_point(thaw_engine_chat(srv->engine), ns, &t->req, t->prompt, t->n_prompt, &branch_remembered);
    if (thaw_engine_recurrent(srv->engine))
        t->n_gen_prompt = thaw_chat_gen_prompt_tokens(thaw_engine_chat(srv->engine), &t->req);
    /* max_tokens 0: nothing to generate, answered after one token as OpenAI does */
    t->max_tokens = t->req.max_tokens > 0 ? t->req.max_tokens : t->req.max_tokens == 0 ? 1 : srv->cfg.n_predict;
    memcpy(t->ns, ns, THAW_KEY_BYTES);
    thaw_engine_binding(srv->engine, ns, t->binding);
    thaw_keys_bind_request(t->binding, &t->req, t->binding);
    long last_asst = thaw_keys_last_assistant(t->req.messages, t->req.n_messages);
    if (last_asst >= 0) {
        t->has_lookup_key = true;
        thaw_keys_conversation(t->binding, t->req.messages, (size_t)last_asst + 1, NULL, t->lookup_key);
    }
    if (thaw_log_verbosity() >= THAW_LOG_DEBUG) {
        char pck[4 * THAW_API_MAX_CONVERSATION_ID + 1], xci[4 * THAW_API_MAX_CONVERSATION_ID + 1];
        LOG_DBG("chat: %zu messages, %d prompt tokens (%d of the leading system messages%s)%s, prompt_cache_key %s, "
                "X-Conversation-Id %s",
                t->req.n_messages, n_prompt, t->n_branch, branch_remembered ? ", remembered" : "",
                t->req.stream ? ", streamed" : "", log_id(t->req.prompt_cache_key, pck),
                log_id(hr->conversation_id, xci));
    }
    /* before submit: the engine may finish (and wake) at once */
    thaw_http_conn_ref(hr->conn);
    t->client = &http_client;
    t->client_ud = hr->conn;
    return t;
}

/* Submits t, or answers the engine's refusal in r (then t's reference is
 * dropped). Returns the engine's rc. */
static int submit(struct server *srv, struct thaw_task *t, struct thaw_http_response *r, const struct wire *w)
{
    int rc = thaw_engine_submit(srv->engine, t);

    if (rc == 0) {
        atomic_fetch_add(&srv->metrics.chat_requests, 1);
        return 0;
    }
    char msg[160];
    int status = 500;
    if (rc == THAW_ECTXFULL) {
        status = 400;
        w->too_long(msg, sizeof msg, t->n_prompt, thaw_engine_n_ctx_slot(srv->engine));
    } else if (rc == THAW_EBUSY) {
        status = 503;
        snprintf(msg, sizeof msg, "the server is busy: every slot is working and the queue is full; retry later");
    } else if (rc == THAW_ESHUTDOWN) {
        status = 503;
        snprintf(msg, sizeof msg, "the server is shutting down");
    } else {
        snprintf(msg, sizeof msg, "%s", thaw_strerror(rc));
    }
    if (rc == THAW_ECTXFULL && w->error_json == thaw_api_error_json) /* llama-server's shape, with the numbers */
        set_json(r, 400, thaw_api_ctx_error_json(msg, t->n_prompt, thaw_engine_n_ctx_slot(srv->engine)));
    else
        set_wire_error(r, w, status, msg);
    thaw_task_release(t);
    return rc;
}

static void serve_chat(struct server *srv, const struct thaw_http_request *hr, const uint8_t ns[THAW_KEY_BYTES],
                       struct thaw_http_response *r, const struct wire *w)
{
    struct thaw_task *t = build_task(srv, hr, ns, r, w);
    struct deferred *d = NULL;

    if (!t)
        return;
    int n = t->req.n_choices;
    if (n > 1 && (t->req.stream || (w != &wire_chat && w != &wire_completions))) {
        set_wire_error(r, w, 400,
                       t->req.stream ? "'n' > 1 is served without streaming: send 'stream': false, or one request per choice"
                                     : "'n' > 1 is for /v1/chat/completions and /v1/completions");
        thaw_task_release(t);
        return;
    }
    if (submit(srv, t, r, w) != 0)
        return;

    if (t->req.stream) {
        char id[48];
        make_id(w->id_prefix, id);
        struct thaw_stream *st = thaw_stream_new(w->stream, t, id, t->model_name, time(NULL));
        if (!st) {
            thaw_task_abandon(t);
            set_wire_error(r, w, 500, "out of memory");
            return;
        }
        r->status = 200;
        r->content_type = "text/event-stream; charset=utf-8";
        r->stream = thaw_stream_read;
        r->stream_ud = st;
        r->stream_free = thaw_stream_free;
        return;
    }
    /* the connection sleeps until the engine is done (no thread waits) */
    if (!(d = calloc(1, sizeof *d))) {
        thaw_task_abandon(t);
        set_wire_error(r, w, 500, "out of memory");
        return;
    }
    d->task[d->n_tasks++] = t;
    d->wire = w;
    d->srv = srv;
    /* n > 1: each further choice is a task of its own, built from the same
     * body (its own sampler and seed); they queue for slots like any
     * request, and after the first the prompt is usually a cache hit */
    while (d->n_tasks < n) {
        struct thaw_task *ti = build_task(srv, hr, ns, r, w);
        if (!ti || submit(srv, ti, r, w) != 0) {
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

static void route_chat(struct server *srv, const struct thaw_http_request *hr, const uint8_t ns[THAW_KEY_BYTES],
                       struct thaw_http_response *r)
{
    serve_chat(srv, hr, ns, r, &wire_chat);
}

/* POST /v1/completions (OpenAI's legacy API) and POST /completion
 * (llama-server's): a raw prompt through the same slots and cache tiers */
static void route_completions(struct server *srv, const struct thaw_http_request *hr, const uint8_t ns[THAW_KEY_BYTES],
                              struct thaw_http_response *r)
{
    serve_chat(srv, hr, ns, r, &wire_completions);
}

static void route_completion(struct server *srv, const struct thaw_http_request *hr, const uint8_t ns[THAW_KEY_BYTES],
                             struct thaw_http_response *r)
{
    serve_chat(srv, hr, ns, r, &wire_completion);
}

/* POST /v1/messages (Claude Code adds ?beta=true: the path is all that is matched) */
static void route_messages(struct server *srv, const struct thaw_http_request *hr, const uint8_t ns[THAW_KEY_BYTES],
                           struct thaw_http_response *r)
{
    serve_chat(srv, hr, ns, r, &wire_messages);
}

/* POST /v1/responses (Codex: {base_url}/responses) */
static void route_responses(struct server *srv, const struct thaw_http_request *hr, const uint8_t ns[THAW_KEY_BYTES],
                            struct thaw_http_response *r)
{
    serve_chat(srv, hr, ns, r, &wire_responses);
}

/* POST /v1/messages/count_tokens: the prompt the request renders to,
 * counted (Claude Code's /context). */
static void route_count_tokens(struct server *srv, const struct thaw_http_request *hr, const uint8_t *ns,
                               struct thaw_http_response *r)
{
    struct thaw_chat_request req;
    llama_token *prompt = NULL;
    struct thaw_chat_gen gen;
    int n_prompt = 0;

    (void)ns;
    if (prepare(srv, hr, &wire_messages, r, &req, &prompt, &n_prompt, &gen) != 0)
        return;
    set_json(r, 200, thaw_anthropic_count_json(n_prompt));
    if (!r->body)
        set_wire_error(r, &wire_messages, 500, "out of memory");
    free(prompt);
    thaw_chat_gen_free(&gen);
    thaw_chat_request_free(&req);
}

/* POST /v1/chat/completions/input_tokens and /v1/responses/input_tokens
 * (llama-server's): {"input_tokens": n}, the prompt the request renders to,
 * counted; nothing is generated. */
static void count_input_tokens(struct server *srv, const struct thaw_http_request *hr, struct thaw_http_response *r,
                               const struct wire *w)
{
    struct thaw_chat_request req;
    llama_token *prompt = NULL;
    struct thaw_chat_gen gen;
    int n_prompt = 0;
    char buf[48];

    if (prepare(srv, hr, w, r, &req, &prompt, &n_prompt, &gen) != 0)
        return;
    snprintf(buf, sizeof buf, "{\"input_tokens\":%d}", n_prompt);
    set_json(r, 200, strdup(buf));
    if (!r->body)
        set_wire_error(r, w, 500, "out of memory");
    free(prompt);
    thaw_chat_gen_free(&gen);
    thaw_chat_request_free(&req);
}

static void route_chat_input_tokens(struct server *srv, const struct thaw_http_request *hr, const uint8_t *ns,
                                    struct thaw_http_response *r)
{
    (void)ns;
    count_input_tokens(srv, hr, r, &wire_chat);
}

static void route_responses_input_tokens(struct server *srv, const struct thaw_http_request *hr, const uint8_t *ns,
                                         struct thaw_http_response *r)
{
    (void)ns;
    count_input_tokens(srv, hr, r, &wire_responses);
}

/* ---- other routes ---------------------------------------------------------------- */

static void route_health(struct server *srv, const struct thaw_http_request *hr, const uint8_t *ns,
                         struct thaw_http_response *r)
{
    (void)srv;
    (void)hr;
    (void)ns;
    set_json(r, 200, strdup("{\"status\":\"ok\"}"));
}

static void route_models(struct server *srv, const struct thaw_http_request *hr, const uint8_t *ns,
                         struct thaw_http_response *r)
{
    struct thaw_model_meta m;

    (void)hr;
    (void)ns;
    thaw_engine_model_meta(srv->engine, &m);
    set_json(r, 200, thaw_api_models_json(thaw_engine_model_name(srv->engine), srv->cfg.tags, srv->started, &m));
}

static void route_metrics(struct server *srv, const struct thaw_http_request *hr, const uint8_t *ns,
                          struct thaw_http_response *r)
{
    (void)hr;
    (void)ns;
    r->status = 200;
    r->content_type = "text/plain; version=0.0.4";
    r->body = thaw_metrics_render(&srv->metrics, thaw_engine_metrics, srv->engine);
    if (!r->body)
        set_error(srv, r, 500, "out of memory");
}

/* The cache's counts and sizes as JSON for the page's cache view: the very
 * numbers /metrics renders (one place computes them), never text or keys. */
static void route_cache(struct server *srv, const struct thaw_http_request *hr, const uint8_t *ns,
                        struct thaw_http_response *r)
{
    char *text = thaw_metrics_render(&srv->metrics, thaw_engine_metrics, srv->engine);

    (void)hr;
    (void)ns;
    set_json(r, 200, text ? thaw_api_cache_json(text) : NULL);
    free(text);
    if (!r->body)
        set_error(srv, r, 500, "out of memory");
}

/* The chat page and its files (webui.h), public like /health: the page asks
 * for the key when the API answers 401. --no-webui: 404, as before it existed. */
static void route_webui(struct server *srv, const struct thaw_http_request *hr, const uint8_t *ns,
                        struct thaw_http_response *r)
{
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

static void route_tokenize(struct server *srv, const struct thaw_http_request *hr, const uint8_t *ns,
                           struct thaw_http_response *r)
{
    const struct thaw_chat *chat = thaw_engine_chat(srv->engine);
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

static void route_detokenize(struct server *srv, const struct thaw_http_request *hr, const uint8_t *ns,
                             struct thaw_http_response *r)
{
    const struct thaw_chat *chat = thaw_engine_chat(srv->engine);
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

static void route_apply_template(struct server *srv, const struct thaw_http_request *hr, const uint8_t *ns,
                                 struct thaw_http_response *r)
{
    struct thaw_chat_request req;
    char err[512], *prompt = NULL;
    int rc;

    (void)ns;
    if ((rc = thaw_api_parse_chat(hr->body, hr->n_body, srv->cfg.cache_prompt, &req, err, sizeof err)) != 0) {
        set_error(srv, r, rc == THAW_EINVAL ? 400 : 500, rc == THAW_EINVAL ? err : thaw_strerror(rc));
        return;
    }
    if ((rc = thaw_api_admit(&req, thaw_engine_n_ctx_slot(srv->engine), thaw_engine_max_token_bytes(srv->engine),
                             err, sizeof err)) != 0 ||
        (rc = thaw_chat_render_prompt(thaw_engine_chat(srv->engine), &req, &prompt, err, sizeof err)) != 0)
        set_error(srv, r, rc == THAW_ENOMEM ? 500 : 400, rc == THAW_ENOMEM ? thaw_strerror(rc) : err);
    else
        set_json(r, 200, thaw_api_string_json("prompt", prompt));
    free(prompt);
    thaw_chat_request_free(&req);
}

static void route_props(struct server *srv, const struct thaw_http_request *hr, const uint8_t *ns,
                        struct thaw_http_response *r)
{
    (void)hr;
    (void)ns;
    set_json(r, 200,
             thaw_api_props_json(thaw_engine_model_name(srv->engine), srv->cfg.model_path,
                                 thaw_chat_template(thaw_engine_chat(srv->engine)), srv->cfg.n_parallel,
                                 thaw_engine_n_ctx_slot(srv->engine), srv->cfg.jinja, srv->cfg.kv_cache_dir != NULL,
                                 &srv->cfg.sampling, srv->cfg.n_predict, thaw_engine_placement(srv->engine)));
}

/* GET /slots: llama-server's array, each slot's conversation (the
 * caller's own tenant's text only), phase and cache tier. --no-slots: 501
 * as llama-server answers. */
static void route_slots(struct server *srv, const struct thaw_http_request *hr, const uint8_t *ns,
                        struct thaw_http_response *r)
{
    (void)hr;
    if (!srv->cfg.slots) {
        set_error(srv, r, 501, "This server does not support slots endpoint. Start it with `--slots`");
        return;
    }
    set_json(r, 200, thaw_slots_view_json(thaw_engine_slots_view(srv->engine), thaw_engine_chat(srv->engine), ns));
    if (!r->body)
        set_error(srv, r, 500, "out of memory");
}

typedef void (*route_fn)(struct server *srv, const struct thaw_http_request *hr, const uint8_t *ns,
                         struct thaw_http_response *r);

/* Every route: its paths, its one method, whether it needs a key, and
 * whether `path` is a prefix (the page's files). */
static const struct route {
    const char *path, *alias;
    const char *method;
    route_fn fn;
    bool public, prefix;
    const struct wire *errors; /* whose error shape its errors take; NULL = OpenAI's */
} routes[] = {
    {"/health", "/v1/health", "GET", route_health, true, false, NULL},
    {"/v1/chat/completions", "/chat/completions", "POST", route_chat, false, false, NULL},
    {"/v1/messages", NULL, "POST", route_messages, false, false, &wire_messages},
    {"/v1/completions", NULL, "POST", route_completions, false, false, NULL},
    /* llama-server's own shape at both, as there; only /v1/completions is OpenAI's */
    {"/completion", "/completions", "POST", route_completion, false, false, NULL},
    {"/v1/chat/completions/input_tokens", "/chat/completions/input_tokens", "POST", route_chat_input_tokens, false,
     false, NULL},
    {"/v1/responses/input_tokens", "/responses/input_tokens", "POST", route_responses_input_tokens, false, false,
     NULL},
    {"/v1/responses", "/responses", "POST", route_responses, false, false, NULL},
    {"/v1/messages/count_tokens", NULL, "POST", route_count_tokens, false, false, &wire_messages},
    {"/v1/models", "/models", "GET", route_models, false, false, NULL},
    {"/metrics", NULL, "GET", route_metrics, false, false, NULL},
    {"/tokenize", NULL, "POST", route_tokenize, false, false, NULL},
    {"/detokenize", NULL, "POST", route_detokenize, false, false, NULL},
    {"/apply-template", NULL, "POST", route_apply_template, false, false, NULL},
    {"/props", NULL, "GET", route_props, false, false, NULL},
    {"/cache", NULL, "GET", route_cache, false, false, NULL},
    {"/slots", NULL, "GET", route_slots, false, false, NULL},
    {"/", NULL, "GET", route_webui, true, false, NULL},
    {"/webui/", NULL, "GET", route_webui, true, true, NULL},
};

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

static void handle(void *ud, const struct thaw_http_request *hr, struct thaw_http_response *r)
{
    struct server *srv = ud;
    const struct route *rt = NULL;
    uint8_t ns[THAW_KEY_BYTES];

    atomic_fetch_add(&srv->metrics.requests_total, 1);
    /* --api-prefix: the routes live under it, and nowhere else */
    const char *url = hr->url;
    size_t np = strlen(srv->cfg.api_prefix);
    if (np && strncmp(url, srv->cfg.api_prefix, np) == 0 && (url[np] == '/' || url[np] == '\0'))
        url = url[np] ? url + np : "/";
    else if (np)
        url = NULL;
    for (size_t i = 0; url && i < sizeof routes / sizeof routes[0] && !rt; i++)
        if (strcmp(url, routes[i].path) == 0 || (routes[i].alias && strcmp(url, routes[i].alias) == 0) ||
            (routes[i].prefix && strncmp(url, routes[i].path, strlen(routes[i].path)) == 0))
            rt = &routes[i];
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
        set_wire_error(r, &wire_chat, 401, wire_chat.auth_hint);
    } else if (!rt) {
        char msg[128];
        snprintf(msg, sizeof msg, "no route for %s %.80s", hr->method, hr->url);
        set_wire_error(r, errors_for(hr->url), 404, msg);
    } else if (strcmp(hr->method, rt->method) != 0) {
        char msg[96];
        snprintf(msg, sizeof msg, "use %s for %s", rt->method, rt->path);
        r->allow = rt->method;
        set_wire_error(r, rt->errors ? rt->errors : &wire_chat, 405, msg);
    } else if (!rt->public && authenticate(srv, hr, ns) != 0) {
        const struct wire *w = rt->errors ? rt->errors : &wire_chat;
        set_wire_error(r, w, 401, w->auth_hint);
    } else {
        struct thaw_http_request under = *hr; /* the path as the routes know it */
        under.url = url;
        rt->fn(srv, &under, ns, r);
    }
    if (r->status >= 400 && !r->defer)
        atomic_fetch_add(&srv->metrics.requests_errors, 1);
    if (r->defer)
        LOG_DBG("%s %s -> waiting for the engine", hr->method, hr->url);
    else
        LOG_DBG("%s %s -> %d", hr->method, hr->url, r->status);
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
    thaw_engine_stop(srv->engine); /* every waiting request now has its answer */
    if (!thaw_http_drain(srv->http, drain_ms))
        LOG_WRN("some responses were still being sent after %d ms; closing their connections", drain_ms);
    thaw_http_stop(srv->http);
    code = 0;
out_engine:
    thaw_stream_pinger_stop();
    thaw_engine_free(srv->engine);
    if (code == 0)
        LOG_INF("shut down in %.1f s", (double)(thaw_now_us() - t_stop) / 1e6);
out:
    free(srv);
    return code;
}
