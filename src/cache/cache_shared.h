/* cache_shared.h — the shared tier: blocks and manifests on an S3-compatible
 * object store, behind every replica's local tiers (DESIGN §11).
 *
 * Objects are immutable, named under PREFIX/ of the bucket by model,
 * tenant and key, and sealed with the cluster secret
 * (--kv-shared-secret-file): shared_seal.h has the names and the envelope.
 * An object that was flipped, truncated, copied to another name or sealed
 * with another secret fails to open and is rejected, counted, before
 * anything reads its bytes; libllama never sees a byte that a replica of
 * this cluster did not write for this name.
 *
 * Flow:
 *   upload   after a store commits locally, a bounded queue (full: dropped,
 *            counted) hands the entry's key to one uploader thread, which
 *            reads the committed entry back (checksums verified), PUTs its
 *            blocks, then the entry, each with If-None-Match: * (the first
 *            writer wins; another replica's identical object is a success).
 *            The entry goes last: a replica killed mid-upload leaves blocks
 *            without an entry, never an entry naming missing blocks (and S3
 *            never shows a half-written object).
 *   fetch    a request whose conversation the local tier lacks waits (on a
 *            fetch thread, not the engine's nor the HTTP loop's) while its
 *            entry and missing blocks are fetched within the deadline
 *            (--kv-shared-timeout-ms), FETCH_PARALLEL GETs at a time,
 *            opened and submitted to the local disk writer in order, blocks
 *            first; the engine's lookup then finds them
 *            there. A first turn without an entry fetches the run of its
 *            prompt's blocks instead. Anything failed, slow or partial is a
 *            miss: the request is served by prefill.
 *   breaker  THAW_SHARED_BREAKER_FAILS failures in a row (timeouts, store
 *            errors: not a 404) stop every fetch and upload for
 *            --kv-shared-retry-s seconds (logged once); then one request
 *            tries again, and a success closes it (logged).
 *
 * Threads: open/close on one thread; upload, fetch_async, taken and
 * metrics from any.
 */
#ifndef THAW_CACHE_SHARED_H
#define THAW_CACHE_SHARED_H

#include "base/key.h"
#include "base/token.h"
#include "cache/cache_disk.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define THAW_SHARED_BREAKER_FAILS 3

struct thaw_shared;

struct thaw_shared_params {
    const char *url;         /* s3://BUCKET[/PREFIX] */
    const char *endpoint;    /* http(s)://HOST[:PORT]; NULL = $AWS_ENDPOINT_URL */
    const char *secret_file; /* the cluster secret: at least 16 bytes */
    long timeout_ms;         /* deadline of a fetch, all its objects together; 0 = 2000 */
    long retry_s;            /* breaker: seconds without trying; 0 = 30 */
    uint32_t queue;          /* uploads waiting; 0 = 64 */
    uint32_t block_tokens;   /* the local tier's block size (0: whole states, no prefix fetch) */
    bool prefix_fetch;       /* a first turn may fetch its prompt's run of blocks */
    uint8_t identity[THAW_KEY_BYTES]; /* the model's (keys.h), bound into every object */
    struct thaw_disk_cache *disk;     /* the local tier: read to upload, written by fetches */
    struct thaw_workers *workers;     /* background pool (workers.h) a fetch's parallel GETs run
                                       * on, THAW_SHARED_WORKERS of them at most; borrowed, must
                                       * outlive the tier. NULL: a fetch's GETs one at a time */
};

/* Jobs the shared tier may have on the pool at once: its fetch threads
 * times the GETs each runs beside its own. */
#define THAW_SHARED_WORKERS 6

/* Reads the secret and the credentials (AWS_ACCESS_KEY_ID,
 * AWS_SECRET_ACCESS_KEY, AWS_REGION), starts the uploader and fetch
 * threads. Does not contact the store (a store down at start-up is a miss
 * later, not a failed start). Returns 0, THAW_EINVAL (logged: what is
 * wrong and what to do) or THAW_ENOMEM. */
int thaw_shared_open(const struct thaw_shared_params *p, struct thaw_shared **out);

/* Stops taking fetches and finishes those in flight (their callbacks run):
 * before the scheduler the callbacks push to goes away. Uploads go on.
 * Idempotent. */
void thaw_shared_stop(struct thaw_shared *s);

/* thaw_shared_stop, stops the uploader (what it has not taken is dropped,
 * counted: thaw_shared_flush first to hand them on), frees all. NULL: no-op. */
void thaw_shared_close(struct thaw_shared *s);

/* Queues the upload of the entry just submitted to the local tier under
 * key (it is uploaded once it has committed there). Never waits. */
void thaw_shared_upload(struct thaw_shared *s, const uint8_t key[THAW_KEY_BYTES], const uint8_t ns[THAW_KEY_BYTES]);

/* Fetches, on a fetch thread, what the local tier lacks of conversation
 * `key` (NULL: none) or else of the prompt's run of blocks, then calls
 * done(ud) there. The prompt must stay valid until done. Returns 0 (done
 * will be called), or nonzero when there is nothing to fetch or no fetch
 * is taken now (the local tier holds key, the breaker is open, every fetch
 * thread is busy and the queue is full, stopping): done is not called. */
int thaw_shared_fetch_async(struct thaw_shared *s, const uint8_t *key, const uint8_t ns[THAW_KEY_BYTES],
                            const thaw_token *prompt, int n_prompt, void (*done)(void *ud), void *ud);

/* A local store of key is coming (the engine has the reply, not yet the
 * state): fetch_async does not go after key meanwhile. A small ring of the
 * latest such keys; a store that never comes (too short, dropped) only
 * ages out of it. */
void thaw_shared_expect(struct thaw_shared *s, const uint8_t key[THAW_KEY_BYTES]);

/* Whether key's local entry came from the store (then forgotten): the
 * lookup that restores it reports "shared". */
bool thaw_shared_taken(struct thaw_shared *s, const uint8_t key[THAW_KEY_BYTES]);

/* Waits until the upload queue is empty, at most timeout_ms: a replica
 * shutting down hands its last turns on to the others. Returns the uploads
 * still queued or in flight (0: all done). */
int thaw_shared_flush(struct thaw_shared *s, long timeout_ms);

/* Appends thaw_kv_shared_* Prometheus lines. */
void thaw_shared_metrics(struct thaw_shared *s, char *buf, size_t cap, size_t *len);

#endif
