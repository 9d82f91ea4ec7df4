/* api_llamaserver.h — llama-server's endpoints that are no chat codec:
 * their request bodies parsed and their replies written (JSON text; the
 * routes are http/server.c's). The chat, completions, Anthropic and
 * Responses codecs are codec.h's.
 */
#ifndef THAW_API_LLAMASERVER_H
#define THAW_API_LLAMASERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* POST /tokenize {"content", "add_special"?, "with_pieces"?}: 0 and a
 * malloc'd *content, or THAW_EINVAL (reason in err) / THAW_ENOMEM. */
int thaw_api_parse_tokenize(const char *body, size_t len, char **content, bool *add_special, bool *with_pieces,
                            char *err, size_t errlen);
/* POST /detokenize {"tokens": [ids]}: each id checked against n_vocab; 0
 * and a malloc'd *tokens (n of them), or THAW_EINVAL / THAW_ENOMEM. */
int thaw_api_parse_detokenize(const char *body, size_t len, int n_vocab, int32_t **tokens, size_t *n, char *err,
                              size_t errlen);
/* {"tokens": [ids]} or, with pieces, {"tokens": [{"id", "piece"}]}. */
char *thaw_api_tokens_json(const int32_t *tokens, size_t n, char *const *pieces);
/* {key: text} (text made valid UTF-8): /detokenize's "content", /apply-template's "prompt". */
char *thaw_api_string_json(const char *key, const char *text);
/* GET /props, llama-server's shape (the fields clients read): the model's
 * alias and path, default_generation_settings (n_ctx of a slot and the
 * sampling defaults a request gets, `smp`, with -n as n_predict),
 * build_info; and thaw's "placement" from `pl` (omitted when NULL):
 * {"n_layer", "kv_cache": "Vulkan0" | "host" | "Vulkan0+host" | "none",
 *  "split_layers": "0,3-4", "places": [{"name", "host", "layers": "0-11",
 *  "n_layers", "output", "weights_bytes", "kv_bytes", "compute_bytes",
 *  and for a device "description", "memory_total", "memory_free"}]},
 * the devices first, then the host. */
/* With `embd` (a server started with --embedding; NULL otherwise) also
 * "embedding": true, "pooling", "embd_normalize", "rerank" and
 * "kv_cache_embeddings": a sentence saying the KV cache is not used for
 * them. */
struct thaw_sampling;
struct thaw_placement;
struct thaw_props_embedding {
    const char *pooling; /* none | mean | cls | last | rank */
    int embd_normalize;
    bool rerank;         /* /rerank is served */
};
/* What a server can change at run time (POST /props, --props), and GET
 * /props shows: the reasoning budget requests default to. */
struct thaw_api_props_live {
    bool endpoint_props;              /* --props: POST /props is on */
    int reasoning_budget;             /* -1 unlimited */
    const char *reasoning_budget_message; /* NULL = none */
    bool vision;                      /* --mmproj: requests may carry images ("modalities") */
};
/* POST /props's body: a JSON object of the settings to change, each by
 * its request field's name: reasoning_budget_tokens (an integer >= -1),
 * reasoning_budget_message (a string, "" = none). Any other key is a
 * THAW_EINVAL naming it (thaw fixes the rest at start-up: its flag says
 * how); so is a bad value. Fills `out` (out->reasoning_budget_message is
 * malloc'd, the caller frees; *has_budget / *has_message say what was
 * sent). Returns 0, THAW_EINVAL (reason in err) or THAW_ENOMEM. */
int thaw_api_parse_props(const char *body, size_t len, bool *has_budget, bool *has_message,
                         struct thaw_api_props_live *out, char *err, size_t errlen);
/* GET /props of a server of many models asked for no model in particular:
 * llama-server's router answer ({"role": "router", "max_instances",
 * "models_autoload", "build_info", and its placeholders "model_alias",
 * "model_path", "default_generation_settings"}). NULL on ENOMEM. */
char *thaw_api_router_props_json(int models_max, bool models_autoload);

/* GET /props of a model asleep (--sleep-idle-seconds): its name and path,
 * "is_sleeping": true (llama-server's), nothing that needs it loaded. */
char *thaw_api_sleeping_props_json(const char *model, const char *model_path);

/* `live` may be NULL (the fields are then left out). */
char *thaw_api_props_json(const struct thaw_api_props_live *live, const char *model, const char *model_path,
                          const char *chat_template, int total_slots,
                          int n_ctx_slot, bool jinja, bool kv_cache, const struct thaw_sampling *smp, int n_predict,
                          const struct thaw_placement *pl, const struct thaw_props_embedding *embd);
/* GET /cache: {"object":"thaw.cache","metrics":{name: number}} from the
 * Prometheus text of thaw_metrics_render (its sample lines, "thaw_" cut from
 * each name), so the page and /metrics can never disagree: counts and sizes
 * only, no text of any conversation. NULL only on ENOMEM. */
char *thaw_api_cache_json(const char *prometheus_text);

#endif
