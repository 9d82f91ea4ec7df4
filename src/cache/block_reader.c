/* block_reader.c — a run of blocks read into one state (block_reader.h).
 * Moved out of blocks.c (the format) unchanged: the checker, one block
 * file read into place, the shapes of a section, then the load itself. */
#include "cache/block_reader.h"

#include "base/blob.h"
#include "base/error.h"
#include "base/workers.h"
#include "cache/tiers.h"
#include "llama/kvstate.h"

#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <xxhash.h>

static int check_end(struct thaw_blocks_check *ck);

void thaw_blocks_state_free(struct thaw_blocks_state *s)
{
    if (!s)
        return;
    (void)check_end(s->check); /* never free what the checker reads */
    thaw_blob_unref(s->kv);
    memset(s, 0, sizeof *s);
}

/* ---- restore: blocks read straight into place ----
 *
 * Every block file of the state is opened first (each open asks the kernel
 * to start reading it, so a cold disk serves them in parallel); then each
 * is read with preadv straight into its place in the state buffer: its
 * head into a buffer of its own, its K and V runs where they belong. No
 * block is copied twice. The checksums run on the disk tier's worker pool
 * (thaw_disk_cache_workers; none: on the caller's thread at the check),
 * behind the reads and then alongside libllama's copy of the state: the
 * caller installs, then thaw_blocks_state_check() says whether to undo. */

struct src {
    void *mem; /* a block still in the writer's queue (a blob reference) */
    size_t n_mem;
    struct thaw_disk_kv_file f; /* else its file: f.fd >= 0 */
    uint8_t *head;              /* the file's head as read (n_head bytes) */
    size_t n_head;
    struct thaw_kvlayout_asm *a; /* the section it goes into: section 0, or the SWA section */
    uint32_t pos0;               /* its first position */
};

struct thaw_blocks_check {
    struct thaw_disk_cache *c;
    struct thaw_kvlayout_asm *a;
    struct src *src;
    uint32_t n, n_src, block_tokens; /* n: blocks to check; n_src: sources to free */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint32_t n_ready; /* blocks read so far */
    int aborted;      /* the reader gave up: stop */
    int bad;          /* index of the first block that failed its checksum, or -1 */
    struct thaw_job job; /* check_main on the disk tier's pool (or the waiter's thread) */
    int submitted;
};

/* The checksum of file block k as it lies in the state: its head, then its
 * segments in order. */
static int block_sum_ok(struct thaw_blocks_check *ck, uint32_t k)
{
    struct thaw_kvlayout_cursor cur = {0};
    struct iovec iov[256];
    XXH3_state_t *st = XXH3_createState();
    int m, ok;

    if (!st)
        return 0; /* cannot check: treat as bad, a miss */
    XXH3_64bits_reset(st);
    XXH3_64bits_update(st, ck->src[k].head, ck->src[k].n_head);
    while ((m = thaw_kvlayout_asm_segments(ck->src[k].a, ck->src[k].pos0, ck->block_tokens, &cur, iov, 256)) > 0)
        for (int i = 0; i < m; i++)
            XXH3_64bits_update(st, iov[i].iov_base, iov[i].iov_len);
    ok = XXH3_64bits_digest(st) == ck->src[k].f.xxh3;
    XXH3_freeState(st);
    return ok;
}

static void check_main(void *arg)
{
    struct thaw_blocks_check *ck = arg;

    for (uint32_t k = 0; k < ck->n; k++) {
        if (ck->src[k].f.fd < 0)
            continue; /* from memory: nothing to check */
        pthread_mutex_lock(&ck->mu);
        while (ck->n_ready <= k && !ck->aborted)
            pthread_cond_wait(&ck->cv, &ck->mu);
        int stop = ck->aborted;
        pthread_mutex_unlock(&ck->mu);
        if (stop)
            break;
        if (!block_sum_ok(ck, k)) {
            ck->bad = (int)k;
            break;
        }
    }
}

static void check_ready(struct thaw_blocks_check *ck, uint32_t n_ready, int aborted)
{
    pthread_mutex_lock(&ck->mu);
    ck->n_ready = n_ready;
    ck->aborted |= aborted;
    pthread_cond_broadcast(&ck->cv);
    pthread_mutex_unlock(&ck->mu);
}

/* Closes the files (removing block `bad`, -1 for none), drops the blobs
 * and frees ck; the checker must be done. */
static void ck_free(struct thaw_blocks_check *ck, int bad)
{
    for (uint32_t k = 0; k < ck->n_src; k++) {
        thaw_disk_kv_close(ck->c, &ck->src[k].f, (int)k == bad);
        thaw_blob_unref(ck->src[k].mem);
        free(ck->src[k].head);
    }
    thaw_kvlayout_asm_free(ck->a);
    pthread_cond_destroy(&ck->cv);
    pthread_mutex_destroy(&ck->mu);
    free(ck->src);
    free(ck);
}

/* Waits for the checksums (or computes them here without a thread), then
 * frees ck. Returns 0 or THAW_ECORRUPT (the bad block removed). */
static int check_end(struct thaw_blocks_check *ck)
{
    int bad;

    if (!ck)
        return 0;
    thaw_workers_wait(thaw_disk_cache_workers(ck->c), &ck->job); /* not started: runs here */
    bad = ck->bad;
    ck_free(ck, bad);
    return bad >= 0 ? THAW_ECORRUPT : 0;
}

int thaw_blocks_state_check(struct thaw_blocks_state *s)
{
    int rc = check_end(s->check);

    s->check = NULL;
    return rc;
}

/* Bytes of block files the kernel is asked to read ahead of the one being
 * read (load_blocks). All of a conversation's at once queued the next
 * block behind the others: 8 MiB blocks read ~1.4x slower than one at a
 * time (a 2-core VM's virtual disk); 16 MiB ahead read fastest. */
#define READ_AHEAD ((uint64_t)16 << 20)

/* Reads file block k (B cells at its pos0) into place in its section: its
 * head and data in one preadv per IOV_MAX segments, then the head checked
 * and its meta written. */
static int read_block(struct thaw_blocks_check *ck, uint32_t k)
{
    struct src *b = &ck->src[k];
    struct thaw_kvlayout_cursor cur = {0};
    struct iovec iov[IOV_MAX];
    uint64_t off = 0;
    uint32_t pos0, cells;
    int m, first = 1, rc;

    if (!(b->head = malloc(b->n_head)))
        return THAW_ENOMEM;
    do {
        m = 0;
        if (first)
            iov[m++] = (struct iovec){b->head, b->n_head};
        m += thaw_kvlayout_asm_segments(b->a, b->pos0, ck->block_tokens, &cur, iov + m, IOV_MAX - m);
        first = 0;
        size_t want = 0;
        for (int i = 0; i < m; i++)
            want += iov[i].iov_len;
        if (want == 0)
            break;
        /* a short read (a file cut under us) is a bad block */
        for (int i = 0; want > 0;) {
            ssize_t got = thaw_disk_kv_preadv(ck->c, &b->f, iov + i, m - i, off);
            if (got < 0)
                return (int)got;
            if (got == 0)
                return THAW_ECORRUPT;
            off += (uint64_t)got;
            want -= (size_t)got;
            while (got > 0 && (size_t)got >= iov[i].iov_len)
                got -= (ssize_t)iov[i++].iov_len;
            if (got > 0) {
                iov[i].iov_base = (uint8_t *)iov[i].iov_base + got;
                iov[i].iov_len -= (size_t)got;
            }
        }
    } while (cur.part < 2);
    if (off != b->f.size)
        return THAW_ECORRUPT;
    if ((rc = thaw_kvlayout_asm_head(b->a, b->head, b->n_head, b->f.size, &pos0, &cells)) != 0)
        return rc;
    return pos0 == b->pos0 && cells == ck->block_tokens ? 0 : THAW_ECORRUPT;
}

/* The head of file block f: n_head bytes from its first 24. */
static int file_head_size(struct thaw_disk_cache *c, const struct thaw_disk_kv_file *f, size_t *n_head)
{
    uint8_t hdr[24];
    struct iovec iov = {hdr, sizeof hdr};
    ssize_t got = thaw_disk_kv_preadv(c, f, &iov, 1, 0);

    if (got < 0)
        return (int)got;
    if ((size_t)got != sizeof hdr)
        return THAW_ECORRUPT;
    int rc = thaw_kvlayout_block_head_size(hdr, sizeof hdr, n_head);
    return rc == 0 && *n_head <= f->size ? 0 : THAW_ECORRUPT;
}

/* Sources [k0, k1) of ck share one shape: the files' head size (every
 * file block of a section has the same), and the head of the first (a
 * malloc'd copy, or the memory block itself: *own 0). *head NULL when the
 * range is empty. */
static int group_head(struct thaw_blocks_check *ck, uint32_t k0, uint32_t k1, uint8_t **head, size_t *n_head,
                      int *own)
{
    uint32_t k;
    size_t n_file = 0;
    int rc;

    *head = NULL;
    *n_head = 0;
    *own = 0;
    if (k0 == k1)
        return 0;
    for (k = k0; k < k1 && ck->src[k].mem; k++)
        ;
    if (k < k1) {
        if ((rc = file_head_size(ck->c, &ck->src[k].f, &n_file)) != 0) {
            thaw_disk_kv_close(ck->c, &ck->src[k].f, 1); /* removed: bad */
            return rc;
        }
        for (uint32_t j = k0; j < k1; j++)
            ck->src[j].n_head = n_file;
    }
    if (ck->src[k0].mem) {
        *head = ck->src[k0].mem;
        *n_head = ck->src[k0].n_mem;
        return 0;
    }
    if (!(*head = malloc(n_file)))
        return THAW_ENOMEM;
    struct iovec iov = {*head, n_file};
    ssize_t got = thaw_disk_kv_preadv(ck->c, &ck->src[k0].f, &iov, 1, 0);
    if (got != (ssize_t)n_file) {
        free(*head);
        *head = NULL;
        return got < 0 ? (int)got : THAW_ECORRUPT;
    }
    *n_head = n_file;
    *own = 1;
    return 0;
}

int thaw_block_reader_load(struct thaw_disk_cache *c, struct thaw_ram_cache *ram,
                           const uint8_t (*ids)[THAW_KEY_BYTES], uint32_t n_ids, uint32_t block_tokens,
                           const void *tail, size_t tail_size, const void *rest, size_t n_rest,
                           const struct thaw_block_swa_rows *swa, const struct thaw_kvlayout_frame *f, const thaw_token *toks,
                       int n_toks, struct thaw_blocks_state *out)
{
    struct thaw_blocks_check *ck = calloc(1, sizeof *ck);
    uint32_t n_sids = swa ? swa->n_sids : 0, n_all = n_ids + n_sids;
    uint8_t *head0 = NULL, *shead0 = NULL;
    size_t n_head0 = 0, n_shead0 = 0, n_sec = 0;
    int own0 = 0, sown0 = 0;
    uint32_t k = 0;
    int rc = 0;

    if (swa && rest) {
        free(ck);
        return THAW_EINVAL;
    }
    if (!ck || !(ck->src = calloc((size_t)n_all + 1, sizeof *ck->src))) {
        free(ck);
        return THAW_ENOMEM;
    }
    ck->c = c;
    ck->n = ck->n_src = n_all;
    ck->block_tokens = block_tokens;
    ck->bad = -1;
    pthread_mutex_init(&ck->mu, NULL);
    pthread_cond_init(&ck->cv, NULL);
    for (k = 0; k < n_all; k++)
        ck->src[k].f.fd = -1;
    /* open them all first (blocks the RAM tier or the writer's queue holds
     * are copied from memory) */
    for (k = 0; k < n_all; k++) {
        const uint8_t *id = k < n_ids ? ids[k] : swa->sids[k - n_ids];
        if (thaw_tiers_held(c, ram, id, &ck->src[k].mem, &ck->src[k].n_mem) != 0 &&
            (rc = thaw_disk_cache_open_kv(c, id, &ck->src[k].f)) != 0)
            goto fail;
    }
    /* the kernel starts on the first READ_AHEAD bytes of files now: the
     * heads read next (one per section, cold, before anything can be laid
     * out) then come from reads already under way */
    uint64_t early = 0;
    for (k = 0; k < n_all && early < READ_AHEAD; k++)
        if (!ck->src[k].mem) {
            thaw_disk_kv_willneed(&ck->src[k].f);
            early += ck->src[k].f.size;
        }
    /* the shapes: each section's first block's head; every file block of
     * a section has the same head size */
    if ((rc = group_head(ck, 0, n_ids, &head0, &n_head0, &own0)) != 0 ||
        (rc = group_head(ck, n_ids, n_all, &shead0, &n_shead0, &sown0)) != 0)
        goto fail;
    if (!n_ids) {
        head0 = (void *)tail;
        n_head0 = tail_size;
    }
    uint32_t swa_cells = n_sids * block_tokens;
    if (swa && swa->tail) {
        uint32_t tpos, tcells;
        if ((rc = thaw_kvlayout_block_info(swa->tail, swa->n_tail, &tpos, &tcells)) != 0)
            goto fail;
        swa_cells += tcells;
        if (!n_sids) {
            shead0 = (void *)swa->tail;
            n_shead0 = swa->n_tail;
        }
    }
    if (swa && (!shead0 || (rc = thaw_kvlayout_section_size(shead0, n_shead0, swa_cells, f, &n_sec)) != 0)) {
        rc = rc ? rc : THAW_EINVAL;
        goto fail;
    }
    size_t headroom = thaw_kvstate_head_size(n_toks);
    rc = thaw_kvlayout_asm_new(head0, n_head0, (uint32_t)n_toks, f, swa ? n_sec : n_rest, headroom,
                               THAW_KVLAYOUT_ASM_BLOB, &ck->a);
    if (rc == 0 && swa)
        rc = thaw_kvlayout_asm_swa(ck->a, shead0, n_shead0, swa->pos0, swa_cells);
    if (rc != 0)
        goto fail;
    for (k = 0; k < n_all; k++) {
        ck->src[k].a = k < n_ids ? ck->a : thaw_kvlayout_asm_swa_part(ck->a);
        ck->src[k].pos0 = k < n_ids ? k * block_tokens : swa->pos0 + (k - n_ids) * block_tokens;
    }
    (void)thaw_workers_submit(thaw_disk_cache_workers(c), &ck->job, check_main, ck); /* refused: runs at wait */
    ck->submitted = 1;
    uint32_t ahead = 0; /* files asked for up to here */
    uint64_t asked = 0; /* their bytes past the file being read */
    for (k = 0; k < n_all; k++) {
        /* the kernel reads READ_AHEAD bytes of the next files while this
         * one is copied: a cold disk serves several files at once, and the
         * one needed next is not queued behind all the others */
        if (ahead <= k) {
            ahead = k;
            asked = 0;
        } else if (!ck->src[k].mem) {
            asked -= ck->src[k].f.size;
        }
        for (; ahead < n_all && (ahead == k || asked < READ_AHEAD); ahead++)
            if (!ck->src[ahead].mem) {
                thaw_disk_kv_willneed(&ck->src[ahead].f);
                if (ahead > k)
                    asked += ck->src[ahead].f.size;
            }
        if (ck->src[k].mem) {
            /* placed at the next position (every block before it held B) */
            uint32_t cells;
            rc = thaw_kvlayout_asm_copy(ck->src[k].a, ck->src[k].mem, ck->src[k].n_mem, &cells);
            if (rc == 0 && cells != block_tokens)
                rc = THAW_ECORRUPT;
        } else {
            rc = read_block(ck, k);
        }
        if (rc != 0)
            break;
        check_ready(ck, k + 1, 0);
    }
    /* the tails must hold exactly the cells past the whole blocks: placed
     * at the next position, and finish checks that every cell is there */
    if (rc == 0 && tail_size)
        rc = thaw_kvlayout_asm_copy(ck->a, tail, tail_size, NULL);
    if (rc == 0 && swa && swa->tail)
        rc = thaw_kvlayout_asm_copy(thaw_kvlayout_asm_swa_part(ck->a), swa->tail, swa->n_tail, NULL);
    size_t n_state;
    if (rc == 0)
        rc = thaw_kvlayout_asm_finish(ck->a, swa ? NULL : rest, swa ? 0 : n_rest, &out->kv, &n_state);
    if (rc != 0) {
        /* a block file that reads short or whose head does not fit its
         * place is bad: removed like a checksum mismatch */
        int bad = (rc == THAW_ECORRUPT || rc == THAW_EMISMATCH || rc == THAW_EINVAL || rc == THAW_EVERSION) &&
                          k < n_all && ck->src[k].f.fd >= 0
                      ? (int)k
                      : -1;
        if (ck->submitted) {
            check_ready(ck, 0, 1);
            thaw_workers_wait(thaw_disk_cache_workers(c), &ck->job);
        }
        if (own0)
            free(head0);
        if (sown0)
            free(shead0);
        ck_free(ck, bad >= 0 ? bad : ck->bad);
        if (rc == THAW_EINVAL || rc == THAW_EMISMATCH || rc == THAW_EVERSION)
            rc = THAW_ECORRUPT; /* blocks that do not fit together */
        return rc;
    }
    if (own0)
        free(head0);
    if (sown0)
        free(shead0);
    thaw_kvstate_write_head(out->kv, toks, n_toks, n_state);
    out->n_kv = headroom + n_state;
    out->n_tokens = n_toks;
    out->n_blocks = (int)n_all;
    out->check = ck;
    return 0;

fail:
    if (own0)
        free(head0);
    if (sown0)
        free(shead0);
    ck_free(ck, -1);
    if (rc == THAW_ECORRUPT)
        rc = THAW_ENOTFOUND; /* removed by the disk tier */
    return rc;
}

