/* generate.c — a reply's tokens, one at a time: each sampled token's text
 * streamed out, the stop conditions (end of generation, stop strings,
 * max_tokens, the slot's context), the reply's end (parsed into the message
 * the client gets, its store key derived, FIXUP entered), and speculative
 * decoding's two halves (ask the draft, verify with the target's sampler).
 * Engine thread only; engine_state.h is the state it shares with engine.c. */
#include "engine/engine_state.h"

#include "api/template.h"
#include "base/error.h"
#include "base/log.h"
#include "base/utf8.h" /* thaw_utf8_sanitize */
#include "engine/draft.h"
#include "engine/ngram.h"
#include "engine/prepare.h"
#include "engine/sampler.h"
#include "engine/slotkv.h"
#include "llama/vision.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

/* After a reply (s->store_key derived): the slot enters FIXUP with the
 * tokens the next turn will present for this conversation, or with what it
 * holds when there is no canonical form (still a prefix win); slotkv.h. */
static void slot_prepare_store(struct thaw_engine *e, struct thaw_slot *s, const char *reply_json)
{
    llama_token *canon = NULL;
    int n_canon = 0;

    /* with images, the prompt's own tokens up to its last image, the
     * canonical text after it (chat.h) */
    const struct thaw_task *t = s->task;
    int rc = t->vision ? thaw_chat_canonical_spliced(e->chat, &t->req, reply_json, t->vision_text, thaw_vision_marker(),
                                                     t->prompt, t->n_prompt, &canon, &n_canon)
                       : thaw_chat_canonical(e->chat, &t->req, reply_json, &canon, &n_canon);
    if (rc != 0 || n_canon >= e->n_ctx_slot || thaw_slot_reserve(s, n_canon + 1) != 0) {
        if (rc != 0 && t->vision)
            LOG_DBG("slot %d: no canonical form of this image turn (%s): stored as generated", s->id,
                    thaw_strerror(rc));
        free(canon);
        canon = NULL;
    }
    thaw_slotkv_prepare_store(e->skv, s, canon, n_canon);
}

static void spec_settle(struct thaw_engine *e, struct thaw_slot *s);

static void slot_finish(struct thaw_engine *e, struct thaw_slot *s, const char *reason)
{
    int64_t now = thaw_now_us();

    thaw_slot_flush_text(s, true);
    thaw_slot_finish_timings(s, now);
    atomic_fetch_add(&e->metrics->predicted_tokens, (uint64_t)s->n_decoded);
    atomic_fetch_add(&e->metrics->predicted_steps, (uint64_t)(s->n_decoded > 0 ? s->n_decoded - 1 : 0));
    atomic_fetch_add(&e->metrics->predicted_us, (uint64_t)(now - s->t_prompt_done_us));
    /* the reply as the message the client gets: content, reasoning, tool
     * calls; its normalised form keys the store, as the client will echo it */
    char *reply = thaw_utf8_sanitize(s->gen.data ? s->gen.data : "", s->gen.len);
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
    s->n_retain = 0;
    if (will_store) {
        thaw_prepare_store_key(s->task, norm, s->tokens, s->n_tokens, s->store_key);
        thaw_kvcache_expect(e->kv, s->store_key);
        for (int i = 0; i < s->task->req.n_retain; i++)
            if (s->task->retain_tokens[i] > 0)
                s->retain[s->n_retain++] = (struct thaw_kvcache_retain){
                    s->task->retain_tokens[i], (int64_t)time(NULL) + s->task->req.retain[i].ttl_s};
    }
    if (!will_store) /* cache_new_n as told when the slot took it (engine.c) */
        s->timings.cache_new_n = 0;
    thaw_task_finish(s->task, reason, s->stop_word, &s->timings, msg);
    char spec[96] = "";
    if (s->timings.draft_n > 0)
        snprintf(spec, sizeof spec, "; drafts: %d of %d accepted (%.0f%%)", s->timings.draft_n_accepted,
                 s->timings.draft_n, 100.0 * s->timings.draft_n_accepted / s->timings.draft_n);
    LOG_INF("slot %d: done (%s): prompt %d (%d cached, %s), %.1f ms; %d generated, %.1f tok/s%s", s->id, reason,
            s->task->n_prompt, s->timings.cache_n, s->timings.cache_source, s->timings.prompt_ms,
            s->timings.predicted_n,
            s->timings.predicted_ms > 0 ? s->timings.predicted_n * 1000.0 / s->timings.predicted_ms : 0.0, spec);
    /* a verified draft may have left positions past the finish in the KV */
    if (s->spec_base >= 0)
        spec_settle(e, s);
    else
        thaw_slotkv_rm(e->skv, s, s->n_tokens);
    if (will_store)
        slot_prepare_store(e, s, stored_msg); /* -> FIXUP */
    else
        thaw_engine_slot_idle(e, s);
    free(stored_msg);
    free(norm);
    free(reply);
}

/* The entry of a token whose text is s->gen[start, end) (logprobs.h);
 * the candidates' pieces as the token's own is rendered. */
static int record_probs(struct thaw_engine *e, struct thaw_slot *s, llama_token tok, const struct thaw_token_probs *p,
                        size_t start, size_t end)
{
    struct thaw_logprob_in top[THAW_LOGPROBS_MAX], sampled = {tok, p->p, s->gen.data + start, end - start};
    char (*pieces)[256] = p->n_top > 0 ? malloc((size_t)p->n_top * sizeof *pieces) : NULL;
    int rc;

    if (p->n_top > 0 && !pieces)
        return THAW_ENOMEM;
    for (int i = 0; i < p->n_top; i++) {
        bool special = false;
        for (int j = 0; j < s->task->gen.n_preserved && !special; j++)
            special = s->task->gen.preserved[j] == p->top[i];
        int n = llama_token_to_piece(e->vocab, p->top[i], pieces[i], sizeof pieces[i], 0, special);
        top[i] = (struct thaw_logprob_in){p->top[i], p->top_p[i], pieces[i], n > 0 ? (size_t)n : 0};
    }
    rc = thaw_task_add_logprobs(s->task, &sampled, top, p->n_top, (uint32_t)start, (uint32_t)end);
    free(pieces);
    return rc;
}

int thaw_gen_sample(struct thaw_engine *e, struct thaw_slot *s, int idx, llama_token *tok, struct thaw_token_probs *probs)
{
    const struct thaw_chat_request *req = &s->task->req;
    char err[256];
    int rc = thaw_sampler_sample(s->smpl, e->ctx, idx, llama_vocab_n_tokens(e->vocab), req->n_probs,
                                 req->post_sampling_probs, req->logprobs ? probs : NULL, tok, err, sizeof err);

    if (rc != 0) {
        /* a grammar at a dead end: this request fails, the server lives */
        LOG_WRN("slot %d: %s", s->id, rc == THAW_EINVAL ? err : "out of memory");
        thaw_engine_slot_fail(e, s, 500, rc == THAW_EINVAL ? err : "out of memory");
    }
    return rc;
}

/* Takes one sampled token: text out, stop conditions, next decode. */
void thaw_gen_take_token(struct thaw_engine *e, struct thaw_slot *s, llama_token tok,
                         const struct thaw_token_probs *probs)
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
    size_t before = s->gen.len;
    if (thaw_slot_gen_append(s, piece, (size_t)n) != 0 ||
        (t->req.logprobs && record_probs(e, s, tok, probs, before, s->gen.len) != 0)) {
        thaw_engine_slot_fail(e, s, 500, "out of memory");
        return;
    }
    if (t->req.n_stop + t->gen.n_stops > 0) {
        int which = -1;
        const char *hit = thaw_slot_find_stop(s, before, &which);
        if (hit) {
            if (which < t->req.n_stop)
                s->stop_word = t->req.stop[which]; /* the client's own: Anthropic names it */
            thaw_buf_truncate(&s->gen, (size_t)(hit - s->gen.data));
            slot_finish(e, s, "stop");
            return;
        }
    }
    if (s->n_decoded >= t->max_tokens || s->n_tokens + 1 >= e->n_ctx_slot) {
        s->timings.truncated = s->n_tokens + 1 >= e->n_ctx_slot;
        slot_finish(e, s, "length");
        return;
    }
    thaw_slot_flush_text(s, false);
    s->next_token = tok;
    if (s->phase != THAW_SLOT_GEN) {
        thaw_slot_move(s, THAW_SLOT_GEN, NULL, e->metrics);
        /* the first token is out: the prompt's blocks go to the disk while
         * the reply is generated, so that its end has less to write */
        thaw_slotkv_store_ahead(e->skv, s, s->n_tokens);
    }
}

/* Up to `room` tokens after the slot's next token: the n-gram kinds'
 * (copied from the slot's own conversation) first, then the draft
 * model's, as llama-server tries them. */
int thaw_gen_draft(struct thaw_engine *e, struct thaw_slot *s, int room)
{
    const struct thaw_config *cfg = e->cfg;
    int max = room;

    if (max > s->task->max_tokens - s->n_decoded - 1)
        max = s->task->max_tokens - s->n_decoded - 1;
    if (max > e->n_ctx_slot - s->n_tokens - 2)
        max = e->n_ctx_slot - s->n_tokens - 2;
    if (max < 1)
        return 0;
    if (s->ngram) {
        int n = thaw_ngram_draft(s->ngram, s->tokens, s->n_tokens, s->next_token, max, s->drafts);
        if (n > 0)
            return n;
    }
    if (!e->draft)
        return 0;
    if (max > cfg->draft_max)
        max = cfg->draft_max;
    if (max < 1 || max < cfg->draft_min)
        return 0;
    int64_t t0 = thaw_now_us();
    if (thaw_draft_sync(e->draft, s->id, s->tokens, s->n_tokens) < 0)
        return 0;
    int n = thaw_draft_propose(e->draft, s->id, s->next_token, max, cfg->draft_p_min, s->drafts);
    thaw_metrics_hold(e->metrics, THAW_HOLD_DRAFT, thaw_now_us() - t0);
    return n >= cfg->draft_min ? n : 0;
}

/* A recurrent target after a verify: its state holds every token of the
 * verify batch, and cannot drop the ones that do not stay (a rejected
 * draft, or a reply that ended inside the accepted ones). It goes back to
 * the checkpoint taken before the batch (engine.c, build_batch), and the
 * tokens that stay are decoded again. Only once every slot's rows of the
 * batch are sampled: this decode reuses the context's logits. */
static void spec_settle(struct thaw_engine *e, struct thaw_slot *s)
{
    int base = s->spec_base, n = s->n_tokens - base;

    s->spec_base = -1;
    if (base < 0 || s->n_tokens == s->spec_kv_end)
        return;
    int64_t t0 = thaw_now_us();
    struct llama_batch *b = &e->spec_batch;
    bool ok = n >= 0 && n <= s->n_tokens && thaw_ckpt_restore(&s->spec_ckpt, e->ctx, s->id) == 0 &&
              thaw_slotkv_rm(e->skv, s, base);
    b->n_tokens = 0;
    for (int i = 0; ok && i < n; i++) {
        b->token[i] = s->tokens[base + i];
        b->pos[i] = base + i;
        b->n_seq_id[i] = 1;
        b->seq_id[i][0] = s->id;
        b->logits[i] = i == n - 1; /* unread: one row, as any decode asks for */
        b->n_tokens++;
    }
    if (ok && n > 0)
        ok = llama_decode(e->ctx, *b) == 0;
    thaw_metrics_hold(e->metrics, THAW_HOLD_CHECKPOINT, thaw_now_us() - t0);
    if (!ok) {
        LOG_ERR("slot %d: could not roll its recurrent state back past a rejected draft", s->id);
        thaw_slotkv_clear(e->skv, s); /* nothing of it can be trusted */
        if (s->phase == THAW_SLOT_GEN)
            thaw_engine_slot_fail(e, s, 500, "the model's state could not be rolled back past a rejected draft");
    }
}

int thaw_gen_verify_sample(struct thaw_engine *e, struct thaw_slot *s)
{
    /* every emitted token is sampled at its own row: its probabilities are
     * the target's there, as without a draft */
    struct thaw_token_probs *probs = NULL;
    int n_emit = 0;

    if (s->task->req.logprobs && !(probs = malloc((size_t)(s->n_drafts + 1) * sizeof *probs))) {
        thaw_engine_slot_fail(e, s, 500, "out of memory");
        return -1;
    }
    for (int i = 0; i <= s->n_drafts; i++) {
        llama_token tok;
        if (thaw_gen_sample(e, s, s->i_batch + i, &tok, probs ? &probs[n_emit] : NULL) != 0) {
            free(probs);
            return -1;
        }
        n_emit++;
        if (i == s->n_drafts || tok != s->drafts[i]) {
            s->spec_last = tok;
            break;
        }
    }
    int accepted = n_emit - 1;
    thaw_ngram_accept(s->ngram, accepted); /* nothing when the draft model drafted */
    s->timings.draft_n += s->n_drafts;
    s->timings.draft_n_accepted += accepted;
    atomic_fetch_add(&e->metrics->draft_tokens, (uint64_t)s->n_drafts);
    atomic_fetch_add(&e->metrics->draft_accepted, (uint64_t)accepted);
    atomic_fetch_add(&e->metrics->draft_steps, 1);
    s->spec_accepted = accepted;
    free(s->spec_probs);
    s->spec_probs = probs;
    return 0;
}

void thaw_gen_verify_take(struct thaw_engine *e, struct thaw_slot *s)
{
    int base = s->n_tokens, accepted = s->spec_accepted;
    struct thaw_token_probs *probs = s->spec_probs;

    s->spec_probs = NULL;
    /* the KV holds next_token and every draft: keep next_token + accepted */
    if (!e->recurrent) {
        thaw_slotkv_rm(e->skv, s, base + 1 + accepted);
    } else {
        s->spec_base = base;
        s->spec_kv_end = base + 1 + s->n_drafts;
    }
    s->tokens[base] = s->next_token;
    memcpy(s->tokens + base + 1, s->drafts, (size_t)accepted * sizeof(llama_token));
    s->n_drafts = 0;
    for (int i = 0; i <= accepted; i++) {
        s->n_tokens = base + 1 + i;
        thaw_gen_take_token(e, s, i < accepted ? s->tokens[base + 1 + i] : s->spec_last, probs ? &probs[i] : NULL);
        if (s->phase != THAW_SLOT_GEN)
            break;
    }
    free(probs);
    spec_settle(e, s); /* the reply goes on: the state as n_tokens says (its end did it already) */
}

/* The target's verdict on a draft: sample at every drafted position with
 * the request's own sampler (so each emitted token is the target's), keep
 * the drafts that match, emit the samples, roll the rest back. */
void thaw_gen_verify(struct thaw_engine *e, struct thaw_slot *s)
{
    _Static_assert(THAW_NGRAM_MAX >= THAW_DRAFT_MAX, "drafts[] holds the longest draft of either source");
    if (thaw_gen_verify_sample(e, s) == 0)
        thaw_gen_verify_take(e, s);
}
