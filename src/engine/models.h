/* models.h — the models one process serves, and the engine each loaded one
 * runs (DESIGN §16).
 *
 * With -m there is one model, loaded at start and never unloaded but by
 * --sleep-idle-seconds: every request goes to it whatever its 'model'
 * field says (thaw's behaviour before --models-dir). With --models-dir every GGUF file in the directory
 * is a model named by its stem; a request's 'model' picks one (its stem,
 * or its file name), which is loaded on demand. With --models-preset (with
 * or without --models-dir) each [NAME] section is a model too, or sets the
 * --models-dir file of that stem: it runs with its own config (the
 * section's flags, cli/config.c), is also named by its aliases, and may
 * be loaded before the server listens (load-on-startup). At most --models-max are
 * loaded at once: loading one more first unloads the least recently used
 * one no request holds. Unloading is a clean shutdown of that engine
 * (thaw_engine_free: its slots' conversations stored, the writer's queue
 * written), so a model that comes back restores its conversations from the
 * cache: the keys carry the model's fingerprint and settings.
 *
 * A request holds the model it was routed to (thaw_models_acquire) until
 * its connection is done with the engine (thaw_models_release): a model
 * held is never unloaded. Any thread.
 */
#ifndef THAW_MODELS_H
#define THAW_MODELS_H

#include "base/config.h"
#include "base/metrics.h"

#include <stdbool.h>
#include <stdint.h>

struct thaw_engine;
struct thaw_models;
struct thaw_model;

enum thaw_model_status {
    THAW_MODEL_UNLOADED,
    THAW_MODEL_LOADING,
    THAW_MODEL_LOADED,
    THAW_MODEL_UNLOADING,
};

/* "unloaded", "loading", "loaded", "unloading" (llama-server's words). */
const char *thaw_model_status_name(enum thaw_model_status s);

/* The models cfg names: -m (loaded now; its failure is returned) or the
 * GGUF files in --models-dir and the models of --models-preset (none
 * loaded yet but the load-on-startup ones, whose failure is returned; an
 * empty set is THAW_ENOTFOUND, an alias naming two models THAW_EINVAL,
 * logged). `cfg` and `metrics` must outlive the set.
 * Returns 0, THAW_ENOMEM, -errno or thaw_engine_new's error. */
int thaw_models_new(const struct thaw_config *cfg, struct thaw_metrics *metrics, struct thaw_models **out);

/* Stops every loaded engine (thaw_engine_stop: waiting requests get their
 * 503) and makes later loads fail with THAW_ESHUTDOWN. Idempotent. */
void thaw_models_stop(struct thaw_models *ms);

/* Stops and frees every engine (their conversations stored), then the set.
 * NULL: no-op. */
void thaw_models_free(struct thaw_models *ms);

/* Whether the set is --models-dir's or --models-preset's (many models)
 * rather than -m's. */
bool thaw_models_many(const struct thaw_models *ms);

/* Whether a model may be unloaded while the server runs, so that a request
 * may have to wait for its load (thaw_models_try): many models, or -m's
 * one with --sleep-idle-seconds (asleep, it is loaded again by the next
 * request that needs it, --no-models-autoload or not). */
bool thaw_models_dynamic(const struct thaw_models *ms);

/* The model `name` names (NULL or "" with -m: the one model; with
 * --models-dir, NULL or "" names the only model when there is exactly one),
 * held for the caller in *out: loaded (when `load`; it waits while another
 * request loads it or while every loaded model is held, up to timeout_s
 * seconds). Returns 0 (release it with thaw_models_release), THAW_ENOTFOUND
 * (no such model), THAW_EBUSY (not loaded and `load` false), THAW_ETIMEDOUT,
 * THAW_ESHUTDOWN, or the load's error (logged; the model stays unloaded). */
int thaw_models_acquire(struct thaw_models *ms, const char *name, bool load, int timeout_s, struct thaw_model **out);

/* A request that waits for its model without blocking its thread: it
 * registers a watch and is woken (wake(ud), from the set's loader thread,
 * with the set's mutex held: wake must not call back into the set) after
 * every load or unload and at least once a second, and then asks again.
 * Caller storage; zero it before first use. */
struct thaw_models_watch {
    void (*wake)(void *ud);
    bool (*alive)(void *ud);                  /* false once its client left: the loader loads nothing for it
                                               * (NULL: always there) */
    void *ud;
    struct thaw_model *want;                  /* set's: the model it waits for, NULL = not watching */
    struct thaw_models_watch *prev, *next;    /* set's */
};

/* As thaw_models_acquire, without waiting: 0 (*out held), THAW_EPENDING
 * (the model is loading, or is to be loaded by the set's loader thread:
 * `w` is watching, ask again when woken), THAW_ENOTFOUND, THAW_EBUSY,
 * THAW_ESHUTDOWN, or the error its load ended with. Anything but
 * THAW_EPENDING leaves `w` not watching. */
int thaw_models_try(struct thaw_models *ms, const char *name, bool load, struct thaw_models_watch *w,
                    struct thaw_model **out);

/* Stops watching (a request that gives up waiting). No-op when `w` is not. */
void thaw_models_unwatch(struct thaw_models *ms, struct thaw_models_watch *w);

/* Another hold on a model the caller holds (for work that outlives the
 * request's handler: a deferred reply, a stream). */
void thaw_models_hold(struct thaw_models *ms, struct thaw_model *m);

/* Drops one hold. */
void thaw_models_release(struct thaw_models *ms, struct thaw_model *m);

/* A hold for a look at a loaded model that is no use of it (a /metrics
 * scrape): as thaw_models_acquire(name, load false) but it counts as no
 * activity for --sleep-idle-seconds, so it keeps no model awake. Returns
 * 0 (*out held: thaw_models_unpeek), THAW_ENOTFOUND or THAW_EBUSY (not
 * loaded). */
int thaw_models_peek(struct thaw_models *ms, const char *name, struct thaw_model **out);
void thaw_models_unpeek(struct thaw_models *ms, struct thaw_model *m);

/* Unloads `name` (its conversations stored) once nobody holds it. Returns
 * 0, THAW_ENOTFOUND, THAW_EINVAL (not loaded; or the -m model, which is
 * never unloaded) or THAW_ETIMEDOUT (still held after timeout_s) or THAW_ESHUTDOWN. */
int thaw_models_unload(struct thaw_models *ms, const char *name, int timeout_s);

/* A held model's engine (valid while held), and its name and the config
 * its engine runs with (valid as long as the set). */
struct thaw_engine *thaw_model_engine(const struct thaw_model *m);
const char *thaw_model_name(const struct thaw_model *m);
const struct thaw_config *thaw_model_config(const struct thaw_model *m);

/* What the i-th model is now (it may change as soon as this returns). */
struct thaw_model_info {
    const char *name;
    const char *aliases;  /* "a,b", NULL: none */
    const char *path;
    enum thaw_model_status status;
    const char *stage;    /* LOADING: "text_model" or "mmproj_model", else NULL */
    float progress;       /* LOADING: how far `stage` has come, 0..1 */
    bool vision;          /* it has a projector (--mmproj / a preset's mmproj) */
    bool failed;          /* UNLOADED: its last load failed */
    int waiting;          /* requests waiting for it to be loaded */
};

/* The i-th model (0 <= i < thaw_models_count); strings valid as long as the set. */
int thaw_models_count(const struct thaw_models *ms);
void thaw_models_get(struct thaw_models *ms, int i, struct thaw_model_info *out);

/* GET /models/sse (llama-server's): every status move of every model and
 * its load's progress, each as one JSON event
 * ({"model", "event": "status_change", "data": {"status", "progress"?,
 * "exit_code"?}}). A reader subscribes (its wake(ud) is called, with the
 * set's mutex held: it must not call back into the set, after each new
 * event) and reads from the cursor subscribe returned; one that falls
 * more than 64 events behind skips to the oldest kept. Caller storage,
 * zeroed before first use. */
struct thaw_models_sub {
    void (*wake)(void *ud);
    void *ud;
    bool on;                             /* set's */
    struct thaw_models_sub *prev, *next; /* set's */
};
uint64_t thaw_models_subscribe(struct thaw_models *ms, struct thaw_models_sub *sub);
void thaw_models_unsubscribe(struct thaw_models *ms, struct thaw_models_sub *sub);
/* The event at *cursor, malloc'd (the caller frees), *cursor moved past
 * it; NULL when there is none yet (or out of memory). */
char *thaw_models_event_next(struct thaw_models *ms, uint64_t *cursor);

/* Appends to buf (cap bytes, at *len, NUL-terminated) the engine lines
 * /metrics had for the model `name` names (NULL: the first such) as it
 * fell asleep (--sleep-idle-seconds), while it sleeps: a sleeping
 * model's /metrics reads as it was, as llama-server's. false: no such
 * model asleep (awake, loading, or unloaded for another reason). */
bool thaw_models_asleep_metrics(struct thaw_models *ms, const char *name, char *buf, size_t cap, size_t *len);

/* The counters of the model `name` names (as thaw_models_acquire finds
 * it, loaded or not): its engines' since the start, kept across unloads,
 * its gauges zero while unloaded (asleep: as they were). With -m, the server's own struct (the
 * one thaw_models_new was given). NULL: no such model. Valid as long as
 * the set. */
struct thaw_metrics *thaw_models_metrics(struct thaw_models *ms, const char *name);

/* Adds every model's counters into out (thaw_metrics_add): the totals
 * with --models-dir, where each model counts in its own struct. -m: no-op
 * (its engine counts in the server's). */
void thaw_models_metrics_sum(struct thaw_models *ms, struct thaw_metrics *out);

/* The names of every model, comma-separated, into buf (truncated with
 * "..." when it does not fit). */
void thaw_models_names(const struct thaw_models *ms, char *buf, size_t cap);

#endif
