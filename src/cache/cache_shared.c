/* cache_shared.c — the shared tier on an S3-compatible store (cache_shared.h).
 *
 * Objects' names and their sealed envelope are shared_seal.c's.
 *
 * Map:
 *   ---- names ----               an object's name under the bucket's prefix
 *   ---- breaker ----             failures in a row stop trying for a while
 *   ---- fetch ----               entry, then its missing blocks; or a run of
 *                                 a prompt's blocks; installed locally
 *   ---- upload ----              after the local commit, blocks then entry
 *   ---- threads ----             the uploader, the fetch threads, their queues
 *   ---- open / close / metrics ----
 */
#include "cache/cache_shared.h"

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "base/metrics.h"
#include "base/testhooks.h"
#include "base/workers.h"
#include "cache/blocks.h"
#include "cache/keys.h"
#include "cache/manifest.h"
#include "cache/s3.h"
#include "cache/shared_seal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define N_FETCHERS 2
#define FETCH_PARALLEL 4 /* GETs in flight per fetch: a store's round trip, not its bandwidth, bounds small blocks */
#define FETCH_WINDOW 8   /* blocks fetched ahead of the first not yet installed (memory bound) */
_Static_assert(THAW_SHARED_WORKERS == N_FETCHERS * (FETCH_PARALLEL - 1), "the pool's share (cache_shared.h)");
#define FETCH_QUEUE 32
#define TAKEN_RING 64
#define SEEN_CAP 65536u            /* block ids the uploader knows the store holds */
#define UPLOAD_TIMEOUT_MIN_MS 10000 /* an upload is no request's wait: it may take longer */

/* The latest TAKEN_RING keys noted (older ones age out); under mu. */
struct key_ring {
    uint8_t keys[TAKEN_RING][THAW_KEY_BYTES];
    uint32_t next;
};

static void ring_add(struct key_ring *r, const uint8_t key[THAW_KEY_BYTES])
{
    memcpy(r->keys[r->next++ % TAKEN_RING], key, THAW_KEY_BYTES);
}

/* Whether key was noted; `forget` clears it. */
static bool ring_find(struct key_ring *r, const uint8_t key[THAW_KEY_BYTES], bool forget)
{
    for (int i = 0; i < TAKEN_RING; i++)
        if (memcmp(r->keys[i], key, THAW_KEY_BYTES) == 0) {
            if (forget)
                memset(r->keys[i], 0, THAW_KEY_BYTES);
            return true;
        }
    return false;
}

struct upload_job {
    uint8_t key[THAW_KEY_BYTES], ns[THAW_KEY_BYTES];
};

struct fetch_job {
    uint8_t key[THAW_KEY_BYTES], ns[THAW_KEY_BYTES];
    bool has_key;
    const thaw_token *prompt;
    int n_prompt;
    void (*done)(void *ud);
    void *ud;
};

struct thaw_shared {
    struct thaw_shared_names nm;
    uint8_t identity[THAW_KEY_BYTES];
    char prefix[256]; /* "" or "PREFIX/" (thaw_s3_location's) */
    char *bucket, *endpoint, *access_key, *secret_key, *region;
    struct thaw_disk_cache *disk;
    struct thaw_workers *workers; /* borrowed: a fetch's parallel GETs */
    long timeout_ms, retry_s;
    uint32_t block_tokens;
    bool prefix_fetch;

    pthread_mutex_t mu;
    pthread_cond_t ucv, fcv, idle;
    struct upload_job *uq;
    uint32_t ucap, uhead, ucount;
    bool uploading;
    struct fetch_job fq[FETCH_QUEUE];
    uint32_t fhead, fcount;
    bool stopping, stopped; /* the uploader's */
    bool fstopping, fstopped; /* the fetch threads' */
    pthread_t uploader, fetchers[N_FETCHERS];
    bool uploader_up;
    int n_fetchers_up;
    struct thaw_s3 *ucli, *fcli[N_FETCHERS][FETCH_PARALLEL];

    /* breaker, under mu */
    int fails;
    bool open, probing;
    int64_t open_until_us;

    struct key_ring taken;    /* conversations installed from the store, not yet restored */
    struct key_ring expected; /* stores this replica is about to write itself */

    /* uploader thread only */
    uint8_t (*seen)[THAW_KEY_BYTES];
    uint32_t seen_n;

    atomic_uint_fast64_t hits, misses, errors, rejected, fetch_bytes, fetch_us, blocks_fetched;
    atomic_uint_fast64_t uploads, upload_exists, upload_bytes, uploads_dropped, upload_errors, breaker_opens;
};

/* ---- names ----------------------------------------------------------------- */

static void object_name(const struct thaw_shared *s, const uint8_t ns[THAW_KEY_BYTES], char kind,
                        const uint8_t id[THAW_KEY_BYTES], char *rel, size_t n_rel, char *full, size_t n_full)
{
    thaw_shared_name(&s->nm, ns, kind, id, rel, n_rel);
    snprintf(full, n_full, "%s%s", s->prefix, rel);
}

/* ---- breaker
 * ------------------------------------------------------------------- */

/* Whether a request may go to the store now. While open, one caller after
 * the pause becomes the probe; the others keep away. */
static bool breaker_allows(struct thaw_shared *s)
{
    bool ok = true;

    pthread_mutex_lock(&s->mu);
    if (s->open) {
        ok = !s->probing && thaw_now_us() >= s->open_until_us;
        if (ok)
            s->probing = true;
    }
    pthread_mutex_unlock(&s->mu);
    return ok;
}

/* Is the breaker open right now (no probe due)? Read-only. */
static bool breaker_is_open(struct thaw_shared *s)
{
    pthread_mutex_lock(&s->mu);
    bool open = s->open && (s->probing || thaw_now_us() < s->open_until_us);
    pthread_mutex_unlock(&s->mu);
    return open;
}

static bool store_failure(int rc)
{
    return rc == THAW_ETIMEDOUT || rc == THAW_ESTORE;
}

static void breaker_report(struct thaw_shared *s, int rc, const char *what)
{
    pthread_mutex_lock(&s->mu);
    if (store_failure(rc)) {
        s->fails++;
        if (s->open) {
            s->probing = false;
            s->open_until_us = thaw_now_us() + s->retry_s * 1000000;
            LOG_DBG("shared tier: still failing (%s): next try in %lds", what, s->retry_s);
        } else if (s->fails >= THAW_SHARED_BREAKER_FAILS) {
            s->open = true;
            s->probing = false;
            s->open_until_us = thaw_now_us() + s->retry_s * 1000000;
            atomic_fetch_add(&s->breaker_opens, 1);
            LOG_WRN("shared tier: %d failures in a row (last: %s): not trying the store for %lds; "
                    "local tiers and prefill serve meanwhile",
                    s->fails, what, s->retry_s);
        }
    } else {
        if (s->open)
            LOG_INF("shared tier: the store answers again: fetches and uploads resume");
        s->open = false;
        s->probing = false;
        s->fails = 0;
    }
    pthread_mutex_unlock(&s->mu);
}

/* ---- fetch
 * --------------------------------------------------------------------- */

static long remaining_ms(int64_t deadline_us)
{
    int64_t left = (deadline_us - thaw_now_us()) / 1000;
    return left > 0 ? (long)left : 0;
}

/* GETs one object within the deadline and opens it into parts (blobs).
 * Counts rejections. Returns 0, THAW_ENOTFOUND, THAW_ETIMEDOUT, THAW_ESTORE,
 * THAW_ECORRUPT, THAW_ETOOBIG, THAW_ENOMEM. */
static int get_object(struct thaw_shared *s, struct thaw_s3 *cli, const uint8_t ns[THAW_KEY_BYTES], char kind,
                      const uint8_t id[THAW_KEY_BYTES], int64_t deadline_us, uint32_t *n_tokens,
                      struct thaw_part_blob parts[THAW_PART_COUNT])
{
    char rel[160], full[448];
    void *obj;
    size_t n_obj;
    long left = remaining_ms(deadline_us);

    if (left <= 0)
        return THAW_ETIMEDOUT;
    object_name(s, ns, kind, id, rel, sizeof rel, full, sizeof full);
    thaw_s3_set_timeout(cli, left);
    int rc = thaw_s3_get(cli, full, THAW_SHARED_MAX_OBJECT, &obj, &n_obj);
    if (rc != 0) {
        if (rc != THAW_ENOTFOUND)
            LOG_DBG("shared tier: GET %s: %s", full, thaw_s3_last_error(cli));
        return rc;
    }
    atomic_fetch_add(&s->fetch_bytes, n_obj);
    rc = thaw_shared_open_object(&s->nm, rel, ns, s->identity, obj, n_obj, n_tokens, parts);
    free(obj);
    if (rc == THAW_ECORRUPT) {
        atomic_fetch_add(&s->rejected, 1);
        LOG_WRN("shared tier: object %s rejected: it does not open with this cluster's secret for this name, tenant "
                "and model (tampered, truncated, copied or foreign): serving by prefill",
                full);
    }
    return rc;
}

/* Hands fetched parts to the local disk writer (the references move). */
static int install(struct thaw_shared *s, const uint8_t key[THAW_KEY_BYTES], uint32_t n_tokens,
                   struct thaw_part_blob parts[THAW_PART_COUNT], int64_t deadline_us)
{
    int rc;

    /* the network may outrun the disk: a full writer queue is waited for,
     * within the deadline */
    while ((rc = thaw_disk_cache_submit(s->disk, key, n_tokens, parts, NULL, 0)) == THAW_EBUSY &&
           thaw_now_us() + 2000 < deadline_us) {
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    if (rc != 0)
        for (int p = 0; p < THAW_PART_COUNT; p++)
            thaw_blob_unref(parts[p].data);
    return rc;
}

/* A run of blocks fetched FETCH_PARALLEL at a time and installed in their
 * order: the local writer gets block k only after blocks 0..k-1, so a run
 * cut short (a 404, the deadline) still leaves a usable prefix. */
struct run {
    struct thaw_shared *s;
    const uint8_t *ns;
    const uint8_t *const *ids;
    int n;
    int64_t deadline_us;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int next_take, next_install, stop_at, rc;
    struct run_slot {
        int state; /* 0 not yet, 1 fetched, 2 failed */
        uint32_t n_tokens;
        struct thaw_part_blob parts[THAW_PART_COUNT];
    } *res;
};

struct run_worker {
    struct run *r;
    struct thaw_s3 *cli;
};

static void run_main(void *arg)
{
    struct run_worker *w = arg;
    struct run *r = w->r;

    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (r->next_take < r->stop_at && r->next_take >= r->next_install + FETCH_WINDOW)
            pthread_cond_wait(&r->cv, &r->mu);
        if (r->next_take >= r->stop_at)
            break;
        int k = r->next_take++;
        pthread_mutex_unlock(&r->mu);
        struct run_slot got = {1, 0, {{NULL, 0}}};
        int rc = get_object(r->s, w->cli, r->ns, 'b', r->ids[k], r->deadline_us, &got.n_tokens, got.parts);
        pthread_mutex_lock(&r->mu);
        if (rc != 0) {
            r->res[k].state = 2;
            if (k < r->stop_at) {
                r->stop_at = k;
                r->rc = rc;
            }
        } else {
            r->res[k] = got;
        }
        while (r->next_install < r->stop_at && r->res[r->next_install].state == 1) {
            struct run_slot *o = &r->res[r->next_install];
            if ((rc = install(r->s, r->ids[r->next_install], o->n_tokens, o->parts, r->deadline_us)) != 0) {
                r->stop_at = r->next_install;
                r->rc = rc;
                break;
            }
            memset(o->parts, 0, sizeof o->parts); /* the writer's now */
            r->next_install++;
        }
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
}

/* Fetches and installs ids[0..n) in order. Returns 0 (all installed) or
 * the error at the first one that failed; *installed gets how many. */
static int fetch_run(struct thaw_shared *s, struct thaw_s3 *const clis[FETCH_PARALLEL],
                     const uint8_t ns[THAW_KEY_BYTES], const uint8_t *const *ids, int n, int64_t deadline_us,
                     int *installed)
{
    struct run r = {s, ns, ids, n, deadline_us, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, n, 0,
                    NULL};
    struct run_worker w[FETCH_PARALLEL];
    struct thaw_job jobs[FETCH_PARALLEL];
    int n_jobs = 0;

    *installed = 0;
    if (n <= 0)
        return 0;
    if (!(r.res = calloc((size_t)n, sizeof *r.res)))
        return THAW_ENOMEM;
    for (int i = 0; i < FETCH_PARALLEL; i++)
        w[i] = (struct run_worker){&r, clis[i]};
    /* a helper no pool thread has started by the time this thread is done
     * runs at its wait, finds nothing left and returns */
    for (int i = 1; i < FETCH_PARALLEL && i < n; i++, n_jobs++)
        (void)thaw_workers_submit(s->workers, &jobs[n_jobs], run_main, &w[i]);
    run_main(&w[0]); /* this thread is a worker too */
    for (int i = 0; i < n_jobs; i++)
        thaw_workers_wait(s->workers, &jobs[i]);
    for (int k = r.next_install; k < n; k++) /* fetched past a failure: not used */
        for (int p = 0; p < THAW_PART_COUNT; p++)
            thaw_blob_unref(r.res[k].parts[p].data);
    free(r.res);
    pthread_cond_destroy(&r.cv);
    pthread_mutex_destroy(&r.mu);
    *installed = r.next_install;
    atomic_fetch_add(&s->blocks_fetched, (uint64_t)r.next_install);
    return r.next_install == n ? 0 : r.rc;
}

/* The blocks a fetched entry names that the local tier lacks. */
static int fetch_blocks_of(struct thaw_shared *s, struct thaw_s3 *const clis[FETCH_PARALLEL],
                           const uint8_t ns[THAW_KEY_BYTES], const struct thaw_part_blob *kv, int64_t deadline_us)
{
    const uint8_t *ids;
    uint32_t n_ids;
    int rc, n = 0, installed;

    if (!thaw_manifest_is(kv->data, kv->size))
        return 0; /* a whole state: nothing else to fetch */
    if ((rc = thaw_manifest_ids(kv->data, kv->size, &ids, &n_ids)) != 0) {
        atomic_fetch_add(&s->rejected, 1);
        return THAW_ECORRUPT;
    }
    const uint8_t **missing = malloc((n_ids ? n_ids : 1) * sizeof *missing);
    if (!missing)
        return THAW_ENOMEM;
    for (uint32_t k = 0; k < n_ids; k++)
        if (!thaw_disk_cache_has(s->disk, ids + (size_t)k * THAW_KEY_BYTES))
            missing[n++] = ids + (size_t)k * THAW_KEY_BYTES;
    rc = fetch_run(s, clis, ns, missing, n, deadline_us, &installed);
    free(missing);
    /* a block the store lacks (expired): the blocks before it are installed,
     * and the caller's prefix lookup gets what they are worth */
    return rc;
}

static void mark_taken(struct thaw_shared *s, const uint8_t key[THAW_KEY_BYTES])
{
    pthread_mutex_lock(&s->mu);
    ring_add(&s->taken, key);
    pthread_mutex_unlock(&s->mu);
}

void thaw_shared_expect(struct thaw_shared *s, const uint8_t key[THAW_KEY_BYTES])
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    ring_add(&s->expected, key);
    pthread_mutex_unlock(&s->mu);
}

static bool is_expected(struct thaw_shared *s, const uint8_t key[THAW_KEY_BYTES])
{
    pthread_mutex_lock(&s->mu);
    bool found = ring_find(&s->expected, key, false);
    pthread_mutex_unlock(&s->mu);
    return found;
}

bool thaw_shared_taken(struct thaw_shared *s, const uint8_t key[THAW_KEY_BYTES])
{
    if (!s)
        return false;
    pthread_mutex_lock(&s->mu);
    bool found = ring_find(&s->taken, key, true);
    pthread_mutex_unlock(&s->mu);
    return found;
}

/* The conversation's entry: its blocks first, then the entry, so the
 * local writer commits them in that order too. */
static int fetch_entry(struct thaw_shared *s, struct thaw_s3 *const clis[FETCH_PARALLEL],
                       const uint8_t key[THAW_KEY_BYTES], const uint8_t ns[THAW_KEY_BYTES], int64_t deadline_us)
{
    struct thaw_part_blob parts[THAW_PART_COUNT];
    uint32_t n_tokens;
    int rc = get_object(s, clis[0], ns, 'm', key, deadline_us, &n_tokens, parts);

    if (rc != 0)
        return rc;
    /* its blocks, present or fetched, held until the entry is queued: the
     * local tier collects blocks no entry names (cache_disk.h) */
    const uint8_t *ids = NULL;
    uint32_t n_ids = 0;
    void *held = NULL;
    if (thaw_manifest_is(parts[THAW_PART_KV].data, parts[THAW_PART_KV].size) &&
        thaw_manifest_ids(parts[THAW_PART_KV].data, parts[THAW_PART_KV].size, &ids, &n_ids) == 0) {
        held = thaw_blob_ref(parts[THAW_PART_KV].data);
        thaw_disk_cache_hold(s->disk, ids, n_ids);
    }
    if ((rc = fetch_blocks_of(s, clis, ns, &parts[THAW_PART_KV], deadline_us)) != 0) {
        for (int p = 0; p < THAW_PART_COUNT; p++)
            thaw_blob_unref(parts[p].data);
    } else {
        mark_taken(s, key); /* before the writer can commit it and the engine look */
        if ((rc = install(s, key, n_tokens, parts, deadline_us)) != 0)
            thaw_shared_taken(s, key);
    }
    if (held) {
        thaw_disk_cache_unhold(s->disk, ids, n_ids);
        thaw_blob_unref(held);
    }
    return rc;
}

/* The ids of the prompt's whole blocks (at least one token left to
 * decode), malloc'd into *ids; returns how many (0: none, or ENOMEM). */
static int prefix_ids(struct thaw_shared *s, const uint8_t ns[THAW_KEY_BYTES], const thaw_token *prompt, int n_prompt,
                      uint8_t (**ids)[THAW_KEY_BYTES])
{
    uint8_t binding[THAW_KEY_BYTES];
    int nb = s->block_tokens && prompt ? (n_prompt - 1) / (int)s->block_tokens : 0;

    *ids = NULL;
    if (nb <= 0 || !(*ids = malloc((size_t)nb * THAW_KEY_BYTES)))
        return 0;
    thaw_keys_block_binding(s->identity, ns, binding);
    thaw_blocks_ids(binding, s->block_tokens, prompt, nb * (int)s->block_tokens, *ids);
    return nb;
}

/* The prompt's blocks (prefix fetch on) into *ids, and in *from the first
 * the local tier lacks. Returns how many (0: none to fetch). */
static int plan_prefix(struct thaw_shared *s, const uint8_t ns[THAW_KEY_BYTES], const thaw_token *prompt,
                       int n_prompt, uint8_t (**ids)[THAW_KEY_BYTES], int *from)
{
    int nb = s->prefix_fetch ? prefix_ids(s, ns, prompt, n_prompt, ids) : 0;

    *from = 0;
    while (*from < nb && thaw_disk_cache_has(s->disk, (*ids)[*from]))
        (*from)++;
    return nb;
}

/* A prompt without an entry: its run of whole blocks from block `from`
 * (the first the local tier lacks), as far as the store has them. */
static int fetch_prefix(struct thaw_shared *s, struct thaw_s3 *const clis[FETCH_PARALLEL],
                        const uint8_t ns[THAW_KEY_BYTES], uint8_t (*ids)[THAW_KEY_BYTES], int nb, int from,
                        int64_t deadline_us)
{
    const uint8_t **missing = malloc((size_t)(nb - from) * sizeof *missing);
    int n = 0, installed, rc;

    if (!missing)
        return THAW_ENOMEM;
    for (int k = from; k < nb; k++)
        if (!thaw_disk_cache_has(s->disk, ids[k]))
            missing[n++] = ids[k];
    rc = fetch_run(s, clis, ns, missing, n, deadline_us, &installed);
    free(missing);
    if (installed > 0 && rc == THAW_ENOTFOUND)
        return 0; /* the run ends where the store's does */
    return rc;
}

static int fetch_with(struct thaw_shared *s, struct thaw_s3 *const clis[FETCH_PARALLEL], const uint8_t *key,
                      const uint8_t ns[THAW_KEY_BYTES], const thaw_token *prompt, int n_prompt)
{
    int64_t t0 = thaw_now_us(), deadline = t0 + (int64_t)s->timeout_ms * 1000;
    uint8_t(*ids)[THAW_KEY_BYTES] = NULL;
    int rc = THAW_ENOTFOUND, nb = 0, from = 0;
    char what[64] = "";

    if (key && thaw_disk_cache_has(s->disk, key))
        return THAW_ENOTFOUND;
    if (!key) {
        nb = plan_prefix(s, ns, prompt, n_prompt, &ids, &from);
        if (from >= nb) {
            free(ids);
            return THAW_ENOTFOUND; /* a first turn whose blocks are all here: nothing to ask the store */
        }
    }
    if (!breaker_allows(s)) {
        free(ids);
        return THAW_EBUSY;
    }
    if (key && (rc = fetch_entry(s, clis, key, ns, deadline)) == THAW_ENOTFOUND)
        nb = plan_prefix(s, ns, prompt, n_prompt, &ids, &from); /* no entry: the prompt's blocks, then */
    if (rc == THAW_ENOTFOUND && from < nb)
        rc = fetch_prefix(s, clis, ns, ids, nb, from, deadline);
    free(ids);
    int64_t us = thaw_now_us() - t0;
    atomic_fetch_add(&s->fetch_us, (uint64_t)us);
    if (rc == 0) {
        atomic_fetch_add(&s->hits, 1);
        LOG_DBG("shared tier: fetched in %.1f ms", (double)us / 1000.0);
    } else if (rc == THAW_ENOTFOUND) {
        atomic_fetch_add(&s->misses, 1);
    } else if (rc != THAW_ECORRUPT) {
        atomic_fetch_add(&s->errors, 1);
        snprintf(what, sizeof what, "%s", thaw_strerror(rc));
        LOG_INF("shared tier: fetch failed after %.0f ms (%s%s%s): serving by prefill", (double)us / 1000.0,
                thaw_strerror(rc), *thaw_s3_last_error(clis[0]) ? ": " : "", thaw_s3_last_error(clis[0]));
    }
    breaker_report(s, rc, what);
    return rc;
}

/* ---- upload
 * -------------------------------------------------------------------- */

static bool seen_has(struct thaw_shared *s, const uint8_t id[THAW_KEY_BYTES], bool add)
{
    uint32_t h;

    memcpy(&h, id, sizeof h);
    for (uint32_t i = 0; i < SEEN_CAP; i++) {
        uint8_t *slot = s->seen[(h + i) % SEEN_CAP];
        bool empty = true;
        for (int b = 0; b < THAW_KEY_BYTES && empty; b++)
            empty = slot[b] == 0;
        if (empty) {
            if (add) {
                if (s->seen_n >= SEEN_CAP / 4 * 3) { /* full enough: forget (costs a 412 each) */
                    memset(s->seen, 0, (size_t)SEEN_CAP * THAW_KEY_BYTES);
                    s->seen_n = 0;
                    return seen_has(s, id, true);
                }
                memcpy(slot, id, THAW_KEY_BYTES);
                s->seen_n++;
            }
            return false;
        }
        if (memcmp(slot, id, THAW_KEY_BYTES) == 0)
            return true;
    }
    return false;
}

/* Seals one local entry's parts and PUTs it create-only. */
static int put_entry(struct thaw_shared *s, const uint8_t ns[THAW_KEY_BYTES], char kind,
                     const uint8_t id[THAW_KEY_BYTES], uint32_t n_tokens,
                     const struct thaw_part_blob parts[THAW_PART_COUNT])
{
    char rel[160], full[448];
    void *obj;
    size_t n_obj;
    int rc;

    object_name(s, ns, kind, id, rel, sizeof rel, full, sizeof full);
    /* A block is megabytes and most are shared (another conversation's, or
     * ours before a restart emptied `seen`): ask before sending it. */
    if (kind == 'b') {
        if ((rc = thaw_s3_head(s->ucli, full)) == 0) {
            atomic_fetch_add(&s->upload_exists, 1);
            return 0;
        }
        if (rc != THAW_ENOTFOUND)
            return rc;
    }
    if ((rc = thaw_shared_seal(&s->nm, rel, ns, s->identity, n_tokens, parts, &obj, &n_obj)) != 0)
        return rc;
    rc = thaw_s3_put(s->ucli, full, obj, n_obj, 1);
    free(obj);
    if (rc == 0) {
        atomic_fetch_add(&s->uploads, 1);
        atomic_fetch_add(&s->upload_bytes, n_obj);
    } else if (rc == THAW_EEXIST) {
        atomic_fetch_add(&s->upload_exists, 1); /* another replica wrote it first: as good */
        rc = 0;
    } else {
        LOG_DBG("shared tier: PUT %s: %s", full, thaw_s3_last_error(s->ucli));
    }
    return rc;
}

static void entry_parts(const struct thaw_disk_entry *de, struct thaw_part_blob parts[THAW_PART_COUNT])
{
    for (int p = 0; p < THAW_PART_COUNT; p++)
        parts[p].data = (void *)thaw_disk_entry_part(de, (enum thaw_part)p, &parts[p].size);
}

/* THAW_HOOK_SHARED_UPLOAD_DELAY_MS (testhooks.h): the uploader sleeps that
 * long before the entry's PUT (after its blocks): a window to kill the
 * replica in. */
static void test_delay(void)
{
    long ms = thaw_test_hook(THAW_HOOK_SHARED_UPLOAD_DELAY_MS);

    if (ms > 0) {
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
}

static int upload_one(struct thaw_shared *s, const struct upload_job *j)
{
    struct thaw_part_blob parts[THAW_PART_COUNT];
    struct thaw_disk_entry *de = NULL;
    const uint8_t *ids = NULL;
    uint32_t n_ids = 0;
    int rc;

    /* after the local commit: what is uploaded was written and reads back */
    for (int i = 0; thaw_disk_cache_queued(s->disk, j->key); i++) {
        if (i > 60000 || s->stopping)
            return THAW_ESHUTDOWN;
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    if ((rc = thaw_disk_cache_lookup(s->disk, j->key, &de)) != 0)
        return rc; /* the store failed, or was evicted already: nothing to share */
    entry_parts(de, parts);
    thaw_s3_set_timeout(s->ucli, s->timeout_ms > UPLOAD_TIMEOUT_MIN_MS ? s->timeout_ms : UPLOAD_TIMEOUT_MIN_MS);
    if (thaw_manifest_is(parts[THAW_PART_KV].data, parts[THAW_PART_KV].size) &&
        (rc = thaw_manifest_ids(parts[THAW_PART_KV].data, parts[THAW_PART_KV].size, &ids, &n_ids)) != 0)
        goto out;
    for (uint32_t k = 0; k < n_ids && !s->stopping; k++) {
        const uint8_t *id = ids + (size_t)k * THAW_KEY_BYTES;
        struct thaw_disk_entry *be;
        struct thaw_part_blob bp[THAW_PART_COUNT];
        if (seen_has(s, id, false))
            continue;
        if ((rc = thaw_disk_cache_lookup(s->disk, id, &be)) != 0)
            goto out; /* evicted since: the entry would name a block nobody can fetch */
        entry_parts(be, bp);
        rc = put_entry(s, j->ns, 'b', id, thaw_disk_entry_n_tokens(be), bp);
        thaw_disk_entry_release(be);
        if (rc != 0)
            goto out;
        seen_has(s, id, true);
    }
    if (s->stopping) {
        rc = THAW_ESHUTDOWN;
        goto out;
    }
    test_delay();
    rc = put_entry(s, j->ns, 'm', j->key, thaw_disk_entry_n_tokens(de), parts);
out:
    thaw_disk_entry_release(de);
    return rc;
}

/* ---- threads
 * ------------------------------------------------------------------- */

static void *uploader_main(void *arg)
{
    struct thaw_shared *s = arg;

    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->ucount == 0 && !s->stopping)
            pthread_cond_wait(&s->ucv, &s->mu);
        if (s->stopping)
            break;
        struct upload_job j = s->uq[s->uhead];
        s->uhead = (s->uhead + 1) % s->ucap;
        s->ucount--;
        s->uploading = true;
        pthread_mutex_unlock(&s->mu);

        char hex[17];
        thaw_keys_short(j.key, hex);
        if (!breaker_allows(s)) {
            atomic_fetch_add(&s->uploads_dropped, 1);
            LOG_DBG("shared tier: upload of %s dropped: the store is failing", hex);
        } else {
            int64_t t0 = thaw_now_us();
            int rc = upload_one(s, &j);
            if (rc == 0)
                LOG_DBG("shared tier: %s uploaded in %.1f ms", hex, (double)(thaw_now_us() - t0) / 1000.0);
            else if (store_failure(rc))
                atomic_fetch_add(&s->upload_errors, 1);
            if (rc != 0 && rc != THAW_ESHUTDOWN)
                LOG_INF("shared tier: upload of %s failed (%s%s%s): other replicas will prefill it", hex,
                        thaw_strerror(rc), store_failure(rc) ? ": " : "",
                        store_failure(rc) ? thaw_s3_last_error(s->ucli) : "");
            breaker_report(s, rc, thaw_strerror(rc));
        }

        pthread_mutex_lock(&s->mu);
        s->uploading = false;
        pthread_cond_broadcast(&s->idle);
    }
    s->uploading = false;
    pthread_cond_broadcast(&s->idle);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

struct fetcher_arg {
    struct thaw_shared *s;
    int i;
};

static void *fetcher_main(void *arg)
{
    struct fetcher_arg *fa = arg;
    struct thaw_shared *s = fa->s;
    int me = fa->i;

    free(fa);
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->fcount == 0 && !s->fstopping)
            pthread_cond_wait(&s->fcv, &s->mu);
        if (s->fcount == 0)
            break; /* stopping, nothing left: every job taken has had its done() */
        struct fetch_job j = s->fq[s->fhead];
        s->fhead = (s->fhead + 1) % FETCH_QUEUE;
        s->fcount--;
        bool stopping = s->fstopping;
        pthread_mutex_unlock(&s->mu);
        if (!stopping)
            fetch_with(s, s->fcli[me], j.has_key ? j.key : NULL, j.ns, j.prompt, j.n_prompt);
        j.done(j.ud);
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

void thaw_shared_upload(struct thaw_shared *s, const uint8_t key[THAW_KEY_BYTES], const uint8_t ns[THAW_KEY_BYTES])
{
    bool dropped = false;

    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    if (s->stopping || s->ucount >= s->ucap) {
        dropped = true;
    } else {
        struct upload_job *j = &s->uq[(s->uhead + s->ucount) % s->ucap];
        memcpy(j->key, key, THAW_KEY_BYTES);
        memcpy(j->ns, ns, THAW_KEY_BYTES);
        s->ucount++;
        pthread_cond_signal(&s->ucv);
    }
    pthread_mutex_unlock(&s->mu);
    if (dropped) {
        atomic_fetch_add(&s->uploads_dropped, 1);
        LOG_DBG("shared tier: upload queue full (--kv-shared-queue %u): dropped", s->ucap);
    }
}

int thaw_shared_fetch_async(struct thaw_shared *s, const uint8_t *key, const uint8_t ns[THAW_KEY_BYTES],
                            const thaw_token *prompt, int n_prompt, void (*done)(void *ud), void *ud)
{
    int rc = 0;

    if (!s || (key && (thaw_disk_cache_has(s->disk, key) || is_expected(s, key))) || breaker_is_open(s))
        return THAW_ENOTFOUND;
    if (!key && (!s->prefix_fetch || !s->block_tokens || (n_prompt - 1) / (int)s->block_tokens < 1))
        return THAW_ENOTFOUND;
    pthread_mutex_lock(&s->mu);
    if (s->fstopping || !s->n_fetchers_up) {
        rc = THAW_ESHUTDOWN;
    } else if (s->fcount >= FETCH_QUEUE) {
        rc = THAW_EBUSY;
    } else {
        struct fetch_job *j = &s->fq[(s->fhead + s->fcount) % FETCH_QUEUE];
        memset(j, 0, sizeof *j);
        if ((j->has_key = key != NULL))
            memcpy(j->key, key, THAW_KEY_BYTES);
        memcpy(j->ns, ns, THAW_KEY_BYTES);
        j->prompt = prompt;
        j->n_prompt = n_prompt;
        j->done = done;
        j->ud = ud;
        s->fcount++;
        pthread_cond_signal(&s->fcv);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int thaw_shared_flush(struct thaw_shared *s, long timeout_ms)
{
    struct timespec until;
    int left;

    if (!s)
        return 0;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&s->mu);
    while ((s->ucount > 0 || s->uploading) && s->uploader_up && !s->stopped)
        if (pthread_cond_timedwait(&s->idle, &s->mu, &until) != 0)
            break;
    left = (int)s->ucount + (s->uploading ? 1 : 0);
    pthread_mutex_unlock(&s->mu);
    return left;
}

/* ---- open / close / metrics
 * ---------------------------------------------------- */

static int read_secret(const char *path, uint8_t *buf, size_t cap, size_t *n)
{
    struct stat st;
    int fd = open(path, O_RDONLY | O_CLOEXEC);

    if (fd < 0) {
        LOG_ERR("--kv-shared-secret-file %s: %s", path, strerror(errno));
        return THAW_EINVAL;
    }
    if (fstat(fd, &st) == 0 && (st.st_mode & 077))
        LOG_WRN("--kv-shared-secret-file %s is readable by others (mode %03o): chmod 600 it", path,
                (unsigned)(st.st_mode & 0777));
    ssize_t r = read(fd, buf, cap);
    close(fd);
    if (r < 0) {
        LOG_ERR("--kv-shared-secret-file %s: %s", path, strerror(errno));
        return THAW_EINVAL;
    }
    while (r > 0 && (buf[r - 1] == '\n' || buf[r - 1] == '\r' || buf[r - 1] == ' '))
        r--; /* `echo SECRET > FILE` and `printf SECRET > FILE` give the same key */
    if (r < 16) {
        LOG_ERR("--kv-shared-secret-file %s holds %zd bytes; the cluster secret needs at least 16 (e.g. "
                "`head -c 32 /dev/urandom | base64 > FILE`, the same file on every replica)",
                path, r);
        return THAW_EINVAL;
    }
    *n = (size_t)r;
    return 0;
}

int thaw_shared_open(const struct thaw_shared_params *p, struct thaw_shared **out)
{
    struct thaw_shared *s = calloc(1, sizeof *s);
    uint8_t secret[4096];
    size_t n_secret = 0;
    int rc = THAW_EINVAL;

    if (!s)
        return THAW_ENOMEM;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->ucv, NULL);
    pthread_cond_init(&s->fcv, NULL);
    pthread_cond_init(&s->idle, NULL);
    s->disk = p->disk;
    s->workers = p->workers;
    s->timeout_ms = p->timeout_ms > 0 ? p->timeout_ms : 2000;
    s->retry_s = p->retry_s > 0 ? p->retry_s : 30;
    s->ucap = p->queue ? p->queue : 64;
    s->block_tokens = p->block_tokens;
    s->prefix_fetch = p->prefix_fetch && p->block_tokens > 0;
    memcpy(s->identity, p->identity, THAW_KEY_BYTES);
    if (!p->disk) {
        LOG_ERR("--kv-shared needs --kv-cache-dir: fetched state is installed into the local disk tier");
        goto fail;
    }
    /* where the store is: s3.c's one parser, as for thaw cache gc --shared */
    struct thaw_s3_location loc;
    char why[128];
    if (thaw_s3_parse_url(p->url, &loc, why, sizeof why) != 0) {
        LOG_ERR("--kv-shared %s: %s", p->url ? p->url : "(null)", why);
        goto fail;
    }
    int erc = thaw_s3_endpoint(p->endpoint, &loc, NULL);
    if (erc != 0) {
        LOG_ERR("--kv-shared needs the store's address: --kv-shared-endpoint http(s)://HOST[:PORT] (or "
                "AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL)%s",
                erc == THAW_EINVAL ? ": the one given is not one" : "");
        goto fail;
    }
    if (thaw_s3_credentials(&loc) != 0) {
        LOG_ERR("--kv-shared needs the store's credentials in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY");
        goto fail;
    }
    if (loc.session_token)
        LOG_WRN("--kv-shared: AWS_SESSION_TOKEN is set but not sent (temporary credentials are not supported): "
                "use a key pair");
    snprintf(s->prefix, sizeof s->prefix, "%s", loc.prefix);
    if (!(s->bucket = strdup(loc.bucket)) || !(s->endpoint = strdup(loc.endpoint)) ||
        !(s->access_key = strdup(loc.access_key)) || !(s->secret_key = strdup(loc.secret_key)) ||
        (loc.region && !(s->region = strdup(loc.region)))) {
        rc = THAW_ENOMEM;
        goto fail;
    }
    if (!p->secret_file) {
        LOG_ERR("--kv-shared needs --kv-shared-secret-file FILE: the cluster secret every replica seals and "
                "checks objects with (nothing fetched is trusted without it)");
        goto fail;
    }
    if (read_secret(p->secret_file, secret, sizeof secret, &n_secret) != 0)
        goto fail;
    thaw_shared_derive(secret, n_secret, s->identity, &s->nm);
    sodium_memzero(secret, sizeof secret);

    rc = THAW_ENOMEM;
    if (!(s->uq = calloc(s->ucap, sizeof *s->uq)) || !(s->seen = calloc(SEEN_CAP, THAW_KEY_BYTES)))
        goto fail;
    struct thaw_s3_params sp = {s->endpoint, s->bucket, s->access_key, s->secret_key, s->region, s->timeout_ms};
    if ((rc = thaw_s3_new(&sp, &s->ucli)) != 0)
        goto fail;
    for (int i = 0; i < N_FETCHERS; i++)
        for (int j = 0; j < FETCH_PARALLEL; j++)
            if ((rc = thaw_s3_new(&sp, &s->fcli[i][j])) != 0)
                goto fail;
    if ((rc = -pthread_create(&s->uploader, NULL, uploader_main, s)) != 0)
        goto fail;
    s->uploader_up = true;
    for (int i = 0; i < N_FETCHERS; i++) {
        struct fetcher_arg *fa = malloc(sizeof *fa);
        if (!fa)
            break;
        *fa = (struct fetcher_arg){s, i};
        if (pthread_create(&s->fetchers[i], NULL, fetcher_main, fa) != 0) {
            free(fa);
            break;
        }
        s->n_fetchers_up++;
    }
    LOG_INF("shared tier: s3://%s/%s at %s (fetch deadline %ld ms, breaker pause %lds, upload queue %u%s)", s->bucket,
            s->prefix, s->endpoint, s->timeout_ms, s->retry_s, s->ucap,
            s->prefix_fetch ? ", first turns fetch their prompt's blocks" : "");
    *out = s;
    return 0;
fail:
    thaw_shared_close(s);
    return rc;
}

void thaw_shared_stop(struct thaw_shared *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    bool done = s->fstopped;
    s->fstopping = true;
    s->fstopped = true;
    pthread_cond_broadcast(&s->fcv);
    pthread_mutex_unlock(&s->mu);
    if (!done)
        for (int i = 0; i < s->n_fetchers_up; i++)
            pthread_join(s->fetchers[i], NULL);
}

/* The uploader goes; what it had not taken is dropped (counted). */
static void stop_uploader(struct thaw_shared *s)
{
    pthread_mutex_lock(&s->mu);
    if (s->stopped) {
        pthread_mutex_unlock(&s->mu);
        return;
    }
    s->stopping = true;
    pthread_cond_broadcast(&s->ucv);
    pthread_mutex_unlock(&s->mu);
    if (s->uploader_up)
        pthread_join(s->uploader, NULL);
    pthread_mutex_lock(&s->mu);
    if (s->ucount)
        LOG_INF("shared tier: %u uploads still queued at shutdown: dropped", s->ucount);
    atomic_fetch_add(&s->uploads_dropped, s->ucount);
    s->ucount = 0;
    s->stopped = true;
    pthread_cond_broadcast(&s->idle);
    pthread_mutex_unlock(&s->mu);
}

void thaw_shared_close(struct thaw_shared *s)
{
    if (!s)
        return;
    thaw_shared_stop(s);
    stop_uploader(s);
    thaw_s3_free(s->ucli);
    for (int i = 0; i < N_FETCHERS; i++)
        for (int j = 0; j < FETCH_PARALLEL; j++)
            thaw_s3_free(s->fcli[i][j]);
    free(s->uq);
    free(s->seen);
    free(s->bucket);
    free(s->endpoint);
    if (s->secret_key)
        sodium_memzero(s->secret_key, strlen(s->secret_key));
    free(s->access_key);
    free(s->secret_key);
    free(s->region);
    sodium_memzero(&s->nm, sizeof s->nm);
    pthread_cond_destroy(&s->ucv);
    pthread_cond_destroy(&s->fcv);
    pthread_cond_destroy(&s->idle);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

void thaw_shared_metrics(struct thaw_shared *s, char *buf, size_t cap, size_t *len)
{
    if (!s)
        return;
#define C(n, h, v) thaw_metrics_append(buf, cap, len, "thaw_kv_shared_" n, "counter", h, (double)(v))
    C("hits_total", "fetches that installed state from the shared store into the local tier", atomic_load(&s->hits));
    C("misses_total", "fetches the store had nothing for", atomic_load(&s->misses));
    C("fetch_errors_total", "fetches that failed (timeout, store error, local writer full): served by prefill",
      atomic_load(&s->errors));
    C("rejected_total", "objects that failed authentication or checks (tampered, truncated, foreign): never used",
      atomic_load(&s->rejected));
    C("fetch_bytes_total", "bytes downloaded from the store", atomic_load(&s->fetch_bytes));
    C("fetch_seconds_total", "time spent fetching", (double)atomic_load(&s->fetch_us) / 1e6);
    C("blocks_fetched_total", "blocks downloaded and installed locally", atomic_load(&s->blocks_fetched));
    C("uploads_total", "objects uploaded (blocks and entries)", atomic_load(&s->uploads));
    C("uploads_existing_total", "uploads the store already held (If-None-Match: another replica won)",
      atomic_load(&s->upload_exists));
    C("upload_bytes_total", "bytes uploaded", atomic_load(&s->upload_bytes));
    C("uploads_dropped_total", "uploads dropped (queue full, breaker open, shutdown)",
      atomic_load(&s->uploads_dropped));
    C("upload_errors_total", "uploads that failed (timeout, store error)", atomic_load(&s->upload_errors));
    C("breaker_opens_total", "times the breaker stopped trying the store", atomic_load(&s->breaker_opens));
#undef C
    pthread_mutex_lock(&s->mu);
    uint32_t queued = s->ucount + (s->uploading ? 1 : 0);
    pthread_mutex_unlock(&s->mu);
    thaw_metrics_append(buf, cap, len, "thaw_kv_shared_upload_queue", "gauge",
                        "uploads waiting or in progress", queued);
    thaw_metrics_append(buf, cap, len, "thaw_kv_shared_breaker_open", "gauge",
                        "1 while the breaker keeps requests away from a failing store", breaker_is_open(s) ? 1 : 0);
}
