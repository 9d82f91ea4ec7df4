/* api_responses.c — the Responses codec.
 *
 * Like api_anthropic.c: a request is translated into a chat-completions
 * body that api.c's parser validates and normalises, every Responses field
 * checked here first so a 400 names what the client sent.
 *
 * Map:
 *   ---- request ----    input items, tools, settings
 *   ---- responses ----  the response object and its output items
 *   ---- the codec ----  the table; the stream: response.created, output items (reasoning,
 *                        message, function_call) with their deltas and done events,
 *                        response.completed
 */
#include "api/api_responses.h"

#include "api/api_wire.h"
#include "api/codec.h"

#include "base/error.h"
#include "base/log.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- request ---------------------------------------------------------------------- */

#define fail thaw_api_fail /* the short name this file's checks use */

static const char *type_of(json_t *o)
{
    json_t *t = json_object_get(o, "type");

    return json_is_string(t) ? json_string_value(t) : NULL;
}

/* Content parts with an input_image among them, as chat-completions
 * parts in order: text parts as "text", each input_image ({"image_url":
 * "data:..."}) as an "image_url" part api.c reads (a file_id is refused:
 * thaw keeps no files). */
static int parts_with_images(json_t *content, const char *where, json_t **out, char *err, size_t errlen)
{
    json_t *parts = json_array(), *p;
    size_t i;

    *out = NULL;
    if (!parts)
        return THAW_ENOMEM;
    json_array_foreach(content, i, p) {
        const char *ty = type_of(p);
        json_t *part;
        if (!json_is_object(p) || !ty) {
            json_decref(parts);
            return fail(err, errlen, "%s[%zu] must be an object with a string 'type'", where, i);
        }
        if (strcmp(ty, "input_image") == 0) {
            json_t *url = json_object_get(p, "image_url");
            if (json_is_object(url))
                url = json_object_get(url, "url");
            if (!json_is_string(url)) {
                json_decref(parts);
                return fail(err, errlen, "%s[%zu].image_url must be a string (a data: URL; thaw keeps no files for "
                                         "a file_id)", where, i);
            }
            part = json_pack("{s:s, s:{s:O}}", "type", "image_url", "image_url", "url", url);
        } else if (strcmp(ty, "input_text") == 0 || strcmp(ty, "output_text") == 0 || strcmp(ty, "text") == 0) {
            json_t *t = json_object_get(p, "text");
            if (!json_is_string(t)) {
                json_decref(parts);
                return fail(err, errlen, "%s[%zu].text must be a string", where, i);
            }
            part = json_pack("{s:s, s:O}", "type", "text", "text", t);
        } else {
            json_decref(parts);
            return fail(err, errlen, "%s[%zu].type '%s' is not supported (input_text, output_text, input_image)",
                        where, i, ty);
        }
        if (json_array_append_new(parts, part) != 0) {
            json_decref(parts);
            return THAW_ENOMEM;
        }
    }
    *out = parts;
    return 0;
}

/* The text of a content field: a string, or parts of which input_text,
 * output_text and text carry text (joined); with an input_image among
 * them, the parts themselves (parts_with_images). Files are refused. */
static int text_of(json_t *content, const char *where, json_t **out, char *err, size_t errlen)
{
    size_t i, total = 0;
    json_t *p;

    *out = NULL;
    if (json_is_array(content))
        json_array_foreach(content, i, p)
            if (type_of(p) && strcmp(type_of(p), "input_image") == 0)
                return parts_with_images(content, where, out, err, errlen);
    if (!content || json_is_null(content)) {
        *out = json_string("");
        return *out ? 0 : THAW_ENOMEM;
    }
    if (json_is_string(content)) {
        *out = json_incref(content);
        return 0;
    }
    if (!json_is_array(content))
        return fail(err, errlen, "%s must be a string or an array of content parts", where);
    json_array_foreach(content, i, p) {
        const char *ty = type_of(p);
        if (!json_is_object(p) || !ty)
            return fail(err, errlen, "%s[%zu] must be an object with a string 'type'", where, i);
        if (strcmp(ty, "input_text") != 0 && strcmp(ty, "output_text") != 0 && strcmp(ty, "text") != 0)
            return fail(err, errlen, "%s[%zu].type '%s' is not supported (input_text, output_text, input_image)%s",
                        where, i, ty, strncmp(ty, "input_", 6) == 0 ? ": the model reads text and images only" : "");
        if (!json_is_string(json_object_get(p, "text")))
            return fail(err, errlen, "%s[%zu].text must be a string", where, i);
        total += json_string_length(json_object_get(p, "text"));
    }
    char *buf = malloc(total + 1);
    size_t n = 0;
    if (!buf)
        return THAW_ENOMEM;
    json_array_foreach(content, i, p) {
        json_t *t = json_object_get(p, "text");
        memcpy(buf + n, json_string_value(t), json_string_length(t));
        n += json_string_length(t);
    }
    *out = json_stringn(buf, n);
    free(buf);
    return *out ? 0 : THAW_ENOMEM;
}

/* The assistant message being assembled from consecutive reasoning,
 * message and function_call items; appended to `out` when another kind of
 * item (or the end) comes. */
static int flush(json_t *out, json_t **pending)
{
    int rc = 0;

    if (*pending) {
        if (!json_object_get(*pending, "content"))
            json_object_set_new(*pending, "content", json_null());
        rc = json_array_append_new(out, *pending) == 0 ? 0 : THAW_ENOMEM;
        *pending = NULL;
    }
    return rc;
}

static json_t *assistant(json_t **pending)
{
    if (!*pending)
        *pending = json_pack("{s:s}", "role", "assistant");
    return *pending;
}

static int convert_input(json_t *root, json_t *oai, char *err, size_t errlen)
{
    json_t *input = json_object_get(root, "input"), *out = json_array(), *pending = NULL, *item, *v;
    size_t i;
    int rc = 0;

    if (!out)
        return THAW_ENOMEM;
    json_object_set_new(oai, "messages", out);
    if ((v = json_object_get(root, "instructions")) && !json_is_null(v)) {
        if (!json_is_string(v))
            return fail(err, errlen, "'instructions' must be a string");
        json_array_append_new(out, json_pack("{s:s, s:O}", "role", "system", "content", v));
    }
    if (!input)
        return fail(err, errlen, "'input' is required");
    if (json_is_string(input)) {
        json_array_append_new(out, json_pack("{s:s, s:O}", "role", "user", "content", input));
        return 0;
    }
    if (!json_is_array(input) || json_array_size(input) == 0)
        return fail(err, errlen, "'input' must be a string or a non-empty array of items");
    json_array_foreach(input, i, item) {
        const char *ty = type_of(item);
        char where[64];
        json_t *role = json_object_get(item, "role");
        snprintf(where, sizeof where, "input[%zu]", i);
        if (!json_is_object(item)) {
            rc = fail(err, errlen, "%s must be an object", where);
            break;
        }
        if ((!ty && json_is_string(role)) || (ty && strcmp(ty, "message") == 0)) {
            const char *r = json_string_value(role);
            json_t *text = NULL;
            char w2[80];
            snprintf(w2, sizeof w2, "%s.content", where);
            if (!r || (strcmp(r, "user") != 0 && strcmp(r, "assistant") != 0 && strcmp(r, "system") != 0 &&
                       strcmp(r, "developer") != 0)) {
                rc = fail(err, errlen, "%s.role must be one of user, assistant, system, developer", where);
                break;
            }
            if ((rc = text_of(json_object_get(item, "content"), w2, &text, err, errlen)) != 0)
                break;
            if (strcmp(r, "assistant") == 0) {
                json_t *a = pending && (json_object_get(pending, "tool_calls") || json_object_get(pending, "content"))
                                ? NULL
                                : assistant(&pending);
                if (!a) { /* the pending one is complete: this is another turn */
                    if ((rc = flush(out, &pending)) != 0 || !(a = assistant(&pending))) {
                        json_decref(text);
                        rc = rc ? rc : THAW_ENOMEM;
                        break;
                    }
                }
                json_object_set_new(a, "content", text);
                continue;
            }
            if ((rc = flush(out, &pending)) != 0 ||
                json_array_append_new(out, json_pack("{s:s, s:o}", "role", r, "content", text)) != 0) {
                rc = rc ? rc : THAW_ENOMEM;
                break;
            }
        } else if (ty && strcmp(ty, "reasoning") == 0) {
            /* the text thaw sent (content), else the summary */
            json_t *parts = json_object_get(item, "content"), *p, *text = NULL;
            size_t k;
            if (!json_is_array(parts) || json_array_size(parts) == 0)
                parts = json_object_get(item, "summary");
            if (parts && !json_is_null(parts) && !json_is_array(parts)) {
                rc = fail(err, errlen, "%s.summary must be an array", where);
                break;
            }
            json_array_foreach(parts, k, p) {
                json_t *t = json_object_get(p, "text");
                if (!json_is_string(t)) {
                    rc = fail(err, errlen, "%s: reasoning parts need a string 'text'", where);
                    break;
                }
                if (!text) {
                    text = json_copy(t);
                } else {
                    size_t a = json_string_length(text), b = json_string_length(t);
                    char *buf = malloc(a + b + 1);
                    if (!buf) {
                        rc = THAW_ENOMEM;
                        break;
                    }
                    memcpy(buf, json_string_value(text), a);
                    memcpy(buf + a, json_string_value(t), b);
                    json_string_setn(text, buf, a + b);
                    free(buf);
                }
            }
            if (rc != 0) {
                json_decref(text);
                break;
            }
            /* reasoning opens a turn: after a message or calls it is the next one's */
            if (pending && (json_object_get(pending, "content") || json_object_get(pending, "tool_calls")))
                rc = flush(out, &pending);
            json_t *prev = pending ? json_object_get(pending, "reasoning_content") : NULL;
            if (rc == 0 && text && json_string_length(text) > 0 && assistant(&pending)) {
                if (prev) { /* consecutive reasoning items: one turn's reasoning */
                    size_t a = json_string_length(prev), b = json_string_length(text);
                    char *buf = malloc(a + b + 1);
                    if (buf) {
                        memcpy(buf, json_string_value(prev), a);
                        memcpy(buf + a, json_string_value(text), b);
                        json_object_set_new(pending, "reasoning_content", json_stringn(buf, a + b));
                    }
                    free(buf);
                    rc = buf ? 0 : THAW_ENOMEM;
                } else {
                    json_object_set(pending, "reasoning_content", text);
                }
            }
            json_decref(text);
            if (rc != 0)
                break;
        } else if (ty && strcmp(ty, "function_call") == 0) {
            json_t *id = json_object_get(item, "call_id"), *name = json_object_get(item, "name");
            json_t *args = json_object_get(item, "arguments");
            if (!json_is_string(id) || !json_is_string(name) || json_string_length(name) == 0 ||
                (args && !json_is_string(args))) {
                rc = fail(err, errlen, "%s (function_call) needs a string 'call_id', a non-empty 'name' and string "
                                       "'arguments'",
                          where);
                break;
            }
            json_t *a = assistant(&pending), *calls = a ? json_object_get(a, "tool_calls") : NULL;
            if (a && !calls)
                json_object_set_new(a, "tool_calls", calls = json_array());
            if (!calls || json_array_append_new(calls, json_pack("{s:O, s:s, s:{s:O, s:s}}", "id", id, "type",
                                                                 "function", "function", "name", name, "arguments",
                                                                 args ? json_string_value(args) : "{}")) != 0) {
                rc = THAW_ENOMEM;
                break;
            }
        } else if (ty && strcmp(ty, "function_call_output") == 0) {
            json_t *id = json_object_get(item, "call_id"), *text = NULL;
            char w2[80];
            snprintf(w2, sizeof w2, "%s.output", where);
            if (!json_is_string(id)) {
                rc = fail(err, errlen, "%s.call_id must be a string", where);
                break;
            }
            if ((rc = text_of(json_object_get(item, "output"), w2, &text, err, errlen)) != 0)
                break;
            if ((rc = flush(out, &pending)) != 0 ||
                json_array_append_new(out, json_pack("{s:s, s:O, s:o}", "role", "tool", "tool_call_id", id, "content",
                                                     text)) != 0) {
                rc = rc ? rc : THAW_ENOMEM;
                break;
            }
        } else if (ty && strcmp(ty, "item_reference") == 0) {
            rc = fail(err, errlen, "%s: 'item_reference' needs stored responses, which thaw does not keep: send the "
                                   "items themselves",
                      where);
            break;
        } else {
            rc = fail(err, errlen, "%s.type '%s' is not supported (message, reasoning, function_call, "
                                   "function_call_output)",
                      where, ty ? ty : "(none)");
            break;
        }
    }
    if (rc == 0)
        rc = flush(out, &pending);
    json_decref(pending);
    return rc;
}

/* One function tool into `out`: {type, name, description?, parameters?}. */
static int function_tool(json_t *t, const char *where, json_t *out, char *err, size_t errlen)
{
    json_t *name = json_object_get(t, "name"), *params = json_object_get(t, "parameters");
    json_t *desc = json_object_get(t, "description");

    if (!json_is_string(name) || json_string_length(name) == 0)
        return fail(err, errlen, "%s.name must be a non-empty string", where);
    if (params && !json_is_null(params) && !json_is_object(params))
        return fail(err, errlen, "%s.parameters must be a JSON schema object", where);
    if (desc && !json_is_null(desc) && !json_is_string(desc))
        return fail(err, errlen, "%s.description must be a string", where);
    json_t *fn = json_pack("{s:O}", "name", name);
    if (!fn)
        return THAW_ENOMEM;
    if (json_is_object(params))
        json_object_set(fn, "parameters", params);
    if (json_is_string(desc))
        json_object_set(fn, "description", desc);
    return json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function", fn)) == 0 ? 0
                                                                                                         : THAW_ENOMEM;
}

static int convert_tools(json_t *root, json_t *oai, char *err, size_t errlen)
{
    json_t *tools = json_object_get(root, "tools"), *t, *out, *v;
    size_t i, skipped = 0;
    int rc;

    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools))
            return fail(err, errlen, "'tools' must be an array");
        if (!(out = json_array()))
            return THAW_ENOMEM;
        json_object_set_new(oai, "tools", out);
        json_array_foreach(tools, i, t) {
            const char *ty = type_of(t);
            char where[48];
            snprintf(where, sizeof where, "tools[%zu]", i);
            if (!json_is_object(t) || !ty)
                return fail(err, errlen, "%s must be an object with a string 'type'", where);
            if (strcmp(ty, "function") == 0) {
                if ((rc = function_tool(t, where, out, err, errlen)) != 0)
                    return rc;
            } else if (strcmp(ty, "namespace") == 0) {
                /* Codex groups MCP servers' tools: each function is a tool */
                json_t *inner = json_object_get(t, "tools"), *f;
                size_t k;
                if (!json_is_array(inner))
                    return fail(err, errlen, "%s.tools must be an array", where);
                json_array_foreach(inner, k, f) {
                    char w2[80];
                    snprintf(w2, sizeof w2, "%s.tools[%zu]", where, k);
                    if (!json_is_object(f) || (type_of(f) && strcmp(type_of(f), "function") != 0)) {
                        skipped++;
                        continue;
                    }
                    if ((rc = function_tool(f, w2, out, err, errlen)) != 0)
                        return rc;
                }
            } else {
                skipped++; /* web_search, local_shell, custom, ...: no schema to render */
            }
        }
        if (skipped)
            LOG_INF("responses: %zu tool(s) of types other than function left out of the prompt", skipped);
        if (json_array_size(out) == 0)
            json_object_del(oai, "tools");
    }
    bool have_tools = json_object_get(oai, "tools") != NULL;
    if ((v = json_object_get(root, "tool_choice")) && !json_is_null(v)) {
        if (json_is_string(v)) {
            const char *c = json_string_value(v);
            if (strcmp(c, "auto") != 0 && strcmp(c, "none") != 0 && strcmp(c, "required") != 0)
                return fail(err, errlen, "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": "
                                         "\"function\", \"name\": ...}");
            if (have_tools || strcmp(c, "required") == 0)
                json_object_set(oai, "tool_choice", v);
        } else if (json_is_object(v) && type_of(v) && strcmp(type_of(v), "function") == 0 &&
                   json_is_string(json_object_get(v, "name"))) {
            json_object_set_new(oai, "tool_choice", json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name",
                                                              json_object_get(v, "name")));
        } else if (json_is_object(v) && type_of(v) && strcmp(type_of(v), "allowed_tools") != 0) {
            /* a hosted tool's choice (web_search_preview, ...): those are not rendered */
            if (!have_tools)
                return fail(err, errlen, "'tool_choice' type '%s' names a tool thaw does not run", type_of(v));
        } else {
            return fail(err, errlen, "'tool_choice' must be a string or {\"type\": \"function\", \"name\": ...}");
        }
    }
    if ((v = json_object_get(root, "parallel_tool_calls")) && !json_is_null(v)) {
        if (!json_is_boolean(v))
            return fail(err, errlen, "'parallel_tool_calls' must be true or false");
        if (have_tools)
            json_object_set(oai, "parallel_tool_calls", v);
    } else if (have_tools) {
        json_object_set_new(oai, "parallel_tool_calls", json_true()); /* the Responses API's default */
    }
    return 0;
}

static int convert_settings(json_t *root, json_t *oai, char *err, size_t errlen)
{
    json_t *v;

    if ((v = json_object_get(root, "store")) && json_is_true(v))
        return fail(err, errlen, "'store': true is not supported: thaw keeps no responses (send 'store': false and "
                                 "the whole input each turn)");
    if ((v = json_object_get(root, "previous_response_id")) && !json_is_null(v))
        return fail(err, errlen, "'previous_response_id' is not supported: thaw keeps no responses (send the whole "
                                 "input each turn; its cache makes that cheap)");
    if ((v = json_object_get(root, "conversation")) && !json_is_null(v))
        return fail(err, errlen, "'conversation' is not supported: thaw keeps no conversations (send the whole input)");
    if ((v = json_object_get(root, "background")) && json_is_true(v))
        return fail(err, errlen, "'background' is not supported");
    /* llama-server's own extras too: prompt_progress events, per-token timings */
    static const char *const copy[] = {"model",       "prompt_cache_key", "stream",           "temperature",
                                       "top_p",       "return_progress",  "timings_per_token"};
    for (size_t i = 0; i < sizeof copy / sizeof copy[0]; i++)
        if ((v = json_object_get(root, copy[i])) && !json_is_null(v))
            json_object_set(oai, copy[i], v); /* api.c checks each */
    if ((v = json_object_get(root, "max_output_tokens")) && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > (1 << 30))
            return fail(err, errlen, "'max_output_tokens' must be an integer of at least 1");
        json_object_set(oai, "max_tokens", v);
    }
    /* reasoning.effort: the template's reasoning_effort ("none": thinking
     * off), as a chat completion's reasoning_effort; summary is not made */
    json_t *rs = json_object_get(root, "reasoning");
    if (rs && !json_is_null(rs)) {
        if (!json_is_object(rs))
            return fail(err, errlen, "'reasoning' must be an object");
        json_t *eff = json_object_get(rs, "effort");
        if (eff && !json_is_null(eff)) {
            if (!json_is_string(eff) || json_string_length(eff) == 0)
                return fail(err, errlen, "'reasoning.effort' must be a string (none, minimal, low, medium, high, xhigh)");
            json_object_set(oai, "reasoning_effort", eff);
        }
    }
    json_t *text = json_object_get(root, "text");
    if (text && !json_is_null(text)) {
        json_t *fmt = json_object_get(text, "format");
        if (!json_is_object(text))
            return fail(err, errlen, "'text' must be an object");
        if (fmt && !json_is_null(fmt)) {
            const char *ty = type_of(fmt);
            if (!ty)
                return fail(err, errlen, "'text.format' must be an object with a string 'type'");
            if (strcmp(ty, "json_schema") == 0) {
                json_t *schema = json_object_get(fmt, "schema");
                if (!json_is_object(schema))
                    return fail(err, errlen, "'text.format.schema' must be a JSON schema object");
                json_object_set_new(oai, "response_format",
                                    json_pack("{s:s, s:{s:O}}", "type", "json_schema", "json_schema", "schema", schema));
            } else if (strcmp(ty, "json_object") == 0) {
                json_object_set_new(oai, "response_format", json_pack("{s:s}", "type", "json_object"));
            } else if (strcmp(ty, "text") != 0) {
                return fail(err, errlen, "'text.format.type' '%s' is not one of text, json_schema, json_object", ty);
            }
        }
    }
    return 0;
}

static int convert(json_t *root, json_t *oai, char *err, size_t errlen)
{
    int rc;

    if ((rc = convert_settings(root, oai, err, errlen)) != 0 ||
        (rc = convert_input(root, oai, err, errlen)) != 0 ||
        (rc = convert_tools(root, oai, err, errlen)) != 0)
        return rc;
    return 0;
}

int thaw_responses_parse(const char *body, size_t len, bool default_cache_prompt, struct thaw_chat_request *out,
                         char *err, size_t errlen)
{
    return thaw_api_parse_via_chat(body, len, default_cache_prompt, convert, out, err, errlen);
}

/* ---- responses -------------------------------------------------------------------- */

void thaw_responses_item_id(const char *id, const char *kind, int index, char out[64])
{
    const char *u = strchr(id, '_');

    /* ids are the id_prefix and 24 hex digits: 40 bytes of them is more than enough */
    snprintf(out, 64, "%.3s_%.40s_%d", kind, u ? u + 1 : id, index);
}

char *thaw_responses_json(const char *id, const char *model, long created, const char *message_json,
                          const char *finish_reason, int n_prompt, const struct thaw_timings *t)
{
    json_error_t jerr;
    json_t *msg = message_json ? json_loads(message_json, 0, &jerr) : NULL, *output = json_array(), *v, *c;
    char iid[64];
    size_t i;

    if ((message_json && !msg) || !output) {
        json_decref(msg);
        json_decref(output);
        return NULL;
    }
    if ((v = json_object_get(msg, "reasoning_content")) && json_string_length(v) > 0) {
        thaw_responses_item_id(id, "rs", (int)json_array_size(output), iid);
        json_array_append_new(output, json_pack("{s:s, s:s, s:[], s:[{s:s, s:O}]}", "type", "reasoning", "id", iid,
                                                "summary", "content", "type", "reasoning_text", "text", v));
    }
    if ((v = json_object_get(msg, "content")) && json_string_length(v) > 0) {
        thaw_responses_item_id(id, "msg", (int)json_array_size(output), iid);
        json_array_append_new(output,
                              json_pack("{s:s, s:s, s:s, s:s, s:[{s:s, s:O, s:[]}]}", "type", "message", "id", iid,
                                        "status", "completed", "role", "assistant", "content", "type", "output_text",
                                        "text", v, "annotations"));
    }
    json_array_foreach(json_object_get(msg, "tool_calls"), i, c) {
        json_t *fn = json_object_get(c, "function");
        thaw_responses_item_id(id, "fc", (int)json_array_size(output), iid);
        json_array_append_new(output, json_pack("{s:s, s:s, s:O, s:O, s:O, s:s}", "type", "function_call", "id", iid,
                                                "call_id", json_object_get(c, "id"), "name",
                                                json_object_get(fn, "name"), "arguments",
                                                json_object_get(fn, "arguments"), "status", "completed"));
    }
    bool done = msg != NULL, cut = done && finish_reason && strcmp(finish_reason, "length") == 0;
    json_t *r = json_pack("{s:s, s:s, s:I, s:s, s:s, s:o, s:n, s:n, s:b, s:s, s:{}}", "id", id, "object", "response",
                          "created_at", (json_int_t)created, "model", model, "status",
                          !done ? "in_progress" : cut ? "incomplete" : "completed", "output", output,
                          "previous_response_id", "error", "store", false, "truncation", "disabled", "metadata");
    if (r) {
        json_object_set_new(r, "incomplete_details",
                            cut ? json_pack("{s:s}", "reason", "max_output_tokens") : json_null());
        json_object_set_new(r, "usage",
                            done ? json_pack("{s:i, s:{s:i}, s:i, s:{s:i}, s:i}", "input_tokens", n_prompt,
                                             "input_tokens_details", "cached_tokens", t->cache_n, "output_tokens",
                                             t->predicted_n, "output_tokens_details", "reasoning_tokens", 0,
                                             "total_tokens", n_prompt + t->predicted_n)
                                 : json_null());
    }
    json_decref(msg);
    return thaw_api_dump(r);
}

/* ---- the codec -------------------------------------------------------------------- */

#undef fail /* the table's field of that name */

static char *responses_reply(const struct thaw_reply *r)
{
    return thaw_responses_json(r->id, r->model, r->created, r->message_json, r->finish_reason, r->n_prompt,
                               r->timings);
}

/* One event: its type is both the event: line and data.type, and every
 * event carries the stream's sequence_number. Takes `v`. */
static int r_emit(struct thaw_codec_stream *st, const char *type, json_t *v)
{
    if (!v)
        return THAW_ENOMEM;
    json_object_set_new(v, "type", json_string(type));
    json_object_set_new(v, "sequence_number", json_integer(st->seq++));
    return thaw_codec_emit(st, type, v);
}

/* An event `v` (taken) with llama-server's "timings" so far, when the
 * request asked timings_per_token. */
static json_t *r_timed(const struct thaw_codec_stream *st, json_t *v)
{
    if (v)
        thaw_codec_live_timings(st, v);
    return v;
}

/* The response object: in progress until the stream closes. */
static json_t *r_response(struct thaw_codec_stream *st)
{
    static const struct thaw_timings none;
    const struct thaw_reply *r = st->reply;

    if (!r)
        return thaw_codec_loads(thaw_responses_json(st->id, st->model, st->created, NULL, NULL, st->n_prompt, &none));
    return thaw_codec_loads(thaw_responses_json(st->id, st->model, st->created,
                                                r->message_json ? r->message_json : "{}", r->finish_reason,
                                                r->n_prompt, r->timings));
}

static int resp_open(struct thaw_codec_stream *st)
{
    json_t *r = r_response(st);
    int rc;

    if (!r)
        return THAW_ENOMEM;
    rc = r_emit(st, "response.created", json_pack("{s:O}", "response", r));
    if (rc == 0)
        rc = r_emit(st, "response.in_progress", json_pack("{s:O}", "response", r));
    json_decref(r);
    return rc;
}

static void r_item_id(struct thaw_codec_stream *st, char out[64])
{
    static const char *const kind[] = {
        [THAW_CODEC_PART_NONE] = "",
        [THAW_CODEC_PART_TEXT] = "msg",
        [THAW_CODEC_PART_THINKING] = "rs",
        [THAW_CODEC_PART_TOOL] = "fc",
    };

    thaw_responses_item_id(st->id, kind[st->part], st->n_parts - 1, out);
}

/* The open item, complete: as output_item.done and the final response name it. */
static json_t *r_item_done(struct thaw_codec_stream *st)
{
    const char *text = st->acc ? st->acc : "";
    char id[64];

    r_item_id(st, id);
    if (st->part == THAW_CODEC_PART_THINKING)
        return json_pack("{s:s, s:s, s:[], s:[{s:s, s:s}]}", "type", "reasoning", "id", id, "summary", "content",
                         "type", "reasoning_text", "text", text);
    if (st->part == THAW_CODEC_PART_TEXT)
        return json_pack("{s:s, s:s, s:s, s:s, s:[{s:s, s:s, s:[]}]}", "type", "message", "id", id, "status",
                         "completed", "role", "assistant", "content", "type", "output_text", "text", text,
                         "annotations");
    return json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "type", "function_call", "id", id, "call_id",
                     st->call_id ? st->call_id : "", "name", st->call_name ? st->call_name : "", "arguments", text,
                     "status", "completed");
}

static int resp_item_stop(struct thaw_codec_stream *st)
{
    int idx = st->n_parts - 1, rc = 0;
    const char *text = st->acc ? st->acc : "";
    char id[64];

    if (st->part == THAW_CODEC_PART_NONE)
        return 0;
    r_item_id(st, id);
    if (st->part == THAW_CODEC_PART_THINKING) {
        rc = r_emit(st, "response.reasoning_text.done",
                    json_pack("{s:s, s:i, s:i, s:s}", "item_id", id, "output_index", idx, "content_index", 0, "text",
                              text));
    } else if (st->part == THAW_CODEC_PART_TEXT) {
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
        rc = r_emit(st, "response.output_item.done",
                    json_pack("{s:i, s:o}", "output_index", idx, "item", r_item_done(st)));
    st->part = THAW_CODEC_PART_NONE;
    thaw_codec_part_reset(st);
    return rc;
}

/* Makes `kind` the open item, announcing it (and a message's text part). */
static int resp_item_start(struct thaw_codec_stream *st, int kind, const char *call_id, const char *name)
{
    int rc = resp_item_stop(st), idx;
    char id[64];
    json_t *item;

    if (rc != 0)
        return rc;
    st->part = kind;
    idx = st->n_parts++;
    r_item_id(st, id);
    if (kind == THAW_CODEC_PART_TOOL && (!(st->call_id = strdup(call_id)) || !(st->call_name = strdup(name))))
        return THAW_ENOMEM;
    if (kind == THAW_CODEC_PART_THINKING)
        item = json_pack("{s:s, s:s, s:[], s:[]}", "type", "reasoning", "id", id, "summary", "content");
    else if (kind == THAW_CODEC_PART_TEXT)
        item = json_pack("{s:s, s:s, s:s, s:s, s:[]}", "type", "message", "id", id, "status", "in_progress", "role",
                         "assistant", "content");
    else
        item = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "type", "function_call", "id", id, "call_id", call_id,
                         "name", name, "arguments", "", "status", "in_progress");
    rc = r_emit(st, "response.output_item.added", json_pack("{s:i, s:o}", "output_index", idx, "item", item));
    if (rc == 0 && kind == THAW_CODEC_PART_TEXT)
        rc = r_emit(st, "response.content_part.added",
                    json_pack("{s:s, s:i, s:i, s:{s:s, s:s, s:[]}}", "item_id", id, "output_index", idx,
                              "content_index", 0, "part", "type", "output_text", "text", "", "annotations"));
    return rc;
}

static int resp_delta(struct thaw_codec_stream *st, json_t *diff)
{
    json_t *v;
    char id[64];
    int rc = 0;

    if ((v = json_object_get(diff, "reasoning_content")) && json_string_length(v) > 0) {
        if (st->part != THAW_CODEC_PART_THINKING)
            rc = resp_item_start(st, THAW_CODEC_PART_THINKING, NULL, NULL);
        if (rc == 0 && (rc = thaw_codec_part_add(st, v)) == 0) {
            r_item_id(st, id);
            rc = r_emit(st, "response.reasoning_text.delta",
                        r_timed(st, json_pack("{s:s, s:i, s:i, s:O}", "item_id", id, "output_index",
                                              st->n_parts - 1, "content_index", 0, "delta", v)));
        }
    }
    if (rc == 0 && (v = json_object_get(diff, "content")) && json_string_length(v) > 0) {
        if (st->part != THAW_CODEC_PART_TEXT)
            rc = resp_item_start(st, THAW_CODEC_PART_TEXT, NULL, NULL);
        if (rc == 0 && (rc = thaw_codec_part_add(st, v)) == 0) {
            r_item_id(st, id);
            rc = r_emit(st, "response.output_text.delta",
                        r_timed(st, json_pack("{s:s, s:i, s:i, s:O, s:[]}", "item_id", id, "output_index",
                                              st->n_parts - 1, "content_index", 0, "delta", v, "logprobs")));
        }
    }
    if (rc == 0 && (v = json_object_get(diff, "tool_call_index"))) {
        long index = (long)json_integer_value(v);
        json_t *cid = json_object_get(diff, "id"), *name = json_object_get(diff, "name");
        json_t *args = json_object_get(diff, "arguments");
        if (st->part != THAW_CODEC_PART_TOOL || st->tool_index != index) {
            rc = resp_item_start(st, THAW_CODEC_PART_TOOL, json_is_string(cid) ? json_string_value(cid) : "",
                                 json_is_string(name) ? json_string_value(name) : "");
            st->tool_index = index;
        }
        if (rc == 0 && json_string_length(args) > 0 && (rc = thaw_codec_part_add(st, args)) == 0) {
            r_item_id(st, id);
            rc = r_emit(st, "response.function_call_arguments.delta",
                        r_timed(st, json_pack("{s:s, s:i, s:O}", "item_id", id, "output_index", st->n_parts - 1,
                                              "delta", args)));
        }
    }
    return rc;
}

static int resp_close(struct thaw_codec_stream *st)
{
    int rc = resp_item_stop(st);
    json_t *r = rc == 0 ? r_response(st) : NULL;

    if (rc != 0)
        return rc;
    /* response.completed also for a reply cut at max_output_tokens (its
     * status says "incomplete"): what Codex and the SDKs wait for; with
     * llama-server's "timings" beside the response, as its /completion's */
    json_t *ev = r ? json_pack("{s:o}", "response", r) : NULL;
    if (ev && thaw_api_set_timings(ev, st->reply->timings) != 0) {
        json_decref(ev);
        ev = NULL;
    }
    return ev ? r_emit(st, "response.completed", ev) : THAW_ENOMEM;
}

/* llama-server's prompt_progress rides a response.in_progress event */
static int resp_progress(struct thaw_codec_stream *st, int processed, int64_t time_us, int cache_n)
{
    json_t *r = r_response(st), *ev = r ? json_pack("{s:o, s:s, s:i}", "response", r, "type",
                                                    "response.in_progress", "sequence_number", st->seq++)
                                         : NULL;

    return ev ? thaw_codec_emit_progress(st, "response.in_progress", ev, processed, time_us, cache_n)
              : THAW_ENOMEM;
}

static int resp_fail(struct thaw_codec_stream *st, int status, const char *message)
{
    char code[16];

    snprintf(code, sizeof code, "%d", status);
    return r_emit(st, "error", json_pack("{s:s, s:s, s:n}", "code", code, "message", message, "param"));
}

const struct thaw_codec thaw_codec_responses = {
    .name = "responses",
    .id_prefix = "resp_",
    .auth_hint = THAW_API_AUTH_HINT,
    .caps = 0,
    .parse = thaw_responses_parse,
    .error_json = thaw_api_error_json,
    .too_long_json = thaw_api_too_long_json,
    .reply = responses_reply,
    .merge_choice = NULL,
    .open = resp_open,
    .progress = resp_progress,
    .delta = resp_delta,
    .close = resp_close,
    .fail = resp_fail,
};
