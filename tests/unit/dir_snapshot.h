/* dir_snapshot.h — for the unit tests: a snapshot of a directory that any
 * change would show, to prove that a read-only path changed nothing.
 * Header-only (static functions): include it from one test file each. */
#ifndef THAW_TEST_DIR_SNAPSHOT_H
#define THAW_TEST_DIR_SNAPSHOT_H

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Everything about a directory that a change would show: per file its
 * name, inode, mode, size, mtime, ctime (a chmod, utimens or rename moves
 * ctime) and a hash of its bytes; the directory's own mode, mtime and ctime
 * (a create or unlink moves them). atime is left out: reading moves it. */
struct snap_file {
    char name[256]; /* d_name's size */
    ino_t ino;
    mode_t mode;
    off_t size;
    struct timespec mtim, ctim;
    uint64_t hash;
};

struct snap {
    struct stat dir;
    int n;
    struct snap_file f[64];
};

static int snap_cmp(const void *a, const void *b)
{
    return strcmp(((const struct snap_file *)a)->name, ((const struct snap_file *)b)->name);
}

static void snap_take(const char *dir, struct snap *s)
{
    DIR *d = opendir(dir);
    struct dirent *de;

    memset(s, 0, sizeof *s);
    assert_non_null(d);
    assert_int_equal(stat(dir, &s->dir), 0);
    while ((de = readdir(d))) {
        struct snap_file *x = &s->f[s->n];
        char path[PATH_MAX], buf[4096];
        struct stat st;
        ssize_t got;
        int fd;

        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        assert_true(s->n < 64);
        snprintf(x->name, sizeof x->name, "%s", de->d_name);
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        assert_int_equal(lstat(path, &st), 0);
        x->ino = st.st_ino;
        x->mode = st.st_mode;
        x->size = st.st_size;
        x->mtim = st.st_mtim;
        x->ctim = st.st_ctim;
        x->hash = 1469598103934665603ull; /* FNV-1a */
        if (S_ISREG(st.st_mode)) {
            fd = open(path, O_RDONLY);
            assert_true(fd >= 0);
            while ((got = read(fd, buf, sizeof buf)) > 0)
                for (ssize_t i = 0; i < got; i++)
                    x->hash = (x->hash ^ (uint8_t)buf[i]) * 1099511628211ull;
            close(fd);
        }
        s->n++;
    }
    closedir(d);
    qsort(s->f, (size_t)s->n, sizeof s->f[0], snap_cmp);
}

static int ts_eq(struct timespec a, struct timespec b)
{
    return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

static void snap_assert_same(const struct snap *a, const struct snap *b, const char *after)
{
    if (a->dir.st_mode != b->dir.st_mode || !ts_eq(a->dir.st_mtim, b->dir.st_mtim) ||
        !ts_eq(a->dir.st_ctim, b->dir.st_ctim))
        fail_msg("%s: the directory itself changed (mode, mtime or ctime)", after);
    for (int i = 0; i < a->n || i < b->n; i++) {
        const struct snap_file *x = i < a->n ? &a->f[i] : NULL, *y = i < b->n ? &b->f[i] : NULL;

        if (!x || !y || strcmp(x->name, y->name) != 0)
            fail_msg("%s: file list changed at %s / %s", after, x ? x->name : "-", y ? y->name : "-");
        if (x->ino != y->ino || x->mode != y->mode || x->size != y->size || x->hash != y->hash ||
            !ts_eq(x->mtim, y->mtim) || !ts_eq(x->ctim, y->ctim))
            fail_msg("%s: %s changed", after, x->name);
    }
}

#endif
