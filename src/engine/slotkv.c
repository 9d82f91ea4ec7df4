/* slotkv.c — a slot's sequence in the llama_context (slotkv.h).
 *
 * Map:
 *   (top)                               new/free: the cache tiers, opened after
 *                                       the layout and tap self-tests
 *   ---- cutting back ----              removal, rollback (checkpoints for SWA /
 *                                       recurrent memory)
 *   ---- from and to the cache tiers ---- install a cached state, the lookup
 *                                       (slot, then the tiers), the store: the
 *                                       tap as a source of blocks (blocks.h),
 *                                       else a capture, with the checkpoints and
 *                                       the draft's state, handed to kvcache.c
 */
#include "engine/slotkv.h"

#include "base/blob.h"
#include "base/error.h"
#include "base/log.h"
#include "base/workers.h"
#include "cache/blocks.h"
#include "engine/draft.h"
#include "engine/slots_view.h"
#include "llama/kvlayout.h"
#include "llama/kvstate.h"
#include "llama/kvtap.h"
#include "llama/tokens.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* A keyed hit being assembled on the restore thread (thaw_slotkv_restore
 * with defer): the slot's s->restore. */
struct thaw_slot_restore {
    struct thaw_slotkv *k;
    struct thaw_kvcache_hit h;
    int n_past;
    struct thaw_job job;
    atomic_bool done;
};

struct thaw_slotkv {
    struct llama_context *ctx;
    struct thaw_kvcache *kv;
    struct thaw_kvtap *tap;
    bool tap_verify;
    struct thaw_draft *draft;
    int n_swa;
    bool recurrent;
    bool partial; /* n_swa > 0 || recurrent: checkpoints needed */
    int min_tokens;
    struct thaw_metrics *metrics;
    void *capture; /* the last capture's buffer, reused once the tiers let go of it (kvstate.h) */
    size_t capture_cap;
    struct thaw_workers *restorer; /* one thread: deferred restores' assembly; NULL = none (restores inline) */
    void (*restored)(void *ud);
    void *restored_ud;
};

/* The cache tiers for this context: blocks only where the state layout
 * and the tap pass their self-tests on it. */
static int open_tiers(struct thaw_slotkv *k, const struct thaw_slotkv_params *p)
{
    const struct thaw_config *cfg = p->cfg;

    struct thaw_kvcache_params kp = {
        .ram_bytes = cfg->cache_ram_mib << 20,
        .disk_dir = cfg->kv_cache_dir,
        .disk_store = p->disk_store,
        .disk_max_bytes = cfg->kv_cache_max_mib << 20,
        .disk_queue_bytes = cfg->kv_cache_queue_mib << 20,
        .ttl_s = (int64_t)cfg->kv_cache_ttl_s,
        .min_tokens = cfg->kv_cache_min_tokens,
        .metrics = p->metrics,
        .block_tokens = cfg->kv_cache_dir ? (uint32_t)cfg->kv_cache_block : 0,
        .prefix_lookup = !k->recurrent, /* a recurrent state is no run of blocks; SWA blocks carry their rows */
        .snapshots = k->recurrent,      /* a hybrid's recurrent state: snapshots (snapshots.h) */
        .n_window = (uint32_t)k->n_swa,
        .n_stream = (uint32_t)llama_n_seq_max(p->ctx),
        .snapshot_idle_s = (uint32_t)cfg->kv_snapshot_idle_s,
    };
    struct thaw_shared_params sp = {
        .url = cfg->kv_shared,
        .endpoint = cfg->kv_shared_endpoint,
        .secret_file = cfg->kv_shared_secret_file,
        .timeout_ms = cfg->kv_shared_timeout_ms,
        .retry_s = cfg->kv_shared_retry_s,
        .queue = (uint32_t)cfg->kv_shared_queue,
        .prefix_fetch = true,
    };
    if (cfg->kv_shared)
        kp.shared = &sp;
    if (kp.block_tokens) {
        /* blocks only for a state layout kvlayout.c knows, checked on a real
         * round trip through slot 0's (still empty) sequence */
        char why[200];
        int lrc = thaw_kvlayout_selftest(p->ctx, 0, why, sizeof why);
        if (lrc != 0) {
            LOG_INF("kv-cache: whole states, not blocks: %s", lrc == THAW_ELAYOUT ? why : thaw_strerror(lrc));
            kp.block_tokens = 0;
        }
    }
    if (p->tap) {
        char why[200] = "";
        int trc = kp.block_tokens && !k->recurrent ? thaw_kvtap_selftest(p->tap, p->ctx, 0, why, sizeof why)
                                                   : THAW_ELAYOUT;
        if (trc == 0)
            LOG_INF("kv-cache: stores cut their new blocks straight from the KV cache%s",
                    thaw_kvtap_has_swa(p->tap) ? ", SWA rows as they are written" : "");
        else if (kp.block_tokens)
            LOG_INF("kv-cache: stores capture whole states: %s", why[0] ? why : thaw_strerror(trc));
    }
    memcpy(kp.identity, p->identity, THAW_KEY_BYTES);
    return thaw_kvcache_open(&kp, &k->kv);
}

static void count_device_io(struct thaw_slotkv *k);

int thaw_slotkv_new(const struct thaw_slotkv_params *p, struct thaw_slotkv **out)
{
    struct thaw_slotkv *k = calloc(1, sizeof *k);
    int rc;

    if (!k)
        return THAW_ENOMEM;
    k->ctx = p->ctx;
    k->tap = p->tap;
    k->tap_verify = p->tap_verify;
    k->draft = p->draft;
    k->n_swa = p->n_swa;
    k->recurrent = p->recurrent;
    k->partial = p->n_swa > 0 || p->recurrent;
    k->min_tokens = p->cfg->kv_cache_min_tokens;
    k->metrics = p->metrics;
    /* --embedding: every prompt is computed afresh and nothing is kept, so
     * no tier is opened (k->kv stays NULL: the tiers' calls do nothing) */
    if (!p->cfg->embedding && (rc = open_tiers(k, p)) != 0) {
        free(k);
        return rc;
    }
    count_device_io(k); /* the start-up self-test's reads, from the first scrape */
    k->restored = p->restored;
    k->restored_ud = p->restored_ud;
    if (thaw_kvcache_enabled(k->kv)) {
        /* its own thread, not the disk tier's pool: an assembly waits for
         * checksum jobs on that pool (workers.h: no job waits on its own
         * pool's progress); without it restores run inline, as before */
        struct thaw_workers_params wp = thaw_workers_default_params();
        wp.n_threads = 1;
        if (thaw_workers_new(&wp, &k->restorer) != 0) {
            LOG_WRN("kv-cache: no restore thread: restores run on the engine thread");
            k->restorer = NULL;
        }
    }
    *out = k;
    return 0;
}

void thaw_slotkv_free(struct thaw_slotkv *k)
{
    if (!k)
        return;
    thaw_workers_free(k->restorer); /* every restore was resumed: nothing runs */
    thaw_kvcache_close(k->kv); /* writes what is still queued, then lets go of the last capture */
    thaw_blob_unref(k->capture);
    free(k);
}

struct thaw_kvcache *thaw_slotkv_cache(const struct thaw_slotkv *k) { return k->kv; }

/* What stores and restores copied between device memory and the host so
 * far, when the tap saw the KV cache in device memory: its rows, and whole
 * states read or installed (with --no-kv-tap there is no tap to tell: 0). */
static void count_device_io(struct thaw_slotkv *k)
{
    uint64_t out, in;

    if (!thaw_kvtap_device(k->tap))
        return;
    thaw_kvstate_io_bytes(&out, &in);
    atomic_store(&k->metrics->device_to_host, out + thaw_kvtap_device_bytes(k->tap));
    atomic_store(&k->metrics->host_to_device, in);
}

/* ---- cutting back ---------------------------------------------------------------- */

/* Removes the slot's positions >= p (0: all) from its sequence, and from
 * what the tap knows of it (kvtap.h): every removal goes through here. */
bool thaw_slotkv_rm(struct thaw_slotkv *k, const struct thaw_slot *s, int p)
{
    thaw_kvcache_slot_cut(k->kv, s->id, p); /* a kept turn-end snapshot there is written first */
    bool ok = llama_memory_seq_rm(llama_get_memory(k->ctx), s->id, p > 0 ? p : -1, -1);
    thaw_kvtap_forget(k->tap, s->id, p);
    return ok;
}

void thaw_slotkv_clear(struct thaw_slotkv *k, struct thaw_slot *s)
{
    thaw_slotkv_rm(k, s, 0);
    thaw_slot_forget(s);
}

/* Can a sequence whose memory starts at pos_min continue at position n?
 * The token at n attends to the n_swa positions before it (standard SWA:
 * positions > n - n_swa); a recurrent state exists only at its end. */
static bool can_resume_at(const struct thaw_slotkv *k, const struct thaw_slot *s, llama_pos pos_min, int n)
{
    if (k->recurrent)
        return n == s->n_tokens;
    if (k->n_swa == 0 || pos_min <= 0)
        return true;
    return pos_min <= n - k->n_swa + 1;
}

/* The longest prefix of at most n tokens the slot can resume at, and the
 * checkpoint that takes it there (*ckpt NULL: a plain truncation does). */
int thaw_slotkv_rollback_target(const struct thaw_slotkv *k, const struct thaw_slot *s, int n, const struct thaw_ckpt **ckpt)
{
    *ckpt = NULL;
    if (n > s->n_tokens)
        n = s->n_tokens;
    if (n <= 0 || !k->partial || can_resume_at(k, s, llama_memory_seq_pos_min(llama_get_memory(k->ctx), s->id), n))
        return n > 0 ? n : 0;
    for (int i = s->ckpts.n - 1; i >= 0; i--) {
        if (s->ckpts.v[i].n_tokens <= n && s->ckpts.v[i].n_tokens > 0) {
            *ckpt = &s->ckpts.v[i];
            return s->ckpts.v[i].n_tokens;
        }
    }
    return 0;
}

/* Truncates the slot's sequence to at most n tokens, as close to n as its
 * memory allows (a checkpoint when the window or recurrent state cannot roll
 * back that far; nothing when no checkpoint fits). Returns the new length. */
int thaw_slotkv_rollback(struct thaw_slotkv *k, struct thaw_slot *s, int n)
{
    const struct thaw_ckpt *c;

    n = thaw_slotkv_rollback_target(k, s, n, &c);
    if (c) {
        if (thaw_ckpt_restore(c, k->ctx, s->id) == 0) {
            LOG_DBG("slot %d: rolled back to the checkpoint at %d tokens", s->id, n);
        } else {
            LOG_WRN("slot %d: checkpoint at %d tokens could not be installed: full prefill", s->id, n);
            n = 0;
        }
    }
    if (n == 0 || !thaw_slotkv_rm(k, s, n)) {
        thaw_slotkv_clear(k, s);
        return 0;
    }
    thaw_slot_truncate(s, n);
    return n;
}

/* ---- from and to the cache tiers ------------------------------------------------ */

/* Installs a cached conversation (its .kv, .ckpt and .dft blobs; the last
 * two may be empty) into the slot when it holds more of the prompt than the
 * slot already does. Returns the tokens of the prompt the slot now holds
 * (>= n_past), or a negative error when the blobs are corrupt (the slot is
 * then empty). A bad .dft only costs the draft a prefill. */
static int slot_install(struct thaw_slotkv *k, struct thaw_slot *s, const struct thaw_task *t,
                        const struct thaw_part_blob parts[THAW_PART_COUNT], int n_past)
{
    struct thaw_kvstate_view v;
    int rc;

    if ((rc = thaw_kvstate_parse(parts[THAW_PART_KV].data, parts[THAW_PART_KV].size, &v)) != 0)
        return rc;
    int lcp = thaw_lcp(v.tokens, v.n_tokens, t->prompt, t->n_prompt);
    if (lcp <= n_past)
        return n_past; /* the slot already holds as much: keep it */
    if (thaw_slot_reserve(s, v.n_tokens + 1) != 0)
        return THAW_ENOMEM;
    thaw_slotkv_clear(k, s);
    if ((rc = thaw_kvstate_restore(k->ctx, s->id, &v)) != 0)
        return rc;
    thaw_kvtap_restored(k->tap, s->id, v.state, v.n_state, thaw_kvcache_block_tokens(k->kv));
    memcpy(s->tokens, v.tokens, (size_t)v.n_tokens * sizeof(llama_token));
    s->n_tokens = v.n_tokens;
    if ((rc = thaw_ckpt_parse(parts[THAW_PART_CKPT].data, parts[THAW_PART_CKPT].size, &s->ckpts)) != 0) {
        thaw_slotkv_clear(k, s);
        return rc;
    }
    if (k->draft && parts[THAW_PART_DFT].size > 0) {
        rc = thaw_draft_restore(k->draft, s->id, parts[THAW_PART_DFT].data, parts[THAW_PART_DFT].size);
        if (rc < 0)
            LOG_WRN("slot %d: draft state unusable (%s): the draft prefills instead", s->id, thaw_strerror(rc));
        else
            s->timings.draft_restored = rc;
    }
    thaw_slot_hold(s, t->lookup_key);
    return lcp;
}

/* A hit of the cache's installed into the slot, then ended: the prompt
 * tokens the slot holds afterwards (n_past when the hit gave no more; 0
 * when its bytes were bad, the slot then emptied). Sets the timings'
 * source and restore time when it gave more. */
static int take_hit(struct thaw_slotkv *k, struct thaw_slot *s, const struct thaw_task *t, struct thaw_kvcache_hit *h,
                    int n_past)
{
    int got = slot_install(k, s, t, h->parts, n_past);
    int rc = thaw_kvcache_hit_end(k->kv, h, got);

    if (rc < 0) {
        if (got >= 0)
            thaw_slotkv_clear(k, s); /* installed, then found bad: before any decode */
        return 0;
    }
    if (got > n_past) {
        s->timings.cache_source = h->source;
        s->timings.restore_ms = h->restore_ms;
    }
    return got;
}

/* The cache's prefix lookup (kvcache.h) for a slot holding `reach` tokens:
 * the tokens it holds afterwards (reach on a miss). */
static int take_prefix(struct thaw_slotkv *k, struct thaw_slot *s, const struct thaw_task *t, int reach)
{
    struct thaw_kvcache_hit h;

    if (thaw_kvcache_find_prefix(k->kv, t->ns, t->prompt, t->n_prompt, s->id, reach, &h) != 0)
        return reach;
    return take_hit(k, s, t, &h, reach);
}

/* One lookup, one outcome: the source that served it ("slot" when the slot
 * already held the conversation), or NULL for a miss. The outcomes sum to
 * thaw_kv_cache_lookups_total (a keyed miss that stored blocks rescue is a
 * blocks hit, not also a miss). */
static void count_lookup(struct thaw_metrics *m, const char *source)
{
    atomic_uint_fast64_t *c = !source                         ? &m->cache_misses
                              : strcmp(source, "slot") == 0   ? &m->cache_hits_slot
                              : strcmp(source, "ram") == 0    ? &m->cache_hits_ram
                              : strcmp(source, "shared") == 0 ? &m->cache_hits_shared
                              : strcmp(source, "blocks") == 0 ? &m->cache_hits_blocks
                                                              : &m->cache_hits_disk;

    atomic_fetch_add(&m->cache_lookups, 1);
    atomic_fetch_add(c, 1);
}

/* The lookup at the start of a request: the slot itself, then the cache
 * tiers (kvcache.h). Returns the number of prompt tokens the slot holds
 * afterwards. */
static int restore_rest(struct thaw_slotkv *k, struct thaw_slot *s, const struct thaw_task *t, int n_past, int got);

/* The restore thread's job: the deferred hit's assembly and checks. */
static void restore_main(void *arg)
{
    struct thaw_slot_restore *r = arg;

    thaw_kvcache_hit_prepare(r->k->kv, &r->h);
    atomic_store(&r->done, true);
    if (r->k->restored)
        r->k->restored(r->k->restored_ud);
}

int thaw_slotkv_restore(struct thaw_slotkv *k, struct thaw_slot *s, const struct thaw_task *t, int n_past,
                        bool defer)
{
    int got = n_past;
    if (t->has_lookup_key) {
        struct thaw_kvcache_hit h;
        if (thaw_slot_holds(s, t->lookup_key)) {
            /* the slot still holds this conversation: the prefix path serves it */
            count_lookup(k->metrics, "slot");
            return n_past;
        }
        struct thaw_slot_restore *r = defer && k->restorer ? calloc(1, sizeof *r) : NULL;
        int rc = r ? thaw_kvcache_find_deferred(k->kv, t->lookup_key, s->id, n_past, &h)
                   : thaw_kvcache_find(k->kv, t->lookup_key, s->id, n_past, &h);
        if (rc == 0 && h.deferred) {
            r->k = k;
            r->h = h;
            r->n_past = n_past;
            atomic_init(&r->done, false);
            s->restore = r;
            atomic_fetch_add(&k->metrics->restores_deferred, 1);
            if (thaw_workers_submit(k->restorer, &r->job, restore_main, r) != 0)
                thaw_workers_wait(k->restorer, &r->job); /* not taken: run here, now */
            return THAW_SLOTKV_RESTORING;
        }
        free(r);
        if (rc == 0)
            got = take_hit(k, s, t, &h, n_past);
    }
    return restore_rest(k, s, t, n_past, got);
}

bool thaw_slotkv_restore_ready(const struct thaw_slot *s) { return s->restore && atomic_load(&s->restore->done); }

int thaw_slotkv_restore_resume(struct thaw_slotkv *k, struct thaw_slot *s, const struct thaw_task *t)
{
    struct thaw_slot_restore *r = s->restore;
    int got;

    thaw_workers_wait(k->restorer, &r->job);
    s->restore = NULL;
    if (thaw_kvcache_hit_ready(k->kv, &r->h) == 0)
        got = take_hit(k, s, t, &r->h, r->n_past);
    else
        got = r->n_past; /* unusable, found before anything was installed: the slot keeps what it held */
    int n_past = r->n_past;
    free(r);
    return restore_rest(k, s, t, n_past, got);
}

/* The lookup after the keyed hit (got: the prompt tokens the slot holds):
 * stored blocks where it gave nothing, an SWA model's blocks where its
 * window does not reach; counts the outcome. */
static int restore_rest(struct thaw_slotkv *k, struct thaw_slot *s, const struct thaw_task *t, int n_past, int got)
{
    if (got <= n_past) { /* no entry (a first turn, an edit, a fork): stored blocks may still serve it */
        /* recurrent memory resumes only where a checkpoint takes it, and
         * a sliding window only where it still holds (or a checkpoint
         * restores) the window: stored blocks deeper than that are worth
         * installing (a new conversation sharing a system prompt and an
         * image with what the slot holds, with no checkpoint there) */
        const struct thaw_ckpt *c;
        int reach = k->recurrent || k->n_swa > 0 ? thaw_slotkv_rollback_target(k, s, got, &c) : got;
        int pre = take_prefix(k, s, t, reach);
        if (pre > reach || pre < got) /* a snapshot was installed (or the slot emptied) */
            got = pre;
    } else if (k->n_swa > 0 && !k->recurrent) {
        /* An SWA conversation's entry comes without checkpoints when its
         * blocks carry their SWA rows (kvcache.c): where the prompt parts
         * from it further back than the restored window reaches, its
         * blocks still serve it up to the last boundary before that */
        const struct thaw_ckpt *c;
        int want = got < t->n_prompt ? got : t->n_prompt - 1; /* one token is decoded (engine.c) */
        int reach = thaw_slotkv_rollback_target(k, s, want, &c);
        if (reach < want) {
            int pre = take_prefix(k, s, t, reach);
            if (pre != reach) /* the blocks were installed (or the slot emptied) */
                got = pre;
        }
    }
    count_lookup(k->metrics, got > n_past ? s->timings.cache_source : NULL);
    count_device_io(k);
    return got;
}

/* The tap as a store's source (blocks.h) for one sequence. */
struct tap_ud {
    struct thaw_kvtap *tap;
    llama_seq_id seq;
};

static size_t tap_size(const void *ud, uint32_t a, uint32_t b)
{
    return thaw_kvtap_block_size(((const struct tap_ud *)ud)->tap, a, b);
}

static int tap_cut(const void *ud, uint32_t a, uint32_t b, void *dst, size_t cap)
{
    const struct tap_ud *u = ud;
    return thaw_kvtap_cut(u->tap, u->seq, a, b, dst, cap);
}

static int tap_known(const void *ud, uint32_t a, uint32_t b)
{
    const struct tap_ud *u = ud;
    return thaw_kvtap_known(u->tap, u->seq, a, b);
}

static size_t tap_swa_size(const void *ud, uint32_t a, uint32_t b)
{
    return thaw_kvtap_swa_block_size(((const struct tap_ud *)ud)->tap, a, b);
}

static int tap_swa_cut(const void *ud, uint32_t a, uint32_t b, void *dst, size_t cap)
{
    const struct tap_ud *u = ud;
    return thaw_kvtap_swa_cut(u->tap, u->seq, a, b, dst, cap);
}

static int tap_swa_known(const void *ud, uint32_t a, uint32_t b)
{
    const struct tap_ud *u = ud;
    return thaw_kvtap_swa_known(u->tap, u->seq, a, b);
}

/* The tap as the source of the first n cells of ud's sequence, with the
 * SWA rows it took as they were written when it has them (DESIGN §12). */
static struct thaw_blocks_src tap_src(const struct thaw_slotkv *k, const struct tap_ud *ud, int n)
{
    struct thaw_blocks_src src = {
        .n_cells = (uint32_t)n,
        .size = tap_size,
        .cut = tap_cut,
        .known = tap_known,
        .ud = ud,
    };
    if (thaw_kvtap_has_swa(k->tap)) {
        src.swa_size = tap_swa_size;
        src.swa_cut = tap_swa_cut;
        src.swa_known = tap_swa_known;
        src.n_window = (uint32_t)k->n_swa;
    }
    return src;
}

static void drop_parts(struct thaw_part_blob parts[THAW_PART_COUNT])
{
    for (int p = 0; p < THAW_PART_COUNT; p++)
        thaw_blob_unref(parts[p].data);
    memset(parts, 0, THAW_PART_COUNT * sizeof *parts);
}

/* The one store path of the slot's sequence: the blocks cut from the tap
 * when it and the disk's blocks are on and it knows the cells (counted as
 * stores_cut), else a capture of the sequence (stores_captured when the
 * tap was tried), with the checkpoints when they are needed, handed to
 * the tiers (thaw_kvcache_store). parts[THAW_PART_DFT] may hold the
 * draft's state (taken); the others must be empty. sizes gets each part's
 * bytes as handed over (sizes[KV] 0: blocks cut from the tap). Returns
 * the tiers it went to, or NULL when the capture failed (logged; nothing
 * stored, the parts dropped). */
static const char *store_seq(struct thaw_slotkv *k, struct thaw_slot *s, const uint8_t *supersedes,
                             struct thaw_part_blob parts[THAW_PART_COUNT], size_t sizes[THAW_PART_COUNT])
{
    struct thaw_kvcache_store_params sp = {
        .slot_id = s->id,
        .key = s->store_key,
        .ns = s->ns,
        .supersedes = supersedes,
        .n_tokens = s->n_tokens,
        .toks = s->tokens,
        /* stored before its re-decode (engine.c, store_early): the store
         * after it supersedes this one, and only that one is shared */
        .local_only = s->phase == THAW_SLOT_FIXUP && s->n_tokens < s->n_fix,
        .retain = s->retain,
        .n_retain = s->n_retain,
    };
    const char *where = NULL;
    char hex[17];
    int rc;

    thaw_keys_short(s->store_key, hex);
    /* cut from the tap with SWA rows, the blocks hold every position's
     * window rows: a restore rebuilds the window at any boundary and the
     * checkpoints (a window each) are not stored (DESIGN §12); they stay
     * the slot's, for its own rollbacks */
    bool cut = k->tap && thaw_kvtap_ready(k->tap) && thaw_kvcache_cuts_blocks(k->kv);
    bool swa_rows = cut && thaw_kvtap_has_swa(k->tap);
    if (k->partial && !swa_rows &&
        (rc = thaw_ckpt_serialize(&s->ckpts, &parts[THAW_PART_CKPT].data, &parts[THAW_PART_CKPT].size)) != 0)
        goto fail;
    /* the blocks straight from the cache's memory: as much work on a 16k
     * history as on a 2k one (kvtap.h) */
    if (cut) {
        if (k->tap_verify)
            (void)thaw_kvtap_verify(k->tap, k->ctx, s->id, s->n_tokens, thaw_kvcache_block_tokens(k->kv));
        struct tap_ud ud = {k->tap, s->id};
        struct thaw_blocks_src src = tap_src(k, &ud, s->n_tokens);
        for (int p = 0; p < THAW_PART_COUNT; p++)
            sizes[p] = parts[p].size;
        sp.src = &src;
        where = thaw_kvcache_store(k->kv, &sp, parts);
        sp.src = NULL;
        atomic_fetch_add(where ? &k->metrics->stores_cut : &k->metrics->stores_captured, 1);
    }
    if (!where) {
        /* a capture: its manifest may have to carry the window, and then
         * the checkpoints go too (the tiers drop them when they need not) */
        if (k->partial && swa_rows &&
            (rc = thaw_ckpt_serialize(&s->ckpts, &parts[THAW_PART_CKPT].data, &parts[THAW_PART_CKPT].size)) != 0)
            goto fail;
        if ((rc = thaw_kvstate_capture_reuse(k->ctx, s->id, s->tokens, s->n_tokens, &k->capture, &k->capture_cap,
                                             &parts[THAW_PART_KV].data, &parts[THAW_PART_KV].size)) != 0)
            goto fail;
        for (int p = 0; p < THAW_PART_COUNT; p++)
            sizes[p] = parts[p].size;
        where = thaw_kvcache_store(k->kv, &sp, parts);
    }
    return where;

fail:
    LOG_WRN("slot %d: could not capture state for %s: %s", s->id, hex, thaw_strerror(rc));
    drop_parts(parts);
    return NULL;
}

bool thaw_slotkv_will_store(const struct thaw_slotkv *k, int n_tokens)
{
    return thaw_kvcache_enabled(k->kv) && n_tokens > 0 && n_tokens >= k->min_tokens;
}

/* Serialises the slot's state (and its draft's) and hands it to the RAM
 * tier and the disk writer under s->store_key. Never waits for I/O. */
void thaw_slotkv_store(struct thaw_slotkv *k, struct thaw_slot *s)
{
    struct thaw_part_blob parts[THAW_PART_COUNT] = {{NULL, 0}, {NULL, 0}, {NULL, 0}};
    char hex[17];

    if (s->n_tokens < k->min_tokens || s->n_tokens == 0)
        return;
    thaw_keys_short(s->store_key, hex);
    int64_t t0 = thaw_now_us();
    /* the draft catches up with the stored tokens first, so the next turn
     * restores it as far as the target */
    if (k->draft && (thaw_draft_sync(k->draft, s->id, s->tokens, s->n_tokens) < 0 ||
                     thaw_draft_capture(k->draft, s->id, &parts[THAW_PART_DFT].data, &parts[THAW_PART_DFT].size) != 0))
        LOG_WRN("slot %d: draft state not stored with %s: the next turn prefills the draft", s->id, hex);
    const uint8_t *supersedes = s->has_prev_key ? s->prev_key : NULL;
    size_t sizes[THAW_PART_COUNT] = {0, 0, 0};
    /* blocks cut from the tap, else a capture */
    const char *where = store_seq(k, s, supersedes, parts, sizes);
    /* stored as generated, past where the next turn parts from it: a
     * hybrid's turn-end snapshot there would serve no prompt (the next
     * turn rolls back below it), so it is not kept for later either */
    if (s->store_parts_at > 0)
        thaw_kvcache_slot_drop(k->kv, s->id);
    s->store_parts_at = 0;
    count_device_io(k);
    if (!where)
        return; /* logged */
    thaw_slot_hold(s, s->store_key);
    thaw_slots_view_stored(s->view, s->id, where);
    s->has_prev_key = false;
    int64_t took = thaw_now_us() - t0;
    thaw_metrics_hold(k->metrics, THAW_HOLD_STORE, took);
    atomic_fetch_add(&k->metrics->stores, 1);
    atomic_fetch_add(&k->metrics->store_us, (uint64_t)took);
    if (sizes[0])
        LOG_INF("slot %d: stored %s: %d tokens, %.1f MiB state%s%s -> %s in %.1f ms", s->id, hex, s->n_tokens,
                (double)sizes[0] / 1048576.0, sizes[1] ? " + checkpoints" : "", sizes[2] ? " + draft" : "", where,
                (double)took / 1000.0);
    else
        LOG_INF("slot %d: stored %s: %d tokens, blocks cut from the cache%s%s -> %s in %.1f ms", s->id, hex,
                s->n_tokens, sizes[1] ? " + checkpoints" : "", sizes[2] ? " + draft" : "", where,
                (double)took / 1000.0);
}

void thaw_slotkv_store_ahead(struct thaw_slotkv *k, struct thaw_slot *s, int n)
{
    if (k->recurrent || !k->tap || !thaw_kvtap_ready(k->tap) || !thaw_kvcache_cuts_blocks(k->kv) ||
        !thaw_slotkv_will_store(k, n) || n > s->n_tokens)
        return;
    int64_t t0 = thaw_now_us();
    struct tap_ud ud = {k->tap, s->id};
    struct thaw_blocks_src src = tap_src(k, &ud, n);
    if (thaw_kvcache_store_ahead(k->kv, s->id, s->ns, s->tokens, &src) > 0)
        thaw_metrics_hold(k->metrics, THAW_HOLD_STORE, thaw_now_us() - t0);
}

/* The slot's state is final: it is stored at the next moment no other slot
 * decodes (the engine's finish_fixups), like a FIXUP with nothing left to
 * re-decode, so that the capture never delays another request's tokens. */
static void defer_store(struct thaw_slotkv *k, struct thaw_slot *s)
{
    thaw_slot_move(s, THAW_SLOT_FIXUP, NULL, k->metrics);
}

void thaw_slotkv_prepare_store(struct thaw_slotkv *k, struct thaw_slot *s, llama_token *canon, int n_canon)
{
    const struct thaw_task *t = s->task;

    s->store_parts_at = 0;
    if (!canon) {
        defer_store(k, s);
        return;
    }
    int lcp = thaw_lcp(s->tokens, s->n_tokens, canon, n_canon);
    const struct thaw_ckpt *c;
    int target = thaw_slotkv_rollback_target(k, s, lcp, &c);
    /* Re-decode at most the reply and a little more: when the window has
     * moved past the divergence and no checkpoint reaches back, store the
     * state as generated (its checkpoints still serve the next turn). */
    if ((lcp == s->n_tokens && lcp == n_canon) || n_canon - target > n_canon - t->n_prompt + 64) {
        if (lcp != n_canon)
            LOG_DBG("slot %d: canonical form differs at %d, cannot roll back there: storing as generated", s->id,
                    lcp);
        if (lcp < s->n_tokens)
            s->store_parts_at = lcp;
        free(canon);
        defer_store(k, s);
        return;
    }
    int kept = thaw_slotkv_rollback(k, s, lcp);
    LOG_DBG("slot %d: canonical form differs after %d of %d tokens; kept %d, re-decoding %d", s->id, lcp,
            n_canon, kept, n_canon - kept);
    /* stays busy until stored; see the engine's build_batch */
    thaw_slot_move(s, THAW_SLOT_FIXUP, &(struct thaw_slot_enter){.fix = canon, .n_fix = n_canon}, k->metrics);
}
