/* cache_disk.h — the on-disk KV store: opaque blobs under 32-byte keys.
 *
 * The engine serialises a conversation's context state and hands it here
 * under a key it computed (DESIGN §2); the next turn asks for the same key
 * and gets the bytes back, verified, from a read-only mapping. This module
 * knows nothing of llama.cpp: an entry is up to three byte blobs (parts), a
 * token count and a small opaque "meta" blob.
 *
 * Files, in the cache directory (0700), each 0600, named by the key in
 * lowercase hex (64 characters):
 *   <key>.kv    part THAW_PART_KV: target context state (mandatory)
 *   <key>.ckpt  part THAW_PART_CKPT: context checkpoints (optional)
 *   <key>.dft   part THAW_PART_DFT: draft context state (optional)
 *   <key>.idx   the index record, the commit marker (format: cache_disk.c)
 *   lock        flock()ed by the process that owns the directory
 * The crash invariants and their order of operations are at the top of
 * cache_disk.c.
 *
 * Roots and blocks (DESIGN §9). The caller's classify() callback says, at
 * store time and from the .kv bytes, what an entry is: a BLOCK (content
 * addressed, shared, named by other entries) or a ROOT (a whole state, or a
 * manifest naming blocks by key); thaw's formats are told apart in
 * entry_kind.h. The answer is written into the .idx, so this module never
 * parses a state and reopening needs no callback.
 *
 * Policies (the why is in cache_disk.c):
 *   - TTL and LRU choose among roots only. A block lives while a committed
 *     root, or a store of one still queued, names it; once none does and it
 *     has been unused for block_grace_s, it is collected. --kv-cache-max
 *     (max_bytes) counts every file, blocks included.
 *   - TTL counts from an entry's LAST USE (store or lookup hit), not its
 *     creation: a conversation in use is never expired.
 *   - Last use is the .idx file's mtime: one utimensat() per hit, no rewrite,
 *     survives restarts (not fsynced: a lost update only makes an entry look
 *     older).
 *   - An entry written under another model fingerprint is a miss, but it is
 *     kept (counted in bytes, subject to TTL/LRU): the same directory may be
 *     used by that model again after a restart.
 *   - One process owns a directory (flock on `lock`); a second thaw server
 *     on the same directory fails to open with THAW_ELOCKED. `thaw cache`
 *     opens it THAW_DISK_CACHE_SHARED alongside a running server.
 *   - A directory with group/other permission bits is chmod()ed to 0700 (and
 *     a warning logged); if that fails, open fails.
 *
 * Threads: every function may be called from any thread, except that
 * thaw_disk_cache_close() must not race any other call on the same cache.
 * No lock is held across disk I/O: lookups (engine thread, prefetching HTTP
 * threads), evictions and the writer thread's stores proceed in parallel; a
 * lookup racing a store or removal of the same key is a miss, never a
 * half-written entry.
 */
#ifndef THAW_CACHE_DISK_H
#define THAW_CACHE_DISK_H

#include "base/blob.h" /* the parts of an entry */
#include "base/fmt.h"       /* thaw_hex and the like, which its callers use with it */
#include "base/key.h"
#include "base/vfs.h"
#include "cache/cache_idx.h" /* the .idx record; sizes of fingerprints, meta, refs */

#include <stddef.h>
#include <stdint.h>

struct thaw_workers; /* base/workers.h */


/* Open flags. */
#define THAW_DISK_CACHE_NO_WRITER 0x1u /* no writer thread: submit() fails */
#define THAW_DISK_CACHE_SHARED                                                                                         \
    0x2u /* a second process on a directory                                                                            \
          * that a server may be using: no lock,                                                                       \
          * no sweep of *.tmp and orphans (they                                                                        \
          * may be the server's store in                                                                               \
          * progress), no writer thread */
#define THAW_DISK_CACHE_READONLY                                                                                       \
    0x4u /* implies SHARED; additionally never                                                                         \
          * creates, chmods, touches or removes                                                                        \
          * anything; store/remove fail with                                                                           \
          * THAW_EINVAL, corrupt entries are                                                                           \
          * reported but left in place */

struct thaw_disk_cache_params {
    const char *dir;                                 /* the cache directory; copied. Missing parents
                                                      * are created 0700 (except READONLY/SHARED) */
    uint64_t max_bytes;                              /* LRU budget over all files of all entries
                                                      * (including other models'); 0 = no limit */
    int64_t ttl_s;                                   /* evict entries unused for more than this many
                                                      * seconds; 0 = no limit */
    uint8_t fingerprint[THAW_DISK_FINGERPRINT_SIZE]; /* model + context
                                                      * identity, written into every .idx; entries
                                                      * with another one are misses */
    uint64_t queue_max_bytes;                        /* bytes of submitted stores the writer may
                                                      * hold (waiting, and the group being written:
                                                      * the sum of their parts and .idx); a submit
                                                      * that would go over is dropped. A store larger
                                                      * than this alone is still taken when the
                                                      * writer holds nothing. 0 = no limit */
    unsigned flags;                                  /* THAW_DISK_CACHE_* above */
    const struct thaw_vfs *vfs;                      /* NULL = thaw_vfs_default(); must outlive
                                                      * the cache */
    /* One readable line per store / eviction / corruption / warning. level
     * is an enum thaw_log_level (log.h): THAW_LOG_ERROR/WARN/INFO.
     * msg has no trailing newline and is valid only during the call. Called
     * from the writer thread too; must not call back into the cache. NULL =
     * silent. */
    void (*log)(void *ud, int level, const char *msg);
    void *log_ud;
    /* Wall clock in Unix seconds (tests fake it for TTL). NULL = time(). */
    int64_t (*now)(void *ud);
    void *now_ud;
    /* What an entry is, from its .kv part (kv, n bytes), called once per
     * store/submit on the caller's thread, never with c->mu held: returns
     * THAW_DISK_KIND_BLOCK or THAW_DISK_KIND_ROOT; for a root that names
     * blocks (a manifest) it sets *refs to n_refs keys of THAW_KEY_BYTES
     * each, pointing into kv (left NULL/0 otherwise). Must be pure. NULL =
     * every entry is a root naming nothing (the behaviour before blocks). */
    int (*classify)(void *ud, const void *kv, size_t n, const uint8_t **refs, uint32_t *n_refs);
    void *classify_ud;
    /* Seconds an unreferenced block is kept after its last use (written, read,
     * or found present by contains()): the time between a store's blocks and
     * its manifest, and the life of a block fetched for a prefix lookup that
     * no manifest names yet. Never longer than ttl_s (when ttl_s > 0): what
     * expired must not come back as a prefix; over max_bytes or on a full
     * disk, none (a store in progress holds its blocks: thaw_disk_cache_hold),
     * except SHARED, which cannot see a server's holds and queue. 0 =
     * collected at the first eviction pass. */
    int64_t block_grace_s;
    /* The background pool (workers.h) that work reading this tier's files
     * beside a request runs on (a restore's block checksums, blocks.c);
     * not the writer's. Borrowed: must outlive the cache. NULL = that work
     * runs on the caller's thread. */
    struct thaw_workers *workers;
};

#define THAW_DISK_KIND_ROOT 0
#define THAW_DISK_KIND_BLOCK 1
#define THAW_DISK_BLOCK_GRACE_DEFAULT 600

/* max_bytes 0, ttl_s 259200 (3 days), fingerprint all zero,
 * queue_max_bytes 1 GiB (THAW_DISK_QUEUE_MAX_BYTES_DEFAULT), flags 0,
 * block_grace_s THAW_DISK_BLOCK_GRACE_DEFAULT (10 minutes), everything else
 * NULL. dir must be set by the caller. */
#define THAW_DISK_QUEUE_MAX_BYTES_DEFAULT ((uint64_t)1 << 30)
struct thaw_disk_cache_params thaw_disk_cache_default_params(void);

struct thaw_disk_cache;
struct thaw_disk_entry;

/* Opens (creating if needed) the directory p->dir: takes the directory lock,
 * sweeps *.tmp files, data files without an .idx and entries whose .idx is
 * unreadable or whose files are missing or of the wrong size (invariant 4),
 * loads every entry's index record into memory (checksums of the data are
 * verified at lookup, not here), and starts the writer thread.
 * Returns 0 and sets *out, to be freed with thaw_disk_cache_close(); or
 *   THAW_EINVAL   p or p->dir missing/empty/too long, ttl_s < 0
 *   THAW_ELOCKED  another process (or another open cache in this one) owns
 *                 the directory
 *   THAW_ENOMEM
 *   -errno        the directory could not be created, chmod()ed to 0700,
 *                 read, or locked; -ENOTDIR if p->dir is not a directory;
 *                 -ENOENT for a missing directory with SHARED/READONLY.
 * On error *out is untouched and nothing is left open. */
int thaw_disk_cache_open(const struct thaw_disk_cache_params *p, struct thaw_disk_cache **out);

/* A handle onto the open cache `store` for another model: one directory,
 * one lock, index, writer and budget shared by every model a process
 * serves (DESIGN §16). Every function takes a handle where it takes a
 * cache, and works on the store, with the handle's fingerprint where the
 * store's own would be used: what the handle stores is written under
 * `fingerprint`, its lookups find only entries of that fingerprint,
 * thaw_disk_cache_workers gives `workers` (borrowed, may be NULL; must
 * outlive the handle), foreach's same_model compares with it. Stats,
 * flush, pause and eviction are the store's, all models together.
 * Close a handle with thaw_disk_cache_close (the store stays open)
 * before its store. A handle of a handle is one of its store. Returns 0
 * (*out set), THAW_EINVAL or THAW_ENOMEM. */
int thaw_disk_cache_handle(struct thaw_disk_cache *store, const uint8_t fingerprint[THAW_DISK_FINGERPRINT_SIZE],
                           struct thaw_workers *workers, struct thaw_disk_cache **out);

/* Writes every store still queued (waits for the writer), stops the writer
 * thread, releases the lock and frees c. Every entry obtained from c must
 * have been released before, and every handle onto it closed. On a handle
 * (thaw_disk_cache_handle): frees the handle only; the store's writer
 * goes on. NULL is a no-op. */
void thaw_disk_cache_close(struct thaw_disk_cache *c);

/* Writes an entry synchronously, replacing any entry under the same key (its
 * .idx goes first, so a crash midway leaves no entry rather than a mix).
 * parts[THAW_PART_KV] must be present; the others may have size 0. The
 * buffers are only read: the caller keeps ownership. meta may be NULL when
 * n_meta is 0. A concurrent store/removal of the same key is waited for.
 * Disk full: when a step fails with -ENOSPC or -EDQUOT, what was written of
 * the key is removed, the least recently used entries of OTHER keys are
 * evicted (.idx first) until at least this entry's size is freed, one line
 * is logged, and the store starts over: at most THAW_DISK_ENOSPC_ROUNDS
 * rounds of evict-and-retry, so 1 + that many attempts. Each entry so
 * evicted counts in evictions_enospc.
 * Returns 0 (entry committed and durable: data, .idx and directory fsynced);
 *   THAW_EINVAL   NULL key/parts, no KV part, meta NULL with n_meta > 0,
 *                 READONLY cache
 *   THAW_ETOOBIG  n_meta > THAW_DISK_META_MAX, more than THAW_DISK_REFS_MAX
 *                 refs, or the entry alone exceeds max_bytes (it would be
 *                 evicted at once)
 *   THAW_ENOMEM
 *   -errno        an I/O call failed (-EIO, ...; -ENOSPC/-EDQUOT once
 *                 nothing is left to evict or the rounds are spent).
 * On any error nothing is committed, no file of the key is left behind, and
 * an entry previously stored under the key is gone too. Counts in
 * stores_ok / store_failures. */
#define THAW_DISK_ENOSPC_ROUNDS 3
int thaw_disk_cache_store(struct thaw_disk_cache *c, const uint8_t key[THAW_KEY_BYTES], uint32_t n_tokens,
                          const struct thaw_part_blob parts[THAW_PART_COUNT], const void *meta, size_t n_meta);

/* Queues a store for the writer thread and returns at once (never blocks on
 * I/O or on the writer). Same arguments and checks as thaw_disk_cache_store.
 * parts[i].data must be blobs (blob.h). Returns 0: the caller's reference
 * to every parts[i].data moves to the cache (dropped after the write,
 * whatever its outcome) and parts[i].data is set to NULL; meta is copied,
 * the caller keeps it. The store's bytes (parts + .idx) count in
 * queue_bytes until the writer is done with it (with the group it is
 * committed in: thaw_disk_cache_pause). The write's own outcome shows only
 * in the stats and the log.
 * Otherwise the store is dropped: the caller keeps its references, it counts
 * in stores_dropped (c NULL aside), and one WARN line says why:
 *   THAW_EBUSY     the writer holds queue_bytes > 0 already and this store's
 *                  bytes would take it past queue_max_bytes
 *   THAW_ESHUTDOWN the cache is closing
 *   THAW_EINVAL    bad arguments (as store), or the cache has no writer
 *                  thread (NO_WRITER, SHARED, READONLY)
 *   THAW_ETOOBIG   as store
 *   THAW_ENOMEM */
int thaw_disk_cache_submit(struct thaw_disk_cache *c, const uint8_t key[THAW_KEY_BYTES], uint32_t n_tokens,
                           struct thaw_part_blob parts[THAW_PART_COUNT], const void *meta, size_t n_meta);

/* As submit, for a block (a manifest goes as submit) written ahead of the
 * manifest that will name it: a turn's prompt blocks while its reply is
 * generated (kvcache.h, thaw_kvcache_store_ahead). A group of only such
 * blocks is written without syncs: nothing names them yet, so nothing
 * needs them durable, and the group that commits the manifest naming them
 * syncs the filesystem (its first syncfs) before that manifest's .idx,
 * which is all the invariants ask (cache_disk.c, "Blocks ahead"). */
int thaw_disk_cache_submit_unsynced(struct thaw_disk_cache *c, const uint8_t key[THAW_KEY_BYTES], uint32_t n_tokens,
                                    struct thaw_part_blob parts[THAW_PART_COUNT]);

/* A store of key the writer still holds (waiting, or in the group being
 * written, until that group is done): the
 * bytes a lookup right after submit() would otherwise miss until the write
 * lands. Takes a reference to each of its present parts' blobs into out[]
 * (absent parts: NULL, 0); the caller drops them with thaw_blob_unref. The
 * newest such store wins. They are the bytes submitted, so there is no
 * checksum to verify; n_tokens is in the .kv itself. Any thread; no I/O.
 * Returns 0, THAW_ENOTFOUND (out[] all NULL: not held by the writer, so a
 * store of key submitted before the call is on disk, or failed) or
 * THAW_EINVAL. */
int thaw_disk_cache_pending(struct thaw_disk_cache *c, const uint8_t key[THAW_KEY_BYTES],
                            struct thaw_part_blob out[THAW_PART_COUNT]);

/* Blocks until every store submitted before the call has been written (or
 * has failed). Ends a pause (below). Returns at once without a writer
 * thread. */
void thaw_disk_cache_flush(struct thaw_disk_cache *c);

/* The writer commits what is queued when it looks as one group (at most 64
 * stores or 256 MiB), sharing the directory fsyncs (cache_disk.c, "Group
 * commit"). paused 1: it finishes the group it is writing but takes no new
 * one, so the stores submitted meanwhile go as one group once paused 0 (or
 * flush(), or close(), which end a pause). Submit, pending and the queue's
 * budget work as ever meanwhile. For tests, which need a group of their
 * choosing. No-op for NULL or without a writer thread. */
void thaw_disk_cache_pause(struct thaw_disk_cache *c, int paused);

/* A store made of several submits (a turn's new blocks, then the manifest
 * naming them) goes as one group, two syncs, rather than as many groups as
 * the writer happens to wake for: between batch_begin() and batch_end()
 * the writer finishes the group it is writing but takes no new one.
 * Nestable and any thread (one engine per model may store at once): the
 * writer waits until every batch has ended, or the cache closes. A batch
 * must not wait for the writer (flush) and should last only the submits'
 * own work (milliseconds). No-op for NULL or without a writer thread. */
void thaw_disk_cache_batch_begin(struct thaw_disk_cache *c);
void thaw_disk_cache_batch_end(struct thaw_disk_cache *c);

/* Looks key up, maps its parts read-only and verifies every checksum.
 * Returns 0 and sets *out: a hit, to be released with
 *   thaw_disk_entry_release(); the entry's last use becomes now (a root's
 *   on disk too, a block's in memory only: it times only its grace).
 *   If only the .dft part was corrupt, it is dropped (file removed, .idx
 *   rewritten without it) and the entry is returned without it.
 * THAW_ENOTFOUND  no such entry, an entry of another fingerprint (kept), or
 *                 a store/removal of this key is in progress
 * THAW_ECORRUPT   the entry failed verification (bad .idx or one of another
 *                 format version, a missing or truncated file, a checksum
 *                 mismatch): it has been removed
 *                 and counted in corrupt_removed. Serve by prefill.
 * THAW_EINVAL     NULL argument
 * THAW_ENOMEM, -errno   the entry could not be read (e.g. -EMFILE); it is
 *                 left in place.
 * Every outcome but THAW_EINVAL counts as one lookup and a hit or a miss.
 * Never crashes on any file content, save a file truncated by another
 * process while mapped (SIGBUS; thaw itself never truncates). */
int thaw_disk_cache_lookup(struct thaw_disk_cache *c, const uint8_t key[THAW_KEY_BYTES], struct thaw_disk_entry **out);

/* Lookup flags. */
#define THAW_DISK_LOOKUP_DEFER_KV                                                                                      \
    0x1u /* map the .kv but leave its checksum to                                                                      \
          * thaw_disk_entry_verify(), so the                                                                           \
          * caller can check it on another                                                                             \
          * thread while it already reads the                                                                          \
          * bytes (the other parts are verified                                                                        \
          * as usual) */

/* thaw_disk_cache_lookup() with flags. With THAW_DISK_LOOKUP_DEFER_KV the
 * returned entry is NOT yet known good: the caller must not let anything
 * derived from its .kv bytes take effect before thaw_disk_entry_verify()
 * returned 0. Same returns as thaw_disk_cache_lookup(). */
int thaw_disk_cache_lookup_ex(struct thaw_disk_cache *c, const uint8_t key[THAW_KEY_BYTES], unsigned flags,
                              struct thaw_disk_entry **out);

/* Checks the checksums a deferred lookup left unchecked. Safe to call from
 * another thread while the entry's bytes are being read; not concurrently
 * with thaw_disk_entry_release(). Returns 0 (the entry is good), or
 * THAW_ECORRUPT: the entry has been removed (invariant 5) and the lookup
 * now counts as a miss; the caller serves by prefill. THAW_EINVAL for NULL. */
int thaw_disk_entry_verify(struct thaw_disk_cache *c, struct thaw_disk_entry *e);

/* 1 if an entry for key with this cache's fingerprint is indexed and not
 * being written or removed, else 0. Memory only: no I/O, no checksum. The
 * last use of a root is unchanged; a block's restarts (in memory only): a
 * store that finds its block present is about to name it in a manifest, so
 * the block must outlive block_grace_s from now even if nothing names it
 * yet. */
int thaw_disk_cache_contains(struct thaw_disk_cache *c, const uint8_t key[THAW_KEY_BYTES]);

/* 1 if a store of key is waiting for the writer or being written (what
 * thaw_disk_cache_pending would find, without taking references), else 0. */
int thaw_disk_cache_queued(struct thaw_disk_cache *c, const uint8_t key[THAW_KEY_BYTES]);

/* 1 if key is queued or contained (both checked under one lock, so a store
 * committing meanwhile is never missed), else 0: whether a store of key
 * would be redundant. Same side effect on a block as contains. */
int thaw_disk_cache_has(struct thaw_disk_cache *c, const uint8_t key[THAW_KEY_BYTES]);

/* A committed entry's .kv opened for a caller that reads it itself (the
 * block store's restore scatters blocks straight into their place): the
 * size and checksum come from the index, and checking the bytes it reads
 * against xxh3 is the caller's job. */
struct thaw_disk_kv_file {
    uint8_t key[THAW_KEY_BYTES];
    int fd;
    uint64_t size, xxh3;
    uint64_t gen; /* which commit of key was opened */
};

/* Opens key's .kv (a committed entry of this fingerprint, no store of it
 * in progress). Counts a lookup and a hit; the last use is now. Returns 0
 * (*f set; close it with thaw_disk_kv_close), THAW_ENOTFOUND (absent, being
 * written, or its file gone or of the wrong size: such an entry is removed)
 * or -errno. */
int thaw_disk_cache_open_kv(struct thaw_disk_cache *c, const uint8_t key[THAW_KEY_BYTES], struct thaw_disk_kv_file *f);
/* Reads the first min(cap, its size) bytes of key's .kv into buf, for a
 * caller that inspects entries rather than restores them (`thaw cache`:
 * a head names an entry's kind, entry_kind.h; a manifest is read whole).
 * An entry of any fingerprint; its last use is unchanged, no lookup is
 * counted and nothing is removed, READONLY or not. A read of the whole
 * part is checked against its checksum; a head cannot be. Returns 0 with
 * *n the bytes read; THAW_ENOTFOUND (no committed entry of key, one being
 * written or removed, or its file gone); THAW_ECORRUPT (the file is not
 * the size its .idx says, or a whole read does not match its checksum);
 * THAW_EINVAL; or -errno. */
int thaw_disk_cache_read_kv(struct thaw_disk_cache *c, const uint8_t key[THAW_KEY_BYTES], void *buf, size_t cap,
                            size_t *n);

/* Asks the kernel to start reading f (POSIX_FADV_WILLNEED) while the
 * caller reads the files before it. */
void thaw_disk_kv_willneed(const struct thaw_disk_kv_file *f);
/* The pool of the params (NULL: none). */
struct thaw_workers *thaw_disk_cache_workers(const struct thaw_disk_cache *c);
/* preadv of f at off: bytes read or -errno (THAW_VFS_PREAD for faults). */
ssize_t thaw_disk_kv_preadv(struct thaw_disk_cache *c, const struct thaw_disk_kv_file *f, const struct iovec *iov,
                            int n_iov, uint64_t off);
/* Closes f. bad: what was read did not match f->xxh3 or was short: the hit
 * becomes a miss and the entry is removed if it is still the commit that
 * was opened (invariant 2). */
void thaw_disk_kv_close(struct thaw_disk_cache *c, struct thaw_disk_kv_file *f, int bad);

/* Holds the n block keys at keys (n x THAW_KEY_BYTES) as if a root named
 * them: none is collected until thaw_disk_cache_unhold() of the same keys.
 * A store takes it before it looks for its blocks (contains()) and submits
 * the missing ones, and drops it once its manifest is submitted (the queued
 * manifest names them from then on): no grace or clock is needed for that
 * window, so over budget what nothing names or holds goes at once. Keys
 * need not be on disk. Memory only; any thread. Out of memory leaves a key
 * unheld (its block may go: a miss, never a wrong state). NULL c or n 0:
 * no-op. */
void thaw_disk_cache_hold(struct thaw_disk_cache *c, const uint8_t *keys, uint32_t n);

/* A retention hint (an Anthropic cache_control mark: what it covers is
 * kept at least its ttl): each of the n block keys counts as named until
 * `until` (Unix seconds, the cache's clock), so it outlives the roots that
 * name it, and goes over budget or on a full disk only once no root and
 * no other block is left to evict (the earliest deadline first). A later
 * call extends, never shortens. Memory only: a restart forgets the hints
 * (the blocks stay, as blocks nothing names: their grace). Any thread;
 * keys need not be on disk yet. Out of memory leaves a key unkept. */
void thaw_disk_cache_retain(struct thaw_disk_cache *c, const uint8_t *keys, uint32_t n, int64_t until);
/* Drops what thaw_disk_cache_hold(c, keys, n) took. */
void thaw_disk_cache_unhold(struct thaw_disk_cache *c, const uint8_t *keys, uint32_t n);

/* Asks the kernel to start reading key's entry into the page cache
 * (POSIX_FADV_WILLNEED), so that a lookup made later, when the request has
 * a slot, finds it in memory. Any thread; returns at once, without waiting
 * for the reads and without checking anything but the index. Returns how
 * many part files the advice was given for (0: no such entry, or nothing
 * could be opened). */
int thaw_disk_cache_prefetch(struct thaw_disk_cache *c, const uint8_t key[THAW_KEY_BYTES]);

/* A part's bytes, valid until thaw_disk_entry_release(); *size gets its
 * length (0 when absent; size may be NULL). NULL when the part is absent. */
const void *thaw_disk_entry_part(const struct thaw_disk_entry *e, enum thaw_part p, size_t *size);
uint32_t thaw_disk_entry_n_tokens(const struct thaw_disk_entry *e);
/* The meta blob (NULL with *n = 0 if none), valid until release. */
const void *thaw_disk_entry_meta(const struct thaw_disk_entry *e, size_t *n);
/* Unmaps and frees e. NULL is a no-op. */
void thaw_disk_entry_release(struct thaw_disk_entry *e);

/* Evicts, in this order: roots unused for more than ttl_s seconds; then,
 * while the total (blocks included) is over max_bytes, unreferenced blocks
 * nothing holds and the least recently used roots; then every unreferenced
 * block past its grace (block_grace_s; no grace after a pass over budget),
 * the blocks only those roots named among them: collected. Blocks are never chosen by
 * TTL or LRU themselves. Cheap when there is nothing to do (reads the
 * in-memory LRU list head and the list of unreferenced blocks; no I/O).
 * Entries being written are skipped. Returns the number of entries removed
 * (roots evicted + blocks collected, >= 0); removal errors are logged, the
 * entry is dropped from the index anyway. */
int thaw_disk_cache_evict(struct thaw_disk_cache *c);

/* Removes key's entry (.idx first) and any file of the key left on disk.
 * The blocks only a removed root named are collected by a later eviction
 * pass, once past their grace. Waits for a store of the same key in
 * progress. Returns 0, THAW_ENOTFOUND
 * if no entry was indexed (leftover files are still removed), THAW_EINVAL
 * for a READONLY cache or NULL key, or the -errno of unlinking the .idx. */
int thaw_disk_cache_remove(struct thaw_disk_cache *c, const uint8_t key[THAW_KEY_BYTES]);

/* Bits of *bad_parts from thaw_disk_cache_verify(). */
#define THAW_DISK_BAD_PART(p) (1u << (p))
#define THAW_DISK_BAD_IDX (1u << THAW_PART_COUNT)

/* Checksums every part of key's entry, whatever its fingerprint, without
 * changing its last use. *bad_parts (may be NULL) gets which files failed.
 * With fix, does what a lookup does to what it finds: removes a bad entry,
 * drops a bad .dft alone (not with READONLY: nothing is changed).
 * Returns 0 (usable; maybe a bad .dft, see *bad_parts), THAW_ECORRUPT,
 * THAW_ENOTFOUND, THAW_EINVAL, THAW_ENOMEM or -errno as lookup. Counts no
 * lookup. */
int thaw_disk_cache_verify(struct thaw_disk_cache *c, const uint8_t key[THAW_KEY_BYTES], int fix, unsigned *bad_parts);

/* One indexed entry, as listed by thaw_disk_cache_foreach(). */
struct thaw_disk_entry_info {
    uint8_t key[THAW_KEY_BYTES];
    uint8_t fingerprint[THAW_DISK_FINGERPRINT_SIZE];
    int same_model; /* fingerprint equals this cache's */
    uint32_t n_tokens;
    uint64_t bytes;                      /* all files of the entry, .idx included */
    int is_block;                        /* THAW_DISK_KIND_BLOCK */
    uint32_t n_refs;                     /* blocks it names (a manifest) */
    uint32_t referrers;                  /* for a block: roots (and queued stores) naming it */
    uint64_t part_size[THAW_PART_COUNT]; /* 0 = absent */
    uint32_t n_meta;
    int64_t created;   /* Unix seconds */
    int64_t last_used; /* Unix seconds */
};

/* Calls cb for every committed entry, most recently used first, on a
 * snapshot taken under the lock: cb may call any cache function (remove,
 * verify, ...). Stops when cb returns non-zero and returns that value;
 * otherwise 0, or THAW_ENOMEM (nothing called). */
int thaw_disk_cache_foreach(struct thaw_disk_cache *c, int (*cb)(void *ud, const struct thaw_disk_entry_info *info),
                            void *ud);

struct thaw_disk_cache_stats {
    uint64_t entries;             /* committed, all fingerprints, blocks included */
    uint64_t bytes;               /* their files, .idx included */
    uint64_t blocks;              /* now: of those entries, blocks */
    uint64_t block_bytes;         /* now: their files */
    uint64_t blocks_unreferenced; /* now: blocks no root names (collected
                                   * once unused for block_grace_s) */
    uint64_t blocks_collected;    /* blocks removed because no root named them */
    uint64_t block_bytes_collected;
    int64_t oldest_created; /* Unix seconds; 0 when empty */
    int64_t oldest_used;    /* least recent last use; 0 when empty */
    uint64_t stores_ok;
    uint64_t roots_ok;         /* of those, roots: a conversation's manifest or whole state committed */
    uint64_t store_failures;   /* store() errors, including the writer's */
    uint64_t stores_dropped;   /* submit() refused: queue bytes full,
                                * closing, too big, ... (any non-zero return) */
    uint64_t evictions_ttl;    /* roots */
    uint64_t evictions_lru;    /* roots */
    uint64_t evictions_enospc; /* evicted to make room after a store's I/O
                                * failed with ENOSPC/EDQUOT */
    uint64_t queue_bytes;      /* now: bytes of submitted stores the writer
                                * holds (waiting + being written) */
    uint64_t queue_len;        /* now: how many stores that is */
    uint64_t corrupt_removed;  /* entries removed as corrupt (open or lookup) */
    uint64_t dft_dropped;      /* bad .dft parts dropped, entry kept */
    uint64_t lookups;
    uint64_t hits;
    uint64_t misses;          /* lookups - hits */
    uint64_t swept_files;     /* *.tmp / orphan parts removed at open */
    uint64_t skipped_entries; /* found unusable at open and left in place:
                               * corrupt under READONLY, or an .idx that
                               * could not be read (EACCES, EIO) */
    uint64_t fsyncs;          /* fsync and syncfs calls made, of files, the
                               * directory and the filesystem (whatever
                               * their outcome) */
    uint64_t stores_superseded; /* submitted roots taken out of the queue,
                                 * unwritten, by a newer store of their key */
    /* The writer's group commits, where a store's time goes after submit
     * (microseconds, summed over groups): waiting in the queue (the
     * group's oldest job, submit to the group's start), writing its files,
     * and in the syncs that make them durable. */
    uint64_t groups;
    uint64_t groups_unsynced; /* of them: only blocks written ahead (submit_unsynced), no sync */
    uint64_t group_wait_us;
    uint64_t group_write_us;
    uint64_t group_sync_us;
};

/* Counters since open (entries, bytes, oldest_*, queue_*: now). c NULL
 * gives all zero. Never fails. */
void thaw_disk_cache_get_stats(struct thaw_disk_cache *c, struct thaw_disk_cache_stats *out);

#endif
