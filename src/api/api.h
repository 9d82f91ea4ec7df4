/* api.h — OpenAI chat-completions JSON <-> thaw's request/response structs:
 * the one internal request every codec (codec.h) parses into, and the
 * chat API's builders (its table is thaw_codec_chat).
 *
 * Parsing validates every field it reads and names the offending field in
 * the error text, so a client learns what to fix from one 400. Builders
 * return malloc'd NUL-terminated JSON text the caller frees.
 */
#ifndef THAW_API_H
#define THAW_API_H

#include "llama/vision.h" /* struct thaw_image */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define THAW_API_MAX_STOP 4
#define THAW_API_MAX_RETAIN 2 /* retention hints kept per request: the furthest mark of each ttl */
/* Most choices one request may ask for ('n'): each is a generation of its own */
#define THAW_API_MAX_N 8
/* Longest conversation id a client may send (prompt_cache_key, the
 * X-Conversation-Id header), in bytes: an id, not a payload. */
#define THAW_API_MAX_CONVERSATION_ID 1024

struct thaw_message {
    char *role;    /* "system" | "user" | "assistant" | "developer" | "tool" */
    char *content; /* flattened: text parts joined, never NULL */
    char *json;    /* normalised message for the template and the keys: role
                    * (developer -> system), content (string or null),
                    * tool_calls, tool_call_id, name, reasoning_content;
                    * compact, keys sorted */
    char *render;  /* the message as the template gets it, when it differs from json: content of several
                    * text parts kept as parts (the chat library joins them as the template wants, as
                    * llama-server passes them); NULL = json */
};

/* The request's sampling fields beyond temperature/top_p/min_p/top_k/seed,
 * by llama-server's names (thaw_api_smp_names). */
enum thaw_api_smp {
    THAW_API_SMP_REPEAT_PENALTY,
    THAW_API_SMP_REPEAT_LAST_N,
    THAW_API_SMP_PRESENCE_PENALTY,
    THAW_API_SMP_FREQUENCY_PENALTY,
    THAW_API_SMP_TYPICAL_P,
    THAW_API_SMP_TOP_N_SIGMA,
    THAW_API_SMP_XTC_PROBABILITY,
    THAW_API_SMP_XTC_THRESHOLD,
    THAW_API_SMP_DRY_MULTIPLIER,
    THAW_API_SMP_DRY_BASE,
    THAW_API_SMP_DRY_ALLOWED_LENGTH,
    THAW_API_SMP_DRY_PENALTY_LAST_N,
    THAW_API_SMP_DYNATEMP_RANGE,
    THAW_API_SMP_DYNATEMP_EXPONENT,
    THAW_API_SMP_MIROSTAT,
    THAW_API_SMP_MIROSTAT_TAU,
    THAW_API_SMP_MIROSTAT_ETA,
    THAW_API_SMP_COUNT
};

/* Each field's JSON name, bounds, and whether it is an integer. */
struct thaw_api_smp_field {
    const char *name;
    double lo, hi;
    bool integer;
};
extern const struct thaw_api_smp_field thaw_api_smp_fields[THAW_API_SMP_COUNT];

struct thaw_chat_request {
    struct thaw_message *messages; /* n_messages, owned */
    size_t n_messages;
    struct thaw_image *images;     /* the messages' images in order, each a marker in its message's content
                                    * (thaw_vision_marker); n_images, owned */
    size_t n_images;
    char *model;                   /* as sent, may be NULL; not used for routing */
    char *prompt_cache_key;        /* OpenAI's conversation id, as sent (at most THAW_API_MAX_CONVERSATION_ID
                                    * bytes), NULL when absent: the proxy routes on it, thaw only logs it (its
                                    * cache keys come from the messages) */
    bool stream;
    bool include_usage;            /* stream_options.include_usage */
    int max_tokens;                /* -1 = server default (-n) */
    float temperature;             /* <= 0 means greedy; NAN = not sent (the server's --temp) */
    float top_p, min_p;            /* NAN = not sent (--top-p, --min-p) */
    int top_k;                     /* -1 = not sent (--top-k) */
    uint32_t seed;
    bool has_seed;
    /* llama-server's other sampling fields (repeat_penalty, presence_penalty,
     * dry_multiplier, mirostat, ...), over the server's flags: indexed by
     * enum thaw_api_smp, NAN = not sent (thaw_api_smp_names) */
    double smp[THAW_API_SMP_COUNT];
    int ignore_eos;                /* -1 = not sent (--ignore-eos) */
    char *stop[THAW_API_MAX_STOP]; /* n_stop, owned */
    int n_stop;
    bool cache_prompt;
    /* The template's generation prompt (llama-server's and transformers'
     * add_generation_prompt, default true) and assistant prefill: with
     * continue_final the last message is an assistant message the reply
     * continues (rendered open, no end of turn). A trailing assistant
     * message turns it on unless the request says continue_final_message
     * false, as llama-server's prefill_assistant does; it and an explicit
     * add_generation_prompt true are a 400, as are two trailing assistant
     * messages and a prefill with tool calls. */
    bool add_generation_prompt;
    bool continue_final;
    /* logit_bias: OpenAI's {"token id": bias} or llama-server's [[id or
     * text, bias or false], ...]; false bans. A text entry biases each of
     * its tokens: resolved into bias_tok/bias_val (owned, n_bias_tok) by
     * thaw_chat_resolve_bias once the vocabulary is at hand. */
    struct thaw_api_bias {
        int32_t token;             /* -1 when `text` is set */
        char *text;                /* owned */
        float bias;                /* -INFINITY = banned */
    } *bias;
    int n_bias;
    int32_t *bias_tok;
    float *bias_val;
    int n_bias_tok;
    char *response_fields;         /* /completion's response_fields: a JSON array of "a/b" paths, NULL = all */
    int id_slot;                   /* llama-server's id_slot: the slot to run on, -1 = any */
    int verbose;                   /* llama-server's 'verbose' (the reply's __verbose): 1, 0, -1 = not sent
                                    * (the server's -v decides) */
    /* per-token probabilities (logprobs.h): OpenAI's logprobs + top_logprobs
     * (chat; default 20 candidates, as llama-server), an integer logprobs
     * (/v1/completions), llama-server's n_probs > 0; post_sampling_probs:
     * the candidates after the sampler chain, as probabilities */
    bool logprobs;
    int n_probs;                   /* candidates per token, 0..THAW_LOGPROBS_MAX */
    bool post_sampling_probs;
    int n_choices;                 /* 'n': choices wanted, 1..THAW_API_MAX_N (the route serves each as a task) */
    bool return_progress;          /* llama-server's: a stream reports each prefill batch (prompt_progress) */
    bool timings_per_token;        /* llama-server's: each streamed piece carries the timings so far */

    /* agents (NULL = absent); JSON texts compact; tools and the schema keep
     * the client's key order (templates print tools as JSON, and a schema's
     * property order is the reply's: llama-server renders both as sent) */
    char *tools_json;              /* the 'tools' array, validated */
    char *tool_choice;             /* "auto" | "none" | "required" */
    char *tool_choice_name;        /* a named function (tool_choice is then "required") */
    bool parallel_tool_calls;
    char *json_schema;             /* response_format's schema ({"type":"object"} for json_object) */
    char *template_kwargs;         /* chat_template_kwargs object, keys sorted */
    char *grammar;                 /* GBNF from the request's 'grammar' (it wins over a template's); NULL = none */

    /* a raw completion (POST /v1/completions, /completion): no messages;
     * the prompt is raw_text (tokenized with BOS, special tokens parsed)
     * or raw_tokens, as sent (ids checked against the vocabulary later) */
    bool raw;
    char *raw_text;
    int32_t *raw_tokens;           /* n_raw_tokens, owned; an entry < 0 stands for the text
                                    * raw_pieces[-entry - 1] (llama-server's mixed prompt: ids and text,
                                    * each text tokenized on its own, BOS only when it comes first) */
    int n_raw_tokens;
    char **raw_pieces;             /* n_raw_pieces, owned */
    int n_raw_pieces;

    /* The last message is rendered for this request only: the client never
     * echoes it in a later turn (Claude Code's max-tokens recovery prompt,
     * api_anthropic.c; an assistant prefill, which the reply carries whole:
     * the chat library parses the prefill back into the reply's content, as
     * llama-server answers), so the reply is stored and keyed as the history
     * without it (thaw_chat_request_n_history). */
    bool last_transient;
    /* The trailing assistant message became a prefill by default (none of
     * add_generation_prompt / continue_final_message sent): a server with
     * --no-prefill-assistant renders it whole instead (thaw_api_no_prefill). */
    bool prefill_implicit;

    /* reasoning (llama-server's fields): the budget of tokens inside the
     * template's thinking block, reasoning_budget_tokens or its alias
     * thinking_budget_tokens (-1 = not sent: the server's --reasoning-budget;
     * the engine resolves it, 0 also turning enable_thinking off); the
     * message forced before the end tag when it is spent (NULL = the
     * server's). reasoning_effort lands in template_kwargs at parse time
     * ("none": enable_thinking false), so the cache keys cover it. */
    int reasoning_budget;
    char *reasoning_budget_message;

    /* Anthropic's cache_control marks, as retention hints for the cache
     * tiers (never in the keys or the prompt): what a mark covers, the
     * first n_msgs messages as the template renders them (tools with them;
     * 0: the tools alone), is kept at least ttl_s seconds. The furthest
     * mark of each ttl (5 minutes, 1 hour). */
    struct thaw_api_retain {
        int n_msgs;
        int ttl_s;
    } retain[THAW_API_MAX_RETAIN];
    int n_retain;
};

/* Sets one of req's chat_template_kwargs (`value_json`: a JSON value's
 * text), keys kept sorted as the parser keeps them; with `if_absent` a key
 * already there stays. Returns 0, THAW_EINVAL (value_json is not JSON)
 * or THAW_ENOMEM. */
int thaw_api_kwargs_set(struct thaw_chat_request *req, const char *key, const char *value_json, bool if_absent);

/* --no-prefill-assistant: a trailing assistant message that became a
 * prefill by default is rendered whole, a new assistant turn after it. */
void thaw_api_no_prefill(struct thaw_chat_request *req);

/* The messages a reply follows in the conversation's history: n_messages,
 * less a transient last one. The store key and the canonical re-decode
 * cover these, so the next turn's lookup finds them. */
static inline size_t thaw_chat_request_n_history(const struct thaw_chat_request *req)
{
    return req->n_messages - (req->last_transient && req->n_messages > 0 ? 1 : 0);
}

/* What the engine measured for one request; mirrors llama-server's `timings`
 * plus thaw's own cache_source / restore_ms. */
struct thaw_timings {
    int cache_n;            /* prompt tokens reused (slot prefix or restored) */
    int prompt_n;           /* prompt tokens prefilled */
    double prompt_ms;       /* prefill time, restore excluded */
    int predicted_n;        /* tokens generated */
    double predicted_ms;
    const char *cache_source; /* "slot" | "ram" | "disk" | "blocks" | "shared" | "none" (static string) */
    double restore_ms;      /* time to install restored state, 0 when none */
    int draft_n;            /* speculative tokens proposed (0 without -md) */
    int draft_n_accepted;
    int draft_restored;     /* tokens of the draft's state restored with the entry (.dft) */
    int cache_new_n;        /* prompt tokens this turn newly stores (not reused, stored with the reply to
                             * the cache tiers); 0 when the turn is not stored. Known at the reply's end */
    bool truncated;         /* the reply ended because its slot's context was full (llama-server's
                             * "truncated"; finish_reason is "length" either way) */
};

/* Parses a request body. Returns 0 and fills `out` (free with
 * thaw_chat_request_free), THAW_ENOMEM, or THAW_EINVAL with a message naming
 * the field in err[errlen] (possibly quoting the body's bytes: pass it through
 * thaw_api_error_json, which makes it valid UTF-8); `out` is then empty and need not be freed. `default_cache_prompt`
 * is the server's --cache-prompt setting. */
int thaw_api_parse_chat(const char *body, size_t len, bool default_cache_prompt, struct thaw_chat_request *out,
                        char *err, size_t errlen);

void thaw_chat_request_free(struct thaw_chat_request *req);

/* The normalised JSON (thaw_message.json) of one message given as JSON
 * text: how a reply is keyed as the client will echo it. Returns 0 and a
 * malloc'd *out, THAW_EINVAL (reason in err) or THAW_ENOMEM. */
int thaw_api_normalize_message(const char *msg_json, char **out, char *err, size_t errlen);

/* An image given by URL (`where` names it in errors): a base64 data: URL
 * becomes its bytes, a file:// URL its path (read under --media-path when
 * the request is prepared); http(s) and anything else are refused (thaw
 * fetches nothing). Returns 0 and *out (its data or path malloc'd),
 * THAW_EINVAL (why in err, for a 400) or THAW_ENOMEM. */
int thaw_api_image_from_url(const char *url, const char *where, struct thaw_image *out, char *err, size_t errlen);
/* The same for base64 text (b64, len bytes; whitespace skipped), as an
 * Anthropic image block's source carries it. */
int thaw_api_image_from_base64(const char *b64, size_t len, const char *where, struct thaw_image *out, char *err,
                               size_t errlen);

/* Admission: bounds that need no template or tokenizer, so a request that
 * cannot fit is refused before any costly work. A prompt must leave a slot
 * of `n_ctx_slot` tokens one free for the reply, so it cannot have as many
 * messages as the slot has tokens (each renders to at least one), nor as
 * much text as n_ctx_slot tokens of at most `max_token_bytes` bytes each. Returns 0, or THAW_EINVAL with the reason in err[errlen]. */
int thaw_api_admit(const struct thaw_chat_request *req, int n_ctx_slot, int max_token_bytes, char *err,
                   size_t errlen);

/* {"error":{"message","type","code"}} for an HTTP status. Invalid UTF-8 in
 * `message` (a quoted client byte, a cut character) becomes U+FFFD. NULL
 * only on ENOMEM. */
char *thaw_api_error_json(int status, const char *message);

/* A non-streaming chat.completion object around `message_json` (an
 * assistant message: content, reasoning_content, tool_calls). NULL when
 * that is not JSON, or on ENOMEM. */
char *thaw_api_completion_json(const char *id, const char *model, long created, const char *message_json,
                               const char *finish_reason, int prompt_tokens, const struct thaw_timings *t);

/* A streaming chunk from one delta of thaw_tmpl_diffs (content,
 * reasoning_content, or a tool call's index/id/name/arguments piece). */
char *thaw_api_chunk_delta_json(const char *id, const char *model, long created, const char *diff_json);

/* One streaming chunk object (no "data: " framing). `content` NULL = no delta
 * content; `role` NULL = no role; `finish_reason` NULL = null. With
 * `usage_t` non-NULL the chunk carries usage + timings and empty choices. */
char *thaw_api_chunk_json(const char *id, const char *model, long created, const char *role,
                          const char *content, const char *finish_reason, const struct thaw_timings *timings,
                          int prompt_tokens, bool usage_only);

/* What GET /v1/models says of the model (llama-server's "meta"). */
struct thaw_model_meta {
    uint64_t n_params, size_bytes;
    int n_vocab, vocab_type, n_ctx_train, n_embd, n_ctx_slot;
    bool vision; /* a projector is loaded (--mmproj): llama-server's "multimodal" capability */
};
/* GET /v1/models body: OpenAI's list ("data") with llama-server's "meta",
 * "aliases" (`model` split at commas; the id is the first of them in byte
 * order, as llama-server picks it) and "tags" (`tags` split the same way,
 * NULL = none), and its Ollama-style "models" array. */
char *thaw_api_models_json(const char *model, const char *tags, long created, const struct thaw_model_meta *m);

/* One model of GET /models with --models-dir or --models-preset. */
struct thaw_api_router_model {
    const char *name;
    const char *aliases; /* "a,b", NULL: none */
    const char *status;  /* "loaded", "loading", "unloaded", "unloading" */
    const char *stage;   /* loading: "text_model" / "mmproj_model", else NULL */
    float progress;      /* loading: how far `stage` has come, 0..1 */
    bool vision;         /* takes images */
    bool failed;         /* unloaded: its last load failed */
    int waiting;         /* requests waiting for its load */
};

/* GET /models and /v1/models with --models-dir or --models-preset:
 * llama-server's router list ({"data": [{"id", "aliases", "tags", "object":
 * "model", "owned_by", "created", "status": {"value", "args"},
 * "architecture": {"input_modalities", "output_modalities"}}], "object":
 * "list"}), one entry per model; "aliases" are its other names
 * (llama-server lists a preset's alias list, never the id). A loading
 * model's status has its load's "progress" ({"stages", "current",
 * "value"}, as /models/sse sends it) and, thaw's, "waiting": the requests
 * waiting for it; a failed load's "failed": true, "exit_code": 1. NULL on
 * ENOMEM. */
char *thaw_api_router_models_json(int n, const struct thaw_api_router_model *models, long created);

/* The request body's top-level "model" string, malloc'd (the caller frees),
 * or NULL: none, not a string, or the body is not a JSON object (its route
 * answers that). */
char *thaw_api_request_model(const char *body, size_t n_body);

#endif
