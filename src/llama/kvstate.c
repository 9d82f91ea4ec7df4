/* kvstate.c — capture/restore of sequence state and context checkpoints. */
#include "llama/kvstate.h"

#include "base/blob.h"
#include "base/error.h"

#include <llama.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* Bytes of whole states read out of and installed into contexts (see
 * thaw_kvstate_io_bytes). */
static atomic_uint_fast64_t bytes_out, bytes_in;

void thaw_kvstate_io_bytes(uint64_t *out, uint64_t *in)
{
    *out = atomic_load(&bytes_out);
    *in = atomic_load(&bytes_in);
}

#define KV_MAGIC 0x31564b54u   /* "TKV1" */
#define CKPT_MAGIC 0x314b4354u /* "TCK1" */
#define FORMAT_VERSION 1u

struct kv_header {
    uint32_t magic, version, n_tokens, reserved;
    uint64_t state_size;
};

struct ckpt_header {
    uint32_t magic, version, count, reserved;
};

struct ckpt_record {
    int32_t n_tokens, pos_min, pos_max;
    uint32_t reserved;
    uint64_t size;
};

/* ---- .kv ---------------------------------------------------------------------- */

int thaw_kvstate_capture(struct llama_context *ctx, llama_seq_id seq, const llama_token *tokens, int n_tokens,
                         void **out, size_t *n_out)
{
    void *keep = NULL;
    size_t cap = 0;
    int rc = thaw_kvstate_capture_reuse(ctx, seq, tokens, n_tokens, &keep, &cap, out, n_out);

    thaw_blob_unref(keep); /* *out holds the other reference */
    return rc;
}

int thaw_kvstate_capture_reuse(struct llama_context *ctx, llama_seq_id seq, const llama_token *tokens, int n_tokens,
                               void **keep, size_t *keep_cap, void **out, size_t *n_out)
{
    size_t n_state = llama_state_seq_get_size(ctx, seq);
    size_t head = sizeof(struct kv_header) + (size_t)n_tokens * sizeof(int32_t);
    uint8_t *blob = *keep;

    if (n_state == 0)
        return THAW_ELLAMA;
    if (!blob || !thaw_blob_unique(blob) || *keep_cap < head + n_state) {
        size_t cap = head + n_state + (head + n_state) / 4;
        thaw_blob_unref(blob);
        *keep = NULL;
        *keep_cap = 0;
        if (!(blob = thaw_blob_alloc(cap)))
            return THAW_ENOMEM;
        *keep = blob;
        *keep_cap = cap;
    }
    thaw_kvstate_write_head(blob, tokens, n_tokens, n_state);
    if (llama_state_seq_get_data(ctx, blob + head, n_state, seq) != n_state)
        return THAW_ELLAMA;
    atomic_fetch_add(&bytes_out, n_state);
    *out = thaw_blob_ref(blob);
    *n_out = head + n_state;
    return 0;
}

size_t thaw_kvstate_head_size(int n_tokens)
{
    return sizeof(struct kv_header) + (size_t)n_tokens * sizeof(int32_t);
}

void thaw_kvstate_write_head(void *blob, const llama_token *tokens, int n_tokens, size_t n_state)
{
    struct kv_header h = {KV_MAGIC, FORMAT_VERSION, (uint32_t)n_tokens, 0, n_state};
    memcpy(blob, &h, sizeof h);
    memcpy((uint8_t *)blob + sizeof h, tokens, (size_t)n_tokens * sizeof(int32_t));
}

int thaw_kvstate_is(const void *blob, size_t n)
{
    uint32_t magic;

    if (!blob || n < sizeof(struct kv_header))
        return 0;
    memcpy(&magic, blob, sizeof magic);
    return magic == KV_MAGIC;
}

int thaw_kvstate_head_tokens(const void *head, size_t n, size_t *off, uint32_t *n_tokens)
{
    struct kv_header h;

    if (!thaw_kvstate_is(head, n))
        return THAW_ECORRUPT;
    memcpy(&h, head, sizeof h);
    if (h.version != FORMAT_VERSION)
        return THAW_EVERSION;
    *off = sizeof h;
    *n_tokens = h.n_tokens;
    return 0;
}

int thaw_kvstate_parse(const void *blob, size_t n, struct thaw_kvstate_view *v)
{
    struct kv_header h;

    if (!blob || n < sizeof h)
        return THAW_ECORRUPT;
    memcpy(&h, blob, sizeof h);
    if (h.magic != KV_MAGIC)
        return THAW_ECORRUPT;
    if (h.version != FORMAT_VERSION)
        return THAW_EVERSION;
    if (h.n_tokens > (n - sizeof h) / sizeof(int32_t))
        return THAW_ECORRUPT;
    size_t head = sizeof h + (size_t)h.n_tokens * sizeof(int32_t);
    if (h.state_size == 0 || h.state_size != n - head)
        return THAW_ECORRUPT;
    v->tokens = (const llama_token *)((const uint8_t *)blob + sizeof h);
    v->n_tokens = (int)h.n_tokens;
    v->state = (const uint8_t *)blob + head;
    v->n_state = (size_t)h.state_size;
    return 0;
}

int thaw_kvstate_restore(struct llama_context *ctx, llama_seq_id seq, const struct thaw_kvstate_view *v)
{
    llama_memory_seq_rm(llama_get_memory(ctx), seq, -1, -1);
    if (llama_state_seq_set_data(ctx, v->state, v->n_state, seq) == 0) {
        llama_memory_seq_rm(llama_get_memory(ctx), seq, -1, -1);
        return THAW_ELLAMA;
    }
    atomic_fetch_add(&bytes_in, v->n_state);
    /* the state must hold exactly the positions its token list claims */
    if (llama_memory_seq_pos_max(llama_get_memory(ctx), seq) != v->n_tokens - 1) {
        llama_memory_seq_rm(llama_get_memory(ctx), seq, -1, -1);
        return THAW_ECORRUPT;
    }
    return 0;
}

/* ---- .ckpt --------------------------------------------------------------------- */

static void ckpt_drop(struct thaw_ckpt_list *l, int i)
{
    free(l->v[i].data);
    memmove(l->v + i, l->v + i + 1, (size_t)(l->n - i - 1) * sizeof *l->v);
    l->n--;
}

static int ckpt_push(struct thaw_ckpt_list *l, struct thaw_ckpt c)
{
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 4;
        struct thaw_ckpt *nv = realloc(l->v, (size_t)cap * sizeof *nv);
        if (!nv)
            return THAW_ENOMEM;
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = c;
    return 0;
}

int thaw_ckpt_take(struct thaw_ckpt_list *l, struct llama_context *ctx, llama_seq_id seq, int n_tokens, int max_keep)
{
    llama_memory_t mem = llama_get_memory(ctx);
    struct thaw_ckpt c = {.n_tokens = n_tokens};

    if (max_keep <= 0)
        return 0;
    thaw_ckpt_truncate(l, n_tokens - 1); /* a newer one at the same point replaces it */
    c.size = llama_state_seq_get_size_ext(ctx, seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
    if (c.size == 0)
        return THAW_ELLAMA;
    if (!(c.data = malloc(c.size)))
        return THAW_ENOMEM;
    if (llama_state_seq_get_data_ext(ctx, c.data, c.size, seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY) != c.size) {
        free(c.data);
        return THAW_ELLAMA;
    }
    c.pos_min = llama_memory_seq_pos_min(mem, seq);
    c.pos_max = llama_memory_seq_pos_max(mem, seq);
    while (l->n >= max_keep)
        ckpt_drop(l, 0);
    if (ckpt_push(l, c) != 0) {
        free(c.data);
        return THAW_ENOMEM;
    }
    return 0;
}

int thaw_ckpt_save(struct thaw_ckpt *c, struct llama_context *ctx, llama_seq_id seq, int n_tokens)
{
    llama_memory_t mem = llama_get_memory(ctx);
    size_t size = llama_state_seq_get_size_ext(ctx, seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);

    if (size == 0)
        return THAW_ELLAMA;
    if (size != c->size) {
        void *data = realloc(c->data, size);
        if (!data)
            return THAW_ENOMEM;
        c->data = data;
        c->size = size;
    }
    if (llama_state_seq_get_data_ext(ctx, c->data, c->size, seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY) != c->size)
        return THAW_ELLAMA;
    c->n_tokens = n_tokens;
    c->pos_min = llama_memory_seq_pos_min(mem, seq);
    c->pos_max = llama_memory_seq_pos_max(mem, seq);
    c->flags = 0;
    return 0;
}

int thaw_ckpt_restore(const struct thaw_ckpt *c, struct llama_context *ctx, llama_seq_id seq)
{
    if (llama_state_seq_set_data_ext(ctx, c->data, c->size, seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY) == 0)
        return THAW_ELLAMA;
    return 0;
}

void thaw_ckpt_truncate(struct thaw_ckpt_list *l, int n_tokens)
{
    for (int i = l->n - 1; i >= 0; i--)
        if (l->v[i].n_tokens > n_tokens)
            ckpt_drop(l, i);
}

void thaw_ckpt_clear(struct thaw_ckpt_list *l)
{
    for (int i = 0; i < l->n; i++)
        free(l->v[i].data);
    free(l->v);
    memset(l, 0, sizeof *l);
}

int thaw_ckpt_serialize(const struct thaw_ckpt_list *l, void **out, size_t *n_out)
{
    size_t n = sizeof(struct ckpt_header);
    uint8_t *blob, *p;

    *out = NULL;
    *n_out = 0;
    if (l->n == 0)
        return 0;
    for (int i = 0; i < l->n; i++)
        n += sizeof(struct ckpt_record) + l->v[i].size;
    if (!(blob = thaw_blob_alloc(n)))
        return THAW_ENOMEM;
    struct ckpt_header h = {CKPT_MAGIC, FORMAT_VERSION, (uint32_t)l->n, 0};
    memcpy(blob, &h, sizeof h);
    p = blob + sizeof h;
    for (int i = 0; i < l->n; i++) {
        struct ckpt_record r = {l->v[i].n_tokens, l->v[i].pos_min, l->v[i].pos_max, l->v[i].flags, l->v[i].size};
        memcpy(p, &r, sizeof r);
        memcpy(p + sizeof r, l->v[i].data, l->v[i].size);
        p += sizeof r + l->v[i].size;
    }
    *out = blob;
    *n_out = n;
    return 0;
}

int thaw_ckpt_parse(const void *blob, size_t n, struct thaw_ckpt_list *l)
{
    const uint8_t *p = blob, *end = p + n;
    struct ckpt_header h;
    int rc = 0;

    thaw_ckpt_clear(l);
    if (n == 0)
        return 0;
    if (!blob || n < sizeof h)
        return THAW_ECORRUPT;
    memcpy(&h, p, sizeof h);
    if (h.magic != CKPT_MAGIC)
        return THAW_ECORRUPT;
    if (h.version != FORMAT_VERSION)
        return THAW_EVERSION;
    p += sizeof h;
    for (uint32_t i = 0; i < h.count; i++) {
        struct ckpt_record r;
        if ((size_t)(end - p) < sizeof r) {
            rc = THAW_ECORRUPT;
            goto error;
        }
        memcpy(&r, p, sizeof r);
        p += sizeof r;
        if (r.size == 0 || r.size > (uint64_t)(end - p) || r.n_tokens < 0 || r.pos_min > r.pos_max) {
            rc = THAW_ECORRUPT;
            goto error;
        }
        struct thaw_ckpt c = {r.n_tokens, r.pos_min, r.pos_max, malloc(r.size), (size_t)r.size, r.reserved};
        if (!c.data) {
            rc = THAW_ENOMEM;
            goto error;
        }
        memcpy(c.data, p, c.size);
        p += c.size;
        if (ckpt_push(l, c) != 0) {
            free(c.data);
            rc = THAW_ENOMEM;
            goto error;
        }
    }
    if (p != end) {
        rc = THAW_ECORRUPT;
        goto error;
    }
    return 0;
error:
    thaw_ckpt_clear(l);
    return rc;
}
