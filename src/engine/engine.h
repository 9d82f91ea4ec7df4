/* engine.h — the model, the llama_context and the thread that owns them.
 *
 * One engine thread runs the decode loop: it admits queued tasks into idle
 * slots, builds ONE llama_batch from every active slot (the next token of
 * each generating slot plus as many prompt tokens as fit), decodes it, and
 * samples. No other thread ever touches the llama_context (DESIGN §3).
 */
#ifndef THAW_ENGINE_H
#define THAW_ENGINE_H

#include "api/chat.h"
#include "base/config.h"
#include "base/metrics.h"
#include "cache/keys.h"
#include "engine/task.h"

#include <stdint.h>

struct thaw_engine;
struct thaw_placement;

/* Loads the model named by cfg->model_path, creates the context with
 * cfg->n_parallel sequences and starts the engine thread. kv_store: the
 * --kv-cache-dir every model of the process shares
 * (thaw_kvcache_open_store), which the engine's disk tier takes a handle
 * onto; NULL: the engine opens cfg->kv_cache_dir itself. `progress`
 * (NULL: none) is told how far the load has come: the model's weights,
 * then the projector's (params.h). `cfg`, `metrics` and kv_store must
 * outlive the engine. Returns 0, -errno, THAW_ELLAMA (load or context
 * failure, logged) or THAW_ENOMEM. */
struct thaw_disk_cache;    /* cache_disk.h */
struct thaw_load_progress; /* llama/params.h */
int thaw_engine_new(const struct thaw_config *cfg, struct thaw_metrics *metrics, struct thaw_disk_cache *kv_store,
                    const struct thaw_load_progress *progress, struct thaw_engine **out);

/* Stops the thread: active and queued tasks fail with 503, later submits get
 * THAW_ESHUTDOWN. Everything else stays valid until thaw_engine_free.
 * Idempotent. */
void thaw_engine_stop(struct thaw_engine *e);

/* Stops (if not yet) and frees all. */
void thaw_engine_free(struct thaw_engine *e);

/* Hands a task to the engine (it takes its own reference); when the task's
 * conversation is on disk, starts reading it (thaw_disk_cache_prefetch)
 * before it waits for a slot. Returns 0,
 * THAW_ECTXFULL (prompt cannot fit a slot's context; an EMBED or RERANK
 * task: empty, over a slot's context or over thaw_engine_max_embed_tokens,
 * or the server was not started with --embedding), THAW_EBUSY (queue
 * full) or THAW_ESHUTDOWN. */
int thaw_engine_submit(struct thaw_engine *e, struct thaw_task *t);

const struct thaw_chat *thaw_engine_chat(const struct thaw_engine *e);
/* The logit biases req's sampler applies (thaw_sampler_biases): how many
 * into *tok / *val (the caller frees both), or THAW_ENOMEM. Any thread. */
int thaw_engine_biases(const struct thaw_engine *e, const struct thaw_chat_request *req, int32_t **tok,
                       float **val);
/* The reasoning budget requests default to (--reasoning-budget, then POST
 * /props): *budget (-1 unlimited) and a malloc'd copy of the budget
 * message in *message (NULL = none; the caller frees). Returns 0 or
 * THAW_ENOMEM. Any thread. */
int thaw_engine_reasoning_get(struct thaw_engine *e, int *budget, char **message);
/* Sets them for requests from now on: budget >= -1; message NULL keeps
 * the current one, "" means none. Returns 0 or THAW_ENOMEM. Any thread. */
int thaw_engine_reasoning_set(struct thaw_engine *e, int budget, const char *message);
/* What GET /slots shows (slots_view.h): any thread may read it. */
struct thaw_slots_view *thaw_engine_slots_view(const struct thaw_engine *e);
const char *thaw_engine_model_name(const struct thaw_engine *e);
int thaw_engine_n_ctx_slot(const struct thaw_engine *e);
/* The longest text any one token stands for, in bytes (>= 1). */
int thaw_engine_max_token_bytes(const struct thaw_engine *e);
int thaw_engine_n_ctx_train(const struct thaw_engine *e);
/* --embedding: the context's pooling (enum llama_pooling_type: 0 none, 1
 * mean, 2 cls, 3 last, 4 rank); -1 when the server serves chat. */
int thaw_engine_pooling(const struct thaw_engine *e);
/* --embedding: the longest prompt one embedding takes (one micro-batch,
 * -ub; a slot's context bounds it too: thaw_engine_n_ctx_slot). */
int thaw_engine_max_embed_tokens(const struct thaw_engine *e);
/* Recurrent or hybrid memory: rolls back only to a checkpoint. */
bool thaw_engine_recurrent(const struct thaw_engine *e);
uint64_t thaw_engine_n_params(const struct thaw_engine *e);
/* Where the model's layers, weights, KV cache and compute buffers sit
 * (placement.h), as read at start; the engine owns it. */
const struct thaw_placement *thaw_engine_placement(const struct thaw_engine *e);
/* The model's numbers GET /v1/models reports. */
void thaw_engine_model_meta(const struct thaw_engine *e, struct thaw_model_meta *m);

/* The key binding for a tenant namespace (model fingerprint + context
 * settings + namespace), see thaw_keys_binding. */
void thaw_engine_binding(const struct thaw_engine *e, const uint8_t namespace_id[THAW_KEY_BYTES],
                         uint8_t out[THAW_KEY_BYTES]);

/* Appends the engine's own Prometheus lines (disk cache etc.). Matches
 * thaw_metrics_extra_fn; `ud` is the engine. */
void thaw_engine_metrics(void *ud, char *buf, size_t cap, size_t *len);

#endif
