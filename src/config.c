/* config.c — the `thaw serve` flag table, parser and --help.
 *
 * One table describes every flag: its names, its type, where it is stored,
 * its bounds and its help line. Parsing and --help both walk that table, so
 * a flag cannot exist without being documented.
 */
#include "config.h"

#include "error.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- the flag table -------------------------------------------------------- */

enum opt_kind { OPT_INT, OPT_U64, OPT_FLOAT, OPT_STR, OPT_TRUE, OPT_FALSE, OPT_KEYS, OPT_VERBOSE, OPT_QUIET };

struct opt {
    const char *names; /* "-c,--ctx-size" */
    const char *arg;   /* metavar, NULL for switches */
    enum opt_kind kind;
    size_t off;
    double min, max;
    const char *help;
};

#define OFF(f) offsetof(struct thaw_config, f)

static const struct opt opts[] = {
    {"-m,--model", "FILE", OPT_STR, OFF(model_path), 0, 0, "model GGUF to serve (required)"},
    {"-a,--alias", "NAME", OPT_STR, OFF(alias), 0, 0, "model name reported by /v1/models (default: file name)"},
    {"--chat-template", "NAME|TEXT", OPT_STR, OFF(chat_template), 0, 0,
     "chat template: a llama.cpp built-in name (chatml, llama3, gemma, ...) or template text (default: the model's)"},
    {"--chat-template-file", "FILE", OPT_STR, OFF(chat_template_file), 0, 0,
     "chat template (Jinja) read from FILE, instead of the model's"},
    {"--jinja", NULL, OPT_TRUE, OFF(jinja), 0, 0,
     "render with the model's Jinja template: tools, tool calls, reasoning, response_format (default)"},
    {"--no-jinja", NULL, OPT_FALSE, OFF(jinja), 0, 0, "render with llama.cpp's built-in templates only (no tools)"},
    {"--chat-template-kwargs", "JSON", OPT_STR, OFF(chat_template_kwargs), 0, 0,
     "extra template variables for every request, e.g. '{\"enable_thinking\":false}' (a request's own win)"},
    {"--reasoning-format", "FORMAT", OPT_STR, OFF(reasoning_format), 0, 0,
     "none: reasoning stays in content; deepseek / auto: split into message.reasoning_content"},
    {"-c,--ctx-size", "N", OPT_INT, OFF(n_ctx), 0, 1 << 24, "total context in tokens, split evenly across slots (0 = model's training context)"},
    {"-np,--parallel", "N", OPT_INT, OFF(n_parallel), 1, 256, "number of slots decoded together"},
    {"-t,--threads", "N", OPT_INT, OFF(n_threads), 1, 1024, "threads for generation (default: number of CPUs)"},
    {"-tb,--threads-batch", "N", OPT_INT, OFF(n_threads_batch), 1, 1024, "threads for prompt processing (default: same as -t)"},
    {"-b,--batch-size", "N", OPT_INT, OFF(n_batch), 1, 1 << 20, "logical batch: most tokens given to one llama_decode"},
    {"-ub,--ubatch-size", "N", OPT_INT, OFF(n_ubatch), 1, 1 << 20, "physical batch size"},
    {"-n,--n-predict", "N", OPT_INT, OFF(n_predict), -1, INT_MAX, "default max tokens per reply (-1 = until the slot's context is full)"},
    {"--swa-full", NULL, OPT_TRUE, OFF(swa_full), 0, 0, "keep a full-size SWA cache (more memory, no checkpoints needed)"},
    {"--backend-dir", "DIR", OPT_STR, OFF(backend_dir), 0, 0,
     "load ggml's backends (CPU variants, GPU) from DIR: a folder holding only libggml-cpu-x64.so runs the "
     "portable CPU code on any x86 machine (default: $THAW_BACKEND_DIR, else the llama.cpp thaw was built with)"},
    {"-md,--model-draft", "FILE", OPT_STR, OFF(draft_path), 0, 0,
     "draft model for speculative decoding (same vocabulary as -m)"},
    {"-cd,--ctx-size-draft", "N", OPT_INT, OFF(n_ctx_draft), 0, 1 << 24, "draft context, total (0 = same as -c)"},
    {"--draft-max", "N", OPT_INT, OFF(draft_max), 0, 256, "most tokens drafted per step (0 = speculation off)"},
    {"--draft-min", "N", OPT_INT, OFF(draft_min), 0, 256, "drafts shorter than this are not verified"},
    {"--draft-p-min", "P", OPT_FLOAT, OFF(draft_p_min), 0, 1,
     "stop drafting when the draft's top token is less likely than this"},
    {"--host", "ADDR", OPT_STR, OFF(host), 0, 0, "address to listen on"},
    {"--port", "N", OPT_INT, OFF(port), 0, 65535, "port to listen on (0 = pick a free one and log it)"},
    {"--api-key", "KEY[,KEY]", OPT_KEYS, 0, 0, 0,
     "require 'Authorization: Bearer KEY'; repeat for several keys, each its own cache namespace "
     "(derived from the key itself: stable across reordering, gone with the key)"},
    {"--slot-prompt-similarity", "F", OPT_FLOAT, OFF(slot_prompt_similarity), 0, 1,
     "reuse the slot whose prompt shares more than this fraction with the request (0 = least recently used only)"},
    {"--fixup-wait-ms", "MS", OPT_INT, OFF(fixup_wait_ms), 0, 1 << 20,
     "after a reply a slot re-decodes it as the next turn will present it, then stores it; a request that needs "
     "that slot waits for this work when it has at most this long left, else cuts it short (what is done is "
     "stored; the conversation's next turn prefills the rest)"},
    {"--cache-prompt", NULL, OPT_TRUE, OFF(cache_prompt), 0, 0, "reuse the common prefix a slot already holds (default)"},
    {"--no-cache-prompt", NULL, OPT_FALSE, OFF(cache_prompt), 0, 0, "always prefill the whole prompt"},
    {"--max-queue", "N", OPT_INT, OFF(max_queue), 0, 1 << 20, "requests that may wait for a slot; beyond that: 503"},
    {"--max-body", "BYTES", OPT_U64, OFF(max_body), 1024, (double)(1ull << 32), "largest request body accepted; beyond that: 413"},
    {"--threads-http", "N", OPT_INT, OFF(threads_http), 1, 256,
     "HTTP event-loop threads (connections are multiplexed: this is not a connection limit)"},
    {"--max-connections", "N", OPT_INT, OFF(max_connections), 1, 1 << 20,
     "open HTTP connections in all; more are refused (raised to fit the open-file limit)"},
    {"--max-connections-per-client", "N", OPT_INT, OFF(max_per_client), 0, 1 << 20,
     "open connections per client address (0 = no limit; use 0 behind a proxy, where every client has its address)"},
    {"--cors-origin", "ORIGIN[,ORIGIN]", OPT_STR, OFF(cors_origin), 0, 0,
     "let browser pages from these origins call the API (CORS); '*' for any, refused with --api-key"},
    {"-to,--timeout", "SECONDS", OPT_INT, OFF(timeout_s), 1, 86400,
     "drop a connection idle this long, or a client that takes longer to send its request body"},
    {"--webui", NULL, OPT_TRUE, OFF(webui), 0, 0,
     "serve the chat page with its cache view at / (default; the API it calls needs the key as usual)"},
    {"--no-webui", NULL, OPT_FALSE, OFF(webui), 0, 0, "no page: / and /webui/ answer 404"},
    {"--metrics", NULL, OPT_TRUE, 0, 0, 0, "accepted for llama-server compatibility: /metrics is always on"},
    {"--kv-cache-dir", "PATH", OPT_STR, OFF(kv_cache_dir), 0, 0, "enable the on-disk KV cache in PATH (created 0700)"},
    {"--kv-cache-max", "MiB", OPT_U64, OFF(kv_cache_max_mib), 0, (double)(1ull << 40),
     "disk cache budget over every file, blocks included: the least recently used conversations are evicted first, "
     "with the blocks only they used (0 = no limit)"},
    {"--kv-cache-ttl", "SECONDS", OPT_U64, OFF(kv_cache_ttl_s), 0, (double)(1ull << 40), "disk entries unused this long are evicted"},
    {"--kv-cache-queue", "MiB", OPT_U64, OFF(kv_cache_queue_mib), 0, (double)(1ull << 30),
     "state waiting for the disk writer; a store beyond it is dropped and logged (0 = no limit)"},
    {"--kv-cache-block", "N", OPT_INT, OFF(kv_cache_block), 0, 1 << 20,
     "store the disk cache as blocks of N tokens, each written once and shared by every conversation with the same "
     "prefix, plus a small manifest per turn (0 = a whole state per turn; recurrent models always use whole states)"},
    {"--kv-cache-min-tokens", "N", OPT_INT, OFF(kv_cache_min_tokens), 0, INT_MAX, "do not store conversations shorter than this"},
    {"--cache-ram", "MiB", OPT_U64, OFF(cache_ram_mib), 0, (double)(1ull << 40), "in-memory cache tier (0 = off; never disables the disk tier)"},
    {"--kv-shared", "s3://BUCKET[/PREFIX]", OPT_STR, OFF(kv_shared), 0, 0,
     "shared cache tier on an S3-compatible store, for several replicas: every stored turn is uploaded, and a "
     "conversation the local tiers lack is fetched from there (needs --kv-cache-dir and --kv-shared-secret-file; "
     "credentials from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION)"},
    {"--kv-shared-endpoint", "URL", OPT_STR, OFF(kv_shared_endpoint), 0, 0,
     "the store's address, http(s)://HOST[:PORT] (default: $AWS_ENDPOINT_URL)"},
    {"--kv-shared-secret-file", "FILE", OPT_STR, OFF(kv_shared_secret_file), 0, 0,
     "the cluster secret (>= 16 bytes, the same file on every replica): objects are encrypted and authenticated "
     "with it, and one that fails is never used"},
    {"--kv-shared-timeout-ms", "MS", OPT_INT, OFF(kv_shared_timeout_ms), 1, 600000,
     "longest a request waits for the shared tier before it is served by prefill"},
    {"--kv-shared-retry-s", "SECONDS", OPT_INT, OFF(kv_shared_retry_s), 1, 86400,
     "after 3 failures in a row, leave the store alone this long (circuit breaker)"},
    {"--kv-shared-queue", "N", OPT_INT, OFF(kv_shared_queue), 1, 1 << 20,
     "uploads that may wait; beyond that they are dropped and counted"},
    {"--kv-tap", NULL, OPT_TRUE, OFF(kv_tap), 0, 0,
     "stores cut each new block straight from the KV cache's memory: as much work on a long conversation as on "
     "a short one (default; CPU only)"},
    {"--no-kv-tap", NULL, OPT_FALSE, OFF(kv_tap), 0, 0,
     "stores capture each state whole through libllama, then split it (slower on long conversations; a "
     "diagnostic)"},
    {"--ctx-checkpoints", "N", OPT_INT, OFF(ctx_checkpoints), 0, 1024, "context checkpoints kept per slot (SWA / recurrent models)"},
    {"-v,--verbose", NULL, OPT_VERBOSE, 0, 0, 0, "more log output (repeatable)"},
    {"--log-quiet", NULL, OPT_QUIET, 0, 0, 0, "only warnings and errors"},
};

#define N_OPTS (sizeof opts / sizeof opts[0])

void thaw_config_init(struct thaw_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->n_ctx = 4096;
    cfg->n_parallel = 1;
    cfg->n_threads = 0; /* resolved after parsing: number of CPUs */
    cfg->n_threads_batch = 0;
    cfg->n_batch = 2048;
    cfg->n_ubatch = 512;
    cfg->n_predict = -1;
    cfg->host = "127.0.0.1";
    cfg->port = 8080;
    cfg->slot_prompt_similarity = 0.1f;
    cfg->fixup_wait_ms = 250;
    cfg->cache_prompt = true;
    cfg->webui = true;
    cfg->max_queue = 64;
    cfg->max_body = 16u << 20;
    cfg->threads_http = 4;
    cfg->max_connections = 4096;
    cfg->max_per_client = 64;
    cfg->timeout_s = 30;
    cfg->kv_cache_ttl_s = 259200;
    cfg->kv_cache_min_tokens = 256;
    cfg->kv_cache_queue_mib = 1024;
    cfg->kv_cache_block = 128;
    cfg->cache_ram_mib = 8192;
    cfg->ctx_checkpoints = 8;
    cfg->kv_shared_timeout_ms = 2000;
    cfg->kv_shared_retry_s = 30;
    cfg->kv_shared_queue = 64;
    cfg->verbosity = 1;
    cfg->jinja = true;
    cfg->kv_tap = true;
    cfg->reasoning_format = "auto";
    cfg->draft_max = 16;
    cfg->draft_min = 0;
    cfg->draft_p_min = 0.75f;
}

/* ---- parsing ------------------------------------------------------------------- */

static bool name_matches(const char *names, const char *arg)
{
    size_t n = strlen(arg);
    const char *p = names;

    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && memcmp(p, arg, n) == 0)
            return true;
        if (!end)
            break;
        p = end + 1;
    }
    return false;
}

static int add_keys(struct thaw_config *cfg, const char *value)
{
    const char *p = value;

    /* an empty key (an unset variable, a stray comma) must never turn
     * authentication off, nor authenticate an empty Bearer token */
    if (!*value) {
        fprintf(stderr, "thaw: --api-key is empty (an unset variable?): refusing to start without authentication\n");
        return THAW_EINVAL;
    }
    while (*p) {
        size_t len = strcspn(p, ",");
        if (len == 0 || (p[len] == ',' && p[len + 1] == '\0')) {
            fprintf(stderr, "thaw: --api-key '%s' holds an empty key: refusing to start\n", value);
            return THAW_EINVAL;
        }
        if (len > 0) {
            if (cfg->n_api_keys == THAW_MAX_API_KEYS) {
                fprintf(stderr, "thaw: at most %d API keys\n", THAW_MAX_API_KEYS);
                return THAW_EINVAL;
            }
            char *k = strndup(p, len);
            if (!k)
                return THAW_ENOMEM;
            cfg->api_keys[cfg->n_api_keys++] = k; /* owned: freed by thaw_config_free */
        }
        p += len;
        if (*p == ',')
            p++;
    }
    return 0;
}

static int parse_number(const struct opt *o, const char *flag, const char *value, double *out)
{
    char *end = NULL;
    double v;

    errno = 0;
    v = strtod(value, &end);
    if (errno || end == value || *end != '\0') {
        fprintf(stderr, "thaw: %s expects a number, got '%s'\n", flag, value);
        return THAW_EINVAL;
    }
    if ((o->kind == OPT_INT || o->kind == OPT_U64) && v != (double)(long long)v) {
        fprintf(stderr, "thaw: %s expects a whole number, got '%s'\n", flag, value);
        return THAW_EINVAL;
    }
    if (v < o->min || v > o->max) {
        fprintf(stderr, "thaw: %s must be between %g and %g, got '%s'\n", flag, o->min, o->max, value);
        return THAW_EINVAL;
    }
    *out = v;
    return 0;
}

int thaw_config_parse(struct thaw_config *cfg, int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i];
        const char *value = NULL;
        char *eq = NULL;
        const struct opt *o = NULL;
        char name[64];

        if (strcmp(flag, "-h") == 0 || strcmp(flag, "--help") == 0) {
            thaw_config_usage(stdout);
            return 1;
        }
        /* --flag=value form */
        if (flag[0] == '-' && flag[1] == '-' && (eq = strchr(flag, '=')) != NULL &&
            (size_t)(eq - flag) < sizeof name) {
            memcpy(name, flag, (size_t)(eq - flag));
            name[eq - flag] = '\0';
            value = eq + 1;
            flag = name;
        }
        for (size_t j = 0; j < N_OPTS; j++) {
            if (name_matches(opts[j].names, flag)) {
                o = &opts[j];
                break;
            }
        }
        if (!o) {
            fprintf(stderr, "thaw: unknown flag '%s' (see thaw serve --help)\n", argv[i]);
            return THAW_EINVAL;
        }
        if (o->arg && !value) {
            if (i + 1 >= argc) {
                fprintf(stderr, "thaw: %s needs a value (%s)\n", flag, o->arg);
                return THAW_EINVAL;
            }
            value = argv[++i];
        } else if (!o->arg && value) {
            fprintf(stderr, "thaw: %s takes no value\n", flag);
            return THAW_EINVAL;
        }

        char *field = (char *)cfg + o->off;
        double v = 0;
        int rc;
        switch (o->kind) {
        case OPT_INT:
            if ((rc = parse_number(o, flag, value, &v)) != 0)
                return rc;
            *(int *)field = (int)v;
            break;
        case OPT_U64:
            if ((rc = parse_number(o, flag, value, &v)) != 0)
                return rc;
            if (o->off == OFF(max_body))
                *(size_t *)field = (size_t)v;
            else
                *(uint64_t *)field = (uint64_t)v;
            break;
        case OPT_FLOAT:
            if ((rc = parse_number(o, flag, value, &v)) != 0)
                return rc;
            *(float *)field = (float)v;
            break;
        case OPT_STR:
            if (!*value) {
                fprintf(stderr, "thaw: %s must not be empty\n", flag);
                return THAW_EINVAL;
            }
            *(const char **)field = value;
            break;
        case OPT_TRUE:
            if (o->off)
                *(bool *)field = true;
            break;
        case OPT_FALSE:
            *(bool *)field = false;
            break;
        case OPT_KEYS:
            if ((rc = add_keys(cfg, value)) != 0)
                return rc;
            break;
        case OPT_VERBOSE:
            cfg->verbosity++;
            break;
        case OPT_QUIET:
            cfg->verbosity = 0;
            break;
        }
    }

    if (!cfg->model_path) {
        fprintf(stderr, "thaw: no model given: use -m FILE.gguf (see thaw serve --help)\n");
        return THAW_EINVAL;
    }
    if (cfg->n_ctx != 0 && cfg->n_ctx < 16 * cfg->n_parallel) {
        fprintf(stderr, "thaw: -c %d leaves fewer than 16 tokens per slot for -np %d\n", cfg->n_ctx, cfg->n_parallel);
        return THAW_EINVAL;
    }
    if (cfg->kv_shared && !cfg->kv_cache_dir) {
        fprintf(stderr, "thaw: --kv-shared needs --kv-cache-dir: what is fetched is installed into the local disk "
                        "tier first\n");
        return THAW_EINVAL;
    }
    if (cfg->kv_shared && !cfg->kv_shared_secret_file) {
        fprintf(stderr, "thaw: --kv-shared needs --kv-shared-secret-file FILE (the cluster secret, the same on every "
                        "replica; e.g. head -c 32 /dev/urandom | base64 > FILE)\n");
        return THAW_EINVAL;
    }
    if (cfg->cors_origin && cfg->n_api_keys > 0 && strstr(cfg->cors_origin, "*")) {
        fprintf(stderr, "thaw: --cors-origin '*' with --api-key would let any web page use a key a browser holds: "
                        "name the origins\n");
        return THAW_EINVAL;
    }
    if (strcmp(cfg->reasoning_format, "none") != 0 && strcmp(cfg->reasoning_format, "deepseek") != 0 &&
        strcmp(cfg->reasoning_format, "auto") != 0) {
        fprintf(stderr, "thaw: --reasoning-format must be none, deepseek or auto, got '%s'\n", cfg->reasoning_format);
        return THAW_EINVAL;
    }
    if (cfg->chat_template_file) {
        if (cfg->chat_template) {
            fprintf(stderr, "thaw: give --chat-template or --chat-template-file, not both\n");
            return THAW_EINVAL;
        }
        FILE *f = fopen(cfg->chat_template_file, "rb");
        if (!f) {
            fprintf(stderr, "thaw: cannot read --chat-template-file %s: %s\n", cfg->chat_template_file, strerror(errno));
            return THAW_EINVAL;
        }
        size_t cap = 1 << 16, n = 0, got;
        char *buf = malloc(cap + 1);
        while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
            n += got;
            if (n == cap && cap < (16u << 20)) {
                char *nb = realloc(buf, 2 * cap + 1);
                if (!nb) {
                    free(buf);
                    buf = NULL;
                    break;
                }
                buf = nb;
                cap *= 2;
            }
        }
        fclose(f);
        if (!buf) {
            fprintf(stderr, "thaw: out of memory reading --chat-template-file\n");
            return THAW_ENOMEM;
        }
        buf[n] = '\0';
        cfg->chat_template_text = buf;
        cfg->chat_template = buf;
    }
    if (cfg->draft_min > cfg->draft_max) {
        fprintf(stderr, "thaw: --draft-min %d exceeds --draft-max %d\n", cfg->draft_min, cfg->draft_max);
        return THAW_EINVAL;
    }
    if (cfg->n_ubatch > cfg->n_batch)
        cfg->n_ubatch = cfg->n_batch;
    if (cfg->n_threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        cfg->n_threads = n > 0 ? (int)n : 1;
    }
    if (cfg->n_threads_batch == 0)
        cfg->n_threads_batch = cfg->n_threads;
    return 0;
}

void thaw_config_free(struct thaw_config *cfg)
{
    free(cfg->chat_template_text);
    cfg->chat_template_text = NULL;
    for (int i = 0; i < cfg->n_api_keys; i++)
        free((char *)cfg->api_keys[i]);
    cfg->n_api_keys = 0;
}

/* ---- --help -------------------------------------------------------------------- */

static void print_default(FILE *f, const struct opt *o)
{
    struct thaw_config d;

    thaw_config_init(&d);
    const char *field = (const char *)&d + o->off;
    switch (o->kind) {
    case OPT_INT:
        if (o->off != OFF(n_threads) && o->off != OFF(n_threads_batch)) /* 0 = resolved at start-up */
            fprintf(f, " [default: %d]", *(const int *)field);
        break;
    case OPT_U64:
        if (o->off == OFF(max_body))
            fprintf(f, " [default: %zu]", *(const size_t *)field);
        else
            fprintf(f, " [default: %llu]", (unsigned long long)*(const uint64_t *)field);
        break;
    case OPT_FLOAT:
        fprintf(f, " [default: %g]", *(const float *)field);
        break;
    case OPT_STR:
        if (*(const char *const *)field)
            fprintf(f, " [default: %s]", *(const char *const *)field);
        break;
    default:
        break;
    }
}

void thaw_config_usage(FILE *f)
{
    fprintf(f, "usage: thaw serve -m MODEL.gguf [flags]\n\n"
               "An OpenAI-compatible chat server (POST /v1/chat/completions, GET /v1/models,\n"
               "/health, /metrics) that keeps conversations' KV state so a returning chat is\n"
               "restored instead of prefilled again.\n\nflags:\n");
    for (size_t i = 0; i < N_OPTS; i++) {
        char left[64];
        snprintf(left, sizeof left, "%s%s%s", opts[i].names, opts[i].arg ? " " : "", opts[i].arg ? opts[i].arg : "");
        fprintf(f, "  %-34s %s", left, opts[i].help);
        print_default(f, &opts[i]);
        fputc('\n', f);
    }
    fprintf(f, "  %-34s %s\n", "-h,--help", "this text");
    fprintf(f, "\nEvery flag also accepts --flag=value.\n");
}
