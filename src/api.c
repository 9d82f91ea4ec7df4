/* api.c — OpenAI chat-completions request parsing and response building.
 *
 * Sections:
 *   ---- parsing ----    body -> struct thaw_chat_request, field by field
 *   ---- responses ----  completion, chunk, error, models JSON
 */
#include "api.h"

#include "error.h"
#include "utf8.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- parsing ------------------------------------------------------------------ */

static int fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return THAW_EINVAL;
}

/* Flattens `content`: a string, null (assistant tool calls), or an array of
 * parts of which only {"type":"text","text":...} carry text. */
static int flatten_content(json_t *content, size_t idx, char **out, char *err, size_t errlen)
{
    if (!content || json_is_null(content)) {
        *out = strdup("");
        return *out ? 0 : THAW_ENOMEM;
    }
    if (json_is_string(content)) {
        *out = strndup(json_string_value(content), json_string_length(content));
        return *out ? 0 : THAW_ENOMEM;
    }
    if (!json_is_array(content))
        return fail(err, errlen, "messages[%zu].content must be a string or an array of content parts", idx);

    size_t total = 1, i;
    json_t *part;
    json_array_foreach(content, i, part) {
        json_t *type = json_object_get(part, "type");
        json_t *text = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(type))
            return fail(err, errlen, "messages[%zu].content[%zu] must be an object with a string 'type'", idx, i);
        if (strcmp(json_string_value(type), "text") != 0)
            return fail(err, errlen, "messages[%zu].content[%zu].type '%s' is not supported (only 'text')", idx, i,
                        json_string_value(type));
        if (!json_is_string(text))
            return fail(err, errlen, "messages[%zu].content[%zu].text must be a string", idx, i);
        total += json_string_length(text);
    }
    char *buf = malloc(total);
    size_t len = 0;
    if (!buf)
        return THAW_ENOMEM;
    json_array_foreach(content, i, part) {
        json_t *text = json_object_get(part, "text");
        memcpy(buf + len, json_string_value(text), json_string_length(text));
        len += json_string_length(text);
    }
    buf[len] = '\0';
    *out = buf;
    return 0;
}

static int get_number(json_t *root, const char *name, double lo, double hi, double *out, bool *present, char *err,
                      size_t errlen)
{
    json_t *v = json_object_get(root, name);

    *present = false;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_number(v))
        return fail(err, errlen, "'%s' must be a number", name);
    double d = json_number_value(v);
    if (!isfinite(d) || d < lo || d > hi)
        return fail(err, errlen, "'%s' must be between %g and %g", name, lo, hi);
    *out = d;
    *present = true;
    return 0;
}

static int get_int(json_t *root, const char *name, double lo, double hi, double *out, bool *present, char *err,
                   size_t errlen)
{
    json_t *v = json_object_get(root, name);

    *present = false;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_integer(v))
        return fail(err, errlen, "'%s' must be an integer", name);
    return get_number(root, name, lo, hi, out, present, err, errlen);
}

static int get_bool(json_t *root, const char *name, bool *out, char *err, size_t errlen)
{
    json_t *v = json_object_get(root, name);

    if (!v || json_is_null(v))
        return 0;
    if (!json_is_boolean(v))
        return fail(err, errlen, "'%s' must be true or false", name);
    *out = json_is_true(v);
    return 0;
}

static int parse_messages(json_t *root, struct thaw_chat_request *out, char *err, size_t errlen)
{
    static const char *const roles[] = {"system", "developer", "user", "assistant", "tool"};
    json_t *msgs = json_object_get(root, "messages");
    size_t i;
    json_t *m;
    int rc;

    if (!msgs)
        return fail(err, errlen, "'messages' is required");
    if (!json_is_array(msgs))
        return fail(err, errlen, "'messages' must be an array");
    if (json_array_size(msgs) == 0)
        return fail(err, errlen, "'messages' must not be empty");
    out->messages = calloc(json_array_size(msgs), sizeof *out->messages);
    if (!out->messages)
        return THAW_ENOMEM;
    json_array_foreach(msgs, i, m) {
        json_t *role = json_object_get(m, "role");
        bool known = false;

        if (!json_is_object(m))
            return fail(err, errlen, "messages[%zu] must be an object", i);
        if (!json_is_string(role))
            return fail(err, errlen, "messages[%zu].role must be a string", i);
        for (size_t r = 0; r < sizeof roles / sizeof roles[0]; r++)
            known |= strcmp(json_string_value(role), roles[r]) == 0;
        if (!known)
            return fail(err, errlen, "messages[%zu].role '%s' is not one of system, developer, user, assistant, tool",
                        i, json_string_value(role));
        json_t *content = json_object_get(m, "content");
        if (!content && strcmp(json_string_value(role), "assistant") != 0)
            return fail(err, errlen, "messages[%zu].content is required", i);
        out->messages[i].role = strdup(json_string_value(role));
        if (!out->messages[i].role)
            return THAW_ENOMEM;
        out->n_messages = i + 1;
        if ((rc = flatten_content(content, i, &out->messages[i].content, err, errlen)) != 0)
            return rc;
    }
    return 0;
}

static int parse_stop(json_t *root, struct thaw_chat_request *out, char *err, size_t errlen)
{
    json_t *stop = json_object_get(root, "stop");
    size_t i;
    json_t *s;

    if (!stop || json_is_null(stop))
        return 0;
    if (json_is_string(stop)) {
        if (json_string_length(stop) == 0)
            return 0;
        out->stop[0] = strdup(json_string_value(stop));
        out->n_stop = out->stop[0] ? 1 : 0;
        return out->stop[0] ? 0 : THAW_ENOMEM;
    }
    if (!json_is_array(stop))
        return fail(err, errlen, "'stop' must be a string or an array of strings");
    if (json_array_size(stop) > THAW_API_MAX_STOP)
        return fail(err, errlen, "'stop' may hold at most %d strings", THAW_API_MAX_STOP);
    json_array_foreach(stop, i, s) {
        if (!json_is_string(s))
            return fail(err, errlen, "stop[%zu] must be a string", i);
        if (json_string_length(s) == 0)
            continue;
        out->stop[out->n_stop] = strdup(json_string_value(s));
        if (!out->stop[out->n_stop])
            return THAW_ENOMEM;
        out->n_stop++;
    }
    return 0;
}

int thaw_api_parse_chat(const char *body, size_t len, bool default_cache_prompt, struct thaw_chat_request *out,
                        char *err, size_t errlen)
{
    json_error_t jerr;
    json_t *root = NULL;
    double d;
    bool present;
    int rc;

    memset(out, 0, sizeof *out);
    out->max_tokens = -1;
    out->temperature = 0.8f;
    out->top_p = 0.95f;
    out->min_p = 0.05f;
    out->top_k = 40;
    out->cache_prompt = default_cache_prompt;

    root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        rc = fail(err, errlen, "request body is not valid JSON: %s (line %d, column %d)", jerr.text, jerr.line,
                  jerr.column);
        goto error;
    }
    if (!json_is_object(root)) {
        rc = fail(err, errlen, "request body must be a JSON object");
        goto error;
    }
    if ((rc = parse_messages(root, out, err, errlen)) != 0)
        goto error;

    json_t *model = json_object_get(root, "model");
    if (model && !json_is_null(model)) {
        if (!json_is_string(model)) {
            rc = fail(err, errlen, "'model' must be a string");
            goto error;
        }
        if (!(out->model = strdup(json_string_value(model)))) {
            rc = THAW_ENOMEM;
            goto error;
        }
    }
    if ((rc = get_bool(root, "stream", &out->stream, err, errlen)) != 0)
        goto error;
    json_t *so = json_object_get(root, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) {
            rc = fail(err, errlen, "'stream_options' must be an object");
            goto error;
        }
        json_t *iu = json_object_get(so, "include_usage");
        if (iu && !json_is_boolean(iu)) {
            rc = fail(err, errlen, "'stream_options.include_usage' must be true or false");
            goto error;
        }
        out->include_usage = iu && json_is_true(iu);
    }
    /* max_completion_tokens is OpenAI's newer name; it wins when both are sent */
    static const char *const max_names[] = {"max_tokens", "max_completion_tokens", "n_predict"};
    for (size_t i = 0; i < 3; i++) {
        if ((rc = get_int(root, max_names[i], -1, 1 << 30, &d, &present, err, errlen)) != 0)
            goto error;
        if (present && (i != 2 || out->max_tokens < 0))
            out->max_tokens = (int)d;
    }
    if ((rc = get_number(root, "temperature", 0, 2, &d, &present, err, errlen)) != 0)
        goto error;
    if (present)
        out->temperature = (float)d;
    if ((rc = get_number(root, "top_p", 0, 1, &d, &present, err, errlen)) != 0)
        goto error;
    if (present)
        out->top_p = (float)d;
    if ((rc = get_number(root, "min_p", 0, 1, &d, &present, err, errlen)) != 0)
        goto error;
    if (present)
        out->min_p = (float)d;
    if ((rc = get_int(root, "top_k", 0, 1 << 30, &d, &present, err, errlen)) != 0)
        goto error;
    if (present)
        out->top_k = (int)d;
    if ((rc = get_int(root, "seed", -1, 4294967295.0, &d, &present, err, errlen)) != 0)
        goto error;
    if (present && d >= 0) {
        out->seed = (uint32_t)d;
        out->has_seed = true;
    }
    json_t *n = json_object_get(root, "n");
    if (n && !json_is_null(n) && !(json_is_integer(n) && json_integer_value(n) == 1)) {
        rc = fail(err, errlen, "'n' must be 1: one choice per request is supported");
        goto error;
    }
    if ((rc = parse_stop(root, out, err, errlen)) != 0)
        goto error;
    if ((rc = get_bool(root, "cache_prompt", &out->cache_prompt, err, errlen)) != 0)
        goto error;

    json_decref(root);
    return 0;

error:
    json_decref(root);
    thaw_chat_request_free(out);
    return rc;
}

void thaw_chat_request_free(struct thaw_chat_request *req)
{
    for (size_t i = 0; i < req->n_messages; i++) {
        free(req->messages[i].role);
        free(req->messages[i].content);
    }
    free(req->messages);
    free(req->model);
    for (int i = 0; i < req->n_stop; i++)
        free(req->stop[i]);
    memset(req, 0, sizeof *req);
}

int thaw_api_admit(const struct thaw_chat_request *req, int n_ctx_slot, int max_token_bytes, char *err,
                   size_t errlen)
{
    size_t bytes = 0;

    if (n_ctx_slot < 1 || max_token_bytes < 1)
        return fail(err, errlen, "the server has no context to admit requests into");
    if (req->n_messages >= (size_t)n_ctx_slot)
        return fail(err, errlen, "'messages' holds %zu messages; a slot's context holds %d tokens (-c / -np)",
                    req->n_messages, n_ctx_slot);
    for (size_t i = 0; i < req->n_messages; i++)
        bytes += strlen(req->messages[i].content);
    /* every token covers at most max_token_bytes of text */
    if (bytes / (size_t)max_token_bytes >= (size_t)n_ctx_slot)
        return fail(err, errlen,
                    "'messages' hold %zu bytes of text: at least %zu tokens, more than a slot's context of %d "
                    "tokens (-c / -np)",
                    bytes, bytes / (size_t)max_token_bytes, n_ctx_slot);
    return 0;
}

/* ---- responses ---------------------------------------------------------------- */

static char *dump(json_t *root)
{
    char *s = root ? json_dumps(root, JSON_COMPACT) : NULL;

    json_decref(root);
    return s;
}

static json_t *timings_json(const struct thaw_timings *t)
{
    double pps = t->prompt_ms > 0 ? t->prompt_n * 1000.0 / t->prompt_ms : 0;
    double gps = t->predicted_ms > 0 ? t->predicted_n * 1000.0 / t->predicted_ms : 0;

    return json_pack("{s:i, s:i, s:f, s:f, s:f, s:i, s:f, s:f, s:f, s:s, s:f, s:i, s:i, s:i}", "cache_n", t->cache_n,
                     "prompt_n", t->prompt_n, "prompt_ms", t->prompt_ms, "prompt_per_token_ms",
                     t->prompt_n ? t->prompt_ms / t->prompt_n : 0.0, "prompt_per_second", pps, "predicted_n",
                     t->predicted_n, "predicted_ms", t->predicted_ms, "predicted_per_token_ms",
                     t->predicted_n ? t->predicted_ms / t->predicted_n : 0.0, "predicted_per_second", gps,
                     "cache_source", t->cache_source ? t->cache_source : "none", "restore_ms", t->restore_ms,
                     "draft_n", t->draft_n, "draft_n_accepted", t->draft_n_accepted, "draft_restored",
                     t->draft_restored);
}

static json_t *usage_json(int prompt_tokens, const struct thaw_timings *t)
{
    return json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", prompt_tokens, "completion_tokens",
                     t->predicted_n, "total_tokens", prompt_tokens + t->predicted_n, "prompt_tokens_details",
                     "cached_tokens", t->cache_n);
}

char *thaw_api_error_json(int status, const char *message)
{
    const char *type = "invalid_request_error";
    /* messages may quote the client's bytes (jansson's "near '...'") or be
     * cut mid-character: JSON strings must be valid UTF-8 */
    char *clean = thaw_utf8_sanitize(message, strlen(message));

    if (status == 401)
        type = "authentication_error";
    else if (status == 404)
        type = "not_found_error";
    else if (status == 503)
        type = "unavailable_error";
    else if (status >= 500)
        type = "server_error";
    char *out = clean ? dump(json_pack("{s:{s:s, s:s, s:i}}", "error", "message", clean, "type", type, "code", status))
                      : NULL;
    free(clean);
    return out;
}

char *thaw_api_completion_json(const char *id, const char *model, long created, const char *content,
                               const char *finish_reason, int prompt_tokens, const struct thaw_timings *t)
{
    return dump(json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:{s:s, s:s}, s:s}], s:o, s:o}", "id", id, "object",
                          "chat.completion", "created", (json_int_t)created, "model", model, "choices", "index", 0,
                          "message", "role", "assistant", "content", content, "finish_reason", finish_reason,
                          "usage", usage_json(prompt_tokens, t), "timings", timings_json(t)));
}

char *thaw_api_chunk_json(const char *id, const char *model, long created, const char *role,
                          const char *content, const char *finish_reason, const struct thaw_timings *timings,
                          int prompt_tokens, bool usage_only)
{
    json_t *root = json_pack("{s:s, s:s, s:I, s:s}", "id", id, "object", "chat.completion.chunk", "created",
                             (json_int_t)created, "model", model);
    json_t *choices = json_array();

    if (!root || !choices) {
        json_decref(root);
        json_decref(choices);
        return NULL;
    }
    if (!usage_only) {
        json_t *delta = json_object();
        if (role)
            json_object_set_new(delta, "role", json_string(role));
        if (content)
            json_object_set_new(delta, "content", json_string(content));
        json_array_append_new(choices, json_pack("{s:i, s:o, s:o}", "index", 0, "delta", delta, "finish_reason",
                                                 finish_reason ? json_string(finish_reason) : json_null()));
    }
    json_object_set_new(root, "choices", choices);
    if (timings)
        json_object_set_new(root, "timings", timings_json(timings));
    if (usage_only)
        json_object_set_new(root, "usage", usage_json(prompt_tokens, timings));
    return dump(root);
}

char *thaw_api_models_json(const char *model, long created, uint64_t n_params, int n_ctx_train)
{
    return dump(json_pack("{s:s, s:[{s:s, s:s, s:I, s:s, s:{s:I, s:i}}]}", "object", "list", "data", "id", model,
                          "object", "model", "created", (json_int_t)created, "owned_by", "thaw", "meta", "n_params",
                          (json_int_t)n_params, "n_ctx_train", n_ctx_train));
}
