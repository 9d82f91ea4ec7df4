/* cache_cli.c — `thaw cache ...`: the disk cache seen from a shell; `thaw
 * cache gc --shared` for the shared tier's bucket is cache_gc_shared.c's.
 *
 * Map:
 *   ---- helpers ----    formatting, options, opening, listing
 *   ---- commands ----   ls, stats (with the block store's view), verify, gc, rm
 *   ---- main ----       the commands' flag tables (cli/flags.h), dispatch, usage
 */
#include "cli/cache_cli.h"

#include "base/config.h"
#include "base/error.h"
#include "base/log.h"
#include "cache/cache_disk.h"
#include "cache/entry_kind.h"
#include "cache/manifest.h"
#include "cli/cache_gc_shared.h"
#include "cli/flags.h"
#include "llama/vision.h"

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>

#define KEY_SHOWN 16 /* hex digits of a key shown in listings */

/* ---- helpers ------------------------------------------------------------ */

struct cli {
    const char *dir;
    int verbose; /* print the store's info lines too (gc: evictions) */
    int mute;    /* print nothing: the command reports on stdout itself */
};

static void cli_log(void *ud, int level, const char *msg)
{
    const struct cli *cli = ud;

    if (!cli->mute && (level <= THAW_LOG_WARN || cli->verbose))
        fprintf(stderr, "%s\n", msg);
}

static void fmt_parts(const uint64_t size[THAW_PART_COUNT], char out[24])
{
    snprintf(out, 24, "kv%s%s", size[THAW_PART_CKPT] ? "+ckpt" : "", size[THAW_PART_DFT] ? "+dft" : "");
}

/* Parses "90", "90s", "15m", "12h", "3d" into seconds. 0 or THAW_EINVAL. */
static int parse_duration(const char *s, int64_t *out)
{
    char *end;
    long long v;
    int64_t mul = 1;

    errno = 0;
    v = strtoll(s, &end, 10);
    if (errno || end == s || v < 0)
        return THAW_EINVAL;
    if (*end) {
        if (end[1])
            return THAW_EINVAL;
        switch (*end) {
        case 's':
            mul = 1;
            break;
        case 'm':
            mul = 60;
            break;
        case 'h':
            mul = 3600;
            break;
        case 'd':
            mul = 86400;
            break;
        default:
            return THAW_EINVAL;
        }
    }
    if (v > INT64_MAX / mul)
        return THAW_EINVAL;
    *out = v * mul;
    return 0;
}

static int parse_mib(const char *s, uint64_t *out)
{
    char *end;
    unsigned long long v;

    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-' || v > (UINT64_MAX >> 20))
        return THAW_EINVAL;
    *out = (uint64_t)v << 20;
    return 0;
}

/* Opens cli->dir. Read-only, or else as the directory's owner when no
 * server holds it (so leftovers are swept) and shared when one does.
 * 0 or the error, already reported. */
static int cli_open(struct cli *cli, int readonly, uint64_t max_bytes, int64_t ttl_s, struct thaw_disk_cache **out)
{
    struct thaw_disk_cache_params p = thaw_disk_cache_default_params();
    struct stat st;
    int r;

    /* Never create the directory: a typo should not make a new cache. */
    if (stat(cli->dir, &st) != 0) {
        fprintf(stderr, "thaw cache: %s: %s\n", cli->dir, strerror(errno));
        return -errno;
    }
    p.dir = cli->dir;
    p.max_bytes = max_bytes;
    p.ttl_s = ttl_s;
    p.log = cli_log;
    p.log_ud = cli;
    p.flags = readonly ? THAW_DISK_CACHE_READONLY : THAW_DISK_CACHE_NO_WRITER;
    /* Owning the directory (its lock), no server can be mid-store: a block
     * no manifest names is an orphan of a crash or of an evicted
     * conversation, with no grace to wait for (cache_disk.c, invariant 8). */
    p.block_grace_s = 0;
    r = thaw_disk_cache_open(&p, out);
    if (r == THAW_ELOCKED && !readonly) {
        /* a server's store in progress has blocks its manifest does not
         * name yet, and its queue is invisible from here: keep the grace */
        p.flags = THAW_DISK_CACHE_SHARED;
        p.block_grace_s = THAW_DISK_BLOCK_GRACE_DEFAULT;
        r = thaw_disk_cache_open(&p, out);
        if (r == 0 && cli->verbose)
            fprintf(stderr, "thaw cache: a server is using %s: leaving its temporary files alone\n", cli->dir);
    }
    if (r)
        fprintf(stderr, "thaw cache: cannot open %s: %s\n", cli->dir, thaw_strerror(r));
    return r;
}

/* A snapshot of every entry, most recently used first. */
struct list {
    struct thaw_disk_entry_info *v;
    size_t n, cap;
};

static int list_cb(void *ud, const struct thaw_disk_entry_info *info)
{
    struct list *l = ud;

    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        struct thaw_disk_entry_info *nv = realloc(l->v, cap * sizeof *nv);

        if (!nv)
            return THAW_ENOMEM;
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = *info;
    return 0;
}

static int list_all(struct thaw_disk_cache *c, struct list *l)
{
    int r = thaw_disk_cache_foreach(c, list_cb, l);

    if (r)
        fprintf(stderr, "thaw cache: listing: %s\n", thaw_strerror(r));
    return r;
}

/* The images an entry's conversation holds (thaw_vision_count_images of
 * its tokens, read from the head of its .kv), into out: a count, or "-"
 * when its tokens cannot be read. */
static void fmt_images(struct thaw_disk_cache *c, const struct thaw_disk_entry_info *e, char out[16])
{
    size_t cap = THAW_ENTRY_HEAD + (size_t)e->n_tokens * sizeof(int32_t), n = 0, off;
    uint32_t n_tokens;
    uint8_t *head;

    strcpy(out, "-");
    if (e->part_size[THAW_PART_KV] < cap)
        cap = (size_t)e->part_size[THAW_PART_KV];
    if (!(head = malloc(cap ? cap : 1)))
        return;
    if (thaw_disk_cache_read_kv(c, e->key, head, cap, &n) == 0 && thaw_entry_tokens(head, n, &off, &n_tokens) == 0 &&
        off <= n && n_tokens <= (n - off) / sizeof(int32_t)) {
        llama_token *t = malloc((size_t)n_tokens * sizeof *t + 1);

        if (t) {
            memcpy(t, head + off, (size_t)n_tokens * sizeof *t); /* not aligned in the head */
            snprintf(out, 16, "%d", thaw_vision_count_images(t, n_tokens));
            free(t);
        }
    }
    free(head);
}

/* ---- commands ----------------------------------------------------------- */

static int cmd_ls(struct cli *cli)
{
    struct thaw_disk_cache *c;
    struct list l = {0};
    struct thaw_disk_cache_stats st;
    int64_t now = (int64_t)time(NULL);
    char hex[2 * THAW_KEY_BYTES + 1], fp[2 * THAW_DISK_FINGERPRINT_SIZE + 1];
    char size[24], parts[24], created[24], used[24], images[16];
    int ret = 2;

    if (cli_open(cli, 1, 0, 0, &c))
        return 2;
    if (list_all(c, &l))
        goto out;
    if (l.n)
        printf("%-*s %8s %6s %10s  %-12s %-10s %-10s %s\n", KEY_SHOWN, "KEY", "TOKENS", "IMAGES", "SIZE", "PARTS",
               "CREATED", "LAST USED", "MODEL");
    for (size_t i = 0; i < l.n; i++) {
        const struct thaw_disk_entry_info *e = &l.v[i];

        thaw_hex(e->key, THAW_KEY_BYTES, hex);
        thaw_hex(e->fingerprint, THAW_DISK_FINGERPRINT_SIZE, fp);
        thaw_fmt_bytes(e->bytes, size);
        fmt_parts(e->part_size, parts);
        thaw_fmt_ago(e->created, now, created);
        thaw_fmt_ago(e->last_used, now, used);
        fmt_images(c, e, images);
        printf("%.*s %8" PRIu32 " %6s %10s  %-12s %-10s %-10s %.8s\n", KEY_SHOWN, hex, e->n_tokens, images, size, parts,
               created, used, fp);
    }
    thaw_disk_cache_get_stats(c, &st);
    thaw_fmt_bytes(st.bytes, size);
    printf("%" PRIu64 " %s, %s\n", st.entries, st.entries == 1 ? "entry" : "entries", size);
    if (st.skipped_entries)
        printf("%" PRIu64 " unreadable or corrupt, not listed (see `thaw cache verify %s`)\n", st.skipped_entries,
               cli->dir);
    /* A listing that leaves entries out must not pass for a clean one in a
     * script: what could be read is printed, the status says the rest. */
    ret = st.skipped_entries ? 1 : 0;
out:
    free(l.v);
    thaw_disk_cache_close(c);
    return ret;
}

static int fp_cmp(const void *a, const void *b)
{
    return memcmp(a, b, THAW_DISK_FINGERPRINT_SIZE);
}

/* ---- the block store's view: what each entry's .kv holds (entry_kind.h) ---- */

/* A block or a snapshot on disk, and how many manifests name it. */
struct named {
    uint8_t key[THAW_KEY_BYTES];
    uint64_t bytes;
    uint32_t refs;
    bool snapshot;
};

static int named_cmp(const void *a, const void *b)
{
    return memcmp(a, b, THAW_KEY_BYTES);
}

/* The entry's .kv, whole and checked, through the disk tier (NULL when it
 * cannot be read: removed meanwhile, corrupt, too big); *n its size. */
static uint8_t *read_kv(struct thaw_disk_cache *c, const struct thaw_disk_entry_info *e, size_t *n)
{
    uint64_t size = e->part_size[THAW_PART_KV];
    uint8_t *buf = size && size < (64u << 20) ? malloc((size_t)size) : NULL;

    if (buf && thaw_disk_cache_read_kv(c, e->key, buf, (size_t)size, n) != 0) {
        free(buf);
        buf = NULL;
    }
    return buf;
}

/* Prints conversations, blocks and snapshots, the bytes shared, the dedup
 * ratio (block bytes the manifests name / block bytes on disk), and what
 * manifests name that is not stored. A manifest names its blocks, then its
 * SWA blocks, then a hybrid's snapshots (manifest.h): each is counted as
 * the kind it is on disk. */
static void print_blocks(struct thaw_disk_cache *c, const struct list *l)
{
    struct named *named = calloc(l->n + 1, sizeof *named);
    size_t *manifests = calloc(l->n + 1, sizeof *manifests); /* their indices in l */
    uint64_t n_named = 0, n_manifests = 0, n_whole = 0, n_blocks = 0, n_snaps = 0;
    uint64_t block_bytes = 0, snap_bytes = 0, named_bytes = 0, shared = 0, snap_shared = 0, missing = 0;
    char a[24], b[24];

    if (!named || !manifests) {
        free(named);
        free(manifests);
        return;
    }
    for (size_t i = 0; i < l->n; i++) {
        uint8_t head[THAW_ENTRY_HEAD];
        size_t n = 0;
        if (thaw_disk_cache_read_kv(c, l->v[i].key, head, sizeof head, &n) != 0)
            continue; /* removed meanwhile, or unreadable: verify says which */
        switch (thaw_entry_kind(head, n)) {
        case THAW_ENTRY_BLOCK:
        case THAW_ENTRY_SNAPSHOT:
            named[n_named] = (struct named){.bytes = l->v[i].bytes,
                                            .snapshot = thaw_entry_kind(head, n) == THAW_ENTRY_SNAPSHOT};
            memcpy(named[n_named].key, l->v[i].key, THAW_KEY_BYTES);
            if (named[n_named++].snapshot) {
                n_snaps++;
                snap_bytes += l->v[i].bytes;
            } else {
                n_blocks++;
                block_bytes += l->v[i].bytes;
            }
            break;
        case THAW_ENTRY_MANIFEST:
            manifests[n_manifests++] = i;
            break;
        case THAW_ENTRY_STATE:
            n_whole++;
            break;
        case THAW_ENTRY_OTHER:
            break;
        }
    }
    qsort(named, n_named, sizeof *named, named_cmp);
    for (uint64_t j = 0; j < n_manifests; j++) { /* only manifests are read whole */
        size_t n = 0;
        const uint8_t *ids;
        uint32_t n_ids;
        uint8_t *m = read_kv(c, &l->v[manifests[j]], &n);
        if (m && thaw_manifest_ids(m, n, &ids, &n_ids) == 0) {
            for (uint32_t k = 0; k < n_ids; k++) {
                struct named *r = bsearch(ids + (size_t)k * THAW_KEY_BYTES, named, n_named, sizeof *named, named_cmp);
                if (!r) {
                    missing++;
                    continue;
                }
                if (r->snapshot) {
                    snap_shared += ++r->refs == 2 ? r->bytes : 0;
                } else {
                    named_bytes += r->bytes;
                    shared += ++r->refs == 2 ? r->bytes : 0;
                }
            }
        }
        free(m);
    }
    free(manifests);
    printf("conversations     %" PRIu64 " (%" PRIu64 " as manifests of blocks, %" PRIu64 " as whole states)\n",
           n_manifests + n_whole, n_manifests, n_whole);
    thaw_fmt_bytes(block_bytes, a);
    thaw_fmt_bytes(shared, b);
    printf("blocks            %" PRIu64 ", %s (%s shared by two or more conversations)\n", n_blocks, a, b);
    if (n_snaps) {
        thaw_fmt_bytes(snap_bytes, a);
        thaw_fmt_bytes(snap_shared, b);
        printf("snapshots         %" PRIu64 ", %s (%s shared by two or more conversations)\n", n_snaps, a, b);
    }
    if (block_bytes)
        printf("dedup ratio       %.2fx (block bytes the manifests name / block bytes on disk)\n",
               (double)named_bytes / (double)block_bytes);
    if (missing)
        printf("missing blocks    %" PRIu64 " named by a manifest but not stored (those conversations miss)\n",
               missing);
    free(named);
}

/* Blocks as the disk tier's index sees them (kinds and refs from the .idx). */
static void print_gc(const struct thaw_disk_cache_stats *st)
{
    if (!st->blocks)
        return;
    printf("unnamed blocks    %" PRIu64 " (no conversation names them: `thaw cache gc` collects them)\n",
           st->blocks_unreferenced);
}

static int cmd_stats(struct cli *cli)
{
    struct thaw_disk_cache *c;
    struct thaw_disk_cache_stats st;
    struct list l = {0};
    int64_t now = (int64_t)time(NULL), newest = 0;
    uint64_t tokens = 0, with_ckpt = 0, with_dft = 0;
    size_t models = 0;
    uint8_t(*fps)[THAW_DISK_FINGERPRINT_SIZE] = NULL;
    char size[24], ago[24];
    int ret = 2;

    if (cli_open(cli, 1, 0, 0, &c))
        return 2;
    if (list_all(c, &l))
        goto out;
    thaw_disk_cache_get_stats(c, &st);
    if (l.n) {
        fps = calloc(l.n, sizeof *fps);
        if (!fps)
            goto out;
    }
    for (size_t i = 0; i < l.n; i++) {
        tokens += l.v[i].n_tokens;
        with_ckpt += l.v[i].part_size[THAW_PART_CKPT] != 0;
        with_dft += l.v[i].part_size[THAW_PART_DFT] != 0;
        if (l.v[i].last_used > newest)
            newest = l.v[i].last_used;
        memcpy(fps[i], l.v[i].fingerprint, THAW_DISK_FINGERPRINT_SIZE);
    }
    if (l.n) {
        qsort(fps, l.n, sizeof *fps, fp_cmp);
        models = 1;
        for (size_t i = 1; i < l.n; i++)
            models += memcmp(fps[i], fps[i - 1], THAW_DISK_FINGERPRINT_SIZE) != 0;
    }
    thaw_fmt_bytes(st.bytes, size);
    printf("directory         %s\n", cli->dir);
    printf("entries           %" PRIu64 " (%zu model%s)\n", st.entries, models, models == 1 ? "" : "s");
    printf("total size        %s (%" PRIu64 " bytes)\n", size, st.bytes);
    printf("tokens stored     %" PRIu64 "\n", tokens);
    printf("with checkpoints  %" PRIu64 "\n", with_ckpt);
    printf("with draft state  %" PRIu64 "\n", with_dft);
    thaw_fmt_ago(st.oldest_created, now, ago);
    printf("oldest entry      created %s\n", ago);
    thaw_fmt_ago(st.oldest_used, now, ago);
    printf("least recent use  %s\n", ago);
    thaw_fmt_ago(newest, now, ago);
    printf("most recent use   %s\n", ago);
    print_blocks(c, &l);
    print_gc(&st);
    if (st.skipped_entries)
        printf("unreadable        %" PRIu64 " (see `thaw cache verify %s`)\n", st.skipped_entries, cli->dir);
    ret = st.skipped_entries ? 1 : 0; /* as ls: the totals leave them out */
out:
    free(fps);
    free(l.v);
    thaw_disk_cache_close(c);
    return ret;
}

static void fmt_bad(unsigned bad, char *out, size_t n)
{
    static const char *const names[] = {".kv", ".ckpt", ".dft", ".idx"};
    size_t len = 0;

    out[0] = '\0';
    for (int i = 0; i <= THAW_PART_COUNT; i++)
        if (bad & (1u << i))
            len += (size_t)snprintf(out + len, len < n ? n - len : 0, "%s%s", len ? " " : "", names[i]);
}

/* Read-only unless fix: reporting must never cost the evidence (a corrupt
 * file someone wants to look at) nor race a server's store, so removal is
 * asked for explicitly. */
static int cmd_verify(struct cli *cli, int fix)
{
    struct thaw_disk_cache *c;
    struct thaw_disk_cache_stats st;
    struct list l = {0};
    char hex[2 * THAW_KEY_BYTES + 1], what[48];
    uint64_t ok = 0, bad_entries = 0, bad_dft = 0, gone = 0;
    int ret = 2;

    if (cli_open(cli, !fix, 0, 0, &c))
        return 2;
    cli->mute = 1; /* each finding is printed below */
    thaw_disk_cache_get_stats(c, &st);
    bad_entries = st.corrupt_removed + st.skipped_entries; /* found at open */
    if (list_all(c, &l))
        goto out;
    for (size_t i = 0; i < l.n; i++) {
        unsigned bad = 0;
        int r = thaw_disk_cache_verify(c, l.v[i].key, fix, &bad);

        thaw_hex(l.v[i].key, THAW_KEY_BYTES, hex);
        fmt_bad(bad, what, sizeof what);
        if (r == 0 && !bad) {
            ok++;
        } else if (r == 0) {
            bad_dft++;
            printf("%.*s  bad %s: %s\n", KEY_SHOWN, hex, what,
                   fix ? "dropped it, kept the entry" : "left in place (--fix drops it)");
        } else if (r == THAW_ECORRUPT) {
            bad_entries++;
            printf("%.*s  corrupt (%s): %s\n", KEY_SHOWN, hex, what,
                   fix ? "removed" : "left in place (--fix removes it)");
        } else if (r == THAW_ENOTFOUND) {
            gone++; /* removed meanwhile (a server's eviction) */
        } else {
            printf("%.*s  cannot read: %s\n", KEY_SHOWN, hex, thaw_strerror(r));
            bad_entries++;
        }
    }
    /* Those found at open were checked too (and named on stderr then). */
    printf("%" PRIu64 " checked: %" PRIu64 " ok, %" PRIu64 " corrupt, %" PRIu64 " with a bad .dft",
           (uint64_t)l.n + st.corrupt_removed + st.skipped_entries, ok, bad_entries, bad_dft);
    if (gone)
        printf(", %" PRIu64 " gone meanwhile", gone);
    printf("\n");
    ret = bad_entries || bad_dft ? 1 : 0;
out:
    free(l.v);
    thaw_disk_cache_close(c);
    return ret;
}

static int cmd_gc(struct cli *cli, int64_t ttl_s, uint64_t max_bytes)
{
    struct thaw_disk_cache *c;
    struct thaw_disk_cache_stats before, after;
    char freed[24], left[24], blocks[24];
    int n;

    if (cli_open(cli, 0, max_bytes, ttl_s, &c))
        return 2;
    cli->verbose = 1; /* one line per eviction, with its reason */
    thaw_disk_cache_get_stats(c, &before);
    n = thaw_disk_cache_evict(c);
    thaw_disk_cache_get_stats(c, &after);
    thaw_fmt_bytes(before.bytes - after.bytes, freed);
    thaw_fmt_bytes(after.bytes, left);
    uint64_t collected = after.blocks_collected;
    n -= (int)collected; /* the rest were conversations (manifests, whole states) */
    printf("evicted %d %s (%s)", n, n == 1 ? "entry" : "entries", freed);
    thaw_fmt_bytes(after.block_bytes_collected, blocks);
    if (collected)
        printf(", collected %" PRIu64 " block%s no conversation names (%s of it)", collected,
               collected == 1 ? "" : "s", blocks);
    if (after.swept_files)
        printf(", swept %" PRIu64 " leftover file%s", after.swept_files, after.swept_files == 1 ? "" : "s");
    if (after.corrupt_removed)
        printf(", removed %" PRIu64 " corrupt", after.corrupt_removed);
    printf("; %" PRIu64 " %s left, %s\n", after.entries, after.entries == 1 ? "entry" : "entries", left);
    thaw_disk_cache_close(c);
    return 0;
}

static int cmd_rm(struct cli *cli, char **keys, int n_keys, int all)
{
    struct thaw_disk_cache *c;
    struct list l = {0};
    char hex[2 * THAW_KEY_BYTES + 1];
    int ret = 2, missing = 0, r;
    uint64_t removed = 0;

    if (cli_open(cli, 0, 0, 0, &c))
        return 2;
    if (list_all(c, &l))
        goto out;
    if (all) {
        for (size_t i = 0; i < l.n; i++)
            if (thaw_disk_cache_remove(c, l.v[i].key) == 0)
                removed++;
    }

    for (int k = 0; k < n_keys; k++) {
        size_t len = strlen(keys[k]), match = 0, at = 0;

        for (size_t i = 0; i < l.n; i++) {
            thaw_hex(l.v[i].key, THAW_KEY_BYTES, hex);
            if (len <= 2 * THAW_KEY_BYTES && !strncasecmp(hex, keys[k], len)) {
                match++;
                at = i;
            }
        }
        if (len < 4 || match > 1) {
            fprintf(stderr, "thaw cache: %s: %s\n", keys[k],
                    len < 4 ? "give at least 4 hex digits" : "ambiguous prefix");
            missing++;
        } else if (match == 0) {
            fprintf(stderr, "thaw cache: %s: no such entry\n", keys[k]);
            missing++;
        } else if ((r = thaw_disk_cache_remove(c, l.v[at].key)) == 0) {
            thaw_hex(l.v[at].key, THAW_KEY_BYTES, hex);
            printf("removed %.*s\n", KEY_SHOWN, hex);
            removed++;
        } else {
            fprintf(stderr, "thaw cache: %s: %s\n", keys[k], thaw_strerror(r));
            missing++;
        }
    }
    if (all || removed != 1)
        printf("removed %" PRIu64 " %s\n", removed, removed == 1 ? "entry" : "entries");
    ret = missing ? 1 : 0;
out:
    free(l.v);
    thaw_disk_cache_close(c);
    return ret;
}

/* ---- main --------------------------------------------------------------- */

/* What the command line says; each command's flags are its table below. */
struct cache_args {
    char **pos; /* DIR, then rm's KEYs (argc slots) */
    int n_pos;
    bool dry_run; /* verify: the default now; kept for scripts written before */
    bool fix, all;
    bool verbose; /* gc --shared: one line per object deleted (a DIR's gc always says) */
    const char *shared, *endpoint;
    bool ttl_given, max_given;
    int64_t ttl_s;
    uint64_t max_bytes;
};

static int arg_positional(void *dst, const char *arg)
{
    struct cache_args *a = dst;

    a->pos[a->n_pos++] = (char *)arg;
    return 0;
}

static int arg_ttl(void *dst, const struct thaw_flag *f, const char *flag, const char *v)
{
    struct cache_args *a = dst;

    (void)f, (void)flag;
    a->ttl_given = true;
    if (parse_duration(v, &a->ttl_s)) {
        fprintf(stderr, "thaw cache: --ttl %s: want seconds, or 90m, 12h, 3d\n", v);
        return THAW_EINVAL;
    }
    return 0;
}

static int arg_max(void *dst, const struct thaw_flag *f, const char *flag, const char *v)
{
    struct cache_args *a = dst;

    (void)f, (void)flag;
    a->max_given = true;
    if (parse_mib(v, &a->max_bytes)) {
        fprintf(stderr, "thaw cache: --max %s: want MiB\n", v);
        return THAW_EINVAL;
    }
    return 0;
}

#define ARG(f) offsetof(struct cache_args, f)

static const struct thaw_flag verify_flags[] = {
    {"--fix,--repair", NULL, THAW_FLAG_TRUE, ARG(fix), 0, 0,
     "remove the corrupt entries, and the files an\ninterrupted run left if no server holds DIR", NULL},
    {"--dry-run", NULL, THAW_FLAG_TRUE, ARG(dry_run), 0, 0, "change nothing (the default, still accepted)", NULL},
};

static const struct thaw_flag gc_flags[] = {
    {"--ttl", "T", THAW_FLAG_FN, 0, 0, 0,
     "evict entries unused for more than T (seconds, or\nwith a unit: 90m, 12h, 3d); --shared: objects\n"
     "written more than T ago (default: the server's\n--kv-cache-ttl, 3d)",
     arg_ttl},
    {"--max", "MiB", THAW_FLAG_FN, 0, 0, 0,
     "then the least recently used until the total is\n<= MiB; blocks go with the last conversation\n"
     "naming them",
     arg_max},
    {"--shared", "s3://BUCKET/PREFIX", THAW_FLAG_STR, ARG(shared), 0, 0,
     "the shared tier (--kv-shared) on a store with no\nlifecycle rule, instead of a DIR: delete the\n"
     "objects under PREFIX/ older than --ttl, manifests\nfirst. Credentials: AWS_ACCESS_KEY_ID,\n"
     "AWS_SECRET_ACCESS_KEY, AWS_REGION",
     NULL},
    {"--endpoint", "URL", THAW_FLAG_STR, ARG(endpoint), 0, 0, "--shared: the store (default: AWS_ENDPOINT_URL)", NULL},
    {"--dry-run", NULL, THAW_FLAG_TRUE, ARG(dry_run), 0, 0, "--shared: list the objects instead of deleting", NULL},
    {"-v,--verbose", NULL, THAW_FLAG_TRUE, ARG(verbose), 0, 0, "--shared: name each object deleted", NULL},
};

static const struct thaw_flag rm_flags[] = {
    {"--all", NULL, THAW_FLAG_TRUE, ARG(all), 0, 0, "every entry, instead of KEYs", NULL},
};

/* Each command: its synopsis, what it does, its flags. */
static const struct cache_cmd {
    const char *name, *synopsis, *help;
    const struct thaw_flag *flags;
    size_t n_flags;
} cache_cmds[] = {
    {"ls", "ls DIR", "list entries, most recently used first", NULL, 0},
    {"stats", "stats DIR", "entries, total size, oldest entry", NULL, 0},
    {"verify", "verify DIR [--fix]", "checksum every entry and report the corrupt\nones; changes nothing unless --fix",
     verify_flags, sizeof verify_flags / sizeof verify_flags[0]},
    {"gc", "gc DIR [--ttl T] [--max MiB]\ngc --shared s3://BUCKET/PREFIX [--ttl T] [--endpoint URL] [--dry-run] [-v]",
     "evict as the server does (DIR), or expire the\nshared tier's objects by age (--shared)", gc_flags,
     sizeof gc_flags / sizeof gc_flags[0]},
    {"rm", "rm DIR KEY... | --all", "remove entries (KEY: hex key or unique prefix\nof 4 or more digits)", rm_flags,
     sizeof rm_flags / sizeof rm_flags[0]},
};
#define N_CACHE_CMDS (sizeof cache_cmds / sizeof cache_cmds[0])

static int usage(FILE *to, int status)
{
    fputs("usage: thaw cache <command> DIR [options]\n\n", to);
    for (size_t i = 0; i < N_CACHE_CMDS; i++) {
        const struct cache_cmd *c = &cache_cmds[i];
        const char *nl = strchr(c->synopsis, '\n');
        struct thaw_flags t = {.flags = c->flags, .n_flags = c->n_flags, .width = 22, .indent = 4};

        if (nl) /* a second form: on its own line, the text below both */
            fprintf(to, "  %.*s\n  %s\n  %-24s  ", (int)(nl - c->synopsis), c->synopsis, nl + 1, "");
        else
            fprintf(to, "  %-24s  ", c->synopsis);
        for (const char *p = c->help; *p; p++) {
            fputc(*p, to);
            if (*p == '\n')
                fprintf(to, "  %-24s  ", "");
        }
        fputc('\n', to);
        thaw_flags_usage(to, &t, NULL, NULL, NULL);
    }
    fputs("\n"
          "ls, stats and verify (without --fix) never change DIR. The others are safe\n"
          "while a server uses DIR: only whole entries are removed, .idx first.\n"
          "Exit status: 0 ok, 1 something found wrong (an unreadable or corrupt\n"
          "entry), not found or not deleted, 2 error.\n",
          to);
    return status;
}

int thaw_cache_main(int argc, char **argv)
{
    struct cli cli = {0};
    struct cache_args a = {0};
    const struct cache_cmd *c = NULL;
    const char *cmd;
    char prog[64];
    int ret;

    if (argc < 2)
        return usage(stderr, 2);
    cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help"))
        return usage(stdout, 0);
    for (size_t i = 0; i < N_CACHE_CMDS; i++)
        if (!strcmp(cmd, cache_cmds[i].name))
            c = &cache_cmds[i];
    a.pos = calloc((size_t)argc, sizeof *a.pos);
    if (!a.pos)
        return 2;
    snprintf(prog, sizeof prog, "thaw cache %s", cmd);
    struct thaw_flags t = {
        .prog = prog,
        .see = "thaw cache",
        .flags = c ? c->flags : NULL,
        .n_flags = c ? c->n_flags : 0,
        .positional = arg_positional,
    };
    ret = thaw_flags_parse(&t, &a, argc - 1, argv + 1);
    if (ret != 0) {
        free(a.pos);
        return ret == 1 ? usage(stdout, 0) : usage(stderr, 2);
    }
    if (a.dry_run && a.fix) {
        fprintf(stderr, "thaw cache verify: --dry-run and --fix contradict each other\n");
        free(a.pos);
        return usage(stderr, 2);
    }
    if (!strcmp(cmd, "gc") && (a.shared || a.endpoint || a.dry_run)) {
        /* the shared tier: a bucket, not a DIR; kept by age only */
        struct thaw_config cfg;
        const char *why = !a.shared     ? "--endpoint and --dry-run go with --shared s3://BUCKET/PREFIX"
                          : a.n_pos     ? "--shared takes no DIR"
                          : a.max_given ? "--max is for a DIR: the shared tier is kept by age (--ttl)"
                                        : NULL;
        if (why) {
            fprintf(stderr, "thaw cache gc: %s\n", why);
            free(a.pos);
            return usage(stderr, 2);
        }
        thaw_config_init(&cfg); /* the server's default --kv-cache-ttl */
        ret = thaw_cache_gc_shared(a.shared, a.endpoint, a.ttl_given ? a.ttl_s : (int64_t)cfg.kv_cache_ttl_s, a.dry_run,
                            a.verbose);
        thaw_config_free(&cfg);
        free(a.pos);
        return ret;
    }
    if (a.n_pos < 1) {
        fprintf(stderr, "thaw cache %s: missing DIR\n", cmd);
        free(a.pos);
        return usage(stderr, 2);
    }
    cli.dir = a.pos[0];
    if (strcmp(cmd, "rm") != 0 && a.n_pos > 1) {
        fprintf(stderr, "thaw cache %s: unexpected argument %s\n", cmd, a.pos[1]);
        free(a.pos);
        return usage(stderr, 2);
    }
    if (!strcmp(cmd, "ls")) {
        ret = cmd_ls(&cli);
    } else if (!strcmp(cmd, "stats")) {
        ret = cmd_stats(&cli);
    } else if (!strcmp(cmd, "verify")) {
        ret = cmd_verify(&cli, a.fix);
    } else if (!strcmp(cmd, "gc")) {
        ret = cmd_gc(&cli, a.ttl_s, a.max_bytes);
    } else if (!strcmp(cmd, "rm")) {
        if (!a.all && a.n_pos < 2) {
            fprintf(stderr, "thaw cache rm: give KEY... or --all\n");
            ret = 2;
        } else {
            ret = cmd_rm(&cli, a.pos + 1, a.n_pos - 1, a.all);
        }
    } else {
        fprintf(stderr, "thaw cache: unknown command %s\n", cmd);
        ret = usage(stderr, 2);
    }
    free(a.pos);
    return ret;
}
