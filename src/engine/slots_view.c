/* slots_view.c — the engine's slots as GET /slots shows them (slots_view.h). */
#include "engine/slots_view.h"

#include "api/chat.h"
#include "base/utf8.h"
#include "engine/slot.h"

#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct one {
    enum thaw_slot_phase phase;
    llama_token *tokens; /* what the KV held at the last publish, n_tokens of cap */
    int n_tokens, cap;
    int n_prompt, n_cached;            /* the request in progress, or the last one */
    int n_decoded, n_remain;           /* the request in progress; 0 and -1 without one, as llama-server's */
    int draft_n, draft_n_accepted;     /* its speculative tokens proposed, accepted (the last one's after it) */
    const char *cache_source;          /* static */
    const char *stored_to;             /* static, NULL = not stored yet */
    uint8_t ns[THAW_KEY_BYTES];
};

struct thaw_slots_view {
    pthread_mutex_t mu;
    int n_slots, n_ctx;
    bool speculative; /* drafts are made (n-grams or a draft model) */
    struct one *slots;
};

struct thaw_slots_view *thaw_slots_view_new(int n_slots, int n_ctx, bool speculative)
{
    struct thaw_slots_view *v = calloc(1, sizeof *v);

    if (!v || !(v->slots = calloc((size_t)n_slots, sizeof *v->slots))) {
        free(v);
        return NULL;
    }
    pthread_mutex_init(&v->mu, NULL);
    v->n_slots = n_slots;
    v->n_ctx = n_ctx;
    v->speculative = speculative;
    for (int i = 0; i < n_slots; i++) {
        v->slots[i].cache_source = "none";
        v->slots[i].n_remain = -1; /* no request yet */
    }
    return v;
}

void thaw_slots_view_free(struct thaw_slots_view *v)
{
    if (!v)
        return;
    for (int i = 0; i < v->n_slots; i++)
        free(v->slots[i].tokens);
    free(v->slots);
    pthread_mutex_destroy(&v->mu);
    free(v);
}

void thaw_slots_view_publish(struct thaw_slots_view *v, const struct thaw_slot *s)
{
    if (!v || s->id < 0 || s->id >= v->n_slots)
        return;
    pthread_mutex_lock(&v->mu);
    struct one *o = &v->slots[s->id];
    if (s->n_tokens > o->cap) {
        llama_token *nt = realloc(o->tokens, (size_t)s->n_tokens * sizeof *nt);
        if (nt) {
            o->tokens = nt;
            o->cap = s->n_tokens;
        }
    }
    if (s->n_tokens <= o->cap) {
        if (s->n_tokens)
            memcpy(o->tokens, s->tokens, (size_t)s->n_tokens * sizeof *o->tokens);
        o->n_tokens = s->n_tokens;
    }
    if (s->phase == THAW_SLOT_PREFILL) /* a new request: it is not stored yet */
        o->stored_to = NULL;
    o->phase = s->phase;
    o->n_decoded = s->task ? s->n_decoded : 0;
    o->n_remain = s->task ? s->task->max_tokens - s->n_decoded : -1;
    if (s->task)
        o->n_prompt = s->task->n_prompt;
    o->n_cached = s->timings.cache_n;
    o->draft_n = s->timings.draft_n;
    o->draft_n_accepted = s->timings.draft_n_accepted;
    o->cache_source = s->timings.cache_source ? s->timings.cache_source : "none";
    memcpy(o->ns, s->ns, THAW_KEY_BYTES);
    pthread_mutex_unlock(&v->mu);
}

void thaw_slots_view_stored(struct thaw_slots_view *v, int id, const char *tiers)
{
    if (!v || id < 0 || id >= v->n_slots)
        return;
    pthread_mutex_lock(&v->mu);
    v->slots[id].stored_to = tiers;
    pthread_mutex_unlock(&v->mu);
}

char *thaw_slots_view_json(struct thaw_slots_view *v, const struct thaw_chat *chat, const uint8_t ns[THAW_KEY_BYTES])
{
    json_t *arr = json_array();
    char *out = NULL;

    if (!arr)
        return NULL;
    pthread_mutex_lock(&v->mu);
    for (int i = 0; i < v->n_slots; i++) {
        const struct one *o = &v->slots[i];
        bool mine = memcmp(o->ns, ns, THAW_KEY_BYTES) == 0;
        /* a request in flight, as llama-server's; the re-decode after a reply (FIXUP) is not one */
        bool processing = o->phase == THAW_SLOT_PREFILL || o->phase == THAW_SLOT_GEN;
        /* what a slot holds may end inside a character, or be bytes no
         * character makes (a prompt of token ids): sent as valid UTF-8 */
        char *raw = mine && o->n_tokens ? thaw_chat_detokenize(chat, o->tokens, o->n_tokens) : NULL;
        char *text = raw ? thaw_utf8_sanitize(raw, strlen(raw)) : NULL;
        free(raw);
        json_t *so = json_pack(
            "{s:i, s:i, s:b, s:b, s:i, s:i, s:i, s:s, s:[{s:b, s:i, s:i}], s:{s:s, s:i, s:s, s:o, s:i, s:i, s:f}}",
            "id", i, "n_ctx", v->n_ctx, "speculative", v->speculative, "is_processing", processing, "n_prompt_tokens", o->n_prompt,
            "n_prompt_tokens_processed", o->n_prompt - o->n_cached, "n_prompt_tokens_cache", o->n_cached, "prompt",
            text ? text : "", "next_token", "has_next_token", o->phase == THAW_SLOT_GEN, "n_remain", o->n_remain,
            "n_decoded", o->n_decoded,
            "thaw", "phase", thaw_slot_phase_name(o->phase), "n_tokens", mine ? o->n_tokens : 0, "cache_source",
            o->cache_source, "stored_to", o->stored_to ? json_string(o->stored_to) : json_null(), "draft_n",
            o->draft_n, "draft_n_accepted", o->draft_n_accepted, "draft_acceptance_rate",
            o->draft_n ? (double)o->draft_n_accepted / o->draft_n : 0.0);
        free(text);
        if (!so || json_array_append_new(arr, so) != 0)
            goto out;
    }
    out = json_dumps(arr, JSON_COMPACT);
out:
    pthread_mutex_unlock(&v->mu);
    json_decref(arr);
    return out;
}
