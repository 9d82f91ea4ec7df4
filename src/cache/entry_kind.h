/* entry_kind.h — what a disk entry's .kv holds, named in one place.
 *
 * The disk tier stores opaque parts under keys (cache_disk.h); which format
 * a .kv is in is the formats' business. Four go to disk as a .kv:
 *
 *   magic   kind                      format        to the collector
 *   "TKV1"  THAW_ENTRY_STATE          kvstate.h     a root naming nothing
 *   "TMF1"  THAW_ENTRY_MANIFEST       manifest.h    a root naming its ids
 *   "TKB1"  THAW_ENTRY_BLOCK          kvlayout.h    a block (SWA blocks too)
 *   "TSN1"  THAW_ENTRY_SNAPSHOT       snapshots.h   a block: it lives while a
 *                                                   manifest names it
 *
 * Each format says whether bytes are its own (thaw_*_is: its magic and its
 * header's length), and thaw_entry_kind asks them all; every reader that
 * tells entries apart goes through it: the disk tier's collector (through
 * thaw_entry_classify, its classify callback at store time) and `thaw
 * cache` (what it counts, read through the disk tier's API).
 */
#ifndef THAW_ENTRY_KIND_H
#define THAW_ENTRY_KIND_H

#include <stddef.h>
#include <stdint.h>

enum thaw_entry_kind {
    THAW_ENTRY_OTHER,    /* no format claims it (or too short for its header) */
    THAW_ENTRY_STATE,    /* "TKV1": a conversation's whole state */
    THAW_ENTRY_MANIFEST, /* "TMF1": a conversation as blocks and snapshots */
    THAW_ENTRY_BLOCK,    /* "TKB1": KV rows of B positions */
    THAW_ENTRY_SNAPSHOT, /* "TSN1": a hybrid's recurrent state at one position */
};

/* Bytes of a .kv's start that are enough to name its kind: every format's
 * header fits (the longest, a version 2 manifest's, is 56). */
#define THAW_ENTRY_HEAD 64

/* The kind of the .kv whose first n bytes are at kv (n may be a head:
 * THAW_ENTRY_HEAD bytes, or all of a shorter file). Never fails: bytes no
 * format claims are THAW_ENTRY_OTHER. */
enum thaw_entry_kind thaw_entry_kind(const void *kv, size_t n);

/* The disk tier's classify callback (struct thaw_disk_cache_params,
 * cache_disk.h), ud unused, from a whole .kv: a block or a snapshot is
 * THAW_DISK_KIND_BLOCK (a block only when it parses whole); a manifest is
 * THAW_DISK_KIND_ROOT with *refs / *n_refs its ids (thaw_manifest_ids,
 * pointing into kv; none when it does not parse: it will not load either);
 * anything else THAW_DISK_KIND_ROOT naming nothing. */
int thaw_entry_classify(void *ud, const void *kv, size_t n, const uint8_t **refs, uint32_t *n_refs);

/* Where a conversation's token ids lie in its .kv (a state's or a
 * manifest's), from the first n bytes (THAW_ENTRY_HEAD is enough): *off
 * and *n_tokens. 0; THAW_ENOTFOUND for a block, a snapshot or bytes no
 * format claims; or as the format's own head reader. */
int thaw_entry_tokens(const void *head, size_t n, size_t *off, uint32_t *n_tokens);

#endif
