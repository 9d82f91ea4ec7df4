/* cache_gc_shared.h — `thaw cache gc --shared`: expire the shared tier's
 * objects (DESIGN §11) by age, on a store without a lifecycle rule. */
#ifndef THAW_CACHE_GC_SHARED_H
#define THAW_CACHE_GC_SHARED_H

#include <stdint.h>

/* Deletes the objects under url (s3://BUCKET/PREFIX: the servers'
 * --kv-shared; a prefix is required) written more than ttl_s seconds ago,
 * manifests in a first listing, the rest in a second, at the store
 * endpoint_opt (NULL: $AWS_ENDPOINT_URL) with $AWS_ACCESS_KEY_ID,
 * $AWS_SECRET_ACCESS_KEY and $AWS_REGION. dry_run: lists what would go,
 * deletes nothing; verbose: one line per object deleted. Prints a summary
 * on stdout, problems on stderr. Returns the exit status: 0 done, 1 some
 * deletes failed, 2 the run could not start or was stopped (the store
 * unreachable, deletes failing in a row, no libcurl in this build). */
int thaw_cache_gc_shared(const char *url, const char *endpoint_opt, int64_t ttl_s, int dry_run, int verbose);

#endif
