/* metrics.h — the server's counters and gauges, rendered as Prometheus text.
 *
 * Every field is an atomic so any thread may update it without a lock; the
 * /metrics route snapshots them in thaw_metrics_render(). Seconds are kept
 * as microseconds internally (integers add atomically).
 *
 * The text carries thaw's own names (thaw_*) and, beside them, llama-server's
 * (llamacpp:*, same meanings and types) so a dashboard built for
 * llama-server reads thaw unchanged. Two of those are rates over the window
 * since the previous scrape, as there: the `scraped_*` fields hold the
 * counters as that scrape saw them.
 */
#ifndef THAW_METRICS_H
#define THAW_METRICS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What holds the engine thread, each timed into a histogram
 * (thaw_engine_hold_seconds{op=...}): a decode step, and the work between
 * decode steps that every streaming request waits for (issue #37: none of
 * it may stretch another stream's gap between tokens much beyond a step). */
enum thaw_hold {
    THAW_HOLD_DECODE,     /* a llama_decode serving requests (prefill, generation; re-decoding riding along) */
    THAW_HOLD_FIXUP,      /* a llama_decode of post-reply re-decoding alone (the canonical form) */
    THAW_HOLD_RESTORE,    /* a slot's admission: cache lookup, restore from a tier, rollback to a checkpoint */
    THAW_HOLD_STORE,      /* a slot's store: the tap's new rows, or a whole capture */
    THAW_HOLD_CHECKPOINT, /* a context checkpoint (sliding-window and recurrent memory) */
    THAW_HOLD_SNAPSHOT,   /* a checkpoint kept to be stored as a snapshot (snapshots.h) */
    THAW_HOLD_IMAGE,      /* encoding a prompt's images (vision.h) */
    THAW_HOLD_DRAFT,      /* the draft model proposing for one slot */
    THAW_HOLD_COUNT
};

#define THAW_HOLD_BUCKETS 14 /* upper bounds in thaw_hold_bucket_us[], then +Inf */

struct thaw_hold_hist {
    atomic_uint_fast64_t n[THAW_HOLD_BUCKETS + 1]; /* per bucket (not cumulative): the first bound >= the time */
    atomic_uint_fast64_t sum_us;
    atomic_uint_fast64_t max_us;
};

struct thaw_metrics {
    /* HTTP */
    atomic_uint_fast64_t requests_total;     /* HTTP requests but reads of the server's state (server.c's watches()) */
    atomic_uint_fast64_t requests_errors;    /* answered with status >= 400 */
    atomic_uint_fast64_t chat_requests;      /* POST /v1/chat/completions accepted */
    /* engine */
    atomic_uint_fast64_t prompt_tokens;      /* tokens prefilled (decoded from the prompt) */
    atomic_uint_fast64_t prompt_cached_tokens; /* prompt tokens served from a cache tier */
    atomic_uint_fast64_t predicted_tokens;   /* tokens generated */
    atomic_uint_fast64_t prompt_us;          /* time spent prefilling, microseconds */
    atomic_uint_fast64_t predicted_us;       /* time spent generating, microseconds */
    atomic_uint_fast64_t predicted_steps;    /* decode steps that generated: each reply's tokens less its first,
                                              * which the prompt's last batch yields */
    atomic_uint_fast64_t decode_calls;       /* llama_decode calls */
    atomic_uint_fast64_t busy_slot_decodes;  /* requests_processing summed over the llama_decode calls */
    atomic_uint_fast64_t n_tokens_max;       /* the longest sequence a slot held after a decode (prompt +
                                              * generation); written by the engine thread only */
    atomic_int slots_busy;                   /* gauge: slots in any phase but IDLE (re-decodes too) */
    atomic_int requests_processing;          /* gauge: slots holding a request (PREFILL or GEN) */
    atomic_int queue_depth;                  /* gauge: tasks waiting for a slot */
    int slots_total;
    /* KV cache */
    atomic_uint_fast64_t cache_lookups;
    atomic_uint_fast64_t cache_hits_slot;
    atomic_uint_fast64_t cache_hits_ram;
    atomic_uint_fast64_t cache_hits_disk;
    atomic_uint_fast64_t cache_hits_shared;  /* restored from state just fetched from the shared tier */
    atomic_uint_fast64_t cache_hits_blocks;  /* no entry: a run of stored blocks served the prompt's prefix */
    atomic_uint_fast64_t cache_misses;
    atomic_uint_fast64_t restore_us;         /* time spent restoring, microseconds */
    atomic_uint_fast64_t cache_prefetches;   /* disk entries whose reads started while queued */
    atomic_uint_fast64_t stores;             /* states captured after a reply */
    atomic_uint_fast64_t store_us;           /* engine time spent capturing them, microseconds */
    atomic_uint_fast64_t stores_cut;         /* stores whose blocks were cut from the KV cache (kvtap.h) */
    atomic_uint_fast64_t stores_captured;    /* stores the tap could not serve: whole capture */
    atomic_uint_fast64_t device_to_host;     /* bytes stores copied out of device memory (0: KV on the host) */
    atomic_uint_fast64_t host_to_device;     /* bytes restores copied into device memory */
    atomic_uint_fast64_t fixups_cut;         /* post-reply re-decodes cut short for a request needing the slot */
    atomic_uint_fast64_t reply_stores;       /* finished replies stored (the first store of each: early, or after its re-decoding) */
    atomic_uint_fast64_t reply_store_wait_us; /* their time from the reply's end to that store, microseconds */
    atomic_uint_fast64_t stores_early;       /* of those, stored before a re-decoding that had to wait (engine.c) */
    atomic_uint_fast64_t restores_deferred;  /* restores assembled on the restore thread while other slots decoded */
    atomic_uint_fast64_t ram_bytes;          /* gauge: bytes held by the RAM tier */
    atomic_int ram_entries;                  /* gauge: conversations held by the RAM tier */
    uint64_t ram_budget_bytes;               /* --cache-ram in bytes (0 = tier off); set once at start */
    uint64_t disk_budget_bytes;              /* --kv-cache-max in bytes (0 = no limit); set once at start */
    /* speculative decoding */
    atomic_uint_fast64_t draft_tokens;       /* tokens proposed by the draft */
    atomic_uint_fast64_t draft_accepted;     /* of those, accepted by the target */
    atomic_uint_fast64_t draft_steps;        /* target decodes that verified drafted tokens */
    struct thaw_hold_hist hold[THAW_HOLD_COUNT]; /* engine thread hold times, by enum thaw_hold */
    /* the counters at the last /metrics scrape: llamacpp's rate gauges cover the window since */
    atomic_uint_fast64_t scraped_prompt_tokens, scraped_prompt_us;
    atomic_uint_fast64_t scraped_predicted_steps, scraped_predicted_us;
};

/* Adds src's engine and cache counters and gauges into dst (the totals
 * of several models' engines, each of which counts in its own struct):
 * everything but the HTTP counters and the scrape window (scraped_*);
 * n_tokens_max and disk_budget_bytes (one store for all) take the larger.
 * Any thread. */
void thaw_metrics_add(struct thaw_metrics *dst, const struct thaw_metrics *src);

/* Counts `us` of engine thread time spent on `op`. Any thread. */
void thaw_metrics_hold(struct thaw_metrics *m, enum thaw_hold op, int64_t us);

/* Snapshot callback for gauges owned by other modules (disk cache stats):
 * appends Prometheus lines to `buf` of `cap` bytes at `*len`. */
typedef void (*thaw_metrics_extra_fn)(void *ud, char *buf, size_t cap, size_t *len);

/* Renders all metrics, thaw's then llama-server's, into a malloc'd
 * NUL-terminated string the caller frees; NULL on allocation failure.
 * `extra` may be NULL. `scrape`: a Prometheus scrape (GET /metrics), which
 * ends the rate gauges' window and starts the next; false reads the same
 * numbers and leaves the window alone (the page's /cache). */
char *thaw_metrics_render(struct thaw_metrics *m, bool scrape, thaw_metrics_extra_fn extra, void *ud);

/* Appends one metric with HELP/TYPE lines; used by render and by extras. */
void thaw_metrics_append(char *buf, size_t cap, size_t *len, const char *name, const char *type,
                         const char *help, double value);

#endif
