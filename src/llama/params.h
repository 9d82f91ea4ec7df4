/* params.h — the config's placement, memory and context settings as
 * llama.cpp's parameter structs (llama_model_params, llama_context_params).
 *
 * llama's structs point into storage this module owns (device lists,
 * tensor-override patterns, metadata overrides, the tensor split): keep the
 * thaw_params alive until the model is loaded and the context created,
 * then thaw_params_free it. Every setting means what llama-server's flag
 * of the same name means (common/common.cpp common_model_params_to_llama).
 */
#ifndef THAW_PARAMS_H
#define THAW_PARAMS_H

#include <stdbool.h>
#include <stdio.h>

#include <llama.h>

struct thaw_config;
struct thaw_kvtap;
struct thaw_threads;

struct thaw_params {
    ggml_backend_dev_t *devices;                        /* NULL-terminated, or NULL = every device */
    struct llama_model_tensor_buft_override *overrides; /* llama_max_tensor_buft_overrides() entries */
    char *patterns;                                     /* the overrides' patterns, back to back */
    struct llama_model_kv_override *kv;                 /* key "" terminates */
    float *tensor_split;                                /* llama_max_devices() entries */
    size_t *fit_margins;                                /* bytes, llama_max_devices() entries */
    bool gpu;                                           /* a GPU (or iGPU) device is present */
};

/* Fills *mp from cfg (after llama_model_default_params) once the backends
 * are loaded: resolves -dev names and -ot buffer types, builds -cmoe /
 * -ncmoe / -ncffn patterns, parses --override-kv, applies --numa. On a
 * build without a GPU device, logs each placement flag given as having no
 * effect. Returns 0, THAW_EINVAL (an unknown device or buffer type; the
 * reason logged) or THAW_ENOMEM; on error *p is freed. */
int thaw_params_model(const struct thaw_config *cfg, struct thaw_params *p, struct llama_model_params *mp);

/* The same for the draft model (-md): -ngld, -devd, -otd, -cmoed, -ncmoed,
 * and the target's load mode and repacking. Same returns. */
int thaw_params_draft_model(const struct thaw_config *cfg, struct thaw_params *p, struct llama_model_params *mp);

/* Fills the context settings of *cp from cfg (-c, -fa, -ctk/-ctv, rope,
 * YaRN, -nkvo, --op-offload); leaves thaw's own (threads, batch, slots). */
void thaw_params_context(const struct thaw_config *cfg, struct llama_context_params *cp);

/* -fit: lowers what was left at its default (-ngl auto, -c 0) until the
 * model and context fit the devices' free memory less -fitt, never the
 * context below -fitc (llama.cpp's common_fit_params). Only on a GPU; a
 * no-op otherwise. Logs the outcome. */
void thaw_params_fit(const struct thaw_config *cfg, struct thaw_params *p, struct llama_model_params *mp,
                     struct llama_context_params *cp);

/* Frees what thaw_params_model allocated; *p may be zeroed or already freed. */
void thaw_params_free(struct thaw_params *p);

/* --list-devices: loads the backends (cfg's --backend-dir) and prints the
 * devices llama-server would list, one a line. */
void thaw_params_list_devices(const struct thaw_config *cfg, FILE *f);

/* Loads ggml's backends from --backend-dir, $THAW_BACKEND_DIR or the
 * llama.cpp thaw was built with. Idempotent. */
void thaw_params_load_backends(const struct thaw_config *cfg);

/* How far a model's load has come, for whoever waits for it (models.c:
 * GET /models, /models/sse): `stage` is "text_model" or "mmproj_model"
 * (llama-server's words), value 0..1; called on the loading thread, at
 * most every 100 ms but always with 1 at a stage's end. */
struct thaw_load_progress {
    void (*fn)(void *ud, const char *stage, float value);
    void *ud;
};

/* Loads the model and creates its context as every flag says (the above,
 * then thaw's own: batch sizes, threads, one sequence of its own per slot,
 * --swa-full), with llama's log lines routed to thaw's and the load's
 * progress logged (and told to `progress`, NULL: nobody). With want_tap, and when the KV cache stays in host
 * memory (no GPU device), a tap (kvtap.h) watches the context's graphs;
 * *tap is NULL otherwise. *cp_out: the context's settings (the cache keys
 * bind its KV types). Returns 0, or an error (logged) with nothing left
 * open. *threads: the context's CPU threadpools (threads.h; NULL when
 * ggml makes its own). The caller frees the context, then the threads and
 * the tap, then the model. */
int thaw_params_open(const struct thaw_config *cfg, bool want_tap, const struct thaw_load_progress *progress,
                     struct llama_model **model,
                     struct llama_context **ctx, struct thaw_kvtap **tap, struct thaw_threads **threads,
                     struct llama_context_params *cp_out);

#endif
