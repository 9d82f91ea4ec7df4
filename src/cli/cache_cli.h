/* cache_cli.h — `thaw cache ls|stats|verify|gc|rm DIR ...`: inspect and
 * tidy a disk cache directory, also while a server is using it.
 *
 *   thaw cache ls DIR                  entries, most recently used first
 *   thaw cache stats DIR               totals
 *   thaw cache verify DIR [--fix]      checksum every entry and report the
 *                                      bad ones; with --fix (alias --repair)
 *                                      remove them (what the server's next
 *                                      lookup would do anyway). --dry-run is
 *                                      the default, accepted for old scripts
 *   thaw cache gc DIR [--ttl T] [--max MiB]
 *                                      evict as the server does: unused for
 *                                      more than T (seconds, or 90m, 12h, 3d),
 *                                      then least recently used down to MiB
 *   thaw cache rm DIR KEY... | --all   remove entries; KEY is the hex key or
 *                                      a unique prefix of 4 or more digits
 *   thaw cache gc --shared s3://BUCKET/PREFIX [--ttl T] [--endpoint URL]
 *                 [--dry-run] [-v]     the shared tier's bucket (s3.h): delete
 *                                      the objects under PREFIX/ written more
 *                                      than T ago (default: serve's
 *                                      --kv-cache-ttl), manifests first;
 *                                      credentials from AWS_* variables
 *
 * ls, stats and verify change nothing (READONLY: not a file created,
 * removed, renamed or touched, not even *.tmp or orphans). verify --fix, gc
 * and rm only ever remove entries, .idx first, so they are safe next to a
 * running server; when no server holds the directory they also sweep what
 * an interrupted run left (*.tmp, orphans), as a server's start-up does.
 */
#ifndef THAW_CACHE_CLI_H
#define THAW_CACHE_CLI_H

/* argv[0] is "cache". Prints to stdout (results) and stderr (errors).
 * Returns the process exit status: 0 success; 1 the command ran but found
 * something wrong: verify a corrupt entry (fixed or not), ls/stats an entry
 * they could not read (counted, left out of the listing), rm a key not
 * found, gc --shared an object it could not delete; 2 usage error (--fix
 * with --dry-run included), the directory could not be opened, or gc
 * --shared could not list the bucket or stopped early. Never exits. */
int thaw_cache_main(int argc, char **argv);

#endif
