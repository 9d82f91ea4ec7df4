/* engine.c — model + context, the decode loop, batching across slots.
 *
 * Map:
 *   ---- slots ----        a slot's KV: clearing, rollback (checkpoints for SWA)
 *   ---- cache tiers ----  install a cached state into a slot, capture one; the
 *                          tier policy (which tier, in what order) is kvcache.c's
 *   ---- admission ----    queued task -> idle slot, prompt-prefix reuse
 *   ---- generation ----   sampling, stop strings, streaming text out
 *   ---- the loop ----     one llama_batch for every active slot per step
 *   ---- lifecycle ----    load model, context, thread; shutdown
 *
 * A slot's life: IDLE -> PREFILL -> GEN -> (FIXUP) -> IDLE; slot.h has the
 * table of legal moves, and thaw_slot_set_phase is the only place a phase
 * (and the busy gauge) changes. FIXUP happens after the reply has been
 * sent: the slot re-decodes the reply's tail as the next turn will present
 * it (the canonical rendering, DESIGN §2 "Beyond the seed") so the stored
 * state matches the next request token for token, then stores it.
 *
 * Only engine_main() and what it calls touch e->ctx.
 */
#include "engine.h"

#include "blob.h"
#include "blocks.h"
#include "draft.h"
#include "error.h"
#include "fingerprint.h"
#include "kvcache.h"
#include "kvlayout.h"
#include "kvstate.h"
#include "kvtap.h"
#include "log.h"
#include "scheduler.h"
#include "slot.h"
#include "template.h"
#include "testhooks.h"
#include "utf8.h"

#include <ggml-backend.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- slots --------------------------------------------------------------------- */

struct thaw_engine {
    const struct thaw_config *cfg;
    struct thaw_metrics *metrics;

    struct llama_model *model;
    const struct llama_vocab *vocab;
    struct llama_context *ctx;
    struct thaw_chat *chat;
    struct thaw_sched *sched;
    char *model_name;
    uint8_t fingerprint[THAW_FINGERPRINT_BYTES];
    char settings[256];        /* the context settings that shape the state's bytes */
    double fixup_us_per_tok;   /* decode cost of a FIXUP token alone (moving average), 0 = unknown */
    bool batch_fixup_only;     /* the batch in flight holds FIXUP tokens only */
    bool fixup_awaited;        /* a queued request waits for a FIXUP slot to finish (admit): full speed */
    void *capture;             /* the last capture's buffer, reused once the tiers let go of it (kvstate.h) */
    size_t capture_cap;
    struct thaw_kvtap *tap;    /* where the KV cache's cells are: stores cut blocks from it (kvtap.h); NULL = off */
    bool tap_verify;           /* THAW_TEST_KVTAP_VERIFY: check every cut against a capture */

    struct thaw_slot *slots;
    int n_slots;
    int n_ctx_slot;            /* tokens per sequence */
    int max_token_bytes;       /* longest piece of text one token stands for */
    int n_swa;                 /* sliding window, 0 = none or --swa-full */
    bool recurrent;            /* recurrent / hybrid memory: cannot roll back without a checkpoint */
    bool partial;              /* n_swa > 0 || recurrent: checkpoints needed */

    struct thaw_draft *draft;  /* NULL = no speculative decoding */
    struct thaw_kvcache *kv;   /* the cache tiers (kvcache.h) */
    uint8_t identity[THAW_KEY_BYTES]; /* model + settings, written into every .idx */
    struct llama_batch batch;  /* n_batch tokens */
    int n_batch;

    pthread_t thread;
    atomic_bool stop;
};

/* Removes the slot's positions >= p (0: all) from its sequence, and from
 * what the tap knows of it (kvtap.h): every removal goes through here. */
static bool slot_kv_rm(struct thaw_engine *e, const struct thaw_slot *s, int p)
{
    bool ok = llama_memory_seq_rm(llama_get_memory(e->ctx), s->id, p > 0 ? p : -1, -1);
    thaw_kvtap_forget(e->tap, s->id, p);
    return ok;
}

static void slot_clear_kv(struct thaw_engine *e, struct thaw_slot *s)
{
    slot_kv_rm(e, s, 0);
    s->n_tokens = 0;
    s->holds_key = false;
    thaw_ckpt_clear(&s->ckpts);
}

/* Can a sequence whose memory starts at pos_min continue at position n?
 * The token at n attends to the n_swa positions before it (standard SWA:
 * positions > n - n_swa); a recurrent state exists only at its end. */
static bool can_resume_at(const struct thaw_engine *e, const struct thaw_slot *s, llama_pos pos_min, int n)
{
    if (e->recurrent)
        return n == s->n_tokens;
    if (e->n_swa == 0 || pos_min <= 0)
        return true;
    return pos_min <= n - e->n_swa + 1;
}

/* The longest prefix of at most n tokens the slot can resume at, and the
 * checkpoint that takes it there (*ckpt NULL: a plain truncation does). */
static int rollback_target(const struct thaw_engine *e, const struct thaw_slot *s, int n, const struct thaw_ckpt **ckpt)
{
    *ckpt = NULL;
    if (n > s->n_tokens)
        n = s->n_tokens;
    if (n <= 0 || !e->partial || can_resume_at(e, s, llama_memory_seq_pos_min(llama_get_memory(e->ctx), s->id), n))
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
static int slot_rollback(struct thaw_engine *e, struct thaw_slot *s, int n)
{
    const struct thaw_ckpt *c;

    n = rollback_target(e, s, n, &c);
    if (c) {
        if (thaw_ckpt_restore(c, e->ctx, s->id) == 0) {
            LOG_DBG("slot %d: rolled back to the checkpoint at %d tokens", s->id, n);
        } else {
            LOG_WRN("slot %d: checkpoint at %d tokens could not be installed: full prefill", s->id, n);
            n = 0;
        }
    }
    if (n == 0 || !slot_kv_rm(e, s, n)) {
        slot_clear_kv(e, s);
        return 0;
    }
    if (n < s->n_tokens)
        s->holds_key = false; /* it now holds a prefix of that conversation only */
    s->n_tokens = n;
    thaw_ckpt_truncate(&s->ckpts, n);
    return n;
}

/* ---- post-reply work (FIXUP) --------------------------------------------------- */

/* FIXUP tokens a generation step carries once the FIXUP has waited
 * THAW_FIXUP_DEFER_US for the engine to be free; a FIXUP alone runs in
 * slices of about THAW_FIXUP_SLICE_US of decoding. */
#define THAW_FIXUP_PIGGYBACK 2
#define THAW_FIXUP_DEFER_US 2000000
#define THAW_FIXUP_SLICE_US 50000.0
/* At shutdown the re-decoding left gets this long, at full speed. */
#define THAW_SHUTDOWN_FIXUP_S 10

/* FIXUP tokens for one slice, from what FIXUP batches cost so far (a
 * small first batch measures it). */
static int fixup_slice(const struct thaw_engine *e)
{
    if (e->fixup_us_per_tok <= 0)
        return 4;
    double n = THAW_FIXUP_SLICE_US / e->fixup_us_per_tok;
    return n < 1 ? 1 : n > e->n_batch ? e->n_batch : (int)n;
}

/* Ends the slot's request: the task is released, the KV stays for reuse. */
static void slot_release_task(struct thaw_engine *e, struct thaw_slot *s)
{
    if (s->smpl) {
        llama_sampler_free(s->smpl);
        s->smpl = NULL;
    }
    thaw_task_release(s->task);
    s->task = NULL;
    s->i_batch = -1;
    s->last_used_us = thaw_now_us();
    if (s->phase != THAW_SLOT_FIXUP) /* a FIXUP slot stays busy until stored */
        thaw_slot_set_phase(s, THAW_SLOT_IDLE, e->metrics);
}

static void slot_fail(struct thaw_engine *e, struct thaw_slot *s, int status, const char *msg)
{
    if (s->task)
        thaw_task_fail(s->task, status, msg);
    slot_clear_kv(e, s); /* its KV may be half-written */
    if (s->phase == THAW_SLOT_FIXUP) {
        thaw_slot_set_phase(s, THAW_SLOT_IDLE, e->metrics);
        return;
    }
    slot_release_task(e, s);
}

/* ---- cache tiers ----------------------------------------------------------------- */

/* Installs a cached conversation (its .kv, .ckpt and .dft blobs; the last
 * two may be empty) into the slot when it holds more of the prompt than the
 * slot already does. Returns the tokens of the prompt the slot now holds
 * (>= n_past), or a negative error when the blobs are corrupt (the slot is
 * then empty). A bad .dft only costs the draft a prefill. */
static int slot_install(struct thaw_engine *e, struct thaw_slot *s, const struct thaw_task *t,
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
    slot_clear_kv(e, s);
    if ((rc = thaw_kvstate_restore(e->ctx, s->id, &v)) != 0)
        return rc;
    thaw_kvtap_restored(e->tap, s->id, v.state, v.n_state);
    memcpy(s->tokens, v.tokens, (size_t)v.n_tokens * sizeof(llama_token));
    s->n_tokens = v.n_tokens;
    if ((rc = thaw_ckpt_parse(parts[THAW_PART_CKPT].data, parts[THAW_PART_CKPT].size, &s->ckpts)) != 0) {
        slot_clear_kv(e, s);
        return rc;
    }
    if (e->draft && parts[THAW_PART_DFT].size > 0) {
        rc = thaw_draft_restore(e->draft, s->id, parts[THAW_PART_DFT].data, parts[THAW_PART_DFT].size);
        if (rc < 0)
            LOG_WRN("slot %d: draft state unusable (%s): the draft prefills instead", s->id, thaw_strerror(rc));
        else
            s->timings.draft_restored = rc;
    }
    memcpy(s->held_key, t->lookup_key, THAW_KEY_BYTES);
    s->holds_key = true;
    return lcp;
}

/* slot_install through the kvcache's sink */
struct install_ctx {
    struct thaw_engine *e;
    struct thaw_slot *s;
    const struct thaw_task *t;
    int n_past;
};

static int install_cb(void *ud, const struct thaw_part_blob parts[THAW_PART_COUNT])
{
    struct install_ctx *ic = ud;

    return slot_install(ic->e, ic->s, ic->t, parts, ic->n_past);
}

static void undo_cb(void *ud)
{
    struct install_ctx *ic = ud;

    slot_clear_kv(ic->e, ic->s);
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
static int slot_restore(struct thaw_engine *e, struct thaw_slot *s, const struct thaw_task *t, int n_past)
{
    struct install_ctx ic = {e, s, t, n_past};
    const struct thaw_kvcache_sink sink = {install_cb, undo_cb, &ic, s->id};

    int got = n_past;
    if (t->has_lookup_key) {
        if (s->holds_key && memcmp(s->held_key, t->lookup_key, THAW_KEY_BYTES) == 0) {
            /* the slot still holds this conversation: the prefix path serves it */
            count_lookup(e->metrics, "slot");
            return n_past;
        }
        got = thaw_kvcache_lookup(e->kv, t->lookup_key, n_past, &sink, &s->timings.cache_source,
                                  &s->timings.restore_ms);
    }
    if (got <= n_past) /* no entry (a first turn, an edit, a fork): stored blocks may still serve it */
        got = thaw_kvcache_lookup_prefix(e->kv, t->ns, t->prompt, t->n_prompt, got, &sink, &s->timings.cache_source,
                                         &s->timings.restore_ms);
    count_lookup(e->metrics, got > n_past ? s->timings.cache_source : NULL);
    return got;
}

/* The tap as a store's source (blocks.h) for one slot. */
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

/* Serialises the slot's state (and its draft's) and hands it to the RAM
 * tier and the disk writer under s->store_key. Never waits for I/O. */
static void slot_store(struct thaw_engine *e, struct thaw_slot *s)
{
    struct thaw_part_blob parts[THAW_PART_COUNT] = {{NULL, 0}, {NULL, 0}, {NULL, 0}};
    char hex[17];
    int rc;

    if (s->n_tokens < e->cfg->kv_cache_min_tokens || s->n_tokens == 0)
        return;
    thaw_keys_short(s->store_key, hex);
    int64_t t0 = thaw_now_us();
    if (e->partial &&
        (rc = thaw_ckpt_serialize(&s->ckpts, &parts[THAW_PART_CKPT].data, &parts[THAW_PART_CKPT].size)) != 0) {
        LOG_WRN("slot %d: could not capture state for %s: %s", s->id, hex, thaw_strerror(rc));
        return;
    }
    /* the draft catches up with the stored tokens first, so the next turn
     * restores it as far as the target */
    if (e->draft && (thaw_draft_sync(e->draft, s->id, s->tokens, s->n_tokens) < 0 ||
                     thaw_draft_capture(e->draft, s->id, &parts[THAW_PART_DFT].data, &parts[THAW_PART_DFT].size) != 0))
        LOG_WRN("slot %d: draft state not stored with %s: the next turn prefills the draft", s->id, hex);
    const uint8_t *supersedes = s->has_prev_key ? s->prev_key : NULL;
    size_t sizes[THAW_PART_COUNT];
    const char *where = NULL;
    /* the blocks straight from the cache's memory: as much work on a 16k
     * history as on a 2k one (kvtap.h) */
    if (thaw_kvtap_ready(e->tap) && thaw_kvcache_cuts_blocks(e->kv)) {
        if (e->tap_verify)
            (void)thaw_kvtap_verify(e->tap, e->ctx, s->id, s->n_tokens, thaw_kvcache_block_tokens(e->kv));
        struct thaw_blocks_src src = {(uint32_t)s->n_tokens, tap_size, tap_cut, tap_known, &(struct tap_ud){e->tap, s->id},
                                      NULL, 0};
        for (int p = 0; p < THAW_PART_COUNT; p++)
            sizes[p] = parts[p].size;
        where = thaw_kvcache_store_src(e->kv, s->id, s->store_key, s->ns, s->tokens, s->n_tokens, &src, parts,
                                       supersedes);
        atomic_fetch_add(where ? &e->metrics->stores_cut : &e->metrics->stores_captured, 1);
    }
    if (!where) {
        if ((rc = thaw_kvstate_capture_reuse(e->ctx, s->id, s->tokens, s->n_tokens, &e->capture, &e->capture_cap,
                                             &parts[THAW_PART_KV].data, &parts[THAW_PART_KV].size)) != 0) {
            LOG_WRN("slot %d: could not capture state for %s: %s", s->id, hex, thaw_strerror(rc));
            for (int p = 0; p < THAW_PART_COUNT; p++)
                thaw_blob_unref(parts[p].data);
            return;
        }
        for (int p = 0; p < THAW_PART_COUNT; p++)
            sizes[p] = parts[p].size;
        where = thaw_kvcache_store(e->kv, s->id, s->store_key, s->ns, s->n_tokens, parts, supersedes);
    }
    memcpy(s->held_key, s->store_key, THAW_KEY_BYTES);
    s->holds_key = true;
    s->has_prev_key = false;
    int64_t took = thaw_now_us() - t0;
    atomic_fetch_add(&e->metrics->stores, 1);
    atomic_fetch_add(&e->metrics->store_us, (uint64_t)took);
    if (sizes[0])
        LOG_INF("slot %d: stored %s: %d tokens, %.1f MiB state%s%s -> %s in %.1f ms", s->id, hex, s->n_tokens,
                (double)sizes[0] / 1048576.0, sizes[1] ? " + checkpoints" : "", sizes[2] ? " + draft" : "", where,
                (double)took / 1000.0);
    else
        LOG_INF("slot %d: stored %s: %d tokens, blocks cut from the cache%s -> %s in %.1f ms", s->id, hex,
                s->n_tokens, sizes[2] ? " + draft" : "", where, (double)took / 1000.0);
}

/* After a reply (s->store_key derived): the tokens the next turn will
 * present for this conversation. If the slot's tokens differ from them, roll
 * back to the common prefix and enter FIXUP to decode the difference before
 * storing; otherwise store now. */
/* The slot's state is final: it is stored at the next moment no other slot
 * decodes (finish_fixups), like a FIXUP with nothing left to re-decode, so
 * that the capture never delays another request's tokens. */
static void slot_defer_store(struct thaw_engine *e, struct thaw_slot *s)
{
    free(s->fix);
    s->fix = NULL;
    s->n_fix = s->n_tokens;
    s->fix_since_us = thaw_now_us();
    thaw_slot_set_phase(s, THAW_SLOT_FIXUP, e->metrics);
}

static void slot_prepare_store(struct thaw_engine *e, struct thaw_slot *s, const char *reply_json)
{
    const struct thaw_task *t = s->task;
    llama_token *canon = NULL;
    int n_canon = 0;

    if (thaw_chat_canonical(e->chat, &t->req, reply_json, &canon, &n_canon) != 0 || n_canon >= e->n_ctx_slot ||
        thaw_slot_reserve(s, n_canon + 1) != 0) {
        /* no canonical form: store what the slot holds (still a prefix win) */
        free(canon);
        slot_defer_store(e, s);
        return;
    }
    int lcp = thaw_lcp(s->tokens, s->n_tokens, canon, n_canon);
    const struct thaw_ckpt *c;
    int target = rollback_target(e, s, lcp, &c);
    /* Re-decode at most the reply and a little more: when the window has
     * moved past the divergence and no checkpoint reaches back, store the
     * state as generated (its checkpoints still serve the next turn). */
    if ((lcp == s->n_tokens && lcp == n_canon) || n_canon - target > n_canon - t->n_prompt + 64) {
        if (lcp != n_canon)
            LOG_DBG("slot %d: canonical form differs at %d, cannot roll back there: storing as generated", s->id,
                    lcp);
        free(canon);
        slot_defer_store(e, s);
        return;
    }
    int kept = slot_rollback(e, s, lcp);
    LOG_DBG("slot %d: canonical form differs after %d of %d tokens; kept %d, re-decoding %d", s->id, lcp,
            n_canon, kept, n_canon - kept);
    free(s->fix);
    s->fix = canon;
    s->n_fix = n_canon;
    s->fix_since_us = thaw_now_us();
    thaw_slot_set_phase(s, THAW_SLOT_FIXUP, e->metrics); /* stays busy until stored; see build_batch */
}

/* ---- admission ---------------------------------------------------------------- */

/* The request's sampler chain. A grammar (tool calls, response_format)
 * comes first so every later sampler sees only the tokens it allows; a
 * non-lazy one first accepts the generation prompt the template already
 * wrote. NULL when the grammar does not compile (or ENOMEM). */
static struct llama_sampler *make_sampler(const struct thaw_engine *e, const struct thaw_task *t)
{
    const struct thaw_chat_request *req = &t->req;
    const struct thaw_chat_gen *g = &t->gen;
    struct llama_sampler *c = llama_sampler_chain_init(llama_sampler_chain_default_params());

    if (!c)
        return NULL;
    if (g->grammar) {
        struct llama_sampler *gr =
            g->grammar_lazy ? llama_sampler_init_grammar_lazy_patterns(e->vocab, g->grammar, "root",
                                                                      (const char **)g->triggers, (size_t)g->n_triggers,
                                                                      g->trigger_tokens, (size_t)g->n_trigger_tokens)
                            : llama_sampler_init_grammar(e->vocab, g->grammar, "root");
        if (!gr) {
            llama_sampler_free(c);
            return NULL;
        }
        char err[256];
        for (int i = 0; i < g->n_prefill; i++)
            if (thaw_tmpl_sampler_accept(gr, g->prefill[i], err, sizeof err) != 0) {
                LOG_WRN("the template's grammar does not accept its own generation prompt (%s)", err);
                llama_sampler_free(gr);
                llama_sampler_free(c);
                return NULL;
            }
        llama_sampler_chain_add(c, gr);
    }
    if (req->temperature <= 0.0f) {
        llama_sampler_chain_add(c, llama_sampler_init_greedy());
        return c;
    }
    if (req->top_k > 0)
        llama_sampler_chain_add(c, llama_sampler_init_top_k(req->top_k));
    if (req->top_p < 1.0f)
        llama_sampler_chain_add(c, llama_sampler_init_top_p(req->top_p, 1));
    if (req->min_p > 0.0f)
        llama_sampler_chain_add(c, llama_sampler_init_min_p(req->min_p, 1));
    llama_sampler_chain_add(c, llama_sampler_init_temp(req->temperature));
    llama_sampler_chain_add(c, llama_sampler_init_dist(req->has_seed ? req->seed : LLAMA_DEFAULT_SEED));
    return c;
}

static int slot_start(struct thaw_engine *e, struct thaw_slot *s, struct thaw_task *t)
{
    const struct thaw_chat_request *req = &t->req;

    s->task = t;
    thaw_slot_set_phase(s, THAW_SLOT_PREFILL, e->metrics);
    memset(&s->timings, 0, sizeof s->timings);
    s->timings.cache_source = "none";
    s->smpl = make_sampler(e, t);
    if (!s->smpl && t->gen.grammar) {
        slot_fail(e, s, 400, "the grammar for this request's tools or response_format does not compile");
        return THAW_EINVAL;
    }
    if (!s->smpl || thaw_slot_reserve(s, t->n_prompt + 1) != 0) {
        slot_fail(e, s, 500, "out of memory");
        return THAW_ENOMEM;
    }
    s->n_gen = s->n_sent = 0;
    s->n_decoded = 0;
    s->i_batch = -1;
    s->stop_hold = 0;
    for (int i = 0; i < req->n_stop + t->gen.n_stops; i++) {
        size_t l = strlen(i < req->n_stop ? req->stop[i] : t->gen.stops[i - req->n_stop]);
        if (l > 0 && l - 1 > s->stop_hold)
            s->stop_hold = l - 1;
    }
    s->t_start_us = thaw_now_us();

    if (memcmp(s->ns, t->ns, THAW_KEY_BYTES) != 0) {
        slot_clear_kv(e, s); /* another tenant's tokens: never a prefix for this one */
        memcpy(s->ns, t->ns, THAW_KEY_BYTES);
    }
    int n_past = req->cache_prompt ? thaw_lcp(s->tokens, s->n_tokens, t->prompt, t->n_prompt) : 0;
    if (n_past > 0)
        s->timings.cache_source = "slot";
    s->has_prev_key = t->has_lookup_key;
    if (t->has_lookup_key)
        memcpy(s->prev_key, t->lookup_key, THAW_KEY_BYTES);
    if (thaw_kvcache_enabled(e->kv))
        n_past = slot_restore(e, s, t, n_past);
    /* at least one prompt token must be decoded to get logits to sample from */
    if (n_past >= t->n_prompt)
        n_past = t->n_prompt - 1;
    n_past = slot_rollback(e, s, n_past);
    if (s->timings.restore_ms > 0) {
        char hex[17];
        thaw_keys_short(t->lookup_key, hex);
        LOG_INF("slot %d: restored %s from %s in %.1f ms: %d of %d prompt tokens reused%s", s->id, hex,
                s->timings.cache_source, s->timings.restore_ms, n_past, t->n_prompt,
                n_past == 0 ? " (no checkpoint reaches back to where it diverges)" : "");
    }
    if (n_past == 0)
        s->timings.cache_source = "none";
    s->n_prompt_done = n_past;
    s->timings.cache_n = n_past;
    thaw_task_started(t, n_past);
    atomic_fetch_add(&e->metrics->prompt_cached_tokens, (uint64_t)n_past);
    LOG_DBG("slot %d: start, prompt %d tokens, %d reused (%s)", s->id, t->n_prompt, n_past, s->timings.cache_source);
    return 0;
}

/* The FIXUP slot (same tenant) worth taking over for t rather than an
 * idle slot holding `have` tokens of its prompt, or -1: the one holding
 * t's conversation (t is its next turn), else one holding more of the
 * prompt than cutting its FIXUP short costs its own conversation (the
 * tokens it has left to re-decode, which that conversation's next turn
 * then prefills). */
static int fixup_worth_taking(const struct thaw_engine *e, const struct thaw_task *t, int have)
{
    int best = -1, best_gain = 0;

    for (int i = 0; i < e->n_slots; i++) {
        const struct thaw_slot *s = &e->slots[i];
        if (s->phase != THAW_SLOT_FIXUP || memcmp(s->ns, t->ns, THAW_KEY_BYTES) != 0)
            continue;
        if (t->has_lookup_key && memcmp(t->lookup_key, s->store_key, THAW_KEY_BYTES) == 0)
            return i;
        int gain = thaw_lcp(s->tokens, s->n_tokens, t->prompt, t->n_prompt) - have;
        if (gain > s->n_fix - s->n_tokens && gain > best_gain) {
            best_gain = gain;
            best = i;
        }
    }
    return best;
}

/* THAW_TEST_FIXUP_HOLD (testhooks.h): the slot's re-decoding waits for a
 * request that needs the slot, or for shutdown. */
static bool fixup_held(const struct thaw_engine *e, const struct thaw_slot *s)
{
    return thaw_test_hook(THAW_HOOK_FIXUP_HOLD) && s->phase == THAW_SLOT_FIXUP && s->n_tokens < s->n_fix &&
           !e->fixup_awaited && !atomic_load(&e->stop);
}

/* Cuts a slot's post-reply work short for a request that needs the slot
 * (t; NULL at shutdown):
 * its tokens are a prefix of the conversation as the next turn presents
 * it, so that is what is stored (the next turn prefills the rest). Not
 * stored when `t` is that very next turn: it continues on these tokens and
 * stores when it is done. */
static void slot_cut_fixup(struct thaw_engine *e, struct thaw_slot *s, const struct thaw_task *t)
{
    bool next_turn = t && t->has_lookup_key && memcmp(t->lookup_key, s->store_key, THAW_KEY_BYTES) == 0;

    if (t)
        LOG_DBG("slot %d: post-reply work cut short at %d of %d tokens for a waiting request%s", s->id,
                s->n_tokens, s->n_fix, next_turn ? " (its next turn)" : "");
    else
        LOG_WRN("slot %d: shutdown: post-reply work stopped at %d of %d tokens after %d s; storing those", s->id,
                s->n_tokens, s->n_fix, THAW_SHUTDOWN_FIXUP_S);
    atomic_fetch_add(&e->metrics->fixups_cut, 1);
    if (next_turn) {
        memcpy(s->held_key, s->store_key, THAW_KEY_BYTES);
        s->holds_key = true;
    } else {
        slot_store(e, s);
    }
    free(s->fix);
    s->fix = NULL;
    s->n_fix = 0;
    thaw_slot_set_phase(s, THAW_SLOT_IDLE, e->metrics);
}

/* Moves queued tasks into slots. A request never waits for another
 * request's post-reply work (FIXUP): it takes an idle slot, or cuts short
 * the FIXUP of the slot holding more of its prompt (it would prefill those
 * very tokens anyway) or, with no idle slot, of the slot the usual choice
 * picks among the FIXUP ones. `block` waits for a task when no slot is busy
 * (nothing else to do). Returns the number of busy slots. */
static int admit(struct thaw_engine *e, bool block)
{
    struct thaw_slot_view *views = NULL;
    int busy = 0, open = 0, working = 0;

    e->fixup_awaited = false;
    for (int i = 0; i < e->n_slots; i++) {
        busy += e->slots[i].phase != THAW_SLOT_IDLE;
        working += e->slots[i].phase != THAW_SLOT_IDLE && !fixup_held(e, &e->slots[i]);
        open += e->slots[i].phase == THAW_SLOT_IDLE || e->slots[i].phase == THAW_SLOT_FIXUP;
    }
    while (open > 0) {
        struct thaw_task *t = thaw_sched_pop(e->sched, block && working == 0 && !atomic_load(&e->stop));
        if (!t)
            break;
        atomic_store(&e->metrics->queue_depth, thaw_sched_depth(e->sched));
        if (!thaw_task_client_alive(t)) {
            thaw_task_fail(t, 499, "cancelled");
            thaw_task_release(t);
            continue;
        }
        if (!views && !(views = calloc((size_t)e->n_slots, sizeof *views))) {
            thaw_task_fail(t, 500, "out of memory");
            thaw_task_release(t);
            break;
        }
        int pick = -1;
        /* idle slots first; with none idle, the FIXUP ones as if idle */
        for (int pass = 0; pass < 2 && pick < 0; pass++) {
            enum thaw_slot_phase want = pass == 0 ? THAW_SLOT_IDLE : THAW_SLOT_FIXUP;
            for (int i = 0; i < e->n_slots; i++) {
                struct thaw_slot *s = &e->slots[i];
                /* another tenant's prefix is no prefix: it must not be reused,
                 * nor steer the choice (its timing would leak it) */
                bool same_ns = memcmp(s->ns, t->ns, THAW_KEY_BYTES) == 0;
                views[i] = (struct thaw_slot_view){
                    .idle = s->phase == want,
                    .tokens = s->tokens,
                    .n_tokens = same_ns ? s->n_tokens : 0,
                    .last_used_us = s->last_used_us,
                    .holds_key = t->has_lookup_key && s->holds_key &&
                                 memcmp(s->held_key, t->lookup_key, THAW_KEY_BYTES) == 0,
                };
            }
            pick = thaw_sched_pick_slot(views, e->n_slots, t->prompt, t->n_prompt,
                                        t->req.cache_prompt ? e->cfg->slot_prompt_similarity : 0);
        }
        if (pick < 0) { /* cannot happen while open > 0 */
            thaw_sched_unpop(e->sched, t);
            break;
        }
        if (t->req.cache_prompt && e->slots[pick].phase == THAW_SLOT_IDLE) {
            const struct thaw_slot *p = &e->slots[pick];
            int have = memcmp(p->ns, t->ns, THAW_KEY_BYTES) == 0
                           ? thaw_lcp(p->tokens, p->n_tokens, t->prompt, t->n_prompt)
                           : 0;
            int f = fixup_worth_taking(e, t, have);
            if (f >= 0)
                pick = f; /* not a cold slot while a warm one only finishes post-reply work */
        }
        struct thaw_slot *s = &e->slots[pick];
        if (s->phase == THAW_SLOT_FIXUP) {
            /* what is left of it, at what FIXUP tokens cost so far */
            double left_us = (double)(s->n_fix - s->n_tokens) * e->fixup_us_per_tok;
            if (left_us <= 1000.0 * e->cfg->fixup_wait_ms) {
                /* a short wait keeps that conversation's state whole (for
                 * the store, or for its next turn, which then prefills only
                 * its new message): finish it at full speed, then come back */
                thaw_sched_unpop(e->sched, t);
                e->fixup_awaited = true;
                break;
            }
            bool held = fixup_held(e, s);
            slot_cut_fixup(e, s, t);
            busy--;
            working -= !held;
        }
        open--;
        if (slot_start(e, s, t) == 0) {
            busy++;
            working++;
        }
    }
    free(views);
    return busy;
}

/* ---- generation --------------------------------------------------------------- */

/* Hands the task every byte that can no longer change: complete UTF-8, and
 * not a possible beginning of a stop string (unless `final`). */
static void slot_flush_text(struct thaw_slot *s, bool final)
{
    size_t end = s->n_gen;

    if (!final) {
        end = end > s->stop_hold ? end - s->stop_hold : 0;
        end = thaw_utf8_complete_len(s->gen, end);
    }
    if (end > s->n_sent) {
        thaw_task_emit(s->task, s->gen + s->n_sent, end - s->n_sent);
        s->n_sent = end;
    }
}

static void slot_finish(struct thaw_engine *e, struct thaw_slot *s, const char *reason)
{
    int64_t now = thaw_now_us();

    slot_flush_text(s, true);
    if (!s->t_prompt_done_us)
        s->t_prompt_done_us = now;
    s->timings.prompt_n = s->task->n_prompt - s->timings.cache_n;
    s->timings.prompt_ms = (double)(s->t_prompt_done_us - s->t_start_us) / 1000.0 - s->timings.restore_ms;
    s->timings.predicted_n = s->n_decoded;
    s->timings.predicted_ms = (double)(now - s->t_prompt_done_us) / 1000.0;
    atomic_fetch_add(&e->metrics->predicted_tokens, (uint64_t)s->n_decoded);
    atomic_fetch_add(&e->metrics->predicted_us, (uint64_t)(now - s->t_prompt_done_us));
    /* the reply as the message the client gets: content, reasoning, tool
     * calls; its normalised form keys the store, as the client will echo it */
    char *reply = thaw_utf8_sanitize(s->gen ? s->gen : "", s->n_gen);
    char *msg = NULL, *norm = NULL, err[256];
    if (reply && thaw_chat_parse_reply(s->task->gen.parser, reply, false, s->task->id_prefix, &msg, &norm, err,
                                       sizeof err) != 0) {
        LOG_WRN("slot %d: the reply could not be parsed (%s): sent as plain text", s->id, err);
        thaw_chat_parse_reply(NULL, reply, false, s->task->id_prefix, &msg, &norm, err, sizeof err);
    }
    if (msg && strstr(msg, "\"tool_calls\":[") && strcmp(reason, "stop") == 0)
        reason = "tool_calls";
    char *stored_msg = msg ? strdup(msg) : NULL;
    /* The store key, derived now: the next turn may arrive as soon as the
     * client has this reply, before the store below is captured. The cache
     * tiers learn it is coming, so the shared tier does not go looking for
     * a state this replica is about to write itself. */
    bool will_store = thaw_kvcache_enabled(e->kv) && stored_msg && norm;
    if (will_store) {
        thaw_keys_conversation(s->task->binding, s->task->req.messages, s->task->req.n_messages, norm,
                               s->store_key);
        thaw_kvcache_expect(e->kv, s->store_key);
    }
    thaw_task_finish(s->task, reason, &s->timings, msg);
    LOG_INF("slot %d: done (%s): prompt %d (%d cached, %s), %.1f ms; %d generated, %.1f tok/s", s->id, reason,
            s->task->n_prompt, s->timings.cache_n, s->timings.cache_source, s->timings.prompt_ms,
            s->timings.predicted_n,
            s->timings.predicted_ms > 0 ? s->timings.predicted_n * 1000.0 / s->timings.predicted_ms : 0.0);
    /* a verified draft may have left positions past the finish in the KV */
    slot_kv_rm(e, s, s->n_tokens);
    if (will_store)
        slot_prepare_store(e, s, stored_msg);
    free(stored_msg);
    free(norm);
    free(reply);
    slot_release_task(e, s);
}

/* Earliest occurrence of any stop string that ends at or after `from`. */
static const char *find_stop(const struct thaw_slot *s, size_t from)
{
    const struct thaw_task *t = s->task;
    const char *best = NULL;

    for (int i = 0; i < t->req.n_stop + t->gen.n_stops; i++) {
        const char *stop = i < t->req.n_stop ? t->req.stop[i] : t->gen.stops[i - t->req.n_stop];
        size_t l = strlen(stop);
        size_t start = from >= l ? from - l + 1 : 0;
        const char *hit = memmem(s->gen + start, s->n_gen - start, stop, l);
        if (hit && (!best || hit < best))
            best = hit;
    }
    return best;
}

/* Takes one sampled token: text out, stop conditions, next decode. */
static void slot_take_token(struct thaw_engine *e, struct thaw_slot *s, llama_token tok)
{
    const struct thaw_task *t = s->task;
    char piece[256];
    int n;

    s->n_decoded++;
    if (llama_vocab_is_eog(e->vocab, tok)) {
        slot_finish(e, s, "stop");
        return;
    }
    bool special = false; /* the template's own markers (<tool_call>, <think>) stay in the text the parser reads */
    for (int i = 0; i < t->gen.n_preserved && !special; i++)
        special = t->gen.preserved[i] == tok;
    n = llama_token_to_piece(e->vocab, tok, piece, sizeof piece, 0, special);
    if (n < 0)
        n = 0; /* a piece longer than 256 bytes: no real vocab has one */
    size_t before = s->n_gen;
    if (thaw_slot_gen_append(s, piece, (size_t)n) != 0) {
        slot_fail(e, s, 500, "out of memory");
        return;
    }
    if (t->req.n_stop + t->gen.n_stops > 0) {
        const char *hit = find_stop(s, before);
        if (hit) {
            s->n_gen = (size_t)(hit - s->gen);
            s->gen[s->n_gen] = '\0';
            slot_finish(e, s, "stop");
            return;
        }
    }
    if (s->n_decoded >= t->max_tokens || s->n_tokens + 1 >= e->n_ctx_slot) {
        slot_finish(e, s, "length");
        return;
    }
    slot_flush_text(s, false);
    s->next_token = tok;
    if (s->phase != THAW_SLOT_GEN)
        thaw_slot_set_phase(s, THAW_SLOT_GEN, e->metrics);
}

/* ---- the loop ------------------------------------------------------------------ */

static void batch_add(struct llama_batch *b, llama_token tok, llama_pos pos, llama_seq_id seq, bool logits)
{
    int i = b->n_tokens++;

    b->token[i] = tok;
    b->pos[i] = pos;
    b->n_seq_id[i] = 1;
    b->seq_id[i][0] = seq;
    b->logits[i] = logits;
}

/* Asks the draft for up to `room` tokens after the slot's next token. */
static int slot_draft(struct thaw_engine *e, struct thaw_slot *s, int room)
{
    const struct thaw_config *cfg = e->cfg;
    int max = cfg->draft_max;

    if (max > room)
        max = room;
    if (max > s->task->max_tokens - s->n_decoded - 1)
        max = s->task->max_tokens - s->n_decoded - 1;
    if (max > e->n_ctx_slot - s->n_tokens - 2)
        max = e->n_ctx_slot - s->n_tokens - 2;
    if (max < 1 || max < cfg->draft_min)
        return 0;
    if (thaw_draft_sync(e->draft, s->id, s->tokens, s->n_tokens) < 0)
        return 0;
    int n = thaw_draft_propose(e->draft, s->id, s->next_token, max, cfg->draft_p_min, s->drafts);
    return n >= cfg->draft_min ? n : 0;
}

/* The target's verdict on a draft: sample at every drafted position with
 * the request's own sampler (so each emitted token is the target's), keep
 * the drafts that match, emit the samples, roll the rest back. */
static void slot_verify(struct thaw_engine *e, struct thaw_slot *s)
{
    llama_token emitted[THAW_DRAFT_MAX + 1];
    int base = s->n_tokens, n_emit = 0;

    char err[256];
    for (int i = 0; i <= s->n_drafts; i++) {
        if (thaw_tmpl_sampler_sample(s->smpl, e->ctx, s->i_batch + i, &emitted[n_emit], err, sizeof err) != 0) {
            LOG_WRN("slot %d: %s", s->id, err);
            slot_fail(e, s, 500, err);
            return;
        }
        n_emit++;
        if (i == s->n_drafts || emitted[i] != s->drafts[i])
            break;
    }
    int accepted = n_emit - 1;
    s->timings.draft_n += s->n_drafts;
    s->timings.draft_n_accepted += accepted;
    atomic_fetch_add(&e->metrics->draft_tokens, (uint64_t)s->n_drafts);
    atomic_fetch_add(&e->metrics->draft_accepted, (uint64_t)accepted);
    /* the KV holds next_token and every draft: keep next_token + accepted */
    slot_kv_rm(e, s, base + 1 + accepted);
    s->tokens[base] = s->next_token;
    memcpy(s->tokens + base + 1, s->drafts, (size_t)accepted * sizeof(llama_token));
    s->n_drafts = 0;
    for (int i = 0; i < n_emit; i++) {
        s->n_tokens = base + 1 + i;
        slot_take_token(e, s, emitted[i]);
        if (s->phase != THAW_SLOT_GEN)
            break;
    }
}

/* Fills e->batch: first the next token of every generating slot (so
 * generation never waits behind a long prompt), then prompt tokens, then
 * FIXUP tokens (nobody waits for those). */
static void build_batch(struct thaw_engine *e)
{
    struct llama_batch *b = &e->batch;

    b->n_tokens = 0;
    for (int i = 0; i < e->n_slots; i++) {
        struct thaw_slot *s = &e->slots[i];
        s->i_batch = -1;
        s->n_in_batch = 0;
        if (s->phase != THAW_SLOT_GEN)
            continue;
        s->n_drafts = e->draft ? slot_draft(e, s, e->n_batch - b->n_tokens - 1) : 0;
        s->i_batch = b->n_tokens;
        batch_add(b, s->next_token, s->n_tokens, s->id, true);
        for (int k = 0; k < s->n_drafts; k++)
            batch_add(b, s->drafts[k], s->n_tokens + 1 + k, s->id, true);
        s->n_in_batch = 1 + s->n_drafts;
    }
    for (int i = 0; i < e->n_slots && b->n_tokens < e->n_batch; i++) {
        struct thaw_slot *s = &e->slots[i];
        if (s->phase != THAW_SLOT_PREFILL)
            continue;
        const struct thaw_task *t = s->task;
        while (s->n_prompt_done + s->n_in_batch < t->n_prompt && b->n_tokens < e->n_batch) {
            int p = s->n_prompt_done + s->n_in_batch;
            bool last = p == t->n_prompt - 1;
            if (last)
                s->i_batch = b->n_tokens;
            batch_add(b, t->prompt[p], p, s->id, last);
            s->n_in_batch++;
        }
    }
    /* FIXUP is post-reply work nobody waits for: it must not slow a
     * request that is. A request that needs its slot cuts it short
     * (admit). Alone, it goes in slices of about THAW_FIXUP_SLICE_US, so a
     * request arriving meanwhile waits one slice at most. Beside a prompt
     * or a generation step it waits: on a CPU a batch's cost grows with
     * its tokens (measured: 20 re-decoded tokens batched with a 9-token
     * prompt made that prompt take 1.6 s instead of ~0.3; 2 riding along
     * each generation step halved its speed). After THAW_FIXUP_DEFER_US
     * of waiting a few ride along generation steps, so a busy server still
     * stores within seconds. */
    int prefilling = 0, generating = 0, fixup_tokens = 0;
    for (int i = 0; i < e->n_slots; i++) {
        prefilling += e->slots[i].phase == THAW_SLOT_PREFILL;
        generating += e->slots[i].phase == THAW_SLOT_GEN;
    }
    bool alone = !prefilling && !generating;
    int fixup_room = e->fixup_awaited ? e->n_batch
                     : alone          ? fixup_slice(e)
                     : prefilling     ? 0
                                      : THAW_FIXUP_PIGGYBACK;
    int64_t now = thaw_now_us();
    for (int i = 0; i < e->n_slots && b->n_tokens < e->n_batch && fixup_room > 0; i++) {
        struct thaw_slot *s = &e->slots[i];
        if (s->phase != THAW_SLOT_FIXUP || fixup_held(e, s) ||
            (!alone && !e->fixup_awaited && now - s->fix_since_us < THAW_FIXUP_DEFER_US))
            continue;
        while (s->n_tokens + s->n_in_batch < s->n_fix && b->n_tokens < e->n_batch && fixup_room-- > 0) {
            int p = s->n_tokens + s->n_in_batch;
            batch_add(b, s->fix[p], p, s->id, false);
            s->n_in_batch++;
            fixup_tokens++;
        }
    }
    e->batch_fixup_only = fixup_tokens > 0 && fixup_tokens == b->n_tokens;
}

/* No slot prefilling or generating: post-reply work slows nobody. */
static bool engine_alone(const struct thaw_engine *e)
{
    for (int i = 0; i < e->n_slots; i++)
        if (e->slots[i].phase == THAW_SLOT_PREFILL || e->slots[i].phase == THAW_SLOT_GEN)
            return false;
    return true;
}

/* FIXUP slots whose canonical tokens are all in: store, and free the slot.
 * The capture waits, as the re-decoding does, for a moment when no other
 * slot decodes (or THAW_FIXUP_DEFER_US, or `force` at shutdown): its cost
 * grows with the conversation (libllama captures a sequence only whole). */
static void finish_fixups(struct thaw_engine *e, bool force)
{
    bool alone = force || e->fixup_awaited || engine_alone(e);
    int64_t now = thaw_now_us();

    for (int i = 0; i < e->n_slots; i++) {
        struct thaw_slot *s = &e->slots[i];
        if (s->phase != THAW_SLOT_FIXUP || s->n_tokens < s->n_fix)
            continue;
        if (!alone && now - s->fix_since_us < THAW_FIXUP_DEFER_US)
            continue;
        slot_store(e, s);
        free(s->fix);
        s->fix = NULL;
        s->n_fix = 0;
        thaw_slot_set_phase(s, THAW_SLOT_IDLE, e->metrics);
    }
}

/* After a successful decode: record what each slot's KV now holds, sample. */
static void after_decode(struct thaw_engine *e, int64_t t0, int64_t t1)
{
    int n_prompt_tokens = 0;

    for (int i = 0; i < e->n_slots; i++) {
        struct thaw_slot *s = &e->slots[i];
        if (s->n_in_batch == 0)
            continue;
        if (s->phase == THAW_SLOT_GEN) {
            if (s->n_drafts == 0)
                s->tokens[s->n_tokens++] = s->next_token;
            /* else: slot_verify decides how many of the batch's tokens stay */
        } else if (s->phase == THAW_SLOT_FIXUP) {
            memcpy(s->tokens + s->n_tokens, s->fix + s->n_tokens, (size_t)s->n_in_batch * sizeof(llama_token));
            s->n_tokens += s->n_in_batch;
        } else {
            memcpy(s->tokens + s->n_tokens, s->task->prompt + s->n_prompt_done,
                   (size_t)s->n_in_batch * sizeof(llama_token));
            s->n_tokens += s->n_in_batch;
            s->n_prompt_done += s->n_in_batch;
            n_prompt_tokens += s->n_in_batch;
        }
    }
    atomic_fetch_add(&e->metrics->prompt_tokens, (uint64_t)n_prompt_tokens);
    if (n_prompt_tokens > 0)
        atomic_fetch_add(&e->metrics->prompt_us, (uint64_t)(t1 - t0));
    if (e->batch_fixup_only && t1 > t0 && e->batch.n_tokens > 0) {
        double per = (double)(t1 - t0) / e->batch.n_tokens;
        e->fixup_us_per_tok = e->fixup_us_per_tok > 0 ? 0.7 * e->fixup_us_per_tok + 0.3 * per : per;
    }
    finish_fixups(e, false);

    for (int i = 0; i < e->n_slots; i++) {
        struct thaw_slot *s = &e->slots[i];
        if (!s->task || s->i_batch < 0)
            continue;
        if (s->phase == THAW_SLOT_PREFILL) {
            s->t_prompt_done_us = thaw_now_us();
            if (thaw_slot_reserve(s, s->n_tokens + s->task->max_tokens + 1) != 0) {
                slot_fail(e, s, 500, "out of memory");
                continue;
            }
            /* the prompt's end is where the next turn will most likely need
             * to roll back to on SWA / recurrent memory: keep a checkpoint */
            if (e->partial && e->cfg->ctx_checkpoints > 0 &&
                thaw_ckpt_take(&s->ckpts, e->ctx, s->id, s->n_tokens, e->cfg->ctx_checkpoints) != 0)
                LOG_WRN("slot %d: could not take a context checkpoint", s->id);
        }
        if (s->phase == THAW_SLOT_GEN && s->n_drafts > 0) {
            slot_verify(e, s);
            continue;
        }
        llama_token tok;
        char err[256];
        if (thaw_tmpl_sampler_sample(s->smpl, e->ctx, s->i_batch, &tok, err, sizeof err) != 0) {
            /* a grammar at a dead end: this request fails, the server lives */
            LOG_WRN("slot %d: %s", s->id, err);
            slot_fail(e, s, 500, err);
            continue;
        }
        slot_take_token(e, s, tok);
    }
}

static void fail_batch(struct thaw_engine *e, int rc)
{
    char msg[96];

    snprintf(msg, sizeof msg, "llama_decode failed (%d)", rc);
    LOG_ERR("%s: failing the requests in this batch", msg);
    for (int i = 0; i < e->n_slots; i++) {
        struct thaw_slot *s = &e->slots[i];
        if (s->n_in_batch > 0)
            slot_fail(e, s, 500, msg);
    }
}

/* At shutdown: every FIXUP slot's re-decoding is finished and stored (the
 * replies are out; these states are what the next turns want from disk).
 * Nobody waits for a decode any more, so in full batches; bounded: what is
 * not done after THAW_SHUTDOWN_FIXUP_S is stored as far as it got, as when
 * a request cuts the work short. */
static void drain_fixups(struct thaw_engine *e)
{
    int64_t deadline = thaw_now_us() + THAW_SHUTDOWN_FIXUP_S * (int64_t)1000000;

    e->fixup_awaited = true;
    while (thaw_now_us() < deadline) {
        build_batch(e);
        if (e->batch.n_tokens == 0)
            break;
        if (llama_decode(e->ctx, e->batch) != 0) {
            fail_batch(e, -1);
            break;
        }
        after_decode(e, 0, 0);
    }
    finish_fixups(e, true);
    for (int i = 0; i < e->n_slots; i++)
        if (e->slots[i].phase == THAW_SLOT_FIXUP)
            slot_cut_fixup(e, &e->slots[i], NULL);
}

static void *engine_main(void *arg)
{
    struct thaw_engine *e = arg;

    while (!atomic_load(&e->stop)) {
        /* cancelled requests (client gone) free their slot first */
        for (int i = 0; i < e->n_slots; i++) {
            struct thaw_slot *s = &e->slots[i];
            if (s->task && !thaw_task_client_alive(s->task)) {
                LOG_INF("slot %d: client went away, request cancelled", s->id);
                thaw_task_fail(s->task, 499, "cancelled");
                slot_release_task(e, s);
            }
        }
        if (admit(e, true) == 0)
            continue;
        build_batch(e);
        if (e->batch.n_tokens == 0) {
            finish_fixups(e, true); /* nothing decodes */
            continue;
        }
        int64_t t0 = thaw_now_us();
        int rc = llama_decode(e->ctx, e->batch);
        int64_t t1 = thaw_now_us();
        atomic_fetch_add(&e->metrics->decode_calls, 1);
        if (rc != 0) {
            fail_batch(e, rc);
            continue;
        }
        after_decode(e, t0, t1);
    }
    for (int i = 0; i < e->n_slots; i++) {
        struct thaw_slot *s = &e->slots[i];
        if (s->task) {
            thaw_task_fail(s->task, 503, "the server is shutting down");
            slot_release_task(e, s);
        }
    }
    drain_fixups(e);
    return NULL;
}

/* A task that waited for the shared tier's fetch: on to the queue now
 * (from the fetch thread). */
struct fetch_wait {
    struct thaw_engine *e;
    struct thaw_task *t;
};

static void shared_fetched(void *ud)
{
    struct fetch_wait *w = ud;
    int rc = thaw_sched_push(w->e->sched, w->t);

    if (rc == 0)
        atomic_store(&w->e->metrics->queue_depth, thaw_sched_depth(w->e->sched));
    else
        thaw_task_fail(w->t, 503,
                       rc == THAW_ESHUTDOWN ? "the server is shutting down"
                                            : "the server is busy: every slot is working and the queue is full; retry later");
    thaw_task_release(w->t);
    free(w);
}

int thaw_engine_submit(struct thaw_engine *e, struct thaw_task *t)
{
    uint8_t key[THAW_KEY_BYTES];
    bool has_key = t->has_lookup_key;
    int rc;

    if (t->n_prompt < 1 || t->n_prompt >= e->n_ctx_slot)
        return THAW_ECTXFULL;
    /* never more than the slot can hold after the prompt: every size the
     * engine derives from max_tokens stays within the slot's context */
    if (t->max_tokens <= 0 || t->max_tokens > e->n_ctx_slot - t->n_prompt)
        t->max_tokens = e->n_ctx_slot - t->n_prompt;
    if (has_key)
        memcpy(key, t->lookup_key, THAW_KEY_BYTES);
    /* What the local tiers lack may be in the shared tier: the task waits
     * for that fetch on a fetch thread (never this one, never the engine's),
     * which queues it afterwards. */
    if (t->req.cache_prompt && thaw_kvcache_enabled(e->kv) && !atomic_load(&e->stop)) {
        struct fetch_wait *w = malloc(sizeof *w);
        if (w) {
            *w = (struct fetch_wait){e, t};
            thaw_task_retain(t);
            if (thaw_kvcache_fetch_shared(e->kv, has_key ? key : NULL, t->ns, t->prompt, t->n_prompt, shared_fetched,
                                          w) == 0)
                return 0;
            thaw_task_release(t);
            free(w);
        }
    }
    rc = thaw_sched_push(e->sched, t);
    if (rc == 0)
        atomic_store(&e->metrics->queue_depth, thaw_sched_depth(e->sched));
    /* Start the disk reads now: while the task waits for a slot (or the
     * engine finishes a step), the kernel brings the entry into memory.
     * Harmless when a slot or the RAM tier serves it instead. */
    if (rc == 0 && has_key)
        thaw_kvcache_prefetch(e->kv, key);
    return rc;
}

/* ---- lifecycle ------------------------------------------------------------------ */

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

/* Logs 25/50/75% of a model load, only once it has taken over a second. */
static bool load_progress(float p, void *ud)
{
    int64_t *t0 = ud; /* [0] start, [1] next quarter to log */
    int quarter = (int)(p * 4);

    if (quarter >= 1 && quarter <= 3 && quarter >= t0[1] && thaw_now_us() - t0[0] > 1000000) {
        LOG_INF("loading model: %d%%", quarter * 25);
        t0[1] = quarter + 1;
    }
    return true;
}

/* Admission's bound (thaw_api_admit): the longest text of any token,
 * special ones included (a prompt may spell them out). */
static int max_token_bytes(const struct llama_vocab *vocab)
{
    char piece[8];
    int best = 1;

    for (llama_token t = 0; t < llama_vocab_n_tokens(vocab); t++) {
        int n = llama_token_to_piece(vocab, t, piece, sizeof piece, 0, true);
        if (n < 0)
            n = -n; /* the size it needs */
        if (n > best)
            best = n;
    }
    return best;
}

int thaw_engine_new(const struct thaw_config *cfg, struct thaw_metrics *metrics, struct thaw_engine **out)
{
    struct thaw_engine *e = calloc(1, sizeof *e);
    int rc = 0;
    int64_t t0 = thaw_now_us();
    int64_t progress[2] = {t0, 1};

    if (!e)
        return THAW_ENOMEM;
    e->cfg = cfg;
    e->metrics = metrics;

    llama_log_set(llama_log_cb, NULL);
    llama_backend_init();
    const char *bdir = cfg->backend_dir ? cfg->backend_dir : getenv("THAW_BACKEND_DIR");
    if (bdir && *bdir)
        LOG_INF("backends from %s (--backend-dir)", bdir);
    ggml_backend_load_all_from_path(bdir && *bdir ? bdir : THAW_LLAMA_LIB_DIR);

    if ((rc = thaw_fingerprint_file(cfg->model_path, e->fingerprint)) != 0) {
        LOG_ERR("cannot read model %s: %s", cfg->model_path, thaw_strerror(rc));
        goto error;
    }
    struct llama_model_params mp = llama_model_default_params();
    mp.progress_callback = load_progress;
    mp.progress_callback_user_data = progress;
    e->model = llama_model_load_from_file(cfg->model_path, mp);
    if (!e->model) {
        LOG_ERR("llama.cpp could not load %s (not a model GGUF, or an unsupported architecture)", cfg->model_path);
        rc = THAW_ELLAMA;
        goto error;
    }
    e->vocab = llama_model_get_vocab(e->model);
    e->max_token_bytes = max_token_bytes(e->vocab);

    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)cfg->n_ctx;
    cp.n_batch = (uint32_t)cfg->n_batch;
    cp.n_ubatch = (uint32_t)cfg->n_ubatch;
    cp.n_seq_max = (uint32_t)cfg->n_parallel;
    cp.n_threads = cfg->n_threads;
    cp.n_threads_batch = cfg->n_threads_batch;
    cp.kv_unified = false; /* each slot its own cells: a slot's state is its own to save and restore */
    cp.swa_full = cfg->swa_full;
    cp.no_perf = true;
    /* the tap watches the graphs for where the KV cache's cells are
     * (kvtap.h): host memory only, so not with a GPU device */
    bool gpu = false; /* BLAS / AMX accelerators work beside the CPU backend: the cache stays in host memory */
    for (size_t i = 0; i < ggml_backend_dev_count(); i++) {
        enum ggml_backend_dev_type ty = ggml_backend_dev_type(ggml_backend_dev_get(i));
        gpu |= ty != GGML_BACKEND_DEVICE_TYPE_CPU && ty != GGML_BACKEND_DEVICE_TYPE_ACCEL;
    }
    if (cfg->kv_cache_dir && !gpu && cfg->kv_tap) {
        if ((rc = thaw_kvtap_new(&e->tap)) != 0)
            goto error;
        cp.cb_eval = thaw_kvtap_eval_cb;
        cp.cb_eval_user_data = e->tap;
        e->tap_verify = thaw_test_hook(THAW_HOOK_KVTAP_VERIFY) != 0;
    }
    e->ctx = llama_init_from_model(e->model, cp);
    if (!e->ctx) {
        LOG_ERR("llama.cpp could not create a context (-c %d, -np %d): too little memory?", cfg->n_ctx,
                cfg->n_parallel);
        rc = THAW_ELLAMA;
        goto error;
    }
    e->n_ctx_slot = (int)llama_n_ctx_seq(e->ctx);
    e->n_batch = (int)llama_n_batch(e->ctx);
    e->n_swa = cfg->swa_full ? 0 : llama_model_n_swa(e->model);
    e->recurrent = llama_model_is_recurrent(e->model) || llama_model_is_hybrid(e->model);
    e->partial = e->n_swa > 0 || e->recurrent;
    if (e->partial && cfg->ctx_checkpoints == 0)
        LOG_WRN("%s model with --ctx-checkpoints 0: a returning conversation can only reuse its prefix when it "
                "matches exactly", e->recurrent ? "recurrent" : "sliding-window");
    /* Not the context size nor the slot count: a stored state restores
     * into any slot with room for its cells (blocks take the restoring
     * slot's frame; a whole state that does not fit fails to load and is
     * served by prefill), so changing -c or -np keeps the cache. */
    snprintf(e->settings, sizeof e->settings, "swa_full=%d;type_k=%d;type_v=%d;tmpl=", (int)cp.swa_full,
             (int)cp.type_k, (int)cp.type_v);

    struct thaw_chat_params chp = {cfg->chat_template, cfg->jinja, cfg->chat_template_kwargs, cfg->reasoning_format};
    if ((rc = thaw_chat_new(e->model, &chp, &e->chat)) != 0)
        goto error;
    /* the template, its server-wide kwargs and the renderer shape the
     * tokens a key stands for: bind them too */
    {
        uint8_t th[16];
        char hex[33];
        crypto_generichash_state hs;
        crypto_generichash_init(&hs, NULL, 0, sizeof th);
        crypto_generichash_update(&hs, (const unsigned char *)thaw_chat_template(e->chat),
                                  strlen(thaw_chat_template(e->chat)) + 1);
        const char *renderer = cfg->jinja ? "jinja" : "builtin";
        crypto_generichash_update(&hs, (const unsigned char *)renderer, strlen(renderer) + 1);
        if (cfg->chat_template_kwargs)
            crypto_generichash_update(&hs, (const unsigned char *)cfg->chat_template_kwargs,
                                      strlen(cfg->chat_template_kwargs));
        crypto_generichash_final(&hs, th, sizeof th);
        for (int i = 0; i < 16; i++)
            snprintf(hex + 2 * i, 3, "%02x", th[i]);
        strncat(e->settings, hex, sizeof e->settings - strlen(e->settings) - 1);
    }

    if (cfg->alias) {
        e->model_name = strdup(cfg->alias);
    } else {
        const char *slash = strrchr(cfg->model_path, '/');
        e->model_name = strdup(slash ? slash + 1 : cfg->model_path);
    }
    e->n_slots = cfg->n_parallel;
    e->slots = calloc((size_t)e->n_slots, sizeof *e->slots);
    e->batch = llama_batch_init(e->n_batch, 0, 1);
    if (!e->model_name || !e->slots || !e->batch.token) {
        rc = THAW_ENOMEM;
        goto error;
    }
    for (int i = 0; i < e->n_slots; i++)
        thaw_slot_init(&e->slots[i], i);
    metrics->slots_total = e->n_slots;
    metrics->ram_budget_bytes = cfg->cache_ram_mib << 20;
    metrics->disk_budget_bytes = cfg->kv_cache_dir ? cfg->kv_cache_max_mib << 20 : 0;
    if ((rc = thaw_sched_new(cfg->max_queue, &e->sched)) != 0)
        goto error;
    thaw_keys_binding(e->fingerprint, e->settings, NULL, e->identity);
    struct thaw_kvcache_params kp = {
        .ram_bytes = cfg->cache_ram_mib << 20,
        .disk_dir = cfg->kv_cache_dir,
        .disk_max_bytes = cfg->kv_cache_max_mib << 20,
        .disk_queue_bytes = cfg->kv_cache_queue_mib << 20,
        .ttl_s = (int64_t)cfg->kv_cache_ttl_s,
        .min_tokens = cfg->kv_cache_min_tokens,
        .metrics = metrics,
        .block_tokens = cfg->kv_cache_dir ? (uint32_t)cfg->kv_cache_block : 0,
        .prefix_lookup = !e->partial, /* an SWA window or a recurrent state is no run of blocks */
        .n_stream = (uint32_t)llama_n_seq_max(e->ctx),
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
        int lrc = thaw_kvlayout_selftest(e->ctx, 0, why, sizeof why);
        if (lrc != 0) {
            LOG_INF("kv-cache: whole states, not blocks: %s", lrc == THAW_ELAYOUT ? why : thaw_strerror(lrc));
            kp.block_tokens = 0;
        }
    }
    if (e->tap) {
        char why[200] = "";
        int trc = kp.block_tokens && !e->partial ? thaw_kvtap_selftest(e->tap, e->ctx, 0, why, sizeof why) : THAW_ELAYOUT;
        if (trc == 0)
            LOG_INF("kv-cache: stores cut their new blocks straight from the KV cache");
        else if (kp.block_tokens)
            LOG_INF("kv-cache: stores capture whole states: %s", why[0] ? why : thaw_strerror(trc));
    }
    memcpy(kp.identity, e->identity, THAW_KEY_BYTES);
    if ((rc = thaw_kvcache_open(&kp, &e->kv)) != 0)
        goto error;
    if (cfg->draft_path && cfg->draft_max > 0) {
        if (e->recurrent) {
            LOG_ERR("speculative decoding needs a target that can roll back rejected drafts; %s is recurrent",
                    cfg->model_path);
            rc = THAW_EINVAL;
            goto error;
        }
        if ((rc = thaw_draft_new(cfg, e->model, e->n_slots, &e->draft)) != 0)
            goto error;
        for (int i = 0; i < e->n_slots; i++)
            if (!(e->slots[i].drafts = malloc((size_t)(cfg->draft_max + 1) * sizeof(llama_token)))) {
                rc = THAW_ENOMEM;
                goto error;
            }
    }

    char desc[128];
    llama_model_desc(e->model, desc, sizeof desc);
    LOG_INF("model %s: %s, %.1fM params, %d slots x %d tokens%s, loaded in %.0f ms", e->model_name, desc,
            (double)llama_model_n_params(e->model) / 1e6, e->n_slots, e->n_ctx_slot,
            e->n_swa ? " (sliding window)" : "", (double)(thaw_now_us() - t0) / 1000.0);

    atomic_init(&e->stop, false);
    if ((rc = -pthread_create(&e->thread, NULL, engine_main, e)) != 0)
        goto error;
    *out = e;
    return 0;

error:
    if (e->slots)
        for (int i = 0; i < e->n_slots; i++)
            thaw_slot_free(&e->slots[i]);
    thaw_draft_free(e->draft);
    thaw_kvcache_close(e->kv);
    thaw_sched_free(e->sched);
    if (e->batch.token)
        llama_batch_free(e->batch);
    free(e->slots);
    free(e->model_name);
    thaw_chat_free(e->chat);
    if (e->ctx)
        llama_free(e->ctx);
    thaw_kvtap_free(e->tap); /* after the context that calls it */
    if (e->model)
        llama_model_free(e->model);
    free(e);
    return rc;
}

void thaw_engine_stop(struct thaw_engine *e)
{
    struct thaw_task *t;

    if (atomic_exchange(&e->stop, true))
        return;
    thaw_sched_close(e->sched);
    pthread_join(e->thread, NULL);
    thaw_kvcache_stop_fetches(e->kv); /* their tasks fail against the closed queue */
    while ((t = thaw_sched_pop(e->sched, false)) != NULL) {
        thaw_task_fail(t, 503, "the server is shutting down");
        thaw_task_release(t);
    }
}

void thaw_engine_free(struct thaw_engine *e)
{
    if (!e)
        return;
    thaw_engine_stop(e);
    thaw_sched_free(e->sched);
    thaw_kvcache_close(e->kv); /* writes what is still queued */
    thaw_blob_unref(e->capture);
    for (int i = 0; i < e->n_slots; i++)
        thaw_slot_free(&e->slots[i]);
    thaw_draft_free(e->draft);
    free(e->slots);
    llama_batch_free(e->batch);
    thaw_chat_free(e->chat);
    free(e->model_name);
    llama_free(e->ctx);
    thaw_kvtap_free(e->tap);
    llama_model_free(e->model);
    llama_backend_free();
    free(e);
}

const struct thaw_chat *thaw_engine_chat(const struct thaw_engine *e) { return e->chat; }
const char *thaw_engine_model_name(const struct thaw_engine *e) { return e->model_name; }
int thaw_engine_n_ctx_slot(const struct thaw_engine *e) { return e->n_ctx_slot; }
int thaw_engine_max_token_bytes(const struct thaw_engine *e) { return e->max_token_bytes; }
int thaw_engine_n_ctx_train(const struct thaw_engine *e) { return llama_model_n_ctx_train(e->model); }
uint64_t thaw_engine_n_params(const struct thaw_engine *e) { return llama_model_n_params(e->model); }

void thaw_engine_binding(const struct thaw_engine *e, const uint8_t namespace_id[THAW_KEY_BYTES],
                         uint8_t out[THAW_KEY_BYTES])
{
    thaw_keys_binding(e->fingerprint, e->settings, namespace_id, out);
}

void thaw_engine_metrics(void *ud, char *buf, size_t cap, size_t *len)
{
    struct thaw_engine *e = ud;

    thaw_kvcache_metrics(e->kv, buf, cap, len);
}
