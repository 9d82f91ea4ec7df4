/* api.c — the OpenAI chat-completions codec (thaw_codec_chat, codec.h):
 * the one parser of the internal request every codec ends in, and the
 * chat replies (llama-server's other endpoints: api_llamaserver.c).
 *
 * Sections:
 *   ---- parsing ----    body -> struct thaw_chat_request, field by field
 *   ---- responses ----  completion, chunk, error, models JSON
 *   ---- the codec ----  the table: the whole reply, the stream's chunks ([DONE]), prompt_progress
 */
#include "api/api.h"

#include "api/logprobs.h"

#include "api/api_wire.h"
#include "api/codec.h"
#include "api/template.h"

#include "base/buf.h"
#include "base/error.h"
#include "base/utf8.h"

#include <jansson.h>
#include <math.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- parsing ------------------------------------------------------------------ */


int thaw_api_fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return THAW_EINVAL;
}

#define fail thaw_api_fail /* the short name this file's checks use */

json_t *thaw_api_load_object(const char *body, size_t len, char *err, size_t errlen)
{
    json_error_t jerr;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);

    if (!root) {
        fail(err, errlen, "request body is not valid JSON: %s (line %d, column %d)", jerr.text, jerr.line,
             jerr.column);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        fail(err, errlen, "request body must be a JSON object");
        return NULL;
    }
    return root;
}

/* ---- images ---- */

/* An image URL made a struct thaw_image (vision.h): a data: URL's bytes
 * (base64), or a file:// URL's path (read under --media-path by prepare);
 * http(s) is refused: thaw fetches nothing. 0 or THAW_EINVAL (err says
 * why, for a 400) or THAW_ENOMEM. */
int thaw_api_image_from_url(const char *url, const char *where, struct thaw_image *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (strncmp(url, "data:", 5) == 0) {
        const char *comma = strchr(url, ',');
        if (!comma)
            return fail(err, errlen, "%s: a data: URL needs a ',' before its data", where);
        /* the header's parameters end in ;base64 (data:image/png;base64,...) */
        size_t hlen = (size_t)(comma - url);
        if (hlen < 12 || strncmp(comma - 7, ";base64", 7) != 0)
            return fail(err, errlen, "%s: only base64 data: URLs are taken (data:image/png;base64,...)", where);
        return thaw_api_image_from_base64(comma + 1, strlen(comma + 1), where, out, err, errlen);
    }
    if (strncmp(url, "file://", 7) == 0) {
        if (!url[7])
            return fail(err, errlen, "%s: the file:// URL names no file", where);
        return (out->path = strdup(url + 7)) ? 0 : THAW_ENOMEM;
    }
    if (strncmp(url, "http://", 7) == 0 || strncmp(url, "https://", 8) == 0)
        return fail(err, errlen, "%s: thaw fetches no URLs: send the image inline as a data: URL "
                                 "(data:image/png;base64,...)", where);
    return fail(err, errlen, "%s: the image URL must be a data: URL (or file:// under --media-path)", where);
}

int thaw_api_image_from_base64(const char *b64, size_t len, const char *where, struct thaw_image *out, char *err,
                               size_t errlen)
{
    size_t cap = len / 4 * 3 + 3, n = 0;

    memset(out, 0, sizeof *out);
    if (len == 0)
        return fail(err, errlen, "%s: the image's data is empty", where);
    if (cap - 3 > THAW_VISION_MAX_IMAGE_BYTES)
        return fail(err, errlen, "%s: the image is over %u MiB", where, THAW_VISION_MAX_IMAGE_BYTES >> 20);
    if (!(out->data = malloc(cap)))
        return THAW_ENOMEM;
    if (sodium_base642bin(out->data, cap, b64, len, " \t\r\n", &n, NULL, sodium_base64_VARIANT_ORIGINAL) != 0 &&
        sodium_base642bin(out->data, cap, b64, len, " \t\r\n", &n, NULL, sodium_base64_VARIANT_ORIGINAL_NO_PADDING) !=
            0) {
        free(out->data);
        out->data = NULL;
        return fail(err, errlen, "%s: the image's data is not valid base64", where);
    }
    if (n == 0) {
        free(out->data);
        out->data = NULL;
        return fail(err, errlen, "%s: the image's data is empty", where);
    }
    out->len = n;
    return 0;
}

/* Appends `img` (moved) to the request's images, its key tag set. 0 or
 * THAW_ENOMEM (then img is freed). */
static int add_image(struct thaw_chat_request *req, struct thaw_image *img)
{
    struct thaw_image *v = realloc(req->images, (req->n_images + 1) * sizeof *v);
    unsigned char h[crypto_hash_sha256_BYTES];
    char hex[2 * sizeof h + 1];

    if (img->data) {
        crypto_hash_sha256(h, img->data, img->len);
        snprintf(img->tag, sizeof img->tag, "sha256:%s", sodium_bin2hex(hex, sizeof hex, h, sizeof h));
    } else {
        crypto_generichash(h, sizeof h, (const unsigned char *)img->path, strlen(img->path), NULL, 0);
        snprintf(img->tag, sizeof img->tag, "file:%s", sodium_bin2hex(hex, sizeof hex, h, sizeof h));
    }

    if (!v) {
        free(img->data);
        free(img->path);
        return THAW_ENOMEM;
    }
    req->images = v;
    req->images[req->n_images++] = *img;
    memset(img, 0, sizeof *img);
    return 0;
}

/* An image_url part's URL: {"image_url": {"url": "..."}} or {"image_url": "..."} */
static const char *image_part_url(json_t *part)
{
    json_t *u = json_object_get(part, "image_url");

    if (json_is_object(u))
        u = json_object_get(u, "url");
    return json_is_string(u) ? json_string_value(u) : NULL;
}

/* Flattens `content`: a string, null (assistant tool calls), or an array of
 * parts of which {"type":"text","text":...} carry text and, when `req` is
 * given, {"type":"image_url"} an image: its bytes go to req->images and
 * the text gets the marker that stands for it (thaw_vision_marker). */
static int flatten_content(json_t *content, size_t idx, struct thaw_chat_request *req, char **out, char *err,
                           size_t errlen)
{
    const char *marker = thaw_vision_marker();

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
        if (req && strcmp(json_string_value(type), "image_url") == 0) {
            char where[64];
            const char *url = image_part_url(part);
            struct thaw_image img;
            int rc;
            snprintf(where, sizeof where, "messages[%zu].content[%zu].image_url", idx, i);
            if (!url)
                return fail(err, errlen, "%s.url must be a string", where);
            if ((rc = thaw_api_image_from_url(url, where, &img, err, errlen)) != 0 || (rc = add_image(req, &img)) != 0)
                return rc;
            total += strlen(marker);
            continue;
        }
        if (strcmp(json_string_value(type), "text") != 0)
            return fail(err, errlen, "messages[%zu].content[%zu].type '%s' is not supported (only 'text'%s)", idx, i,
                        json_string_value(type), req ? " and 'image_url'" : "");
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
        if (!json_is_string(text)) { /* an image */
            memcpy(buf + len, marker, strlen(marker));
            len += strlen(marker);
            continue;
        }
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

/* llama-server's per-request sampling fields; the bounds are --help's */
const struct thaw_api_smp_field thaw_api_smp_fields[THAW_API_SMP_COUNT] = {
    [THAW_API_SMP_REPEAT_PENALTY] = {"repeat_penalty", 0, 1e6, false},
    [THAW_API_SMP_REPEAT_LAST_N] = {"repeat_last_n", -1, 1 << 30, true},
    [THAW_API_SMP_PRESENCE_PENALTY] = {"presence_penalty", -1e6, 1e6, false},
    [THAW_API_SMP_FREQUENCY_PENALTY] = {"frequency_penalty", -1e6, 1e6, false},
    [THAW_API_SMP_TYPICAL_P] = {"typical_p", 0, 1, false},
    [THAW_API_SMP_TOP_N_SIGMA] = {"top_n_sigma", -1, 1e6, false},
    [THAW_API_SMP_XTC_PROBABILITY] = {"xtc_probability", 0, 1, false},
    [THAW_API_SMP_XTC_THRESHOLD] = {"xtc_threshold", 0, 1, false},
    [THAW_API_SMP_DRY_MULTIPLIER] = {"dry_multiplier", 0, 1e6, false},
    [THAW_API_SMP_DRY_BASE] = {"dry_base", 1, 1e6, false},
    [THAW_API_SMP_DRY_ALLOWED_LENGTH] = {"dry_allowed_length", 0, 1 << 30, true},
    [THAW_API_SMP_DRY_PENALTY_LAST_N] = {"dry_penalty_last_n", -1, 1 << 30, true},
    [THAW_API_SMP_DYNATEMP_RANGE] = {"dynatemp_range", 0, 1e6, false},
    [THAW_API_SMP_DYNATEMP_EXPONENT] = {"dynatemp_exponent", 0, 1e6, false},
    [THAW_API_SMP_MIROSTAT] = {"mirostat", 0, 2, true},
    [THAW_API_SMP_MIROSTAT_TAU] = {"mirostat_tau", 0, 1e6, false},
    [THAW_API_SMP_MIROSTAT_ETA] = {"mirostat_eta", 0, 1e6, false},
};

int thaw_api_get_bool(json_t *root, const char *name, bool *out, char *err, size_t errlen)
{
    json_t *v = json_object_get(root, name);

    if (!v || json_is_null(v))
        return 0;
    if (!json_is_boolean(v))
        return fail(err, errlen, "'%s' must be true or false", name);
    *out = json_is_true(v);
    return 0;
}

/* An optional string field of an object: absent/null -> NULL is fine. */
static int opt_string(json_t *obj, const char *key, const char *where, json_t **out, char *err, size_t errlen)
{
    json_t *v = json_object_get(obj, key);

    *out = NULL;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_string(v))
        return fail(err, errlen, "%s.%s must be a string", where, key);
    *out = v;
    return 0;
}

/* messages[i].tool_calls: [{"id","type":"function","function":{"name","arguments"}}],
 * normalised into `into` (arguments always a string: an object is encoded). */
static int parse_tool_calls(json_t *calls, size_t i, json_t *into, char *err, size_t errlen)
{
    json_t *norm = json_array(), *c;
    size_t k;

    if (!norm)
        return THAW_ENOMEM;
    if (!json_is_array(calls)) {
        json_decref(norm);
        return fail(err, errlen, "messages[%zu].tool_calls must be an array", i);
    }
    json_array_foreach(calls, k, c) {
        json_t *fn = json_object_get(c, "function"), *id, *name, *args, *type = json_object_get(c, "type");
        char where[64];
        snprintf(where, sizeof where, "messages[%zu].tool_calls[%zu]", i, k);
        if (!json_is_object(c) || !json_is_object(fn)) {
            json_decref(norm);
            return fail(err, errlen, "%s must be an object with a 'function' object", where);
        }
        if (type && !(json_is_string(type) && strcmp(json_string_value(type), "function") == 0)) {
            json_decref(norm);
            return fail(err, errlen, "%s.type must be \"function\"", where);
        }
        if (opt_string(c, "id", where, &id, err, errlen) != 0) {
            json_decref(norm);
            return THAW_EINVAL;
        }
        name = json_object_get(fn, "name");
        if (!json_is_string(name) || json_string_length(name) == 0) {
            json_decref(norm);
            return fail(err, errlen, "%s.function.name must be a non-empty string", where);
        }
        args = json_object_get(fn, "arguments");
        json_t *args_s;
        if (!args || json_is_null(args)) {
            args_s = json_string("{}");
        } else if (json_is_string(args)) {
            args_s = json_incref(args);
        } else if (json_is_object(args)) {
            char *d = json_dumps(args, JSON_COMPACT);
            args_s = d ? json_string(d) : NULL;
            free(d);
        } else {
            json_decref(norm);
            return fail(err, errlen, "%s.function.arguments must be a JSON string", where);
        }
        json_t *o = json_pack("{s:s, s:{s:O, s:o}}", "type", "function", "function", "name", name, "arguments", args_s);
        if (!o) {
            json_decref(norm);
            return THAW_ENOMEM;
        }
        if (id)
            json_object_set(o, "id", id);
        json_array_append_new(norm, o);
    }
    json_object_set_new(into, "tool_calls", norm);
    return 0;
}

/* A message with images: the template still renders it with each image's
 * marker (out->render, set from out->json when not already), while the
 * keys' form (out->json) carries after each marker the image's tag (its
 * SHA-256), so two conversations differing only in an image's bytes never
 * share a key (DESIGN §15). `norm` is the message's normalised JSON (its
 * content replaced here). 0 or THAW_ENOMEM. */
static int key_images(struct thaw_message *out, const struct thaw_image *imgs, size_t n, json_t *norm)
{
    const char *marker = thaw_vision_marker(), *p = out->content;
    size_t ml = strlen(marker), k = 0;
    struct thaw_buf b = {0};
    char *keyed;

    while (*p) {
        const char *q = strstr(p, marker);
        if (!q) {
            thaw_buf_puts(&b, p);
            break;
        }
        thaw_buf_append(&b, p, (size_t)(q + ml - p));
        if (k < n) {
            thaw_buf_puts(&b, "{");
            thaw_buf_puts(&b, imgs[k++].tag);
            thaw_buf_puts(&b, "}");
        }
        p = q + ml;
    }
    if (b.oom || !(keyed = b.data ? strndup(b.data, b.len) : strdup(""))) {
        thaw_buf_free(&b);
        return THAW_ENOMEM;
    }
    thaw_buf_free(&b);
    json_object_set_new(norm, "content", json_string(keyed));
    free(keyed);
    if (!out->render) {
        out->render = out->json;
        out->json = NULL;
    } else {
        free(out->json);
    }
    out->json = json_dumps(norm, JSON_COMPACT | JSON_SORT_KEYS);
    return out->json ? 0 : THAW_ENOMEM;
}

/* One message: checked, flattened to text for the cheap checks, and
 * normalised (known fields only, text parts joined) into JSON for the
 * template and the conversation keys. Fills out (role, content, json). */
static int normalize_message(json_t *m, size_t i, struct thaw_chat_request *req, struct thaw_message *out, char *err,
                             size_t errlen)
{
    static const char *const roles[] = {"system", "developer", "user", "assistant", "tool"};
    json_t *role = json_object_get(m, "role");
    bool known = false;
    char where[32];
    int rc;

    snprintf(where, sizeof where, "messages[%zu]", i);
    if (!json_is_object(m))
        return fail(err, errlen, "messages[%zu] must be an object", i);
    if (!json_is_string(role))
        return fail(err, errlen, "messages[%zu].role must be a string", i);
    for (size_t r = 0; r < sizeof roles / sizeof roles[0]; r++)
        known |= strcmp(json_string_value(role), roles[r]) == 0;
    if (!known)
        return fail(err, errlen, "messages[%zu].role '%s' is not one of system, developer, user, assistant, tool", i,
                    json_string_value(role));
    bool assistant = strcmp(json_string_value(role), "assistant") == 0;
    size_t first_image = req ? req->n_images : 0; /* this message's images are those added from here */
    json_t *content = json_object_get(m, "content");
    json_t *calls = json_object_get(m, "tool_calls");
    bool has_calls = calls && !json_is_null(calls);
    if (!content && !assistant)
        return fail(err, errlen, "messages[%zu].content is required", i);
    if (has_calls && !assistant)
        return fail(err, errlen, "messages[%zu].tool_calls: only assistant messages make tool calls", i);
    if (!(out->role = strdup(json_string_value(role))))
        return THAW_ENOMEM;
    if ((rc = flatten_content(content, i, req, &out->content, err, errlen)) != 0)
        return rc;

    /* "developer" is OpenAI's newer name for the system role */
    const char *trole = strcmp(out->role, "developer") == 0 ? "system" : out->role;
    json_t *norm = json_pack("{s:s}", "role", trole), *v;
    if (!norm)
        return THAW_ENOMEM;
    /* null and "" render alike in every template: one form for the keys */
    json_object_set_new(norm, "content", !content || json_is_null(content) || !*out->content
                                             ? json_null()
                                             : json_string(out->content));
    static const char *const extra[] = {"tool_call_id", "name", "reasoning_content"};
    for (size_t k = 0; k < 3; k++) {
        if (opt_string(m, extra[k], where, &v, err, errlen) != 0) {
            json_decref(norm);
            return THAW_EINVAL;
        }
        if (v && json_string_length(v) > 0)
            json_object_set(norm, extra[k], v);
    }
    if (has_calls && json_array_size(calls) > 0 && (rc = parse_tool_calls(calls, i, norm, err, errlen)) != 0) {
        json_decref(norm);
        return rc;
    }
    if (has_calls && !json_is_array(calls)) {
        json_decref(norm);
        return fail(err, errlen, "messages[%zu].tool_calls must be an array", i);
    }
    out->json = json_dumps(norm, JSON_COMPACT | JSON_SORT_KEYS);
    if (out->json && json_is_array(content) && json_array_size(content) > 1) {
        json_t *parts = json_array(), *part;
        size_t k;
        json_array_foreach(content, k, part) {
            json_t *text = json_object_get(part, "text");
            json_array_append_new(parts, json_pack("{s:s, s:o}", "type", "text", "text",
                                                   json_is_string(text) ? json_incref(text)
                                                                        : json_string(thaw_vision_marker())));
        }
        json_object_set_new(norm, "content", parts);
        if (!(out->render = json_dumps(norm, JSON_COMPACT | JSON_SORT_KEYS))) {
            free(out->json);
            out->json = NULL;
        }
    }
    if (out->json && req && req->n_images > first_image &&
        (rc = key_images(out, &req->images[first_image], req->n_images - first_image, norm)) != 0) {
        json_decref(norm);
        return rc;
    }
    json_decref(norm);
    return out->json ? 0 : THAW_ENOMEM;
}

static int parse_messages(json_t *root, struct thaw_chat_request *out, char *err, size_t errlen)
{
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
        out->n_messages = i + 1; /* freed by thaw_chat_request_free, even half-filled */
        if ((rc = normalize_message(m, i, out, &out->messages[i], err, errlen)) != 0)
            return rc;
    }
    return 0;
}

int thaw_api_normalize_message(const char *msg_json, char **out, char *err, size_t errlen)
{
    json_error_t jerr;
    struct thaw_message m = {0};
    json_t *root = json_loads(msg_json, 0, &jerr);
    int rc;

    *out = NULL;
    if (!root)
        return fail(err, errlen, "not JSON: %s", jerr.text);
    rc = normalize_message(root, 0, NULL, &m, err, errlen);
    json_decref(root);
    free(m.role);
    free(m.content);
    free(m.render);
    if (rc == 0)
        *out = m.json;
    else
        free(m.json);
    return rc;
}

/* tools, tool_choice, parallel_tool_calls, response_format, chat_template_kwargs */
static int parse_agent_fields(json_t *root, struct thaw_chat_request *out, char *err, size_t errlen)
{
    json_t *tools = json_object_get(root, "tools"), *t;
    size_t i;

    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools))
            return fail(err, errlen, "'tools' must be an array");
        json_array_foreach(tools, i, t) {
            json_t *type = json_object_get(t, "type"), *fn = json_object_get(t, "function");
            if (!json_is_object(t) || !json_is_string(type) || strcmp(json_string_value(type), "function") != 0)
                return fail(err, errlen, "tools[%zu] must be {\"type\": \"function\", \"function\": {...}}", i);
            if (!json_is_object(fn) || !json_is_string(json_object_get(fn, "name")) ||
                json_string_length(json_object_get(fn, "name")) == 0)
                return fail(err, errlen, "tools[%zu].function.name must be a non-empty string", i);
            json_t *params = json_object_get(fn, "parameters"), *desc = json_object_get(fn, "description");
            if (params && !json_is_null(params) && !json_is_object(params))
                return fail(err, errlen, "tools[%zu].function.parameters must be a JSON schema object", i);
            if (desc && !json_is_null(desc) && !json_is_string(desc))
                return fail(err, errlen, "tools[%zu].function.description must be a string", i);
        }
        if (json_array_size(tools) > 0 && !(out->tools_json = json_dumps(tools, JSON_COMPACT)))
            return THAW_ENOMEM;
    }

    json_t *tc = json_object_get(root, "tool_choice");
    if (tc && !json_is_null(tc)) {
        const char *choice = NULL;
        if (json_is_string(tc)) {
            choice = json_string_value(tc);
            if (strcmp(choice, "auto") != 0 && strcmp(choice, "none") != 0 && strcmp(choice, "required") != 0)
                return fail(err, errlen, "'tool_choice' must be \"auto\", \"none\", \"required\" or a named function");
        } else if (json_is_object(tc)) {
            json_t *fn = json_object_get(tc, "function");
            json_t *name = json_is_object(fn) ? json_object_get(fn, "name") : NULL;
            if (!json_is_string(name))
                return fail(err, errlen, "'tool_choice' object must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
            bool found = false;
            json_array_foreach(tools, i, t)
                found |= strcmp(json_string_value(json_object_get(json_object_get(t, "function"), "name")),
                                json_string_value(name)) == 0;
            if (!found)
                return fail(err, errlen, "'tool_choice' names '%s', which is not in 'tools'", json_string_value(name));
            if (!(out->tool_choice_name = strdup(json_string_value(name))))
                return THAW_ENOMEM;
            choice = "required";
        } else {
            return fail(err, errlen, "'tool_choice' must be a string or an object");
        }
        if (strcmp(choice, "auto") != 0 && !out->tools_json && strcmp(choice, "none") != 0)
            return fail(err, errlen, "'tool_choice' \"%s\" needs 'tools'", choice);
        if (!(out->tool_choice = strdup(choice)))
            return THAW_ENOMEM;
    }
    json_t *ptc = json_object_get(root, "parallel_tool_calls");
    if (ptc && !json_is_null(ptc)) {
        if (!json_is_boolean(ptc))
            return fail(err, errlen, "'parallel_tool_calls' must be true or false");
        out->parallel_tool_calls = json_is_true(ptc);
    }

    json_t *rf = json_object_get(root, "response_format");
    if (rf && !json_is_null(rf)) {
        json_t *type = json_object_get(rf, "type");
        if (!json_is_object(rf) || !json_is_string(type))
            return fail(err, errlen, "'response_format' must be an object with a string 'type'");
        const char *ty = json_string_value(type);
        if (strcmp(ty, "json_object") == 0) {
            /* llama-server's extension: a 'schema' inside json_object constrains like json_schema */
            json_t *schema = json_object_get(rf, "schema");
            if (schema && !json_is_null(schema) && !json_is_object(schema))
                return fail(err, errlen, "'response_format.schema' must be a JSON schema object");
            if (!(out->json_schema = json_is_object(schema) ? json_dumps(schema, JSON_COMPACT)
                                                            : strdup("{\"type\":\"object\"}")))
                return THAW_ENOMEM;
        } else if (strcmp(ty, "json_schema") == 0) {
            json_t *js = json_object_get(rf, "json_schema");
            json_t *schema = json_is_object(js) ? json_object_get(js, "schema") : NULL;
            if (!json_is_object(schema))
                return fail(err, errlen, "'response_format.json_schema.schema' must be a JSON schema object");
            if (!(out->json_schema = json_dumps(schema, JSON_COMPACT)))
                return THAW_ENOMEM;
        } else if (strcmp(ty, "text") != 0) {
            return fail(err, errlen, "'response_format.type' '%s' is not one of text, json_object, json_schema", ty);
        }
    }

    /* llama-server's own fields: a JSON schema or a GBNF grammar, one of them */
    json_t *js = json_object_get(root, "json_schema"), *gr = json_object_get(root, "grammar");
    if (js && !json_is_null(js)) {
        if (!json_is_object(js))
            return fail(err, errlen, "'json_schema' must be a JSON schema object");
        if (out->json_schema)
            return fail(err, errlen, "send one of 'json_schema' and 'response_format', not both");
        if (!(out->json_schema = json_dumps(js, JSON_COMPACT)))
            return THAW_ENOMEM;
    }
    if (gr && !json_is_null(gr)) {
        if (!json_is_string(gr))
            return fail(err, errlen, "'grammar' must be a string (GBNF)");
        if (out->json_schema)
            return fail(err, errlen, "send one of 'grammar' and 'json_schema' / 'response_format', not both");
        if (json_string_length(gr) > 0 && !(out->grammar = strdup(json_string_value(gr))))
            return THAW_ENOMEM;
    }

    json_t *kw = json_object_get(root, "chat_template_kwargs");
    if (kw && !json_is_null(kw)) {
        if (!json_is_object(kw))
            return fail(err, errlen, "'chat_template_kwargs' must be an object");
        if (json_object_size(kw) > 0 && !(out->template_kwargs = json_dumps(kw, JSON_COMPACT | JSON_SORT_KEYS)))
            return THAW_ENOMEM;
    }
    return 0;
}

/* Fields that would change what the client gets and that thaw does not do:
 * a 400 naming the field beats an answer that silently ignores it. */
static int refuse_unsupported(json_t *root, char *err, size_t errlen)
{
    json_t *v;

    if ((v = json_object_get(root, "audio")) && !json_is_null(v))
        return fail(err, errlen, "'audio' output is not supported");
    if ((v = json_object_get(root, "modalities")) && json_is_array(v)) {
        size_t i;
        json_t *mo;
        json_array_foreach(v, i, mo)
            if (!json_is_string(mo) || strcmp(json_string_value(mo), "text") != 0)
                return fail(err, errlen, "'modalities' other than \"text\" are not supported");
    }
    static const char *const per_server[][2] = {{"samplers", "--samplers"},
                                                {"dry_sequence_breakers", "--dry-sequence-breaker"}};
    for (int i = 0; i < 2; i++)
        if ((v = json_object_get(root, per_server[i][0])) && !json_is_null(v))
            return fail(err, errlen, "'%s' is not supported per request: the server's %s sets it", per_server[i][0],
                        per_server[i][1]);
    if ((v = json_object_get(root, "functions")) && !json_is_null(v))
        return fail(err, errlen, "'functions' is deprecated and not supported: send 'tools'");
    if ((v = json_object_get(root, "prediction")) && !json_is_null(v))
        return fail(err, errlen, "'prediction' is not supported");
    return 0;
}

/* Per-token probabilities: OpenAI's logprobs (true) + top_logprobs
 * (0..20; without logprobs a 400, as OpenAI and llama-server answer it;
 * absent: 20, llama-server's default), llama-server's n_probs (0..100; it
 * wins where both are sent) and post_sampling_probs. /v1/completions'
 * integer logprobs is its codec's (api_completions.c). */
static int parse_probs(json_t *root, struct thaw_chat_request *out, char *err, size_t errlen)
{
    json_t *lp = json_object_get(root, "logprobs");
    double d;
    bool present;
    int rc;

    if (lp && !json_is_null(lp) && !json_is_boolean(lp))
        return fail(err, errlen, "'logprobs' must be true or false");
    out->logprobs = json_is_true(lp);
    out->n_probs = 20;
    if ((rc = get_int(root, "top_logprobs", 0, THAW_LOGPROBS_MAX_OAI, &d, &present, err, errlen)) != 0)
        return rc;
    if (present && !out->logprobs)
        return fail(err, errlen, "'top_logprobs' requires 'logprobs' to be true");
    if (present)
        out->n_probs = (int)d;
    if ((rc = get_int(root, "n_probs", 0, THAW_LOGPROBS_MAX, &d, &present, err, errlen)) != 0)
        return rc;
    if (present) {
        out->logprobs = d > 0;
        out->n_probs = (int)d;
    }
    if (!out->logprobs)
        out->n_probs = 0;
    return thaw_api_get_bool(root, "post_sampling_probs", &out->post_sampling_probs, err, errlen);
}

/* add_generation_prompt, continue_final_message and the assistant prefill,
 * with llama-server's checks (server-common.cpp, oaicompat_chat_params_parse) */
static int parse_continuation(json_t *root, struct thaw_chat_request *out, char *err, size_t errlen)
{
    json_t *agp = json_object_get(root, "add_generation_prompt"), *cfm = json_object_get(root, "continue_final_message");
    const char *last = out->n_messages ? out->messages[out->n_messages - 1].role : NULL;
    bool last_asst = last && strcmp(last, "assistant") == 0;
    bool agp_sent = agp && !json_is_null(agp), cfm_off = false;

    out->add_generation_prompt = true;
    if (agp_sent && !json_is_boolean(agp))
        return fail(err, errlen, "'add_generation_prompt' must be true or false");
    if (agp_sent)
        out->add_generation_prompt = json_is_true(agp);
    if (cfm && !json_is_null(cfm)) {
        if (json_is_boolean(cfm)) {
            out->continue_final = json_is_true(cfm);
            cfm_off = !out->continue_final;
        } else if (json_is_string(cfm) && (strcmp(json_string_value(cfm), "content") == 0 ||
                                           strcmp(json_string_value(cfm), "reasoning_content") == 0)) {
            out->continue_final = true;
        } else {
            return fail(err, errlen, "'continue_final_message' must be true, false, \"content\" or \"reasoning_content\"");
        }
    }
    if (!out->continue_final && !cfm_off && last_asst) { /* llama-server's prefill_assistant */
        if (out->n_messages >= 2 && strcmp(out->messages[out->n_messages - 2].role, "assistant") == 0)
            return fail(err, errlen, "Cannot have 2 or more assistant messages at the end of the list.");
        if (agp_sent && out->add_generation_prompt)
            return fail(err, errlen, "Cannot set both add_generation_prompt and continue_final_message to true.");
        out->continue_final = true;
        out->add_generation_prompt = false;
        out->prefill_implicit = true;
    }
    if (out->continue_final && out->add_generation_prompt) {
        if (agp_sent)
            return fail(err, errlen, "Cannot set both add_generation_prompt and continue_final_message to true.");
        out->add_generation_prompt = false;
    }
    if (out->continue_final && !last_asst)
        return fail(err, errlen, "'continue_final_message' needs an assistant message last");
    if (out->continue_final) {
        json_t *m = json_loads(out->messages[out->n_messages - 1].json, 0, NULL);
        bool calls = json_array_size(json_object_get(m, "tool_calls")) > 0;
        json_decref(m);
        if (calls)
            return fail(err, errlen, "Cannot continue an assistant message that contains tool calls.");
        out->last_transient = true; /* the reply is the continued message, whole */
    }
    return 0;
}

void thaw_api_no_prefill(struct thaw_chat_request *req)
{
    if (!req->prefill_implicit)
        return;
    req->prefill_implicit = false;
    req->continue_final = false;
    req->add_generation_prompt = true;
    req->last_transient = false;
}

int thaw_api_kwargs_set(struct thaw_chat_request *req, const char *key, const char *value_json, bool if_absent)
{
    json_error_t jerr;
    json_t *kw = req->template_kwargs ? json_loads(req->template_kwargs, 0, &jerr) : json_object();
    json_t *v = json_loads(value_json, JSON_DECODE_ANY, &jerr);
    char *out;
    int rc = 0;

    if (!v || !kw) {
        rc = v ? THAW_ENOMEM : THAW_EINVAL;
        goto done;
    }
    if (if_absent && json_object_get(kw, key))
        goto done;
    if (json_object_set(kw, key, v) != 0 || !(out = json_dumps(kw, JSON_COMPACT | JSON_SORT_KEYS))) {
        rc = THAW_ENOMEM;
        goto done;
    }
    free(req->template_kwargs);
    req->template_kwargs = out;
done:
    json_decref(v);
    json_decref(kw);
    return rc;
}

/* llama-server's reasoning fields: reasoning_budget_tokens (its alias
 * thinking_budget_tokens), reasoning_budget_message, and OpenAI's
 * reasoning_effort as the template's kwarg ("none": thinking off). After
 * chat_template_kwargs, which reasoning_effort overrides as there. */
static int parse_reasoning(json_t *root, struct thaw_chat_request *out, char *err, size_t errlen)
{
    static const char *const names[] = {"thinking_budget_tokens", "reasoning_budget_tokens"};
    double d;
    bool present;
    int rc;

    out->reasoning_budget = -1;
    for (int i = 0; i < 2; i++) { /* reasoning_budget_tokens wins when both are sent */
        if ((rc = get_int(root, names[i], -1, INT32_MAX, &d, &present, err, errlen)) != 0)
            return rc;
        if (present && (i == 1 || out->reasoning_budget < 0))
            out->reasoning_budget = (int)d;
    }
    json_t *m = json_object_get(root, "reasoning_budget_message");
    if (m && !json_is_null(m)) {
        if (!json_is_string(m))
            return fail(err, errlen, "'reasoning_budget_message' must be a string");
        if (!(out->reasoning_budget_message = strdup(json_string_value(m))))
            return THAW_ENOMEM;
    }
    json_t *eff = json_object_get(root, "reasoning_effort");
    if (!eff || json_is_null(eff))
        return 0;
    if (!json_is_string(eff) || json_string_length(eff) == 0)
        return fail(err, errlen, "'reasoning_effort' must be a non-empty string (none, minimal, low, medium, high, ...)");
    const char *e = json_string_value(eff);
    if (strcmp(e, "none") == 0)
        return thaw_api_kwargs_set(out, "enable_thinking", "false", false);
    json_t *s = json_string(e);
    char *txt = s ? json_dumps(s, JSON_ENCODE_ANY) : NULL;
    json_decref(s);
    rc = txt ? thaw_api_kwargs_set(out, "reasoning_effort", txt, false) : THAW_ENOMEM;
    free(txt);
    return rc;
}

/* One logit_bias value: a number, or false (banned). */
static int bias_value(json_t *v, const char *where, float *out, char *err, size_t errlen)
{
    if (json_is_false(v)) {
        *out = -INFINITY;
        return 0;
    }
    if (!json_is_number(v) || !isfinite(json_number_value(v)))
        return fail(err, errlen, "%s must be a number or false", where);
    *out = (float)json_number_value(v);
    return 0;
}

static int parse_logit_bias(json_t *root, struct thaw_chat_request *out, char *err, size_t errlen)
{
    json_t *lb = json_object_get(root, "logit_bias"), *v;
    size_t n = json_is_object(lb) ? json_object_size(lb) : json_is_array(lb) ? json_array_size(lb) : 0, i = 0;
    char where[64];

    if (!lb || json_is_null(lb) || n == 0)
        return 0;
    if (n > 65536)
        return fail(err, errlen, "'logit_bias' holds more than 65536 entries");
    if (!(out->bias = calloc(n, sizeof *out->bias)))
        return THAW_ENOMEM;
    if (json_is_object(lb)) {
        const char *k;
        json_object_foreach(lb, k, v) {
            char *end;
            long id = strtol(k, &end, 10);
            struct thaw_api_bias *b = &out->bias[out->n_bias];
            snprintf(where, sizeof where, "logit_bias[\"%.24s\"]", k);
            if (!*k || *end || id < 0 || id > INT32_MAX) { /* llama-server: a key that is no id is text */
                b->token = -1;
                if (!(b->text = strdup(k)))
                    return THAW_ENOMEM;
            } else {
                b->token = (int32_t)id;
            }
            out->n_bias++;
            if (bias_value(v, where, &b->bias, err, errlen) != 0)
                return THAW_EINVAL;
        }
        return 0;
    }
    json_array_foreach(lb, i, v) {
        json_t *key = json_array_get(v, 0);
        struct thaw_api_bias *b = &out->bias[out->n_bias];
        snprintf(where, sizeof where, "logit_bias[%zu][1]", i);
        if (!json_is_array(v) || json_array_size(v) != 2 || !(json_is_integer(key) || json_is_string(key)))
            return fail(err, errlen, "logit_bias[%zu] must be [token id or text, bias or false]", i);
        if (json_is_integer(key)) {
            if (json_integer_value(key) < 0 || json_integer_value(key) > INT32_MAX)
                return fail(err, errlen, "logit_bias[%zu][0] must be a token id", i);
            b->token = (int32_t)json_integer_value(key);
        } else {
            b->token = -1;
            if (!(b->text = strdup(json_string_value(key))))
                return THAW_ENOMEM;
        }
        out->n_bias++;
        if (bias_value(json_array_get(v, 1), where, &b->bias, err, errlen) != 0)
            return THAW_EINVAL;
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
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    int rc;

    memset(out, 0, sizeof *out);
    if (!root)
        return fail(err, errlen, "request body is not valid JSON: %s (line %d, column %d)", jerr.text, jerr.line,
                    jerr.column);
    rc = thaw_api_parse_chat_json(root, default_cache_prompt, out, err, errlen);
    json_decref(root);
    return rc;
}

int thaw_api_parse_chat_json(json_t *root, bool default_cache_prompt, struct thaw_chat_request *out, char *err,
                             size_t errlen)
{
    double d;
    bool present;
    int rc;

    memset(out, 0, sizeof *out);
    out->max_tokens = -1;
    out->temperature = NAN; /* not sent: the server's --temp, --top-p, --min-p, --top-k */
    out->top_p = NAN;
    out->min_p = NAN;
    out->top_k = -1;
    for (int i = 0; i < THAW_API_SMP_COUNT; i++)
        out->smp[i] = NAN;
    out->ignore_eos = -1;
    out->cache_prompt = default_cache_prompt;
    out->add_generation_prompt = true;
    out->id_slot = -1;
    out->verbose = -1;

    if (!json_is_object(root)) {
        rc = fail(err, errlen, "request body must be a JSON object");
        goto error;
    }
    if ((rc = parse_messages(root, out, err, errlen)) != 0 || (rc = parse_agent_fields(root, out, err, errlen)) != 0 ||
        (rc = refuse_unsupported(root, err, errlen)) != 0)
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
    json_t *pck = json_object_get(root, "prompt_cache_key");
    if (pck && !json_is_null(pck)) {
        if (!json_is_string(pck)) {
            rc = fail(err, errlen, "'prompt_cache_key' must be a string");
            goto error;
        }
        if (json_string_length(pck) > THAW_API_MAX_CONVERSATION_ID) {
            rc = fail(err, errlen, "'prompt_cache_key' is longer than %d bytes", THAW_API_MAX_CONVERSATION_ID);
            goto error;
        }
        if (!(out->prompt_cache_key = strdup(json_string_value(pck)))) {
            rc = THAW_ENOMEM;
            goto error;
        }
    }
    if ((rc = thaw_api_get_bool(root, "stream", &out->stream, err, errlen)) != 0)
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
    for (int i = 0; i < THAW_API_SMP_COUNT; i++) {
        const struct thaw_api_smp_field *f = &thaw_api_smp_fields[i];
        if ((rc = (f->integer ? get_int : get_number)(root, f->name, f->lo, f->hi, &d, &present, err, errlen)) != 0)
            goto error;
        out->smp[i] = present ? d : NAN;
    }
    if (json_object_get(root, "ignore_eos") && !json_is_null(json_object_get(root, "ignore_eos"))) {
        bool b = false;
        if ((rc = thaw_api_get_bool(root, "ignore_eos", &b, err, errlen)) != 0)
            goto error;
        out->ignore_eos = b;
    }
    out->n_choices = 1;
    if ((rc = get_int(root, "n", 1, THAW_API_MAX_N, &d, &present, err, errlen)) != 0)
        goto error;
    if (present)
        out->n_choices = (int)d;
    if ((rc = parse_stop(root, out, err, errlen)) != 0)
        goto error;
    if ((rc = thaw_api_get_bool(root, "cache_prompt", &out->cache_prompt, err, errlen)) != 0)
        goto error;
    if ((rc = parse_continuation(root, out, err, errlen)) != 0 || (rc = parse_reasoning(root, out, err, errlen)) != 0)
        goto error;
    if ((rc = parse_logit_bias(root, out, err, errlen)) != 0)
        goto error;
    if ((rc = get_int(root, "id_slot", -1, 1 << 20, &d, &present, err, errlen)) != 0)
        goto error;
    if (present)
        out->id_slot = (int)d;
    if ((rc = parse_probs(root, out, err, errlen)) != 0 ||
        (rc = thaw_api_get_bool(root, "return_progress", &out->return_progress, err, errlen)) != 0 ||
        (rc = thaw_api_get_bool(root, "timings_per_token", &out->timings_per_token, err, errlen)) != 0)
        goto error;
    json_t *verbose = json_object_get(root, "verbose");
    if (verbose && !json_is_null(verbose)) {
        bool b = false;
        if ((rc = thaw_api_get_bool(root, "verbose", &b, err, errlen)) != 0)
            goto error;
        out->verbose = b;
    }
    return 0;

error:
    thaw_chat_request_free(out);
    return rc;
}

int thaw_api_parse_via_chat(const char *body, size_t len, bool default_cache_prompt, thaw_api_convert_fn convert,
                            struct thaw_chat_request *out, char *err, size_t errlen)
{
    json_error_t jerr;
    json_t *root = NULL, *oai = NULL;
    int rc;

    memset(out, 0, sizeof *out);
    root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return fail(err, errlen, "request body is not valid JSON: %s (line %d, column %d)", jerr.text, jerr.line,
                    jerr.column);
    if (!json_is_object(root)) {
        rc = fail(err, errlen, "request body must be a JSON object");
        goto out;
    }
    if (!(oai = json_object())) {
        rc = THAW_ENOMEM;
        goto out;
    }
    if ((rc = convert(root, oai, err, errlen)) == 0 &&
        (rc = thaw_api_parse_chat_json(oai, default_cache_prompt, out, err, errlen)) == 0) {
        json_t *marks = json_object_get(oai, THAW_API_RETAIN_KEY), *m;
        size_t i;
        json_array_foreach(marks, i, m) {
            if (out->n_retain == THAW_API_MAX_RETAIN)
                break;
            out->retain[out->n_retain].n_msgs = (int)json_integer_value(json_array_get(m, 0));
            out->retain[out->n_retain].ttl_s = (int)json_integer_value(json_array_get(m, 1));
            out->n_retain++;
        }
    }
out:
    json_decref(oai);
    json_decref(root);
    return rc;
}

void thaw_chat_request_free(struct thaw_chat_request *req)
{
    for (size_t i = 0; i < req->n_messages; i++) {
        free(req->messages[i].role);
        free(req->messages[i].content);
        free(req->messages[i].json);
        free(req->messages[i].render);
    }
    for (int i = 0; i < req->n_bias; i++)
        free(req->bias[i].text);
    free(req->bias);
    free(req->response_fields);
    free(req->bias_tok);
    free(req->bias_val);
    free(req->tools_json);
    free(req->tool_choice);
    free(req->reasoning_budget_message);
    free(req->tool_choice_name);
    free(req->json_schema);
    free(req->template_kwargs);
    free(req->grammar);
    free(req->raw_text);
    free(req->raw_tokens);
    for (size_t i = 0; i < req->n_images; i++) {
        free(req->images[i].data);
        free(req->images[i].path);
    }
    free(req->images);
    for (int i = 0; i < req->n_raw_pieces; i++)
        free(req->raw_pieces[i]);
    free(req->raw_pieces);
    free(req->messages);
    free(req->model);
    free(req->prompt_cache_key);
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
    if (req->raw_text)
        bytes += strlen(req->raw_text);
    for (int i = 0; i < req->n_raw_pieces; i++)
        bytes += strlen(req->raw_pieces[i]);
    if (req->n_raw_tokens >= n_ctx_slot)
        return fail(err, errlen, "'prompt' holds %d tokens; a slot's context holds %d tokens (-c / -np)",
                    req->n_raw_tokens, n_ctx_slot);
    /* every token covers at most max_token_bytes of text */
    if (bytes / (size_t)max_token_bytes >= (size_t)n_ctx_slot)
        return fail(err, errlen,
                    "%s %zu bytes of text: at least %zu tokens, more than a slot's context of %d "
                    "tokens (-c / -np)",
                    req->raw ? "'prompt' holds" : "'messages' hold", bytes, bytes / (size_t)max_token_bytes, n_ctx_slot);
    return 0;
}

/* ---- responses ---------------------------------------------------------------- */

char *thaw_api_dump(json_t *root)
{
    char *s = root ? json_dumps(root, JSON_COMPACT) : NULL;

    json_decref(root);
    return s;
}

json_t *thaw_api_timings_json(const struct thaw_timings *t)
{
    double pps = t->prompt_ms > 0 ? t->prompt_n * 1000.0 / t->prompt_ms : 0;
    /* the generation rate is over decode steps, as llama-server's: the first
     * token comes from the prompt's last batch and costs none of predicted_ms */
    int steps = t->predicted_n > 0 ? t->predicted_n - 1 : 0;
    double gps = t->predicted_ms > 0 ? steps * 1000.0 / t->predicted_ms : 0;

    return json_pack("{s:i, s:i, s:f, s:f, s:f, s:i, s:f, s:f, s:f, s:f, s:i, s:i, s:i}", "cache_n", t->cache_n,
                     "prompt_n", t->prompt_n, "prompt_ms", t->prompt_ms, "prompt_per_token_ms",
                     t->prompt_n ? t->prompt_ms / t->prompt_n : 0.0, "prompt_per_second", pps, "predicted_n",
                     t->predicted_n, "predicted_ms", t->predicted_ms, "predicted_per_token_ms",
                     steps ? t->predicted_ms / steps : 0.0, "predicted_per_second", gps,
                     "restore_ms", t->restore_ms,
                     "draft_n", t->draft_n, "draft_n_accepted", t->draft_n_accepted, "draft_restored",
                     t->draft_restored);
}

int thaw_api_set_timings(json_t *o, const struct thaw_timings *t)
{
    if (json_object_set_new(o, "timings", thaw_api_timings_json(t)) != 0 ||
        json_object_set_new(o, "cache_source", json_string(t->cache_source ? t->cache_source : "none")) != 0)
        return THAW_ENOMEM;
    return 0;
}

json_t *thaw_api_usage_json(int prompt_tokens, const struct thaw_timings *t)
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
    else if (status == 501)
        type = "not_supported_error"; /* llama-server's, for what a server was not started to serve */
    else if (status >= 500)
        type = "server_error";
    char *out = clean ? thaw_api_dump(json_pack("{s:{s:s, s:s, s:i}}", "error", "message", clean, "type", type, "code", status))
                      : NULL;
    free(clean);
    return out;
}

char *thaw_api_too_long_json(int n_prompt, int n_ctx_slot)
{
    char msg[160];

    /* llama-server's words first: its clients and tests look for them */
    snprintf(msg, sizeof msg,
             "request (%d tokens) exceeds the available context size (%d tokens), try increasing it (a slot's "
             "context is -c / -np)",
             n_prompt, n_ctx_slot);
    return thaw_api_dump(json_pack("{s:{s:s, s:s, s:i, s:i, s:i}}", "error", "message", msg, "type",
                          "exceed_context_size_error", "code", 400, "n_prompt_tokens", n_prompt, "n_ctx", n_ctx_slot));
}

char *thaw_api_completion_json(const char *id, const char *model, long created, const char *message_json,
                               const char *finish_reason, int prompt_tokens, const struct thaw_timings *t)
{
    json_error_t jerr;
    json_t *msg = json_loads(message_json, 0, &jerr);

    if (!msg)
        return NULL;
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:s, s:[{s:i, s:o, s:s}], s:o}", "id", id, "object",
                          "chat.completion", "created", (json_int_t)created, "model", model, "system_fingerprint",
                          thaw_tmpl_build_fingerprint(), "choices", "index", 0, "message", msg, "finish_reason",
                          finish_reason, "usage", thaw_api_usage_json(prompt_tokens, t));
    if (o && thaw_api_set_timings(o, t) != 0) {
        json_decref(o);
        o = NULL;
    }
    return thaw_api_dump(o);
}

char *thaw_api_chunk_delta_json(const char *id, const char *model, long created, const char *diff_json)
{
    json_error_t jerr;
    json_t *d = json_loads(diff_json, 0, &jerr), *delta = json_object(), *v;

    if (!d || !delta) {
        json_decref(d);
        json_decref(delta);
        return NULL;
    }
    if ((v = json_object_get(d, "content")))
        json_object_set(delta, "content", v);
    if ((v = json_object_get(d, "reasoning_content")))
        json_object_set(delta, "reasoning_content", v);
    if ((v = json_object_get(d, "tool_call_index"))) {
        json_t *fn = json_object(), *call = json_pack("{s:O}", "index", v);
        json_t *name = json_object_get(d, "name"), *cid = json_object_get(d, "id"), *args = json_object_get(d, "arguments");
        if (cid) { /* a call's first delta: its id, type and name, once */
            json_object_set(call, "id", cid);
            json_object_set_new(call, "type", json_string("function"));
        }
        if (name)
            json_object_set(fn, "name", name);
        json_object_set_new(fn, "arguments", args ? json_incref(args) : json_string(""));
        json_object_set_new(call, "function", fn);
        json_object_set_new(delta, "tool_calls", json_pack("[o]", call));
    }
    json_decref(d);
    return thaw_api_dump(json_pack("{s:s, s:s, s:I, s:s, s:s, s:[{s:i, s:o, s:n}]}", "id", id, "object",
                          "chat.completion.chunk", "created", (json_int_t)created, "model", model,
                          "system_fingerprint", thaw_tmpl_build_fingerprint(), "choices", "index", 0, "delta", delta,
                          "finish_reason"));
}

char *thaw_api_chunk_json(const char *id, const char *model, long created, const char *role,
                          const char *content, const char *finish_reason, const struct thaw_timings *timings,
                          int prompt_tokens, bool usage_only)
{
    json_t *root = json_pack("{s:s, s:s, s:I, s:s, s:s}", "id", id, "object", "chat.completion.chunk", "created",
                             (json_int_t)created, "model", model, "system_fingerprint", thaw_tmpl_build_fingerprint());
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
        (void)thaw_api_set_timings(root, timings);
    if (usage_only)
        json_object_set_new(root, "usage", thaw_api_usage_json(prompt_tokens, timings));
    return thaw_api_dump(root);
}

/* "a,b,c" -> ["a","b","c"] (empty names dropped); NULL -> []. */
static json_t *comma_list(const char *s)
{
    json_t *a = json_array();

    for (const char *p = s; a && p && *p;) {
        size_t n = strcspn(p, ",");
        if (n > 0)
            json_array_append_new(a, json_stringn(p, n));
        p += n;
        if (*p == ',')
            p++;
    }
    return a;
}

char *thaw_api_models_json(const char *model, const char *tags, long created, const struct thaw_model_meta *m)
{
    json_t *meta = json_pack("{s:i, s:i, s:i, s:i, s:i, s:I, s:I}", "vocab_type", m->vocab_type, "n_vocab", m->n_vocab,
                             "n_ctx", m->n_ctx_slot, "n_ctx_train", m->n_ctx_train, "n_embd", m->n_embd, "n_params",
                             (json_int_t)m->n_params, "size", (json_int_t)m->size_bytes);
    json_t *details = json_pack("{s:s, s:s, s:s, s:[s], s:s, s:s}", "parent_model", "", "format", "gguf", "family", "",
                                "families", "", "parameter_size", "", "quantization_level", "");
    json_t *aliases = comma_list(model), *v;
    const char *id = NULL;
    size_t i;

    json_array_foreach(aliases, i, v)
        if (!id || strcmp(json_string_value(v), id) < 0)
            id = json_string_value(v);
    if (!id)
        id = model;
    json_t *caps = m->vision ? json_pack("[s, s]", "completion", "multimodal") : json_pack("[s]", "completion");
    return thaw_api_dump(json_pack("{s:[{s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:[s], s:o, s:s, s:o}], s:s, "
                          "s:[{s:s, s:o, s:o, s:s, s:I, s:s, s:o}]}",
                          "models", "name", id, "model", id, "modified_at", "", "size", "", "digest", "", "type",
                          "model", "description", "", "tags", "", "capabilities", caps, "parameters", "",
                          "details", details, "object", "list", "data", "id", id, "aliases", aliases, "tags",
                          comma_list(tags), "object", "model", "created", (json_int_t)created, "owned_by", "thaw",
                          "meta", meta));
}

/* ---- the codec ------------------------------------------------------------------ */

#undef fail /* the table's field of that name */

static void chat_place_logprobs(json_t *root, json_t *lp)
{
    json_t *choice = json_array_get(json_object_get(root, "choices"), 0);

    if (choice)
        json_object_set_new(choice, "logprobs", json_pack("{s:O}", "content", lp));
}

static char *chat_reply(const struct thaw_reply *r)
{
    char *body = thaw_api_completion_json(r->id, r->model, r->created, r->message_json, r->finish_reason,
                                          r->n_prompt, r->timings);

    return thaw_codec_add_extras(r, body, false, chat_place_logprobs);
}

static int chat_open(struct thaw_codec_stream *st)
{
    char *chunk = thaw_api_chunk_json(st->id, st->model, st->created, "assistant", "", NULL, NULL, 0, false);

    return thaw_codec_emit_text(st, NULL, chunk);
}

/* llama-server's prompt_progress rides a role delta whose content is null */
static int chat_progress(struct thaw_codec_stream *st, int processed, int64_t time_us, int cache_n)
{
    json_t *root =
        thaw_codec_loads(thaw_api_chunk_json(st->id, st->model, st->created, "assistant", NULL, NULL, NULL, 0, false));

    if (root)
        json_object_set_new(json_object_get(json_array_get(json_object_get(root, "choices"), 0), "delta"), "content",
                            json_null());
    return thaw_codec_emit_progress(st, NULL, root, processed, time_us, cache_n);
}

static int chat_delta(struct thaw_codec_stream *st, json_t *diff)
{
    char *ds = json_dumps(diff, JSON_COMPACT);
    char *chunk = ds ? thaw_api_chunk_delta_json(st->id, st->model, st->created, ds) : NULL;

    free(ds);
    return thaw_codec_emit_text(st, NULL, thaw_codec_timings_attach(st, thaw_codec_lp_attach(st, chunk, false)));
}

static int chat_close(struct thaw_codec_stream *st)
{
    const struct thaw_reply *r = st->reply;
    char *last = thaw_api_chunk_json(st->id, st->model, st->created, NULL, NULL, r->finish_reason, r->timings,
                                     r->n_prompt, false);
    /* entries of text no delta carried (a parser that held it to the end) */
    size_t to = st->lp_from;
    if (st->req->logprobs)
        json_decref(st->rd->logprobs(st->rd->ud, st->lp_from, st->n_text, true, false, &to));
    int rc = thaw_codec_emit_text(st, NULL, to > st->lp_from ? thaw_codec_lp_attach(st, last, false) : last);

    if (rc == 0 && st->req->include_usage)
        rc = thaw_codec_emit_text(st, NULL, thaw_api_chunk_json(st->id, st->model, st->created, NULL, NULL, NULL,
                                                                r->timings, r->n_prompt, true));
    return rc ? rc : st->put(st->sink, NULL, "[DONE]");
}

static int chat_fail(struct thaw_codec_stream *st, int status, const char *message)
{
    return thaw_codec_emit_text(st, NULL, thaw_api_error_json(status, message));
}

const struct thaw_codec thaw_codec_chat = {
    .name = "chat",
    .id_prefix = "chatcmpl-",
    .auth_hint = THAW_API_AUTH_HINT,
    .caps = THAW_CODEC_VERBOSE,
    .parse = thaw_api_parse_chat,
    .error_json = thaw_api_error_json,
    .too_long_json = thaw_api_too_long_json,
    .reply = chat_reply,
    .merge_choice = thaw_codec_merge_choice,
    .open = chat_open,
    .progress = chat_progress,
    .delta = chat_delta,
    .close = chat_close,
    .fail = chat_fail,
};

char *thaw_api_router_models_json(int n, const struct thaw_api_router_model *models, long created)
{
    json_t *data = json_array();

    for (int i = 0; data && i < n; i++) {
        const struct thaw_api_router_model *m = &models[i];
        json_t *status = json_pack("{s:s, s:[]}", "value", m->status, "args");
        if (status && m->stage)
            json_object_set_new(status, "progress",
                                json_pack("{s:[s,s*], s:s, s:f}", "stages", "text_model",
                                          m->vision ? "mmproj_model" : NULL, "current", m->stage, "value",
                                          (double)m->progress));
        if (status && m->waiting > 0)
            json_object_set_new(status, "waiting", json_integer(m->waiting));
        if (status && m->failed) {
            json_object_set_new(status, "failed", json_true());
            json_object_set_new(status, "exit_code", json_integer(1));
        }
        json_array_append_new(data, json_pack("{s:s, s:o, s:[], s:s, s:s, s:I, s:o, s:{s:[s,s*], s:[s]}}", "id",
                                              m->name, "aliases", comma_list(m->aliases), "tags", "object", "model",
                                              "owned_by", "thaw", "created", (json_int_t)created, "status", status,
                                              "architecture", "input_modalities", "text",
                                              m->vision ? "image" : NULL, "output_modalities", "text"));
    }
    return thaw_api_dump(json_pack("{s:o, s:s}", "data", data, "object", "list"));
}

char *thaw_api_request_model(const char *body, size_t n_body)
{
    json_t *root = body && n_body ? json_loadb(body, n_body, 0, NULL) : NULL;
    const char *s = json_is_object(root) ? json_string_value(json_object_get(root, "model")) : NULL;
    char *model = s ? strdup(s) : NULL;

    json_decref(root);
    return model;
}
