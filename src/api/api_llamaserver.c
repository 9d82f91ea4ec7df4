/* api_llamaserver.c — the bodies of llama-server's endpoints that are no
 * chat codec (api_llamaserver.h): /tokenize, /detokenize, /apply-template,
 * /props, and thaw's /cache.
 *
 * Map: the request bodies (/tokenize, /detokenize), then the replies
 * (tokens, a string, /cache's metrics, /props with the placement).
 */
#include "api/api_llamaserver.h"

#include "api/api_wire.h"
#include "api/template.h"
#include "base/error.h"
#include "base/sampling.h"
#include "base/utf8.h"
#include "llama/placement.h"
#include "llama/vision.h"

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define fail thaw_api_fail /* the short name this file's checks use */

int thaw_api_parse_tokenize(const char *body, size_t len, char **content, bool *add_special, bool *with_pieces,
                            char *err, size_t errlen)
{
    json_t *root = thaw_api_load_object(body, len, err, errlen);
    int rc = THAW_EINVAL;

    *content = NULL;
    *add_special = false;
    *with_pieces = false;
    if (!root)
        return THAW_EINVAL;
    json_t *c = json_object_get(root, "content");
    if (!json_is_string(c)) {
        fail(err, errlen, "'content' must be a string");
        goto out;
    }
    if (thaw_api_get_bool(root, "add_special", add_special, err, errlen) != 0 ||
        thaw_api_get_bool(root, "with_pieces", with_pieces, err, errlen) != 0)
        goto out;
    rc = (*content = strndup(json_string_value(c), json_string_length(c))) ? 0 : THAW_ENOMEM;
out:
    json_decref(root);
    return rc;
}

int thaw_api_parse_detokenize(const char *body, size_t len, int n_vocab, int32_t **tokens, size_t *n, char *err,
                              size_t errlen)
{
    json_t *root = thaw_api_load_object(body, len, err, errlen), *arr, *v;
    size_t i;
    int rc = THAW_EINVAL;

    *tokens = NULL;
    *n = 0;
    if (!root)
        return THAW_EINVAL;
    arr = json_object_get(root, "tokens");
    if (!json_is_array(arr)) {
        fail(err, errlen, "'tokens' must be an array of token ids");
        goto out;
    }
    if (!(*tokens = malloc((json_array_size(arr) + 1) * sizeof **tokens))) {
        rc = THAW_ENOMEM;
        goto out;
    }
    json_array_foreach(arr, i, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= n_vocab) {
            fail(err, errlen, "tokens[%zu] must be a token id between 0 and %d", i, n_vocab - 1);
            free(*tokens);
            *tokens = NULL;
            goto out;
        }
        (*tokens)[i] = (int32_t)json_integer_value(v);
    }
    *n = json_array_size(arr);
    rc = 0;
out:
    json_decref(root);
    return rc;
}

char *thaw_api_tokens_json(const int32_t *tokens, size_t n, char *const *pieces)
{
    json_t *arr = json_array();

    for (size_t i = 0; arr && i < n; i++) {
        if (!pieces) {
            json_array_append_new(arr, json_integer(tokens[i]));
            continue;
        }
        /* a piece that is not UTF-8 (a byte-fallback token, half a
         * character) is its bytes, as llama-server sends it */
        json_t *piece = json_string(pieces[i]);
        if (!piece && (piece = json_array()))
            for (const unsigned char *p = (const unsigned char *)pieces[i]; *p; p++)
                json_array_append_new(piece, json_integer(*p));
        json_array_append_new(arr, json_pack("{s:i, s:o}", "id", (int)tokens[i], "piece", piece));
    }
    return thaw_api_dump(json_pack("{s:o}", "tokens", arr));
}

char *thaw_api_string_json(const char *key, const char *text)
{
    char *clean = thaw_utf8_sanitize(text, strlen(text));
    char *out = clean ? thaw_api_dump(json_pack("{s:s}", key, clean)) : NULL;

    free(clean);
    return out;
}

char *thaw_api_cache_json(const char *text)
{
    json_t *m = json_object();

    for (const char *p = text; m && *p;) {
        size_t n = strcspn(p, "\n");
        const char *sp = memchr(p, ' ', n);
        if (*p != '#' && sp && n > 5 && strncmp(p, "thaw_", 5) == 0 && (size_t)(sp - p) < 128) {
            char name[128];
            memcpy(name, p + 5, (size_t)(sp - p) - 5);
            name[sp - p - 5] = '\0';
            double v = strtod(sp + 1, NULL);
            /* counters and byte gauges are integers: keep them exact */
            json_object_set_new(m, name,
                                isfinite(v) && v == floor(v) && fabs(v) < 9e15 ? json_integer((json_int_t)v)
                                                                               : json_real(isfinite(v) ? v : 0));
        }
        p += n;
        if (*p == '\n')
            p++;
    }
    return m ? thaw_api_dump(json_pack("{s:s, s:o}", "object", "thaw.cache", "metrics", m)) : NULL;
}

static json_t *placement_json(const struct thaw_placement *pl)
{
    char buf[512];
    json_t *places = json_array(), *o;

    thaw_placement_kv(pl, buf, sizeof buf);
    o = json_pack("{s:i, s:s, s:o}", "n_layer", pl->n_layer, "kv_cache", buf, "places", places);
    thaw_placement_layers(pl, THAW_PLACE_SPLIT, buf, sizeof buf);
    if (!o || json_object_set_new(o, "split_layers", json_string(buf)) != 0) {
        json_decref(o);
        return NULL;
    }
    for (int k = 1; k <= pl->n_places; k++) {
        int i = k % pl->n_places; /* the devices, then the host */
        const struct thaw_place *p = &pl->places[i];
        thaw_placement_layers(pl, i, buf, sizeof buf);
        json_t *e = json_pack("{s:s, s:b, s:s, s:i, s:b, s:I, s:I, s:I}", "name", p->name, "host", p->host, "layers",
                              buf, "n_layers", p->n_layers, "output", p->output, "weights_bytes",
                              (json_int_t)p->weights_bytes, "kv_bytes", (json_int_t)p->kv_bytes, "compute_bytes",
                              (json_int_t)p->compute_bytes);
        if (e && !p->host)
            json_object_update_new(e, json_pack("{s:s, s:I, s:I}", "description", p->desc, "memory_total",
                                                (json_int_t)p->mem_total, "memory_free", (json_int_t)p->mem_free));
        if (!e || json_array_append_new(places, e) != 0) {
            json_decref(o);
            return NULL;
        }
    }
    return o;
}

int thaw_api_parse_props(const char *body, size_t len, bool *has_budget, bool *has_message,
                         struct thaw_api_props_live *out, char *err, size_t errlen)
{
    json_error_t jerr;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr), *v;
    const char *key;
    int rc = 0;

    *has_budget = *has_message = false;
    memset(out, 0, sizeof *out);
    if (!json_is_object(root)) {
        snprintf(err, errlen, "POST /props takes a JSON object of the settings to change");
        rc = THAW_EINVAL;
        goto done;
    }
    json_object_foreach(root, key, v) {
        if (strcmp(key, "reasoning_budget_tokens") == 0) {
            if (!json_is_integer(v) || json_integer_value(v) < -1 || json_integer_value(v) > INT32_MAX) {
                snprintf(err, errlen, "'reasoning_budget_tokens' must be an integer, -1 (unlimited) or more");
                rc = THAW_EINVAL;
                goto done;
            }
            out->reasoning_budget = (int)json_integer_value(v);
            *has_budget = true;
        } else if (strcmp(key, "reasoning_budget_message") == 0) {
            if (!json_is_string(v)) {
                snprintf(err, errlen, "'reasoning_budget_message' must be a string (\"\" for none)");
                rc = THAW_EINVAL;
                goto done;
            }
            if (!(out->reasoning_budget_message = strdup(json_string_value(v)))) {
                rc = THAW_ENOMEM;
                goto done;
            }
            *has_message = true;
        } else {
            snprintf(err, errlen,
                     "'%.64s' cannot be changed at run time: POST /props changes reasoning_budget_tokens and "
                     "reasoning_budget_message; the rest is set by thaw serve's flags",
                     key);
            rc = THAW_EINVAL;
            goto done;
        }
    }
done:
    if (rc != 0) {
        free((char *)out->reasoning_budget_message);
        out->reasoning_budget_message = NULL;
    }
    json_decref(root);
    return rc;
}

char *thaw_api_router_props_json(int models_max, bool models_autoload)
{
    return thaw_api_dump(json_pack("{s:s, s:i, s:b, s:s, s:s, s:{s:{}, s:i}, s:{}, s:s, s:b}", "role", "router",
                                   "max_instances", models_max, "models_autoload", models_autoload, "model_alias",
                                   "thaw", "model_path", "none", "default_generation_settings", "params", "n_ctx", 0,
                                   "ui_settings", "build_info", thaw_tmpl_build_fingerprint(), "cors_proxy_enabled",
                                   0));
}

char *thaw_api_sleeping_props_json(const char *model, const char *model_path)
{
    return thaw_api_dump(json_pack("{s:s, s:s, s:b, s:s}", "model_alias", model, "model_path",
                                   model_path ? model_path : "", "is_sleeping", true, "build_info",
                                   thaw_tmpl_build_fingerprint()));
}

char *thaw_api_props_json(const struct thaw_api_props_live *live, const char *model, const char *model_path,
                          const char *chat_template, int total_slots,
                          int n_ctx_slot, bool jinja, bool kv_cache, const struct thaw_sampling *smp, int n_predict,
                          const struct thaw_placement *pl, const struct thaw_props_embedding *embd)
{
    char *clean = thaw_utf8_sanitize(chat_template, strlen(chat_template));
    json_t *params = json_pack("{s:I, s:f, s:i, s:f, s:f, s:i, s:f, s:f, s:f, s:b}", "seed", (json_int_t)smp->seed,
                               "temperature", (double)smp->temp, "top_k", smp->top_k, "top_p", (double)smp->top_p,
                               "min_p", (double)smp->min_p, "n_predict", n_predict, "repeat_penalty",
                               (double)smp->penalty_repeat, "presence_penalty", (double)smp->penalty_present,
                               "frequency_penalty", (double)smp->penalty_freq, "ignore_eos", smp->ignore_eos);
    json_t *root = clean && params ? json_pack("{s:{s:i, s:o}, s:i, s:s, s:s, s:s, s:b, s:b, s:s, s:b}",
                                               "default_generation_settings", "n_ctx", n_ctx_slot, "params", params,
                                               "total_slots", total_slots, "model_alias", model, "model_path",
                                               model_path ? model_path : "", "chat_template", clean, "jinja", jinja,
                                               "kv_cache", kv_cache, "build_info", thaw_tmpl_build_fingerprint(),
                                               "is_sleeping", false)
                                   : (json_decref(params), NULL);
    json_t *where = root && pl ? placement_json(pl) : NULL;

    if (root && live && (json_object_set_new(root, "endpoint_props", json_boolean(live->endpoint_props)) != 0 ||
                         json_object_set_new(root, "modalities",
                                             json_pack("{s:b, s:b, s:b}", "vision", live->vision, "video", false,
                                                       "audio", false)) != 0 ||
                         json_object_set_new(root, "media_marker", json_string(thaw_vision_marker())) != 0 ||
                         json_object_set_new(params, "reasoning_budget_tokens", json_integer(live->reasoning_budget)) != 0 ||
                         json_object_set_new(params, "reasoning_budget_message",
                                             json_string(live->reasoning_budget_message ? live->reasoning_budget_message
                                                                                        : "")) != 0)) {
        json_decref(root);
        json_decref(where);
        return NULL;
    }

    free(clean);
    if (root && pl && (!where || json_object_set_new(root, "placement", where) != 0)) {
        json_decref(root);
        return NULL;
    }
    if (root && embd &&
        json_object_update_new(root, json_pack("{s:b, s:s, s:i, s:b, s:s}", "embedding", true, "pooling",
                                               embd->pooling, "embd_normalize", embd->embd_normalize, "rerank",
                                               embd->rerank, "kv_cache_embeddings",
                                               "not used: each embedding is computed afresh in one micro-batch; "
                                               "nothing is stored or restored")) != 0) {
        json_decref(root);
        return NULL;
    }
    return thaw_api_dump(root);
}
