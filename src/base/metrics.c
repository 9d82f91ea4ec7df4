/* metrics.c — Prometheus text exposition of struct thaw_metrics: thaw's names, then llama-server's. */
#include "base/metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void thaw_metrics_append(char *buf, size_t cap, size_t *len, const char *name, const char *type,
                         const char *help, double value)
{
    if (*len >= cap)
        return;
    int n = snprintf(buf + *len, cap - *len, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name,
                     type, name, value);
    if (n > 0)
        *len += (size_t)n < cap - *len ? (size_t)n : cap - *len;
}

static const uint64_t thaw_hold_bucket_us[THAW_HOLD_BUCKETS] = {
    250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 500000, 1000000, 2500000, 5000000,
};

static const char *const hold_names[THAW_HOLD_COUNT] = {
    [THAW_HOLD_DECODE] = "decode",         [THAW_HOLD_FIXUP] = "fixup",
    [THAW_HOLD_RESTORE] = "restore",       [THAW_HOLD_STORE] = "store",
    [THAW_HOLD_CHECKPOINT] = "checkpoint", [THAW_HOLD_SNAPSHOT] = "snapshot",
    [THAW_HOLD_IMAGE] = "image",           [THAW_HOLD_DRAFT] = "draft",
};

static void atomic_max(atomic_uint_fast64_t *a, uint64_t v)
{
    uint64_t cur = atomic_load(a);

    while (v > cur && !atomic_compare_exchange_weak(a, &cur, v))
        ;
}

void thaw_metrics_hold(struct thaw_metrics *m, enum thaw_hold op, int64_t us)
{
    struct thaw_hold_hist *h = &m->hold[op];
    uint64_t v = us > 0 ? (uint64_t)us : 0;
    int b = 0;

    while (b < THAW_HOLD_BUCKETS && v > thaw_hold_bucket_us[b])
        b++;
    atomic_fetch_add(&h->n[b], 1);
    atomic_fetch_add(&h->sum_us, v);
    atomic_max(&h->max_us, v);
}

/* thaw_engine_hold_seconds, a Prometheus histogram labelled by op, and
 * thaw_engine_hold_max_seconds beside it. */
static void render_hold(struct thaw_metrics *m, char *buf, size_t cap, size_t *len)
{
    static const char *name = "thaw_engine_hold_seconds";
    int n;

#define PUT(...)                                                                                                       \
    do {                                                                                                               \
        if (*len < cap && (n = snprintf(buf + *len, cap - *len, __VA_ARGS__)) > 0)                                    \
            *len += (size_t)n < cap - *len ? (size_t)n : cap - *len;                                                   \
    } while (0)
    PUT("# HELP %s time the engine thread spent on one piece of work, by op: decode (a step serving requests), "
        "fixup (post-reply re-decoding alone), restore, store, checkpoint, snapshot, image (encoding), draft; "
        "every stream waits for each\n# TYPE %s histogram\n", name, name);
    for (int op = 0; op < THAW_HOLD_COUNT; op++) {
        struct thaw_hold_hist *h = &m->hold[op];
        uint64_t cum = 0;
        for (int b = 0; b <= THAW_HOLD_BUCKETS; b++) {
            cum += atomic_load(&h->n[b]);
            if (b < THAW_HOLD_BUCKETS)
                PUT("%s_bucket{op=\"%s\",le=\"%g\"} %llu\n", name, hold_names[op], thaw_hold_bucket_us[b] / 1e6,
                    (unsigned long long)cum);
            else
                PUT("%s_bucket{op=\"%s\",le=\"+Inf\"} %llu\n", name, hold_names[op], (unsigned long long)cum);
        }
        PUT("%s_sum{op=\"%s\"} %.17g\n%s_count{op=\"%s\"} %llu\n", name, hold_names[op],
            atomic_load(&h->sum_us) / 1e6, name, hold_names[op], (unsigned long long)cum);
    }
    PUT("# HELP thaw_engine_hold_max_seconds the longest single piece of work of each op since start\n"
        "# TYPE thaw_engine_hold_max_seconds gauge\n");
    for (int op = 0; op < THAW_HOLD_COUNT; op++)
        PUT("thaw_engine_hold_max_seconds{op=\"%s\"} %.17g\n", hold_names[op], atomic_load(&m->hold[op].max_us) / 1e6);
#undef PUT
}

void thaw_metrics_add(struct thaw_metrics *dst, const struct thaw_metrics *src)
{
    /* not const in C11's eyes: atomic_load takes a pointer to non-const */
    struct thaw_metrics *s = (struct thaw_metrics *)src;

    atomic_fetch_add(&dst->prompt_tokens, atomic_load(&s->prompt_tokens));
    atomic_fetch_add(&dst->prompt_cached_tokens, atomic_load(&s->prompt_cached_tokens));
    atomic_fetch_add(&dst->predicted_tokens, atomic_load(&s->predicted_tokens));
    atomic_fetch_add(&dst->prompt_us, atomic_load(&s->prompt_us));
    atomic_fetch_add(&dst->predicted_us, atomic_load(&s->predicted_us));
    atomic_fetch_add(&dst->predicted_steps, atomic_load(&s->predicted_steps));
    atomic_fetch_add(&dst->decode_calls, atomic_load(&s->decode_calls));
    atomic_fetch_add(&dst->busy_slot_decodes, atomic_load(&s->busy_slot_decodes));
    if (atomic_load(&s->n_tokens_max) > atomic_load(&dst->n_tokens_max))
        atomic_store(&dst->n_tokens_max, atomic_load(&s->n_tokens_max)); /* the longest of all */
    atomic_fetch_add(&dst->slots_busy, atomic_load(&s->slots_busy));
    atomic_fetch_add(&dst->requests_processing, atomic_load(&s->requests_processing));
    atomic_fetch_add(&dst->queue_depth, atomic_load(&s->queue_depth));
    dst->slots_total += s->slots_total;
    atomic_fetch_add(&dst->cache_lookups, atomic_load(&s->cache_lookups));
    atomic_fetch_add(&dst->cache_hits_slot, atomic_load(&s->cache_hits_slot));
    atomic_fetch_add(&dst->cache_hits_ram, atomic_load(&s->cache_hits_ram));
    atomic_fetch_add(&dst->cache_hits_disk, atomic_load(&s->cache_hits_disk));
    atomic_fetch_add(&dst->cache_hits_shared, atomic_load(&s->cache_hits_shared));
    atomic_fetch_add(&dst->cache_hits_blocks, atomic_load(&s->cache_hits_blocks));
    atomic_fetch_add(&dst->cache_misses, atomic_load(&s->cache_misses));
    atomic_fetch_add(&dst->restore_us, atomic_load(&s->restore_us));
    atomic_fetch_add(&dst->cache_prefetches, atomic_load(&s->cache_prefetches));
    atomic_fetch_add(&dst->stores, atomic_load(&s->stores));
    atomic_fetch_add(&dst->store_us, atomic_load(&s->store_us));
    atomic_fetch_add(&dst->stores_cut, atomic_load(&s->stores_cut));
    atomic_fetch_add(&dst->stores_captured, atomic_load(&s->stores_captured));
    atomic_fetch_add(&dst->device_to_host, atomic_load(&s->device_to_host));
    atomic_fetch_add(&dst->host_to_device, atomic_load(&s->host_to_device));
    atomic_fetch_add(&dst->fixups_cut, atomic_load(&s->fixups_cut));
    atomic_fetch_add(&dst->reply_stores, atomic_load(&s->reply_stores));
    atomic_fetch_add(&dst->reply_store_wait_us, atomic_load(&s->reply_store_wait_us));
    atomic_fetch_add(&dst->stores_early, atomic_load(&s->stores_early));
    atomic_fetch_add(&dst->restores_deferred, atomic_load(&s->restores_deferred));
    atomic_fetch_add(&dst->ram_bytes, atomic_load(&s->ram_bytes));
    atomic_fetch_add(&dst->ram_entries, atomic_load(&s->ram_entries));
    dst->ram_budget_bytes += s->ram_budget_bytes;
    if (s->disk_budget_bytes > dst->disk_budget_bytes)
        dst->disk_budget_bytes = s->disk_budget_bytes; /* one store for all (DESIGN §16) */
    atomic_fetch_add(&dst->draft_tokens, atomic_load(&s->draft_tokens));
    atomic_fetch_add(&dst->draft_accepted, atomic_load(&s->draft_accepted));
    atomic_fetch_add(&dst->draft_steps, atomic_load(&s->draft_steps));
    for (int op = 0; op < THAW_HOLD_COUNT; op++) {
        for (int b = 0; b <= THAW_HOLD_BUCKETS; b++)
            atomic_fetch_add(&dst->hold[op].n[b], atomic_load(&s->hold[op].n[b]));
        atomic_fetch_add(&dst->hold[op].sum_us, atomic_load(&s->hold[op].sum_us));
        atomic_max(&dst->hold[op].max_us, atomic_load(&s->hold[op].max_us));
    }
}

/* A rate over the window since the last scrape: (n - *n_seen) per second of
 * (us - *us_seen); a scrape moves the window's start to now. 0 when no time
 * passed in the window (nothing decoded: llama-server's 0 too). */
static double window_rate(uint64_t n, uint64_t us, atomic_uint_fast64_t *n_seen, atomic_uint_fast64_t *us_seen,
                          bool scrape)
{
    uint64_t n0 = scrape ? atomic_exchange(n_seen, n) : atomic_load(n_seen);
    uint64_t us0 = scrape ? atomic_exchange(us_seen, us) : atomic_load(us_seen);

    return us > us0 ? (double)(n - n0) * 1e6 / (double)(us - us0) : 0;
}

/* llama-server's names, HELP texts and types (its server_task_result_metrics
 * ::to_metrics), from thaw's counters. */
static void render_llamacpp(struct thaw_metrics *m, bool scrape, char *buf, size_t cap, size_t *len)
{
    uint64_t prompt_n = atomic_load(&m->prompt_tokens), prompt_us = atomic_load(&m->prompt_us);
    uint64_t steps = atomic_load(&m->predicted_steps), predicted_us = atomic_load(&m->predicted_us);
    uint64_t decodes = atomic_load(&m->decode_calls);

#define C(name, help, v) thaw_metrics_append(buf, cap, len, "llamacpp:" name, "counter", help, (double)(v))
#define G(name, help, v) thaw_metrics_append(buf, cap, len, "llamacpp:" name, "gauge", help, (double)(v))
    C("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens", prompt_n);
    C("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache",
      atomic_load(&m->prompt_cached_tokens));
    C("prompt_seconds_total", "Total time spent processing prompts", prompt_us / 1e6);
    C("tokens_predicted_total", "Number of generation tokens processed", atomic_load(&m->predicted_tokens));
    C("tokens_predicted_seconds_total", "Total time spent generating tokens", predicted_us / 1e6);
    C("n_decode_total", "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding",
      decodes);
    C("n_tokens_max", "Largest observed sequence length (prompt + generation)", atomic_load(&m->n_tokens_max));
    C("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated", atomic_load(&m->draft_tokens));
    C("spec_decode_num_accepted_tokens_total", "Speculative: Total draft tokens accepted by the target model",
      atomic_load(&m->draft_accepted));
    C("spec_decode_num_drafts_total", "Speculative: Total speculative decoding verification steps",
      atomic_load(&m->draft_steps));
    G("prompt_tokens_seconds", "Average prompt throughput in tokens/s",
      window_rate(prompt_n, prompt_us, &m->scraped_prompt_tokens, &m->scraped_prompt_us, scrape));
    G("predicted_tokens_seconds", "Average generation throughput in tokens/s",
      window_rate(steps, predicted_us, &m->scraped_predicted_steps, &m->scraped_predicted_us, scrape));
    G("requests_processing", "Number of requests processing", atomic_load(&m->requests_processing));
    G("requests_deferred", "Number of requests deferred", atomic_load(&m->queue_depth));
    G("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call",
      (double)atomic_load(&m->busy_slot_decodes) / (decodes ? (double)decodes : 1.0));
#undef C
#undef G
}

char *thaw_metrics_render(struct thaw_metrics *m, bool scrape, thaw_metrics_extra_fn extra, void *ud)
{
    const size_t cap = 98304; /* thaw's, the hold histogram, the cache tiers' and llama-server's: ~30 KiB with every tier on */
    char *buf = malloc(cap);
    size_t len = 0;

    if (!buf)
        return NULL;
    buf[0] = '\0';
#define C(name, help, v) thaw_metrics_append(buf, cap, &len, "thaw_" name, "counter", help, (double)(v))
#define G(name, help, v) thaw_metrics_append(buf, cap, &len, "thaw_" name, "gauge", help, (double)(v))
    C("requests_total", "HTTP requests received (health checks, scrapes and /props, /slots, /models reads aside)", atomic_load(&m->requests_total));
    C("requests_errors_total", "HTTP requests answered with an error status", atomic_load(&m->requests_errors));
    C("chat_requests_total", "chat completion requests accepted", atomic_load(&m->chat_requests));
    C("prompt_tokens_total", "prompt tokens prefilled", atomic_load(&m->prompt_tokens));
    C("prompt_cached_tokens_total", "prompt tokens served from a cache tier instead of prefill",
      atomic_load(&m->prompt_cached_tokens));
    C("predicted_tokens_total", "tokens generated", atomic_load(&m->predicted_tokens));
    C("prompt_seconds_total", "time spent prefilling", atomic_load(&m->prompt_us) / 1e6);
    C("predicted_seconds_total", "time spent generating", atomic_load(&m->predicted_us) / 1e6);
    C("decode_calls_total", "llama_decode calls (one serves every active slot)", atomic_load(&m->decode_calls));
    G("slots_busy", "slots serving a request", atomic_load(&m->slots_busy));
    G("slots_total", "slots configured (-np)", m->slots_total);
    G("queue_depth", "requests waiting for a slot", atomic_load(&m->queue_depth));
    C("kv_cache_lookups_total",
      "requests looked up in the cache tiers; each counts once below, under what served it or as a miss",
      atomic_load(&m->cache_lookups));
    C("kv_cache_hits_slot_total", "lookups served by the state a slot already held", atomic_load(&m->cache_hits_slot));
    C("kv_cache_hits_ram_total", "lookups served by the RAM tier", atomic_load(&m->cache_hits_ram));
    C("kv_cache_hits_disk_total", "lookups served by the disk tier", atomic_load(&m->cache_hits_disk));
    C("kv_cache_hits_shared_total", "lookups served by state fetched from the shared tier (--kv-shared)",
      atomic_load(&m->cache_hits_shared));
    C("kv_cache_hits_blocks_total", "lookups with no entry whose prompt prefix a run of stored blocks served",
      atomic_load(&m->cache_hits_blocks));
    C("kv_cache_misses_total", "lookups that found nothing", atomic_load(&m->cache_misses));
    C("kv_cache_restore_seconds_total", "time spent restoring state", atomic_load(&m->restore_us) / 1e6);
    C("kv_cache_prefetches_total", "disk entries read ahead while their request waited",
      atomic_load(&m->cache_prefetches));
    C("kv_cache_stores_total", "states captured after a reply (for the RAM and disk tiers)", atomic_load(&m->stores));
    C("kv_cache_store_seconds_total", "engine time spent capturing states", atomic_load(&m->store_us) / 1e6);
    C("kv_cache_stores_cut_total", "stores whose new blocks were cut straight from the KV cache",
      atomic_load(&m->stores_cut));
    C("kv_cache_stores_captured_total", "stores the KV cache tap could not serve (a whole capture instead)",
      atomic_load(&m->stores_captured));
    C("kv_device_to_host_bytes_total",
      "bytes the cache copied out of device memory for stores (the tap's rows, whole captures); 0 with the KV "
      "cache in host memory",
      atomic_load(&m->device_to_host));
    C("kv_host_to_device_bytes_total", "bytes the cache copied into device memory for restores; 0 with the KV "
      "cache in host memory",
      atomic_load(&m->host_to_device));
    C("kv_cache_fixups_cut_total",
      "post-reply re-decodes cut short for a request that needed the slot (the next turn prefills the rest)",
      atomic_load(&m->fixups_cut));
    C("kv_cache_reply_stores_total", "finished replies stored (the first store of each: early, or once re-decoded)",
      atomic_load(&m->reply_stores));
    C("kv_cache_reply_store_wait_seconds_total",
      "time from a reply's end to its first store (the canonical re-decode and waiting for the engine, or none)",
      atomic_load(&m->reply_store_wait_us) / 1e6);
    C("kv_cache_stores_early_total",
      "replies stored as they stood because their re-decoding had to wait for a busy engine (superseded after it)",
      atomic_load(&m->stores_early));
    C("kv_cache_restores_deferred_total",
      "restores whose blocks were read and assembled off the engine thread while other slots decoded",
      atomic_load(&m->restores_deferred));
    G("kv_cache_ram_bytes", "bytes held by the RAM tier", atomic_load(&m->ram_bytes));
    G("kv_cache_ram_entries", "conversations held by the RAM tier", atomic_load(&m->ram_entries));
    G("kv_cache_ram_budget_bytes", "the RAM tier's budget, --cache-ram (0 = off)", m->ram_budget_bytes);
    G("kv_disk_budget_bytes", "the disk tier's budget, --kv-cache-max (0 = no limit)", m->disk_budget_bytes);
    uint64_t drafted = atomic_load(&m->draft_tokens), accepted = atomic_load(&m->draft_accepted);
    C("draft_tokens_total", "tokens proposed by the draft model", drafted);
    C("draft_accepted_total", "drafted tokens the target accepted", accepted);
    G("draft_acceptance_rate", "accepted / proposed draft tokens since start", drafted ? (double)accepted / drafted : 0);
#undef C
#undef G
    render_hold(m, buf, cap, &len);
    if (extra)
        extra(ud, buf, cap, &len);
    render_llamacpp(m, scrape, buf, cap, &len);
    return buf;
}
