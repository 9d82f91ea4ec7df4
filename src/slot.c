/* slot.c — a slot's phases and the one function that moves between them
 * (slot.h has the table). */
#include "slot.h"

#include "error.h"
#include "log.h"
#include "tokens.h"

#include <stdlib.h>
#include <string.h>

/* legal[from][to], the table of slot.h */
static const bool legal[THAW_SLOT_PHASE_COUNT][THAW_SLOT_PHASE_COUNT] = {
    [THAW_SLOT_IDLE] = {[THAW_SLOT_PREFILL] = true},
    [THAW_SLOT_PREFILL] = {[THAW_SLOT_IDLE] = true, [THAW_SLOT_GEN] = true, [THAW_SLOT_FIXUP] = true},
    [THAW_SLOT_GEN] = {[THAW_SLOT_IDLE] = true, [THAW_SLOT_FIXUP] = true},
    [THAW_SLOT_FIXUP] = {[THAW_SLOT_IDLE] = true},
};

void thaw_slot_init(struct thaw_slot *s, int id)
{
    memset(s, 0, sizeof *s);
    s->id = id;
    s->phase = THAW_SLOT_IDLE;
    s->i_batch = -1;
}

void thaw_slot_free(struct thaw_slot *s)
{
    free(s->tokens);
    free(s->gen);
    free(s->fix);
    free(s->drafts);
    thaw_ckpt_clear(&s->ckpts);
    s->tokens = s->fix = s->drafts = NULL;
    s->gen = NULL;
    s->n_tokens = s->cap_tokens = s->n_fix = 0;
    s->n_gen = s->cap_gen = 0;
}

bool thaw_slot_move_legal(enum thaw_slot_phase from, enum thaw_slot_phase to)
{
    if ((unsigned)from >= THAW_SLOT_PHASE_COUNT || (unsigned)to >= THAW_SLOT_PHASE_COUNT)
        return false;
    return legal[from][to];
}

const char *thaw_slot_phase_name(enum thaw_slot_phase p)
{
    static const char *const names[THAW_SLOT_PHASE_COUNT] = {"idle", "prefill", "gen", "fixup"};

    return (unsigned)p < THAW_SLOT_PHASE_COUNT ? names[p] : "?";
}

void thaw_slot_set_phase(struct thaw_slot *s, enum thaw_slot_phase to, struct thaw_metrics *m)
{
    enum thaw_slot_phase from = s->phase;

    if (!thaw_slot_move_legal(from, to)) {
        LOG_ERR("slot %d: illegal phase move %s -> %s", s->id, thaw_slot_phase_name(from), thaw_slot_phase_name(to));
        abort();
    }
    s->phase = to;
    if (!m)
        return;
    /* busy = every phase but IDLE */
    if (from == THAW_SLOT_IDLE)
        atomic_fetch_add(&m->slots_busy, 1);
    else if (to == THAW_SLOT_IDLE)
        atomic_fetch_sub(&m->slots_busy, 1);
}

int thaw_slot_reserve(struct thaw_slot *s, int n)
{
    return thaw_tokens_reserve(&s->tokens, &s->cap_tokens, n);
}

int thaw_slot_gen_append(struct thaw_slot *s, const char *p, size_t n)
{
    if (s->n_gen + n + 1 > s->cap_gen) {
        size_t cap = s->cap_gen ? s->cap_gen : 512;
        while (cap < s->n_gen + n + 1)
            cap *= 2;
        char *nb = realloc(s->gen, cap);
        if (!nb)
            return THAW_ENOMEM;
        s->gen = nb;
        s->cap_gen = cap;
    }
    memcpy(s->gen + s->n_gen, p, n);
    s->n_gen += n;
    s->gen[s->n_gen] = '\0';
    return 0;
}
