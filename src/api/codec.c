/* codec.c — what every codec's stream and reply share (codec.h): the step
 * that turns the engine's news into a writer's calls, and the helpers the
 * writers and replies are built from.
 *
 * Map:
 *   ---- the step ----     news -> open, progress, the parser's deltas, close or fail
 *   ---- events ----       a writer's events handed to the transport's framing
 *   ---- probabilities --  the entries that go with the text handed out
 *   ---- the open part --  the text of an Anthropic block or a Responses item so far
 *   ---- replies ----      llama-server's __verbose, 'n' choices merged, OpenAI's too-long error
 */
#include "api/codec.h"

#include "api/api_completions.h"
#include "api/api_wire.h"
#include "api/chat.h"
#include "api/template.h"
#include "base/error.h"
#include "base/utf8.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the step ------------------------------------------------------------------------ */

size_t thaw_codec_stream_from(const struct thaw_codec_stream *st)
{
    if (!st->opened)
        return SIZE_MAX;
    return st->parser ? 0 : st->n_seen;
}

/* Whether a parsed message carries nothing: no content, reasoning or
 * tool call. */
static bool msg_empty(const char *msg)
{
    json_t *m = json_loads(msg, 0, NULL), *c;
    bool empty = json_is_object(m) && (!(c = json_object_get(m, "content")) || json_is_null(c) ||
                                       (json_is_string(c) && json_string_length(c) == 0)) &&
                 !json_object_get(m, "reasoning_content") && json_array_size(json_object_get(m, "tool_calls")) == 0;

    json_decref(m);
    return empty;
}

/* Hands the deltas from the last parsed message to `msg` to the writer.
 * A partial text that does not parse yet waits for more, and so does one
 * that parses as nothing at all (as llama-server's stream): a parser that
 * reads the start of a tool call in what was content so far ("{" for
 * Llama 3.x) gives an empty message until it knows, and a diff against
 * that would send the whole content again at the end. */
static int deltas(struct thaw_codec_stream *st, const char *msg, bool final)
{
    char *diffs = NULL, err[256];
    json_t *arr = NULL, *d;
    json_error_t jerr;
    size_t i;
    int rc = 0;

    if (!final && msg_empty(msg))
        return 0;
    if (!(diffs = thaw_tmpl_diffs(st->prev_msg, msg, err, sizeof err)))
        return 0; /* nothing sendable yet */
    if (!(arr = json_loads(diffs, 0, &jerr)) || !json_is_array(arr)) {
        rc = THAW_ENOMEM;
        goto out;
    }
    json_array_foreach(arr, i, d)
        if (rc == 0)
            rc = st->codec->delta(st, d);
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

int thaw_codec_stream_step(struct thaw_codec_stream *st, const struct thaw_codec_news *nw)
{
    const struct thaw_codec *c = st->codec;
    int rc = 0;

    if (!st->opened) {
        if (c->open_after_start && !nw->started)
            return THAW_CODEC_WAIT;
        st->opened = true;
        st->cache_n = nw->cache_n;
        st->cache_new_n = nw->cache_new_n;
        st->tool_index = -1;
        return c->open(st);
    }
    if (st->n_progress < nw->n_progress) { /* prefill batches come before any text */
        int processed;
        int64_t us;
        st->live.cache_source = nw->live.cache_source; /* the reports' timings tell it too */
        while (rc == 0 && st->n_progress < nw->n_progress &&
               st->rd->progress(st->rd->ud, st->n_progress, &processed, &us)) {
            rc = c->progress ? c->progress(st, processed, us, nw->cache_n) : 0;
            st->n_progress++;
        }
        if (rc != 0 || (!nw->done && nw->n_text <= st->n_news))
            return rc;
    }
    if (!nw->done && nw->n_text <= st->n_news)
        return THAW_CODEC_WAIT;
    st->n_news = nw->n_text;
    st->live = nw->live;
    st->text_from = st->n_seen;
    st->n_seen = nw->n_text; /* a writer may keep some back */
    st->n_text = nw->n_text;
    st->done = nw->done;
    if (st->parser) {
        /* content, reasoning and tool calls: parse what exists so far and
         * send what changed (the final parse is the engine's) */
        char *msg = NULL, err[256];
        if (nw->done)
            msg = nw->reply && nw->reply->message_json ? strdup(nw->reply->message_json) : NULL;
        else if (nw->text)
            (void)thaw_chat_parse_reply(st->parser, nw->text, true, st->call_prefix, &msg, NULL, err, sizeof err);
        rc = msg ? deltas(st, msg, nw->done) : 0;
        free(msg);
    } else if (nw->text) {
        json_t *diff = json_pack("{s:s}", "content", nw->text);
        rc = diff ? c->delta(st, diff) : THAW_ENOMEM;
        json_decref(diff);
    }
    if (rc != 0 || !nw->done)
        return rc;
    st->finished = true;
    if (nw->status != 200 || !nw->reply)
        return c->fail(st, nw->status, nw->error ? nw->error : "error");
    st->reply = nw->reply;
    return c->close(st);
}

void thaw_codec_stream_free(struct thaw_codec_stream *st)
{
    free(st->prev_msg);
    st->prev_msg = NULL;
    thaw_codec_part_reset(st);
}

/* ---- events ------------------------------------------------------------------------ */

int thaw_codec_emit_text(struct thaw_codec_stream *st, const char *event, char *json)
{
    int rc;

    if (!json)
        return THAW_ENOMEM;
    rc = st->put(st->sink, event, json);
    free(json);
    return rc;
}

int thaw_codec_emit(struct thaw_codec_stream *st, const char *event, json_t *v)
{
    char *s = v ? json_dumps(v, JSON_COMPACT) : NULL;

    json_decref(v);
    return thaw_codec_emit_text(st, event, s);
}

int thaw_codec_emit_progress(struct thaw_codec_stream *st, const char *event, json_t *chunk, int processed,
                             int64_t time_us, int cache_n)
{
    if (!chunk)
        return THAW_ENOMEM;
    json_object_set_new(chunk, "prompt_progress",
                        json_pack("{s:i, s:i, s:i, s:I}", "total", st->n_prompt, "cache", cache_n, "processed",
                                  processed, "time_ms", (json_int_t)(time_us / 1000)));
    if (st->req->timings_per_token) {
        /* the prefill so far, as llama-server's: the first report comes
         * before any prompt token is decoded (a restore, if any, is done:
         * its time is no prefill's) */
        if (st->n_progress == 0)
            st->progress_t0_us = time_us;
        struct thaw_timings t = {.cache_n = cache_n,
                                 .prompt_n = processed > cache_n ? processed - cache_n : 0,
                                 .prompt_ms = (double)(time_us - st->progress_t0_us) / 1000.0,
                                 .cache_source = st->live.cache_source};
        if (thaw_api_set_timings(chunk, &t) != 0) {
            json_decref(chunk);
            return THAW_ENOMEM;
        }
    }
    return thaw_codec_emit(st, event, chunk);
}

json_t *thaw_codec_loads(char *text)
{
    json_error_t jerr;
    json_t *v = text ? json_loads(text, 0, &jerr) : NULL;

    free(text);
    return v;
}

/* ---- probabilities ------------------------------------------------------------------- */

json_t *thaw_codec_lp_take(struct thaw_codec_stream *st, bool legacy)
{
    size_t to;
    json_t *v = st->rd->logprobs(st->rd->ud, st->lp_from, st->n_text, st->done, legacy, &to);

    if (v)
        st->lp_from = to;
    return v;
}

char *thaw_codec_lp_attach(struct thaw_codec_stream *st, char *chunk, bool legacy)
{
    if (!chunk || !st->req->logprobs)
        return chunk;
    json_t *root = json_loads(chunk, 0, NULL), *choice = json_array_get(json_object_get(root, "choices"), 0);
    json_t *lp = choice ? thaw_codec_lp_take(st, legacy) : NULL;
    char *out = NULL;

    if (lp)
        json_object_set_new(choice, "logprobs", legacy ? lp : json_pack("{s:o}", "content", lp));
    out = lp ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    free(chunk);
    return out;
}

void thaw_codec_live_timings(const struct thaw_codec_stream *st, json_t *o)
{
    if (st->req->timings_per_token)
        (void)thaw_api_set_timings(o, &st->live);
}

char *thaw_codec_timings_attach(const struct thaw_codec_stream *st, char *chunk)
{
    if (!chunk || !st->req->timings_per_token)
        return chunk;
    json_t *root = json_loads(chunk, 0, NULL);
    char *out = NULL;

    if (json_is_object(root) && thaw_api_set_timings(root, &st->live) == 0)
        out = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    free(chunk);
    return out;
}

char *thaw_codec_add_logprobs(const struct thaw_reply *r, char *body, bool legacy, void (*place)(json_t *root,
                                                                                                  json_t *lp))
{
    json_t *root = json_loads(body, 0, NULL);
    size_t to;
    json_t *lp = r->rd->logprobs(r->rd->ud, 0, r->n_text, true, legacy, &to);
    char *out = NULL;

    free(body);
    if (json_is_object(root) && lp) {
        place(root, lp);
        out = json_dumps(root, JSON_COMPACT);
    }
    json_decref(lp);
    json_decref(root);
    return out;
}

/* ---- the open part ------------------------------------------------------------------- */

int thaw_codec_part_add(struct thaw_codec_stream *st, json_t *s)
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

void thaw_codec_part_reset(struct thaw_codec_stream *st)
{
    free(st->acc);
    free(st->call_id);
    free(st->call_name);
    st->acc = st->call_id = st->call_name = NULL;
    st->n_acc = 0;
}

/* ---- replies ------------------------------------------------------------------------- */

char *thaw_codec_add_verbose(const struct thaw_reply *r, char *body)
{
    json_t *root = json_loads(body, 0, NULL);
    char *content = thaw_api_message_content(r->message_json), *out = NULL;
    char *cclean = content ? thaw_utf8_sanitize(content, strlen(content)) : NULL;

    if (json_is_object(root) && r->prompt && cclean)
        json_object_set_new(root, "__verbose",
                            json_pack("{s:s, s:s, s:i, s:i, s:i, s:s}", "prompt", r->prompt, "content", cclean,
                                      "tokens_evaluated", r->n_prompt, "tokens_predicted", r->timings->predicted_n,
                                      "tokens_cached", r->timings->cache_n, "finish_reason",
                                      r->finish_reason ? r->finish_reason : ""));
    out = json_object_get(root, "__verbose") ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    free(content);
    free(cclean);
    if (!out)
        return body;
    free(body);
    return out;
}

char *thaw_codec_add_extras(const struct thaw_reply *r, char *body, bool legacy,
                            void (*place)(json_t *root, json_t *lp))
{
    if (body && r->verbose)
        body = thaw_codec_add_verbose(r, body);
    if (body && r->req->logprobs)
        body = thaw_codec_add_logprobs(r, body, legacy, place);
    return body;
}

char *thaw_codec_merge_choice(char *body, char *other, int index)
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
