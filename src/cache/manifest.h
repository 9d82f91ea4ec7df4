/* manifest.h — the manifest codec: what a conversation's key names in the
 * block store (DESIGN §9), its bytes, encoded and validated in one place.
 *
 * A manifest is the .kv part of a conversation's entry. It names the
 * content-addressed entries the conversation's state is built from (blocks,
 * SWA blocks: blocks.h; snapshots: snapshots.h) and carries what cannot be
 * cut. Host byte order (little-endian on every platform thaw builds for):
 *
 *   u32 magic "TMF1" | u32 version (1) | u32 n_tokens | u32 block_tokens (B)
 *   u32 n_blocks | u32 n_snaps | u64 tail_size | u64 swa_size
 *   [version 2: u32 swa_first | u32 n_window | u64 swa_tail_size]
 *   i32 tokens[n_tokens]
 *   u8  ids[n_blocks][32]     block k holds positions [kB, (k+1)B)
 *   u8  sids[n_blocks - swa_first][32]  version 2: the SWA blocks of
 *                             blocks swa_first .. n_blocks-1
 *   u8  snaps[n_snaps][32]    a hybrid's snapshots, the last one at
 *                             n_tokens; with them tail and swa are empty
 *                             (that snapshot holds both)
 *   u8  tail[tail_size]       the cells past the last whole block, as one
 *                             kvlayout block (absent when B divides n_tokens)
 *   u8  swa_tail[swa_tail_size]  version 2: the SWA rows of the tail's cells
 *   u8  swa[swa_size]         version 1: the uncut SWA window section
 *                             (kvlayout tail); 0 in version 2
 *
 * n_blocks is n_tokens / B. n_snaps was a reserved 0 before snapshots: a
 * manifest written before them reads as one without. All a manifest names
 * (ids, sids, snaps) is one contiguous run (thaw_manifest_ids): what the
 * disk tier's collector counts (entry_kind.h).
 *
 * Version 2 is a sliding-window model's whose blocks carry their SWA rows
 * (DESIGN §12): the run of SWA blocks ends at the last block and starts no
 * later than the one a restore at n_tokens needs (thaw_manifest_swa_first),
 * so no window is copied per turn. Version 2 is SWA rows, not snapshots: a
 * version 2 manifest has n_snaps 0 (no layout kvlayout.h knows has both),
 * and a version 1 manifest with snapshots is a hybrid's.
 *
 * Every length is checked against the blob, in 64 bits, before anything is
 * read: a damaged manifest is THAW_ECORRUPT, never an overread
 * (tests/fuzz/fuzz_manifest.c).
 */
#ifndef THAW_MANIFEST_H
#define THAW_MANIFEST_H

#include "base/key.h"

#include <stddef.h>
#include <stdint.h>

#define THAW_MANIFEST_V1 1u     /* blocks, then a tail and a window copy, or snapshots */
#define THAW_MANIFEST_V2_SWA 2u /* blocks carry their SWA rows */

/* A manifest's fields: what thaw_manifest_encode writes, what
 * thaw_manifest_parse points into a blob. The id arrays are
 * THAW_KEY_BYTES each, back to back. */
struct thaw_manifest {
    uint32_t version; /* THAW_MANIFEST_V1 or THAW_MANIFEST_V2_SWA */
    uint32_t n_tokens;
    uint32_t block_tokens;
    uint32_t n_blocks;  /* n_tokens / block_tokens */
    const void *tokens; /* n_tokens x i32; in a parsed blob not aligned: copy them out */
    const uint8_t *ids; /* n_blocks ids */
    uint32_t swa_first; /* version 2: the first block with an SWA block; else 0 */
    uint32_t n_window;  /* version 2: the sliding window, tokens; else 0 */
    const uint8_t *sids; /* version 2: n_blocks - swa_first SWA ids; else NULL */
    uint32_t n_snaps;
    const uint8_t *snaps; /* n_snaps snapshot ids */
    const void *tail;     /* tail_size bytes (encode: NULL leaves them to the caller) */
    size_t tail_size;
    const void *swa_tail; /* version 2, as tail */
    size_t swa_tail_size;
    const void *swa; /* version 1, as tail */
    size_t swa_size;
};

/* Where an encoded manifest's byte sections lie in its blob (NULL when
 * empty): the caller writes those it gave no bytes for. */
struct thaw_manifest_sections {
    uint8_t *tail, *swa_tail, *swa;
};

/* 1 if blob starts like a manifest (magic, and a header's length), else 0. */
int thaw_manifest_is(const void *blob, size_t n);

/* From a manifest's first n bytes (its header at least; the rest need not
 * be there): where its token ids start (*off) and how many (*n_tokens), for
 * a reader that wants them without the whole manifest. 0, THAW_ECORRUPT
 * (not a manifest's header) or THAW_EVERSION. */
int thaw_manifest_head_tokens(const void *head, size_t n, size_t *off, uint32_t *n_tokens);

/* Validates the manifest of n bytes at blob and points m into it. Returns
 * 0, THAW_ECORRUPT (not a manifest, or lengths that do not add up to n) or
 * THAW_EVERSION (another format version). */
int thaw_manifest_parse(const void *blob, size_t n, struct thaw_manifest *m);

/* Encodes m into a new blob (blob.h: the caller drops it with
 * thaw_blob_unref). Sections whose bytes m gives (tail, swa_tail, swa) are
 * copied; those it gives as NULL with a size are left for the caller to
 * write at *at (at may be NULL when there are none). Returns 0,
 * THAW_EINVAL (m would not parse back: lengths or fields that disagree)
 * or THAW_ENOMEM. */
int thaw_manifest_encode(const struct thaw_manifest *m, void **blob, size_t *n, struct thaw_manifest_sections *at);

/* The ids a manifest names (pointing into it): its blocks, then its SWA
 * blocks (version 2), then its snapshots, contiguous. Returns 0 or as
 * thaw_manifest_parse. */
int thaw_manifest_ids(const void *blob, size_t n, const uint8_t **ids, uint32_t *n_ids);

/* The snapshot ids a manifest names (pointing into it; NULL and 0 for a
 * manifest without). 0 or as thaw_manifest_parse. */
int thaw_manifest_snaps(const void *blob, size_t n, const uint8_t **snaps, uint32_t *n_snaps);

/* 1 when the blob is a manifest whose blocks carry their SWA rows
 * (version 2): a restore rebuilds the window from them, so the
 * conversation's checkpoints (a window copy each) need not be stored with
 * it. 0 otherwise (not a manifest, version 1, damaged). */
int thaw_manifest_swa_rows(const void *blob, size_t n);

/* The first block whose SWA rows a restore at n needs: the window
 * [n - n_window, n) starts in it (the token at n attends to the
 * n_window - 1 before it). */
uint32_t thaw_manifest_swa_first(uint32_t n, uint32_t n_window, uint32_t block_tokens);

#endif
