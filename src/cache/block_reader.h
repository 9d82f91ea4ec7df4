/* block_reader.h — reads a run of blocks into one restorable state
 * (DESIGN §9): the disk side of a restore, under the tier policy.
 *
 * Each block comes from the first tier that has it, in tiers.h's order:
 * the RAM tier's copy, the disk writer's queue, then its file. Files are
 * opened first (each open starts the kernel's read), read ahead
 * READ_AHEAD bytes past the one being copied, and preadv'd straight into
 * their place in the state being assembled (kvlayout.h); their checksums
 * run on the disk tier's worker pool (workers.h) behind the reads and then
 * alongside libllama's copy of the state, and thaw_blocks_state_check says
 * whether the install must be undone.
 *
 * What the blocks are, their ids and the manifest that names them are
 * blocks.h's (the format); this file knows only where a block's bytes are
 * and how they get into place.
 */
#ifndef THAW_BLOCK_READER_H
#define THAW_BLOCK_READER_H

#include "base/key.h"
#include "base/token.h"
#include "cache/cache_disk.h"
#include "cache/cache_ram.h"
#include "llama/kvlayout.h"

#include <stddef.h>
#include <stdint.h>

/* A restorable state: a .kv blob in kvstate.h's format (header, tokens,
 * then what llama_state_seq_set_data takes), built in place. Free with
 * thaw_blocks_state_free. */
struct thaw_blocks_state {
    void *kv; /* a blob (blob.h) */
    size_t n_kv;
    int n_tokens;
    int n_blocks;                    /* blocks read from disk */
    struct thaw_blocks_check *check; /* checksums still running; see below */
};

/* Frees s (waiting for its checksums first). */
void thaw_blocks_state_free(struct thaw_blocks_state *s);

/* The blocks of a loaded state are read straight into place and their
 * checksums computed on the disk tier's worker pool while the caller
 * installs the state; this waits for them (or computes them here when no
 * worker has started them). Returns 0, or THAW_ECORRUPT: a block did not
 * match (it has been removed), so the installed state must be undone
 * before anything is decoded from it. Call once, before freeing. */
int thaw_blocks_state_check(struct thaw_blocks_state *s);

/* The SWA rows of a restore (DESIGN §12): SWA blocks sids[0, n_sids) of
 * positions pos0.. in B steps, then `tail` (the SWA rows of the cells past
 * the last whole block; NULL: none), read into the state's SWA section as
 * section 0's blocks are into theirs. */
struct thaw_block_swa_rows {
    const uint8_t (*sids)[THAW_KEY_BYTES];
    uint32_t n_sids, pos0;
    const void *tail;
    size_t n_tail;
};

/* Reads blocks ids[0, n_ids) (block k must hold positions [kB, (k+1)B)),
 * then appends the extra block (the tail; may be NULL) and either `rest`
 * verbatim (a version 1 manifest's window, a hybrid's recurrent state) or
 * the SWA section built from `swa` in place, and assembles them for frame
 * f. The checksums of the blocks read from files go on in out->check.
 * Returns 0, THAW_EINVAL (swa and rest both given) or as thaw_blocks_load
 * (blocks.h); *out is thaw_blocks_state_free'd by the caller either way. */
int thaw_block_reader_load(struct thaw_disk_cache *c, struct thaw_ram_cache *ram,
                           const uint8_t (*ids)[THAW_KEY_BYTES], uint32_t n_ids, uint32_t block_tokens,
                           const void *tail, size_t tail_size, const void *rest, size_t n_rest,
                           const struct thaw_block_swa_rows *swa, const struct thaw_kvlayout_frame *f,
                           const thaw_token *toks, int n_toks, struct thaw_blocks_state *out);

#endif
