/* blocks.h — a conversation's state as content-addressed blocks plus a
 * manifest (DESIGN §9), over the disk tier (cache_disk.h).
 *
 * Storing each turn's whole state writes the conversation again every turn
 * (O(turns²) bytes) and keeps a full copy per turn. Here the attention KV
 * of positions [kB, (k+1)B) is block k, stored as its own disk entry under
 * its id:
 *
 *   id_0 = BLAKE2b-256(key = binding, "thaw-block-v1" | 32 zero bytes | tokens[0, B))
 *   id_k = BLAKE2b-256(key = binding, "thaw-block-v1" | id_{k-1}      | tokens[kB, (k+1)B))
 *
 * (tokens as i32 little-endian). The chain makes a block's id name its whole
 * prefix, so equal prefixes give equal ids in every conversation of the same
 * binding (model, state-shaping settings, tenant) and a block is written
 * once, ever: a store skips the ids the disk already holds.
 *
 * The conversation's key names a manifest, its .kv part (manifest.h: its
 * bytes, encoded and checked there): the tokens, the block ids, the cells
 * past the last whole block (the tail) and the SWA window section, or a
 * hybrid's snapshots instead of those two (snapshots.h).
 *
 * A sliding-window model's manifest is version 2 when its blocks carry
 * their SWA rows (DESIGN §12): each block k then has an SWA block, the SWA
 * layers' rows of the same positions, stored as its own entry under
 *
 *   sid_k = BLAKE2b-256(key = id_k, "thaw-swa-v1")
 *
 * and the manifest names the run of SWA blocks that ends at the last
 * block, and the tail's SWA rows instead of a window copy: no window is
 * copied per turn. A restore at n installs section 0 from the blocks and
 * rebuilds the SWA section from the SWA blocks covering [n - n_window, n).
 *
 * The manifest is submitted after its blocks, to the same FIFO writer, so
 * it commits last: a crash leaves blocks without a manifest (collected once
 * their grace is over, cache_disk.c), never a manifest whose blocks were
 * not yet written. The disk tier learns which entries are blocks and which
 * blocks a manifest names from thaw_entry_classify (entry_kind.h) at store
 * time: TTL and LRU act on manifests, and a block goes once no manifest
 * names it. A manifest whose block went missing or bad since is a miss (the
 * block's own checksum decides, cache_disk.c), never a wrong state.
 *
 * Blocks hold no sequence id: assembly takes the frame (seq id, streams) of
 * the slot that restores, so a conversation stored from slot 1 under -np 2
 * restores into slot 0 under -np 3.
 *
 * Layouts kvlayout.h refuses (purely recurrent, MLA, another libllama
 * build) give THAW_ELAYOUT: the caller stores whole-state entries instead
 * (a hybrid's recurrent tail parses, and goes in snapshots: snapshots.h).
 */
#ifndef THAW_BLOCKS_H
#define THAW_BLOCKS_H

#include "base/key.h"
#include "base/token.h"
#include "cache/block_reader.h" /* struct thaw_blocks_state: what a load gives */
#include "cache/cache_disk.h"
#include "cache/cache_ram.h"
#include "llama/kvlayout.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define THAW_BLOCKS_DEFAULT_TOKENS 128

struct thaw_blocks_stats {
    uint32_t written;       /* blocks submitted to the writer */
    uint32_t skipped;       /* blocks the disk already held */
    uint32_t dropped;       /* blocks the writer refused (queue full, ...) */
    uint64_t bytes_written; /* bytes of the blocks submitted */
};

/* The ids of the n / B whole blocks of toks (ids: room for n / B). */
void thaw_blocks_ids(const uint8_t binding[THAW_KEY_BYTES], uint32_t block_tokens, const thaw_token *toks, int n,
                     uint8_t (*ids)[THAW_KEY_BYTES]);

/* Where a store cuts its blocks from, when not from a capture: the KV
 * cache's own memory, which the engine reads (it owns the context) and
 * describes here. Every function gets ud; a, b are positions, [a, b) the
 * cells of one block (or of the tail past the last whole block). */
struct thaw_blocks_src {
    uint32_t n_cells;
    size_t (*size)(const void *ud, uint32_t a, uint32_t b);                    /* of the block of [a, b) */
    int (*cut)(const void *ud, uint32_t a, uint32_t b, void *dst, size_t cap); /* 0 or an error */
    int (*known)(const void *ud, uint32_t a, uint32_t b); /* can cut [a, b)? NULL: all */
    const void *ud;
    const void *swa; /* the uncut SWA section, or NULL */
    size_t n_swa;
    /* SWA rows (DESIGN §12; NULL: none): the SWA block of [a, b), as size,
     * cut and known above. A store that can give the SWA blocks a restore
     * at n needs ([n - n_window, n), block-aligned) writes them, and every
     * earlier one it can, instead of the window section */
    size_t (*swa_size)(const void *ud, uint32_t a, uint32_t b);
    int (*swa_cut)(const void *ud, uint32_t a, uint32_t b, void *dst, size_t cap);
    int (*swa_known)(const void *ud, uint32_t a, uint32_t b);
    uint32_t n_window; /* the sliding window, tokens (llama_model_n_swa) */
    /* a hybrid's snapshots (snapshots.h), the last one at n_cells: the
     * manifest names them instead of carrying a tail and swa. NULL/0: none.
     * Not with SWA rows (THAW_EINVAL) */
    const uint8_t (*snaps)[THAW_KEY_BYTES];
    uint32_t n_snaps;
};

/* One store: the conversation toks[0, n) as blocks plus its manifest. */
struct thaw_blocks_store_params {
    struct thaw_disk_cache *disk;
    struct thaw_ram_cache *ram; /* may be NULL */
    const uint8_t *binding;     /* THAW_KEY_BYTES: the blocks' binding (keys.h) */
    uint32_t block_tokens;      /* B */
    const thaw_token *toks;
    int n;
    /* the cells, from one of: */
    const struct thaw_blocks_src *src; /* a source (above); NULL: the capture below */
    const void *state;                 /* a libllama sequence state of toks[0, n) */
    size_t n_state;                    /* (llama_state_seq_get_data output), cut here */
    uint32_t window;                   /* with a capture: the sliding window, tokens (0: none) */
    /* with a source: only the whole blocks of toks[0, n), and their SWA
     * blocks the source has, submitted unsynced (cache_disk.h), no
     * manifest (NULL): a turn's prompt, ahead of the store that names them */
    bool ahead;
};

/* Cuts the cells into blocks, submits to the disk writer those it does
 * not hold (each an entry of one .kv part: the block; one the RAM tier
 * `ram` holds is taken from there, and one cut anew is also put into
 * `ram`, one copy shared by both), and builds the manifest (a blob,
 * blob.h: the caller submits it as the conversation entry's .kv part, or
 * drops it with thaw_blob_unref).
 *
 * From a capture of an SWA model (window > 0), the capture's SWA section
 * gives the SWA rows of the blocks it still holds; when they cover what a
 * restore at n needs, the manifest is version 2 (no window copy). From a
 * source, what it does not know of the cells the store needs (blocks
 * neither tier holds, the tail) is THAW_ENOTFOUND, with nothing submitted
 * and nothing held: capture the whole state instead.
 *
 * On 0 the manifest's block ids are held (thaw_disk_cache_hold), so that
 * none is collected before the manifest is queued: the caller, once it has
 * submitted the manifest (or given up), drops the hold with
 * thaw_disk_cache_unhold(c, ids, n_ids) of thaw_blocks_manifest_ids() of
 * the manifest. On an error nothing is held.
 * st (may be NULL) gets the counts. Returns 0, THAW_ELAYOUT (a capture of
 * an unknown layout: store the whole state instead), THAW_EINVAL (no
 * cells, or the cells are not n), THAW_ENOTFOUND (above), THAW_ENOMEM. A
 * block the writer drops makes the store fail (THAW_EBUSY): the manifest
 * would name it. */
int thaw_blocks_store(const struct thaw_blocks_store_params *p, void **manifest, size_t *n_manifest,
                      struct thaw_blocks_stats *st);

/* Builds the state a manifest describes, taking its blocks from the RAM
 * tier `ram` (may be NULL), the disk writer's queue or the disk
 * (their checksums: thaw_blocks_state_check), for the slot of frame f.
 * A manifest naming snapshots is a hybrid's: thaw_snapshots_load's.
 * Returns 0, THAW_ECORRUPT (a bad manifest, or a block — the tail too —
 * whose header does not fit its place), THAW_EVERSION (a manifest of
 * another format version), THAW_ENOTFOUND (a block is gone: evicted, or found
 * corrupt and removed), THAW_EINVAL (a manifest naming snapshots),
 * THAW_ENOMEM, or a disk error. */
int thaw_blocks_load(struct thaw_disk_cache *c, struct thaw_ram_cache *ram, const void *manifest, size_t n_manifest,
                     const struct thaw_kvlayout_frame *f, struct thaw_blocks_state *out);

/* The state of toks[0, p) from its blocks 0 .. p/B - 1 (ids computed
 * here), then `tail` (the cells [p/B*B, p) as one kvlayout block; NULL/0
 * when B divides p) and `rest` appended verbatim (a recurrent state), for
 * frame f: a hybrid's restore at a snapshot (snapshots.c). Returns as
 * thaw_blocks_load. */
int thaw_blocks_load_at(struct thaw_disk_cache *c, struct thaw_ram_cache *ram, const uint8_t binding[THAW_KEY_BYTES],
                        uint32_t block_tokens, const thaw_token *toks, int p, const void *tail, size_t n_tail,
                        const void *rest, size_t n_rest, const struct thaw_kvlayout_frame *f,
                        struct thaw_blocks_state *out);

/* One prefix lookup: the stored state of toks[0, n)'s longest prefix. */
struct thaw_blocks_prefix_params {
    struct thaw_disk_cache *disk;
    struct thaw_ram_cache *ram; /* may be NULL */
    const uint8_t *binding;     /* THAW_KEY_BYTES */
    uint32_t block_tokens;
    uint32_t n_window; /* a sliding-window model's window, tokens; 0: none */
    const thaw_token *toks;
    int n;
    const struct thaw_kvlayout_frame *frame; /* the restoring slot's */
};

/* The longest run of toks' whole blocks the disk holds, from block 0,
 * restorable for the slot of the frame. At least one token of toks is
 * left out (the request must decode one). With a window, the deepest
 * boundary b of that run whose SWA blocks covering [b - n_window, b) are
 * stored too; the state then holds the run's blocks and an SWA section
 * rebuilt from those. (A hybrid's lookup is thaw_snapshots_prefix, with
 * the same params.)
 * Returns 0 and fills out (n_blocks >= 1), THAW_ENOTFOUND (not even block
 * 0), or an error as thaw_blocks_load. */
int thaw_blocks_prefix(const struct thaw_blocks_prefix_params *p, struct thaw_blocks_state *out);

/* The id of block id's SWA block. */
void thaw_blocks_swa_id(const uint8_t id[THAW_KEY_BYTES], uint8_t sid[THAW_KEY_BYTES]);

#endif
