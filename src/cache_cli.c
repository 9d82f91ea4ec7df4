/* cache_cli.c — `thaw cache ...`: the disk cache seen from a shell.
 *
 * Map:
 *   ---- helpers ----    formatting (sizes, ages), options, opening
 *   ---- commands ----   ls, stats, verify, gc, rm
 *   ---- main ----       dispatch and usage
 */
#include "cache_cli.h"

#include "blocks.h"
#include "cache_disk.h"
#include "error.h"
#include "log.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>

#define KEY_SHOWN 16 /* hex digits of a key shown in listings */

static const char usage_text[] = "usage: thaw cache <command> DIR [options]\n"
                                 "\n"
                                 "  ls DIR                    list entries, most recently used first\n"
                                 "  stats DIR                 entries, total size, oldest entry\n"
                                 "  verify DIR [--fix]        checksum every entry and report the corrupt\n"
                                 "                            ones; changes nothing unless --fix (alias\n"
                                 "                            --repair): then removes them, and the files an\n"
                                 "                            interrupted run left if no server holds DIR\n"
                                 "                            (--dry-run: the default, still accepted)\n"
                                 "  gc DIR [--ttl T] [--max MiB]\n"
                                 "                            evict entries unused for more than T (seconds,\n"
                                 "                            or with a unit: 90m, 12h, 3d), then the least\n"
                                 "                            recently used until the total is <= MiB\n"
                                 "  rm DIR KEY... | --all     remove entries (KEY: hex key or unique prefix)\n"
                                 "\n"
                                 "ls, stats and verify (without --fix) never change DIR. The others are safe\n"
                                 "while a server uses DIR: only whole entries are removed, .idx first.\n"
                                 "Exit status: 0 ok, 1 something found wrong (an unreadable or corrupt\n"
                                 "entry) or not found, 2 error.\n";

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

/* "45s ago", "12m ago", "3h ago", "2d ago"; "-" for 0 (unknown). */
static void fmt_ago(int64_t then, int64_t now, char out[24])
{
    int64_t d = now - then;

    if (then == 0) {
        snprintf(out, 24, "-");
        return;
    }
    if (d < 0)
        snprintf(out, 24, "in the future");
    else if (d < 120)
        snprintf(out, 24, "%" PRId64 "s ago", d);
    else if (d < 2 * 3600)
        snprintf(out, 24, "%" PRId64 "m ago", d / 60);
    else if (d < 2 * 86400)
        snprintf(out, 24, "%" PRId64 "h ago", d / 3600);
    else
        snprintf(out, 24, "%" PRId64 "d ago", d / 86400);
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
    r = thaw_disk_cache_open(&p, out);
    if (r == THAW_ELOCKED && !readonly) {
        p.flags = THAW_DISK_CACHE_SHARED;
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

/* ---- commands ----------------------------------------------------------- */

static int cmd_ls(struct cli *cli)
{
    struct thaw_disk_cache *c;
    struct list l = {0};
    struct thaw_disk_cache_stats st;
    int64_t now = (int64_t)time(NULL);
    char hex[2 * THAW_KEY_BYTES + 1], fp[2 * THAW_DISK_FINGERPRINT_SIZE + 1];
    char size[24], parts[24], created[24], used[24];
    int ret = 2;

    if (cli_open(cli, 1, 0, 0, &c))
        return 2;
    if (list_all(c, &l))
        goto out;
    if (l.n)
        printf("%-*s %8s %10s  %-12s %-10s %-10s %s\n", KEY_SHOWN, "KEY", "TOKENS", "SIZE", "PARTS", "CREATED",
               "LAST USED", "MODEL");
    for (size_t i = 0; i < l.n; i++) {
        const struct thaw_disk_entry_info *e = &l.v[i];

        thaw_hex(e->key, THAW_KEY_BYTES, hex);
        thaw_hex(e->fingerprint, THAW_DISK_FINGERPRINT_SIZE, fp);
        thaw_fmt_bytes(e->bytes, size);
        fmt_parts(e->part_size, parts);
        fmt_ago(e->created, now, created);
        fmt_ago(e->last_used, now, used);
        printf("%.*s %8" PRIu32 " %10s  %-12s %-10s %-10s %.8s\n", KEY_SHOWN, hex, e->n_tokens, size, parts, created,
               used, fp);
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

/* ---- the block store's view (blocks.h): what each entry's .kv holds ---- */

enum kind { KIND_OTHER, KIND_BLOCK, KIND_MANIFEST, KIND_WHOLE };

struct block_ref {
    uint8_t key[THAW_KEY_BYTES];
    uint64_t bytes;
    uint32_t refs;
};

static int block_cmp(const void *a, const void *b)
{
    return memcmp(a, b, THAW_KEY_BYTES);
}

/* The entry's .kv file, whole (NULL when unreadable); *n its size. */
static uint8_t *read_kv(const struct cli *cli, const uint8_t key[THAW_KEY_BYTES], size_t max, size_t *n)
{
    char hex[2 * THAW_KEY_BYTES + 1], path[4096];
    uint8_t *buf = NULL;
    FILE *f;

    thaw_hex(key, THAW_KEY_BYTES, hex);
    snprintf(path, sizeof path, "%s/%s.kv", cli->dir, hex);
    if (!(f = fopen(path, "rb")))
        return NULL;
    if ((buf = malloc(max)))
        *n = fread(buf, 1, max, f);
    fclose(f);
    return buf;
}

static enum kind kind_of(const uint8_t *head, size_t n)
{
    if (n < 4)
        return KIND_OTHER;
    if (!memcmp(head, "TKB1", 4))
        return KIND_BLOCK;
    if (!memcmp(head, "TMF1", 4))
        return KIND_MANIFEST;
    if (!memcmp(head, "TKV1", 4))
        return KIND_WHOLE;
    return KIND_OTHER;
}

/* Prints conversations, blocks, shared bytes and the dedup ratio (bytes
 * the manifests name / bytes the blocks take). */
static void print_blocks(const struct cli *cli, const struct list *l)
{
    struct block_ref *blocks = calloc(l->n + 1, sizeof *blocks);
    size_t *manifests = calloc(l->n + 1, sizeof *manifests); /* their indices in l */
    uint64_t n_blocks = 0, n_manifests = 0, n_whole = 0, block_bytes = 0, named = 0, shared = 0, missing = 0;
    char a[24], b[24];

    if (!blocks || !manifests) {
        free(blocks);
        free(manifests);
        return;
    }
    for (size_t i = 0; i < l->n; i++) {
        uint8_t *head;
        size_t n = 0;
        if (!(head = read_kv(cli, l->v[i].key, 4, &n)))
            continue;
        switch (kind_of(head, n)) {
        case KIND_BLOCK:
            memcpy(blocks[n_blocks].key, l->v[i].key, THAW_KEY_BYTES);
            blocks[n_blocks++].bytes = l->v[i].bytes;
            block_bytes += l->v[i].bytes;
            break;
        case KIND_MANIFEST:
            manifests[n_manifests++] = i;
            break;
        case KIND_WHOLE:
            n_whole++;
            break;
        default:
            break;
        }
        free(head);
    }
    qsort(blocks, n_blocks, sizeof *blocks, block_cmp);
    for (uint64_t j = 0; j < n_manifests; j++) { /* only manifests are read whole */
        size_t n = 0;
        const uint8_t *ids;
        uint32_t n_ids;
        const struct thaw_disk_entry_info *e = &l->v[manifests[j]];
        uint64_t size = e->part_size[THAW_PART_KV];
        uint8_t *m = size < (64u << 20) ? read_kv(cli, e->key, size, &n) : NULL;
        if (m && thaw_blocks_manifest_ids(m, n, &ids, &n_ids) == 0) {
            for (uint32_t k = 0; k < n_ids; k++) {
                struct block_ref *r =
                    bsearch(ids + (size_t)k * THAW_KEY_BYTES, blocks, n_blocks, sizeof *blocks, block_cmp);
                if (!r) {
                    missing++;
                    continue;
                }
                named += r->bytes;
                if (++r->refs == 2)
                    shared += r->bytes;
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
    if (block_bytes)
        printf("dedup ratio       %.2fx (block bytes the manifests name / block bytes on disk)\n",
               (double)named / (double)block_bytes);
    if (missing)
        printf("missing blocks    %" PRIu64 " named by a manifest but not stored (those conversations miss)\n",
               missing);
    free(blocks);
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
    fmt_ago(st.oldest_created, now, ago);
    printf("oldest entry      created %s\n", ago);
    fmt_ago(st.oldest_used, now, ago);
    printf("least recent use  %s\n", ago);
    fmt_ago(newest, now, ago);
    printf("most recent use   %s\n", ago);
    print_blocks(cli, &l);
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
    char freed[24], left[24];
    int n;

    if (cli_open(cli, 0, max_bytes, ttl_s, &c))
        return 2;
    cli->verbose = 1; /* one line per eviction, with its reason */
    thaw_disk_cache_get_stats(c, &before);
    n = thaw_disk_cache_evict(c);
    thaw_disk_cache_get_stats(c, &after);
    thaw_fmt_bytes(before.bytes - after.bytes, freed);
    thaw_fmt_bytes(after.bytes, left);
    printf("evicted %d %s (%s)", n, n == 1 ? "entry" : "entries", freed);
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

static int usage(FILE *to, int status)
{
    fputs(usage_text, to);
    return status;
}

int thaw_cache_main(int argc, char **argv)
{
    struct cli cli = {0};
    const char *cmd;
    char **pos;
    int n_pos = 0, dry_run = 0, fix = 0, all = 0, ret;
    int64_t ttl_s = 0;
    uint64_t max_bytes = 0;

    if (argc < 2)
        return usage(stderr, 2);
    cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help"))
        return usage(stdout, 0);
    pos = calloc((size_t)argc, sizeof *pos);
    if (!pos)
        return 2;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];

        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            free(pos);
            return usage(stdout, 0);
        } else if (!strcmp(a, "--dry-run") && !strcmp(cmd, "verify")) {
            dry_run = 1; /* the default now; kept for scripts written before */
        } else if ((!strcmp(a, "--fix") || !strcmp(a, "--repair")) && !strcmp(cmd, "verify")) {
            fix = 1;
        } else if (!strcmp(a, "--all") && !strcmp(cmd, "rm")) {
            all = 1;
        } else if (!strcmp(a, "--ttl") && !strcmp(cmd, "gc") && i + 1 < argc) {
            if (parse_duration(argv[++i], &ttl_s)) {
                fprintf(stderr, "thaw cache: --ttl %s: want seconds, or 90m, 12h, 3d\n", argv[i]);
                free(pos);
                return 2;
            }
        } else if (!strcmp(a, "--max") && !strcmp(cmd, "gc") && i + 1 < argc) {
            if (parse_mib(argv[++i], &max_bytes)) {
                fprintf(stderr, "thaw cache: --max %s: want MiB\n", argv[i]);
                free(pos);
                return 2;
            }
        } else if (a[0] == '-' && a[1] != '\0') {
            fprintf(stderr, "thaw cache %s: unknown option %s\n", cmd, a);
            free(pos);
            return usage(stderr, 2);
        } else {
            pos[n_pos++] = argv[i];
        }
    }
    if (dry_run && fix) {
        fprintf(stderr, "thaw cache verify: --dry-run and --fix contradict each other\n");
        free(pos);
        return usage(stderr, 2);
    }
    if (n_pos < 1) {
        fprintf(stderr, "thaw cache %s: missing DIR\n", cmd);
        free(pos);
        return usage(stderr, 2);
    }
    cli.dir = pos[0];
    if (strcmp(cmd, "rm") != 0 && n_pos > 1) {
        fprintf(stderr, "thaw cache %s: unexpected argument %s\n", cmd, pos[1]);
        free(pos);
        return usage(stderr, 2);
    }
    if (!strcmp(cmd, "ls")) {
        ret = cmd_ls(&cli);
    } else if (!strcmp(cmd, "stats")) {
        ret = cmd_stats(&cli);
    } else if (!strcmp(cmd, "verify")) {
        ret = cmd_verify(&cli, fix);
    } else if (!strcmp(cmd, "gc")) {
        ret = cmd_gc(&cli, ttl_s, max_bytes);
    } else if (!strcmp(cmd, "rm")) {
        if (!all && n_pos < 2) {
            fprintf(stderr, "thaw cache rm: give KEY... or --all\n");
            ret = 2;
        } else {
            ret = cmd_rm(&cli, pos + 1, n_pos - 1, all);
        }
    } else {
        fprintf(stderr, "thaw cache: unknown command %s\n", cmd);
        ret = usage(stderr, 2);
    }
    free(pos);
    return ret;
}
