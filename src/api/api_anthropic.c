/* api_anthropic.c — the Anthropic Messages codec.
 *
 * A request is translated into a chat-completions body (jansson), which
 * api.c's parser then validates and normalises exactly as it does
 * OpenAI's: one normal form for the template and the keys, whichever API
 * carried the conversation. Every Anthropic field is checked here first,
 * so a client's 400 names the field it sent.
 *
 * Map:
 *   ---- request ----    system, messages and their blocks, tools, settings
 *   ---- responses ----  message, usage, errors, signatures
 *   ---- the codec ----  the table; the stream: message_start, content blocks
 *                        (text, thinking with its signature, tool_use), message_delta/stop
 */
#include "api/api_anthropic.h"

#include "api/api_wire.h"
#include "api/codec.h"

#include "base/error.h"
#include "base/fmt.h"
#include "base/log.h"
#include "base/utf8.h"

#include <jansson.h>
#include <math.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- request ---------------------------------------------------------------------- */

#define fail thaw_api_fail /* the short name this file's checks use */

static bool is_type(json_t *block, const char *type)
{
    json_t *t = json_object_get(block, "type");

    return json_is_string(t) && strcmp(json_string_value(t), type) == 0;
}

/* Appends `s` to *acc (a jansson string or NULL), joined by `sep`. */
static int append_text(json_t **acc, const char *s, size_t n, const char *sep)
{
    if (!*acc) {
        *acc = json_stringn(s, n);
        return *acc ? 0 : THAW_ENOMEM;
    }
    size_t have = json_string_length(*acc), ns = strlen(sep);
    char *buf = malloc(have + ns + n + 1);
    if (!buf)
        return THAW_ENOMEM;
    memcpy(buf, json_string_value(*acc), have);
    memcpy(buf + have, sep, ns);
    memcpy(buf + have + ns, s, n);
    int rc = json_string_setn_nocheck(*acc, buf, have + ns + n) == 0 ? 0 : THAW_ENOMEM;
    free(buf);
    return rc;
}

/* An image block ({"type": "image", "source": {"type": "base64",
 * "media_type", "data"}}) as the chat-completions part api.c reads (an
 * image_url with a data: URL). A "url" source is refused here, by this
 * API's field names: thaw fetches nothing. 0, THAW_EINVAL or THAW_ENOMEM. */
static int image_part(json_t *b, const char *where, size_t k, json_t **out, char *err, size_t errlen)
{
    json_t *src = json_object_get(b, "source");
    json_t *ty = json_object_get(src, "type"), *mt = json_object_get(src, "media_type"),
           *data = json_object_get(src, "data");

    *out = NULL;
    if (!json_is_object(src) || !json_is_string(ty))
        return fail(err, errlen, "%s[%zu].source must be an object with a string 'type'", where, k);
    if (strcmp(json_string_value(ty), "base64") != 0)
        return fail(err, errlen, "%s[%zu].source.type '%s' is not supported: send the image as base64 (thaw "
                                 "fetches no URLs)", where, k, json_string_value(ty));
    if (!json_is_string(mt) || !json_is_string(data))
        return fail(err, errlen, "%s[%zu].source needs string 'media_type' and 'data'", where, k);
    size_t n = json_string_length(mt) + json_string_length(data) + 16;
    char *url = malloc(n);
    if (!url)
        return THAW_ENOMEM;
    snprintf(url, n, "data:%s;base64,%s", json_string_value(mt), json_string_value(data));
    *out = json_pack("{s:s, s:{s:s}}", "type", "image_url", "image_url", "url", url);
    free(url);
    return *out ? 0 : THAW_ENOMEM;
}

/* Moves the text gathered so far (*text, may be NULL) into `parts` as a
 * text part. 0 or THAW_ENOMEM. */
static int flush_text(json_t *parts, json_t **text)
{
    int rc = 0;

    if (*text)
        rc = json_array_append_new(parts, json_pack("{s:s, s:O}", "type", "text", "text", *text)) == 0 ? 0
                                                                                                       : THAW_ENOMEM;
    json_decref(*text);
    *text = NULL;
    return rc;
}

/* Text of a content field that may be a string or text blocks (system,
 * tool_result): blocks joined by `sep`; NULL *out for none. */
static int text_of(json_t *content, const char *where, const char *sep, bool drop_billing, json_t **out, char *err,
                   size_t errlen);

/* A tool_result's content: its text as text_of gives it, or, when it
 * holds image blocks, chat-completions parts (text and image_url) in
 * order. */
static int tool_result_content(json_t *content, const char *where, json_t **out, char *err, size_t errlen)
{
    json_t *b, *text = NULL, *parts = NULL;
    size_t k;
    bool images = false;
    int rc;

    if (json_is_array(content))
        json_array_foreach(content, k, b)
            images |= is_type(b, "image");
    if (!images)
        return text_of(content, where, "", false, out, err, errlen);
    *out = NULL;
    if (!(parts = json_array()))
        return THAW_ENOMEM;
    json_array_foreach(content, k, b) {
        json_t *part = NULL, *t = json_object_get(b, "text");
        if (is_type(b, "image")) {
            if ((rc = flush_text(parts, &text)) != 0 || (rc = image_part(b, where, k, &part, err, errlen)) != 0 ||
                (rc = json_array_append_new(parts, part) == 0 ? 0 : THAW_ENOMEM) != 0)
                goto fail;
        } else if (is_type(b, "text") && json_is_string(t)) {
            if ((rc = append_text(&text, json_string_value(t), json_string_length(t), "")) != 0)
                goto fail;
        } else {
            rc = fail(err, errlen, "%s[%zu] must be a text or image block", where, k);
            goto fail;
        }
    }
    if ((rc = flush_text(parts, &text)) != 0)
        goto fail;
    *out = parts;
    return 0;
fail:
    json_decref(text);
    json_decref(parts);
    return rc;
}

static int text_of(json_t *content, const char *where, const char *sep, bool drop_billing, json_t **out, char *err,
                   size_t errlen)
{
    static atomic_bool billing_logged;
    size_t i;
    json_t *b;

    *out = NULL;
    if (!content || json_is_null(content))
        return 0;
    if (json_is_string(content)) {
        *out = json_incref(content);
        return 0;
    }
    if (!json_is_array(content))
        return fail(err, errlen, "%s must be a string or an array of content blocks", where);
    json_array_foreach(content, i, b) {
        json_t *text = json_object_get(b, "text");
        if (!json_is_object(b) || !json_is_string(json_object_get(b, "type")))
            return fail(err, errlen, "%s[%zu] must be an object with a string 'type'", where, i);
        if (!is_type(b, "text")) {
            json_decref(*out);
            *out = NULL;
            return fail(err, errlen, "%s[%zu].type '%s' is not supported here (only 'text'%s)", where, i,
                        json_string_value(json_object_get(b, "type")),
                        is_type(b, "image") || is_type(b, "document") ? ": the model reads text only" : "");
        }
        if (!json_is_string(text)) {
            json_decref(*out);
            *out = NULL;
            return fail(err, errlen, "%s[%zu].text must be a string", where, i);
        }
        /* Claude Code's first system block differs per conversation (a hash
         * of its first message): rendered, it would end every shared prefix
         * at token one */
        if (drop_billing && strncmp(json_string_value(text), THAW_ANTHROPIC_BILLING_PREFIX,
                                    strlen(THAW_ANTHROPIC_BILLING_PREFIX)) == 0) {
            if (!atomic_exchange(&billing_logged, true))
                LOG_INF("anthropic: the system block '%s ...' is left out of the prompt (it varies per "
                        "conversation; logged once)",
                        THAW_ANTHROPIC_BILLING_PREFIX);
            continue;
        }
        if (append_text(out, json_string_value(text), json_string_length(text), sep) != 0) {
            json_decref(*out);
            *out = NULL;
            return THAW_ENOMEM;
        }
    }
    return 0;
}

static json_t *message(const char *role, json_t *content /* taken, may be NULL */)
{
    json_t *m = json_pack("{s:s}", "role", role);

    if (m)
        json_object_set_new(m, "content", content ? content : json_string(""));
    else
        json_decref(content);
    return m;
}

/* One user message: tool_result blocks become tool messages (in order),
 * the text blocks one user message after them. */
static int user_message(json_t *content, size_t i, json_t *out, char *err, size_t errlen)
{
    char where[64];
    json_t *text = NULL, *b, *parts = NULL; /* parts: once an image is met, the message's parts in order */
    size_t k;
    int rc;

    snprintf(where, sizeof where, "messages[%zu].content", i);
    if (json_is_string(content))
        return json_array_append_new(out, message("user", json_incref(content))) == 0 ? 0 : THAW_ENOMEM;
    if (!json_is_array(content))
        return fail(err, errlen, "%s must be a string or an array of content blocks", where);
    json_array_foreach(content, k, b) {
        if (!json_is_object(b) || !json_is_string(json_object_get(b, "type"))) {
            rc = fail(err, errlen, "%s[%zu] must be an object with a string 'type'", where, k);
            goto out;
        }
        if (is_type(b, "text")) {
            json_t *t = json_object_get(b, "text");
            if (!json_is_string(t)) {
                rc = fail(err, errlen, "%s[%zu].text must be a string", where, k);
                goto out;
            }
            if ((rc = append_text(&text, json_string_value(t), json_string_length(t), "")) != 0)
                goto out;
        } else if (is_type(b, "tool_result")) {
            json_t *id = json_object_get(b, "tool_use_id"), *res = NULL;
            char w2[96];
            snprintf(w2, sizeof w2, "%s[%zu].content", where, k);
            if (!json_is_string(id) || json_string_length(id) == 0) {
                rc = fail(err, errlen, "%s[%zu].tool_use_id must be a non-empty string", where, k);
                goto out;
            }
            if ((rc = tool_result_content(json_object_get(b, "content"), w2, &res, err, errlen)) != 0)
                goto out;
            json_t *tm = message("tool", res);
            if (!tm || json_object_set(tm, "tool_call_id", id) != 0 || json_array_append_new(out, tm) != 0) {
                rc = THAW_ENOMEM;
                goto out;
            }
        } else if (is_type(b, "image")) {
            json_t *part;
            if (!parts && !(parts = json_array())) {
                rc = THAW_ENOMEM;
                goto out;
            }
            if ((rc = flush_text(parts, &text)) != 0 || (rc = image_part(b, where, k, &part, err, errlen)) != 0)
                goto out;
            if (json_array_append_new(parts, part) != 0) {
                rc = THAW_ENOMEM;
                goto out;
            }
        } else {
            const char *ty = json_string_value(json_object_get(b, "type"));
            rc = fail(err, errlen, "%s[%zu].type '%s' is not supported in a user message (text, image, tool_result)%s",
                      where, k, ty, strcmp(ty, "document") == 0 ? ": the model reads text and images only" : "");
            goto out;
        }
    }
    rc = 0;
    if (parts) {
        if ((rc = flush_text(parts, &text)) == 0) {
            rc = json_array_append_new(out, message("user", parts)) == 0 ? 0 : THAW_ENOMEM;
            parts = NULL; /* taken by message() */
        }
    } else if (text || json_array_size(content) == 0) {
        rc = json_array_append_new(out, message("user", text)) == 0 ? 0 : THAW_ENOMEM;
        text = NULL;
    }
out:
    json_decref(text);
    json_decref(parts);
    return rc;
}

/* One assistant message: text -> content, thinking -> reasoning_content,
 * tool_use -> tool_calls (input encoded compactly, key order kept: the
 * reply was keyed with its arguments as generated, which the parser gives
 * in the same compact form). */
static int assistant_message(json_t *content, size_t i, json_t *out, char *err, size_t errlen)
{
    char where[64];
    json_t *text = NULL, *thinking = NULL, *calls = NULL, *b, *m = NULL;
    size_t k;
    int rc = THAW_ENOMEM;

    snprintf(where, sizeof where, "messages[%zu].content", i);
    if (json_is_string(content))
        return json_array_append_new(out, message("assistant", json_incref(content))) == 0 ? 0 : THAW_ENOMEM;
    if (!json_is_array(content))
        return fail(err, errlen, "%s must be a string or an array of content blocks", where);
    json_array_foreach(content, k, b) {
        if (!json_is_object(b) || !json_is_string(json_object_get(b, "type"))) {
            rc = fail(err, errlen, "%s[%zu] must be an object with a string 'type'", where, k);
            goto out;
        }
        if (is_type(b, "text") || is_type(b, "thinking")) {
            bool th = is_type(b, "thinking");
            json_t *t = json_object_get(b, th ? "thinking" : "text");
            if (!json_is_string(t)) {
                rc = fail(err, errlen, "%s[%zu].%s must be a string", where, k, th ? "thinking" : "text");
                goto out;
            }
            if ((rc = append_text(th ? &thinking : &text, json_string_value(t), json_string_length(t), "")) != 0)
                goto out;
        } else if (is_type(b, "redacted_thinking")) {
            continue; /* opaque, and never thaw's: nothing to render */
        } else if (is_type(b, "tool_use")) {
            json_t *id = json_object_get(b, "id"), *name = json_object_get(b, "name"), *input = json_object_get(b, "input");
            if (!json_is_string(id) || !json_is_string(name) || json_string_length(name) == 0) {
                rc = fail(err, errlen, "%s[%zu] (tool_use) needs a string 'id' and a non-empty 'name'", where, k);
                goto out;
            }
            if (input && !json_is_null(input) && !json_is_object(input)) {
                rc = fail(err, errlen, "%s[%zu].input must be an object", where, k);
                goto out;
            }
            char *args = input && !json_is_null(input) ? json_dumps(input, JSON_COMPACT) : strdup("{}");
            json_t *call = args ? json_pack("{s:O, s:s, s:{s:O, s:s}}", "id", id, "type", "function", "function",
                                            "name", name, "arguments", args)
                                : NULL;
            free(args);
            if (!call || (!calls && !(calls = json_array())) || json_array_append_new(calls, call) != 0) {
                rc = THAW_ENOMEM;
                goto out;
            }
        } else {
            rc = fail(err, errlen, "%s[%zu].type '%s' is not supported in an assistant message (text, thinking, "
                                   "tool_use)",
                      where, k, json_string_value(json_object_get(b, "type")));
            goto out;
        }
    }
    m = message("assistant", text ? text : json_null());
    text = NULL; /* taken by message() */
    if (!m)
        goto out;
    if (thinking)
        json_object_set(m, "reasoning_content", thinking);
    if (calls)
        json_object_set(m, "tool_calls", calls);
    rc = json_array_append_new(out, m) == 0 ? 0 : THAW_ENOMEM;
out:
    json_decref(text);
    json_decref(thinking);
    json_decref(calls);
    return rc;
}

/* A user message that is Claude Code's max-tokens recovery prompt (its
 * text, as a string or text blocks, begins with the prefix). */
static bool is_recovery(json_t *m)
{
    json_t *content = json_object_get(m, "content"), *b;
    const char *role = json_string_value(json_object_get(m, "role")), *text = json_string_value(content);
    size_t n = strlen(THAW_ANTHROPIC_RECOVERY_PREFIX);

    if (!role || strcmp(role, "user") != 0)
        return false;
    if (json_is_array(content)) {
        if (json_array_size(content) != 1 || !is_type(b = json_array_get(content, 0), "text"))
            return false;
        text = json_string_value(json_object_get(b, "text"));
    }
    return text && strncmp(text, THAW_ANTHROPIC_RECOVERY_PREFIX, n) == 0;
}

/* cache_control marks (prompt caching): per ttl (5 minutes, 1 hour), how
 * many of the converted messages the furthest mark covers, -1 for none;
 * handed on as retention hints (THAW_API_RETAIN_KEY). */
struct marks {
    int n_msgs[2];
};

/* b's cache_control: *ttl_s 0 (none), 300 or 3600; 0 or a 400. */
static int cache_mark(json_t *b, const char *where, int *ttl_s, char *err, size_t errlen)
{
    json_t *cc = json_object_get(b, "cache_control"), *ttl;

    *ttl_s = 0;
    if (!json_is_object(b) || !cc || json_is_null(cc))
        return 0;
    if (!json_is_object(cc) || !is_type(cc, "ephemeral"))
        return fail(err, errlen, "%s.cache_control must be {\"type\": \"ephemeral\"}, with an optional \"ttl\"",
                    where);
    ttl = json_object_get(cc, "ttl");
    if (!ttl || json_is_null(ttl) || (json_is_string(ttl) && strcmp(json_string_value(ttl), "5m") == 0))
        *ttl_s = 300;
    else if (json_is_string(ttl) && strcmp(json_string_value(ttl), "1h") == 0)
        *ttl_s = 3600;
    else
        return fail(err, errlen, "%s.cache_control.ttl must be \"5m\" or \"1h\"", where);
    return 0;
}

/* Every mark on `v` (a block, or an array of blocks, tool_result blocks'
 * own content included) covers the first n_msgs converted messages. */
static int note_marks(json_t *v, const char *where, int n_msgs, struct marks *mk, char *err, size_t errlen)
{
    char w[128];
    json_t *b;
    size_t k;
    int ttl, rc;

    if (json_is_array(v)) {
        json_array_foreach(v, k, b) {
            snprintf(w, sizeof w, "%s[%zu]", where, k);
            if ((rc = note_marks(b, w, n_msgs, mk, err, errlen)) != 0)
                return rc;
        }
        return 0;
    }
    if ((rc = cache_mark(v, where, &ttl, err, errlen)) != 0)
        return rc;
    if (ttl && n_msgs > mk->n_msgs[ttl == 3600])
        mk->n_msgs[ttl == 3600] = n_msgs;
    if (json_is_object(v) && is_type(v, "tool_result") && json_is_array(json_object_get(v, "content"))) {
        snprintf(w, sizeof w, "%s.content", where);
        return note_marks(json_object_get(v, "content"), w, n_msgs, mk, err, errlen);
    }
    return 0;
}

static int convert_messages(json_t *root, json_t *oai, struct marks *mk, char *err, size_t errlen)
{
    json_t *msgs = json_object_get(root, "messages"), *out = json_array(), *sys = NULL, *m;
    size_t i;
    int rc;

    if (!out)
        return THAW_ENOMEM;
    json_object_set_new(oai, "messages", out);
    if (!msgs)
        return fail(err, errlen, "'messages' is required");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return fail(err, errlen, "'messages' must be a non-empty array");
    if ((rc = text_of(json_object_get(root, "system"), "system", "\n\n", true, &sys, err, errlen)) != 0)
        return rc;
    if (sys && json_array_append_new(out, message("system", sys)) != 0)
        return THAW_ENOMEM;
    if ((rc = note_marks(json_object_get(root, "system"), "system", (int)json_array_size(out), mk, err, errlen)) != 0)
        return rc;
    json_array_foreach(msgs, i, m) {
        json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
        if (!json_is_object(m) || !json_is_string(role))
            return fail(err, errlen, "messages[%zu] must be an object with a string 'role'", i);
        const char *r = json_string_value(role);
        if (i + 1 < json_array_size(msgs) && is_recovery(m)) {
            static atomic_bool recovery_logged;
            if (!atomic_exchange(&recovery_logged, true))
                LOG_INF("anthropic: Claude Code's '%s ...' prompts before the last message are left out of the "
                        "prompt (it records none: later requests carry the cut replies back to back; logged once)",
                        THAW_ANTHROPIC_RECOVERY_PREFIX);
            continue;
        }
        if (!content && strcmp(r, "assistant") != 0)
            return fail(err, errlen, "messages[%zu].content is required", i);
        if (strcmp(r, "user") == 0) {
            rc = user_message(content, i, out, err, errlen);
        } else if (strcmp(r, "assistant") == 0) {
            rc = content ? assistant_message(content, i, out, err, errlen)
                         : json_array_append_new(out, message("assistant", NULL)) == 0 ? 0 : THAW_ENOMEM;
        } else if (strcmp(r, "system") == 0) {
            char where[48];
            json_t *t = NULL;
            snprintf(where, sizeof where, "messages[%zu].content", i);
            if ((rc = text_of(content, where, "\n\n", false, &t, err, errlen)) == 0 &&
                json_array_append_new(out, message("system", t)) != 0)
                rc = THAW_ENOMEM;
        } else {
            rc = fail(err, errlen, "messages[%zu].role '%s' is not one of user, assistant, system", i, r);
        }
        if (rc != 0)
            return rc;
        char where[48];
        snprintf(where, sizeof where, "messages[%zu].content", i);
        if ((rc = note_marks(content, where, (int)json_array_size(out), mk, err, errlen)) != 0)
            return rc;
    }
    return 0;
}

/* The marks on the tools (they render before every message: they cover
 * none) and the request's own (Anthropic's automatic caching: all of it),
 * then every mark into oai as retention hints. */
static int convert_marks(json_t *root, json_t *oai, struct marks *mk, char *err, size_t errlen)
{
    json_t *tools = json_object_get(root, "tools"), *list;
    int rc, ttl;

    if (json_is_array(tools) && (rc = note_marks(tools, "tools", 0, mk, err, errlen)) != 0)
        return rc;
    if ((rc = cache_mark(root, "request", &ttl, err, errlen)) != 0)
        return rc;
    if (ttl)
        mk->n_msgs[ttl == 3600] = (int)json_array_size(json_object_get(oai, "messages"));
    if (mk->n_msgs[0] < 0 && mk->n_msgs[1] < 0)
        return 0;
    if (!(list = json_array()) || json_object_set_new(oai, THAW_API_RETAIN_KEY, list) != 0)
        return THAW_ENOMEM;
    for (int k = 1; k >= 0; k--) /* the longer ttl first */
        if (mk->n_msgs[k] >= 0 && json_array_append_new(list, json_pack("[i, i]", mk->n_msgs[k], k ? 3600 : 300)) != 0)
            return THAW_ENOMEM;
    return 0;
}

/* tools and tool_choice. Tools Anthropic runs itself (web search, code
 * execution: a versioned 'type') have no schema to render: left out, with
 * one log line each time a request carries them. */
static int convert_tools(json_t *root, json_t *oai, char *err, size_t errlen)
{
    json_t *tools = json_object_get(root, "tools"), *t, *out = NULL;
    size_t i, skipped = 0;

    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools))
            return fail(err, errlen, "'tools' must be an array");
        if (!(out = json_array()))
            return THAW_ENOMEM;
        json_object_set_new(oai, "tools", out);
        json_array_foreach(tools, i, t) {
            json_t *name = json_object_get(t, "name"), *schema = json_object_get(t, "input_schema");
            json_t *desc = json_object_get(t, "description"), *type = json_object_get(t, "type");
            if (!json_is_object(t))
                return fail(err, errlen, "tools[%zu] must be an object", i);
            if (type && !json_is_null(type) && !(json_is_string(type) && strcmp(json_string_value(type), "custom") == 0)) {
                skipped++;
                continue;
            }
            if (!json_is_string(name) || json_string_length(name) == 0)
                return fail(err, errlen, "tools[%zu].name must be a non-empty string", i);
            if (!json_is_object(schema))
                return fail(err, errlen, "tools[%zu].input_schema must be a JSON schema object", i);
            if (desc && !json_is_null(desc) && !json_is_string(desc))
                return fail(err, errlen, "tools[%zu].description must be a string", i);
            json_t *fn = json_pack("{s:O, s:O}", "name", name, "parameters", schema);
            if (!fn)
                return THAW_ENOMEM;
            if (json_is_string(desc))
                json_object_set(fn, "description", desc);
            if (json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function", fn)) != 0)
                return THAW_ENOMEM;
        }
        if (skipped)
            LOG_INF("anthropic: %zu server-side tool(s) left out of the prompt (only custom tools are rendered)",
                    skipped);
    }

    json_t *tc = json_object_get(root, "tool_choice");
    bool parallel = true;
    if (tc && !json_is_null(tc)) {
        json_t *type = json_object_get(tc, "type"), *dp = json_object_get(tc, "disable_parallel_tool_use");
        if (!json_is_object(tc) || !json_is_string(type))
            return fail(err, errlen, "'tool_choice' must be an object with a string 'type'");
        const char *ty = json_string_value(type);
        if (dp && !json_is_null(dp) && !json_is_boolean(dp))
            return fail(err, errlen, "'tool_choice.disable_parallel_tool_use' must be true or false");
        parallel = !json_is_true(dp);
        if (strcmp(ty, "auto") != 0 && strcmp(ty, "any") != 0 && strcmp(ty, "tool") != 0 && strcmp(ty, "none") != 0)
            return fail(err, errlen, "'tool_choice.type' '%s' is not one of auto, any, tool, none", ty);
        if (strcmp(ty, "none") != 0 && strcmp(ty, "auto") != 0 && json_array_size(out) == 0)
            return fail(err, errlen, "'tool_choice' \"%s\" needs 'tools'", ty);
        if (strcmp(ty, "auto") == 0 || strcmp(ty, "none") == 0) {
            json_object_set_new(oai, "tool_choice", json_string(ty));
        } else if (strcmp(ty, "any") == 0) {
            json_object_set_new(oai, "tool_choice", json_string("required"));
        } else if (strcmp(ty, "tool") == 0) {
            json_t *name = json_object_get(tc, "name");
            bool found = false;
            if (!json_is_string(name))
                return fail(err, errlen, "'tool_choice.name' must be a string when its type is \"tool\"");
            json_array_foreach(out, i, t)
                found |= json_equal(json_object_get(json_object_get(t, "function"), "name"), name);
            if (!found)
                return fail(err, errlen, "'tool_choice.name' '%s' is not in 'tools'", json_string_value(name));
            json_object_set_new(oai, "tool_choice",
                                json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name));
        } else {
            return fail(err, errlen, "'tool_choice.type' '%s' is not one of auto, any, tool, none", ty);
        }
    }
    if (json_array_size(out) > 0)
        json_object_set_new(oai, "parallel_tool_calls", json_boolean(parallel));
    return 0;
}

/* thinking, output_config.format, sampling, stops, limits, stream. */
static int convert_settings(json_t *root, json_t *oai, char *err, size_t errlen)
{
    json_t *v;

    if ((v = json_object_get(root, "model")) && !json_is_null(v)) {
        if (!json_is_string(v))
            return fail(err, errlen, "'model' must be a string");
        json_object_set(oai, "model", v);
    }
    if ((v = json_object_get(root, "max_tokens")) && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > (1 << 30))
            return fail(err, errlen, "'max_tokens' must be an integer of at least 1");
        json_object_set(oai, "max_tokens", v);
    }
    static const struct {
        const char *name;
        double hi;
    } nums[] = {{"temperature", 1}, {"top_p", 1}};
    for (size_t i = 0; i < 2; i++)
        if ((v = json_object_get(root, nums[i].name)) && !json_is_null(v)) {
            double d = json_number_value(v);
            if (!json_is_number(v) || !isfinite(d) || d < 0 || d > nums[i].hi)
                return fail(err, errlen, "'%s' must be a number between 0 and %g", nums[i].name, nums[i].hi);
            json_object_set(oai, nums[i].name, v);
        }
    if ((v = json_object_get(root, "top_k")) && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > (1 << 30))
            return fail(err, errlen, "'top_k' must be a non-negative integer");
        json_object_set(oai, "top_k", v);
    }
    if ((v = json_object_get(root, "stream")) && !json_is_null(v)) {
        if (!json_is_boolean(v))
            return fail(err, errlen, "'stream' must be true or false");
        json_object_set(oai, "stream", v);
    }
    if ((v = json_object_get(root, "stop_sequences")) && !json_is_null(v)) {
        size_t i;
        json_t *s;
        if (!json_is_array(v))
            return fail(err, errlen, "'stop_sequences' must be an array of strings");
        if (json_array_size(v) > THAW_API_MAX_STOP)
            return fail(err, errlen, "'stop_sequences' may hold at most %d strings", THAW_API_MAX_STOP);
        json_array_foreach(v, i, s)
            if (!json_is_string(s))
                return fail(err, errlen, "stop_sequences[%zu] must be a string", i);
        json_object_set(oai, "stop", v);
    }

    /* thinking: the template's own switch (Qwen3's enable_thinking and
     * its kin); absent leaves the template's default */
    if ((v = json_object_get(root, "thinking")) && !json_is_null(v)) {
        json_t *type = json_object_get(v, "type");
        if (!json_is_object(v) || !json_is_string(type))
            return fail(err, errlen, "'thinking' must be an object with a string 'type'");
        const char *ty = json_string_value(type);
        bool on = strcmp(ty, "enabled") == 0 || strcmp(ty, "adaptive") == 0;
        if (!on && strcmp(ty, "disabled") != 0)
            return fail(err, errlen, "'thinking.type' '%s' is not one of enabled, adaptive, disabled", ty);
        json_t *budget = json_object_get(v, "budget_tokens");
        if (budget && !json_is_null(budget) &&
            (!json_is_integer(budget) || json_integer_value(budget) < 0 || json_integer_value(budget) > INT32_MAX))
            return fail(err, errlen, "'thinking.budget_tokens' must be a non-negative integer");
        json_object_set_new(oai, "chat_template_kwargs", json_pack("{s:b}", "enable_thinking", on));
        /* enabled's budget_tokens is the reasoning budget (engine/budget.h),
         * as llama-server maps it */
        if (strcmp(ty, "enabled") == 0 && json_is_integer(budget))
            json_object_set(oai, "thinking_budget_tokens", budget);
    }

    /* structured output: output_config.format (and the older output_format) */
    json_t *oc = json_object_get(root, "output_config"), *fmt = NULL;
    if (oc && !json_is_null(oc)) {
        if (!json_is_object(oc))
            return fail(err, errlen, "'output_config' must be an object");
        fmt = json_object_get(oc, "format");
    }
    /* output_config.effort (adaptive thinking's depth): the template's
     * reasoning_effort, as a chat completion's reasoning_effort */
    json_t *effort = json_is_object(oc) ? json_object_get(oc, "effort") : NULL;
    if (effort && !json_is_null(effort)) {
        if (!json_is_string(effort) || json_string_length(effort) == 0)
            return fail(err, errlen, "'output_config.effort' must be a string (low, medium, high, max)");
        json_object_set(oai, "reasoning_effort", effort);
    }
    if ((!fmt || json_is_null(fmt)) && (v = json_object_get(root, "output_format")) && !json_is_null(v))
        fmt = v;
    if (fmt && !json_is_null(fmt)) {
        json_t *type = json_object_get(fmt, "type"), *schema = json_object_get(fmt, "schema");
        if (!json_is_object(fmt) || !json_is_string(type) || strcmp(json_string_value(type), "json_schema") != 0)
            return fail(err, errlen, "'output_config.format' must be {\"type\": \"json_schema\", \"schema\": {...}}");
        if (!json_is_object(schema))
            return fail(err, errlen, "'output_config.format.schema' must be a JSON schema object");
        json_object_set_new(oai, "response_format",
                            json_pack("{s:s, s:{s:O}}", "type", "json_schema", "json_schema", "schema", schema));
    }

    /* Claude Code's session: what a proxy may route on (as prompt_cache_key) */
    json_t *md = json_object_get(root, "metadata");
    if (md && !json_is_null(md) && !json_is_object(md))
        return fail(err, errlen, "'metadata' must be an object");
    json_t *uid = json_object_get(md, "user_id");
    if (json_is_string(uid) && json_string_length(uid) > 0 && json_string_length(uid) <= THAW_API_MAX_CONVERSATION_ID)
        json_object_set(oai, "prompt_cache_key", uid);
    return 0;
}

static int convert(json_t *root, json_t *oai, char *err, size_t errlen)
{
    struct marks mk = {{-1, -1}};
    int rc;

    if ((rc = convert_messages(root, oai, &mk, err, errlen)) != 0 ||
        (rc = convert_tools(root, oai, err, errlen)) != 0 ||
        (rc = convert_settings(root, oai, err, errlen)) != 0 || (rc = convert_marks(root, oai, &mk, err, errlen)) != 0)
        return rc;
    return 0;
}

int thaw_anthropic_parse(const char *body, size_t len, bool default_cache_prompt, struct thaw_chat_request *out,
                         char *err, size_t errlen)
{
    int rc = thaw_api_parse_via_chat(body, len, default_cache_prompt, convert, out, err, errlen);

    /* a recovery prompt is the last message only (convert_messages) */
    if (rc == 0 && out->n_messages > 0) {
        const struct thaw_message *last = &out->messages[out->n_messages - 1];
        out->last_transient = strcmp(last->role, "user") == 0 &&
                              strncmp(last->content, THAW_ANTHROPIC_RECOVERY_PREFIX,
                                      strlen(THAW_ANTHROPIC_RECOVERY_PREFIX)) == 0;
    }
    return rc;
}

/* ---- responses -------------------------------------------------------------------- */

char *thaw_anthropic_error_json(int status, const char *message)
{
    const char *type = "api_error";
    char *clean = thaw_utf8_sanitize(message, strlen(message));

    if (status == 400 || status == 405 || status == 422)
        type = "invalid_request_error";
    else if (status == 401)
        type = "authentication_error";
    else if (status == 403)
        type = "permission_error";
    else if (status == 404)
        type = "not_found_error";
    else if (status == 408)
        type = "timeout_error";
    else if (status == 413)
        type = "request_too_large";
    else if (status == 429)
        type = "rate_limit_error";
    else if (status == 503 || status == 529)
        type = "overloaded_error";
    char *out = clean ? thaw_api_dump(json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", type, "message", clean))
                      : NULL;
    free(clean);
    return out;
}

const char *thaw_anthropic_stop_reason(const char *finish_reason, const char *stop_sequence)
{
    if (stop_sequence && finish_reason && strcmp(finish_reason, "stop") == 0)
        return "stop_sequence";
    if (finish_reason && strcmp(finish_reason, "length") == 0)
        return "max_tokens";
    if (finish_reason && strcmp(finish_reason, "tool_calls") == 0)
        return "tool_use";
    return "end_turn";
}

char *thaw_anthropic_usage_json(int n_prompt, int cache_n, int cache_new_n, int output_tokens)
{
    return thaw_api_dump(json_pack("{s:i, s:i, s:i, s:i}", "input_tokens", n_prompt - cache_n - cache_new_n,
                                   "cache_creation_input_tokens", cache_new_n, "cache_read_input_tokens", cache_n,
                                   "output_tokens", output_tokens));
}

void thaw_anthropic_signature(const char *thinking, size_t n, char out[THAW_ANTHROPIC_SIGNATURE_LEN])
{
    unsigned char h[16];

    crypto_generichash(h, sizeof h, (const unsigned char *)thinking, n, (const unsigned char *)"thaw.thinking.v1", 16);
    memcpy(out, "thaw-", 5);
    thaw_hex(h, sizeof h, out + 5);
}

char *thaw_anthropic_message_json(const char *id, const char *model, const char *message_json,
                                  const char *finish_reason, const char *stop_sequence, int n_prompt,
                                  const struct thaw_timings *t)
{
    json_error_t jerr;
    json_t *msg = json_loads(message_json, 0, &jerr), *blocks = json_array(), *v, *c;
    json_t *usage = NULL;
    char *u = NULL;
    size_t i;

    if (!msg || !blocks)
        goto fail;
    if ((v = json_object_get(msg, "reasoning_content")) && json_string_length(v) > 0) {
        char sig[THAW_ANTHROPIC_SIGNATURE_LEN];
        thaw_anthropic_signature(json_string_value(v), json_string_length(v), sig);
        json_array_append_new(blocks, json_pack("{s:s, s:O, s:s}", "type", "thinking", "thinking", v, "signature", sig));
    }
    if ((v = json_object_get(msg, "content")) && json_string_length(v) > 0)
        json_array_append_new(blocks, json_pack("{s:s, s:O}", "type", "text", "text", v));
    json_array_foreach(json_object_get(msg, "tool_calls"), i, c) {
        json_t *fn = json_object_get(c, "function");
        const char *args = json_string_value(json_object_get(fn, "arguments"));
        json_t *input = args ? json_loads(args, 0, &jerr) : NULL;
        if (!json_is_object(input)) { /* a call cut short by max_tokens: its arguments are not JSON yet */
            json_decref(input);
            input = json_object();
        }
        json_array_append_new(blocks, json_pack("{s:s, s:O, s:O, s:o}", "type", "tool_use", "id",
                                                json_object_get(c, "id"), "name", json_object_get(fn, "name"), "input",
                                                input));
    }
    if (!(u = thaw_anthropic_usage_json(n_prompt, t->cache_n, t->cache_new_n, t->predicted_n)) || !(usage = json_loads(u, 0, &jerr)))
        goto fail;
    free(u);
    json_decref(msg);
    return thaw_api_dump(json_pack("{s:s, s:s, s:s, s:s, s:o, s:s, s:o, s:o}", "id", id, "type", "message", "role", "assistant",
                          "model", model, "content", blocks, "stop_reason",
                          thaw_anthropic_stop_reason(finish_reason, stop_sequence), "stop_sequence",
                          stop_sequence ? json_string(stop_sequence) : json_null(), "usage", usage));
fail:
    free(u);
    json_decref(msg);
    json_decref(blocks);
    return NULL;
}

/* ---- the codec -------------------------------------------------------------------- */

#undef fail /* the table's field of that name */

static char *messages_reply(const struct thaw_reply *r)
{
    return thaw_anthropic_message_json(r->id, r->model, r->message_json, r->finish_reason, r->stop_sequence,
                                       r->n_prompt, r->timings);
}

/* Claude Code reads the two numbers out of exactly this sentence */
static char *messages_too_long(int n_prompt, int n_ctx_slot)
{
    char msg[160];

    snprintf(msg, sizeof msg, "prompt is too long: %d tokens > %d maximum", n_prompt, n_ctx_slot - 1);
    return thaw_anthropic_error_json(400, msg);
}

static int msg_open(struct thaw_codec_stream *st)
{
    json_t *usage = thaw_codec_loads(thaw_anthropic_usage_json(st->n_prompt, st->cache_n, st->cache_new_n, 0));
    int rc;

    if (!usage)
        return THAW_ENOMEM;
    rc = thaw_codec_emit(st, "message_start",
                         json_pack("{s:s, s:{s:s, s:s, s:s, s:[], s:s, s:n, s:n, s:o}}", "type", "message_start",
                                   "message", "id", st->id, "type", "message", "role", "assistant", "content", "model",
                                   st->model, "stop_reason", "stop_sequence", "usage", usage));
    return rc ? rc : thaw_codec_emit(st, "ping", json_pack("{s:s}", "type", "ping"));
}

/* Ends the open content block (a thinking block gets its signature first). */
static int msg_block_stop(struct thaw_codec_stream *st)
{
    int idx = st->n_parts - 1, rc = 0;

    if (st->part == THAW_CODEC_PART_NONE)
        return 0;
    if (st->part == THAW_CODEC_PART_THINKING) {
        char sig[THAW_ANTHROPIC_SIGNATURE_LEN];
        thaw_anthropic_signature(st->acc ? st->acc : "", st->n_acc, sig);
        rc = thaw_codec_emit(st, "content_block_delta",
                             json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_delta", "index", idx,
                                       "delta", "type", "signature_delta", "signature", sig));
    }
    thaw_codec_part_reset(st);
    st->part = THAW_CODEC_PART_NONE;
    return rc ? rc
              : thaw_codec_emit(st, "content_block_stop",
                                json_pack("{s:s, s:i}", "type", "content_block_stop", "index", idx));
}

/* Makes `kind` the open block: the open one of another kind (or another
 * tool call) is stopped and a new one started with `start` (taken). */
static int msg_block_start(struct thaw_codec_stream *st, int kind, json_t *start)
{
    int rc = msg_block_stop(st);

    if (rc != 0) {
        json_decref(start);
        return rc;
    }
    st->part = kind;
    return thaw_codec_emit(st, "content_block_start",
                           json_pack("{s:s, s:i, s:o}", "type", "content_block_start", "index", st->n_parts++,
                                     "content_block", start));
}

static int msg_block_delta(struct thaw_codec_stream *st, json_t *delta)
{
    return thaw_codec_emit(st, "content_block_delta",
                           json_pack("{s:s, s:i, s:o}", "type", "content_block_delta", "index", st->n_parts - 1,
                                     "delta", delta));
}

static int msg_delta(struct thaw_codec_stream *st, json_t *diff)
{
    json_t *v;
    int rc = 0;

    if ((v = json_object_get(diff, "reasoning_content")) && json_string_length(v) > 0) {
        if (st->part != THAW_CODEC_PART_THINKING)
            rc = msg_block_start(st, THAW_CODEC_PART_THINKING,
                                 json_pack("{s:s, s:s, s:s}", "type", "thinking", "thinking", "", "signature", ""));
        if (rc == 0 && (rc = thaw_codec_part_add(st, v)) == 0)
            rc = msg_block_delta(st, json_pack("{s:s, s:O}", "type", "thinking_delta", "thinking", v));
    }
    if (rc == 0 && (v = json_object_get(diff, "content")) && json_string_length(v) > 0) {
        if (st->part != THAW_CODEC_PART_TEXT)
            rc = msg_block_start(st, THAW_CODEC_PART_TEXT, json_pack("{s:s, s:s}", "type", "text", "text", ""));
        if (rc == 0)
            rc = msg_block_delta(st, json_pack("{s:s, s:O}", "type", "text_delta", "text", v));
    }
    if (rc == 0 && (v = json_object_get(diff, "tool_call_index"))) {
        long index = (long)json_integer_value(v);
        json_t *id = json_object_get(diff, "id"), *name = json_object_get(diff, "name");
        json_t *args = json_object_get(diff, "arguments");
        if (st->part != THAW_CODEC_PART_TOOL || st->tool_index != index) {
            rc = msg_block_start(st, THAW_CODEC_PART_TOOL,
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

static int msg_close(struct thaw_codec_stream *st)
{
    const struct thaw_reply *r = st->reply;
    json_t *usage = thaw_codec_loads(thaw_anthropic_usage_json(r->n_prompt, r->timings->cache_n,
                                                               r->timings->cache_new_n, r->timings->predicted_n));
    int rc = msg_block_stop(st);

    if (!usage)
        return THAW_ENOMEM;
    if (rc == 0)
        rc = thaw_codec_emit(st, "message_delta",
                             json_pack("{s:s, s:{s:s, s:o}, s:O}", "type", "message_delta", "delta", "stop_reason",
                                       thaw_anthropic_stop_reason(r->finish_reason, r->stop_sequence),
                                       "stop_sequence", r->stop_sequence ? json_string(r->stop_sequence) : json_null(),
                                       "usage", usage));
    json_decref(usage);
    return rc ? rc : thaw_codec_emit(st, "message_stop", json_pack("{s:s}", "type", "message_stop"));
}

static int msg_fail(struct thaw_codec_stream *st, int status, const char *message)
{
    return thaw_codec_emit_text(st, "error", thaw_anthropic_error_json(status, message));
}

const struct thaw_codec thaw_codec_messages = {
    .name = "messages",
    .id_prefix = "msg_",
    .auth_hint = "missing or invalid API key: send 'x-api-key: <key>' or 'Authorization: Bearer <key>'",
    .caps = 0,
    .parse = thaw_anthropic_parse,
    .error_json = thaw_anthropic_error_json,
    .too_long_json = messages_too_long,
    .reply = messages_reply,
    .merge_choice = NULL,
    .open_after_start = true, /* message_start reports the cache's part of the prompt */
    .open = msg_open,
    .progress = NULL,
    .delta = msg_delta,
    .close = msg_close,
    .fail = msg_fail,
};
