/* fuzz_kvlayout.c — libFuzzer target: libllama sequence-state buffers and
 * thaw's blocks through kvlayout.c (both layouts: top of kvlayout.h). A
 * restore reads blocks from disk and a store parses what libllama gave; a
 * bug or another build can hand either anything.
 *
 * Every input is read two ways:
 *   1. as a libllama buffer, thaw_kvlayout_parse(): 0, THAW_ECORRUPT,
 *      THAW_ELAYOUT, THAW_EINVAL or THAW_ENOMEM, *out NULL on failure. On 0
 *      it is cut into blocks of B cells (B = 1 + the input's last byte mod
 *      n_cells: the last byte is K/V or tail payload, so the fuzzer moves B
 *      without breaking the parse). Each block must be accepted by
 *      thaw_kvlayout_block_info() with its own pos0 and cell count, and the
 *      blocks with the parsed frame and tail must assemble to the input byte
 *      for byte (the module's promise), with or without headroom. Blocks out
 *      of order, or without the first one, are THAW_EINVAL; a frame whose
 *      stream is outside it is THAW_EINVAL; ranges past the cells and
 *      buffers one byte short are refused.
 *   2. as a block, thaw_kvlayout_block_info(): 0, THAW_ECORRUPT or
 *      THAW_EVERSION. A valid block is assembled alone (no tail) for a frame
 *      taken from the input's size: THAW_EINVAL unless it starts at position
 *      0, else 0, and then what assembly wrote must parse back to the same
 *      cells and frame, and cutting it gives back the block — unless the
 *      block's cells carry ext and the assembled buffer also reads as plain
 *      cells (libllama's layout does not record which; parse tries plain
 *      first, and assembly still round-trips what it parsed).
 * Any broken promise aborts: a crash to libFuzzer.
 */
#include "base/error.h"
#include "llama/kvlayout.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK_FLAGS_OFF 4 /* u16 version | u16 flags, kvlayout.h */
#define FLAG_EXT 2u

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok)
{
    if (!ok)
        abort();
}

/* Assembles blocks[0, nb) and returns its code; on 0 the result is in
 * *out (free it), *n_out its size. */
static int assemble(const void *const *blocks, const size_t *sizes, int nb, const struct thaw_kvlayout_frame *f,
                    const void *tail, size_t n_tail, void **out, size_t *n_out)
{
    int rc = thaw_kvlayout_assemble((const void *const *)blocks, sizes, nb, f, tail, n_tail, out, n_out);

    check(rc == 0 || rc == THAW_ECORRUPT || rc == THAW_EVERSION || rc == THAW_EMISMATCH || rc == THAW_EINVAL ||
          rc == THAW_ENOMEM);
    check(rc == 0 ? *out != NULL : *out == NULL && *n_out == 0);
    return rc;
}

/* ---- 1. a libllama buffer ------------------------------------------------------ */

static void check_state(const uint8_t *buf, size_t n)
{
    static char not_null;
    struct thaw_kvlayout *l = (struct thaw_kvlayout *)&not_null; /* parse must reset it */
    struct thaw_kvlayout_frame f, bad;
    const void *tail;
    size_t n_tail, *sizes = NULL, n_out;
    uint8_t **blocks = NULL;
    void *out = NULL;
    uint32_t N, bs;
    int rc = thaw_kvlayout_parse(buf, n, &l), nb = 0;

    check(rc == 0 || rc == THAW_ECORRUPT || rc == THAW_ELAYOUT || rc == THAW_EINVAL || rc == THAW_ENOMEM);
    check(rc == 0 ? l != NULL : l == NULL);
    if (rc != 0)
        return;
    N = thaw_kvlayout_n_cells(l);
    thaw_kvlayout_frame(l, &f);
    thaw_kvlayout_tail(l, &tail, &n_tail);
    check(N > 0 && thaw_kvlayout_n_layers(l) > 0 && (thaw_kvlayout_v_trans(l) & ~1) == 0);
    check(f.stream < f.n_stream);
    check(thaw_kvlayout_bytes_per_cell(l) > 0 && thaw_kvlayout_bytes_per_cell(l) <= n / N);
    check(n_tail < n && (n_tail == 0 ? tail == NULL : (const uint8_t *)tail == buf + n - n_tail));
    check(thaw_kvlayout_block_size(l, 0, 0) == 0 && thaw_kvlayout_block_size(l, 0, N + 1) == 0 &&
          thaw_kvlayout_block_size(l, N, N) == 0);
    check(thaw_kvlayout_cut(l, N, N + 1, NULL, 0) == THAW_EINVAL);

    bs = 1 + buf[n - 1] % N;
    uint32_t max_blocks = (N + bs - 1) / bs;
    if (!(blocks = calloc(max_blocks, sizeof *blocks)) || !(sizes = calloc(max_blocks, sizeof *sizes)))
        goto out;
    for (uint32_t a = 0; a < N; a += bs, nb++) {
        uint32_t b = N - a < bs ? N : a + bs, pos0, cells;
        sizes[nb] = thaw_kvlayout_block_size(l, a, b);
        check(sizes[nb] > 0);
        if (!(blocks[nb] = malloc(sizes[nb])))
            goto out;
        check(thaw_kvlayout_cut(l, a, b, blocks[nb], sizes[nb] - 1) == THAW_ETOOBIG);
        check(thaw_kvlayout_cut(l, a, b, blocks[nb], sizes[nb]) == 0);
        check(thaw_kvlayout_block_info(blocks[nb], sizes[nb], &pos0, &cells) == 0 && pos0 == a && cells == b - a);
        check(thaw_kvlayout_block_info(blocks[nb], sizes[nb] - 1, &pos0, &cells) == THAW_ECORRUPT);
    }

    /* the promise: blocks + frame + tail give back the buffer */
    if ((rc = assemble((const void *const *)blocks, sizes, nb, &f, tail, n_tail, &out, &n_out)) == THAW_ENOMEM)
        goto out;
    check(rc == 0 && n_out == n && memcmp(out, buf, n) == 0);
    free(out);
    out = NULL;
    rc = thaw_kvlayout_assemble_ex((const void *const *)blocks, sizes, nb, &f, tail, n_tail, 16, &out, &n_out);
    if (rc == THAW_ENOMEM)
        goto out;
    check(rc == 0 && n_out == n && memcmp((uint8_t *)out + 16, buf, n) == 0);
    free(out);
    out = NULL;

    /* what must be refused */
    bad = f;
    bad.stream = bad.n_stream;
    check(assemble((const void *const *)blocks, sizes, nb, &bad, tail, n_tail, &out, &n_out) == THAW_EINVAL);
    if (nb >= 2) {
        rc = assemble((const void *const *)(blocks + 1), sizes + 1, nb - 1, &f, tail, n_tail, &out, &n_out);
        check(rc == THAW_EINVAL || rc == THAW_ENOMEM); /* starts past position 0 */
        uint8_t *tb = blocks[0];
        size_t ts = sizes[0];
        blocks[0] = blocks[1], sizes[0] = sizes[1], blocks[1] = tb, sizes[1] = ts;
        rc = assemble((const void *const *)blocks, sizes, nb, &f, tail, n_tail, &out, &n_out);
        check(rc == THAW_EINVAL || rc == THAW_ENOMEM); /* out of order */
    }
out:
    free(out);
    for (int i = 0; blocks && i < (int)max_blocks; i++)
        free(blocks[i]);
    free(blocks);
    free(sizes);
    thaw_kvlayout_free(l);
}

/* ---- 2. a block ---------------------------------------------------------------- */

static void check_block(const uint8_t *blk, size_t n)
{
    struct thaw_kvlayout_frame f = {(int32_t)(n * 2654435761u), (uint32_t)(1 + n % 3), 0}, g;
    struct thaw_kvlayout *l = NULL;
    uint32_t pos0 = 0xdeadbeef, cells = 0xdeadbeef;
    const void *one = blk, *tail;
    uint8_t *again = NULL;
    size_t n_tail, sz;
    uint16_t fl_in, fl_again;
    void *out = NULL;
    size_t n_out = 0;
    int rc = thaw_kvlayout_block_info(blk, n, &pos0, &cells);

    check(rc == 0 || rc == THAW_ECORRUPT || rc == THAW_EVERSION);
    if (rc != 0)
        return;
    check(cells > 0 && (uint64_t)pos0 + cells <= INT32_MAX);
    f.stream = (uint32_t)(n / 3) % f.n_stream;
    rc = assemble(&one, &n, 1, &f, NULL, 0, &out, &n_out);
    if (rc == THAW_ENOMEM)
        return;
    if (pos0 != 0) {
        check(rc == THAW_EINVAL);
        return;
    }
    check(rc == 0);

    /* what assembly writes, parse reads */
    rc = thaw_kvlayout_parse(out, n_out, &l);
    if (rc == THAW_ENOMEM)
        goto out;
    check(rc == 0 && thaw_kvlayout_n_cells(l) == cells);
    thaw_kvlayout_frame(l, &g);
    check(g.seq_id == f.seq_id && g.n_stream == f.n_stream && g.stream == f.stream);
    thaw_kvlayout_tail(l, &tail, &n_tail);
    check(n_tail == 0 && tail == NULL);
    sz = thaw_kvlayout_block_size(l, 0, cells);
    if (!(again = malloc(sz ? sz : 1)))
        goto out;
    check(thaw_kvlayout_cut(l, 0, cells, again, sz) == 0);
    memcpy(&fl_in, blk + BLOCK_FLAGS_OFF + 2, 2);
    memcpy(&fl_again, again + BLOCK_FLAGS_OFF + 2, 2);
    if ((fl_in & FLAG_EXT) && !(fl_again & FLAG_EXT))
        goto out; /* ext cells read as plain ones: allowed, see the top */
    check(sz == n && memcmp(again, blk, n) == 0);
out:
    free(again);
    thaw_kvlayout_free(l);
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check_state(data, size);
    check_block(data, size);
    return 0;
}
