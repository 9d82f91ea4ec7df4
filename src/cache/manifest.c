/* manifest.c — the manifest codec (manifest.h): its header, the checks
 * that make every length safe to read, the encoder. */
#include "cache/manifest.h"

#include "base/blob.h"
#include "base/error.h"
#include "cache/cache_idx.h" /* THAW_DISK_REFS_MAX: what one entry may name */

#include <string.h>

#define MANIFEST_MAGIC 0x31464d54u /* "TMF1" */

struct manifest_header {
    uint32_t magic, version, n_tokens, block_tokens;
    uint32_t n_blocks, n_snaps; /* n_snaps: 0 before snapshots (it was reserved) */
    uint64_t tail_size, swa_size;
};

/* version 2 goes on with this */
struct manifest_swa {
    uint32_t swa_first, n_window;
    uint64_t swa_tail_size;
};

uint32_t thaw_manifest_swa_first(uint32_t n, uint32_t n_window, uint32_t block_tokens)
{
    return n > n_window ? (n - n_window) / block_tokens : 0;
}

int thaw_manifest_is(const void *blob, size_t n)
{
    uint32_t magic;

    if (!blob || n < sizeof(struct manifest_header))
        return 0;
    memcpy(&magic, blob, sizeof magic);
    return magic == MANIFEST_MAGIC;
}

int thaw_manifest_head_tokens(const void *head, size_t n, size_t *off, uint32_t *n_tokens)
{
    struct manifest_header h;
    size_t hsize = sizeof h;

    if (!thaw_manifest_is(head, n))
        return THAW_ECORRUPT;
    memcpy(&h, head, sizeof h);
    if (h.version == THAW_MANIFEST_V2_SWA)
        hsize += sizeof(struct manifest_swa);
    else if (h.version != THAW_MANIFEST_V1)
        return THAW_EVERSION;
    *off = hsize;
    *n_tokens = h.n_tokens;
    return 0;
}

/* Whether a header (and version 2's part, w; zeros in version 1) agrees
 * with itself and with a blob of n bytes. 0 or THAW_ECORRUPT. */
static int check(const struct manifest_header *h, const struct manifest_swa *w, size_t n)
{
    size_t hsize = sizeof *h + (h->version == THAW_MANIFEST_V2_SWA ? sizeof *w : 0);
    uint32_t n_sids = 0;

    if (h->version == THAW_MANIFEST_V2_SWA) {
        if (h->swa_size != 0 || w->n_window == 0 || w->swa_first > h->n_blocks ||
            (w->swa_tail_size == 0) != (h->tail_size == 0) || w->swa_tail_size > n)
            return THAW_ECORRUPT;
        n_sids = h->n_blocks - w->swa_first;
    }
    /* every length against the blob, in 64 bits */
    uint64_t need = (uint64_t)hsize + (uint64_t)h->n_tokens * 4 +
                    ((uint64_t)h->n_blocks + n_sids + h->n_snaps) * THAW_KEY_BYTES;
    if (h->block_tokens == 0 || h->n_tokens == 0 || h->n_blocks != h->n_tokens / h->block_tokens ||
        h->n_snaps > THAW_DISK_REFS_MAX || h->tail_size > n || h->swa_size > n ||
        need + h->tail_size + h->swa_size + w->swa_tail_size != n)
        return THAW_ECORRUPT;
    /* the tail: inline, or in the last snapshot (which holds the swa part
     * too); snapshots are version 1's (manifest.h): SWA rows are not */
    if (h->n_snaps ? h->tail_size != 0 || h->swa_size != 0 || h->version != THAW_MANIFEST_V1
                   : (h->tail_size == 0) != (h->n_tokens % h->block_tokens == 0))
        return THAW_ECORRUPT;
    /* a restore at n_tokens needs the SWA blocks from the window's start */
    if (h->version == THAW_MANIFEST_V2_SWA) {
        uint32_t need_first = thaw_manifest_swa_first(h->n_tokens, w->n_window, h->block_tokens);
        if (need_first < w->swa_first && need_first < h->n_blocks)
            return THAW_ECORRUPT;
    }
    return 0;
}

int thaw_manifest_parse(const void *blob, size_t n, struct thaw_manifest *m)
{
    const uint8_t *b = blob;
    struct manifest_header h;
    struct manifest_swa w = {0};
    size_t hsize = sizeof h;
    int rc;

    memset(m, 0, sizeof *m);
    if (!thaw_manifest_is(blob, n))
        return THAW_ECORRUPT;
    memcpy(&h, b, sizeof h);
    if (h.version == THAW_MANIFEST_V2_SWA) {
        if (n < sizeof h + sizeof w)
            return THAW_ECORRUPT;
        memcpy(&w, b + sizeof h, sizeof w);
        hsize += sizeof w;
    } else if (h.version != THAW_MANIFEST_V1) {
        return THAW_EVERSION;
    }
    if ((rc = check(&h, &w, n)) != 0)
        return rc;
    uint32_t n_sids = h.version == THAW_MANIFEST_V2_SWA ? h.n_blocks - w.swa_first : 0;
    const uint8_t *p = b + hsize;
    *m = (struct thaw_manifest){
        .version = h.version,
        .n_tokens = h.n_tokens,
        .block_tokens = h.block_tokens,
        .n_blocks = h.n_blocks,
        .tokens = p,
        .ids = p + (size_t)h.n_tokens * 4,
        .swa_first = w.swa_first,
        .n_window = w.n_window,
        .n_snaps = h.n_snaps,
        .tail_size = (size_t)h.tail_size,
        .swa_tail_size = (size_t)w.swa_tail_size,
        .swa_size = (size_t)h.swa_size,
    };
    const uint8_t *sids = m->ids + (size_t)h.n_blocks * THAW_KEY_BYTES;
    const uint8_t *snaps = sids + (size_t)n_sids * THAW_KEY_BYTES;
    const uint8_t *tail = snaps + (size_t)h.n_snaps * THAW_KEY_BYTES;
    m->sids = h.version == THAW_MANIFEST_V2_SWA ? sids : NULL;
    m->snaps = h.n_snaps ? snaps : NULL;
    m->tail = m->tail_size ? tail : NULL;
    m->swa_tail = m->swa_tail_size ? tail + m->tail_size : NULL;
    m->swa = m->swa_size ? tail + m->tail_size + m->swa_tail_size : NULL;
    return 0;
}

int thaw_manifest_encode(const struct thaw_manifest *m, void **blob, size_t *n, struct thaw_manifest_sections *at)
{
    const int v2 = m->version == THAW_MANIFEST_V2_SWA;
    struct manifest_header h = {
        .magic = MANIFEST_MAGIC,
        .version = m->version,
        .n_tokens = m->n_tokens,
        .block_tokens = m->block_tokens,
        .n_blocks = m->n_blocks,
        .n_snaps = m->n_snaps,
        .tail_size = m->tail_size,
        .swa_size = m->swa_size,
    };
    struct manifest_swa w = {
        .swa_first = v2 ? m->swa_first : 0,
        .n_window = v2 ? m->n_window : 0,
        .swa_tail_size = v2 ? m->swa_tail_size : 0,
    };
    size_t hsize = sizeof h + (v2 ? sizeof w : 0);
    uint32_t n_sids = v2 && m->swa_first <= m->n_blocks ? m->n_blocks - m->swa_first : 0;
    size_t head = hsize + (size_t)m->n_tokens * 4 + ((size_t)m->n_blocks + n_sids + m->n_snaps) * THAW_KEY_BYTES;
    size_t total = head + m->tail_size + (size_t)w.swa_tail_size + m->swa_size;
    uint8_t *b, *p;

    *blob = NULL;
    *n = 0;
    if ((m->version != THAW_MANIFEST_V1 && !v2) || (!v2 && m->swa_tail_size) || check(&h, &w, total) != 0 ||
        (m->n_tokens && !m->tokens) || (m->n_blocks && !m->ids) || (n_sids && !m->sids) || (m->n_snaps && !m->snaps))
        return THAW_EINVAL;
    if (!(b = thaw_blob_alloc(total)))
        return THAW_ENOMEM;
    memcpy(b, &h, sizeof h);
    if (v2)
        memcpy(b + sizeof h, &w, sizeof w);
    p = b + hsize;
    memcpy(p, m->tokens, (size_t)m->n_tokens * 4);
    p += (size_t)m->n_tokens * 4;
    if (m->n_blocks)
        memcpy(p, m->ids, (size_t)m->n_blocks * THAW_KEY_BYTES);
    p += (size_t)m->n_blocks * THAW_KEY_BYTES;
    if (n_sids)
        memcpy(p, m->sids, (size_t)n_sids * THAW_KEY_BYTES);
    p += (size_t)n_sids * THAW_KEY_BYTES;
    if (m->n_snaps)
        memcpy(p, m->snaps, (size_t)m->n_snaps * THAW_KEY_BYTES);
    p += (size_t)m->n_snaps * THAW_KEY_BYTES;
    struct thaw_manifest_sections s = {
        .tail = m->tail_size ? p : NULL,
        .swa_tail = w.swa_tail_size ? p + m->tail_size : NULL,
        .swa = m->swa_size ? p + m->tail_size + w.swa_tail_size : NULL,
    };
    if (s.tail && m->tail)
        memcpy(s.tail, m->tail, m->tail_size);
    if (s.swa_tail && m->swa_tail)
        memcpy(s.swa_tail, m->swa_tail, m->swa_tail_size);
    if (s.swa && m->swa)
        memcpy(s.swa, m->swa, m->swa_size);
    if (at)
        *at = s;
    *blob = b;
    *n = total;
    return 0;
}

int thaw_manifest_ids(const void *blob, size_t n, const uint8_t **ids, uint32_t *n_ids)
{
    struct thaw_manifest m;
    int rc = thaw_manifest_parse(blob, n, &m);

    if (rc != 0)
        return rc;
    *ids = m.ids; /* the SWA ids, then the snapshots, follow the ids */
    *n_ids = m.n_blocks + (m.sids ? m.n_blocks - m.swa_first : 0) + m.n_snaps;
    return 0;
}

int thaw_manifest_snaps(const void *blob, size_t n, const uint8_t **snaps, uint32_t *n_snaps)
{
    struct thaw_manifest m;
    int rc = thaw_manifest_parse(blob, n, &m);

    if (rc != 0)
        return rc;
    *snaps = m.snaps;
    *n_snaps = m.n_snaps;
    return 0;
}

int thaw_manifest_swa_rows(const void *blob, size_t n)
{
    struct thaw_manifest m;

    return thaw_manifest_parse(blob, n, &m) == 0 && m.version == THAW_MANIFEST_V2_SWA;
}
