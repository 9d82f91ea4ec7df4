/* stream.c — a streamed reply: following the task, SSE framing, and one
 * writer per wire format.
 *
 * Map:
 *   ---- framing ----    the pending buffer, "event:" / "data:" lines
 *   ---- OpenAI chat --- chat.completion.chunk objects, [DONE]
 *   ---- Anthropic ----  message_start, content blocks, message_delta/stop
 *   ---- the reply ----  task news -> parser deltas -> the writer
 *
 * A writer sees a stream in this order: open (once), delta (each piece of
 * the reply the template's parser tells apart: {"content"}, or
 * {"reasoning_content"}, or {"tool_call_index", "id"?, "name"?,
 * "arguments"?}), then close (the reply is complete: the task's
 * message_json, finish_reason and timings are final) or fail (the request
 * failed; status and message).
 */
#include "stream.h"

#include "api.h"
#include "api_anthropic.h"
#include "chat.h"
#include "error.h"
#include "http.h"
#include "template.h"

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

    /* Anthropic: the open content block */
    enum block block;
    int n_blocks;     /* content blocks started so far; the open one is n_blocks - 1 */
    long tool_index;  /* the parser's index of the open tool_use block */
    char *thinking;   /* the open thinking block's text (its signature covers it) */
    size_t n_thinking;
};

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
    return emit_text(st, NULL, chunk);
}

static int chat_close(struct thaw_stream *st)
{
    struct thaw_task *t = st->task;
    int rc = emit_text(st, NULL, thaw_api_chunk_json(st->id, st->model, st->created, NULL, NULL, t->finish_reason,
                                                     &t->timings, t->n_prompt, false));

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
        thaw_anthropic_signature(st->thinking ? st->thinking : "", st->n_thinking, sig);
        rc = emit(st, "content_block_delta",
                  json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_delta", "index", idx, "delta", "type",
                            "signature_delta", "signature", sig));
        free(st->thinking);
        st->thinking = NULL;
        st->n_thinking = 0;
    }
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
        char *nb = rc == 0 ? realloc(st->thinking, st->n_thinking + json_string_length(v) + 1) : NULL;
        if (rc == 0 && !nb)
            rc = THAW_ENOMEM;
        if (rc == 0) {
            memcpy(nb + st->n_thinking, json_string_value(v), json_string_length(v));
            st->n_thinking += json_string_length(v);
            nb[st->n_thinking] = '\0';
            st->thinking = nb;
            rc = msg_block_delta(st, json_pack("{s:s, s:O}", "type", "thinking_delta", "thinking", v));
        }
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
                  json_pack("{s:s, s:{s:s, s:n}, s:O}", "type", "message_delta", "delta", "stop_reason",
                            thaw_anthropic_stop_reason(t->finish_reason), "stop_sequence", "usage", usage));
    json_decref(usage);
    return rc ? rc : emit(st, "message_stop", json_pack("{s:s}", "type", "message_stop"));
}

static int msg_fail(struct thaw_stream *st, int status, const char *message)
{
    return emit_text(st, "error", thaw_anthropic_error_json(status, message));
}

static const struct writer messages_writer = {true, msg_open, msg_delta, msg_close, msg_fail};

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
    if (!nw.done && nw.n_text <= st->n_seen) {
        free(nw.text);
        return STREAM_NOTHING_YET;
    }
    st->n_seen = nw.n_text;
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

struct thaw_stream *thaw_stream_new(enum thaw_wire wire, struct thaw_task *t, const char *id, const char *model,
                                    long created)
{
    struct thaw_stream *st = calloc(1, sizeof *st);

    if (!st)
        return NULL;
    st->w = wire == THAW_WIRE_MESSAGES ? &messages_writer : &chat_writer;
    st->task = t;
    snprintf(st->id, sizeof st->id, "%s", id);
    st->model = model;
    st->created = created;
    return st;
}

void thaw_stream_free(void *ud)
{
    struct thaw_stream *st = ud;

    thaw_task_abandon(st->task);
    free(st->pending);
    free(st->prev_msg);
    free(st->thinking);
    free(st);
}
