/* api_completions.c — POST /v1/completions and POST /completion: a raw
 * prompt in, text out (api_completions.h).
 *
 * Map:
 *   ---- request ----  the prompt; every other field through thaw_api_parse_chat_json
 *   ---- replies ----  OpenAI's text_completion (whole, chunks), llama-server's /completion
 *   ---- the codecs -- their tables: OpenAI's (text_completion chunks, [DONE]) and llama-server's
 *                      ({"content", "stop"} pieces, one per token with n_probs, no [DONE])
 */
#include "api/api_completions.h"

#include "api/api_wire.h"
#include "api/codec.h"
#include "api/logprobs.h"
#include "api/template.h"
#include "base/error.h"
#include "base/utf8.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- request ------------------------------------------------------------------------ */

/* A prompt given as token ids, or llama-server's mixed sequence of ids
 * and text: 0 and the ids in out (each text in raw_pieces, api.h), or
 * THAW_EINVAL. */
static int take_tokens(json_t *arr, struct thaw_chat_request *out, char *err, size_t errlen)
{
    size_t i, n_text = 0;
    json_t *v;

    if (json_array_size(arr) == 0)
        return thaw_api_fail(err, errlen, "'prompt' is empty");
    if (json_array_size(arr) > (1u << 24))
        return thaw_api_fail(err, errlen, "'prompt' holds more token ids than any context");
    json_array_foreach(arr, i, v)
        n_text += json_is_string(v);
    if (!(out->raw_tokens = malloc(json_array_size(arr) * sizeof *out->raw_tokens)) ||
        (n_text && !(out->raw_pieces = calloc(n_text, sizeof *out->raw_pieces))))
        return THAW_ENOMEM;
    json_array_foreach(arr, i, v) {
        if (json_is_string(v)) {
            if (!(out->raw_pieces[out->n_raw_pieces] = strndup(json_string_value(v), json_string_length(v))))
                return THAW_ENOMEM;
            out->raw_tokens[i] = -1 - out->n_raw_pieces++;
            continue;
        }
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
            return thaw_api_fail(err, errlen, "prompt[%zu] must be a token id or a string", i);
        out->raw_tokens[i] = (int32_t)json_integer_value(v);
    }
    out->n_raw_tokens = (int)json_array_size(arr);
    return 0;
}

/* llama-server's rule: an array of ids and strings with at least one id
 * is one prompt (mixed); any other array of several holds one prompt each. */
static bool several_prompts(json_t *p)
{
    size_t i, n_ids = 0;
    json_t *v;

    if (!json_is_array(p) || json_array_size(p) < 2)
        return false;
    json_array_foreach(p, i, v) {
        if (!json_is_integer(v) && !json_is_string(v))
            return true;
        n_ids += json_is_integer(v);
    }
    return n_ids == 0;
}

static int take_prompt(json_t *p, struct thaw_chat_request *out, char *err, size_t errlen)
{
    if (json_is_array(p) && json_array_size(p) == 1 && !json_is_integer(json_array_get(p, 0)))
        p = json_array_get(p, 0); /* ["text"] or [[ids]]: one prompt */
    if (several_prompts(p))
        return thaw_api_fail(err, errlen, "'prompt' holds %zu prompts: send one per request (several are served "
                                          "on /completion, without streaming)",
                             json_array_size(p));
    if (json_is_object(p)) { /* llama-server's JSON prompt: {"prompt_string", "multimodal_data"?} */
        if (json_object_get(p, "multimodal_data"))
            return thaw_api_fail(err, errlen, "'prompt.multimodal_data': this server reads text only on "
                                              "/completion (no multimodal projector)");
        p = json_object_get(p, "prompt_string");
        if (!json_is_string(p))
            return thaw_api_fail(err, errlen, "'prompt' as an object needs a string 'prompt_string'");
    }
    if (json_is_string(p)) {
        if (json_string_length(p) == 0)
            return thaw_api_fail(err, errlen, "'prompt' is empty");
        return (out->raw_text = strndup(json_string_value(p), json_string_length(p))) ? 0 : THAW_ENOMEM;
    }
    if (json_is_array(p))
        return take_tokens(p, out, err, errlen);
    return thaw_api_fail(err, errlen, "'prompt' must be a string or an array of token ids");
}

/* What a completion may ask that thaw does not do: a 400 naming it. */
static int refuse_fields(json_t *root, char *err, size_t errlen)
{
    json_t *v;

    if ((v = json_object_get(root, "echo")) && json_is_true(v))
        return thaw_api_fail(err, errlen, "'echo' is not supported");
    if ((v = json_object_get(root, "suffix")) && json_is_string(v) && json_string_length(v) > 0)
        return thaw_api_fail(err, errlen, "'suffix' is not supported (no infill)");
    if ((v = json_object_get(root, "best_of")) && !json_is_null(v) && !(json_is_integer(v) && json_integer_value(v) == 1))
        return thaw_api_fail(err, errlen, "'best_of' must be 1");
    return 0;
}

/* OpenAI's completions logprobs: an integer, the candidates per token
 * (0..20; 0 = none, as llama-server reads it as n_probs); llama-server's
 * own n_probs, when sent, wins (thaw_api_parse_chat reads it). -1 = none
 * asked here. */
static int take_logprobs(json_t *root, int *n, char *err, size_t errlen)
{
    json_t *v = json_object_get(root, "logprobs");

    *n = -1;
    if (!v || json_is_null(v) || json_is_false(v))
        return 0;
    if (json_is_true(v)) { /* the chat form, which llama-server also takes here */
        *n = 20;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > THAW_LOGPROBS_MAX_OAI)
        return thaw_api_fail(err, errlen, "'logprobs' must be an integer from 0 to %d", THAW_LOGPROBS_MAX_OAI);
    *n = (int)json_integer_value(v);
    return 0;
}

int thaw_api_parse_completion(const char *body, size_t len, bool default_cache_prompt, struct thaw_chat_request *out,
                              char *err, size_t errlen)
{
    json_error_t jerr;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr), *chat = NULL, *prompt;
    int rc;

    memset(out, 0, sizeof *out);
    if (!root)
        return thaw_api_fail(err, errlen, "request body is not valid JSON: %s (line %d, column %d)", jerr.text,
                             jerr.line, jerr.column);
    if (!json_is_object(root)) {
        rc = thaw_api_fail(err, errlen, "request body must be a JSON object");
        goto out;
    }
    if (!(prompt = json_object_get(root, "prompt")) || json_is_null(prompt)) {
        rc = thaw_api_fail(err, errlen, "'prompt' is required");
        goto out;
    }
    int n_logprobs;
    if ((rc = refuse_fields(root, err, errlen)) != 0 || (rc = take_logprobs(root, &n_logprobs, err, errlen)) != 0)
        goto out;
    json_t *rf = json_object_get(root, "response_fields"), *f;
    size_t k;
    if (rf && !json_is_null(rf)) {
        bool ok = json_is_array(rf);
        json_array_foreach(rf, k, f)
            ok &= json_is_string(f);
        if (!ok) {
            rc = thaw_api_fail(err, errlen, "'response_fields' must be an array of strings");
            goto out;
        }
    }
    /* the rest is a chat request's: one stand-in message, dropped after */
    if (!(chat = json_copy(root))) {
        rc = THAW_ENOMEM;
        goto out;
    }
    json_object_del(chat, "prompt");
    json_object_del(chat, "logprobs");
    json_object_del(chat, "tools");
    json_object_del(chat, "response_format");
    json_object_del(chat, "response_fields");
    json_object_set_new(chat, "messages", json_pack("[{s:s, s:s}]", "role", "user", "content", "."));
    if ((rc = thaw_api_parse_chat_json(chat, default_cache_prompt, out, err, errlen)) != 0)
        goto out;
    for (size_t i = 0; i < out->n_messages; i++) {
        free(out->messages[i].role);
        free(out->messages[i].content);
        free(out->messages[i].json);
        free(out->messages[i].render);
    }
    free(out->messages);
    out->messages = NULL;
    out->n_messages = 0;
    out->raw = true;
    json_t *np = json_object_get(root, "n_probs");
    if (n_logprobs >= 0 && (!np || json_is_null(np))) {
        out->logprobs = n_logprobs > 0;
        out->n_probs = n_logprobs;
    }
    if (json_array_size(rf) > 0 && !(out->response_fields = json_dumps(rf, JSON_COMPACT))) {
        thaw_chat_request_free(out);
        rc = THAW_ENOMEM;
        goto out;
    }
    if ((rc = take_prompt(prompt, out, err, errlen)) != 0)
        thaw_chat_request_free(out);
out:
    json_decref(chat);
    json_decref(root);
    return rc;
}

/* ---- replies ------------------------------------------------------------------------ */

/* JSON strings must be valid UTF-8: a reply may end mid-character */
static json_t *text_value(const char *text)
{
    char *clean = thaw_utf8_sanitize(text ? text : "", text ? strlen(text) : 0);
    json_t *v = clean ? json_string(clean) : NULL;

    free(clean);
    return v;
}

static char *text_completion(const char *id, const char *model, long created, const char *text,
                             const char *finish_reason, int prompt_tokens, const struct thaw_timings *t)
{
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:s, s:[{s:o, s:i, s:n, s:o}]}", "id", id, "object",
                          "text_completion", "created", (json_int_t)created, "model", model, "system_fingerprint",
                          thaw_tmpl_build_fingerprint(), "choices", "text", text_value(text), "index", 0, "logprobs", "finish_reason",
                          finish_reason ? json_string(finish_reason) : json_null());

    if (o && t) {
        json_object_set_new(o, "usage", thaw_api_usage_json(prompt_tokens, t));
        (void)thaw_api_set_timings(o, t);
    }
    return thaw_api_dump(o);
}

char *thaw_api_text_completion_json(const char *id, const char *model, long created, const char *text,
                                    const char *finish_reason, int prompt_tokens, const struct thaw_timings *t)
{
    return text_completion(id, model, created, text, finish_reason, prompt_tokens, t);
}

char *thaw_api_text_completion_chunk_json(const char *id, const char *model, long created, const char *text,
                                          const char *finish_reason, int prompt_tokens, const struct thaw_timings *t)
{
    return text_completion(id, model, created, text, finish_reason, prompt_tokens, t);
}

char *thaw_api_llama_completion_json(const char *model, const char *text, bool final, const char *finish_reason,
                                     const char *stop_word, int prompt_tokens, const struct thaw_timings *t)
{
    if (!final)
        return thaw_api_dump(json_pack("{s:i, s:o, s:[], s:b}", "index", 0, "content", text_value(text), "tokens", "stop", 0));
    bool limit = finish_reason && strcmp(finish_reason, "length") == 0;
    const char *type = limit ? "limit" : stop_word ? "word" : "eos";
    json_t *o = json_pack("{s:i, s:o, s:[], s:s, s:b, s:s, s:s, s:i, s:i, s:i, s:b}", "index", 0, "content",
                          text_value(text), "tokens", "model", model, "stop", 1, "stop_type", type, "stopping_word",
                          stop_word && !limit ? stop_word : "", "tokens_predicted", t->predicted_n, "tokens_evaluated",
                          prompt_tokens, "tokens_cached", t->cache_n, "truncated", t->truncated);
    if (o && thaw_api_set_timings(o, t) != 0) {
        json_decref(o);
        o = NULL;
    }
    return thaw_api_dump(o);
}

char *thaw_api_message_content(const char *message_json)
{
    json_error_t jerr;
    json_t *m = message_json ? json_loads(message_json, 0, &jerr) : NULL;
    const char *c = json_string_value(json_object_get(m, "content"));
    char *out = strdup(c ? c : "");

    json_decref(m);
    return out;
}

/* ---- the codecs ---------------------------------------------------------------------- */

static void cmpl_place_logprobs(json_t *root, json_t *lp)
{
    json_t *choice = json_array_get(json_object_get(root, "choices"), 0);

    if (choice)
        json_object_set(choice, "logprobs", lp);
}

static char *completions_reply(const struct thaw_reply *r)
{
    char *text = thaw_api_message_content(r->message_json);
    char *body = text ? thaw_api_text_completion_json(r->id, r->model, r->created, text, r->finish_reason,
                                                      r->n_prompt, r->timings)
                      : NULL;

    free(text);
    return thaw_codec_add_extras(r, body, true, cmpl_place_logprobs);
}

static void completion_place_logprobs(json_t *root, json_t *lp)
{
    json_object_set(root, "completion_probabilities", lp);
}

/* /completion's whole reply, as llama-server's: with the prompt the model
 * read and generation_settings; then, with response_fields, only the named
 * fields, each "a/b" path read from that whole reply and keyed by the path
 * (a path that names nothing is left out). Takes `body`; NULL on ENOMEM. */
static char *completion_fields(const struct thaw_reply *r, char *body)
{
    const struct thaw_chat_request *req = r->req;
    json_t *root = json_loads(body, 0, NULL), *out = NULL, *f;
    json_t *fields = req->response_fields ? json_loads(req->response_fields, 0, NULL) : NULL;
    char *text = NULL;
    size_t i;

    free(body);
    if (!json_is_object(root) || !r->prompt || !(out = json_object()))
        goto done;
    json_object_set_new(root, "prompt", json_string(r->prompt));
    json_t *biases = json_array();
    for (int k = 0; biases && k < r->n_bias; k++) /* -inf (banned) as null, as llama-server writes it */
        json_array_append_new(biases, json_pack("{s:o, s:i}", "bias",
                                                isinf(r->bias_val[k]) ? json_null() : json_real(r->bias_val[k]),
                                                "token", (int)r->bias_tok[k]));
    json_object_set_new(root, "generation_settings",
                        json_pack("{s:i, s:i, s:b, s:b, s:o*}", "n_predict", r->max_tokens, "n_probs", req->n_probs,
                                  "post_sampling_probs", req->post_sampling_probs, "stream", req->stream,
                                  "logit_bias", biases));
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
    return text;
}

static char *completion_reply(const struct thaw_reply *r)
{
    char *text = thaw_api_message_content(r->message_json);
    char *body = text ? thaw_api_llama_completion_json(r->model, text, true, r->finish_reason, r->stop_sequence,
                                                       r->n_prompt, r->timings)
                      : NULL;

    free(text);
    body = thaw_codec_add_extras(r, body, false, completion_place_logprobs);
    return body ? completion_fields(r, body) : NULL;
}

static int cmpl_open(struct thaw_codec_stream *st)
{
    (void)st;
    return 0; /* the first text is the first chunk */
}

static int cmpl_fail(struct thaw_codec_stream *st, int status, const char *message)
{
    return thaw_codec_emit_text(st, NULL, thaw_api_error_json(status, message));
}

static const char *diff_text(json_t *diff)
{
    const char *s = json_string_value(json_object_get(diff, "content"));
    return s ? s : "";
}

/* llama-server's prompt_progress rides an empty piece */
static int oai_cmpl_progress(struct thaw_codec_stream *st, int processed, int64_t time_us, int cache_n)
{
    return thaw_codec_emit_progress(
        st, NULL, thaw_codec_loads(thaw_api_text_completion_chunk_json(st->id, st->model, st->created, "", NULL, 0, NULL)),
        processed, time_us, cache_n);
}

static int oai_cmpl_delta(struct thaw_codec_stream *st, json_t *diff)
{
    return thaw_codec_emit_text(
        st, NULL,
        thaw_codec_timings_attach(st, thaw_codec_lp_attach(st,
                                                           thaw_api_text_completion_chunk_json(
                                                               st->id, st->model, st->created, diff_text(diff), NULL, 0,
                                                               NULL),
                                                           true)));
}

static int oai_cmpl_close(struct thaw_codec_stream *st)
{
    const struct thaw_reply *r = st->reply;
    int rc = thaw_codec_emit_text(
        st, NULL,
        thaw_codec_lp_attach(st,
                             thaw_api_text_completion_chunk_json(st->id, st->model, st->created, "", r->finish_reason,
                                                                 r->n_prompt, r->timings),
                             true));

    return rc ? rc : st->put(st->sink, NULL, "[DONE]");
}

static int llama_cmpl_progress(struct thaw_codec_stream *st, int processed, int64_t time_us, int cache_n)
{
    return thaw_codec_emit_progress(
        st, NULL, thaw_codec_loads(thaw_api_llama_completion_json(st->model, "", false, NULL, NULL, 0, NULL)), processed,
        time_us, cache_n);
}

/* One /completion piece; with `probs` (taken) its completion_probabilities. */
static int llama_cmpl_piece(struct thaw_codec_stream *st, const char *text, json_t *probs)
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
    return thaw_codec_emit_text(st, NULL, thaw_codec_timings_attach(st, chunk));
}

/* With n_probs, llama-server sends one piece per token, each with that
 * token's entry: the text is cut at the entries' ends, read from the
 * reply's bytes (a piece may end inside a character; what follows the last
 * entry waits for its token, unless the reply is done). */
static int llama_cmpl_delta(struct thaw_codec_stream *st, json_t *diff)
{
    const struct thaw_reply_reader *rd = st->rd;
    size_t off = st->text_from, n_text = st->n_text;
    uint32_t start, end;
    int rc = 0;

    if (!st->req->logprobs)
        return llama_cmpl_piece(st, diff_text(diff), NULL);
    while (rc == 0 && rd->span(rd->ud, st->lp_from, &start, &end) &&
           (end <= n_text || (st->done && start < n_text))) {
        size_t cut = end < n_text ? end : n_text;
        if (cut < off)
            cut = off;
        char *piece = rd->text(rd->ud, off, cut);
        size_t to;
        json_t *probs = piece ? rd->logprobs(rd->ud, st->lp_from, SIZE_MAX, true, false, &to) : NULL;
        while (probs && json_array_size(probs) > 1) /* this entry only */
            json_array_remove(probs, json_array_size(probs) - 1);
        rc = probs ? llama_cmpl_piece(st, piece, probs) : THAW_ENOMEM;
        free(piece);
        st->lp_from++;
        off = cut;
    }
    if (rc == 0 && off < n_text && st->done) { /* text no token of its own stands for */
        char *piece = rd->text(rd->ud, off, n_text);
        rc = piece ? llama_cmpl_piece(st, piece, NULL) : THAW_ENOMEM;
        free(piece);
        off = n_text;
    }
    st->n_seen = off; /* the rest comes again with the next news */
    return rc;
}

static int llama_cmpl_close(struct thaw_codec_stream *st)
{
    const struct thaw_reply *r = st->reply;

    return thaw_codec_emit_text(st, NULL, thaw_api_llama_completion_json(st->model, "", true, r->finish_reason,
                                                                         r->stop_sequence, r->n_prompt, r->timings));
}

/* /completion's several prompts: the body once per prompt, with that one */
static int completion_split(const char *body, size_t len, char ***bodies, int *n)
{
    json_t *root = json_loadb(body, len, 0, NULL), *p = json_object_get(root, "prompt"), *v;
    char **out = NULL;
    size_t i, count = 0;
    int rc = 0;

    *bodies = NULL;
    *n = 0;
    if (!json_is_object(root) || !several_prompts(p))
        goto done;
    count = json_array_size(p);
    if (!(out = calloc(count, sizeof *out))) {
        rc = THAW_ENOMEM;
        goto done;
    }
    json_incref(p); /* root's "prompt" is replaced by each in turn */
    json_array_foreach(p, i, v) {
        if (json_object_set(root, "prompt", v) != 0 || !(out[i] = json_dumps(root, JSON_COMPACT))) {
            rc = THAW_ENOMEM;
            break;
        }
    }
    json_decref(p);
    if (rc == 0) {
        *bodies = out;
        *n = (int)count;
        out = NULL;
    }
done:
    for (size_t k = 0; out && k < count; k++)
        free(out[k]);
    free(out);
    json_decref(root);
    return rc;
}

/* ... answered as an array of their replies, in the prompts' order */
static char *completion_merge_split(char **bodies, int n)
{
    json_t *arr = json_array();
    char *out = NULL;

    for (int i = 0; arr && i < n; i++) {
        json_t *v = bodies[i] ? json_loads(bodies[i], 0, NULL) : NULL;
        if (!v || json_array_append_new(arr, v) != 0) {
            json_decref(arr);
            arr = NULL;
        }
    }
    for (int i = 0; i < n; i++)
        free(bodies[i]);
    out = arr ? json_dumps(arr, JSON_COMPACT) : NULL;
    json_decref(arr);
    return out;
}

const struct thaw_codec thaw_codec_completions = {
    .name = "completions",
    .id_prefix = "cmpl-",
    .auth_hint = THAW_API_AUTH_HINT,
    .caps = THAW_CODEC_VERBOSE,
    .parse = thaw_api_parse_completion,
    .error_json = thaw_api_error_json,
    .too_long_json = thaw_api_too_long_json,
    .reply = completions_reply,
    .merge_choice = thaw_codec_merge_choice,
    .open = cmpl_open,
    .progress = oai_cmpl_progress,
    .delta = oai_cmpl_delta,
    .close = oai_cmpl_close,
    .fail = cmpl_fail,
};

const struct thaw_codec thaw_codec_completion = {
    .name = "completion",
    .id_prefix = "cmpl-",
    .auth_hint = THAW_API_AUTH_HINT,
    .caps = THAW_CODEC_VERBOSE | THAW_CODEC_PROMPT,
    .parse = thaw_api_parse_completion,
    .error_json = thaw_api_error_json,
    .too_long_json = thaw_api_too_long_json,
    .reply = completion_reply,
    .merge_choice = NULL,
    .split = completion_split,
    .merge_split = completion_merge_split,
    .open = cmpl_open,
    .progress = llama_cmpl_progress,
    .delta = llama_cmpl_delta,
    .close = llama_cmpl_close,
    .fail = cmpl_fail,
};
