/* kvcache.h — tier policy: where a conversation's state is looked for and
 * where a captured one goes (DESIGN §2, §3).
 *
 *   lookup   RAM tier, then the disk tier: first the stores its writer
 *            still holds (a turn sent right after the reply must not miss
 *            a store that is only queued), then the files (the .kv checksum
 *            verified on a worker thread while the caller installs the
 *            bytes); a hit in neither is a miss
 *   store    one capture, fanned out to both tiers: the RAM tier and the
 *            disk writer hold references to the very same blobs (blob.h)
 *   RAM keeps the newest turn of a conversation; the turn it supersedes is
 *            dropped from RAM once the disk holds it (a regenerated reply
 *            would look it up again until then)
 *
 * It knows nothing of slots nor of libllama: a lookup returns the parts,
 * which the caller installs before it ends the hit, and a store takes
 * bytes the engine read out of its context, either a whole capture or a
 * source of blocks (the KV cache's memory, blocks.h) the engine describes. Engine thread only,
 * except thaw_kvcache_prefetch and thaw_kvcache_metrics (any thread).
 */
#ifndef THAW_KVCACHE_H
#define THAW_KVCACHE_H

#include "base/blob.h"
#include "base/key.h"
#include "base/metrics.h"
#include "base/token.h"
#include "cache/cache_shared.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct thaw_blocks_src; /* blocks.h */
struct thaw_disk_cache; /* cache_disk.h */
struct thaw_kvcache_held; /* kvcache.c */

struct thaw_kvcache;

struct thaw_kvcache_params {
    uint64_t ram_bytes;               /* RAM tier budget (--cache-ram); 0 = that tier off */
    const char *disk_dir;             /* --kv-cache-dir; NULL = disk tier off */
    struct thaw_disk_cache *disk_store; /* the directory opened once for every model of the process
                                         * (thaw_kvcache_open_store): this cache takes a handle onto it
                                         * under its identity instead of opening disk_dir; must
                                         * outlive the cache. NULL: disk_dir is opened for this one */
    uint64_t disk_max_bytes;          /* --kv-cache-max; 0 = no limit */
    uint64_t disk_queue_bytes;        /* writer queue budget (--kv-cache-queue) */
    int64_t ttl_s;                    /* --kv-cache-ttl, both tiers */
    int min_tokens;                   /* --kv-cache-min-tokens, for the start-up line only */
    uint8_t identity[THAW_KEY_BYTES]; /* model + settings, written into every .idx */
    uint32_t block_tokens;            /* --kv-cache-block: the disk tier stores blocks of this many
                                       * tokens plus a manifest (blocks.h); 0 = whole states */
    bool prefix_lookup;               /* a prompt without an entry may restore its longest run of
                                       * stored blocks (not for recurrent models: a state is no block) */
    bool snapshots;                   /* a hybrid model: its recurrent state as snapshots beside the
                                       * attention blocks (snapshots.h), and the prefix lookup at
                                       * the deepest one; falls back to whole states when the
                                       * layout is not one kvlayout.c knows as hybrid */
    uint32_t n_window;                /* sliding window of an SWA model (0: none, or --swa-full): its
                                       * blocks carry SWA rows, a prefix needs its window's (blocks.h) */
    uint32_t n_stream;                /* the context's KV streams (one per slot): the frame a
                                       * manifest or a run of blocks is assembled for */
    uint32_t snapshot_idle_s;         /* --kv-snapshot-idle: a hybrid slot's kept turn-end snapshot
                                       * is written after this many idle seconds; 0 = only when the
                                       * slot loses the conversation and at shutdown */
    struct thaw_metrics *metrics;     /* must outlive the cache */
    const struct thaw_shared_params *shared; /* --kv-shared (cache_shared.h); NULL = that tier off. Its
                                              * disk, identity and block fields are filled in here */
};

/* Opens the tiers the params ask for (none is fine: every lookup then
 * misses and every store is dropped) and logs the disk tier's contents.
 * Returns 0, THAW_ENOMEM, or the disk tier's open error (logged:
 * THAW_ELOCKED, -errno, ...). */
int thaw_kvcache_open(const struct thaw_kvcache_params *p, struct thaw_kvcache **out);

/* Opens p->disk_dir once for every model a process serves (DESIGN §16):
 * one lock, index, writer thread and --kv-cache-max for all of them. Each
 * model's cache then takes a handle onto it (params: disk_store), under
 * its own identity: keys carry the model's fingerprint and settings, so
 * models share the directory without reading each other's state. Only
 * the disk_* fields, ttl_s and min_tokens are read. Logs what the
 * directory holds. Returns 0 (*out: close it with thaw_disk_cache_close
 * after every cache using it), or the open's error (logged). */
int thaw_kvcache_open_store(const struct thaw_kvcache_params *p, struct thaw_disk_cache **out);

/* Writes the turn-end snapshots the slots keep (thaw_kvcache_slot_cut),
 * then what the disk writer still holds, then frees all. NULL: no-op. */
void thaw_kvcache_close(struct thaw_kvcache *c);

/* Whether any tier is on. */
bool thaw_kvcache_enabled(const struct thaw_kvcache *c);

/* A lookup's hit: the parts to install into the caller's sequence
 * (thaw_kvstate_parse reads parts[THAW_PART_KV]), valid until
 * thaw_kvcache_hit_end. The caller installs them and then ends the hit,
 * which tells it whether the bytes were good: a disk entry's .kv checksum
 * and a manifest's blocks' checksums run on a worker thread while the
 * caller installs, so a restore costs the larger of the two, not their
 * sum. */
struct thaw_kvcache_hit {
    struct thaw_part_blob parts[THAW_PART_COUNT];
    const char *source;               /* "ram", "disk", "shared" or "blocks" */
    double restore_ms;                /* set by thaw_kvcache_hit_end: lookup to end */
    bool deferred;                    /* thaw_kvcache_find_deferred: parts not assembled yet */
    struct thaw_kvcache_held *held;   /* the tier's (kvcache.c) */
};

/* Looks key up: RAM, the stores the disk writer still holds, then the
 * disk. Returns 0 (a hit: install it, then thaw_kvcache_hit_end) or
 * THAW_ENOTFOUND (a miss; an unusable entry found on the way is logged and
 * removed). n_past: the prompt tokens the caller holds already (the hit's
 * restore is counted only when the install gives more), slot_id: the
 * log's and the slot the blocks are assembled for. */
int thaw_kvcache_find(struct thaw_kvcache *c, const uint8_t key[THAW_KEY_BYTES], int slot_id, int n_past,
                      struct thaw_kvcache_hit *h);

/* thaw_kvcache_find with the hit's heavy part left for later, so that it
 * runs off the engine thread while other slots decode (issue #37): when
 * the entry is a manifest (its blocks to read and assemble) or a disk
 * entry (its .kv's checksum), h->deferred is set and h->parts are not
 * filled yet. Then thaw_kvcache_hit_prepare, on any one thread (the
 * engine's restore thread): assembles, and waits for the checksums that
 * the install would have run beside, so the install that follows is
 * known good. Then thaw_kvcache_hit_ready, on the engine thread: 0 (the
 * parts are there: install, then thaw_kvcache_hit_end as ever) or
 * THAW_ENOTFOUND (unusable, logged, the entry removed; the hit is over).
 * The lookup itself (the tiers' indexes, which the engine's stores
 * change) stays on the engine thread, as do removals. */
int thaw_kvcache_find_deferred(struct thaw_kvcache *c, const uint8_t key[THAW_KEY_BYTES], int slot_id, int n_past,
                               struct thaw_kvcache_hit *h);
void thaw_kvcache_hit_prepare(struct thaw_kvcache *c, struct thaw_kvcache_hit *h);
int thaw_kvcache_hit_ready(struct thaw_kvcache *c, struct thaw_kvcache_hit *h);

/* Prefix lookup (with blocks and prefix_lookup on): after a miss, the
 * longest run of the prompt's whole blocks the disk holds under the
 * tenant's namespace `ns` (a hybrid's deepest snapshot on it), when it is
 * longer than n_past. Returns as thaw_kvcache_find (source "blocks"). */
int thaw_kvcache_find_prefix(struct thaw_kvcache *c, const uint8_t ns[THAW_KEY_BYTES], const thaw_token *prompt,
                             int n_prompt, int slot_id, int n_past, struct thaw_kvcache_hit *h);

/* Ends a hit the caller tried to install: `installed` is the prompt tokens
 * its sequence holds afterwards (>= 0) or the install's negative error.
 * Waits for the checksums, then returns `installed` when the bytes were
 * good, else a negative error: the bytes were bad (the entry or block is
 * removed) and the caller empties what it installed. An install that
 * failed on good bytes removes the entry too. Logs, and counts the
 * restore's time when more than n_past came of it. Frees the hit. */
int thaw_kvcache_hit_end(struct thaw_kvcache *c, struct thaw_kvcache_hit *h, int installed);

/* One store of a conversation: under which keys, and where its
 * attention KV comes from. */
/* A retention hint (an Anthropic cache_control mark): the first n_tokens
 * of what is stored stay until `until` (Unix seconds) in the RAM and disk
 * tiers, against LRU and TTL and evicted last, within their budgets
 * (thaw_ram_cache_retain, thaw_disk_cache_retain): the whole blocks they
 * fill; without blocks (the RAM tier alone), the entry itself. */
struct thaw_kvcache_retain {
    int n_tokens;
    int64_t until;
};

struct thaw_kvcache_store_params {
    int slot_id;               /* the log's, and the slot whose turn-end snapshot is kept */
    const uint8_t *key;        /* THAW_KEY_BYTES: the conversation's */
    const uint8_t *ns;         /* THAW_KEY_BYTES: the tenant's namespace (the blocks' binding, keys.h) */
    const uint8_t *supersedes; /* the key this conversation was looked up under, whose RAM entry may go
                                * (see the top); NULL: none */
    int n_tokens;              /* the tokens stored */
    /* the attention KV cut from a source (blocks.h: the KV cache's memory,
     * which the engine reads), parts[THAW_PART_KV] then empty; NULL: a
     * capture (kvstate.h) in parts[THAW_PART_KV], whose own tokens it is */
    const struct thaw_blocks_src *src;
    const thaw_token *toks; /* with src: the tokens stored, n_tokens of them */
    bool local_only;        /* a store the caller will supersede under the same key soon (a reply
                             * as it stands, before its re-decode): the RAM and disk tiers only,
                             * the shared tier gets the one that supersedes it */
    const struct thaw_kvcache_retain *retain; /* n_retain hints over what is stored; NULL: none */
    int n_retain;
};

/* Hands a conversation's state to every tier under p->key. Takes the
 * caller's reference to each part's blob (parts[THAW_PART_DFT]: the
 * draft's state; parts[THAW_PART_CKPT]: the checkpoints, for a model that
 * needs them, dropped where blocks with SWA rows stand for them); never
 * waits for I/O (the disk store is queued, and dropped when the queue is
 * full). Returns the tiers it went to, for the log: "ram+disk", "disk",
 * "ram" or "none"; with p->src, NULL when the source cannot give the
 * cells the store needs or blocks are off: nothing was stored and parts
 * are untouched — capture and call again without it. */
const char *thaw_kvcache_store(struct thaw_kvcache *c, const struct thaw_kvcache_store_params *p,
                               struct thaw_part_blob parts[THAW_PART_COUNT]);

/* A prompt's whole blocks, ahead of its turn's store: those of toks[0,
 * src->n_cells) (a multiple of the block size or not: the cells past the
 * last whole block are left) that the disk does not hold go to the writer
 * now, unsynced, with no manifest (cache_disk.h, submit_unsynced), so
 * that the turn's store at the reply's end writes only the reply's blocks
 * and its manifest. The engine calls it while the reply is generated.
 * Best effort: anything the source cannot give, a full queue, blocks off
 * — the turn's store writes them as ever. Returns the blocks submitted. */
int thaw_kvcache_store_ahead(struct thaw_kvcache *c, int slot_id, const uint8_t ns[THAW_KEY_BYTES],
                             const thaw_token *toks, const struct thaw_blocks_src *src);

/* A hybrid's turn-end snapshot is kept per slot, not written with the
 * turn (snapshots.h, "Written when"): slot slot_id's sequence is about to
 * lose its positions >= p (p <= 0: all of them). When that takes the kept
 * snapshot's position, it goes to the disk writer now. Any slot id (one
 * without a kept snapshot, or none at all: no-op). */
void thaw_kvcache_slot_cut(struct thaw_kvcache *c, int slot_id, int p);

/* Drops slot slot_id's kept turn-end snapshot unwritten: the caller knows
 * no prompt will present its tokens (stored as generated, and the next
 * turn parts from them before its end). No-op without one. */
void thaw_kvcache_slot_drop(struct thaw_kvcache *c, int slot_id);

/* Writes the kept turn-end snapshots older than --kv-snapshot-idle.
 * Returns the microseconds until the next one is due, or -1 when none is
 * (nothing kept, or the flag is 0). NULL: -1. */
int64_t thaw_kvcache_flush_idle(struct thaw_kvcache *c);

/* 1 when stores go to the disk as blocks (a store from a source can be
 * served). */
int thaw_kvcache_cuts_blocks(const struct thaw_kvcache *c);
/* Tokens per block of the disk's stores (0: whole states). */
uint32_t thaw_kvcache_block_tokens(const struct thaw_kvcache *c);

/* Starts reading key's disk entry into memory while its request waits for
 * a slot (any thread). Counts a prefetch when it did. */
void thaw_kvcache_prefetch(struct thaw_kvcache *c, const uint8_t key[THAW_KEY_BYTES]);

/* The shared tier (--kv-shared): fetches, on its own thread, what the local
 * tiers lack of conversation `key` (NULL: a first turn, then the prompt's
 * run of blocks), then calls done(ud). Returns 0 when done will be called;
 * nonzero (nothing to fetch, tier off or failing, queue full): go on at
 * once, done is not called. Any thread. */
int thaw_kvcache_fetch_shared(struct thaw_kvcache *c, const uint8_t *key, const uint8_t ns[THAW_KEY_BYTES],
                              const thaw_token *prompt, int n_prompt, void (*done)(void *ud), void *ud);

/* A store of key is coming (the engine derived it from a reply it is about
 * to send): until it lands, no shared-tier fetch goes after key. Any
 * thread. */
void thaw_kvcache_expect(struct thaw_kvcache *c, const uint8_t key[THAW_KEY_BYTES]);

/* Stops the shared tier's fetches (their callbacks run first): before the
 * scheduler they push to goes. No-op without that tier. */
void thaw_kvcache_stop_fetches(struct thaw_kvcache *c);

/* Appends the disk tier's Prometheus lines (thaw_metrics_extra_fn shape). */
void thaw_kvcache_metrics(struct thaw_kvcache *c, char *buf, size_t cap, size_t *len);

#endif
