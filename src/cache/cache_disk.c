/* cache_disk.c — the on-disk store: entries, invariants, sweep, eviction,
 * garbage collection of blocks.
 *
 * ---- NOTES ON THE DESIGN OF THE STORE ------------------------------------
 *
 * An entry is the files <key>.kv, <key>.ckpt, <key>.dft (the parts; only .kv
 * is mandatory) and <key>.idx (the index record: sizes and XXH3-64 checksums
 * of the parts, fingerprint, token count, meta, kind, the keys of the blocks
 * it names, its own checksum). An entry is a ROOT (a whole state, or a
 * manifest naming blocks: TTL and LRU choose among these) or a BLOCK (a
 * content-addressed piece of state that roots name; it has no TTL or LRU
 * of its own). The caller's classify() says which, once, at store time; the
 * answer lives in the .idx, so this file never reads a state. These
 * invariants hold after a crash at any point (tests/unit/test_cache_disk.c
 * crashes a store at every one of its system calls and checks them;
 * tests/unit/test_cache_disk_gc.c does the same across a store of blocks
 * then their manifest, across the writer's group commit of several
 * conversations, and across an eviction with its collection):
 *
 *   1. A part is written as <name>.tmp, made durable, closed and renamed
 *      into place; after all parts, the directory is made durable; then
 *      the .idx is written the same way; then the directory again. The
 *      rename of the .idx is the commit. A store alone does it with an
 *      fsync of each file and of the directory (the first directory fsync
 *      is not needed for correctness — invariant 2 catches a part whose
 *      rename was lost — but without it a power cut could cost a committed
 *      entry). The writer does it for a group of entries at once with two
 *      syncs of the whole filesystem instead (Group commit, below): the
 *      parts of all and the blocks' .idx, ONE syncfs; the roots' .idx, ONE
 *      syncfs. What matters is unchanged: every file and rename a root's
 *      .idx rests on (its parts, its blocks' parts and .idx) is durable
 *      before that .idx is written, and the .idx is durable before the
 *      entry is used by anyone who could outlive a power cut (a restart).
 *   2. An entry exists if and only if its .idx exists, parses, names its own
 *      key, and the checksums of its parts match. Nothing else is trusted:
 *      a file of any content is at worst a miss.
 *   3. Removal (replacement, eviction, corruption, `thaw cache rm`) unlinks
 *      the .idx first, then the parts. Hence a store over an existing key
 *      unlinks the old .idx before it writes a byte: a crash midway leaves no
 *      entry, never old .idx + new parts. A store that fails removes what it
 *      wrote the same way, temporaries included, before it returns or
 *      retries.
 *   4. Open sweeps *.tmp, parts without an .idx, parts the .idx does not
 *      list, and entries whose .idx is corrupt or whose mandatory parts are
 *      missing or of the wrong size — unless opened SHARED (a server may be
 *      mid-store: its *.tmp and not-yet-committed parts look exactly like
 *      leftovers). READONLY (implies SHARED) changes nothing at all: no
 *      sweep, no removal of what is corrupt (reported, counted in
 *      skipped_entries), no last-use update, no mkdir, chmod or lock file.
 *   5. A lookup verifies every checksum over the mapping it hands out. A
 *      mismatch, a missing or truncated file or a bad .idx is a miss and the
 *      entry is removed. A bad .dft alone costs only the .dft: it is
 *      unlinked, then the .idx is rewritten without it (atomically, as in 1);
 *      a crash between the two leaves an .idx naming a missing .dft, which
 *      is treated the same way again. A lookup with DEFER_KV hands out the
 *      .kv mapping before its checksum is checked, so the caller can copy it
 *      while thaw_disk_entry_verify() hashes it on another core; the caller
 *      must discard what it copied if that check fails (the engine clears
 *      the slot before any token is decoded from it). Nothing unverified is
 *      ever used.
 *   6. Files are created 0600 (O_EXCL|O_NOFOLLOW) in a 0700 directory; a
 *      looser directory is chmod()ed to 0700 at open, or open fails.
 *   7. Blocks commit before the root that names them: the caller submits
 *      them first to the one FIFO writer, and within a group the writer
 *      renames every block's .idx and syncs before it writes any
 *      root's .idx, so a crash between leaves blocks that
 *      nothing names (collected, 8), never a committed manifest naming a
 *      block whose commit was not yet durable. A root naming a block that is
 *      missing or bad (evicted by another process, corrupt, removed) is not
 *      this file's to judge: the block's own lookup misses or removes it
 *      (5), and the caller serves that root as a miss — never a wrong state.
 *   8. Garbage collection. A block is removed only when no committed root,
 *      no store of a root still in the writer's queue and no hold names it
 *      (a store holds its block ids from before it looks for them until its
 *      manifest is submitted: thaw_disk_cache_hold), and, while there is
 *      room, it has been unused (written, read, found present by
 *      contains()) for block_grace_s, or ttl_s if that is shorter (what TTL
 *      evicted must not come back as a prefix); over budget or on a full
 *      disk, at once (orphan_grace() says why). Removing a block is
 *      removal (3): .idx first. An eviction pass removes its roots before
 *      the blocks they orphaned (the victim chain is in that order), so a
 *      crash mid-pass leaves at worst a root already gone and blocks not
 *      yet collected: the next open finds them unnamed and the next pass
 *      collects them. Nothing leaks for longer than one grace after a
 *      restart.
 *
 * Concurrency. One mutex (mu) guards the in-memory index, the LRU list, the
 * stats and the writer queue; it is never held across disk I/O. A key whose
 * files are being changed (store, removal, eviction, .dft drop) is "busy"
 * in the index: lookups of it miss without touching the disk, evictions skip
 * it, and a second store/removal of it waits on key_cond. A lookup reads
 * without the lock, so it may see the files of a store that began after it
 * looked; each index entry carries a generation, bumped whenever a claim on
 * it ends, and a lookup only removes what it found corrupt if the entry is
 * still the one it started with and not busy — otherwise the mismatch was a
 * race, and it is just a miss. Other processes (`thaw cache`) only ever
 * remove, .idx first; the server treats an .idx that vanished as a miss.
 *
 * The writer queue. submit() hands a store to the one writer thread (FIFO).
 * The queue is bounded by bytes, not by a count: what it costs is the memory
 * of the states it holds, and a count either drops ordinary traffic (a few
 * conversations finishing together) or lets a few huge states through.
 * queue_bytes covers the waiting stores and the group being written; a
 * submit that would take it past queue_max_bytes is dropped (logged with
 * the numbers, counted), except when the writer holds nothing — one store
 * larger than the whole budget must still be possible.
 *
 * Group commit. A store alone costs four fsyncs (part, directory, .idx,
 * directory), and a turn is ~7 blocks and a manifest: 32 fsyncs, each a
 * journal commit that waits behind other writers' on a busy disk (two per
 * block and three per group even when they shared directory fsyncs). So
 * the writer takes everything queued when it looks, up to GROUP_MAX_JOBS /
 * GROUP_MAX_BYTES (no limit once closing: Shutdown, below) and never two
 * stores of one key (the second waits for the next group), and commits it
 * with two syncs of the filesystem, whatever its number of blocks
 * (store_group). A store made of several submits (a turn's new blocks,
 * then its manifest) is submitted as a batch (thaw_disk_cache_batch_begin
 * and _end): the writer takes no new group while one is open, so the
 * turn is one group, not a first block alone and the rest after (measured:
 * 21 groups for 15 turn stores, 36 syncs, before; 15 and 30 after). A root
 * submitted while an older store of its key still waits replaces it in
 * the queue (queue_supersede): a reply stored early, before its re-decode,
 * and the store after the re-decode cost one commit when the writer was
 * busy meanwhile, not two. The steps:
 *   a. stage every job (checks, checksums, .idx record) and claim its key;
 *      open the directory (the syncs' descriptor: opened before the first
 *      write, so that syncfs reports any writeback error of the group's);
 *   b. per job: unlink its old .idx (invariant 3), write its parts (no
 *      fsync) and rename each into place;
 *   c. the blocks' .idx (write, rename, no fsync); then ONE syncfs: the
 *      data, inodes and directory entries of b and c are durable (ext4 and
 *      xfs write back every dirty inode of the filesystem and commit the
 *      journal); then the blocks are live;
 *   d. the roots' .idx the same way, ONE syncfs; then they are live.
 * Why this keeps the invariants. Before c's syncfs returns nothing of a
 * root's .idx exists, so a power cut can leave any subset of b and c in
 * any order — a part renamed without its bytes, a block's .idx without
 * its part, an old .idx not yet unlinked beside new parts — and every one
 * of those is caught by invariant 2 (the .idx's sizes and checksums) as a
 * miss of a block nothing new names; a root committed by an earlier group
 * that names such a block (stored again here because it had gone) finds
 * it missing or bad, a miss (7). After c's sync, the roots' .idx in d
 * rest only on durable files; a power cut in d loses some roots, never
 * makes one name what is not there. The process crashing (not the power)
 * loses nothing written: the page cache survives it, and a crash at every
 * system call (tests) leaves old-or-new-or-nothing as before. A failed
 * syncfs leaves unknown which of the group's writes are durable (the
 * kernel may have dropped a failed page): every job still in the group,
 * of both kinds after c's, is scrubbed and stored by itself with its own
 * fsyncs, from scratch. Cost: two syncs a group (a turn: 2, any number of
 * blocks), measured against per-file fsyncs in bench/store_queue; a sync
 * of the filesystem also writes back what other processes left dirty on
 * it, which on a filesystem shared with a heavy buffered writer is the
 * price (measured there too), bounded by the kernel's dirty limits.
 * A job whose own step fails is scrubbed at once (.idx first,
 * temporaries too) and, after the group's entries of its kind (a block's
 * before any root's .idx, a root's after), stored by itself as a store
 * outside a group is: ENOSPC/EDQUOT runs its make_room rounds, another
 * error fails it alone (counted, logged); the others commit. Claims, held
 * refs, stats and the debug line are per job, as alone; lookups find each
 * job of the group through pending()/queued() until its own commit (or
 * failure), and the index from then on; its buffers go then too. An
 * eviction pass follows the blocks' commit and the roots'; a job's bytes
 * leave queue_bytes after the pass that follows its commit, so a queue at
 * 0 bytes still means the writer is done. thaw_disk_cache_store() stores
 * alone, synchronously.
 *
 * Blocks ahead. A turn's prompt blocks are known before its reply is:
 * submitted while the reply is generated (thaw_disk_cache_submit_unsynced),
 * they leave the turn's own group only the reply's blocks and the manifest
 * to write. A group of nothing but such blocks skips both syncs: no root
 * names them, so none of the invariants needs them durable yet, and a
 * lookup finds them in the page cache like any live block. The group that
 * commits a manifest naming them syncs the filesystem (step c) before
 * that manifest's .idx is written, which makes them durable with its own
 * files: the invariant (a root rests only on durable files) holds as
 * before. A power cut before then may leave such a block renamed without
 * its bytes, which invariant 2 catches as a miss of a block nothing names,
 * as for a group cut short. A block the disk collects meanwhile (over
 * budget: unnamed blocks go first) is stored again by the turn's store,
 * which finds it missing.
 *
 * Shutdown. close() lets the writer drain the queue before it exits, and
 * from then on a group has no size limit: what is queued at exit is one
 * group (keys stored twice aside), two syncs, so a backlog of dozens of
 * turns costs its bytes, not its files' fsyncs.
 *
 * Disk full. A store whose I/O fails with ENOSPC/EDQUOT removes what it
 * wrote (invariant 3), evicts least recently used entries of other keys
 * until at least its own size is freed, and starts over, at most
 * THAW_DISK_ENOSPC_ROUNDS times: the state just computed is worth more than
 * the oldest one on disk. Each attempt rewrites every file from scratch:
 * after a failed fsync the kernel may have dropped the dirty pages, so a
 * file is never "continued" (fsync errors are not retryable).
 *
 * Last use. Stored as the .idx file's mtime: set when the .idx is written
 * and on every hit of a root with one utimensat() (not fsynced — a lost
 * update only makes the entry look older), read back at open. TTL counts
 * from last use. A block's last use is kept in memory only (a restore
 * reads hundreds of blocks; one syscall each would be waste): it only
 * times the grace of a block nothing names, which a restart restarts.
 *
 * Refcounts. Built at open from every root's .idx (the refs are in the
 * record, checksummed with it; a few KiB per manifest) and kept in a map
 * of block key -> how many roots name it, apart from the entries, because
 * a root may name a block not (yet, or any more) on disk. A root adds its
 * refs when committed and drops them when it leaves the index (evicted,
 * removed, found corrupt, replaced); a submitted root adds its refs at
 * submit and its store hands them to the entry it commits, or drops them
 * if it fails, under the commit's lock (held_release), so a block written
 * before its manifest commits is named while the manifest waits.
 * The window that leaves — a block committed (or found present and
 * skipped) before its manifest is even submitted — is closed by holds:
 * the store pins its block ids (thaw_disk_cache_hold, counted in the same
 * map) before it looks for them and drops the pin after the submit.
 * block_grace_s is the life of a block nothing names or holds — fetched
 * for a prefix lookup, left by a crash between blocks and manifest, or
 * of a conversation just removed — when there is room; over budget such
 * blocks go first, before any conversation. Blocks no root names are on
 * the orphan list; an eviction pass takes, over budget, those nothing
 * holds and then roots by LRU, and finally those past their grace.
 * Under SHARED (`thaw cache gc` beside a running server) the server's
 * holds and queued manifests are invisible: the grace, counted from the
 * block's .idx mtime and kept even over budget, keeps its stores in
 * progress safe; a block the server found
 * present and is about to name again may still go if the cli evicts the
 * last root that named it — a miss for that manifest, never a wrong state.
 *
 * Format versions. An .idx of another version is treated as corrupt
 * (invariant 4): version 1 had no kind nor refs, and guessing them would
 * mean reading states; a cache directory from before blocks is swept once.
 *
 * Fingerprints. An .idx names the fingerprint (model + context settings) it
 * was written under. Keys are already bound to the fingerprint by the
 * caller, so another fingerprint under a key means another model: a miss,
 * but the entry is kept (counted, evicted by TTL/LRU), because the same
 * directory may serve that model again after a restart.
 *
 * Handles: one directory, many models (DESIGN §16). A directory has one
 * owner (the lock), one index and one writer, so a process serving several
 * models opens it once and gives each model a handle
 * (thaw_disk_cache_handle): a small struct thaw_disk_cache of its own
 * fingerprint (and background pool) whose every call works on the store it
 * was made from. The fingerprint is the only thing a model changes here,
 * and it is read once per call, at the top of each public function (a
 * store's travels in its job to the writer), so the handle is the cleanest
 * seam: every caller (blocks, snapshots, tiers, the shared tier) keeps the
 * API it has, and nothing below the public functions knows handles exist.
 * Models never read each other's entries: keys are bound to the
 * fingerprint by the caller, and the fingerprint check at lookup stays
 * per handle. Budgets, TTL, LRU and the queue are the store's: one for all
 * models, which is the point.
 *
 * The .idx record's byte layout, encoder and parser are cache_idx.c's; the
 * index and the refcounts are keymaps (keymap.c).
 *
 * Map of this file:
 *   ---- helpers ----        paths, logging, clock
 *   ---- in-memory index ---- entries by key, LRU and orphan lists, refcounts, claims
 *   ---- file I/O ----       durable writes, removal, reading and mapping
 *   ---- open / close ----   directory, lock, sweep, writer start/stop
 *   ---- store ----          staging, synchronous store, group commit,
 *                            writer thread, submit, pending, flush, pause
 *   ---- lookup ----         lookup, a .kv opened or read for its caller,
 *                            prefetch, entry accessors, .dft drop, verify
 *   ---- evict / remove ---- TTL, unreferenced blocks, LRU, room on a full
 *                            disk, removal, listing, stats
 */
#include "cache/cache_disk.h"

#include "base/blob.h"
#include "base/error.h"
#include "base/fmt.h"
#include "base/keymap.h"
#include "base/le.h"
#include "base/log.h"
#include "cache/cache_idx.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#define HEX_LEN (2 * THAW_KEY_BYTES)


/* What the writer takes into one group commit (at least one job, however
 * big): a bound on how long the first job waits for the last one's parts,
 * and on what one crash can cost. */
#define GROUP_MAX_JOBS 64
#define GROUP_MAX_BYTES ((uint64_t)256 << 20)


static const char *const part_ext[THAW_PART_COUNT] = {".kv", ".ckpt", ".dft"};

/* One key in the in-memory index. */
struct ent {
    uint8_t key[THAW_KEY_BYTES];
    uint8_t fingerprint[THAW_DISK_FINGERPRINT_SIZE];
    uint64_t bytes;                      /* all files, .idx included */
    uint64_t part_size[THAW_PART_COUNT]; /* 0 = absent */
    uint64_t kv_xxh3;                    /* the .kv's checksum, from the .idx */
    uint32_t n_tokens;
    uint32_t n_meta;
    int64_t created;                 /* Unix seconds */
    int64_t last_used;               /* Unix seconds */
    long used_ns;                    /* at load: the mtime's nanoseconds, orders a second's uses */
    uint64_t gen;                    /* bumped when a claim ends: see the notes */
    int busy;                        /* a claim owns the key's files */
    int live;                        /* committed; then on a list (below) */
    int is_block;                    /* THAW_DISK_KIND_BLOCK: never on the LRU list */
    int listed;                      /* enum listed: which list prev/next link */
    int evict_why;                   /* as an eviction victim: enum evict_why */
    uint8_t (*refs)[THAW_KEY_BYTES]; /* a root's blocks; counted in the refcount map while set */
    uint32_t n_refs;
    struct thaw_keymap_node hn; /* in the index, under key */
    struct ent *prev;  /* LRU or orphan list: head = least recently used / oldest orphan */
    struct ent *next;  /* same; reused for eviction's victim chain */
};

enum listed {
    LIST_NONE,   /* not live, or a block some root names */
    LIST_LRU,    /* a live root */
    LIST_ORPHAN, /* a live block no root names: collected after its grace */
};

enum evict_why {
    EVICT_TTL,    /* unused for more than ttl_s */
    EVICT_LRU,    /* least recently used, total over max_bytes */
    EVICT_ENOSPC, /* least recently used, to make room on a full disk */
    EVICT_GC,     /* a block no root names, unused for block_grace_s */
};

/* How many roots name a block key (committed roots, and stores of roots
 * still in the writer's queue), plus the holds of stores in progress. Keyed apart from the entries: a root may
 * name a block that is not (or not yet, or no longer) on disk, and the count
 * must be right when it arrives. Absent = 0. */
/* A retention hint on a block (thaw_disk_cache_retain): it counts as one
 * name of the block in refcs while it lasts. */
struct retain {
    uint8_t key[THAW_KEY_BYTES];
    int64_t until; /* Unix seconds (the cache's clock) */
    struct thaw_keymap_node hn; /* in retains */
    struct retain *next;        /* the list, in no order */
};

struct refc {
    uint8_t key[THAW_KEY_BYTES];
    uint32_t n;
    struct thaw_keymap_node hn; /* in the refcount map, under key */
};

/* What classify() said of an entry's .kv (pointers into it). */
struct links {
    int is_block;
    const uint8_t *refs; /* n_refs x THAW_KEY_BYTES */
    uint32_t n_refs;
};

/* A store made ready for its I/O: what its .idx says, encoded, and what
 * its index entry gets at the commit. Owns rec and refs until then. */
struct staged {
    char hex[HEX_LEN + 1];
    uint8_t fingerprint[THAW_DISK_FINGERPRINT_SIZE]; /* the handle's that stored it */
    struct links ln;                     /* what it is; refs point into its .kv */
    uint64_t total;                      /* parts + .idx */
    uint64_t part_size[THAW_PART_COUNT]; /* 0 = absent */
    uint64_t kv_xxh3;
    uint32_t n_tokens;
    uint32_t n_meta;
    int64_t now;  /* created and last used */
    uint8_t *rec; /* the .idx record */
    size_t rec_len;
    uint8_t (*refs)[THAW_KEY_BYTES]; /* the entry's copy of ln.refs */
    struct ent *e;                   /* the claim on the key, once taken */
    double t0;                       /* mono_ms() when staged, for the log */
};

/* Where a job of the group being written stands (store_group). */
enum job_state {
    JOB_GROUP, /* its files go with the group's */
    JOB_ALONE, /* failed in the group: its files are gone, it is stored by
                * itself after the group's entries of its kind */
    JOB_DONE,  /* committed or failed */
};

/* A store waiting for the writer thread; owns its buffers. */
struct job {
    uint8_t key[THAW_KEY_BYTES];
    uint8_t fingerprint[THAW_DISK_FINGERPRINT_SIZE]; /* the submitting handle's */
    uint32_t n_tokens;
    struct thaw_part_blob parts[THAW_PART_COUNT];
    void *meta;
    size_t n_meta;
    struct links links; /* refs point into parts[THAW_PART_KV]; counted from submit
                         * until its store commits or fails (held_release) */
    uint64_t bytes;     /* parts + .idx: what it counts in queue_bytes */
    double t_submit;    /* mono_ms() at submit */
    struct job *next;   /* FIFO; the group being written keeps the order */
    /* the writer's, once the job is in a group */
    struct staged s;
    int state;   /* enum job_state */
    int err;     /* JOB_ALONE: the -errno of its own step that failed in the
                  * group, 0 when a directory fsync of the group failed */
    int ended;   /* under mu: committed or failed, its buffers gone;
                  * pending() and queued() skip it */
    int counted; /* out of q_bytes and q_active (the writer's) */
    int unsynced; /* a block written ahead of its manifest (submit_unsynced): its group need not sync */
};

struct thaw_disk_cache {
    char *dir;
    const struct thaw_vfs *vfs;
    struct thaw_workers *workers; /* borrowed (params) */
    uint64_t max_bytes;
    int64_t ttl_s;
    uint8_t fingerprint[THAW_DISK_FINGERPRINT_SIZE];
    unsigned flags;
    void (*log)(void *ud, int level, const char *msg);
    void *log_ud;
    int64_t (*now)(void *ud);
    void *now_ud;
    int (*classify)(void *ud, const void *kv, size_t n, const uint8_t **refs, uint32_t *n_refs);
    void *classify_ud;
    int64_t block_grace_s;
    int lock_fd; /* -1 when SHARED */
    /* the cache whose directory, index and writer this one's calls use:
     * itself when opened; the opened one for a handle
     * (thaw_disk_cache_handle), of which only store, fingerprint and
     * workers are set */
    struct thaw_disk_cache *store;
    atomic_int n_handles; /* a store's handles not yet closed */

    pthread_mutex_t mu;
    pthread_mutex_t stamp_mu; /* the last mtime written: see stamp() */
    struct timespec last_stamp;
    pthread_cond_t key_cond; /* a busy key was released */
    struct thaw_keymap index;          /* key -> struct ent, busy ones included */
    struct ent *lru_head, *lru_tail;   /* live roots, least recently used first */
    struct ent *orph_head, *orph_tail; /* live blocks no root names, in the order they lost it */
    uint64_t n_live;
    uint64_t bytes;                            /* of live entries */
    uint64_t n_blocks, block_bytes, n_orphans; /* of live blocks */
    struct thaw_keymap refcs; /* block key -> struct refc */
    struct thaw_keymap retains; /* block key -> struct retain */
    struct retain *ret_head;
    struct thaw_disk_cache_stats st;

    /* writer */
    pthread_t writer;
    int has_writer;
    int stopping;
    struct job *q_head, *q_tail;   /* waiting, oldest first */
    unsigned q_len;                /* jobs waiting */
    uint64_t q_bytes;              /* of the jobs waiting and q_active's */
    uint64_t q_max_bytes;          /* 0 = no limit */
    unsigned q_active;             /* jobs of the group being written not yet counted out */
    struct job *q_group;           /* that group (FIFO), while thaw_disk_cache_pending may ref
                                    * its parts; cleared under mu before it is freed */
    int q_writing;                 /* the writer holds a group */
    int q_paused;                  /* thaw_disk_cache_pause: take no new group */
    unsigned q_batches;            /* thaw_disk_cache_batch_begin()s not ended: take no new group */
    pthread_cond_t q_cond;         /* a job arrived, unpaused, or stopping */
    pthread_cond_t q_idle;         /* a group finished */
    atomic_uint_fast64_t n_fsyncs; /* vfs fsync calls, files and directory: stats.fsyncs */
};

struct thaw_disk_entry {
    const struct thaw_vfs *vfs;
    uint8_t key[THAW_KEY_BYTES];
    uint64_t gen;        /* the index generation it was read at (for removal) */
    unsigned unverified; /* THAW_DISK_BAD_PART bits: mapped, checksum not yet checked */
    uint32_t n_tokens;
    void *map[THAW_PART_COUNT]; /* read-only mappings; NULL = absent */
    size_t size[THAW_PART_COUNT];
    uint8_t *idx_buf; /* the .idx record as read; meta points into it */
    size_t idx_len;
    struct thaw_disk_idx idx;
};

/* ---- helpers ------------------------------------------------------------ */

/* <dir>/<hex><ext><tmp> into out[PATH_MAX]; open() checked the length. */
static void entry_path(const struct thaw_disk_cache *c, char *out, const char *hex, const char *ext, int tmp)
{
    snprintf(out, PATH_MAX, "%s/%s%s%s", c->dir, hex, ext, tmp ? ".tmp" : "");
}

static const char *idx_or_part_ext(int p)
{
    return p == THAW_PART_COUNT ? ".idx" : part_ext[p];
}

__attribute__((format(printf, 3, 4))) static void logf_(const struct thaw_disk_cache *c, int level, const char *fmt,
                                                        ...)
{
    char msg[512];
    va_list ap;

    if (!c->log)
        return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->log(c->log_ud, level, msg);
}

static int64_t default_now(void *ud)
{
    (void)ud;
    return (int64_t)time(NULL);
}

static int64_t now_s(const struct thaw_disk_cache *c)
{
    return c->now(c->now_ud);
}

/* The mtime that records a write or a use at `s` (the cache's clock,
 * seconds). A restart orders entries by mtime, and a second holds many
 * stores: the nanoseconds come from the real clock when it agrees with
 * `s`, and stamps only grow within a second, so entries stored or used in
 * one second come back in the order they were (whole seconds put them in
 * key order, and the budget evicted a conversation stored a moment ago
 * before older ones). */
static struct timespec stamp(struct thaw_disk_cache *c, int64_t s)
{
    struct timespec rt, ts = {.tv_sec = (time_t)s};

    clock_gettime(CLOCK_REALTIME, &rt);
    if (rt.tv_sec == ts.tv_sec)
        ts.tv_nsec = rt.tv_nsec;
    pthread_mutex_lock(&c->stamp_mu);
    if (c->last_stamp.tv_sec == ts.tv_sec && ts.tv_nsec <= c->last_stamp.tv_nsec &&
        c->last_stamp.tv_nsec < 999999999)
        ts.tv_nsec = c->last_stamp.tv_nsec + 1;
    if (ts.tv_sec >= c->last_stamp.tv_sec)
        c->last_stamp = ts;
    pthread_mutex_unlock(&c->stamp_mu);
    return ts;
}

static double mono_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- in-memory index ---------------------------------------------------- */
/* Everything in this section runs with c->mu held. */

static struct ent *index_find(const struct thaw_disk_cache *c, const uint8_t *key)
{
    struct thaw_keymap_node *n = thaw_keymap_find(&c->index, key);

    return n ? THAW_KEYMAP_OF(n, struct ent, hn) : NULL;
}

static void index_insert(struct thaw_disk_cache *c, struct ent *e)
{
    thaw_keymap_insert(&c->index, &e->hn, e->key);
}

static void index_unlink(struct thaw_disk_cache *c, struct ent *e)
{
    thaw_keymap_remove(&c->index, &e->hn);
}

/* The LRU list (live roots) and the orphan list (live blocks no root
 * names) share the prev/next links: an entry is on at most one. */
static void list_append(struct ent **head, struct ent **tail, struct ent *e)
{
    e->next = NULL;
    e->prev = *tail;
    if (*tail)
        (*tail)->next = e;
    else
        *head = e;
    *tail = e;
}

static void list_unlink(struct ent **head, struct ent **tail, struct ent *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        *head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        *tail = e->prev;
    e->prev = e->next = NULL;
}

static void lru_append(struct thaw_disk_cache *c, struct ent *e)
{
    list_append(&c->lru_head, &c->lru_tail, e);
    e->listed = LIST_LRU;
}

static void orphan_append(struct thaw_disk_cache *c, struct ent *e)
{
    list_append(&c->orph_head, &c->orph_tail, e);
    e->listed = LIST_ORPHAN;
    c->n_orphans++;
}

/* Takes e off whichever list it is on. */
static void list_leave(struct thaw_disk_cache *c, struct ent *e)
{
    if (e->listed == LIST_LRU) {
        list_unlink(&c->lru_head, &c->lru_tail, e);
    } else if (e->listed == LIST_ORPHAN) {
        list_unlink(&c->orph_head, &c->orph_tail, e);
        c->n_orphans--;
    }
    e->listed = LIST_NONE;
}

/* ---- refcounts: how many roots name each block key ---- */

static struct refc *refc_find(const struct thaw_disk_cache *c, const uint8_t *key)
{
    struct thaw_keymap_node *n = thaw_keymap_find(&c->refcs, key);

    return n ? THAW_KEYMAP_OF(n, struct refc, hn) : NULL;
}

static uint32_t refc_get(const struct thaw_disk_cache *c, const uint8_t *key)
{
    const struct refc *r = refc_find(c, key);

    return r ? r->n : 0;
}

/* One more root names each of refs[0, n): a block among them that was
 * unreferenced leaves the orphan list. Out of memory leaves a count short,
 * which can only cost a miss (the block may be collected while named; a
 * missing block is a miss), never a wrong state. */
static void refs_add(struct thaw_disk_cache *c, const uint8_t *refs, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *key = refs + (size_t)i * THAW_KEY_BYTES;
        struct refc *r = refc_find(c, key);

        if (!r) {
            struct ent *b;

            if (!(r = calloc(1, sizeof *r)))
                continue;
            memcpy(r->key, key, THAW_KEY_BYTES);
            thaw_keymap_insert(&c->refcs, &r->hn, r->key);
            if ((b = index_find(c, key)) && b->listed == LIST_ORPHAN)
                list_leave(c, b);
        }
        r->n++;
    }
}

/* One root fewer names each of refs[0, n): a live block nobody names any
 * more joins the orphan list (collected once past its grace). */
static void refs_drop(struct thaw_disk_cache *c, const uint8_t *refs, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *key = refs + (size_t)i * THAW_KEY_BYTES;
        struct refc *r = refc_find(c, key);
        struct ent *b;

        if (!r || --r->n > 0)
            continue;
        thaw_keymap_remove(&c->refcs, &r->hn);
        free(r);
        if ((b = index_find(c, key)) && b->live && b->is_block && b->listed == LIST_NONE)
            orphan_append(c, b);
    }
}

/* Gives root e the refs list `refs` (malloc'd, n keys; e owns it now),
 * counting it before the old one is dropped, so that a block both name
 * never looks unreferenced. */
static void ent_set_refs(struct thaw_disk_cache *c, struct ent *e, uint8_t (*refs)[THAW_KEY_BYTES], uint32_t n)
{
    uint8_t(*old)[THAW_KEY_BYTES] = e->refs;
    uint32_t n_old = e->n_refs;

    if (n)
        refs_add(c, refs[0], n);
    e->refs = refs;
    e->n_refs = n;
    if (n_old)
        refs_drop(c, old[0], n_old);
    free(old);
}

/* Frees e, dropping what its refs counted. */
static void ent_free(struct thaw_disk_cache *c, struct ent *e)
{
    ent_set_refs(c, e, NULL, 0);
    free(e);
}

/* Makes e live again: on its list and in the totals. A block goes on the
 * orphan list when no root names it. */
static void ent_commit(struct thaw_disk_cache *c, struct ent *e)
{
    e->live = 1;
    c->n_live++;
    c->bytes += e->bytes;
    if (!e->is_block) {
        lru_append(c, e);
        return;
    }
    c->n_blocks++;
    c->block_bytes += e->bytes;
    if (refc_get(c, e->key) == 0)
        orphan_append(c, e);
}

/* Takes e out of its list and the totals (it stays in the hash). */
static void ent_uncommit(struct thaw_disk_cache *c, struct ent *e)
{
    if (!e->live)
        return;
    list_leave(c, e);
    e->live = 0;
    c->n_live--;
    c->bytes -= e->bytes;
    if (e->is_block) {
        c->n_blocks--;
        c->block_bytes -= e->bytes;
    }
}

/* Claims key for changing its files, waiting while another claim holds it.
 * With create, a missing key gets a new (not live) entry. Returns the
 * claimed entry, or NULL (no such key / out of memory with create). */
static struct ent *claim_wait(struct thaw_disk_cache *c, const uint8_t *key, int create)
{
    struct ent *e;

    while ((e = index_find(c, key)) && e->busy)
        pthread_cond_wait(&c->key_cond, &c->mu);
    if (!e && create) {
        e = calloc(1, sizeof *e);
        if (!e)
            return NULL;
        memcpy(e->key, key, THAW_KEY_BYTES);
        index_insert(c, e);
    }
    if (e) {
        e->busy = 1;
        ent_uncommit(c, e);
    }
    return e;
}

/* Claims key only if it is still generation gen and nobody holds it. */
static struct ent *claim_try(struct thaw_disk_cache *c, const uint8_t *key, uint64_t gen)
{
    struct ent *e = index_find(c, key);

    if (!e || e->busy || e->gen != gen)
        return NULL;
    e->busy = 1;
    ent_uncommit(c, e);
    return e;
}

/* Ends a claim: committed puts e back live (its fields describe the files),
 * otherwise it leaves the index and is freed (what it named is dropped). */
static void claim_end(struct thaw_disk_cache *c, struct ent *e, int committed)
{
    e->busy = 0;
    e->gen++;
    if (committed) {
        ent_commit(c, e);
    } else {
        index_unlink(c, e);
        ent_free(c, e);
    }
    pthread_cond_broadcast(&c->key_cond);
}

/* ---- file I/O ----------------------------------------------------------- */

/* Every fsync of the store, a file's or the directory's: counted
 * (stats.fsyncs), since they are what a store waits for on a busy disk. */
static int do_fsync(struct thaw_disk_cache *c, int fd)
{
    atomic_fetch_add_explicit(&c->n_fsyncs, 1, memory_order_relaxed);
    return c->vfs->fsync(c->vfs, fd);
}

/* The group commit's one sync of everything it wrote (notes: "Group
 * commit"): counted with the fsyncs, since it is what they were. */
static int sync_fs(struct thaw_disk_cache *c, int dfd)
{
    atomic_fetch_add_explicit(&c->n_fsyncs, 1, memory_order_relaxed);
    return c->vfs->syncfs(c->vfs, dfd);
}

static int fsync_dir(struct thaw_disk_cache *c)
{
    const struct thaw_vfs *v = c->vfs;
    int fd, ret, r;

    fd = v->open(v, c->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (fd < 0)
        return fd;
    ret = do_fsync(c, fd);
    r = v->close(v, fd);
    return ret ? ret : r;
}

/* Writes data to a new file `path` (0600), sets its mtime to mtime_s
 * (>= 0), fsyncs it when `sync` (the group commit syncs the filesystem
 * once instead) and closes it. A stale file at path is replaced.
 * 0 or -errno; on error the file may remain (the caller unlinks it). */
static int write_file(struct thaw_disk_cache *c, const char *path, const void *data, size_t n, int64_t mtime_s,
                      int sync)
{
    const struct thaw_vfs *v = c->vfs;
    const int flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
    const uint8_t *p = data;
    int fd, ret = 0, r;

    fd = v->open(v, path, flags, 0600);
    if (fd == -EEXIST) { /* a leftover of a failed store: never write through it */
        r = v->unlink(v, path);
        if (r < 0 && r != -ENOENT)
            return r;
        fd = v->open(v, path, flags, 0600);
    }
    if (fd < 0)
        return fd;
    while (n > 0) {
        size_t chunk = n > (1u << 30) ? (1u << 30) : n;
        ssize_t w = v->write(v, fd, p, chunk);

        if (w < 0) {
            ret = (int)w;
            goto out_close;
        }
        if (w == 0) {
            ret = -EIO;
            goto out_close;
        }
        p += w;
        n -= (size_t)w;
    }
    if (mtime_s >= 0) {
        struct timespec ts[2] = {{.tv_nsec = UTIME_OMIT}, stamp(c, mtime_s)};

        ret = v->futimens(v, fd, ts);
        if (ret)
            goto out_close;
    }
    if (sync)
        ret = do_fsync(c, fd);
out_close:
    r = v->close(v, fd);
    return ret ? ret : r;
}

/* Removes key's entry from disk, .idx first (invariant 3). The parts go
 * only if the .idx did. 0, or the -errno of unlinking the .idx. */
static int remove_files(struct thaw_disk_cache *c, const char *hex)
{
    const struct thaw_vfs *v = c->vfs;
    char path[PATH_MAX];
    int r;

    entry_path(c, path, hex, ".idx", 0);
    r = v->unlink(v, path);
    if (r < 0 && r != -ENOENT)
        return r;
    for (int p = 0; p < THAW_PART_COUNT; p++) {
        entry_path(c, path, hex, part_ext[p], 0);
        (void)v->unlink(v, path);
    }
    return 0;
}

/* Reads <hex>.idx into a malloc'd buffer. 0 (*buf, *n, and *st if not NULL
 * filled), THAW_ENOTFOUND (no .idx), THAW_ECORRUPT (not a regular file, or
 * of a size no record has), THAW_ENOMEM or -errno. */
static int read_idx(struct thaw_disk_cache *c, const char *hex, uint8_t **buf, size_t *n, struct stat *st_out)
{
    const struct thaw_vfs *v = c->vfs;
    char path[PATH_MAX];
    struct stat st;
    uint8_t *b = NULL;
    size_t len, got = 0;
    int fd, ret;

    entry_path(c, path, hex, ".idx", 0);
    fd = v->open(v, path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC, 0);
    if (fd == -ENOENT)
        return THAW_ENOTFOUND;
    if (fd == -ELOOP)
        return THAW_ECORRUPT;
    if (fd < 0)
        return fd;
    ret = v->fstat(v, fd, &st);
    if (ret)
        goto out_close;
    if (!S_ISREG(st.st_mode) || st.st_size < (off_t)THAW_DISK_IDX_SIZE(0, 0) || st.st_size > (off_t)THAW_DISK_IDX_SIZE_MAX) {
        ret = THAW_ECORRUPT;
        goto out_close;
    }
    len = (size_t)st.st_size;
    b = malloc(len);
    if (!b) {
        ret = THAW_ENOMEM;
        goto out_close;
    }
    while (got < len) {
        ssize_t r = v->pread(v, fd, b + got, len - got, (off_t)got);

        if (r < 0) {
            ret = (int)r;
            goto out_free;
        }
        if (r == 0) { /* shrank under us */
            ret = THAW_ECORRUPT;
            goto out_free;
        }
        got += (size_t)r;
    }
    *buf = b;
    *n = len;
    if (st_out)
        *st_out = st;
    b = NULL;
out_free:
    free(b);
out_close:
    (void)v->close(v, fd);
    return ret;
}

/* Opens part p of <hex> for reading: 0 (*fd_out open: a regular file of
 * `size` bytes), THAW_ENOTFOUND (no such file), THAW_ECORRUPT (not regular,
 * wrong size) or -errno. */
static int open_part(struct thaw_disk_cache *c, const char *hex, int p, uint64_t size, int *fd_out)
{
    const struct thaw_vfs *v = c->vfs;
    char path[PATH_MAX];
    struct stat st;
    int fd, ret;

    entry_path(c, path, hex, part_ext[p], 0);
    fd = v->open(v, path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC, 0);
    if (fd == -ENOENT || fd == -ELOOP)
        return THAW_ENOTFOUND;
    if (fd < 0)
        return fd;
    ret = v->fstat(v, fd, &st);
    if (ret == 0 && (!S_ISREG(st.st_mode) || (uint64_t)st.st_size != size))
        ret = THAW_ECORRUPT;
    if (ret) {
        (void)v->close(v, fd);
        return ret;
    }
    *fd_out = fd;
    return 0;
}

/* Maps part p of <hex> and checks it against size and (with verify)
 * checksum.
 * 0 (*map set), THAW_ECORRUPT (missing, not regular, wrong size, checksum
 * mismatch; *why says which, static text), or -errno (unreadable). */
static int map_part(struct thaw_disk_cache *c, const char *hex, int p, uint64_t size, uint64_t xxh3, int verify,
                    void **map, const char **why)
{
    const struct thaw_vfs *v = c->vfs;
    void *m = NULL;
    int fd, ret;

    ret = open_part(c, hex, p, size, &fd);
    if (ret == THAW_ENOTFOUND || ret == THAW_ECORRUPT) {
        *why = ret == THAW_ENOTFOUND ? "missing" : "truncated or wrong size";
        return THAW_ECORRUPT;
    }
    if (ret)
        return ret;
    ret = v->mmap(v, fd, (size_t)size, &m);
    if (ret)
        goto out_close;
    if (verify && XXH3_64bits(m, (size_t)size) != xxh3) {
        *why = "checksum mismatch";
        (void)v->munmap(v, m, (size_t)size);
        ret = THAW_ECORRUPT;
        goto out_close;
    }
    *map = m;
out_close:
    (void)v->close(v, fd);
    return ret;
}

/* ---- open / close ------------------------------------------------------- */

struct thaw_disk_cache_params thaw_disk_cache_default_params(void)
{
    struct thaw_disk_cache_params p;

    memset(&p, 0, sizeof p);
    p.ttl_s = 259200;
    p.queue_max_bytes = THAW_DISK_QUEUE_MAX_BYTES_DEFAULT;
    p.block_grace_s = THAW_DISK_BLOCK_GRACE_DEFAULT;
    return p;
}

/* mkdir -p with 0700 for every component created. 0 or -errno. */
static int make_dirs(struct thaw_disk_cache *c)
{
    const struct thaw_vfs *v = c->vfs;
    char path[PATH_MAX];
    size_t len = strlen(c->dir);
    int r;

    memcpy(path, c->dir, len + 1);
    for (size_t i = 1; i <= len; i++) {
        if (path[i] != '/' && path[i] != '\0')
            continue;
        if (path[i - 1] == '/')
            continue;
        path[i] = '\0';
        r = v->mkdir(v, path, 0700);
        if (r < 0 && r != -EEXIST)
            return r;
        if (i < len)
            path[i] = '/';
    }
    return 0;
}

/* Makes sure c->dir is a 0700 directory (invariant 6). 0 or -errno. */
static int prepare_dir(struct thaw_disk_cache *c)
{
    const struct thaw_vfs *v = c->vfs;
    int shared = c->flags & (THAW_DISK_CACHE_SHARED | THAW_DISK_CACHE_READONLY);
    struct stat st;
    int r;

    r = v->stat(v, c->dir, &st);
    if (r == -ENOENT && !shared) {
        r = make_dirs(c);
        if (r)
            return r;
        logf_(c, THAW_LOG_INFO, "disk cache: created %s (0700)", c->dir);
        r = v->stat(v, c->dir, &st);
    }
    if (r)
        return r;
    if (!S_ISDIR(st.st_mode))
        return -ENOTDIR;
    if (st.st_mode & 077) {
        /* The files hold conversations. A second process only warns; the
         * owner fixes the mode or refuses to run. */
        if (shared) {
            logf_(c, THAW_LOG_WARN, "disk cache: %s has mode %04o; it should be 0700", c->dir,
                  (unsigned)(st.st_mode & 07777));
            return 0;
        }
        r = v->chmod(v, c->dir, 0700);
        if (r) {
            logf_(c, THAW_LOG_ERROR, "disk cache: %s has mode %04o and chmod 0700 failed: %s", c->dir,
                  (unsigned)(st.st_mode & 07777), thaw_strerror(r));
            return r;
        }
        logf_(c, THAW_LOG_WARN, "disk cache: %s had mode %04o; changed to 0700", c->dir,
              (unsigned)(st.st_mode & 07777));
    }
    return 0;
}

/* Takes <dir>/lock exclusively. 0, THAW_ELOCKED or -errno. */
static int take_lock(struct thaw_disk_cache *c)
{
    const struct thaw_vfs *v = c->vfs;
    char path[PATH_MAX];
    int fd, r;

    snprintf(path, sizeof path, "%s/lock", c->dir);
    fd = v->open(v, path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return fd;
    r = v->flock(v, fd, LOCK_EX | LOCK_NB);
    if (r) {
        (void)v->close(v, fd);
        return r == -EWOULDBLOCK ? THAW_ELOCKED : r;
    }
    c->lock_fd = fd;
    return 0;
}

/* Kinds of files of a key seen by the sweep. */
enum {
    SEEN_IDX = 1u << THAW_PART_COUNT,       /* parts use bits 0..2 */
    SEEN_TMP = 1u << (THAW_PART_COUNT + 1), /* <key>.<kind>.tmp */
};

struct seen {
    uint8_t key[THAW_KEY_BYTES];
    unsigned kinds;
};

struct scan {
    struct seen *v;
    size_t n, cap;
    int oom;
};

/* Which kind a name "<64 hex><ext>[.tmp]" is, and its key: the SEEN_* or
 * part bit, or 0 for names that are not thaw's (left alone). */
static unsigned classify(const char *name, uint8_t *key)
{
    const char *ext = name + HEX_LEN;
    unsigned kind = 0;

    if (strlen(name) <= HEX_LEN)
        return 0;
    for (int i = 0; i < HEX_LEN; i++)
        if (!((name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'f')))
            return 0;
    for (int p = 0; p <= THAW_PART_COUNT; p++) {
        const char *e = idx_or_part_ext(p);
        size_t el = strlen(e);

        if (strncmp(ext, e, el) != 0)
            continue;
        if (ext[el] == '\0')
            kind = p == THAW_PART_COUNT ? SEEN_IDX : 1u << p;
        else if (!strcmp(ext + el, ".tmp"))
            kind = SEEN_TMP;
        if (kind)
            break;
    }
    if (kind)
        (void)thaw_unhex(name, THAW_KEY_BYTES, key);
    return kind;
}

static int scan_cb(void *ud, const char *name)
{
    struct scan *s = ud;
    uint8_t key[THAW_KEY_BYTES];
    unsigned kind = classify(name, key);

    if (!kind)
        return 0;
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        struct seen *nv = realloc(s->v, cap * sizeof *nv);

        if (!nv) {
            s->oom = 1;
            return 1;
        }
        s->v = nv;
        s->cap = cap;
    }
    memcpy(s->v[s->n].key, key, THAW_KEY_BYTES);
    s->v[s->n].kinds = kind;
    s->n++;
    return 0;
}

static int seen_cmp(const void *a, const void *b)
{
    return memcmp(((const struct seen *)a)->key, ((const struct seen *)b)->key, THAW_KEY_BYTES);
}

static int ent_age_cmp(const void *a, const void *b)
{
    const struct ent *x = *(struct ent *const *)a, *y = *(struct ent *const *)b;

    if (x->last_used != y->last_used)
        return x->last_used < y->last_used ? -1 : 1;
    if (x->used_ns != y->used_ns)
        return x->used_ns < y->used_ns ? -1 : 1;
    if (x->created != y->created)
        return x->created < y->created ? -1 : 1;
    return memcmp(x->key, y->key, THAW_KEY_BYTES);
}

/* Loads (and with `sweep`, cleans up) one key found on disk. Returns 1 if a
 * file was removed, 0 if not, THAW_ENOMEM. Never fails on file content. */
static int load_key(struct thaw_disk_cache *c, const struct seen *s, int sweep, struct ent ***loaded, size_t *n_loaded,
                    size_t *cap_loaded)
{
    const struct thaw_vfs *v = c->vfs;
    int modify = !(c->flags & THAW_DISK_CACHE_READONLY);
    char hex[HEX_LEN + 1], path[PATH_MAX];
    struct thaw_disk_idx idx;
    struct stat st;
    uint8_t *buf = NULL;
    size_t n = 0;
    struct ent *e = NULL;
    unsigned keep = 0; /* part bits the committed entry uses */
    const char *why = NULL;
    int removed = 0, r, ret = 0;

    thaw_hex(s->key, THAW_KEY_BYTES, hex);
    if (!(s->kinds & SEEN_IDX))
        goto sweep_parts; /* orphans: never committed, or half removed */
    r = read_idx(c, hex, &buf, &n, &st);
    if (r == THAW_ENOMEM) {
        ret = r;
        goto out;
    }
    if (r == 0)
        r = thaw_disk_idx_parse(buf, n, &idx);
    if (r == 0 && memcmp(idx.key, s->key, THAW_KEY_BYTES) != 0)
        r = THAW_ECORRUPT;
    if (r == THAW_EVERSION) {
        /* Another format version (or a flipped version byte: the two look
         * alike). A cache, not an archive: it goes like a corrupt one. */
        why = "another .idx format version";
        goto corrupt;
    }
    if (r == THAW_ECORRUPT) {
        why = "unreadable .idx";
        goto corrupt;
    }
    if (r == THAW_ENOTFOUND) /* vanished since the listing (SHARED) */
        goto out;
    if (r < 0) {
        logf_(c, THAW_LOG_WARN, "disk cache: cannot read %.16s.idx: %s; ignored", hex, thaw_strerror(r));
        c->st.skipped_entries++;
        goto out;
    }
    e = calloc(1, sizeof *e);
    if (!e) {
        ret = THAW_ENOMEM;
        goto out;
    }
    memcpy(e->key, s->key, THAW_KEY_BYTES);
    memcpy(e->fingerprint, idx.fingerprint, THAW_DISK_FINGERPRINT_SIZE);
    e->n_tokens = idx.n_tokens;
    e->n_meta = idx.n_meta;
    e->created = idx.created;
    e->last_used = (int64_t)st.st_mtim.tv_sec;
    e->used_ns = st.st_mtim.tv_nsec;
    e->bytes = (uint64_t)st.st_size;
    e->is_block = idx.is_block;
    if (idx.n_refs) {
        if (!(e->refs = malloc((size_t)idx.n_refs * THAW_KEY_BYTES))) {
            ret = THAW_ENOMEM;
            goto out;
        }
        memcpy(e->refs, idx.refs, (size_t)idx.n_refs * THAW_KEY_BYTES);
        e->n_refs = idx.n_refs;
    }
    for (int p = 0; p < THAW_PART_COUNT; p++) {
        struct stat ps;

        if (!idx.size[p])
            continue;
        entry_path(c, path, hex, part_ext[p], 0);
        r = (s->kinds & (1u << p)) ? v->stat(v, path, &ps) : -ENOENT;
        if (r == 0 && (!S_ISREG(ps.st_mode) || (uint64_t)ps.st_size != idx.size[p]))
            r = THAW_ECORRUPT;
        if (r == 0) {
            e->part_size[p] = idx.size[p];
            if (p == THAW_PART_KV)
                e->kv_xxh3 = idx.xxh3[p];
            e->bytes += idx.size[p];
            keep |= 1u << p;
        } else if (p != THAW_PART_DFT) {
            why = r == THAW_ECORRUPT ? "part of the wrong size" : "part missing";
            goto corrupt;
        }
        /* A bad .dft is dropped by the first lookup (invariant 5). */
    }
    if (*n_loaded == *cap_loaded) {
        size_t cap = *cap_loaded ? 2 * *cap_loaded : 64;
        struct ent **nv = realloc(*loaded, cap * sizeof *nv);

        if (!nv) {
            ret = THAW_ENOMEM;
            goto out;
        }
        *loaded = nv;
        *cap_loaded = cap;
    }
    (*loaded)[(*n_loaded)++] = e;
    index_insert(c, e);
    /* counted now, before any block is committed: load_dir commits them
     * all afterwards, so a block sees every root that names it */
    if (e->n_refs)
        refs_add(c, e->refs[0], e->n_refs);
    e = NULL;
    goto sweep_parts;

corrupt:
    if (!modify) {
        logf_(c, THAW_LOG_WARN, "disk cache: entry %.16s is corrupt (%s); left in place (read-only)", hex, why);
        c->st.skipped_entries++;
        goto out;
    }
    r = remove_files(c, hex);
    if (r) {
        logf_(c, THAW_LOG_ERROR, "disk cache: entry %.16s is corrupt (%s); cannot remove it: %s", hex, why,
              thaw_strerror(r));
        goto out;
    }
    logf_(c, THAW_LOG_WARN, "disk cache: entry %.16s is corrupt (%s); removed", hex, why);
    c->st.corrupt_removed++;
    removed = 1;
    keep = 0;
    /* fall through: temporaries of the key go too */

sweep_parts:
    /* Parts no committed .idx lists, and temporaries (invariant 4). */
    if (!sweep)
        goto out;
    for (int p = 0; p < THAW_PART_COUNT; p++) {
        if (!(s->kinds & (1u << p)) || (keep & (1u << p)))
            continue;
        entry_path(c, path, hex, part_ext[p], 0);
        if (v->unlink(v, path) == 0) {
            c->st.swept_files++;
            removed = 1;
        }
    }
    if (s->kinds & SEEN_TMP) {
        for (int p = 0; p <= THAW_PART_COUNT; p++) {
            entry_path(c, path, hex, idx_or_part_ext(p), 1);
            if (v->unlink(v, path) == 0) {
                c->st.swept_files++;
                removed = 1;
            }
        }
    }
out:
    if (e)
        free(e->refs);
    free(e);
    free(buf);
    return ret ? ret : removed;
}

/* Lists the directory, sweeps (unless SHARED) and loads the index. 0,
 * THAW_ENOMEM or -errno (directory unreadable). */
static int load_dir(struct thaw_disk_cache *c)
{
    int sweep = !(c->flags & (THAW_DISK_CACHE_SHARED | THAW_DISK_CACHE_READONLY));
    struct scan s = {0};
    struct ent **loaded = NULL;
    size_t n_loaded = 0, cap_loaded = 0;
    int removed = 0, ret;
    size_t i, j;

    ret = c->vfs->listdir(c->vfs, c->dir, scan_cb, &s);
    if (s.oom)
        ret = THAW_ENOMEM;
    if (ret)
        goto out;
    /* One record per key with all the kinds seen. */
    if (s.n)
        qsort(s.v, s.n, sizeof *s.v, seen_cmp);
    for (i = 0, j = 0; i < s.n; i++) {
        if (j > 0 && !memcmp(s.v[j - 1].key, s.v[i].key, THAW_KEY_BYTES))
            s.v[j - 1].kinds |= s.v[i].kinds;
        else
            s.v[j++] = s.v[i];
    }
    s.n = j;
    for (i = 0; i < s.n; i++) {
        int r = load_key(c, &s.v[i], sweep, &loaded, &n_loaded, &cap_loaded);

        if (r < 0) {
            ret = r;
            goto out;
        }
        removed |= r;
    }
    /* The LRU list in order of last use, as the mtimes say. */
    if (n_loaded)
        qsort(loaded, n_loaded, sizeof *loaded, ent_age_cmp);
    for (i = 0; i < n_loaded; i++)
        ent_commit(c, loaded[i]);
    if (removed) {
        int r = fsync_dir(c);

        if (r)
            logf_(c, THAW_LOG_WARN, "disk cache: fsync %s: %s", c->dir, thaw_strerror(r));
    }
out:
    free(loaded);
    free(s.v);
    return ret;
}

static void *writer_main(void *arg);

static void free_index(struct thaw_disk_cache *c)
{
    THAW_KEYMAP_EACH(&c->index, i, n, nx)
    {
        struct ent *e = THAW_KEYMAP_OF(n, struct ent, hn);

        free(e->refs);
        free(e);
    }
    thaw_keymap_fini(&c->index);
    THAW_KEYMAP_EACH(&c->refcs, i, n, nx)
    {
        free(THAW_KEYMAP_OF(n, struct refc, hn));
    }
    thaw_keymap_fini(&c->refcs);
    while (c->ret_head) {
        struct retain *r = c->ret_head;

        c->ret_head = r->next;
        free(r);
    }
    thaw_keymap_fini(&c->retains);
}

int thaw_disk_cache_open(const struct thaw_disk_cache_params *p, struct thaw_disk_cache **out)
{
    struct thaw_disk_cache *c;
    char bytes[24];
    size_t len;
    int ret;

    if (!p || !out || !p->dir || !p->dir[0] || p->ttl_s < 0 || p->block_grace_s < 0)
        return THAW_EINVAL;
    len = strlen(p->dir);
    while (len > 1 && p->dir[len - 1] == '/')
        len--;
    /* Room for "/<64 hex>.ckpt.tmp" in a PATH_MAX buffer. */
    if (len + 1 + HEX_LEN + 16 >= PATH_MAX)
        return THAW_EINVAL;
    c = calloc(1, sizeof *c);
    if (!c)
        return THAW_ENOMEM;
    c->lock_fd = -1;
    c->store = c;
    atomic_init(&c->n_handles, 0);
    atomic_init(&c->n_fsyncs, 0);
    c->dir = strndup(p->dir, len);
    c->q_max_bytes = p->queue_max_bytes;
    if (!c->dir || thaw_keymap_init(&c->index) != 0 || thaw_keymap_init(&c->refcs) != 0 ||
        thaw_keymap_init(&c->retains) != 0) {
        ret = THAW_ENOMEM;
        goto err_free;
    }
    c->vfs = p->vfs ? p->vfs : thaw_vfs_default();
    c->max_bytes = p->max_bytes;
    c->ttl_s = p->ttl_s;
    memcpy(c->fingerprint, p->fingerprint, THAW_DISK_FINGERPRINT_SIZE);
    c->flags = p->flags;
    if (c->flags & THAW_DISK_CACHE_READONLY)
        c->flags |= THAW_DISK_CACHE_SHARED;
    if (c->flags & THAW_DISK_CACHE_SHARED)
        c->flags |= THAW_DISK_CACHE_NO_WRITER;
    c->log = p->log;
    c->log_ud = p->log_ud;
    c->now = p->now ? p->now : default_now;
    c->now_ud = p->now_ud;
    c->classify = p->classify;
    c->classify_ud = p->classify_ud;
    c->block_grace_s = p->block_grace_s;
    c->workers = p->workers;
    c->stamp_mu = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
    if (pthread_mutex_init(&c->mu, NULL)) {
        ret = THAW_ENOMEM;
        goto err_free;
    }
    if (pthread_cond_init(&c->key_cond, NULL)) {
        ret = THAW_ENOMEM;
        goto err_mutex;
    }
    if (pthread_cond_init(&c->q_cond, NULL)) {
        ret = THAW_ENOMEM;
        goto err_key_cond;
    }
    if (pthread_cond_init(&c->q_idle, NULL)) {
        ret = THAW_ENOMEM;
        goto err_q_cond;
    }

    ret = prepare_dir(c);
    if (ret)
        goto err_q_idle;
    if (!(c->flags & THAW_DISK_CACHE_SHARED)) {
        ret = take_lock(c);
        if (ret)
            goto err_q_idle;
    }
    /* No other thread exists yet; the lock keeps the helpers' contract. */
    pthread_mutex_lock(&c->mu);
    ret = load_dir(c);
    pthread_mutex_unlock(&c->mu);
    if (ret)
        goto err_index;
    if (!(c->flags & THAW_DISK_CACHE_NO_WRITER)) {
        ret = -pthread_create(&c->writer, NULL, writer_main, c);
        if (ret)
            goto err_index;
        c->has_writer = 1;
    }
    thaw_fmt_bytes(c->bytes, bytes);
    logf_(c, THAW_LOG_INFO, "disk cache: %s: %llu entr%s (%llu blocks, %llu named by none), %s%s", c->dir,
          (unsigned long long)c->n_live, c->n_live == 1 ? "y" : "ies", (unsigned long long)c->n_blocks,
          (unsigned long long)c->n_orphans, bytes, c->st.swept_files ? " (swept leftovers of an interrupted run)" : "");
    *out = c;
    return 0;

err_index:
    free_index(c);
    if (c->lock_fd >= 0)
        (void)c->vfs->close(c->vfs, c->lock_fd);
err_q_idle:
    pthread_cond_destroy(&c->q_idle);
err_q_cond:
    pthread_cond_destroy(&c->q_cond);
err_key_cond:
    pthread_cond_destroy(&c->key_cond);
err_mutex:
    pthread_mutex_destroy(&c->mu);
err_free:
    thaw_keymap_fini(&c->index);
    thaw_keymap_fini(&c->refcs);
    thaw_keymap_fini(&c->retains);
    free(c->dir);
    free(c);
    return ret;
}

/* Drops the job's references to its buffers and frees it. NULL: no-op. */
static void job_free(struct job *j)
{
    if (!j)
        return;
    for (int p = 0; p < THAW_PART_COUNT; p++)
        thaw_blob_unref(j->parts[p].data);
    free(j->meta);
    free(j);
}

int thaw_disk_cache_handle(struct thaw_disk_cache *store, const uint8_t fingerprint[THAW_DISK_FINGERPRINT_SIZE],
                           struct thaw_workers *workers, struct thaw_disk_cache **out)
{
    struct thaw_disk_cache *h;

    if (!store || !fingerprint || !out)
        return THAW_EINVAL;
    store = store->store; /* a handle's handle is the store's */
    if (!(h = calloc(1, sizeof *h)))
        return THAW_ENOMEM;
    h->store = store;
    h->lock_fd = -1;
    h->workers = workers;
    memcpy(h->fingerprint, fingerprint, THAW_DISK_FINGERPRINT_SIZE);
    atomic_fetch_add(&store->n_handles, 1);
    *out = h;
    return 0;
}

void thaw_disk_cache_close(struct thaw_disk_cache *c)
{
    if (!c)
        return;
    if (c->store != c) { /* a handle: the store stays open */
        atomic_fetch_sub(&c->store->n_handles, 1);
        free(c);
        return;
    }
    assert(atomic_load(&c->n_handles) == 0); /* handles are closed before their store */
    if (c->has_writer) {
        double t0 = mono_ms();
        pthread_mutex_lock(&c->mu);
        uint64_t left = c->q_len + c->q_active, ok = c->st.stores_ok, failed = c->st.store_failures;
        uint64_t syncs = atomic_load_explicit(&c->n_fsyncs, memory_order_relaxed);
        c->stopping = 1; /* the writer drains the queue before it exits: one group (notes: Shutdown) */
        pthread_cond_signal(&c->q_cond);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->writer, NULL);
        if (left)
            logf_(c, THAW_LOG_INFO, "disk cache: wrote %llu of the %llu stores queued at exit in %.0f ms, %llu syncs%s",
                  (unsigned long long)(c->st.stores_ok - ok), (unsigned long long)left, mono_ms() - t0,
                  (unsigned long long)(atomic_load_explicit(&c->n_fsyncs, memory_order_relaxed) - syncs),
                  c->st.store_failures > failed ? " (the rest failed: logged above)" : "");
    }
    while (c->q_head) { /* only without a writer: none */
        struct job *j = c->q_head;

        c->q_head = j->next;
        job_free(j);
    }
    free_index(c);
    if (c->lock_fd >= 0)
        (void)c->vfs->close(c->vfs, c->lock_fd);
    pthread_cond_destroy(&c->q_idle);
    pthread_cond_destroy(&c->q_cond);
    pthread_cond_destroy(&c->key_cond);
    pthread_mutex_destroy(&c->mu);
    free(c->dir);
    free(c);
}

/* ---- store -------------------------------------------------------------- */

/* What the caller's classify() says the entry is (params: classify). */
static void classify_kv(const struct thaw_disk_cache *c, const struct thaw_part_blob *kv, struct links *out)
{
    memset(out, 0, sizeof *out);
    if (!c->classify || !kv->data)
        return;
    out->is_block = c->classify(c->classify_ud, kv->data, kv->size, &out->refs, &out->n_refs) == THAW_DISK_KIND_BLOCK;
    if (out->is_block || !out->refs) {
        out->refs = NULL; /* a block names nothing */
        out->n_refs = 0;
    }
}

/* The checks store and submit share; *ln gets what the entry is (known,
 * when the caller classified it already, else classify()). 0, THAW_EINVAL
 * or THAW_ETOOBIG. */
static int store_check(const struct thaw_disk_cache *c, const uint8_t *key, const struct thaw_part_blob *parts,
                       const void *meta, size_t n_meta, const struct links *known, struct links *ln, uint64_t *total)
{
    uint64_t sum;

    if (!c || !key || !parts || (n_meta && !meta) || (c->flags & THAW_DISK_CACHE_READONLY))
        return THAW_EINVAL;
    if (parts[THAW_PART_KV].size == 0 || !parts[THAW_PART_KV].data)
        return THAW_EINVAL;
    if (n_meta > THAW_DISK_META_MAX)
        return THAW_ETOOBIG;
    if (known)
        *ln = *known;
    else
        classify_kv(c, &parts[THAW_PART_KV], ln);
    if (ln->n_refs > THAW_DISK_REFS_MAX)
        return THAW_ETOOBIG;
    sum = THAW_DISK_IDX_SIZE(n_meta, ln->n_refs);
    for (int p = 0; p < THAW_PART_COUNT; p++) {
        if (parts[p].size && !parts[p].data)
            return THAW_EINVAL;
        if (parts[p].size > (uint64_t)INT64_MAX - sum)
            return THAW_ETOOBIG;
        sum += parts[p].size;
    }
    if (c->max_bytes && sum > c->max_bytes)
        return THAW_ETOOBIG;
    *total = sum;
    return 0;
}

/* One file of an entry, made durable under its final name: written and
 * fsynced as `tmp` (write_file), then renamed over `path` (invariant 1). */
static int install_file(struct thaw_disk_cache *c, const char *tmp, const char *path, const void *data, size_t n,
                        int64_t mtime_s, int sync)
{
    int ret = write_file(c, tmp, data, n, mtime_s, sync);

    return ret ? ret : c->vfs->rename(c->vfs, tmp, path);
}

/* The first half of a store of <hex>: the old .idx goes first (invariant
 * 3), then every part is installed (each fsynced before its rename when
 * `sync`) and a part the new entry lacks is unlinked. The directory is not
 * fsynced. 0 or -errno (what was written stays: the caller scrubs it). */
static int write_parts(struct thaw_disk_cache *c, const char *hex, const struct thaw_part_blob parts[THAW_PART_COUNT],
                       int sync)
{
    const struct thaw_vfs *v = c->vfs;
    char tmp[PATH_MAX], path[PATH_MAX];
    int ret;

    entry_path(c, path, hex, ".idx", 0);
    ret = v->unlink(v, path);
    if (ret && ret != -ENOENT)
        return ret;
    for (int p = 0; p < THAW_PART_COUNT; p++) {
        entry_path(c, path, hex, part_ext[p], 0);
        if (parts[p].size == 0) {
            /* A part the old entry had must not outlive it. */
            ret = v->unlink(v, path);
            if (ret && ret != -ENOENT)
                return ret;
            continue;
        }
        entry_path(c, tmp, hex, part_ext[p], 1);
        ret = install_file(c, tmp, path, parts[p].data, parts[p].size, -1, sync);
        if (ret)
            return ret;
    }
    return 0;
}

/* The second half: the .idx, whose rename is the commit (durable once the
 * directory is fsynced, or the filesystem synced). 0 or -errno. */
static int write_idx(struct thaw_disk_cache *c, const struct staged *s, int sync)
{
    char tmp[PATH_MAX], path[PATH_MAX];

    entry_path(c, tmp, s->hex, ".idx", 1);
    entry_path(c, path, s->hex, ".idx", 0);
    return install_file(c, tmp, path, s->rec, s->rec_len, s->now, sync);
}

/* Whatever a failed store of <hex> wrote goes, .idx first (it can only be
 * there if the failure came after its rename), temporaries included
 * (invariant 3). */
static void scrub_files(struct thaw_disk_cache *c, const char *hex)
{
    char tmp[PATH_MAX];

    (void)remove_files(c, hex);
    for (int p = 0; p <= THAW_PART_COUNT; p++) {
        entry_path(c, tmp, hex, idx_or_part_ext(p), 1);
        (void)c->vfs->unlink(c->vfs, tmp);
    }
}

/* Writes one staged store's files from scratch, alone: the parts, the
 * directory, the .idx (the commit) and the directory again (invariants 1,
 * 3). 0, or -errno with every file of the key scrubbed. */
static int store_files(struct thaw_disk_cache *c, const struct staged *s,
                       const struct thaw_part_blob parts[THAW_PART_COUNT])
{
    int ret = write_parts(c, s->hex, parts, 1);

    if (ret == 0)
        ret = fsync_dir(c);
    if (ret == 0)
        ret = write_idx(c, s, 1);
    if (ret == 0)
        ret = fsync_dir(c);
    if (ret)
        scrub_files(c, s->hex);
    return ret;
}

static int make_room(struct thaw_disk_cache *c, const char *hex, uint64_t need, int err, int round);

/* The refs of a queued store were counted at submit (held); its store
 * hands them to the entry it commits, or drops them when it fails, under
 * the lock of the commit, so its blocks are never unnamed in between (an
 * eviction pass right after would collect them). With c->mu held. */
static void held_release(struct thaw_disk_cache *c, const struct links *held)
{
    if (held && held->n_refs)
        refs_drop(c, held->refs, held->n_refs);
}

/* Checks a store and makes its .idx record (no I/O, no lock). held NULL:
 * thaw_disk_cache_store, classified here; otherwise the writer's job,
 * classified at submit. fp: the fingerprint its .idx and index entry get
 * (the storing handle's; c is the store). 0, or what store_check says, or
 * THAW_ENOMEM; *s is ready for store_end() either way. */
static int stage(struct thaw_disk_cache *c, const uint8_t *fp, const uint8_t key[THAW_KEY_BYTES], uint32_t n_tokens,
                 const struct thaw_part_blob parts[THAW_PART_COUNT], const void *meta, size_t n_meta,
                 const struct links *held, struct staged *s)
{
    struct thaw_disk_idx idx;
    int ret;

    memset(s, 0, sizeof *s);
    s->t0 = mono_ms();
    ret = store_check(c, key, parts, meta, n_meta, held, &s->ln, &s->total);
    if (ret)
        return ret;
    if (s->ln.n_refs && !(s->refs = malloc((size_t)s->ln.n_refs * THAW_KEY_BYTES)))
        return THAW_ENOMEM;
    s->now = now_s(c);
    s->n_tokens = n_tokens;
    s->n_meta = (uint32_t)n_meta;
    thaw_hex(key, THAW_KEY_BYTES, s->hex);

    memset(&idx, 0, sizeof idx);
    memcpy(idx.key, key, THAW_KEY_BYTES);
    memcpy(s->fingerprint, fp, THAW_DISK_FINGERPRINT_SIZE);
    memcpy(idx.fingerprint, fp, THAW_DISK_FINGERPRINT_SIZE);
    idx.n_tokens = n_tokens;
    idx.created = s->now;
    idx.n_meta = (uint32_t)n_meta;
    idx.meta = meta;
    idx.is_block = s->ln.is_block;
    idx.n_refs = s->ln.n_refs;
    idx.refs = s->ln.refs;
    if (s->ln.n_refs)
        memcpy(s->refs, s->ln.refs, (size_t)s->ln.n_refs * THAW_KEY_BYTES);
    for (int p = 0; p < THAW_PART_COUNT; p++) {
        s->part_size[p] = parts[p].size;
        if (!parts[p].size)
            continue;
        idx.size[p] = parts[p].size;
        idx.xxh3[p] = XXH3_64bits(parts[p].data, parts[p].size);
    }
    s->kv_xxh3 = idx.xxh3[THAW_PART_KV];
    return thaw_disk_idx_encode(&idx, &s->rec, &s->rec_len);
}

/* Claims the key of a staged store (waiting for another claim of it to
 * end). 0 or THAW_ENOMEM. With c->mu held. */
static int stage_claim(struct thaw_disk_cache *c, const uint8_t key[THAW_KEY_BYTES], struct staged *s)
{
    s->e = claim_wait(c, key, 1);
    return s->e ? 0 : THAW_ENOMEM;
}

/* Ends a staged store whose files are committed (ret 0) or scrubbed (ret
 * -errno or the project's error): the entry goes live, or the claim ends
 * with nothing; either way its held refs are released and the outcome
 * counted (stores_ok / store_failures) and logged. Frees what s owns.
 * Returns ret. */
static int store_end(struct thaw_disk_cache *c, struct staged *s, const struct links *held, int ret)
{
    struct ent *e = s->e;
    char bytes[24];

    pthread_mutex_lock(&c->mu);
    if (ret == 0) {
        memcpy(e->fingerprint, s->fingerprint, THAW_DISK_FINGERPRINT_SIZE);
        e->bytes = s->total;
        memcpy(e->part_size, s->part_size, sizeof e->part_size);
        e->kv_xxh3 = s->kv_xxh3;
        e->n_tokens = s->n_tokens;
        e->n_meta = s->n_meta;
        e->created = s->now;
        e->last_used = s->now;
        e->is_block = s->ln.is_block;
        ent_set_refs(c, e, s->refs, s->ln.n_refs); /* before the commit: a block named here is never an orphan */
        s->refs = NULL;
        held_release(c, held);
        claim_end(c, e, 1);
        c->st.stores_ok++;
        c->st.roots_ok += !s->ln.is_block;
    } else {
        if (e)
            claim_end(c, e, 0);
        held_release(c, held);
        c->st.store_failures++;
    }
    pthread_mutex_unlock(&c->mu);
    if (ret == 0) {
        thaw_fmt_bytes(s->total, bytes);
        /* debug: the engine logs the one INFO line per store (what, how big, where) */
        logf_(c, THAW_LOG_DEBUG, "disk cache: stored %.16s: %u tokens, %s in %.0f ms", s->hex, s->n_tokens, bytes,
              mono_ms() - s->t0);
    } else if (e) { /* an I/O error: the others are the caller's mistakes or memory */
        logf_(c, THAW_LOG_ERROR, "disk cache: store of %.16s failed: %s", s->hex, thaw_strerror(ret));
    }
    free(s->rec);
    free(s->refs);
    s->rec = NULL;
    s->refs = NULL;
    s->e = NULL;
    return ret;
}

/* Stores a claimed, staged store by itself. err is what an attempt already
 * made (in a group) ended with: 0 for none, then it starts with one.
 * A full disk costs the least recently used entries, not this one: the
 * newest state is the one the next turn asks for. Each round starts from
 * nothing on disk (the attempt before scrubbed it), so a file whose fsync
 * failed is never trusted again. The key itself is claimed, hence off the
 * LRU list: never its own victim. 0 or -errno (files scrubbed). */
static int store_alone(struct thaw_disk_cache *c, const struct staged *s,
                       const struct thaw_part_blob parts[THAW_PART_COUNT], int err)
{
    int ret = err ? err : store_files(c, s, parts);

    for (int round = 1; (ret == -ENOSPC || ret == -EDQUOT) && round <= THAW_DISK_ENOSPC_ROUNDS; round++) {
        if (make_room(c, s->hex, s->total, ret, round) == 0)
            break; /* nothing left to evict: full of something else */
        ret = store_files(c, s, parts);
    }
    return ret;
}

int thaw_disk_cache_store(struct thaw_disk_cache *c, const uint8_t key[THAW_KEY_BYTES], uint32_t n_tokens,
                          const struct thaw_part_blob parts[THAW_PART_COUNT], const void *meta, size_t n_meta)
{
    struct staged s;
    int ret;

    if (!c)
        return THAW_EINVAL;
    ret = stage(c->store, c->fingerprint, key, n_tokens, parts, meta, n_meta, NULL, &s);
    c = c->store;
    if (ret == 0) {
        pthread_mutex_lock(&c->mu);
        ret = stage_claim(c, key, &s);
        pthread_mutex_unlock(&c->mu);
    }
    if (ret == 0)
        ret = store_alone(c, &s, parts, 0);
    return store_end(c, &s, NULL, ret);
}

/* ---- store: the writer's group commit ---- */

/* Ends job j of a group (store_end) and lets go of it at once, as of a
 * store written alone: lookups find it in the index if it committed, no
 * longer through pending(), and its buffers are released. */
static void job_end(struct thaw_disk_cache *c, struct job *j, int ret)
{
    void *bufs[THAW_PART_COUNT];

    (void)store_end(c, &j->s, &j->links, ret); /* the last use of links.refs, which point into the .kv */
    j->state = JOB_DONE;
    pthread_mutex_lock(&c->mu);
    j->ended = 1;
    for (int p = 0; p < THAW_PART_COUNT; p++) {
        bufs[p] = j->parts[p].data;
        j->parts[p].data = NULL;
    }
    pthread_mutex_unlock(&c->mu);
    for (int p = 0; p < THAW_PART_COUNT; p++)
        thaw_blob_unref(bufs[p]);
}

/* Takes the ended jobs of g not yet counted out (of one kind, or any kind
 * with blocks -1) out of q_bytes and q_active: after their buffers went,
 * and after the eviction pass that follows their commit, so that a queue
 * at 0 bytes means the writer is done (tests and benches wait for it). */
static void jobs_count_out(struct thaw_disk_cache *c, struct job *g, int blocks)
{
    pthread_mutex_lock(&c->mu);
    for (struct job *j = g; j; j = j->next) {
        if (j->state != JOB_DONE || j->counted || (blocks >= 0 && j->s.ln.is_block != blocks))
            continue;
        j->counted = 1;
        c->q_bytes -= j->bytes;
        c->q_active--;
    }
    pthread_mutex_unlock(&c->mu);
}

/* Job j failed in its group with err (0: a sync it shared failed):
 * what it wrote goes now, and it is stored by itself later. */
static void job_alone(struct thaw_disk_cache *c, struct job *j, int err)
{
    scrub_files(c, j->s.hex);
    j->state = JOB_ALONE;
    j->err = err;
}

/* Writes the .idx of every job of the group of one kind (blocks 1, roots
 * 0) still in it, renamed into place, not synced; a job whose write fails
 * goes alone. Returns how many were written. */
static unsigned write_idxs(struct thaw_disk_cache *c, struct job *g, int blocks)
{
    unsigned n = 0;
    int r;

    for (struct job *j = g; j; j = j->next) {
        if (j->state != JOB_GROUP || j->s.ln.is_block != blocks)
            continue;
        if ((r = write_idx(c, &j->s, 0)) != 0)
            job_alone(c, j, r);
        else
            n++;
    }
    return n;
}

/* After the sync that made their .idx durable (sync_err 0) or failed
 * (which of the group's files it covered is then unknown: every job
 * still in the group goes alone, of either kind, since a root's parts
 * rode on that sync too): ends the jobs of one kind; then stores those
 * that failed in the group, each by itself, with its disk-full rounds;
 * then an eviction pass if any committed (the budget holds between
 * lookups too). Every job of the kind ends here and leaves the queue's
 * count. */
static void group_end(struct thaw_disk_cache *c, struct job *g, int blocks, int sync_err)
{
    unsigned n_ok = 0;
    struct job *j;
    int r;

    if (sync_err)
        for (j = g; j; j = j->next)
            if (j->state == JOB_GROUP)
                job_alone(c, j, 0);
    for (j = g; j; j = j->next) {
        if (j->state != JOB_GROUP || j->s.ln.is_block != blocks)
            continue;
        job_end(c, j, 0);
        n_ok++;
    }
    for (j = g; j; j = j->next) {
        if (j->state != JOB_ALONE || j->s.ln.is_block != blocks)
            continue;
        r = store_alone(c, &j->s, j->parts, j->err);
        n_ok += r == 0;
        job_end(c, j, r);
    }
    if (n_ok && c->max_bytes)
        (void)thaw_disk_cache_evict(c);
    jobs_count_out(c, g, blocks);
}

/* Stores the group g (FIFO, distinct keys) as one commit with two syncs
 * of the filesystem, however many jobs and parts (the notes: "Group
 * commit"): every job's parts and the blocks' .idx, one sync; the roots'
 * .idx, one sync. Each job ends committed or failed exactly as a store of
 * its own would: its claim, its held refs, its stats. */
static void store_group(struct thaw_disk_cache *c, struct job *g)
{
    double t0 = mono_ms(), t_sync = 0, t;
    unsigned n = 0;
    struct job *j;
    int r, dfd, sync = 0;

    for (j = g; j; j = j->next) {
        j->state = JOB_GROUP;
        j->err = stage(c, j->fingerprint, j->key, j->n_tokens, j->parts, j->meta, j->n_meta, &j->links, &j->s);
    }
    /* No claim is waited for while another is held, except here: nothing
     * that holds a claim ever waits for one (evictions take only unclaimed
     * entries), so this cannot deadlock. */
    pthread_mutex_lock(&c->mu);
    for (j = g; j; j = j->next)
        if (!j->err)
            j->err = stage_claim(c, j->key, &j->s);
    pthread_mutex_unlock(&c->mu);
    for (j = g; j; j = j->next)
        if (j->err)
            job_end(c, j, j->err);
    jobs_count_out(c, g, -1); /* those failed: nothing to evict for them */
    /* The descriptor the syncs go through, opened before the first write:
     * syncfs reports a writeback error that happened since (vfs.h). */
    dfd = c->vfs->open(c->vfs, c->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    for (j = g; j; j = j->next) {
        if (j->state != JOB_GROUP)
            continue;
        if (dfd < 0)
            job_alone(c, j, 0); /* no sync to share: each with its own fsyncs */
        else if ((r = write_parts(c, j->s.hex, j->parts, 0)) != 0)
            job_alone(c, j, r);
        else
            n++;
    }
    n += write_idxs(c, g, 1);
    /* blocks written ahead of their manifest alone: no sync (the notes,
     * "Blocks ahead"); any other job in the group syncs them with it */
    for (j = g; j; j = j->next)
        sync |= j->state == JOB_GROUP && !j->unsynced;
    t = mono_ms();
    int unsynced = n && !sync;
    r = n && sync ? sync_fs(c, dfd) : 0;
    t_sync += mono_ms() - t;
    group_end(c, g, 1, r);
    n = write_idxs(c, g, 0);
    t = mono_ms();
    r = n ? sync_fs(c, dfd) : 0;
    t_sync += mono_ms() - t;
    group_end(c, g, 0, r);
    if (dfd >= 0)
        (void)c->vfs->close(c->vfs, dfd);
    t = mono_ms();
    pthread_mutex_lock(&c->mu);
    c->st.groups++;
    c->st.groups_unsynced += (uint64_t)unsynced;
    c->st.group_wait_us += (uint64_t)(1000 * (t0 - g->t_submit));
    c->st.group_write_us += (uint64_t)(1000 * (t - t0 - t_sync));
    c->st.group_sync_us += (uint64_t)(1000 * t_sync);
    pthread_mutex_unlock(&c->mu);
}

/* The next group, off the head of the queue: up to GROUP_MAX_JOBS jobs and
 * GROUP_MAX_BYTES (at least one job; no limit once stopping), ending before a key already in it (a
 * second store of a key waits for the first to commit). With c->mu held;
 * the queue is not empty. */
static struct job *group_take(struct thaw_disk_cache *c)
{
    struct job *g = c->q_head, *j = g, *last = NULL;
    uint64_t sum = 0;
    unsigned n = 0;

    for (; j && (c->stopping || (n < GROUP_MAX_JOBS && (n == 0 || sum + j->bytes <= GROUP_MAX_BYTES))); j = j->next) {
        const struct job *k = g;

        for (; k != j && memcmp(k->key, j->key, THAW_KEY_BYTES); k = k->next)
            ;
        if (k != j)
            break;
        sum += j->bytes;
        n++;
        last = j;
    }
    last->next = NULL;
    c->q_head = j;
    if (!j)
        c->q_tail = NULL;
    c->q_len -= n;
    c->q_active = n;
    c->q_group = g;
    c->q_writing = 1;
    return g;
}

static void *writer_main(void *arg)
{
    struct thaw_disk_cache *c = arg;
    struct job *g, *next;

    /* A store should not slow a decode, nor wait behind every other process
     * of the machine: its CPU work (checksums, copies into the page cache)
     * is milliseconds a turn, so a lower weight (nice 5: about a quarter of
     * a busy core's share) rather than SCHED_IDLE, which two CPU-bound
     * processes beside the server starved for seconds (measured: 7 of 8
     * turns not on disk 1 s after the reply). Best effort. */
    (void)setpriority(PRIO_PROCESS, (id_t)gettid(), 5);

    pthread_mutex_lock(&c->mu);
    for (;;) {
        while ((!c->q_head || c->q_paused || c->q_batches) && !c->stopping)
            pthread_cond_wait(&c->q_cond, &c->mu);
        if (!c->q_head)
            break; /* stopping, and drained */
        g = group_take(c);
        pthread_mutex_unlock(&c->mu);

        store_group(c, g); /* every job ends in it, out of q_bytes and q_active */
        pthread_mutex_lock(&c->mu);
        c->q_group = NULL;
        pthread_mutex_unlock(&c->mu);
        for (; g; g = next) { /* their buffers are gone already */
            next = g->next;
            job_free(g);
        }

        pthread_mutex_lock(&c->mu);
        c->q_writing = 0;
        pthread_cond_broadcast(&c->q_idle);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* A root j just queued replaces a store of its key still waiting (not yet
 * in a group): that one would be overwritten as soon as it committed
 * (the newest store of a key wins), so it is taken out of the queue, its
 * refs dropped (after j's were counted: a block both name never looks
 * unnamed) and its bytes out of the budget. Returns it, for the caller to
 * free outside the lock, or NULL. Blocks are not touched: a block queued
 * twice is the same bytes, and the first stays ahead of the roots that
 * name it (FIFO, invariant 7). With c->mu held. */
static struct job *queue_supersede(struct thaw_disk_cache *c, struct job *j)
{
    struct job *prev = NULL, *o = c->q_head;

    for (; o != j && memcmp(o->key, j->key, THAW_KEY_BYTES); prev = o, o = o->next)
        ;
    if (o == j)
        return NULL;
    if (prev)
        prev->next = o->next;
    else
        c->q_head = o->next; /* o is not the tail: j is behind it */
    c->q_len--;
    c->q_bytes -= o->bytes;
    held_release(c, &o->links);
    c->st.stores_superseded++;
    return o;
}

static int submit(struct thaw_disk_cache *c, const uint8_t key[THAW_KEY_BYTES], uint32_t n_tokens,
                  struct thaw_part_blob parts[THAW_PART_COUNT], const void *meta, size_t n_meta, int unsynced)
{
    struct job *j = NULL, *old = NULL;
    uint64_t total = 0, held = 0;
    unsigned held_n = 0;
    char hex[HEX_LEN + 1] = "(no key)", size[24], held_s[24], budget[24];
    const char *why = NULL; /* of a drop, unless the queue was full */
    struct links ln;
    const uint8_t *fp;
    int ret;

    if (!c)
        return THAW_EINVAL;
    fp = c->fingerprint;
    c = c->store;
    ret = store_check(c, key, parts, meta, n_meta, NULL, &ln, &total);
    if (ret) {
        why = ret == THAW_ETOOBIG ? "too big (meta, refs, or the entry alone exceeds max_bytes)" : "invalid arguments";
        goto out;
    }
    j = calloc(1, sizeof *j);
    if (!j || (n_meta && !(j->meta = malloc(n_meta)))) {
        ret = THAW_ENOMEM;
        why = "out of memory";
        goto out;
    }
    if (n_meta)
        memcpy(j->meta, meta, n_meta);
    memcpy(j->key, key, THAW_KEY_BYTES);
    memcpy(j->fingerprint, fp, THAW_DISK_FINGERPRINT_SIZE);
    j->n_tokens = n_tokens;
    j->n_meta = n_meta;
    j->links = ln; /* points into parts[THAW_PART_KV], which the job holds from here */
    j->bytes = total;
    j->t_submit = mono_ms();
    j->unsynced = unsynced && ln.is_block; /* a root is what makes a turn durable: always synced */

    pthread_mutex_lock(&c->mu);
    held = c->q_bytes;
    held_n = c->q_len + (unsigned)c->q_active;
    if (!c->has_writer) {
        ret = THAW_EINVAL;
        why = "no writer thread (opened NO_WRITER, SHARED or READONLY)";
    } else if (c->stopping) {
        ret = THAW_ESHUTDOWN;
        why = "the cache is closing";
    } else if (c->q_max_bytes && held > 0 && (held >= c->q_max_bytes || total > c->q_max_bytes - held)) {
        /* Bytes, not a count: many small stores may wait, and one larger
         * than the whole budget still goes when the writer holds nothing,
         * or a big model could never store. */
        ret = THAW_EBUSY;
    } else {
        for (int p = 0; p < THAW_PART_COUNT; p++) {
            j->parts[p] = parts[p];
            if (!parts[p].size) { /* absent: the cache owns no buffer for it */
                thaw_blob_unref(parts[p].data);
                j->parts[p].data = NULL;
            }
            parts[p].data = NULL;
        }
        if (c->q_tail)
            c->q_tail->next = j;
        else
            c->q_head = j;
        c->q_tail = j;
        c->q_len++;
        c->q_bytes += total;
        /* A queued manifest already names its blocks: those written before
         * it (the same FIFO) are not collected while it waits. */
        if (ln.n_refs)
            refs_add(c, ln.refs, ln.n_refs);
        if (!ln.is_block)
            old = queue_supersede(c, j);
        j = NULL;
        pthread_cond_signal(&c->q_cond);
    }
    pthread_mutex_unlock(&c->mu);
    job_free(old);

out:
    if (ret == 0)
        return 0;
    job_free(j); /* holds no part of the caller's yet */
    pthread_mutex_lock(&c->mu);
    c->st.stores_dropped++;
    pthread_mutex_unlock(&c->mu);
    if (key)
        thaw_hex(key, THAW_KEY_BYTES, hex);
    thaw_fmt_bytes(total, size);
    if (ret == THAW_EBUSY) {
        thaw_fmt_bytes(held, held_s);
        thaw_fmt_bytes(c->q_max_bytes, budget);
        logf_(c, THAW_LOG_WARN,
              "disk cache: dropped store of %.16s (%s): writer queue full: it holds %s in %u "
              "store%s, budget %s",
              hex, size, held_s, held_n, held_n == 1 ? "" : "s", budget);
    } else {
        logf_(c, THAW_LOG_WARN, "disk cache: dropped store of %.16s (%s): %s", hex, size, why);
    }
    return ret;
}

int thaw_disk_cache_submit(struct thaw_disk_cache *c, const uint8_t key[THAW_KEY_BYTES], uint32_t n_tokens,
                           struct thaw_part_blob parts[THAW_PART_COUNT], const void *meta, size_t n_meta)
{
    return submit(c, key, n_tokens, parts, meta, n_meta, 0);
}

int thaw_disk_cache_submit_unsynced(struct thaw_disk_cache *c, const uint8_t key[THAW_KEY_BYTES], uint32_t n_tokens,
                                    struct thaw_part_blob parts[THAW_PART_COUNT])
{
    return submit(c, key, n_tokens, parts, NULL, 0, 1);
}

int thaw_disk_cache_pending(struct thaw_disk_cache *c, const uint8_t key[THAW_KEY_BYTES],
                            struct thaw_part_blob out[THAW_PART_COUNT])
{
    const struct job *found = NULL;

    if (!c || !key || !out)
        return THAW_EINVAL;
    c = c->store;
    pthread_mutex_lock(&c->mu);
    /* the newest store of the key wins: the group being written is older
     * than any waiting job, and holds a key once */
    for (const struct job *j = c->q_group; j; j = j->next)
        if (!j->ended && memcmp(j->key, key, THAW_KEY_BYTES) == 0)
            found = j;
    for (const struct job *j = c->q_head; j; j = j->next)
        if (memcmp(j->key, key, THAW_KEY_BYTES) == 0)
            found = j;
    for (int p = 0; p < THAW_PART_COUNT; p++) {
        out[p].data = found && found->parts[p].size ? thaw_blob_ref(found->parts[p].data) : NULL;
        out[p].size = out[p].data ? found->parts[p].size : 0;
    }
    pthread_mutex_unlock(&c->mu);
    return found ? 0 : THAW_ENOTFOUND;
}

void thaw_disk_cache_flush(struct thaw_disk_cache *c)
{
    if (!(c = c ? c->store : NULL) || !c->has_writer)
        return;
    pthread_mutex_lock(&c->mu);
    c->q_paused = 0;
    pthread_cond_signal(&c->q_cond);
    while (c->q_head || c->q_writing)
        pthread_cond_wait(&c->q_idle, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

void thaw_disk_cache_batch_begin(struct thaw_disk_cache *c)
{
    if (!(c = c ? c->store : NULL) || !c->has_writer)
        return;
    pthread_mutex_lock(&c->mu);
    c->q_batches++;
    pthread_mutex_unlock(&c->mu);
}

void thaw_disk_cache_batch_end(struct thaw_disk_cache *c)
{
    if (!(c = c ? c->store : NULL) || !c->has_writer)
        return;
    pthread_mutex_lock(&c->mu);
    if (c->q_batches && --c->q_batches == 0)
        pthread_cond_signal(&c->q_cond);
    pthread_mutex_unlock(&c->mu);
}

void thaw_disk_cache_pause(struct thaw_disk_cache *c, int paused)
{
    if (!(c = c ? c->store : NULL) || !c->has_writer)
        return;
    pthread_mutex_lock(&c->mu);
    c->q_paused = paused != 0;
    pthread_cond_signal(&c->q_cond);
    pthread_mutex_unlock(&c->mu);
}

/* ---- lookup ------------------------------------------------------------- */

void thaw_disk_entry_release(struct thaw_disk_entry *e)
{
    if (!e)
        return;
    for (int p = 0; p < THAW_PART_COUNT; p++)
        if (e->map[p])
            (void)e->vfs->munmap(e->vfs, e->map[p], e->size[p]);
    free(e->idx_buf);
    free(e);
}

#define WHY_LEN 64

/* Reads and verifies key's entry (invariant 2). Returns 0 with *out (a bad
 * .dft is then left out and flagged in *bad), THAW_ENOTFOUND (no .idx),
 * THAW_ECORRUPT (*bad and why[WHY_LEN] say what; an .idx of another
 * format version included), THAW_EMISMATCH (check_fp and another
 * fingerprint), THAW_ENOMEM or -errno. */
static int entry_load(struct thaw_disk_cache *c, const uint8_t *key, const char *hex, const uint8_t *check_fp, unsigned defer,
                      struct thaw_disk_entry **out, unsigned *bad, char *why)
{
    struct thaw_disk_entry *en;
    int ret;

    *bad = 0;
    why[0] = '\0';
    en = calloc(1, sizeof *en);
    if (!en)
        return THAW_ENOMEM;
    en->vfs = c->vfs;
    ret = read_idx(c, hex, &en->idx_buf, &en->idx_len, NULL);
    if (ret == 0) {
        ret = thaw_disk_idx_parse(en->idx_buf, en->idx_len, &en->idx);
        if (ret == 0 && memcmp(en->idx.key, key, THAW_KEY_BYTES) != 0)
            ret = THAW_ECORRUPT;
    }
    if (ret == THAW_EVERSION || ret == THAW_ECORRUPT) { /* see load_key */
        *bad |= THAW_DISK_BAD_IDX;
        snprintf(why, WHY_LEN, "%s", ret == THAW_ECORRUPT ? "bad .idx" : ".idx of another version");
        ret = THAW_ECORRUPT;
    }
    if (ret)
        goto err;
    if (check_fp && memcmp(en->idx.fingerprint, check_fp, THAW_DISK_FINGERPRINT_SIZE)) {
        ret = THAW_EMISMATCH;
        goto err;
    }
    en->n_tokens = en->idx.n_tokens;
    for (int p = 0; p < THAW_PART_COUNT; p++) {
        const char *w = "";

        if (!en->idx.size[p])
            continue;
        int verify = !(defer & THAW_DISK_BAD_PART(p));
        ret = map_part(c, hex, p, en->idx.size[p], en->idx.xxh3[p], verify, &en->map[p], &w);
        if (ret == 0 && !verify)
            en->unverified |= THAW_DISK_BAD_PART(p);
        if (ret == THAW_ECORRUPT) {
            *bad |= THAW_DISK_BAD_PART(p);
            if (p == THAW_PART_DFT) { /* costs only itself */
                ret = 0;
                continue;
            }
            snprintf(why, WHY_LEN, "%s %s", part_ext[p], w);
        }
        if (ret)
            goto err;
        en->size[p] = (size_t)en->idx.size[p];
    }
    *out = en;
    return 0;

err:
    thaw_disk_entry_release(en);
    return ret;
}

/* Drops the bad .dft of the entry en was read from (invariant 5): unlink it,
 * then rewrite the .idx without it, mtime = now. Only if the entry is still
 * generation gen and unclaimed; otherwise a racing store owns the files. */
static void drop_dft(struct thaw_disk_cache *c, const uint8_t *key, const char *hex, const struct thaw_disk_entry *en,
                     uint64_t gen, int64_t now)
{
    const struct thaw_vfs *v = c->vfs;
    char path[PATH_MAX], tmp[PATH_MAX];
    struct thaw_disk_idx idx = en->idx;
    uint8_t *rec = NULL;
    size_t rec_len;
    struct ent *e;
    int r;

    pthread_mutex_lock(&c->mu);
    e = claim_try(c, key, gen);
    pthread_mutex_unlock(&c->mu);
    if (!e)
        return;
    entry_path(c, path, hex, part_ext[THAW_PART_DFT], 0);
    r = v->unlink(v, path);
    if (r && r != -ENOENT)
        goto out;
    idx.size[THAW_PART_DFT] = 0;
    idx.xxh3[THAW_PART_DFT] = 0;
    r = thaw_disk_idx_encode(&idx, &rec, &rec_len);
    if (r)
        goto out;
    entry_path(c, tmp, hex, ".idx", 1);
    entry_path(c, path, hex, ".idx", 0);
    r = write_file(c, tmp, rec, rec_len, now, 1);
    if (r == 0)
        r = v->rename(v, tmp, path);
    if (r)
        (void)v->unlink(v, tmp); /* the old .idx stays: the next lookup retries */
out:
    pthread_mutex_lock(&c->mu);
    e->bytes -= e->part_size[THAW_PART_DFT];
    e->part_size[THAW_PART_DFT] = 0;
    claim_end(c, e, 1);
    c->st.dft_dropped++;
    pthread_mutex_unlock(&c->mu);
    logf_(c, THAW_LOG_WARN, "disk cache: entry %.16s: .dft corrupt; dropped it, kept the entry%s%s", hex, r ? ": " : "",
          r ? thaw_strerror(r) : "");
    free(rec);
}

/* Removes what a lookup or verify found corrupt, if it is still what it
 * read (gen) and unclaimed. 1 removed, 0 not (a race: just a miss). */
static int remove_corrupt(struct thaw_disk_cache *c, const uint8_t *key, const char *hex, uint64_t gen, const char *why)
{
    struct ent *e;
    int r;

    pthread_mutex_lock(&c->mu);
    e = claim_try(c, key, gen);
    pthread_mutex_unlock(&c->mu);
    if (!e)
        return 0;
    r = remove_files(c, hex);
    pthread_mutex_lock(&c->mu);
    claim_end(c, e, 0);
    if (!r)
        c->st.corrupt_removed++;
    pthread_mutex_unlock(&c->mu);
    if (r)
        logf_(c, THAW_LOG_ERROR, "disk cache: entry %.16s is corrupt (%s); cannot remove it: %s", hex, why,
              thaw_strerror(r));
    else
        logf_(c, THAW_LOG_WARN, "disk cache: entry %.16s is corrupt (%s); removed", hex, why);
    return 1;
}

/* Forgets key if it is still generation gen: its .idx was removed by
 * another process. */
static void forget(struct thaw_disk_cache *c, const uint8_t *key, uint64_t gen)
{
    struct ent *e;

    pthread_mutex_lock(&c->mu);
    e = claim_try(c, key, gen);
    if (e)
        claim_end(c, e, 0);
    pthread_mutex_unlock(&c->mu);
}

int thaw_disk_cache_lookup(struct thaw_disk_cache *c, const uint8_t key[THAW_KEY_BYTES], struct thaw_disk_entry **out)
{
    return thaw_disk_cache_lookup_ex(c, key, 0, out);
}

int thaw_disk_entry_verify(struct thaw_disk_cache *c, struct thaw_disk_entry *en)
{
    char hex[HEX_LEN + 1], why[WHY_LEN];

    if (!c || !en)
        return THAW_EINVAL;
    c = c->store;
    for (int p = 0; p < THAW_PART_COUNT; p++) {
        if (!(en->unverified & THAW_DISK_BAD_PART(p)))
            continue;
        if (XXH3_64bits(en->map[p], en->size[p]) != en->idx.xxh3[p]) {
            thaw_hex(en->key, THAW_KEY_BYTES, hex);
            snprintf(why, sizeof why, "%s checksum mismatch", part_ext[p]);
            if (!(c->flags & THAW_DISK_CACHE_READONLY))
                (void)remove_corrupt(c, en->key, hex, en->gen, why);
            pthread_mutex_lock(&c->mu);
            c->st.hits--; /* it was counted as one at lookup */
            c->st.misses++;
            pthread_mutex_unlock(&c->mu);
            return THAW_ECORRUPT;
        }
        en->unverified &= ~THAW_DISK_BAD_PART(p);
    }
    return 0;
}

int thaw_disk_cache_lookup_ex(struct thaw_disk_cache *c, const uint8_t key[THAW_KEY_BYTES], unsigned flags,
                              struct thaw_disk_entry **out)
{
    int modify;
    char hex[HEX_LEN + 1], path[PATH_MAX];
    struct thaw_disk_entry *en = NULL;
    char why[WHY_LEN];
    unsigned bad;
    uint64_t gen;
    int64_t now;
    struct ent *e;
    const uint8_t *fp;
    int ret;

    if (!c || !key || !out)
        return THAW_EINVAL;
    fp = c->fingerprint;
    c = c->store;
    modify = !(c->flags & THAW_DISK_CACHE_READONLY);
    thaw_hex(key, THAW_KEY_BYTES, hex);
    pthread_mutex_lock(&c->mu);
    c->st.lookups++;
    e = index_find(c, key);
    if (!e || !e->live || e->busy || memcmp(e->fingerprint, fp, THAW_DISK_FINGERPRINT_SIZE) != 0) {
        c->st.misses++;
        pthread_mutex_unlock(&c->mu);
        return THAW_ENOTFOUND;
    }
    gen = e->gen;
    pthread_mutex_unlock(&c->mu);

    ret = entry_load(c, key, hex, fp, (flags & THAW_DISK_LOOKUP_DEFER_KV) ? THAW_DISK_BAD_PART(THAW_PART_KV) : 0, &en,
                     &bad, why);
    now = now_s(c);
    if (ret == 0 && (bad & THAW_DISK_BAD_PART(THAW_PART_DFT)) && modify)
        drop_dft(c, key, hex, en, gen, now); /* also sets the mtime */
    else if (ret == 0 && modify) {
        struct timespec ts[2] = {{.tv_nsec = UTIME_OMIT}, stamp(c, now)};
        int touched = 0;

        pthread_mutex_lock(&c->mu);
        e = index_find(c, key);
        if (e && e->live && !e->busy && e->gen == gen) {
            e->last_used = now;
            /* A block's last use only times its grace once nothing names
             * it: memory is enough (a restart costs it one grace), and a
             * restore of a manifest reads hundreds of blocks */
            if (e->listed == LIST_LRU) {
                list_unlink(&c->lru_head, &c->lru_tail, e);
                lru_append(c, e);
                touched = 1;
            }
        }
        pthread_mutex_unlock(&c->mu);
        if (touched) {
            entry_path(c, path, hex, ".idx", 0);
            (void)c->vfs->utimens(c->vfs, path, ts); /* best effort */
        }
    } else if (ret == THAW_ENOTFOUND) {
        forget(c, key, gen);
    } else if (ret == THAW_ECORRUPT) {
        if (!modify || !remove_corrupt(c, key, hex, gen, why))
            ret = THAW_ENOTFOUND; /* raced a store or removal */
    } else if (ret == THAW_EMISMATCH) {
        ret = THAW_ENOTFOUND; /* the .idx changed under us (another process) */
    }

    pthread_mutex_lock(&c->mu);
    if (ret == 0)
        c->st.hits++;
    else
        c->st.misses++;
    pthread_mutex_unlock(&c->mu);
    if (ret == 0) {
        memcpy(en->key, key, THAW_KEY_BYTES);
        en->gen = gen;
        *out = en;
    }
    return ret;
}

struct thaw_workers *thaw_disk_cache_workers(const struct thaw_disk_cache *c)
{
    return c->workers;
}

void thaw_disk_kv_willneed(const struct thaw_disk_kv_file *f)
{
    if (f->fd >= 0)
        (void)posix_fadvise(f->fd, 0, 0, POSIX_FADV_WILLNEED); /* advice only */
}

int thaw_disk_cache_open_kv(struct thaw_disk_cache *c, const uint8_t key[THAW_KEY_BYTES], struct thaw_disk_kv_file *f)
{
    char hex[HEX_LEN + 1];
    struct ent *e;
    const uint8_t *fp;
    int fd, ret;

    if (!c || !key || !f)
        return THAW_EINVAL;
    fp = c->fingerprint;
    c = c->store;
    pthread_mutex_lock(&c->mu);
    c->st.lookups++;
    e = index_find(c, key);
    if (!e || !e->live || e->busy || !e->part_size[THAW_PART_KV] ||
        memcmp(e->fingerprint, fp, THAW_DISK_FINGERPRINT_SIZE) != 0) {
        c->st.misses++;
        pthread_mutex_unlock(&c->mu);
        return THAW_ENOTFOUND;
    }
    f->size = e->part_size[THAW_PART_KV];
    f->xxh3 = e->kv_xxh3;
    f->gen = e->gen;
    e->last_used = now_s(c); /* times a block's grace once nothing names it */
    pthread_mutex_unlock(&c->mu);

    thaw_hex(key, THAW_KEY_BYTES, hex);
    ret = open_part(c, hex, THAW_PART_KV, f->size, &fd);
    if (ret == THAW_ECORRUPT && !(c->flags & THAW_DISK_CACHE_READONLY))
        (void)remove_corrupt(c, key, hex, f->gen, ".kv truncated or wrong size");
    if (ret) {
        /* missing: removed meanwhile (another process) */
        ret = ret == THAW_ECORRUPT ? THAW_ENOTFOUND : ret;
        goto miss;
    }
    memcpy(f->key, key, THAW_KEY_BYTES);
    f->fd = fd;
    pthread_mutex_lock(&c->mu);
    c->st.hits++;
    pthread_mutex_unlock(&c->mu);
    return 0;

miss:
    pthread_mutex_lock(&c->mu);
    c->st.misses++;
    pthread_mutex_unlock(&c->mu);
    return ret;
}

int thaw_disk_cache_read_kv(struct thaw_disk_cache *c, const uint8_t key[THAW_KEY_BYTES], void *buf, size_t cap,
                            size_t *n)
{
    const struct thaw_vfs *v;
    char hex[HEX_LEN + 1];
    uint64_t size, xxh3;
    struct ent *e;
    size_t want, got = 0;
    int fd, ret;

    if (!c || !key || !n || (cap && !buf))
        return THAW_EINVAL;
    c = c->store;
    *n = 0;
    v = c->vfs;
    pthread_mutex_lock(&c->mu);
    e = index_find(c, key);
    if (!e || !e->live || e->busy || !e->part_size[THAW_PART_KV]) {
        pthread_mutex_unlock(&c->mu);
        return THAW_ENOTFOUND;
    }
    size = e->part_size[THAW_PART_KV];
    xxh3 = e->kv_xxh3;
    pthread_mutex_unlock(&c->mu);

    thaw_hex(key, THAW_KEY_BYTES, hex);
    if ((ret = open_part(c, hex, THAW_PART_KV, size, &fd)) != 0)
        return ret; /* THAW_ENOTFOUND: removed meanwhile; THAW_ECORRUPT: of the wrong size */
    want = size < cap ? (size_t)size : cap;
    while (got < want) {
        ssize_t r = v->pread(v, fd, (uint8_t *)buf + got, want - got, (off_t)got);

        if (r < 0) {
            ret = (int)r;
            goto out_close;
        }
        if (r == 0) { /* shrank under us */
            ret = THAW_ECORRUPT;
            goto out_close;
        }
        got += (size_t)r;
    }
    if (want == size && XXH3_64bits(buf, want) != xxh3)
        ret = THAW_ECORRUPT;
    else
        *n = got;
out_close:
    (void)v->close(v, fd);
    return ret;
}

ssize_t thaw_disk_kv_preadv(struct thaw_disk_cache *c, const struct thaw_disk_kv_file *f, const struct iovec *iov,
                            int n_iov, uint64_t off)
{
    c = c->store;
    return c->vfs->preadv(c->vfs, f->fd, iov, n_iov, (off_t)off);
}

void thaw_disk_kv_close(struct thaw_disk_cache *c, struct thaw_disk_kv_file *f, int bad)
{
    char hex[HEX_LEN + 1];

    if (!c || !f || f->fd < 0)
        return;
    c = c->store;
    (void)c->vfs->close(c->vfs, f->fd);
    f->fd = -1;
    if (!bad)
        return;
    pthread_mutex_lock(&c->mu);
    c->st.hits--; /* counted as one at open */
    c->st.misses++;
    pthread_mutex_unlock(&c->mu);
    thaw_hex(f->key, THAW_KEY_BYTES, hex);
    if (!(c->flags & THAW_DISK_CACHE_READONLY))
        (void)remove_corrupt(c, f->key, hex, f->gen, ".kv checksum mismatch or short read");
}

void thaw_disk_cache_hold(struct thaw_disk_cache *c, const uint8_t *keys, uint32_t n)
{
    if (!c || !keys || !n)
        return;
    c = c->store;
    pthread_mutex_lock(&c->mu);
    refs_add(c, keys, n);
    pthread_mutex_unlock(&c->mu);
}

void thaw_disk_cache_unhold(struct thaw_disk_cache *c, const uint8_t *keys, uint32_t n)
{
    if (!c || !keys || !n)
        return;
    c = c->store;
    pthread_mutex_lock(&c->mu);
    refs_drop(c, keys, n);
    pthread_mutex_unlock(&c->mu);
}

void thaw_disk_cache_retain(struct thaw_disk_cache *c, const uint8_t *keys, uint32_t n, int64_t until)
{
    if (!c || !keys || !n)
        return;
    c = c->store;
    pthread_mutex_lock(&c->mu);
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *key = keys + (size_t)i * THAW_KEY_BYTES;
        struct thaw_keymap_node *hn = thaw_keymap_find(&c->retains, key);
        struct retain *r = hn ? THAW_KEYMAP_OF(hn, struct retain, hn) : NULL;

        if (!r) {
            if (!(r = calloc(1, sizeof *r)))
                continue; /* unkept: LRU as ever */
            memcpy(r->key, key, THAW_KEY_BYTES);
            thaw_keymap_insert(&c->retains, &r->hn, r->key);
            r->next = c->ret_head;
            c->ret_head = r;
            refs_add(c, r->key, 1);
        }
        if (until > r->until)
            r->until = until;
    }
    pthread_mutex_unlock(&c->mu);
}

/* Ends the hint at *pp: off the list and the map, its block one name fewer. */
static void retain_unlink(struct thaw_disk_cache *c, struct retain **pp)
{
    struct retain *r = *pp;

    *pp = r->next;
    thaw_keymap_remove(&c->retains, &r->hn);
    refs_drop(c, r->key, 1);
    free(r);
}

/* Ends the retention hints whose deadline is at or before `before` (all of
 * them: INT64_MAX); with `one`, only the one of the earliest deadline.
 * Their blocks lose that name (orphans if it was the last). Returns how
 * many ended. With c->mu held. */
static unsigned retains_end(struct thaw_disk_cache *c, int64_t before, int one)
{
    struct retain **pp, **victim = NULL;
    unsigned n = 0;

    if (one) {
        for (pp = &c->ret_head; *pp; pp = &(*pp)->next)
            if (!victim || (*pp)->until < (*victim)->until)
                victim = pp;
        if (!victim)
            return 0;
        retain_unlink(c, victim);
        return 1;
    }
    for (pp = &c->ret_head; *pp;) {
        if ((*pp)->until > before) {
            pp = &(*pp)->next;
            continue;
        }
        retain_unlink(c, pp);
        n++;
    }
    return n;
}

/* contains(), with c->mu held. */
static int contains_locked(struct thaw_disk_cache *c, const uint8_t *fp, const uint8_t key[THAW_KEY_BYTES])
{
    struct ent *e = index_find(c, key);
    int found = e && e->live && !e->busy && !memcmp(e->fingerprint, fp, THAW_DISK_FINGERPRINT_SIZE);

    if (found && e->is_block)
        e->last_used = now_s(c); /* a store is about to name it: see the header */
    return found;
}

/* queued(), with c->mu held. */
static int queued_locked(const struct thaw_disk_cache *c, const uint8_t key[THAW_KEY_BYTES])
{
    for (const struct job *j = c->q_group; j; j = j->next)
        if (!j->ended && memcmp(j->key, key, THAW_KEY_BYTES) == 0)
            return 1;
    for (const struct job *j = c->q_head; j; j = j->next)
        if (memcmp(j->key, key, THAW_KEY_BYTES) == 0)
            return 1;
    return 0;
}

int thaw_disk_cache_contains(struct thaw_disk_cache *c, const uint8_t key[THAW_KEY_BYTES])
{
    const uint8_t *fp;
    int found;

    if (!c || !key)
        return 0;
    fp = c->fingerprint;
    c = c->store;
    pthread_mutex_lock(&c->mu);
    found = contains_locked(c, fp, key);
    pthread_mutex_unlock(&c->mu);
    return found;
}

int thaw_disk_cache_queued(struct thaw_disk_cache *c, const uint8_t key[THAW_KEY_BYTES])
{
    int found;

    if (!c || !key)
        return 0;
    c = c->store;
    pthread_mutex_lock(&c->mu);
    found = queued_locked(c, key);
    pthread_mutex_unlock(&c->mu);
    return found;
}

int thaw_disk_cache_has(struct thaw_disk_cache *c, const uint8_t key[THAW_KEY_BYTES])
{
    const uint8_t *fp;
    int found;

    if (!c || !key)
        return 0;
    fp = c->fingerprint;
    c = c->store;
    pthread_mutex_lock(&c->mu);
    found = queued_locked(c, key) || contains_locked(c, fp, key);
    pthread_mutex_unlock(&c->mu);
    return found;
}

int thaw_disk_cache_prefetch(struct thaw_disk_cache *c, const uint8_t key[THAW_KEY_BYTES])
{
    char hex[HEX_LEN + 1], path[PATH_MAX];
    uint64_t size[THAW_PART_COUNT];
    struct ent *e;
    const uint8_t *fp;
    int found, n = 0;

    if (!c || !key)
        return 0;
    fp = c->fingerprint;
    c = c->store;
    pthread_mutex_lock(&c->mu);
    e = index_find(c, key);
    found = e && e->live && !e->busy && !memcmp(e->fingerprint, fp, THAW_DISK_FINGERPRINT_SIZE);
    if (found)
        memcpy(size, e->part_size, sizeof size);
    pthread_mutex_unlock(&c->mu);
    if (!found)
        return 0;
    thaw_hex(key, THAW_KEY_BYTES, hex);
    for (int p = 0; p < THAW_PART_COUNT; p++) {
        if (!size[p])
            continue;
        entry_path(c, path, hex, part_ext[p], 0);
        int fd = c->vfs->open(c->vfs, path, O_RDONLY | O_CLOEXEC, 0);
        if (fd < 0)
            continue; /* removed meanwhile: the lookup will miss too */
        n += posix_fadvise(fd, 0, 0, POSIX_FADV_WILLNEED) == 0;
        c->vfs->close(c->vfs, fd);
    }
    return n;
}

const void *thaw_disk_entry_part(const struct thaw_disk_entry *e, enum thaw_part p, size_t *size)
{
    const void *d = NULL;
    size_t n = 0;

    if (e && (int)p >= 0 && p < THAW_PART_COUNT && e->map[p]) {
        d = e->map[p];
        n = e->size[p];
    }
    if (size)
        *size = n;
    return d;
}

uint32_t thaw_disk_entry_n_tokens(const struct thaw_disk_entry *e)
{
    return e ? e->n_tokens : 0;
}

const void *thaw_disk_entry_meta(const struct thaw_disk_entry *e, size_t *n)
{
    if (n)
        *n = e ? e->idx.n_meta : 0;
    return e ? e->idx.meta : NULL;
}

int thaw_disk_cache_verify(struct thaw_disk_cache *c, const uint8_t key[THAW_KEY_BYTES], int fix, unsigned *bad_parts)
{
    char hex[HEX_LEN + 1];
    struct thaw_disk_entry *en = NULL;
    char why[WHY_LEN];
    unsigned bad = 0;
    uint64_t gen = 0;
    struct ent *e;
    int ret;

    if (bad_parts)
        *bad_parts = 0;
    if (!c || !key)
        return THAW_EINVAL;
    c = c->store;
    if (c->flags & THAW_DISK_CACHE_READONLY)
        fix = 0;
    thaw_hex(key, THAW_KEY_BYTES, hex);
    pthread_mutex_lock(&c->mu);
    e = index_find(c, key);
    if (e) {
        gen = e->gen;
        if (e->busy)
            e = NULL;
    }
    pthread_mutex_unlock(&c->mu);

    ret = entry_load(c, key, hex, NULL, 0, &en, &bad, why);
    if (ret == 0 && (bad & THAW_DISK_BAD_PART(THAW_PART_DFT)) && fix && e) {
        struct stat st;
        char path[PATH_MAX];
        int64_t keep = now_s(c);

        /* Keep the last use as it was: verifying is not using. */
        entry_path(c, path, hex, ".idx", 0);
        if (c->vfs->stat(c->vfs, path, &st) == 0)
            keep = (int64_t)st.st_mtim.tv_sec;
        drop_dft(c, key, hex, en, gen, keep);
    } else if (ret == THAW_ECORRUPT && fix) {
        if (e)
            (void)remove_corrupt(c, key, hex, gen, why);
        else if (remove_files(c, hex) == 0)
            logf_(c, THAW_LOG_WARN, "disk cache: entry %.16s is corrupt (%s); removed", hex, why);
    }
    thaw_disk_entry_release(en);
    if (bad_parts)
        *bad_parts = bad;
    return ret;
}

/* ---- evict / remove ----------------------------------------------------- */

/* Claims live entry e (off its list and the totals) as a victim of `why`
 * and chains it at **tail. A root's refs are dropped at once, so the blocks
 * it alone named join the orphan list and the same pass collects them —
 * after it on the chain, hence unlinked after its .idx (invariant 8).
 * With c->mu held. */
static void take_victim(struct thaw_disk_cache *c, struct ent *e, int why, struct ent ***tail)
{
    e->busy = 1;
    ent_uncommit(c, e);
    ent_set_refs(c, e, NULL, 0);
    e->evict_why = why;
    **tail = e;
    *tail = &e->next;
}

/* Takes the least recently used live root for eviction by `why`. Returns
 * it, or NULL when there is none. With c->mu held. */
static struct ent *take_lru(struct thaw_disk_cache *c, int why, struct ent ***tail)
{
    struct ent *e = c->lru_head;

    if (e)
        take_victim(c, e, why, tail);
    return e;
}

/* How long an unnamed block is kept after its last use. Never longer than
 * the TTL: a conversation evicted as expired must not come back through a
 * prefix lookup of its blocks (DESIGN §2: an expired conversation is never
 * resurrected). Under pressure (over max_bytes, a full disk) the owner of
 * the directory keeps none: it sees every hold and every queued manifest,
 * so a block nothing names is no store's, and keeping the blocks of a
 * conversation just evicted for their grace would evict newer
 * conversations in their place (found by test_lru_budget_keeps_the_most_
 * recent: a time window loses whenever stores come faster than it). SHARED
 * cannot see a server's holds and queue: it keeps the whole grace. */
static int64_t orphan_grace(const struct thaw_disk_cache *c, int pressure)
{
    int64_t g = c->block_grace_s;

    if (c->ttl_s > 0 && c->ttl_s < g)
        g = c->ttl_s;
    if (pressure && !(c->flags & THAW_DISK_CACHE_SHARED))
        g = 0;
    return g;
}

/* Takes every unreferenced (unnamed, unheld) block unused for `grace`
 * seconds (at `now`) for collection. Returns the bytes taken. With c->mu
 * held. */
static uint64_t take_orphans(struct thaw_disk_cache *c, int64_t now, int64_t grace, struct ent ***tail)
{
    struct ent *e, *next;
    uint64_t freed = 0;

    for (e = c->orph_head; e; e = next) {
        next = e->next;
        if (now - e->last_used < grace)
            continue;
        freed += e->bytes;
        take_victim(c, e, EVICT_GC, tail);
    }
    return freed;
}

/* Removes the files of every claimed victim on the chain (.idx first,
 * invariant 3), counts each by its evict_why, and ends the claims: they
 * leave the index even if an unlink failed (logged). now is the clock the
 * TTL was judged by. Returns how many. Without c->mu. */
static int evict_victims(struct thaw_disk_cache *c, struct ent *victims, int64_t now)
{
    char hex[HEX_LEN + 1], bytes[24];
    struct ent *e, *next;
    uint64_t gc_n = 0, gc_bytes = 0;
    int n = 0;

    for (e = victims; e; e = next) {
        int why = e->evict_why;
        int r;

        next = e->next;
        thaw_hex(e->key, THAW_KEY_BYTES, hex);
        thaw_fmt_bytes(e->bytes, bytes);
        r = remove_files(c, hex);
        if (r)
            logf_(c, THAW_LOG_ERROR, "disk cache: %s %.16s: %s", why == EVICT_GC ? "collecting" : "evicting", hex,
                  thaw_strerror(r));
        else if (why == EVICT_TTL)
            logf_(c, THAW_LOG_INFO, "disk cache: evicted %.16s (%s): unused for %lld s > ttl %lld s", hex, bytes,
                  (long long)(now - e->last_used), (long long)c->ttl_s);
        else if (why == EVICT_LRU)
            logf_(c, THAW_LOG_INFO, "disk cache: evicted %.16s (%s): least recently used, over %llu MiB", hex, bytes,
                  (unsigned long long)(c->max_bytes >> 20));
        /* EVICT_ENOSPC: make_room logs one line for the lot; EVICT_GC: one below */
        pthread_mutex_lock(&c->mu);
        if (why == EVICT_TTL) {
            c->st.evictions_ttl++;
        } else if (why == EVICT_LRU) {
            c->st.evictions_lru++;
        } else if (why == EVICT_ENOSPC) {
            c->st.evictions_enospc++;
        } else {
            c->st.blocks_collected++;
            c->st.block_bytes_collected += e->bytes;
            gc_n++;
            gc_bytes += e->bytes;
        }
        claim_end(c, e, 0);
        pthread_mutex_unlock(&c->mu);
        n++;
    }
    if (gc_n) {
        thaw_fmt_bytes(gc_bytes, bytes);
        logf_(c, THAW_LOG_INFO, "disk cache: collected %llu block%s (%s) no conversation names any more",
              (unsigned long long)gc_n, gc_n == 1 ? "" : "s", bytes);
    }
    return n;
}

int thaw_disk_cache_evict(struct thaw_disk_cache *c)
{
    struct ent *victims = NULL, **tail = &victims, *e;
    int64_t now;

    if (!(c = c ? c->store : NULL) || (c->flags & THAW_DISK_CACHE_READONLY))
        return 0;
    now = now_s(c);
    pthread_mutex_lock(&c->mu);
    /* TTL: the list is in order of last use, so stop at the first fresh one.
     * Claimed entries are off the list already. Blocks have no TTL of their
     * own: they go with the last root that names them. */
    while (c->ttl_s > 0 && (e = c->lru_head) && now - e->last_used > c->ttl_s)
        (void)take_lru(c, EVICT_TTL, &tail);
    /* Over budget: what nothing names or holds first, then roots by LRU,
     * each followed by what it alone named, until within budget. Then
     * whatever nothing names past its grace — none after a pass over
     * budget, so a conversation evicted for room takes its own blocks
     * along (the chain keeps every root before its blocks). */
    (void)retains_end(c, now, 0); /* hints past their deadline */
    int pressed = 0;
    while (c->max_bytes > 0 && c->bytes > c->max_bytes) {
        pressed = 1;
        if (take_orphans(c, now, orphan_grace(c, 1), &tail) > 0)
            continue;
        if (take_lru(c, EVICT_LRU, &tail))
            continue;
        /* nothing else left: the blocks kept by hints, the earliest deadline first */
        if (!retains_end(c, now, 1))
            break;
    }
    (void)take_orphans(c, now, orphan_grace(c, pressed), &tail);
    *tail = NULL;
    pthread_mutex_unlock(&c->mu);
    return evict_victims(c, victims, now);
}

/* The store of <hex> (need bytes) failed with err (-ENOSPC/-EDQUOT) in
 * round `round`: collects unreferenced blocks past their grace, then evicts
 * least recently used roots (with the blocks they alone named) until at
 * least need bytes are freed, and logs one line. The key being stored is
 * claimed, so never among them. Returns how many entries were removed (0:
 * none left). */
static int make_room(struct thaw_disk_cache *c, const char *hex, uint64_t need, int err, int round)
{
    struct ent *victims = NULL, **tail = &victims, *e;
    uint64_t freed = 0;
    int64_t now = now_s(c);
    char need_s[24], freed_s[24];
    int n;

    pthread_mutex_lock(&c->mu);
    freed += take_orphans(c, now, orphan_grace(c, 1), &tail);
    while (freed < need && (e = take_lru(c, EVICT_ENOSPC, &tail))) {
        freed += e->bytes;
        freed += take_orphans(c, now, orphan_grace(c, 1), &tail);
    }
    while (freed < need && retains_end(c, now, 1)) /* then what hints keep */
        freed += take_orphans(c, now, orphan_grace(c, 1), &tail);
    *tail = NULL;
    pthread_mutex_unlock(&c->mu);
    n = evict_victims(c, victims, now);
    thaw_fmt_bytes(need, need_s);
    thaw_fmt_bytes(freed, freed_s);
    if (n)
        logf_(c, THAW_LOG_WARN,
              "disk cache: %s storing %.16s (%s): evicted %d least recently used entr%s (%s); "
              "retrying (%d/%d)",
              thaw_strerror(err), hex, need_s, n, n == 1 ? "y" : "ies", freed_s, round, THAW_DISK_ENOSPC_ROUNDS);
    else
        logf_(c, THAW_LOG_WARN, "disk cache: %s storing %.16s (%s): no entry left to evict", thaw_strerror(err), hex,
              need_s);
    return n;
}

int thaw_disk_cache_remove(struct thaw_disk_cache *c, const uint8_t key[THAW_KEY_BYTES])
{
    char hex[HEX_LEN + 1];
    struct ent *e;
    int r;

    if (!(c = c ? c->store : NULL) || !key || (c->flags & THAW_DISK_CACHE_READONLY))
        return THAW_EINVAL;
    thaw_hex(key, THAW_KEY_BYTES, hex);
    pthread_mutex_lock(&c->mu);
    e = claim_wait(c, key, 0);
    pthread_mutex_unlock(&c->mu);
    r = remove_files(c, hex);
    if (e) {
        pthread_mutex_lock(&c->mu);
        claim_end(c, e, r != 0); /* the .idx stayed: so does the entry */
        pthread_mutex_unlock(&c->mu);
    }
    if (r)
        return r;
    logf_(c, THAW_LOG_INFO, "disk cache: removed %.16s", hex);
    return e ? 0 : THAW_ENOTFOUND;
}

/* Most recently used first; ties by key, so a listing is stable. */
static int info_recent_cmp(const void *a, const void *b)
{
    const struct thaw_disk_entry_info *x = a, *y = b;

    if (x->last_used != y->last_used)
        return x->last_used > y->last_used ? -1 : 1;
    return memcmp(x->key, y->key, THAW_KEY_BYTES);
}

int thaw_disk_cache_foreach(struct thaw_disk_cache *c, int (*cb)(void *ud, const struct thaw_disk_entry_info *info),
                            void *ud)
{
    struct thaw_disk_entry_info *v;
    size_t n = 0;
    const uint8_t *fp;
    int ret = 0;

    if (!c || !cb)
        return THAW_EINVAL;
    fp = c->fingerprint;
    c = c->store;
    pthread_mutex_lock(&c->mu);
    v = calloc(c->n_live ? c->n_live : 1, sizeof *v);
    if (!v) {
        pthread_mutex_unlock(&c->mu);
        return THAW_ENOMEM;
    }
    /* Roots are on the LRU list, blocks only in the hash: all from the hash,
     * then in order of last use. */
    THAW_KEYMAP_EACH(&c->index, b, hn, hnx)
    {
        struct ent *e = THAW_KEYMAP_OF(hn, struct ent, hn);

        if (!e->live)
            continue;
        struct thaw_disk_entry_info *i = &v[n++];

        memcpy(i->key, e->key, THAW_KEY_BYTES);
        memcpy(i->fingerprint, e->fingerprint, THAW_DISK_FINGERPRINT_SIZE);
        i->same_model = !memcmp(e->fingerprint, fp, THAW_DISK_FINGERPRINT_SIZE);
        i->n_tokens = e->n_tokens;
        i->bytes = e->bytes;
        memcpy(i->part_size, e->part_size, sizeof i->part_size);
        i->n_meta = e->n_meta;
        i->created = e->created;
        i->last_used = e->last_used;
        i->is_block = e->is_block;
        i->n_refs = e->n_refs;
        i->referrers = e->is_block ? refc_get(c, e->key) : 0;
    }
    pthread_mutex_unlock(&c->mu);
    if (n)
        qsort(v, n, sizeof *v, info_recent_cmp);
    for (size_t k = 0; k < n && !ret; k++)
        ret = cb(ud, &v[k]);
    free(v);
    return ret;
}

void thaw_disk_cache_get_stats(struct thaw_disk_cache *c, struct thaw_disk_cache_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!c)
        return;
    c = c->store;
    pthread_mutex_lock(&c->mu);
    *out = c->st;
    out->queue_bytes = c->q_bytes;
    out->queue_len = c->q_len + (uint64_t)c->q_active;
    out->fsyncs = atomic_load_explicit(&c->n_fsyncs, memory_order_relaxed);
    out->entries = c->n_live;
    out->bytes = c->bytes;
    out->blocks = c->n_blocks;
    out->block_bytes = c->block_bytes;
    out->blocks_unreferenced = c->n_orphans;
    out->oldest_used = c->lru_head ? c->lru_head->last_used : 0;
    for (struct ent *e = c->lru_head; e; e = e->next)
        if (!out->oldest_created || e->created < out->oldest_created)
            out->oldest_created = e->created;
    pthread_mutex_unlock(&c->mu);
}
