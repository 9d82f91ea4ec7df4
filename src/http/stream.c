/* stream.c — a streamed reply: following the task, SSE framing, and one
 * writer per wire format.
 *
 * Map:
 *   ---- framing ----    the pending buffer, "event:" / "data:" lines
 *   ---- OpenAI chat --- chat.completion.chunk objects, [DONE]
 *   ---- Anthropic ----  message_start, content blocks, message_delta/stop
 *   ---- Responses ----  response.created, output items and their parts, response.completed
 *   ---- completions --  raw prompts: OpenAI's text_completion chunks, llama-server's /completion pieces
 *   ---- the reply ----  task news -> parser deltas -> the writer
 *   ---- pings ----      --sse-ping-interval: one thread wakes silent streams, which send ":"
 *
 * A writer sees a stream in this order: open (once), delta (each piece of
 * the reply the template's parser tells apart: {"content"}, or
 * {"reasoning_content"}, or {"tool_call_index", "id"?, "name"?,
 * "arguments"?}), then close (the reply is complete: the task's
 * message_json, finish_reason and timings are final) or fail (the request
 * failed; status and message).
 */
#include "http/stream.h"

#include "api/api.h"
#include "api/api_anthropic.h"
#include "api/api_completions.h"
#include "api/api_responses.h"
#include "api/chat.h"
#include "api/template.h"
#include "base/error.h"
#include "http/http.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct writer {
    /* open waits until a slot has taken the task (cache_n is known) */
    bool open_after_start;
    int (*open)(struct thaw_stream *st, const struct thaw_task_news *nw);
    int (*delta)(struct thaw_stream *st, json_t *diff);
    int (*close)(struct thaw_stream *st);
    int (*fail)(struct thaw_stream *st, int status, const char *message);
};

enum block { BLOCK_NONE, BLOCK_TEXT, BLOCK_THINKING, BLOCK_TOOL };

struct thaw_stream {
    const struct writer *w;
    struct thaw_task *task;
    char id[64];
    const char *model;
    long created;
    size_t n_seen;    /* bytes of the task's text already turned into deltas */
    char *prev_msg;   /* with a reply parser: the message as last parsed (deltas are from it) */
    char *pending;    /* framed bytes not yet handed to the socket */
    size_t n_pending, off_pending, cap_pending;
    bool opened, finished;
    int cache_n;      /* from the news that opened the stream */
    size_t n_news;    /* the task's text length at the last news turned into events */
    int n_progress;   /* the task's progress reports sent (return_progress) */

    /* the request's logprobs (logprobs.h): entries before lp_from are sent;
     * a writer takes those that go with the text as of this refill */
    size_t lp_from;
    size_t lp_text;   /* the reply's bytes handed out, as of this refill */
    size_t text_from; /* where this refill's text starts in the reply */
    bool lp_done;

    /* Anthropic's content block, or the Responses API's output item, now open */
    enum block block;
    int n_blocks;     /* blocks (items) started so far; the open one is n_blocks - 1 */
    long tool_index;  /* the parser's index of the open tool call */
    char *acc;        /* the open block's text so far (a signature, or a done event, repeats it) */
    size_t n_acc;
    char *call_id, *call_name; /* the open tool call's (Responses' done events repeat them) */
    int seq;          /* Responses: sequence_number of the next event */

    _Atomic int64_t last_out_us; /* when bytes last went to the socket (the pinger reads it) */
    struct thaw_stream *prev, *next; /* the pinger's list */
};

static void pinger_add(struct thaw_stream *st);
static void pinger_remove(struct thaw_stream *st);
static int64_t ping_us(void);

/* Appends a delta to the open block's text. */
static int acc_add(struct thaw_stream *st, json_t *s)
{
    char *nb = realloc(st->acc, st->n_acc + json_string_length(s) + 1);

    if (!nb)
        return THAW_ENOMEM;
    memcpy(nb + st->n_acc, json_string_value(s), json_string_length(s));
    st->n_acc += json_string_length(s);
    nb[st->n_acc] = '\0';
    st->acc = nb;
    return 0;
}

static void acc_reset(struct thaw_stream *st)
{
    free(st->acc);
    free(st->call_id);
    free(st->call_name);
    st->acc = st->call_id = st->call_name = NULL;
    st->n_acc = 0;
}

/* ---- framing ------------------------------------------------------------------------ */

static int pending_put(struct thaw_stream *st, const char *s, size_t n)
{
    if (st->n_pending + n + 1 > st->cap_pending) {
        size_t cap = st->cap_pending ? st->cap_pending * 2 : 1024;
        while (cap < st->n_pending + n + 1)
            cap *= 2;
        char *nb = realloc(st->pending, cap);
        if (!nb)
            return THAW_ENOMEM;
        st->pending = nb;
        st->cap_pending = cap;
    }
    memcpy(st->pending + st->n_pending, s, n);
    st->n_pending += n;
    return 0;
}

/* One SSE event: "event: <name>\n" when named, "data: <json>\n\n". Takes
 * `json` (malloc'd; NULL means ENOMEM upstream). */
static int emit_text(struct thaw_stream *st, const char *event, char *json)
{
    int rc = THAW_ENOMEM;

    if (!json)
        return THAW_ENOMEM;
    if (event && ((rc = pending_put(st, "event: ", 7)) != 0 || (rc = pending_put(st, event, strlen(event))) != 0 ||
                  (rc = pending_put(st, "\n", 1)) != 0))
        goto out;
    if ((rc = pending_put(st, "data: ", 6)) == 0 && (rc = pending_put(st, json, strlen(json))) == 0)
        rc = pending_put(st, "\n\n", 2);
out:
    free(json);
    return rc;
}

/* The same with a JSON value (taken: decref'd here). */
static int emit(struct thaw_stream *st, const char *event, json_t *v)
{
    char *s = v ? json_dumps(v, JSON_COMPACT) : NULL;

    json_decref(v);
    return emit_text(st, event, s);
}

/* ---- probabilities --------------------------------------------------------------------- */

/* The entries that go with the text so far and are not yet sent (marked
 * sent): llama-server's array, or with `legacy` OpenAI completions'
 * object. NULL on ENOMEM. */
static json_t *lp_take(struct thaw_stream *st, bool legacy)
{
    size_t to;
    json_t *v = thaw_task_logprobs(st->task, st->lp_from, st->lp_text, st->lp_done, legacy, &to);

    if (v)
        st->lp_from = to;
    return v;
}

/* Sets choices[0].logprobs of the chunk `chunk` (JSON text, taken) to the
 * entries not yet sent: {"content": [...]} (chat) or the legacy object;
 * the chunk as it was when the request wants none. */
static char *lp_attach(struct thaw_stream *st, char *chunk, bool legacy)
{
    if (!chunk || !st->task->req.logprobs)
        return chunk;
    json_t *root = json_loads(chunk, 0, NULL), *choice = json_array_get(json_object_get(root, "choices"), 0);
    json_t *lp = choice ? lp_take(st, legacy) : NULL;
    char *out = NULL;

    if (lp)
        json_object_set_new(choice, "logprobs", legacy ? lp : json_pack("{s:o}", "content", lp));
    out = lp ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    free(chunk);
    return out;
}

/* ---- OpenAI chat ---------------------------------------------------------------------- */

static int chat_open(struct thaw_stream *st, const struct thaw_task_news *nw)
{
    (void)nw;
    return emit_text(st, NULL, thaw_api_chunk_json(st->id, st->model, st->created, "assistant", "", NULL, NULL, 0, false));
}

static int chat_delta(struct thaw_stream *st, json_t *diff)
{
    char *ds = json_dumps(diff, JSON_COMPACT);
    char *chunk = ds ? thaw_api_chunk_delta_json(st->id, st->model, st->created, ds) : NULL;

    free(ds);
    return emit_text(st, NULL, lp_attach(st, chunk, false));
}

static int chat_close(struct thaw_stream *st)
{
    struct thaw_task *t = st->task;
    /* entries of text no delta carried (a parser that held it to the end) */
    char *last = thaw_api_chunk_json(st->id, st->model, st->created, NULL, NULL, t->finish_reason, &t->timings,
                                     t->n_prompt, false);
    size_t to;
    json_decref(t->req.logprobs ? thaw_task_logprobs(t, st->lp_from, st->lp_text, true, false, &to) : NULL);
    int rc = emit_text(st, NULL, t->req.logprobs && to > st->lp_from ? lp_attach(st, last, false) : last);

    if (rc == 0 && t->req.include_usage)
        rc = emit_text(st, NULL, thaw_api_chunk_json(st->id, st->model, st->created, NULL, NULL, NULL, &t->timings,
                                                     t->n_prompt, true));
    if (rc == 0)
        rc = pending_put(st, "data: [DONE]\n\n", 14);
    return rc;
}

static int chat_fail(struct thaw_stream *st, int status, const char *message)
{
    return emit_text(st, NULL, thaw_api_error_json(status, message));
}

static const struct writer chat_writer = {false, chat_open, chat_delta, chat_close, chat_fail};

/* ---- Anthropic ------------------------------------------------------------------------- */

static json_t *loads(char *text)
{
    json_error_t jerr;
    json_t *v = text ? json_loads(text, 0, &jerr) : NULL;

    free(text);
    return v;
}

static int msg_open(struct thaw_stream *st, const struct thaw_task_news *nw)
{
    struct thaw_task *t = st->task;
    json_t *usage = loads(thaw_anthropic_usage_json(t->n_prompt, nw->cache_n, 0));
    int rc;

    st->cache_n = nw->cache_n;
    st->tool_index = -1;
    if (!usage)
        return THAW_ENOMEM;
    rc = emit(st, "message_start",
              json_pack("{s:s, s:{s:s, s:s, s:s, s:[], s:s, s:n, s:n, s:o}}", "type", "message_start", "message", "id",
                        st->id, "type", "message", "role", "assistant", "content", "model", st->model, "stop_reason",
                        "stop_sequence", "usage", usage));
    return rc ? rc : emit(st, "ping", json_pack("{s:s}", "type", "ping"));
}

/* Ends the open content block (a thinking block gets its signature first). */
static int msg_block_stop(struct thaw_stream *st)
{
    int idx = st->n_blocks - 1, rc = 0;

    if (st->block == BLOCK_NONE)
        return 0;
    if (st->block == BLOCK_THINKING) {
        char sig[THAW_ANTHROPIC_SIGNATURE_LEN];
        thaw_anthropic_signature(st->acc ? st->acc : "", st->n_acc, sig);
        rc = emit(st, "content_block_delta",
                  json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_delta", "index", idx, "delta", "type",
                            "signature_delta", "signature", sig));
    }
    acc_reset(st);
    st->block = BLOCK_NONE;
    return rc ? rc : emit(st, "content_block_stop", json_pack("{s:s, s:i}", "type", "content_block_stop", "index", idx));
}

/* Makes `kind` the open block: the open one of another kind (or another
 * tool call) is stopped and a new one started with `start` (taken). */
static int msg_block_start(struct thaw_stream *st, enum block kind, json_t *start)
{
    int rc = msg_block_stop(st);

    if (rc != 0) {
        json_decref(start);
        return rc;
    }
    st->block = kind;
    return emit(st, "content_block_start", json_pack("{s:s, s:i, s:o}", "type", "content_block_start", "index",
                                                     st->n_blocks++, "content_block", start));
}

static int msg_block_delta(struct thaw_stream *st, json_t *delta)
{
    return emit(st, "content_block_delta", json_pack("{s:s, s:i, s:o}", "type", "content_block_delta", "index",
                                                     st->n_blocks - 1, "delta", delta));
}

static int msg_delta(struct thaw_stream *st, json_t *diff)
{
    json_t *v;
    int rc = 0;

    if ((v = json_object_get(diff, "reasoning_content")) && json_string_length(v) > 0) {
        if (st->block != BLOCK_THINKING)
            rc = msg_block_start(st, BLOCK_THINKING,
                                 json_pack("{s:s, s:s, s:s}", "type", "thinking", "thinking", "", "signature", ""));
        if (rc == 0 && (rc = acc_add(st, v)) == 0)
            rc = msg_block_delta(st, json_pack("{s:s, s:O}", "type", "thinking_delta", "thinking", v));
    }
    if (rc == 0 && (v = json_object_get(diff, "content")) && json_string_length(v) > 0) {
        if (st->block != BLOCK_TEXT)
            rc = msg_block_start(st, BLOCK_TEXT, json_pack("{s:s, s:s}", "type", "text", "text", ""));
        if (rc == 0)
            rc = msg_block_delta(st, json_pack("{s:s, s:O}", "type", "text_delta", "text", v));
    }
    if (rc == 0 && (v = json_object_get(diff, "tool_call_index"))) {
        long index = (long)json_integer_value(v);
        json_t *id = json_object_get(diff, "id"), *name = json_object_get(diff, "name");
        json_t *args = json_object_get(diff, "arguments");
        if (st->block != BLOCK_TOOL || st->tool_index != index) {
            rc = msg_block_start(st, BLOCK_TOOL,
                                 json_pack("{s:s, s:s, s:s, s:{}}", "type", "tool_use", "id",
                                           json_is_string(id) ? json_string_value(id) : "", "name",
                                           json_is_string(name) ? json_string_value(name) : "", "input"));
            st->tool_index = index;
        }
        if (rc == 0 && json_string_length(args) > 0)
            rc = msg_block_delta(st, json_pack("{s:s, s:O}", "type", "input_json_delta", "partial_json", args));
    }
    return rc;
}

static int msg_close(struct thaw_stream *st)
{
    struct thaw_task *t = st->task;
    json_t *usage = loads(thaw_anthropic_usage_json(t->n_prompt, t->timings.cache_n, t->timings.predicted_n));
    int rc = msg_block_stop(st);

    if (!usage)
        return THAW_ENOMEM;
    if (rc == 0)
        rc = emit(st, "message_delta",
                  json_pack("{s:s, s:{s:s, s:o}, s:O}", "type", "message_delta", "delta", "stop_reason",
                            thaw_anthropic_stop_reason(t->finish_reason, t->stop_sequence), "stop_sequence",
                            t->stop_sequence ? json_string(t->stop_sequence) : json_null(), "usage", usage));
    json_decref(usage);
    return rc ? rc : emit(st, "message_stop", json_pack("{s:s}", "type", "message_stop"));
}

static int msg_fail(struct thaw_stream *st, int status, const char *message)
{
    return emit_text(st, "error", thaw_anthropic_error_json(status, message));
}

static const struct writer messages_writer = {true, msg_open, msg_delta, msg_close, msg_fail};

/* ---- OpenAI Responses ------------------------------------------------------------------ */

/* One event: its type is both the event: line and data.type, and every
 * event carries the stream's sequence_number. Takes `v`. */
static int r_emit(struct thaw_stream *st, const char *type, json_t *v)
{
    if (!v)
        return THAW_ENOMEM;
    json_object_set_new(v, "type", json_string(type));
    json_object_set_new(v, "sequence_number", json_integer(st->seq++));
    return emit(st, type, v);
}

/* The response object (in progress when message_json is NULL). */
static json_t *r_response(struct thaw_stream *st, const char *message_json)
{
    struct thaw_task *t = st->task;

    return loads(thaw_responses_json(st->id, st->model, st->created, message_json, t->finish_reason, t->n_prompt,
                                     &t->timings));
}

static int resp_open(struct thaw_stream *st, const struct thaw_task_news *nw)
{
    json_t *r = r_response(st, NULL);
    int rc;

    (void)nw;
    st->tool_index = -1;
    if (!r)
        return THAW_ENOMEM;
    rc = r_emit(st, "response.created", json_pack("{s:O}", "response", r));
    if (rc == 0)
        rc = r_emit(st, "response.in_progress", json_pack("{s:O}", "response", r));
    json_decref(r);
    return rc;
}

static void r_item_id(struct thaw_stream *st, char out[64])
{
    static const char *const kind[] = {"", "msg", "rs", "fc"};

    thaw_responses_item_id(st->id, kind[st->block], st->n_blocks - 1, out);
}

/* The open item, complete: as output_item.done and the final response name it. */
static json_t *r_item_done(struct thaw_stream *st)
{
    const char *text = st->acc ? st->acc : "";
    char id[64];

    r_item_id(st, id);
    if (st->block == BLOCK_THINKING)
        return json_pack("{s:s, s:s, s:[], s:[{s:s, s:s}]}", "type", "reasoning", "id", id, "summary", "content",
                         "type", "reasoning_text", "text", text);
    if (st->block == BLOCK_TEXT)
        return json_pack("{s:s, s:s, s:s, s:s, s:[{s:s, s:s, s:[]}]}", "type", "message", "id", id, "status",
                         "completed", "role", "assistant", "content", "type", "output_text", "text", text,
                         "annotations");
    return json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "type", "function_call", "id", id, "call_id",
                     st->call_id ? st->call_id : "", "name", st->call_name ? st->call_name : "", "arguments", text,
                     "status", "completed");
}

static int resp_item_stop(struct thaw_stream *st)
{
    int idx = st->n_blocks - 1, rc = 0;
    const char *text = st->acc ? st->acc : "";
    char id[64];

    if (st->block == BLOCK_NONE)
        return 0;
    r_item_id(st, id);
    if (st->block == BLOCK_THINKING) {
        rc = r_emit(st, "response.reasoning_text.done",
                    json_pack("{s:s, s:i, s:i, s:s}", "item_id", id, "output_index", idx, "content_index", 0, "text",
                              text));
    } else if (st->block == BLOCK_TEXT) {
        rc = r_emit(st, "response.output_text.done",
                    json_pack("{s:s, s:i, s:i, s:s, s:[]}", "item_id", id, "output_index", idx, "content_index", 0,
                              "text", text, "logprobs"));
        if (rc == 0)
            rc = r_emit(st, "response.content_part.done",
                        json_pack("{s:s, s:i, s:i, s:{s:s, s:s, s:[]}}", "item_id", id, "output_index", idx,
                                  "content_index", 0, "part", "type", "output_text", "text", text, "annotations"));
    } else {
        rc = r_emit(st, "response.function_call_arguments.done",
                    json_pack("{s:s, s:i, s:s, s:s}", "item_id", id, "output_index", idx, "arguments", text, "name",
                              st->call_name ? st->call_name : ""));
    }
    if (rc == 0)
        rc = r_emit(st, "response.output_item.done", json_pack("{s:i, s:o}", "output_index", idx, "item",
                                                              r_item_done(st)));
    st->block = BLOCK_NONE;
    acc_reset(st);
    return rc;
}

/* Makes `kind` the open item, announcing it (and a message's text part). */
static int resp_item_start(struct thaw_stream *st, enum block kind, const char *call_id, const char *name)
{
    int rc = resp_item_stop(st), idx;
    char id[64];
    json_t *item;

    if (rc != 0)
        return rc;
    st->block = kind;
    idx = st->n_blocks++;
    r_item_id(st, id);
    if (kind == BLOCK_TOOL && (!(st->call_id = strdup(call_id)) || !(st->call_name = strdup(name))))
        return THAW_ENOMEM;
    if (kind == BLOCK_THINKING)
        item = json_pack("{s:s, s:s, s:[], s:[]}", "type", "reasoning", "id", id, "summary", "content");
    else if (kind == BLOCK_TEXT)
        item = json_pack("{s:s, s:s, s:s, s:s, s:[]}", "type", "message", "id", id, "status", "in_progress", "role",
                         "assistant", "content");
    else
        item = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "type", "function_call", "id", id, "call_id", call_id,
                         "name", name, "arguments", "", "status", "in_progress");
    rc = r_emit(st, "response.output_item.added", json_pack("{s:i, s:o}", "output_index", idx, "item", item));
    if (rc == 0 && kind == BLOCK_TEXT)
        rc = r_emit(st, "response.content_part.added",
                    json_pack("{s:s, s:i, s:i, s:{s:s, s:s, s:[]}}", "item_id", id, "output_index", idx,
                              "content_index", 0, "part", "type", "output_text", "text", "", "annotations"));
    return rc;
}

static int resp_delta(struct thaw_stream *st, json_t *diff)
{
    json_t *v;
    char id[64];
    int rc = 0;

    if ((v = json_object_get(diff, "reasoning_content")) && json_string_length(v) > 0) {
        if (st->block != BLOCK_THINKING)
            rc = resp_item_start(st, BLOCK_THINKING, NULL, NULL);
        if (rc == 0 && (rc = acc_add(st, v)) == 0) {
            r_item_id(st, id);
            rc = r_emit(st, "response.reasoning_text.delta",
                        json_pack("{s:s, s:i, s:i, s:O}", "item_id", id, "output_index", st->n_blocks - 1,
                                  "content_index", 0, "delta", v));
        }
    }
    if (rc == 0 && (v = json_object_get(diff, "content")) && json_string_length(v) > 0) {
        if (st->block != BLOCK_TEXT)
            rc = resp_item_start(st, BLOCK_TEXT, NULL, NULL);
        if (rc == 0 && (rc = acc_add(st, v)) == 0) {
            r_item_id(st, id);
            rc = r_emit(st, "response.output_text.delta",
                        json_pack("{s:s, s:i, s:i, s:O, s:[]}", "item_id", id, "output_index", st->n_blocks - 1,
                                  "content_index", 0, "delta", v, "logprobs"));
        }
    }
    if (rc == 0 && (v = json_object_get(diff, "tool_call_index"))) {
        long index = (long)json_integer_value(v);
        json_t *cid = json_object_get(diff, "id"), *name = json_object_get(diff, "name");
        json_t *args = json_object_get(diff, "arguments");
        if (st->block != BLOCK_TOOL || st->tool_index != index) {
            rc = resp_item_start(st, BLOCK_TOOL, json_is_string(cid) ? json_string_value(cid) : "",
                                 json_is_string(name) ? json_string_value(name) : "");
            st->tool_index = index;
        }
        if (rc == 0 && json_string_length(args) > 0 && (rc = acc_add(st, args)) == 0) {
            r_item_id(st, id);
            rc = r_emit(st, "response.function_call_arguments.delta",
                        json_pack("{s:s, s:i, s:O}", "item_id", id, "output_index", st->n_blocks - 1, "delta", args));
        }
    }
    return rc;
}

static int resp_close(struct thaw_stream *st)
{
    int rc = resp_item_stop(st);
    json_t *r = rc == 0 ? r_response(st, st->task->message_json ? st->task->message_json : "{}") : NULL;

    if (rc != 0)
        return rc;
    /* response.completed also for a reply cut at max_output_tokens (its
     * status says "incomplete"): what Codex and the SDKs wait for */
    return r ? r_emit(st, "response.completed", json_pack("{s:o}", "response", r)) : THAW_ENOMEM;
}

static int resp_fail(struct thaw_stream *st, int status, const char *message)
{
    char code[16];

    snprintf(code, sizeof code, "%d", status);
    return r_emit(st, "error", json_pack("{s:s, s:s, s:n}", "code", code, "message", message, "param"));
}

static const struct writer responses_writer = {false, resp_open, resp_delta, resp_close, resp_fail};

/* ---- the reply ------------------------------------------------------------------------- */

/* Hands the deltas from the last parsed message to `msg` to the writer.
 * A partial text that does not parse yet waits for more. */
static int deltas(struct thaw_stream *st, const char *msg)
{
    char *diffs = NULL, err[256];
    json_t *arr = NULL, *d;
    json_error_t jerr;
    size_t i;
    int rc = 0;

    if (!(diffs = thaw_tmpl_diffs(st->prev_msg, msg, err, sizeof err)))
        return 0; /* nothing sendable yet */
    if (!(arr = json_loads(diffs, 0, &jerr)) || !json_is_array(arr)) {
        rc = THAW_ENOMEM;
        goto out;
    }
    json_array_foreach(arr, i, d)
        if (rc == 0)
            rc = st->w->delta(st, d);
    if (rc == 0) {
        char *copy = strdup(msg);
        if (!copy) {
            rc = THAW_ENOMEM;
            goto out;
        }
        free(st->prev_msg);
        st->prev_msg = copy;
    }
out:
    json_decref(arr);
    free(diffs);
    return rc;
}

/* ---- completions ------------------------------------------------------------------- */

static int cmpl_open(struct thaw_stream *st, const struct thaw_task_news *nw)
{
    (void)st;
    (void)nw;
    return 0; /* the first text is the first chunk */
}

static const char *diff_text(json_t *diff)
{
    const char *s = json_string_value(json_object_get(diff, "content"));
    return s ? s : "";
}

static int oai_cmpl_delta(struct thaw_stream *st, json_t *diff)
{
    return emit_text(st, NULL,
                     lp_attach(st,
                               thaw_api_text_completion_chunk_json(st->id, st->model, st->created, diff_text(diff),
                                                                   NULL, 0, NULL),
                               true));
}

static int oai_cmpl_close(struct thaw_stream *st)
{
    struct thaw_task *t = st->task;
    int rc = emit_text(st, NULL,
                       lp_attach(st,
                                 thaw_api_text_completion_chunk_json(st->id, st->model, st->created, "",
                                                                     t->finish_reason, t->n_prompt, &t->timings),
                                 true));

    return rc ? rc : pending_put(st, "data: [DONE]\n\n", 14);
}

/* One /completion piece; with `probs` (taken) its completion_probabilities. */
static int llama_cmpl_piece(struct thaw_stream *st, const char *text, json_t *probs)
{
    char *chunk = thaw_api_llama_completion_json(st->model, text, false, NULL, NULL, 0, NULL);
    json_t *root = chunk && probs ? json_loads(chunk, 0, NULL) : NULL;

    if (root) {
        json_object_set(root, "completion_probabilities", probs);
        free(chunk);
        chunk = json_dumps(root, JSON_COMPACT);
    } else if (probs) {
        free(chunk);
        chunk = NULL;
    }
    json_decref(root);
    json_decref(probs);
    return emit_text(st, NULL, chunk);
}

/* With n_probs, llama-server sends one piece per token, each with that
 * token's entry: the text is cut at the entries' ends, read from the
 * reply's bytes (a piece may end inside a character; what follows the last
 * entry waits for its token, unless the reply is done). */
static int llama_cmpl_delta(struct thaw_stream *st, json_t *diff)
{
    size_t off = st->text_from, n_text = st->lp_text;
    uint32_t start, end;
    int rc = 0;

    if (!st->task->req.logprobs)
        return llama_cmpl_piece(st, diff_text(diff), NULL);
    while (rc == 0 && thaw_task_logprob_span(st->task, st->lp_from, &start, &end) &&
           (end <= n_text || (st->lp_done && start < n_text))) {
        size_t cut = end < n_text ? end : n_text;
        if (cut < off)
            cut = off;
        char *piece = thaw_task_text(st->task, off, cut);
        size_t to;
        json_t *probs = piece ? thaw_task_logprobs(st->task, st->lp_from, SIZE_MAX, true, false, &to) : NULL;
        while (probs && json_array_size(probs) > 1) /* this entry only */
            json_array_remove(probs, json_array_size(probs) - 1);
        rc = probs ? llama_cmpl_piece(st, piece, probs) : THAW_ENOMEM;
        free(piece);
        st->lp_from++;
        off = cut;
    }
    if (rc == 0 && off < n_text && st->lp_done) { /* text no token of its own stands for */
        char *piece = thaw_task_text(st->task, off, n_text);
        rc = piece ? llama_cmpl_piece(st, piece, NULL) : THAW_ENOMEM;
        free(piece);
        off = n_text;
    }
    st->n_seen = off; /* the rest comes again with the next news */
    return rc;
}

static int llama_cmpl_close(struct thaw_stream *st)
{
    struct thaw_task *t = st->task;

    return emit_text(st, NULL, thaw_api_llama_completion_json(st->model, "", true, t->finish_reason,
                                                              t->stop_sequence, t->n_prompt, &t->timings));
}

static const struct writer oai_cmpl_writer = {false, cmpl_open, oai_cmpl_delta, oai_cmpl_close, chat_fail};
static const struct writer llama_cmpl_writer = {false, cmpl_open, llama_cmpl_delta, llama_cmpl_close, chat_fail};

/* llama-server's prompt_progress chunk (return_progress): in the chat
 * stream a role delta, in a completions stream an empty piece, each with
 * {total, cache, processed, time_ms}; the other wires send none. */
static int progress_chunk(struct thaw_stream *st, const struct thaw_task_progress *p, int cache_n)
{
    struct thaw_task *t = st->task;
    char *chunk = NULL;

    if (st->w == &chat_writer)
        chunk = thaw_api_chunk_json(st->id, st->model, st->created, "assistant", NULL, NULL, NULL, 0, false);
    else if (st->w == &oai_cmpl_writer)
        chunk = thaw_api_text_completion_chunk_json(st->id, st->model, st->created, "", NULL, 0, NULL);
    else if (st->w == &llama_cmpl_writer)
        chunk = thaw_api_llama_completion_json(st->model, "", false, NULL, NULL, 0, NULL);
    else
        return 0;
    json_t *root = chunk ? json_loads(chunk, 0, NULL) : NULL;
    free(chunk);
    if (!root)
        return THAW_ENOMEM;
    if (st->w == &chat_writer) /* llama-server's role delta says content null */
        json_object_set_new(json_object_get(json_array_get(json_object_get(root, "choices"), 0), "delta"), "content",
                            json_null());
    json_object_set_new(root, "prompt_progress",
                        json_pack("{s:i, s:i, s:i, s:I}", "total", t->n_prompt, "cache", cache_n, "processed",
                                  p->processed, "time_ms", (json_int_t)p->time_ms));
    return emit(st, NULL, root);
}

/* Produces the next events. Returns 0, STREAM_NOTHING_YET (the engine has
 * no news: wait for its wake) or THAW_ENOMEM. Never blocks. */
#define STREAM_NOTHING_YET 1

static int refill(struct thaw_stream *st)
{
    struct thaw_task *t = st->task;
    const char *parser = t->gen.parser;
    struct thaw_task_news nw;
    int rc;

    if (!st->opened) {
        if ((rc = thaw_task_news(t, SIZE_MAX, &nw)) != 0)
            return rc;
        if (st->w->open_after_start && !nw.started)
            return STREAM_NOTHING_YET;
        st->opened = true;
        return st->w->open(st, &nw);
    }
    if ((rc = thaw_task_news(t, parser ? 0 : st->n_seen, &nw)) != 0)
        return rc;
    if (st->n_progress < nw.n_progress) { /* prefill batches come before any text */
        struct thaw_task_progress p;
        while (rc == 0 && st->n_progress < nw.n_progress && thaw_task_progress_at(t, st->n_progress, &p)) {
            rc = progress_chunk(st, &p, nw.cache_n);
            st->n_progress++;
        }
        if (rc != 0 || (!nw.done && nw.n_text <= st->n_news)) {
            free(nw.text);
            return rc;
        }
    }
    if (!nw.done && nw.n_text <= st->n_news) {
        free(nw.text);
        return STREAM_NOTHING_YET;
    }
    st->n_news = nw.n_text;
    st->text_from = st->n_seen;
    st->n_seen = nw.n_text; /* a writer may keep some back (llama_cmpl_delta) */
    st->lp_text = nw.n_text;
    st->lp_done = nw.done;
    if (parser) {
        /* content, reasoning and tool calls: parse what exists so far and
         * send what changed (the final parse is the engine's) */
        char *msg = NULL, err[256];
        if (nw.done)
            msg = t->message_json ? strdup(t->message_json) : NULL;
        else if (nw.text)
            (void)thaw_chat_parse_reply(parser, nw.text, true, t->id_prefix, &msg, NULL, err, sizeof err);
        rc = msg ? deltas(st, msg) : 0;
        free(msg);
    } else if (nw.text) {
        json_t *diff = json_pack("{s:s}", "content", nw.text);
        rc = diff ? st->w->delta(st, diff) : THAW_ENOMEM;
        json_decref(diff);
    }
    free(nw.text);
    if (rc != 0 || !nw.done)
        return rc;
    st->finished = true;
    if (t->http_status != 200)
        return st->w->fail(st, t->http_status, t->error ? t->error : "error");
    return st->w->close(st);
}

ssize_t thaw_stream_read(void *ud, char *buf, size_t max)
{
    struct thaw_stream *st = ud;

    while (st->off_pending == st->n_pending) {
        st->n_pending = st->off_pending = 0;
        if (st->finished)
            return 0;
        int rc = refill(st);
        if (rc == STREAM_NOTHING_YET && ping_us() > 0 && thaw_now_us() - atomic_load(&st->last_out_us) >= ping_us())
            rc = pending_put(st, ":\n\n", 3); /* an SSE comment: every client skips it */
        else if (rc == STREAM_NOTHING_YET)
            return THAW_HTTP_STREAM_WAIT;
        if (rc != 0)
            return -1;
    }
    size_t n = st->n_pending - st->off_pending;
    if (n > max)
        n = max;
    memcpy(buf, st->pending + st->off_pending, n);
    st->off_pending += n;
    atomic_store(&st->last_out_us, thaw_now_us());
    return (ssize_t)n;
}

struct thaw_stream *thaw_stream_new(enum thaw_wire wire, struct thaw_task *t, const char *id, const char *model,
                                    long created)
{
    struct thaw_stream *st = calloc(1, sizeof *st);

    if (!st)
        return NULL;
    st->w = wire == THAW_WIRE_MESSAGES ? &messages_writer : wire == THAW_WIRE_RESPONSES ? &responses_writer
                                                                                        : &chat_writer;
    if (wire == THAW_WIRE_COMPLETIONS || wire == THAW_WIRE_COMPLETION)
        st->w = wire == THAW_WIRE_COMPLETIONS ? &oai_cmpl_writer : &llama_cmpl_writer;
    st->task = t;
    snprintf(st->id, sizeof st->id, "%s", id);
    st->model = model;
    st->created = created;
    atomic_store(&st->last_out_us, thaw_now_us());
    pinger_add(st);
    return st;
}

void thaw_stream_free(void *ud)
{
    struct thaw_stream *st = ud;

    pinger_remove(st);
    thaw_task_abandon(st->task);
    free(st->pending);
    free(st->prev_msg);
    acc_reset(st);
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
