/* models.c — the set of models and their engines: lookup, load, LRU unload.
 *
 * Map:
 *   ---- the set ----      -m's one model, or --models-dir's files
 *   ---- load/unload ----  one mutex and one condition for every move
 *   ---- queries ----
 *
 * A model's status moves UNLOADED -> LOADING -> LOADED -> UNLOADING ->
 * UNLOADED, always under ms->mu, and every move broadcasts ms->cond. The
 * slow part of a move (thaw_engine_new, thaw_engine_free) runs with the
 * mutex released, by the thread that made the move: its status tells the
 * others to wait. A LOADING or UNLOADING model counts toward --models-max,
 * so an unload finishes (its memory freed) before the load it makes room
 * for starts.
 *
 * The cache (DESIGN §16): with --models-dir, --kv-cache-dir is opened once
 * here (kv_store) and every engine's disk tier is a handle onto it
 * (cache_disk.h, thaw_disk_cache_handle): one lock, one index, one writer
 * and one --kv-cache-max for all models, each storing and finding only
 * under its own fingerprint. The RAM tier is an engine's own (engine
 * thread only, no lock: sharing one across engine threads would put a lock
 * on every lookup and store), so "one --cache-ram for all" is kept by
 * giving each model its share: --cache-ram / --models-max, whatever the
 * number loaded now; with no --models-max each model gets it whole.
 *
 * Sleep (--sleep-idle-seconds N, llama-server's): the loader thread also
 * unloads, the same way as for --models-max, a model that no request has
 * held for N seconds (a /metrics scrape peeks and does not count), and the
 * next request for it loads it again as any unloaded model; -m's one
 * model too (its set then has a loader thread of its own). Asleep, it
 * reads on /metrics as it was when it fell asleep (its engine's lines kept
 * as text, its gauges left as they were), as llama-server's does.
 */
#include "engine/models.h"

#include "base/blob.h"
#include "base/error.h"
#include "base/log.h"
#include "cache/cache_disk.h"
#include "cache/kvcache.h"
#include "engine/engine.h"
#include "llama/params.h"

#include <dirent.h>
#include <jansson.h>
#include <errno.h>
#include <llama.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

struct thaw_model {
    char *name;                /* --models-dir: the file's stem; a preset's: its section; -m: the engine's name */
    char *file;                /* the file name, with .gguf (--models-dir); NULL: a preset's file elsewhere */
    char *path;
    char *aliases;             /* its preset's alias = a,b: "a,b", other names routed to it; NULL: none */
    bool load_on_startup;      /* its preset's load-on-startup */
    struct thaw_config cfg;    /* the server's, with this model's path and name */
    struct thaw_engine *engine; /* LOADED: set; else NULL */
    struct thaw_metrics *metrics; /* its engine's counters, kept across unloads (--models-dir: its own;
                                   * -m: the server's) */
    enum thaw_model_status status;
    int refs;                  /* holds (thaw_models_acquire/hold) */
    int wanted;                /* watches waiting for it (thaw_models_try): the loader loads it */
    int load_rc;               /* its last load's error, for its watchers; 0 once it is wanted anew */
    uint64_t last_used;        /* ms->tick at its last acquire: the LRU order */
    int64_t active_ms;         /* monotonic ms of its last acquire or release, or its load: with no
                                * hold, it has been idle since (--sleep-idle-seconds); peeks leave it */
    char *asleep_lines;        /* its engine's /metrics lines as it fell asleep (--sleep-idle-seconds),
                                * served while it sleeps; NULL: awake, or unloaded otherwise */
    const char *stage;         /* LOADING: "text_model" or "mmproj_model" (static), else NULL */
    float progress;            /* LOADING: how far `stage` has come, 0..1 */
    struct thaw_models *set;   /* its set (the load's progress callback finds the mutex) */
};

#define N_EVENTS 64 /* the events /models/sse readers can fall behind by */

struct thaw_models {
    const struct thaw_config *cfg;
    struct thaw_metrics *metrics;
    struct thaw_disk_cache *kv_store; /* --models-dir with --kv-cache-dir: the directory every engine shares */
    bool many;                 /* --models-dir or --models-preset */
    bool stopped;
    struct thaw_model *models; /* n, sorted by name */
    int n;
    uint64_t tick;
    struct thaw_models_watch *watches; /* every request waiting in thaw_models_try, the newest first */
    struct thaw_models_sub *subs;      /* every /models/sse reader */
    char *events[N_EVENTS];            /* the last N_EVENTS events' JSON: event i at events[i % N_EVENTS] */
    uint64_t n_events;                 /* events so far */
    pthread_t loader;                  /* --models-dir: loads what watches want */
    bool loader_started;
    pthread_mutex_t mu;
    pthread_cond_t cond;
};

#define ASLEEP_LINES_CAP 65536 /* bytes: an engine's /metrics lines, every tier on (~20 KiB) */

static void *loader_main(void *arg);
static int load_locked(struct thaw_models *ms, struct thaw_model *m);

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

const char *thaw_model_status_name(enum thaw_model_status s)
{
    static const char *const names[] = {"unloaded", "loading", "loaded", "unloading"};
    return (unsigned)s < sizeof names / sizeof names[0] ? names[s] : "unknown";
}

/* ---- the set ------------------------------------------------------------------------ */

static int by_name(const void *a, const void *b)
{
    return strcmp(((const struct thaw_model *)a)->name, ((const struct thaw_model *)b)->name);
}

static bool is_gguf(const char *name)
{
    size_t n = strlen(name);
    return n > 5 && strcmp(name + n - 5, ".gguf") == 0 && name[0] != '.';
}

/* One more unloaded model, named `name` (a copy is kept, as of file and
 * path; file may be NULL: a preset's model outside --models-dir). */
static int add_model(struct thaw_models *ms, int *cap, const char *name, const char *file, const char *path,
                     struct thaw_model **out)
{
    if (ms->n == *cap) {
        int ncap = *cap ? *cap * 2 : 8;
        struct thaw_model *grown = realloc(ms->models, (size_t)ncap * sizeof *grown);
        if (!grown)
            return THAW_ENOMEM;
        ms->models = grown;
        *cap = ncap;
    }
    struct thaw_model *m = &ms->models[ms->n++];
    memset(m, 0, sizeof *m);
    m->name = strdup(name);
    m->file = file ? strdup(file) : NULL;
    m->path = strdup(path);
    m->metrics = calloc(1, sizeof *m->metrics);
    m->set = ms;
    *out = m;
    return m->name && (m->file || !file) && m->path && m->metrics ? 0 : THAW_ENOMEM;
}

/* m runs with `base` (the server's, or its preset's) and its own path and name. */
static void configure(struct thaw_models *ms, struct thaw_model *m, const struct thaw_config *base)
{
    m->cfg = *base;
    m->cfg.model_path = m->path;
    m->cfg.alias = m->name; /* its engine answers with its name; the aliases route (find) */
    if (ms->cfg->models_max > 0) /* one --cache-ram for all (see the top) */
        m->cfg.cache_ram_mib = ms->cfg->cache_ram_mib / (uint64_t)ms->cfg->models_max;
}

/* Every regular *.gguf file in dir, as an unloaded model. */
static int scan_dir(struct thaw_models *ms, const char *dir, int *cap)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int rc = 0;

    if (!d) {
        rc = -errno;
        LOG_ERR("--models-dir %s: %s", dir, thaw_strerror(rc));
        return rc;
    }
    while ((de = readdir(d)) != NULL) {
        char path[4096], name[256];
        struct stat st;
        struct thaw_model *m;

        if (!is_gguf(de->d_name))
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        snprintf(name, sizeof name, "%.*s", (int)strlen(de->d_name) - 5, de->d_name);
        if ((rc = add_model(ms, cap, name, de->d_name, path, &m)) != 0)
            break;
        configure(ms, m, ms->cfg->preset_base ? ms->cfg->preset_base : ms->cfg);
    }
    closedir(d);
    return rc;
}

/* "a, b,,c" as "a,b,c" (malloc'd), or NULL when it names none. */
static char *alias_list(const char *s)
{
    char *out = s ? malloc(strlen(s) + 1) : NULL, *o = out;

    for (const char *p = s; out && *p;) {
        size_t n = strcspn(p, ",");
        const char *a = p, *e = p + n;
        while (a < e && (*a == ' ' || *a == '\t'))
            a++;
        while (e > a && (e[-1] == ' ' || e[-1] == '\t'))
            e--;
        if (e > a) {
            if (o > out)
                *o++ = ',';
            memcpy(o, a, (size_t)(e - a));
            o += e - a;
        }
        p += n + (p[n] == ',');
    }
    if (out && o == out) {
        free(out);
        return NULL;
    }
    if (out)
        *o = '\0';
    return out;
}

static bool in_list(const char *list, const char *name)
{
    size_t n = strlen(name);

    for (const char *p = list; p && *p;) {
        size_t len = strcspn(p, ",");
        if (len == n && memcmp(p, name, n) == 0)
            return true;
        p += len + (p[len] == ',');
    }
    return false;
}

/* --models-preset: each [NAME] section sets the --models-dir file of that
 * stem, or adds the model its `model =` names; its aliases name it too.
 * A name or alias that names two models is an error (llama-server's). */
static int add_presets(struct thaw_models *ms, int *cap)
{
    const struct thaw_config *cfg = ms->cfg;

    for (int i = 0; i < cfg->n_presets; i++) {
        const struct thaw_model_preset *p = &cfg->presets[i];
        struct thaw_model *m = NULL;
        int rc;

        for (int j = 0; j < ms->n && !m; j++)
            if (strcmp(ms->models[j].name, p->name) == 0)
                m = &ms->models[j];
        if (!m) {
            if ((rc = add_model(ms, cap, p->name, NULL, p->cfg->model_path, &m)) != 0)
                return rc;
        } else if (p->cfg->model_path && strcmp(p->cfg->model_path, m->path) != 0) {
            char *path = strdup(p->cfg->model_path); /* its section names another file */
            if (!path)
                return THAW_ENOMEM;
            free(m->path);
            m->path = path;
        }
        configure(ms, m, p->cfg);
        m->load_on_startup = p->load_on_startup;
        if (p->cfg->alias && !(m->aliases = alias_list(p->cfg->alias)))
            return THAW_ENOMEM;
    }
    for (int i = 0; i < ms->n; i++)
        for (int j = 0; j < ms->n; j++) {
            const struct thaw_model *a = &ms->models[i], *b = &ms->models[j];
            for (const char *p = a->aliases; p && *p;) {
                size_t len = strcspn(p, ",");
                char alias[256];
                snprintf(alias, sizeof alias, "%.*s", (int)len, p);
                if (strcmp(alias, b->name) == 0 || (i != j && in_list(b->aliases, alias))) {
                    LOG_ERR("--models-preset %s: alias '%s' of model %s also names model %s", cfg->models_preset,
                            alias, a->name, b->name);
                    return THAW_EINVAL;
                }
                p += len + (p[len] == ',');
            }
        }
    return 0;
}

/* load-on-startup models, loaded before the server listens (no more than
 * --models-max: llama-server refuses more too). */
static int load_on_startup(struct thaw_models *ms)
{
    int n = 0, rc = 0;

    for (int i = 0; i < ms->n; i++)
        n += ms->models[i].load_on_startup;
    if (ms->cfg->models_max > 0 && n > ms->cfg->models_max) {
        LOG_ERR("--models-preset %s: %d models load on startup, more than --models-max %d", ms->cfg->models_preset, n,
                ms->cfg->models_max);
        return THAW_EINVAL;
    }
    pthread_mutex_lock(&ms->mu);
    for (int i = 0; rc == 0 && i < ms->n; i++)
        if (ms->models[i].load_on_startup && ms->models[i].status == THAW_MODEL_UNLOADED)
            rc = load_locked(ms, &ms->models[i]);
    pthread_mutex_unlock(&ms->mu);
    return rc;
}

int thaw_models_new(const struct thaw_config *cfg, struct thaw_metrics *metrics, struct thaw_models **out)
{
    struct thaw_models *ms = calloc(1, sizeof *ms);
    int rc;

    if (!ms)
        return THAW_ENOMEM;
    ms->cfg = cfg;
    ms->metrics = metrics;
    if (cfg->models_dir || cfg->models_preset || cfg->sleep_idle_s > 0)
        /* a model may be unloaded: its memory must go back. glibc raises
         * its mmap threshold as large blocks are freed (up to 32 MiB), so
         * a prefill's and a store's large buffers end up in per-thread
         * arenas that malloc_trim cannot shrink (bench/models: 33 MiB
         * stayed after each unload); a fixed threshold keeps them mapped
         * apart and unmapped on free */
        mallopt(M_MMAP_THRESHOLD, 1 << 20);
    pthread_mutex_init(&ms->mu, NULL);
    pthread_cond_init(&ms->cond, NULL);
    if (cfg->models_dir || cfg->models_preset) {
        int cap = 0;
        ms->many = true;
        if ((cfg->models_dir && (rc = scan_dir(ms, cfg->models_dir, &cap)) != 0) ||
            (rc = add_presets(ms, &cap)) != 0)
            goto error;
        if (ms->n == 0) {
            LOG_ERR("--models-dir %s holds no .gguf file", cfg->models_dir);
            rc = THAW_ENOTFOUND;
            goto error;
        }
        qsort(ms->models, (size_t)ms->n, sizeof *ms->models, by_name);
        LOG_INF("%s%s%s%s: %d models, at most %d loaded at once%s", cfg->models_dir ? "--models-dir " : "",
                cfg->models_dir ? cfg->models_dir : "", cfg->models_dir && cfg->models_preset ? " and " : "",
                cfg->models_preset ? cfg->models_preset : "", ms->n, cfg->models_max,
                cfg->models_autoload ? ", loaded on demand" : "");
        if (cfg->kv_cache_dir && !cfg->embedding) {
            struct thaw_kvcache_params kp = {
                .disk_dir = cfg->kv_cache_dir,
                .disk_max_bytes = cfg->kv_cache_max_mib << 20,
                .disk_queue_bytes = cfg->kv_cache_queue_mib << 20,
                .ttl_s = (int64_t)cfg->kv_cache_ttl_s,
                .min_tokens = cfg->kv_cache_min_tokens,
            };
            if ((rc = thaw_kvcache_open_store(&kp, &ms->kv_store)) != 0)
                goto error;
        }
        if (cfg->models_max > 0 && cfg->cache_ram_mib > 0 && cfg->cache_ram_mib < (1ull << 40))
            LOG_INF("--cache-ram %llu MiB for all models: %llu MiB each (--models-max %d)",
                    (unsigned long long)cfg->cache_ram_mib,
                    (unsigned long long)(cfg->cache_ram_mib / (uint64_t)cfg->models_max), cfg->models_max);
        if ((rc = -pthread_create(&ms->loader, NULL, loader_main, ms)) != 0)
            goto error;
        ms->loader_started = true;
        if ((rc = load_on_startup(ms)) != 0)
            goto error;
    } else {
        struct thaw_model *m = ms->models = calloc(1, sizeof *m);
        if (!m) {
            rc = THAW_ENOMEM;
            goto error;
        }
        ms->n = 1;
        m->set = ms;
        m->metrics = metrics;
        m->cfg = *cfg;
        if ((rc = thaw_engine_new(&m->cfg, metrics, NULL, NULL, &m->engine)) != 0)
            goto error;
        m->status = THAW_MODEL_LOADED;
        m->active_ms = mono_ms();
        if (!(m->name = strdup(thaw_engine_model_name(m->engine))) || !(m->path = strdup(cfg->model_path))) {
            rc = THAW_ENOMEM;
            goto error;
        }
        if (cfg->sleep_idle_s > 0) { /* the loader puts it to sleep */
            if ((rc = -pthread_create(&ms->loader, NULL, loader_main, ms)) != 0)
                goto error;
            ms->loader_started = true;
        }
    }
    *out = ms;
    return 0;

error:
    thaw_models_free(ms);
    return rc;
}

void thaw_models_stop(struct thaw_models *ms)
{
    /* once stopped nothing starts a move, and a load in progress stops its
     * engine itself: the LOADED ones stay so, and are stopped without the
     * mutex (a stop waits for the engine's re-decoding; releases go on) */
    pthread_mutex_lock(&ms->mu);
    ms->stopped = true;
    pthread_cond_broadcast(&ms->cond);
    pthread_mutex_unlock(&ms->mu);
    for (int i = 0; i < ms->n; i++) {
        pthread_mutex_lock(&ms->mu);
        struct thaw_engine *e = ms->models[i].status == THAW_MODEL_LOADED ? ms->models[i].engine : NULL;
        pthread_mutex_unlock(&ms->mu);
        if (e)
            thaw_engine_stop(e);
    }
}

void thaw_models_free(struct thaw_models *ms)
{
    if (!ms)
        return;
    pthread_mutex_lock(&ms->mu);
    ms->stopped = true;
    /* a load or unload in progress finishes first: its thread owns the engine */
    for (;;) {
        bool moving = false;
        for (int i = 0; i < ms->n; i++)
            moving |= ms->models[i].status == THAW_MODEL_LOADING || ms->models[i].status == THAW_MODEL_UNLOADING;
        if (!moving)
            break;
        pthread_cond_wait(&ms->cond, &ms->mu);
    }
    pthread_cond_broadcast(&ms->cond);
    pthread_mutex_unlock(&ms->mu);
    if (ms->loader_started)
        pthread_join(ms->loader, NULL);
    for (int i = 0; i < ms->n; i++) {
        struct thaw_model *m = &ms->models[i];
        thaw_engine_free(m->engine);
        free(m->name);
        free(m->file);
        free(m->path);
        free(m->aliases);
        free(m->asleep_lines);
        if (ms->many)
            free(m->metrics);
    }
    free(ms->models);
    for (int i = 0; i < N_EVENTS; i++)
        free(ms->events[i]);
    thaw_disk_cache_close(ms->kv_store); /* after every engine's handle onto it */
    pthread_cond_destroy(&ms->cond);
    pthread_mutex_destroy(&ms->mu);
    free(ms);
    llama_backend_free();
}

bool thaw_models_many(const struct thaw_models *ms) { return ms->many; }

bool thaw_models_dynamic(const struct thaw_models *ms) { return ms->many || ms->cfg->sleep_idle_s > 0; }

/* ---- events (/models/sse) -------------------------------------------------------------- */

/* {"stages": [...], "current": stage, "value": v}: llama-server's load progress. */
static json_t *progress_json(const struct thaw_model *m)
{
    return json_pack("{s:[s,s*], s:s, s:f}", "stages", "text_model", m->cfg.mmproj_path ? "mmproj_model" : NULL,
                     "current", m->stage, "value", (double)m->progress);
}

/* Records m's status now as llama-server's "status_change" event (with a
 * load's progress; a failed load's exit_code 1) and wakes every reader.
 * With ms->mu held. */
static void event_locked(struct thaw_models *ms, const struct thaw_model *m)
{
    json_t *data = json_pack("{s:s}", "status", thaw_model_status_name(m->status));

    if (data && m->status == THAW_MODEL_LOADING && m->stage)
        json_object_set_new(data, "progress", progress_json(m));
    if (data && m->status == THAW_MODEL_UNLOADED)
        json_object_set_new(data, "exit_code", json_integer(m->load_rc != 0));
    json_t *ev = data ? json_pack("{s:s, s:s, s:o}", "model", m->name, "event", "status_change", "data", data) : NULL;
    char *text = ev ? json_dumps(ev, JSON_COMPACT) : NULL;
    json_decref(ev);
    if (!text) {
        LOG_WRN("model %s: out of memory for a /models/sse event", m->name);
        return;
    }
    free(ms->events[ms->n_events % N_EVENTS]);
    ms->events[ms->n_events++ % N_EVENTS] = text;
    for (struct thaw_models_sub *sub = ms->subs; sub; sub = sub->next)
        sub->wake(sub->ud);
}

uint64_t thaw_models_subscribe(struct thaw_models *ms, struct thaw_models_sub *sub)
{
    pthread_mutex_lock(&ms->mu);
    uint64_t now = ms->n_events;
    if (!sub->on) {
        sub->on = true;
        sub->prev = NULL;
        sub->next = ms->subs;
        if (sub->next)
            sub->next->prev = sub;
        ms->subs = sub;
    }
    pthread_mutex_unlock(&ms->mu);
    return now;
}

void thaw_models_unsubscribe(struct thaw_models *ms, struct thaw_models_sub *sub)
{
    pthread_mutex_lock(&ms->mu);
    if (sub->on) {
        if (sub->prev)
            sub->prev->next = sub->next;
        else
            ms->subs = sub->next;
        if (sub->next)
            sub->next->prev = sub->prev;
        sub->on = false;
        sub->prev = sub->next = NULL;
    }
    pthread_mutex_unlock(&ms->mu);
}

char *thaw_models_event_next(struct thaw_models *ms, uint64_t *cursor)
{
    char *text = NULL;

    pthread_mutex_lock(&ms->mu);
    if (*cursor + N_EVENTS < ms->n_events)
        *cursor = ms->n_events - N_EVENTS; /* fell behind: the oldest kept */
    if (*cursor < ms->n_events && (text = strdup(ms->events[*cursor % N_EVENTS])))
        ++*cursor;
    pthread_mutex_unlock(&ms->mu);
    return text;
}

/* The load's progress (params.h), from the loading thread. */
static void load_told(void *ud, const char *stage, float value)
{
    struct thaw_model *m = ud;
    struct thaw_models *ms = m->set;

    pthread_mutex_lock(&ms->mu);
    m->stage = stage;
    m->progress = value;
    event_locked(ms, m);
    pthread_mutex_unlock(&ms->mu);
}

/* ---- load/unload ---------------------------------------------------------------------- */

static struct thaw_model *find(struct thaw_models *ms, const char *name)
{
    if (!ms->many || ((!name || !*name) && ms->n == 1))
        return &ms->models[0]; /* -m: every request is its model's */
    if (!name)
        return NULL;
    for (int i = 0; i < ms->n; i++) {
        const struct thaw_model *m = &ms->models[i];
        if (strcmp(m->name, name) == 0 || (m->file && strcmp(m->file, name) == 0) || in_list(m->aliases, name))
            return &ms->models[i];
    }
    return NULL;
}

/* Waits on ms->cond until `deadline` (CLOCK_REALTIME); false when it passed. */
static bool wait_until(struct thaw_models *ms, const struct timespec *deadline)
{
    return pthread_cond_timedwait(&ms->cond, &ms->mu, deadline) != ETIMEDOUT;
}

static void deadline_in(int timeout_s, struct timespec *ts)
{
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_sec += timeout_s > 0 ? timeout_s : 3600;
}

/* Frees m's engine: its conversations stored (DESIGN §16). Called with
 * ms->mu held and m LOADED and not held; returns with it held again. */
static void unload_locked(struct thaw_models *ms, struct thaw_model *m, const char *why, bool asleep)
{
    struct thaw_engine *e = m->engine;
    char *lines = NULL;

    /* asleep: its lines as they are now, before the unload stores anything
     * (/props says is_sleeping from here on) */
    if (asleep && (lines = malloc(ASLEEP_LINES_CAP))) {
        size_t len = 0;
        lines[0] = '\0';
        thaw_engine_metrics(e, lines, ASLEEP_LINES_CAP, &len);
    }
    free(m->asleep_lines);
    m->asleep_lines = lines;
    m->status = THAW_MODEL_UNLOADING;
    m->load_rc = 0;
    event_locked(ms, m);
    pthread_mutex_unlock(&ms->mu);
    int64_t t0 = mono_ms();
    LOG_INF("model %s: unloading (%s): its conversations are stored first", m->name, why);
    thaw_engine_free(e); /* stops its thread, stores what its slots hold, writes the queue */
    /* its memory back to the system, not kept for the next model: the
     * pooled restore buffers (the next engine warms its own, kvcache.c)
     * and what the allocator keeps of the freed heap (KV and compute
     * buffers) */
    thaw_blob_pool_drain();
    malloc_trim(0);
    LOG_INF("model %s: unloaded in %lld ms", m->name, (long long)(mono_ms() - t0));
    /* what it holds now is gone: its gauges say so (its counters stay);
     * asleep, it reads as it was when it fell asleep (llama-server's: a
     * dashboard sees no drop to zero, /props says is_sleeping) */
    if (!asleep) {
        m->metrics->slots_total = 0;
        m->metrics->ram_budget_bytes = 0;
        atomic_store(&m->metrics->ram_bytes, 0);
        atomic_store(&m->metrics->ram_entries, 0);
        atomic_store(&m->metrics->slots_busy, 0);
        atomic_store(&m->metrics->requests_processing, 0);
        atomic_store(&m->metrics->queue_depth, 0);
    }
    pthread_mutex_lock(&ms->mu);
    m->engine = NULL;
    m->status = THAW_MODEL_UNLOADED;
    event_locked(ms, m);
    pthread_cond_broadcast(&ms->cond);
}

/* Loads m (UNLOADED, with room under --models-max). Called with ms->mu
 * held; returns with it held again: 0 or thaw_engine_new's error (logged,
 * and kept in m->load_rc for its watchers). */
static int load_locked(struct thaw_models *ms, struct thaw_model *m)
{
    struct thaw_engine *e = NULL;
    const struct thaw_load_progress progress = {load_told, m};
    int64_t t0 = mono_ms();
    int rc;

    m->status = THAW_MODEL_LOADING;
    free(m->asleep_lines); /* awake: its engine's own lines again */
    m->asleep_lines = NULL;
    m->stage = "text_model";
    m->progress = 0.0f;
    event_locked(ms, m);
    pthread_mutex_unlock(&ms->mu);
    LOG_INF("model %s: loading %s", m->name, m->path);
    rc = thaw_engine_new(&m->cfg, m->metrics, ms->kv_store, &progress, &e);
    pthread_mutex_lock(&ms->mu);
    if (rc == 0 && ms->stopped)
        thaw_engine_stop(e); /* stopped while it loaded: its requests get 503 */
    m->engine = e;
    m->status = rc == 0 ? THAW_MODEL_LOADED : THAW_MODEL_UNLOADED;
    m->active_ms = mono_ms();
    m->load_rc = rc;
    m->stage = NULL;
    event_locked(ms, m);
    pthread_cond_broadcast(&ms->cond);
    if (rc != 0)
        LOG_ERR("model %s: cannot load: %s", m->name, thaw_strerror(rc));
    else
        LOG_INF("model %s: loaded in %lld ms", m->name, (long long)(m->active_ms - t0));
    return rc;
}

/* The least recently used model loaded, not held and not waited for, or
 * NULL. A model loaded for waiting requests is theirs until they take it:
 * else two requests for two models under --models-max 1 would have the
 * loader unload each one before its request resumes. */
static struct thaw_model *lru_victim(struct thaw_models *ms)
{
    struct thaw_model *v = NULL;

    for (int i = 0; i < ms->n; i++) {
        struct thaw_model *m = &ms->models[i];
        if (m->status == THAW_MODEL_LOADED && m->refs == 0 && m->wanted == 0 && (!v || m->last_used < v->last_used))
            v = m;
    }
    return v;
}

static int n_resident(const struct thaw_models *ms)
{
    int n = 0;

    for (int i = 0; i < ms->n; i++)
        n += ms->models[i].status != THAW_MODEL_UNLOADED;
    return n;
}

int thaw_models_acquire(struct thaw_models *ms, const char *name, bool load, int timeout_s, struct thaw_model **out)
{
    struct thaw_model *m;
    struct timespec deadline;
    int rc = 0;

    deadline_in(timeout_s, &deadline);
    pthread_mutex_lock(&ms->mu);
    if (!(m = find(ms, name))) {
        rc = THAW_ENOTFOUND;
        goto out;
    }
    for (;;) {
        if (ms->stopped) {
            rc = THAW_ESHUTDOWN;
            break;
        }
        if (m->status == THAW_MODEL_LOADED) {
            m->refs++;
            m->last_used = ++ms->tick;
            m->active_ms = mono_ms();
            *out = m;
            break;
        }
        if (m->status == THAW_MODEL_UNLOADED && !load) {
            rc = THAW_EBUSY;
            break;
        }
        if (m->status == THAW_MODEL_UNLOADED && ms->cfg->models_max > 0 && n_resident(ms) >= ms->cfg->models_max) {
            struct thaw_model *v = lru_victim(ms);
            if (v) {
                unload_locked(ms, v, "--models-max", false);
                continue;
            }
            /* every loaded model is held: wait for a release */
        } else if (m->status == THAW_MODEL_UNLOADED) {
            if ((rc = load_locked(ms, m)) != 0)
                break;
            continue;
        }
        if (!wait_until(ms, &deadline)) {
            rc = THAW_ETIMEDOUT;
            break;
        }
    }
out:
    pthread_mutex_unlock(&ms->mu);
    return rc;
}

void thaw_models_hold(struct thaw_models *ms, struct thaw_model *m)
{
    pthread_mutex_lock(&ms->mu);
    m->refs++;
    pthread_mutex_unlock(&ms->mu);
}

void thaw_models_release(struct thaw_models *ms, struct thaw_model *m)
{
    pthread_mutex_lock(&ms->mu);
    m->active_ms = mono_ms();
    if (--m->refs == 0)
        pthread_cond_broadcast(&ms->cond);
    pthread_mutex_unlock(&ms->mu);
}

int thaw_models_unload(struct thaw_models *ms, const char *name, int timeout_s)
{
    struct thaw_model *m;
    struct timespec deadline;
    int rc = 0;

    deadline_in(timeout_s, &deadline);
    pthread_mutex_lock(&ms->mu);
    if (!ms->many || !name || !(m = find(ms, name))) {
        rc = ms->many ? THAW_ENOTFOUND : THAW_EINVAL;
        goto out;
    }
    while (!ms->stopped && (m->status == THAW_MODEL_LOADING || (m->status == THAW_MODEL_LOADED && m->refs > 0)))
        if (!wait_until(ms, &deadline)) {
            rc = THAW_ETIMEDOUT;
            goto out;
        }
    if (ms->stopped) {
        rc = THAW_ESHUTDOWN;
        goto out;
    }
    if (m->status != THAW_MODEL_LOADED) {
        rc = THAW_EINVAL;
        goto out;
    }
    unload_locked(ms, m, "POST /models/unload", false);
out:
    pthread_mutex_unlock(&ms->mu);
    return rc;
}

static void watch_drop(struct thaw_models *ms, struct thaw_models_watch *w)
{
    if (!w->want)
        return;
    w->want->wanted--;
    w->want = NULL;
    if (w->prev)
        w->prev->next = w->next;
    else
        ms->watches = w->next;
    if (w->next)
        w->next->prev = w->prev;
    w->prev = w->next = NULL;
}

int thaw_models_try(struct thaw_models *ms, const char *name, bool load, struct thaw_models_watch *w,
                    struct thaw_model **out)
{
    struct thaw_model *m;
    int rc = THAW_EPENDING;

    pthread_mutex_lock(&ms->mu);
    if (!(m = find(ms, name)))
        rc = THAW_ENOTFOUND;
    else if (ms->stopped)
        rc = THAW_ESHUTDOWN;
    else if (m->status == THAW_MODEL_LOADED) {
        m->refs++;
        m->last_used = ++ms->tick;
        m->active_ms = mono_ms();
        *out = m;
        rc = 0;
    } else if (w->want == m && m->status == THAW_MODEL_UNLOADED && m->load_rc != 0)
        rc = m->load_rc; /* the load it waited for failed */
    else if (w->want != m && m->status == THAW_MODEL_UNLOADED && !load)
        rc = THAW_EBUSY;
    if (rc != THAW_EPENDING) {
        watch_drop(ms, w);
    } else if (w->want != m) {
        watch_drop(ms, w);
        if (m->status == THAW_MODEL_UNLOADED)
            m->load_rc = 0; /* wanted anew: the loader tries again */
        m->wanted++;
        w->want = m;
        w->next = ms->watches;
        if (w->next)
            w->next->prev = w;
        ms->watches = w;
        pthread_cond_broadcast(&ms->cond); /* the loader */
    }
    pthread_mutex_unlock(&ms->mu);
    return rc;
}

void thaw_models_unwatch(struct thaw_models *ms, struct thaw_models_watch *w)
{
    pthread_mutex_lock(&ms->mu);
    watch_drop(ms, w);
    pthread_mutex_unlock(&ms->mu);
}

static void wake_watches(struct thaw_models *ms)
{
    for (struct thaw_models_watch *w = ms->watches; w; w = w->next)
        w->wake(w->ud);
}

/* --sleep-idle-seconds: a loaded model no one holds nor waits for, idle
 * that long, or NULL; *wait_ms gets the milliseconds until the next one
 * would be (-1: none). With ms->mu held. */
static struct thaw_model *sleepy(struct thaw_models *ms, int64_t *wait_ms)
{
    int64_t now = mono_ms(), idle_ms = (int64_t)ms->cfg->sleep_idle_s * 1000;

    *wait_ms = -1;
    if (ms->cfg->sleep_idle_s <= 0)
        return NULL;
    for (int i = 0; i < ms->n; i++) {
        struct thaw_model *m = &ms->models[i];
        if (m->status != THAW_MODEL_LOADED || m->refs > 0 || m->wanted > 0)
            continue; /* a release or a watch's end wakes the loader */
        int64_t left = m->active_ms + idle_ms - now;
        if (left <= 0)
            return m;
        if (*wait_ms < 0 || left < *wait_ms)
            *wait_ms = left;
    }
    return NULL;
}

/* The model the longest-waiting request wants loaded (requests are served
 * in arrival order: one waiting for room under --models-max holds back
 * those after it), or NULL. A request whose client left counts for
 * nothing (it drops its watch when next woken). With ms->mu held. */
static struct thaw_model *next_wanted(struct thaw_models *ms)
{
    struct thaw_models_watch *w = ms->watches;

    while (w && w->next)
        w = w->next; /* the oldest: each new watch goes first */
    for (; w; w = w->prev)
        if (w->want->status == THAW_MODEL_UNLOADED && w->want->load_rc == 0 && (!w->alive || w->alive(w->ud)))
            return w->want;
    return NULL;
}

/* The loader: loads the models watches want, the longest-waiting
 * request's first (unloading the least recently used one not held first
 * when --models-max is reached), and wakes every watch after each move
 * and once a second (each checks its own deadline and its client). */
static void *loader_main(void *arg)
{
    struct thaw_models *ms = arg;

    pthread_mutex_lock(&ms->mu);
    while (!ms->stopped) {
        struct thaw_model *m = NULL;
        int64_t sleep_wait_ms;
        struct thaw_model *idle = sleepy(ms, &sleep_wait_ms);
        if (idle) {
            char why[64];
            snprintf(why, sizeof why, "idle for %d s, --sleep-idle-seconds", ms->cfg->sleep_idle_s);
            unload_locked(ms, idle, why, true);
            wake_watches(ms);
            continue;
        }
        m = next_wanted(ms);
        if (m && ms->cfg->models_max > 0 && n_resident(ms) >= ms->cfg->models_max) {
            struct thaw_model *v = lru_victim(ms);
            if (v) {
                unload_locked(ms, v, "--models-max", false);
                wake_watches(ms);
                continue;
            }
            m = NULL; /* every loaded model is held: wait for a release */
        }
        if (m) {
            (void)load_locked(ms, m);
            wake_watches(ms);
            continue;
        }
        if (ms->watches) {
            struct timespec t;
            deadline_in(1, &t);
            (void)wait_until(ms, &t);
            wake_watches(ms);
        } else if (sleep_wait_ms >= 0) { /* until the next model may fall asleep */
            struct timespec t;
            clock_gettime(CLOCK_REALTIME, &t);
            sleep_wait_ms += 1; /* past it, not just short of it */
            t.tv_sec += sleep_wait_ms / 1000;
            t.tv_nsec += (sleep_wait_ms % 1000) * 1000000L;
            if (t.tv_nsec >= 1000000000L) {
                t.tv_sec++;
                t.tv_nsec -= 1000000000L;
            }
            (void)wait_until(ms, &t);
        } else {
            pthread_cond_wait(&ms->cond, &ms->mu);
        }
    }
    wake_watches(ms); /* they see the stop */
    pthread_mutex_unlock(&ms->mu);
    return NULL;
}

/* ---- queries ------------------------------------------------------------------------- */

struct thaw_engine *thaw_model_engine(const struct thaw_model *m) { return m->engine; }
const char *thaw_model_name(const struct thaw_model *m) { return m->name; }
const struct thaw_config *thaw_model_config(const struct thaw_model *m) { return &m->cfg; }
int thaw_models_count(const struct thaw_models *ms) { return ms->n; }

void thaw_models_get(struct thaw_models *ms, int i, struct thaw_model_info *out)
{
    const struct thaw_model *m = &ms->models[i];

    pthread_mutex_lock(&ms->mu);
    *out = (struct thaw_model_info){
        .name = m->name,
        .aliases = m->aliases,
        .path = m->path,
        .status = m->status,
        .stage = m->status == THAW_MODEL_LOADING ? m->stage : NULL,
        .progress = m->progress,
        .vision = m->cfg.mmproj_path != NULL,
        .failed = m->status == THAW_MODEL_UNLOADED && m->load_rc != 0,
        .waiting = m->wanted,
    };
    pthread_mutex_unlock(&ms->mu);
}

int thaw_models_peek(struct thaw_models *ms, const char *name, struct thaw_model **out)
{
    struct thaw_model *m;
    int rc = 0;

    pthread_mutex_lock(&ms->mu);
    if (!(m = find(ms, name)))
        rc = THAW_ENOTFOUND;
    else if (m->status != THAW_MODEL_LOADED)
        rc = THAW_EBUSY;
    else {
        m->refs++;
        *out = m;
    }
    pthread_mutex_unlock(&ms->mu);
    return rc;
}

void thaw_models_unpeek(struct thaw_models *ms, struct thaw_model *m)
{
    pthread_mutex_lock(&ms->mu);
    if (--m->refs == 0)
        pthread_cond_broadcast(&ms->cond);
    pthread_mutex_unlock(&ms->mu);
}

bool thaw_models_asleep_metrics(struct thaw_models *ms, const char *name, char *buf, size_t cap, size_t *len)
{
    bool found = false;

    pthread_mutex_lock(&ms->mu);
    struct thaw_model *named = name ? find(ms, name) : NULL;
    for (int i = 0; i < ms->n && !found; i++) {
        struct thaw_model *m = &ms->models[i];
        if (m->asleep_lines && (m->status == THAW_MODEL_UNLOADING || m->status == THAW_MODEL_UNLOADED) &&
            (!name || m == named)) {
            size_t n = strlen(m->asleep_lines);
            if (*len < cap) {
                n = n < cap - *len - 1 ? n : cap - *len - 1;
                memcpy(buf + *len, m->asleep_lines, n);
                *len += n;
                buf[*len] = '\0';
            }
            found = true;
        }
    }
    pthread_mutex_unlock(&ms->mu);
    return found;
}

struct thaw_metrics *thaw_models_metrics(struct thaw_models *ms, const char *name)
{
    pthread_mutex_lock(&ms->mu);
    struct thaw_model *m = find(ms, name);
    pthread_mutex_unlock(&ms->mu);
    return m ? m->metrics : NULL;
}

void thaw_models_metrics_sum(struct thaw_models *ms, struct thaw_metrics *out)
{
    for (int i = 0; ms->many && i < ms->n; i++)
        thaw_metrics_add(out, ms->models[i].metrics);
}

void thaw_models_names(const struct thaw_models *ms, char *buf, size_t cap)
{
    size_t len = 0;

    if (cap)
        buf[0] = '\0';
    for (int i = 0; i < ms->n && len < cap; i++) {
        int w = snprintf(buf + len, cap - len, "%s%s", i ? ", " : "", ms->models[i].name);
        if (w < 0 || (size_t)w >= cap - len) {
            if (cap > 4)
                memcpy(buf + cap - 4, "...", 4);
            break;
        }
        len += (size_t)w;
    }
}
