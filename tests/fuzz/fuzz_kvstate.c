/* fuzz_kvstate.c — libFuzzer target: .kv and .ckpt blobs through their
 * parsers (what a restore reads after the checksums passed; layouts in
 * kvstate.h). Every input goes to both; the magic picks the one that gets
 * past its header.
 *
 * Beyond "no crash, leak or overread", what each parser promises:
 *   .kv    0, THAW_ECORRUPT or THAW_EVERSION; on 0 the view lies exactly
 *          over the blob (header, tokens, state: nothing left over) and is
 *          read end to end, so ASan sees any view that points outside it.
 *   .ckpt  0, THAW_ECORRUPT or THAW_EVERSION (list left empty); on 0
 *          thaw_ckpt_serialize() gives back the input, reserved words
 *          aside, and truncating the list keeps only what it should.
 * Any failure aborts: a crash to libFuzzer.
 */
#include "base/blob.h"
#include "base/error.h"
#include "llama/kvstate.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define KV_HEADER 24   /* u32 magic, version, n_tokens, reserved; u64 state_size */
#define CKPT_HEADER 16 /* u32 magic, version, count, reserved */
#define CKPT_RECORD 24 /* i32 n_tokens, pos_min, pos_max; u32 reserved; u64 size */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint8_t sink;

static void check_kv(const uint8_t *blob, size_t n)
{
    struct thaw_kvstate_view v;
    int rc = thaw_kvstate_parse(blob, n, &v);

    if (rc == THAW_ECORRUPT || rc == THAW_EVERSION)
        return;
    if (rc != 0 || v.n_tokens < 0 || v.n_state == 0 || (const uint8_t *)v.tokens != blob + KV_HEADER ||
        (const uint8_t *)v.state != blob + KV_HEADER + 4 * (size_t)v.n_tokens ||
        KV_HEADER + 4 * (size_t)v.n_tokens + v.n_state != n)
        abort();
    uint8_t x = 0;
    for (int i = 0; i < v.n_tokens; i++)
        x ^= (uint8_t)v.tokens[i];
    for (size_t i = 0; i < v.n_state; i++)
        x ^= ((const uint8_t *)v.state)[i];
    sink = x;
}

/* a and b (both n bytes, b a well-formed .ckpt) equal outside the reserved
 * words of the header and of each record. */
static int ckpt_equal(const uint8_t *a, const uint8_t *b, size_t n)
{
    size_t p = CKPT_HEADER;

    if (memcmp(a, b, 12) != 0)
        return 0;
    while (p < n) {
        uint64_t size;
        memcpy(&size, b + p + 16, 8);
        if (memcmp(a + p, b + p, 12) != 0 || memcmp(a + p + 16, b + p + 16, CKPT_RECORD - 16 + size) != 0)
            return 0;
        p += CKPT_RECORD + size;
    }
    return 1;
}

static void check_ckpt(const uint8_t *blob, size_t n)
{
    struct thaw_ckpt_list l = {0};
    void *out = NULL;
    size_t n_out = 0;
    int rc = thaw_ckpt_parse(blob, n, &l);

    if (rc == THAW_ECORRUPT || rc == THAW_EVERSION) {
        if (l.n != 0 || l.v != NULL)
            abort();
        return;
    }
    if (rc != 0)
        abort();
    if (thaw_ckpt_serialize(&l, &out, &n_out) != 0)
        goto out;
    if (l.n == 0 ? !(n == 0 || n == CKPT_HEADER) || out != NULL
                 : n_out != n || !ckpt_equal(blob, out, n))
        abort();
    if (l.n > 0) {
        int cut = l.v[l.n / 2].n_tokens;
        thaw_ckpt_truncate(&l, cut);
        for (int i = 0; i < l.n; i++)
            if (l.v[i].n_tokens > cut)
                abort();
    }
out:
    thaw_blob_unref(out);
    thaw_ckpt_clear(&l);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    void *copy = malloc(size ? size : 1); /* the parsers expect aligned blobs, as mmap gives */

    if (!copy)
        return 0;
    memcpy(copy, data, size);
    check_kv(copy, size);
    check_ckpt(copy, size);
    free(copy);
    return 0;
}
