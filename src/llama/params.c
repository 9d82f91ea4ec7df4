/* params.c — thaw's config -> llama_model_params / llama_context_params.
 *
 * Map:
 *   backends       thaw_params_load_backends, thaw_params_list_devices
 *   model params   devices (-dev), tensor overrides (-ot, -cmoe, -ncmoe,
 *                  -ncffn), metadata overrides (--override-kv), the rest
 *   context params thaw_params_context
 *   -fit           thaw_params_fit (llama.cpp's common_fit_params, fit.cpp)
 */
#include "llama/params.h"

#include "base/clock.h"
#include "base/config.h"
#include "base/error.h"
#include "base/log.h"
#include "llama/kvtap.h"
#include "llama/threads.h"

#include <dlfcn.h>
#include <ggml-backend.h>
#include <gguf.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int thaw_fit_call(const char *path_model, struct llama_model_params *mp, struct llama_context_params *cp,
                  float *tensor_split, struct llama_model_tensor_buft_override *overrides, size_t *margins,
                  uint32_t n_ctx_min, int debug);

/* ---- backends ------------------------------------------------------------------- */

/* GPU modules scripts/setup.sh lays out, and what each needs from the
 * system: ggml loads them silently, so one that is there and did not load
 * would leave a GPU user on the CPU without a word. */
static const struct {
    const char *file, *reg, *needs;
} gpu_modules[] = {
    {"libggml-vulkan.so", "Vulkan", "a Vulkan loader and driver (Debian: libvulkan1 mesa-vulkan-drivers)"},
    {"libggml-cuda.so", "CUDA",
     "the CUDA runtime of the module's major (libcudart and libcublas .so.13, or .so.12 for setup.sh --gpu cuda12) "
     "and the NVIDIA driver's libcuda.so.1"},
};

static void check_gpu_modules(const char *dir)
{
    char path[4096];

    for (size_t i = 0; i < sizeof gpu_modules / sizeof gpu_modules[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, gpu_modules[i].file);
        if (access(path, F_OK) != 0 || ggml_backend_reg_by_name(gpu_modules[i].reg))
            continue;
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            LOG_WRN("backends: %s did not load (%s); it needs %s", path, dlerror(), gpu_modules[i].needs);
        } else {
            dlclose(h);
            LOG_WRN("backends: %s loaded but registered no backend (built for another ggml?)", path);
        }
    }
}

void thaw_params_load_backends(const struct thaw_config *cfg)
{
    static bool loaded;
    const char *bdir = cfg->backend_dir ? cfg->backend_dir : getenv("THAW_BACKEND_DIR");
    const char *dir = bdir && *bdir ? bdir : THAW_LLAMA_LIB_DIR;

    if (loaded)
        return;
    loaded = true;
    if (bdir && *bdir)
        LOG_INF("backends from %s (--backend-dir)", bdir);
    ggml_backend_load_all_from_path(dir);
    check_gpu_modules(dir);
}

static bool is_gpu(ggml_backend_dev_t dev)
{
    enum ggml_backend_dev_type t = ggml_backend_dev_type(dev);
    return t != GGML_BACKEND_DEVICE_TYPE_CPU && t != GGML_BACKEND_DEVICE_TYPE_ACCEL;
}

void thaw_params_list_devices(const struct thaw_config *cfg, FILE *f)
{
    int n = 0;

    thaw_params_load_backends(cfg);
    fprintf(f, "Available devices:\n");
    for (size_t i = 0; i < ggml_backend_dev_count(); i++) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        size_t free_b, total_b;
        if (ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU)
            continue;
        ggml_backend_dev_memory(dev, &free_b, &total_b);
        fprintf(f, "  %s: %s (%zu MiB, %zu MiB free)\n", ggml_backend_dev_name(dev), ggml_backend_dev_description(dev),
                total_b >> 20, free_b >> 20);
        n++;
    }
    if (n == 0)
        fprintf(f, "  (none)\n");
}

/* ---- model params ---------------------------------------------------------------- */

/* -dev a,b or none -> a NULL-terminated list (none: just the NULL) */
static int resolve_devices(const char *list, struct thaw_params *p)
{
    size_t n = 1;

    for (const char *c = list; *c; c++)
        n += *c == ',';
    if (!(p->devices = calloc(n + 1, sizeof *p->devices)))
        return THAW_ENOMEM;
    if (strcmp(list, "none") == 0)
        return 0;
    n = 0;
    for (const char *c = list; *c;) {
        size_t len = strcspn(c, ",");
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)len, c);
        ggml_backend_dev_t dev = ggml_backend_dev_by_name(name);
        if (!dev || ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU) {
            LOG_ERR("-dev: no device '%s' (see thaw serve --list-devices)", name);
            return THAW_EINVAL;
        }
        p->devices[n++] = dev;
        c += len;
        if (*c == ',')
            c++;
    }
    return 0;
}

static ggml_backend_buffer_type_t buft_by_name(const char *name, size_t len)
{
    for (size_t i = 0; i < ggml_backend_dev_count(); i++) {
        ggml_backend_buffer_type_t b = ggml_backend_dev_buffer_type(ggml_backend_dev_get(i));
        if (b && strlen(ggml_backend_buft_name(b)) == len && strncmp(ggml_backend_buft_name(b), name, len) == 0)
            return b;
    }
    return NULL;
}

/* Every -ot PATTERN=BUFT, then -cmoe / -ncmoe / -ncffn as llama-server
 * writes them (common.h LLM_FFN_EXPS_REGEX, LLM_FFN_DENSE_REGEX), into
 * p->overrides; the patterns live in p->patterns. */
struct placement {
    const char *const *ot;
    int n_ot;
    bool cpu_moe;
    int n_cpu_moe, n_cpu_ffn;
};

static int build_overrides(const struct placement *cfg, struct thaw_params *p)
{
    static const char exps[] = "\\.ffn_(up|down|gate|gate_up)_(ch|)exps";
    static const char dense[] = "\\.ffn_(up|down|gate)\\.";
    size_t max = llama_max_tensor_buft_overrides();
    size_t bytes = sizeof exps + 64 * (size_t)(cfg->n_cpu_moe + cfg->n_cpu_ffn), used = 0, n = 0;
    ggml_backend_buffer_type_t cpu = ggml_backend_dev_buffer_type(ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU));

    for (int i = 0; i < cfg->n_ot; i++)
        bytes += strlen(cfg->ot[i]) + 1;
    if (!(p->overrides = calloc(max, sizeof *p->overrides)) || !(p->patterns = malloc(bytes)))
        return THAW_ENOMEM;
#define ADD_PATTERN(BT, ...)                                                                          \
    do {                                                                                                \
        if (n + 1 >= max) {                                                                             \
            LOG_ERR("more than %zu tensor overrides (-ot, -ncmoe, -ncffn)", max - 1);                   \
            return THAW_EINVAL;                                                                         \
        }                                                                                               \
        int w_ = snprintf(p->patterns + used, bytes - used, __VA_ARGS__);                               \
        p->overrides[n].pattern = p->patterns + used;                                                   \
        p->overrides[n++].buft = (BT);                                                                    \
        used += (size_t)w_ + 1;                                                                         \
    } while (0)
    for (int i = 0; i < cfg->n_ot; i++)
        for (const char *c = cfg->ot[i]; *c;) {
            size_t len = strcspn(c, ",");
            const char *eq = memchr(c, '=', len); /* config.c checked there is one */
            ggml_backend_buffer_type_t b = buft_by_name(eq + 1, (size_t)(c + len - eq - 1));
            if (!b) {
                LOG_ERR("-ot: no buffer type '%.*s' (one per device: see thaw serve --list-devices; CPU is 'CPU')",
                        (int)(c + len - eq - 1), eq + 1);
                return THAW_EINVAL;
            }
            ADD_PATTERN(b, "%.*s", (int)(eq - c), c);
            c += len;
            if (*c == ',')
                c++;
        }
    if (cfg->cpu_moe)
        ADD_PATTERN(cpu, "%s", exps);
    for (int i = 0; i < cfg->n_cpu_moe; i++)
        ADD_PATTERN(cpu, "blk\\.%d%s", i, exps);
    for (int i = 0; i < cfg->n_cpu_ffn; i++)
        ADD_PATTERN(cpu, "blk\\.%d%s", i, dense);
#undef ADD_PATTERN
    p->overrides[n].pattern = NULL; /* terminator */
    return 0;
}

static int build_kv_overrides(const struct thaw_config *cfg, struct thaw_params *p)
{
    size_t n = 0, k = 0;

    for (int i = 0; i < cfg->n_kv_overrides; i++)
        for (const char *c = cfg->kv_overrides[i]; *c; c++)
            n += *c == ',';
    n += (size_t)cfg->n_kv_overrides;
    if (!(p->kv = calloc(n + 1, sizeof *p->kv)))
        return THAW_ENOMEM;
    for (int i = 0; i < cfg->n_kv_overrides; i++)
        for (const char *c = cfg->kv_overrides[i]; *c;) {
            size_t len = strcspn(c, ",");
            char item[400];
            snprintf(item, sizeof item, "%.*s", (int)len, c);
            char *eq = strchr(item, '='), *val = strchr(eq, ':') + 1; /* checked by config.c */
            struct llama_model_kv_override *o = &p->kv[k++];
            snprintf(o->key, sizeof o->key, "%.*s", (int)(eq - item), item);
            if (!strncmp(eq + 1, "int:", 4)) {
                o->tag = LLAMA_KV_OVERRIDE_TYPE_INT;
                o->val_i64 = strtoll(val, NULL, 10);
            } else if (!strncmp(eq + 1, "float:", 6)) {
                o->tag = LLAMA_KV_OVERRIDE_TYPE_FLOAT;
                o->val_f64 = strtod(val, NULL);
            } else if (!strncmp(eq + 1, "bool:", 5)) {
                o->tag = LLAMA_KV_OVERRIDE_TYPE_BOOL;
                if (strcmp(val, "true") != 0 && strcmp(val, "false") != 0) {
                    LOG_ERR("--override-kv %s: a bool is true or false", item);
                    return THAW_EINVAL;
                }
                o->val_bool = strcmp(val, "true") == 0;
            } else {
                o->tag = LLAMA_KV_OVERRIDE_TYPE_STR;
                if (strlen(val) > 127) {
                    LOG_ERR("--override-kv %s: a string is at most 127 bytes", item);
                    return THAW_EINVAL;
                }
                snprintf(o->val_str, sizeof o->val_str, "%s", val);
            }
            c += len;
            if (*c == ',')
                c++;
        }
    return 0;
}

/* On a build with no GPU device: each placement flag given, logged once as
 * having no effect (llama-server warns the same way). */
static void log_no_gpu(const struct thaw_config *cfg)
{
    struct {
        bool given;
        const char *flag;
    } flags[] = {
        {cfg->n_gpu_layers != -1, "-ngl"},
        {cfg->split_mode != LLAMA_SPLIT_MODE_LAYER, "-sm"},
        {cfg->tensor_split[0] != 0, "-ts"},
        {cfg->main_gpu != 0, "-mg"},
        {cfg->devices != NULL, "-dev"},
        {!cfg->kv_offload, "-nkvo"},
        {!cfg->op_offload, "--no-op-offload"},
        {cfg->cpu_moe, "-cmoe"},
        {cfg->n_cpu_moe > 0, "-ncmoe"},
        {cfg->n_cpu_ffn > 0, "-ncffn"},
        {cfg->fit_ctx != 4096 || cfg->fit_target_mib[0] != 1024, "-fitt/-fitc"},
        {cfg->draft_n_gpu_layers != -1, "-ngld"},
        {cfg->draft_devices != NULL, "-devd"},
        {cfg->draft_cpu_moe || cfg->draft_n_cpu_moe > 0, "-cmoed/-ncmoed"},
    };
    char given[256] = "";

    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (flags[i].given)
            snprintf(given + strlen(given), sizeof given - strlen(given), "%s%s", given[0] ? ", " : "", flags[i].flag);
    if (given[0])
        LOG_INF("no GPU device: no effect from %s (everything runs on the CPU)", given);
}

/* Why ggml's AMX buffer type must stay out of the model at path, or NULL
 * when it may take its weights (llama.cpp v0.4.0, its prebuilt Sapphire
 * Rapids CPU variant): an MLA model (a `<arch>.attention.kv_lora_rank`
 * key: DeepSeek 2/3, Kimi...) aborts making its context (no backend for
 * an op on its weights there); F16 / BF16 weight matrices crash in
 * ggml_backend_amx_mul_mat once two sequences decode in one batch (seen
 * with an LFM2 model, -np 2). Quantized models, what AMX is for, keep it. */
static const char *amx_unsafe(const char *path)
{
    struct gguf_init_params gp = {.no_alloc = true, .ctx = NULL};
    struct gguf_context *g = path ? gguf_init_from_file(path, gp) : NULL;
    const char *why = NULL;

    if (!g)
        return NULL;
    int64_t a = gguf_find_key(g, "general.architecture");
    if (a >= 0 && gguf_get_kv_type(g, a) == GGUF_TYPE_STRING) {
        char key[128];
        snprintf(key, sizeof key, "%s.attention.kv_lora_rank", gguf_get_val_str(g, a));
        if (gguf_find_key(g, key) >= 0)
            why = "an MLA model";
    }
    for (int64_t i = 0; !why && i < gguf_get_n_tensors(g); i++) {
        enum ggml_type t = gguf_get_tensor_type(g, i);
        if (t == GGML_TYPE_F16 || t == GGML_TYPE_BF16)
            why = "a model with F16 / BF16 weights";
    }
    gguf_free(g);
    return why;
}

/* Whether the CPU backend offers the AMX buffer type (ggml's Sapphire
 * Rapids and later CPU variants). */
static bool cpu_has_amx(void)
{
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    ggml_backend_reg_t reg = cpu ? ggml_backend_dev_backend_reg(cpu) : NULL;
    typedef ggml_backend_buffer_type_t *(*get_extra_bufts_fn)(ggml_backend_dev_t);
    get_extra_bufts_fn get =
        reg ? (get_extra_bufts_fn)ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts") : NULL;

    for (ggml_backend_buffer_type_t *b = get ? get(cpu) : NULL; b && *b; b++)
        if (strstr(ggml_backend_buft_name(*b), "AMX"))
            return true;
    return false;
}

int thaw_params_model(const struct thaw_config *cfg, struct thaw_params *p, struct llama_model_params *mp)
{
    int rc = 0;

    memset(p, 0, sizeof *p);
    for (size_t i = 0; i < ggml_backend_dev_count(); i++)
        p->gpu |= is_gpu(ggml_backend_dev_get(i));
    if (!p->gpu)
        log_no_gpu(cfg);
    for (int i = 0; i < cfg->n_no_effect; i++)
        LOG_INF("%s: no effect on thaw: %s", cfg->no_effect[i].flag, cfg->no_effect[i].why);
    if (cfg->numa)
        llama_numa_init((enum ggml_numa_strategy)cfg->numa);

    struct placement pl = {cfg->tensor_overrides, cfg->n_tensor_overrides, cfg->cpu_moe, cfg->n_cpu_moe, cfg->n_cpu_ffn};
    if (cfg->devices && (rc = resolve_devices(cfg->devices, p)) != 0)
        goto error;
    if ((rc = build_overrides(&pl, p)) != 0 || (rc = build_kv_overrides(cfg, p)) != 0)
        goto error;
    size_t n_dev = llama_max_devices();
    if (!(p->tensor_split = calloc(n_dev, sizeof *p->tensor_split)) ||
        !(p->fit_margins = calloc(n_dev, sizeof *p->fit_margins))) {
        rc = THAW_ENOMEM;
        goto error;
    }
    for (size_t i = 0; i < n_dev && i < THAW_MAX_DEVICES; i++) {
        p->tensor_split[i] = cfg->tensor_split[i];
        p->fit_margins[i] = (size_t)cfg->fit_target_mib[i] << 20;
    }

    mp->devices = p->devices;
    mp->tensor_buft_overrides = p->overrides[0].pattern ? p->overrides : NULL;
    mp->n_gpu_layers = cfg->n_gpu_layers;
    mp->split_mode = (enum llama_split_mode)cfg->split_mode;
    mp->main_gpu = cfg->main_gpu;
    mp->tensor_split = p->tensor_split;
    mp->load_mode = (enum llama_load_mode)cfg->load_mode;
    mp->lazy_mode = (enum llama_lazy_mode)cfg->lazy_mode;
    mp->kv_overrides = cfg->n_kv_overrides ? p->kv : NULL;
    mp->check_tensors = cfg->check_tensors;
    mp->use_extra_bufts = cfg->repack;
    const char *why = mp->use_extra_bufts && cpu_has_amx() ? amx_unsafe(cfg->model_path) : NULL;
    if (why) { /* see amx_unsafe */
        LOG_WRN("%s on a CPU with AMX: its weights stay out of ggml's AMX and repacked buffers (as --no-repack), "
                "where llama.cpp cannot yet run it",
                why);
        mp->use_extra_bufts = false;
    }
    mp->no_host = cfg->no_host;
    LOG_INF("loading the model: load mode %s%s%s", llama_load_mode_name(mp->load_mode),
            mp->check_tensors ? ", checking tensors" : "", mp->use_extra_bufts ? "" : ", no repacking");
    return 0;

error:
    thaw_params_free(p);
    return rc;
}

int thaw_params_draft_model(const struct thaw_config *cfg, struct thaw_params *p, struct llama_model_params *mp)
{
    struct placement pl = {cfg->draft_tensor_overrides, cfg->n_draft_tensor_overrides, cfg->draft_cpu_moe,
                           cfg->draft_n_cpu_moe, 0};
    int rc;

    memset(p, 0, sizeof *p);
    if ((cfg->draft_devices && (rc = resolve_devices(cfg->draft_devices, p)) != 0) ||
        (rc = build_overrides(&pl, p)) != 0) {
        thaw_params_free(p);
        return rc;
    }
    mp->devices = p->devices;
    mp->tensor_buft_overrides = p->overrides[0].pattern ? p->overrides : NULL;
    mp->n_gpu_layers = cfg->draft_n_gpu_layers;
    mp->load_mode = (enum llama_load_mode)cfg->load_mode; /* memory: as the target's */
    mp->use_extra_bufts = cfg->repack;
    mp->no_host = cfg->no_host;
    return 0;
}

void thaw_params_free(struct thaw_params *p)
{
    free(p->devices);
    free(p->overrides);
    free(p->patterns);
    free(p->kv);
    free(p->tensor_split);
    free(p->fit_margins);
    memset(p, 0, sizeof *p);
}

/* ---- context params ------------------------------------------------------------- */

void thaw_params_context(const struct thaw_config *cfg, struct llama_context_params *cp)
{
    cp->n_ctx = (uint32_t)cfg->n_ctx; /* 0: the model's training context */
    cp->flash_attn_type = (enum llama_flash_attn_type)cfg->flash_attn;
    cp->type_k = (enum ggml_type)cfg->type_k;
    cp->type_v = (enum ggml_type)cfg->type_v;
    cp->rope_scaling_type = (enum llama_rope_scaling_type)cfg->rope_scaling;
    cp->rope_freq_base = cfg->rope_freq_base;
    cp->rope_freq_scale = cfg->rope_freq_scale;
    cp->yarn_ext_factor = cfg->yarn_ext_factor;
    cp->yarn_attn_factor = cfg->yarn_attn_factor;
    cp->yarn_beta_fast = cfg->yarn_beta_fast;
    cp->yarn_beta_slow = cfg->yarn_beta_slow;
    cp->yarn_orig_ctx = (uint32_t)cfg->yarn_orig_ctx;
    cp->offload_kqv = cfg->kv_offload;
    cp->op_offload = cfg->op_offload;
}

/* ---- -fit -------------------------------------------------------------------------- */

void thaw_params_fit(const struct thaw_config *cfg, struct thaw_params *p, struct llama_model_params *mp,
                     struct llama_context_params *cp)
{
    if (!cfg->fit || !p->gpu)
        return; /* all in host memory: nothing to fit */
    /* it only moves what was left unset, and gives up on a placement the
     * command line chose (llama-server logs the same and loads as given) */
    if (mp->n_gpu_layers != -1 || mp->tensor_buft_overrides || cfg->tensor_split[0] != 0) {
        LOG_INF("-fit: nothing to fit: -ngl, -ts or tensor overrides (-ot, -cmoe, -ncmoe) place the model");
        return;
    }
    int32_t ngl = mp->n_gpu_layers;
    uint32_t n_ctx = cp->n_ctx;
    int rc = thaw_fit_call(cfg->model_path, mp, cp, p->tensor_split, p->overrides, p->fit_margins,
                           (uint32_t)cfg->fit_ctx, cfg->verbosity >= 2);
    /* common_fit_params may have written overrides into our buffer */
    mp->tensor_buft_overrides = p->overrides[0].pattern ? p->overrides : NULL;
    if (rc == 0)
        LOG_INF("-fit: -ngl %d -> %d, -c %u -> %u", ngl, mp->n_gpu_layers, n_ctx, cp->n_ctx);
    else
        LOG_WRN("-fit: %s; loading with the settings as given", rc == 1 ? "found no settings that fit" : "failed");
    /* the llama logger was borrowed by common_fit_params: the engine sets its own again */
}

/* ---- opening the model and its context ---- */

/* llama's and ggml's log lines, as thaw's: errors and warnings as such, the
 * rest at debug level (-lv). */
static void llama_log_cb(enum ggml_log_level level, const char *text, void *ud)
{
    (void)ud;
    if (level == GGML_LOG_LEVEL_CONT)
        return;
    int v = level >= GGML_LOG_LEVEL_ERROR ? THAW_LOG_ERROR : level == GGML_LOG_LEVEL_WARN ? THAW_LOG_WARN : 3;
    if (v > thaw_log_verbosity())
        return;
    size_t n = strlen(text);
    while (n > 0 && text[n - 1] == '\n')
        n--;
    thaw_log((enum thaw_log_level)(v > THAW_LOG_DEBUG ? THAW_LOG_DEBUG : v), "llama: %.*s", (int)n, text);
}

struct load_watch {
    int64_t t0;        /* the load's start */
    int next_quarter;  /* the next quarter to log */
    int64_t told_us;   /* when `progress` was last told */
    const struct thaw_load_progress *progress;
};

/* Logs 25/50/75% of a model load, only once it has taken over a second,
 * and tells the load's watcher (at most every 100 ms, and its end). */
static bool load_progress(float p, void *ud)
{
    struct load_watch *w = ud;
    int quarter = (int)(p * 4);
    int64_t now = thaw_now_us();

    if (quarter >= 1 && quarter <= 3 && quarter >= w->next_quarter && now - w->t0 > 1000000) {
        LOG_INF("loading model: %d%%", quarter * 25);
        w->next_quarter = quarter + 1;
    }
    if (w->progress && w->progress->fn && (p >= 1.0f || now - w->told_us >= 100000)) {
        w->told_us = now;
        w->progress->fn(w->progress->ud, "text_model", p);
    }
    return true;
}

int thaw_params_open(const struct thaw_config *cfg, bool want_tap, const struct thaw_load_progress *progress,
                     struct llama_model **model, struct llama_context **ctx, struct thaw_kvtap **tap,
                     struct thaw_threads **threads, struct llama_context_params *cp_out)
{
    struct thaw_params pp = {0}; /* what mp points into, until the context exists */
    struct load_watch watch = {thaw_now_us(), 1, 0, progress};
    int rc;

    *model = NULL;
    *ctx = NULL;
    *tap = NULL;
    *threads = NULL;
    llama_log_set(llama_log_cb, NULL);
    llama_backend_init();
    thaw_params_load_backends(cfg);
    struct llama_model_params mp = llama_model_default_params();
    struct llama_context_params cp = llama_context_default_params();
    if ((rc = thaw_params_model(cfg, &pp, &mp)) != 0)
        return rc;
    thaw_params_context(cfg, &cp);
    cp.n_batch = (uint32_t)cfg->n_batch;
    cp.n_ubatch = (uint32_t)cfg->n_ubatch;
    cp.n_seq_max = (uint32_t)cfg->n_parallel;
    cp.n_threads = cfg->n_threads;
    cp.n_threads_batch = cfg->n_threads_batch;
    cp.kv_unified = false; /* each slot its own cells: a slot's state is its own to save and restore */
    cp.swa_full = cfg->swa_full;
    cp.no_perf = true;
    if (cfg->embedding) {
        /* outputs are pooled vectors (or each token's, pooling none), not
         * logits. One KV stream for all slots: nothing is stored per slot,
         * and with a stream per sequence libllama cuts a batch of several
         * prompts into equal-length micro-batches (split_equal), so a
         * decoder's pooling would see only the last piece of a prompt; one
         * stream takes the batch whole (split_simple, <= n_ubatch). A
         * prompt may then use the whole -c. */
        cp.embeddings = true;
        cp.pooling_type = (enum llama_pooling_type)cfg->pooling;
        cp.kv_unified = true;
    }
    thaw_params_fit(cfg, &pp, &mp, &cp);
    llama_log_set(llama_log_cb, NULL); /* -fit borrows llama's logger */
    mp.progress_callback = load_progress;
    mp.progress_callback_user_data = &watch;
    *model = llama_model_load_from_file(cfg->model_path, mp);
    if (!*model) {
        LOG_ERR("llama.cpp could not load %s (not a model GGUF, or an unsupported architecture)", cfg->model_path);
        rc = THAW_ELLAMA;
        goto error;
    }
    /* the tap watches the graphs for where the KV cache's cells are
     * (kvtap.h), in host or device memory */
    if (want_tap) {
        if ((rc = thaw_kvtap_new(tap)) != 0)
            goto error;
        cp.cb_eval = thaw_kvtap_eval_cb;
        cp.cb_eval_user_data = *tap;
    }
    *ctx = llama_init_from_model(*model, cp);
    if (!*ctx) {
        LOG_ERR("llama.cpp could not create a context (-c %d, -np %d): too little memory?", cfg->n_ctx,
                cfg->n_parallel);
        rc = THAW_ELLAMA;
        goto error;
    }
    if ((rc = thaw_threads_attach(*ctx, cfg->n_threads, &cfg->cpu, cfg->n_threads_batch, &cfg->cpu_batch, threads)) !=
        0) {
        llama_free(*ctx);
        *ctx = NULL;
        goto error;
    }
    thaw_params_free(&pp);
    *cp_out = cp;
    return 0;

error:
    thaw_params_free(&pp);
    thaw_kvtap_free(*tap);
    *tap = NULL;
    if (*model)
        llama_model_free(*model);
    *model = NULL;
    return rc;
}
