/* snapshots.h — a hybrid model's recurrent state, stored at chosen
 * positions, content-addressed like blocks (DESIGN §12).
 *
 * A hybrid (qwen35, lfm2, granitehybrid, ...) keeps attention layers, cut
 * into blocks as for a dense model (blocks.h), and recurrent layers (gated
 * delta-net, Mamba, short convolutions) whose state exists only as a
 * whole, at one position: it cannot be cut, nor rolled back. So it is
 * stored as a snapshot at a few positions p, each one a disk entry of its
 * own:
 *
 *   u32 magic "TSN1" | u32 version (1) | u32 n_tokens (p) | u32 block_tokens (B)
 *   u64 tail_size | u64 rec_size
 *   u8  tail[tail_size]  the attention cells [floor(p/B)*B, p) as one
 *                        kvlayout block (absent when B divides p)
 *   u8  rec[rec_size]    the recurrent state at p, as libllama writes it
 *                        after the attention section (kvlayout.h: the tail)
 *
 * under the id
 *
 *   BLAKE2b-256(key = binding, "thaw-snap-v1" | id of block floor(p/B)-1
 *               (32 zero bytes when p < B) | u32 p | tokens[floor(p/B)*B, p))
 *
 * which names the whole prefix [0, p) (the block chain up to its last whole
 * block, then the tokens past it): conversations that share a prefix share
 * its snapshots, and a snapshot is written once, ever. A restore at p takes
 * blocks 0 .. floor(p/B)-1 and the snapshot.
 *
 * Where (thaw_slotkv and the engine choose; each is a context checkpoint
 * of the slot, kvstate.h, taken as the decode passes p):
 *   - the end of every turn: the manifest names its snapshots, the last one
 *     at the manifest's own end (it replaces the manifest's tail);
 *   - the end of the leading system/developer/tool messages: the branch
 *     point new conversations share (a grid alone misses it: vllm#45238);
 *   - every --kv-cache-snapshot-every tokens of a long prefill.
 * A prefix lookup (no manifest for the conversation) resumes at the deepest
 * snapshot inside the prompt whose blocks are stored.
 *
 * Written when (the turn's end): a turn-end snapshot is kept in memory by
 * the caller (thaw_snapshot_pending, one per slot: kvcache.c), not
 * written with its turn, and written (thaw_snapshots_flush) only when the
 * slot is about to lose the conversation: its sequence cut below that
 * position (another conversation takes the slot, a rollback, an error),
 * the next turn's store of a different conversation, the slot idle for
 * --kv-snapshot-idle seconds, or a clean shutdown. A conversation that
 * keeps its slot writes none: its next turn's store supersedes it
 * (dropped, never written). On a real hybrid the recurrent state is tens
 * of MB a turn, more than the turn's attention rows; so is a partial
 * block of attention rows at each turn's end (the snapshot's tail). The
 * manifest and blocks of every turn are still written with the turn; the
 * pending snapshot has the id today's would have, so the manifest names
 * it and the next turn's key finds it once written. The price: a crash
 * (kill -9, power) loses the pending ones, and a returning conversation
 * then finds its manifest without its last snapshot (a miss: the manifest
 * is removed) and resumes at the deepest snapshot persisted (the branch
 * point, every -cpent tokens, an earlier handover) with its blocks, and
 * prefills the rest: exact, only slower.
 *
 * GC and crash safety are the blocks': a snapshot is an entry of kind
 * block (thaw_entry_classify), named by the manifests that use it, held
 * from the store until its manifest is queued, written before that
 * manifest by the same FIFO writer; a crash leaves at most an unnamed
 * snapshot, collected after its grace. A turn-end snapshot written late
 * follows its manifest: named from the moment it lands (refcounts go by
 * id, cache_disk.c), and a crash before it lands leaves a manifest
 * without its last snapshot, which a lookup removes (above).
 */
#ifndef THAW_SNAPSHOTS_H
#define THAW_SNAPSHOTS_H

#include "base/key.h"
#include "base/token.h"
#include "cache/blocks.h"
#include "cache/cache_disk.h"
#include "cache/cache_ram.h"
#include "llama/kvlayout.h"

#include <stddef.h>
#include <stdint.h>

/* The id of the snapshot at p (1 <= p): prev is the id of block p/B - 1
 * (NULL when p < B), toks the conversation's tokens (at least p). */
void thaw_snapshots_id(const uint8_t binding[THAW_KEY_BYTES], uint32_t block_tokens, const uint8_t *prev,
                       const thaw_token *toks, uint32_t p, uint8_t out[THAW_KEY_BYTES]);

/* 1 if blob starts like a snapshot (magic), else 0. */
int thaw_snapshots_is(const void *blob, size_t n);

struct thaw_snapshot_view {
    uint32_t n_tokens, block_tokens;
    const void *tail; /* NULL when tail_size is 0 */
    size_t tail_size;
    const void *rec;
    size_t rec_size;
};

/* Validates a snapshot and points v into it. 0, THAW_ECORRUPT or
 * THAW_EVERSION. */
int thaw_snapshots_parse(const void *blob, size_t n, struct thaw_snapshot_view *v);

/* A turn-end snapshot not written yet: its entry's bytes, ready to submit. */
struct thaw_snapshot_pending {
    uint8_t id[THAW_KEY_BYTES]; /* thaw_snapshots_id at p */
    uint32_t p;                 /* its position: the stored conversation's length */
    void *blob;                 /* the entry (a blob reference, owned here); NULL: none pending */
    size_t size;                /* of blob */
    int64_t since_us;           /* when it was kept (the caller's clock, for --kv-snapshot-idle) */
};

/* Stores a hybrid model's capture as blocks and snapshots: the capture
 * p->state of p->toks[0, n) (p->src must be NULL: a source holds no
 * recurrent state) and the slot's checkpoints (ckpt, n_ckpt: a .ckpt blob,
 * kvstate.h; may be empty) each at or below n become snapshots (those the
 * disk lacks are submitted), the state's own end the last one; then the
 * blocks and the manifest, which names the snapshots (thaw_blocks_store).
 * On 0 the manifest's blocks and snapshots are held as thaw_blocks_store
 * holds its blocks. defer (NULL: write it now, as the others): the end's
 * snapshot, when the disk lacks it, is built but not submitted; *defer
 * takes it (defer->blob NULL when there was nothing to write; since_us is
 * left 0), and the manifest still names it. Returns 0, THAW_ELAYOUT (not
 * a hybrid layout: use thaw_blocks_store), THAW_ECORRUPT (a bad .ckpt
 * blob), THAW_EINVAL (a source), or thaw_blocks_store's errors (then
 * *defer is empty). */
int thaw_snapshots_store(const struct thaw_blocks_store_params *p, const void *ckpt, size_t n_ckpt, void **manifest,
                         size_t *n_manifest, struct thaw_snapshot_pending *defer, struct thaw_blocks_stats *st);

/* Writes a pending snapshot: submitted to the disk writer unless the disk
 * holds it already; *pd is empty afterwards either way. *n_written (may be
 * NULL): its bytes when submitted, else 0. Returns 0 (also when nothing
 * was pending or the disk had it) or thaw_disk_cache_submit's error (the
 * snapshot is dropped: a returning conversation resumes further back). */
int thaw_snapshots_flush(struct thaw_disk_cache *c, struct thaw_snapshot_pending *pd, size_t *n_written);

/* Drops a pending snapshot unwritten (its conversation went on: the next
 * turn's store supersedes it). Empty or NULL blob: no-op. */
void thaw_snapshots_pending_drop(struct thaw_snapshot_pending *pd);

/* Builds the state a hybrid's manifest describes (one naming snapshots:
 * manifest.h) for the slot of frame f: its blocks and its last snapshot
 * (the cells past the last whole block and the recurrent state at the
 * manifest's end), taken from the RAM tier `ram` (may be NULL), the disk
 * writer's queue or the disk. Returns as thaw_blocks_load (blocks.h):
 * THAW_ENOTFOUND also when the last snapshot is gone or does not fit (a
 * crash before it was written: removed); THAW_EINVAL for a manifest
 * without snapshots (thaw_blocks_load's). */
int thaw_snapshots_load(struct thaw_disk_cache *c, struct thaw_ram_cache *ram, const void *manifest, size_t n_manifest,
                        const struct thaw_kvlayout_frame *f, struct thaw_blocks_state *out);

/* The context checkpoints a manifest's snapshots give (its own end
 * included, all flagged THAW_CKPT_SNAPSHOT: the next store names them
 * again) for sequence seq_id: a .ckpt blob
 * (kvstate.h; *ckpt a blob reference, thaw_blob_unref), so that a
 * conversation restored from disk can still roll back to them.
 * THAW_ENOTFOUND (no such snapshot, or one is gone: none at all is
 * simpler than some), THAW_ENOMEM. */
int thaw_snapshots_ckpts(struct thaw_disk_cache *c, struct thaw_ram_cache *ram, const void *manifest,
                         size_t n_manifest, int32_t seq_id, void **ckpt, size_t *n_ckpt);

/* Prefix lookup for a hybrid: the deepest snapshot at p <= n - 1 of toks
 * the disk holds, with blocks 0 .. p/B - 1, assembled for the frame
 * (p->n_window is not used). Returns 0 (out->n_tokens = p),
 * THAW_ENOTFOUND, or an error as thaw_blocks_load. */
int thaw_snapshots_prefix(const struct thaw_blocks_prefix_params *p, struct thaw_blocks_state *out);

#endif
