/* config.h — what `thaw serve` runs with: every setting and its default.
 *
 * The command line fills it (cli/config.h: the flag table, its parser and
 * --help; flag names follow llama-server wherever one exists). The struct is
 * filled once at start-up and is read-only afterwards (every thread may read
 * it without locking). It holds no llama.cpp types: the enums it stores are
 * plain ints, turned into llama's params by llama/params.c.
 */
#ifndef THAW_CONFIG_H
#define THAW_CONFIG_H

#include "base/cpumask.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/sampling.h"

#define THAW_MAX_API_KEYS 16
#define THAW_MAX_DEVICES 16   /* -ts / -fitt entries */
#define THAW_MAX_OVERRIDES 32 /* -ot / --override-kv entries, each possibly a comma list */

/* --spec-type's kinds (llama-server's names in cli/config.c); the n-gram
 * kinds come first, in the order they are tried */
enum thaw_spec_kind {
    THAW_SPEC_NGRAM_SIMPLE,  /* ngram-simple */
    THAW_SPEC_NGRAM_MAP_K,   /* ngram-map-k */
    THAW_SPEC_NGRAM_MAP_K4V, /* ngram-map-k4v */
    THAW_SPEC_NGRAM_MOD,     /* ngram-mod */
    THAW_SPEC_N_NGRAM,
    THAW_SPEC_DRAFT = THAW_SPEC_N_NGRAM, /* draft-simple: the draft model (-md) */
};

/* One n-gram kind's settings (engine/ngram.h says what each does). */
struct thaw_spec_ngram {
    int size_n;   /* tokens of the key looked up (ngram-mod: --spec-ngram-mod-n-match) */
    int size_m;   /* most tokens drafted per step (ngram-mod: n-max) */
    int min_hits; /* earlier occurrences of the key needed to draft (ngram-mod: 1) */
    int n_min;    /* shortest draft worth verifying (ngram-mod: n-min; the others: 1) */
};

struct thaw_config;

/* One [NAME] section of a --models-preset file: a model with its own config. */
struct thaw_model_preset {
    const char *name;        /* the section's name (in the config's preset_text) */
    struct thaw_config *cfg; /* defaults < [*] < [NAME] < the command line, checked as -m's is (owned) */
    bool load_on_startup;    /* load-on-startup = true: loaded before the server listens */
};

struct thaw_config {
    /* model + context */
    const char *model_path;      /* -m */
    const char *alias;           /* --alias: NAME[,NAME...]; NULL = file name of -m */
    const char *models_dir;      /* --models-dir: serve every GGUF in DIR, each named by its stem (-m not given) */
    int models_max;              /* --models-max: models loaded at once from --models-dir (LRU unload); 0 = no limit */
    bool models_autoload;        /* --models-autoload (default) / --no-models-autoload */
    int sleep_idle_s;            /* --sleep-idle-seconds: a --models-dir model held by no request this long is
                                  * unloaded (its conversations stored), reloaded by the next; -1 = never */
    const char *models_preset;   /* --models-preset: llama-server's INI file of models and their settings */
    struct thaw_model_preset *presets; /* its [NAME] sections, in file order (owned) */
    int n_presets;
    struct thaw_config *preset_base; /* --models-preset with --models-dir: the config of a file no section
                                      * names: defaults < [*] < command line (owned) */
    char *preset_text;           /* the preset file's text, which those configs' strings point into (owned) */
    const char *tags;            /* --tags: TAG[,TAG...], listed by /v1/models (informational); NULL = none */
    const char *chat_template;   /* --chat-template (name or text) or --chat-template-file's text; NULL = model's */
    const char *chat_template_file; /* --chat-template-file: path */
    char *chat_template_text;    /* that file's contents (owned) */
    bool jinja;                  /* --jinja (default) / --no-jinja */
    const char *chat_template_kwargs; /* --chat-template-kwargs: JSON object */
    const char *reasoning_format; /* --reasoning-format: none | deepseek | auto */
    int n_ctx;                   /* -c: total tokens, split evenly across slots */
    int n_parallel;              /* -np: slots */
    int n_threads;               /* -t */
    int n_threads_batch;         /* -tb */
    struct thaw_cpu_cfg cpu;     /* -C, -Cr, --cpu-strict, --prio, --poll: the generation threads */
    struct thaw_cpu_cfg cpu_batch; /* their -batch forms (-Cb ...): what is not given is the same as above */
    int n_batch;                 /* -b: logical batch, tokens per llama_decode */
    int n_ubatch;                /* -ub: physical batch */
    int n_predict;               /* -n: default max tokens per reply, -1 = until context is full */
    bool swa_full;               /* --swa-full: full-size SWA cache (no checkpoints needed) */
    const char *backend_dir;     /* --backend-dir; NULL = $THAW_BACKEND_DIR, else llama.cpp's lib dir */
    bool kv_tap;                 /* --kv-tap (default) / --no-kv-tap: stores cut blocks from the KV cache */

    /* embeddings and rerank (llama-server's): the server serves only them */
    bool embedding;              /* --embedding: /embedding(s), /v1/embeddings; no chat, no KV cache kept */
    bool reranking;              /* --rerank: /rerank & co. too (implies embedding, pooling rank) */
    int pooling;                 /* --pooling: enum llama_pooling_type, -1 (UNSPECIFIED) = the model's */
    int embd_normalize;          /* --embd-normalize: -1 none, 0 max-abs int16, 1 taxicab, 2 euclidean, >2 p-norm */

    /* speculative decoding: the n-gram kinds (drafts from the slot's own
     * conversation) are tried first, in enum order, then the draft model */
    unsigned spec_types;         /* --spec-type: bit (1u << THAW_SPEC_*) per kind; -md alone implies DRAFT */
    bool spec_type_given;        /* --spec-type was given (none: spec_types 0) */
    struct thaw_spec_ngram spec_ngram[THAW_SPEC_N_NGRAM]; /* --spec-ngram-<kind>-*, per n-gram kind */
    const char *draft_path;      /* -md: draft model; NULL = off */
    int n_ctx_draft;             /* -cd: draft context, total (0 = same as -c) */
    int draft_max;               /* --draft-max: tokens drafted per step */
    int draft_min;               /* --draft-min: drafts shorter than this are not verified */
    float draft_p_min;           /* --draft-p-min: stop drafting below this probability */
    int draft_n_gpu_layers;      /* -ngld: as -ngl, for the draft model */
    int draft_threads;           /* -td: 0 = -t */
    int draft_threads_batch;     /* -tbd: 0 = -tb */
    int draft_type_k, draft_type_v; /* -ctkd / -ctvd: enum ggml_type of the draft's KV cache */
    const char *draft_devices;   /* -devd: as -dev */
    const char *draft_tensor_overrides[THAW_MAX_OVERRIDES]; /* -otd: as -ot */
    int n_draft_tensor_overrides;
    bool draft_cpu_moe;          /* -cmoed */
    int draft_n_cpu_moe;         /* -ncmoed */

    /* images (vision.h): --mmproj loads a projector; NULL = text only */
    const char *mmproj_path;     /* -mm: the projector GGUF */
    bool mmproj_offload;         /* --mmproj-offload (default) / --no-mmproj-offload */
    int image_min_tokens;        /* --image-min-tokens: 0 = the projector's */
    int image_max_tokens;        /* --image-max-tokens: 0 = the projector's */
    const char *media_path;      /* --media-path: file:// images are read under it; NULL = refused */

    /* serving */
    const char *host;            /* --host */
    int port;                    /* --port */
    const char *api_keys[THAW_MAX_API_KEYS]; /* --api-key, repeatable or comma-separated; owned */
    int n_api_keys;
    float slot_prompt_similarity; /* --slot-prompt-similarity */
    int fixup_wait_ms;           /* --fixup-wait-ms */
    int shutdown_timeout_s;      /* --shutdown-timeout: SIGTERM's budget, seconds */
    bool cache_prompt;           /* --cache-prompt / --no-cache-prompt */
    bool webui;                  /* --webui (default) / --no-webui: the chat page at / */
    int max_queue;               /* --max-queue: requests waiting beyond the slots */
    size_t max_body;             /* --max-body: bytes of a request body */
    int threads_http;            /* --threads-http: event-loop threads */
    int max_connections;         /* --max-connections: open connections in all */
    int max_per_client;          /* --max-connections-per-client, 0 = no limit */
    int timeout_s;               /* --timeout: idle limit and request-body deadline, seconds */
    const char *cors_origin;     /* --cors-origin: "*" or ORIGIN[,ORIGIN]; NULL = no CORS */

    /* caches */
    const char *kv_cache_dir;    /* --kv-cache-dir; NULL = disk tier off */
    uint64_t kv_cache_max_mib;   /* --kv-cache-max, 0 = no limit */
    uint64_t kv_cache_ttl_s;     /* --kv-cache-ttl */
    int kv_cache_min_tokens;     /* --kv-cache-min-tokens */
    uint64_t kv_cache_queue_mib; /* --kv-cache-queue: writer queue budget, 0 = no limit */
    int kv_cache_block;          /* --kv-cache-block: tokens per block, 0 = whole states */
    uint64_t cache_ram_mib;      /* --cache-ram, 0 = RAM tier off */
    int ctx_checkpoints;         /* --ctx-checkpoints: per slot */
    int checkpoint_every;        /* --checkpoint-every-n-tokens: hybrids snapshot every N prefill tokens, 0 = off */
    int kv_snapshot_idle_s;      /* --kv-snapshot-idle: a hybrid slot's turn-end snapshot is written after this
                                  * many idle seconds (else on handover, shutdown); 0 = not for idleness */

    /* shared tier (cache_shared.h) */
    const char *kv_shared;       /* --kv-shared s3://BUCKET[/PREFIX]; NULL = off */
    const char *kv_shared_endpoint;    /* --kv-shared-endpoint URL; NULL = $AWS_ENDPOINT_URL */
    const char *kv_shared_secret_file; /* --kv-shared-secret-file FILE: the cluster secret */
    int kv_shared_timeout_ms;    /* --kv-shared-timeout-ms: a fetch's deadline */
    int kv_shared_retry_s;       /* --kv-shared-retry-s: breaker pause */
    int kv_shared_queue;         /* --kv-shared-queue: uploads waiting */

    /* placement and memory: params.c turns these into llama_model_params */
    int n_gpu_layers;            /* -ngl: N, -1 = auto (llama.cpp's default: all, unless -fit lowers it), -2 = all */
    const char *devices;         /* -dev: comma list of device names, "none"; NULL = every device */
    const char *tensor_overrides[THAW_MAX_OVERRIDES]; /* -ot PATTERN=BUFT[,...], as given */
    int n_tensor_overrides;
    bool cpu_moe;                /* -cmoe: every layer's experts in host memory */
    int n_cpu_moe;               /* -ncmoe: the first N layers' experts in host memory */
    int n_cpu_ffn;               /* -ncffn: the first N layers' dense FFN in host memory */
    int split_mode;              /* -sm: enum llama_split_mode */
    float tensor_split[THAW_MAX_DEVICES]; /* -ts: proportions, all 0 = llama.cpp decides */
    int main_gpu;                /* -mg */
    bool kv_offload;             /* -kvo (default) / -nkvo: KV cache and KQV ops on the GPU */
    bool op_offload;             /* --op-offload (default) / --no-op-offload */
    int load_mode;               /* --mlock, --mmap/--no-mmap, -dio, -lm: enum llama_load_mode */
    int lazy_mode;               /* -lzm: enum llama_lazy_mode */
    int numa;                    /* --numa: enum ggml_numa_strategy, 0 = off */
    bool repack;                 /* --repack (default) / -nr: extra buffer types (weight repacking) */
    bool no_host;                /* --no-host */
    bool check_tensors;          /* --check-tensors */
    const char *kv_overrides[THAW_MAX_OVERRIDES]; /* --override-kv KEY=TYPE:VALUE[,...], as given */
    int n_kv_overrides;
    bool fit;                    /* -fit on|off: lower unset -ngl / -c until the model fits the devices */
    uint64_t fit_target_mib[THAW_MAX_DEVICES]; /* -fitt: MiB left free per device */
    int fit_ctx;                 /* -fitc: -fit never lowers -c below this */
    bool list_devices;           /* --list-devices: print them and exit */
    bool show_version;           /* --version: print it and exit */
    struct {
        const char *flag, *why;  /* static strings from the flag table */
    } no_effect[THAW_MAX_OVERRIDES]; /* llama-server flags given that do nothing on thaw (logged at start-up) */
    int n_no_effect;

    /* context (params.c -> llama_context_params) */
    int flash_attn;              /* -fa: enum llama_flash_attn_type, -1 = auto */
    int type_k, type_v;          /* -ctk / -ctv: enum ggml_type of the KV cache */
    int rope_scaling;            /* --rope-scaling: enum llama_rope_scaling_type, -1 = model's */
    float rope_freq_base;        /* 0 = model's */
    float rope_freq_scale;       /* 0 = model's; --rope-scale N sets 1/N */
    float yarn_ext_factor;       /* negative = model's */
    float yarn_attn_factor;      /* negative = model's */
    float yarn_beta_fast;        /* negative = model's */
    float yarn_beta_slow;        /* negative = model's */
    int yarn_orig_ctx;           /* 0 = model's training context */

    /* sampling defaults for requests that do not set them */
    struct thaw_sampling sampling;
    bool dry_breakers_set;       /* a --dry-sequence-breaker was given: later ones add, not replace */

    /* constraints for requests that set none (llama-server's sampling grammar) */
    const char *grammar;         /* --grammar GBNF, or --grammar-file's text */
    const char *grammar_file;
    const char *json_schema;     /* -j, or -jf's text: a JSON schema */
    const char *json_schema_file;
    char *file_texts[3];         /* what --grammar-file, -jf and the TLS files read (owned) */

    /* server (llama-server's) */
    const char *ssl_key_file, *ssl_cert_file; /* --ssl-key-file / --ssl-cert-file: PEM; both or neither */
    const char *ssl_key, *ssl_cert; /* their text (in file_texts / tls_texts) */
    char *tls_texts[2];
    const char *reasoning;       /* -rea: on | off | auto (enable_thinking in the template's kwargs) */
    int reasoning_budget;        /* --reasoning-budget: tokens inside the thinking block, -1 = unlimited,
                                  * 0 = thinking off (enable_thinking false, the block ended at once) */
    const char *reasoning_budget_message; /* --reasoning-budget-message: forced before the end tag; NULL = none */
    const char *reasoning_effort; /* --reasoning-effort: the template's reasoning_effort; NULL / "default" = none */
    bool reasoning_preserve;     /* --reasoning-preserve (default) / --no-...: the template's preserve_reasoning */
    bool prefill_assistant;      /* --prefill-assistant (default) / --no-...: a trailing assistant message is
                                  * continued, not rendered whole */
    bool props;                  /* --props: POST /props may change settings at run time */
    char *kwargs_text;           /* the template kwargs every request gets: --chat-template-kwargs with -rea,
                                  * --reasoning-effort and --reasoning-preserve merged in (owned; what
                                  * chat_template_kwargs points to after parsing) */
    const char *api_prefix;      /* --api-prefix: the routes are served under it ("" = none) */
    bool slots;                  /* --slots (default) / --no-slots: GET /slots */
    bool metrics;                /* --metrics (default) / --no-metrics: GET /metrics */
    int sse_ping_s;              /* --sse-ping-interval: ":" comment after this long without events (<= 0 off) */

    /* logging */
    int verbosity;               /* -v raises, --log-quiet lowers, -lv sets */
    const char *log_file;        /* --log-file: every line also goes there */
    int log_colors;              /* --log-colors: 1 on, 0 off, -1 auto (a terminal) */
    bool log_prefix;             /* the level on each line */
    bool log_timestamps;         /* the time on each line */
};

/* Defaults for every field. */
void thaw_config_init(struct thaw_config *cfg);

/* Frees what parsing allocated (cli/config.h's thaw_config_parse: the file
 * texts, the API keys); cfg stays valid to re-init. */
void thaw_config_free(struct thaw_config *cfg);

#endif
