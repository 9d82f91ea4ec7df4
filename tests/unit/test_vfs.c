/* test_vfs.c — the syscall table: the default table reports -errno, and the
 * fault table counts, fails once, fails from a call on, and crashes (with a
 * torn write) exactly where it is armed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "base/vfs.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[64];

static int setup(void **state)
{
    (void)state;
    strcpy(dir, "/tmp/thaw-test-vfs-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    char path[PATH_MAX];

    (void)state;
    snprintf(path, sizeof path, "%s/f", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/g", dir);
    unlink(path);
    rmdir(dir);
    return 0;
}

static int count_cb(void *ud, const char *name)
{
    (void)name;
    ++*(int *)ud;
    return 0;
}

static void test_default_errors(void **state)
{
    const struct thaw_vfs *v = thaw_vfs_default();
    char path[PATH_MAX], to[PATH_MAX];
    struct stat st;
    void *m;
    int fd, fd2, n = 0;

    (void)state;
    snprintf(path, sizeof path, "%s/f", dir);
    snprintf(to, sizeof to, "%s/g", dir);
    assert_int_equal(v->open(v, "/nonexistent/x", O_RDONLY, 0), -ENOENT);
    assert_int_equal(v->unlink(v, path), -ENOENT);
    assert_int_equal(v->stat(v, path, &st), -ENOENT);
    fd = v->open(v, path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    assert_int_equal(v->open(v, path, O_WRONLY | O_CREAT | O_EXCL, 0600), -EEXIST);
    assert_int_equal(v->write(v, fd, "hello", 5), 5);
    assert_int_equal(v->fsync(v, fd), 0);
    assert_int_equal(v->fstat(v, fd, &st), 0);
    assert_int_equal(st.st_size, 5);
    assert_int_equal(v->close(v, fd), 0);
    fd = v->open(v, path, O_RDONLY, 0);
    assert_int_equal(v->mmap(v, fd, 5, &m), 0);
    assert_memory_equal(m, "hello", 5);
    assert_int_equal(v->munmap(v, m, 5), 0);
    assert_int_equal(v->mmap(v, fd, 0, &m), -EINVAL);
    /* flock: a second open file description is refused. */
    fd2 = v->open(v, path, O_RDONLY, 0);
    assert_int_equal(v->flock(v, fd, LOCK_EX | LOCK_NB), 0);
    assert_int_equal(v->flock(v, fd2, LOCK_EX | LOCK_NB), -EWOULDBLOCK);
    v->close(v, fd2);
    v->close(v, fd);
    assert_int_equal(v->rename(v, path, to), 0);
    assert_int_equal(v->listdir(v, dir, count_cb, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(v->listdir(v, "/nonexistent", count_cb, &n), -ENOENT);
    assert_int_equal(v->mkdir(v, dir, 0700), -EEXIST);
    assert_int_equal(v->unlink(v, to), 0);
}

static void test_fault_fail(void **state)
{
    struct thaw_vfs_fault *f;
    const struct thaw_vfs *v;
    char path[PATH_MAX];
    int fd;

    (void)state;
    snprintf(path, sizeof path, "%s/f", dir);
    assert_int_equal(thaw_vfs_fault_new(NULL, &f), 0);
    v = thaw_vfs_fault_vfs(f);
    fd = v->open(v, path, O_WRONLY | O_CREAT, 0600);
    assert_true(fd >= 0);
    /* Once: the 2nd write fails, the 1st and 3rd pass. */
    thaw_vfs_fault_arm(f, THAW_VFS_WRITE, 2, THAW_VFS_FAIL_ONCE, -ENOSPC);
    assert_int_equal(v->write(v, fd, "a", 1), 1);
    assert_int_equal(v->write(v, fd, "b", 1), -ENOSPC);
    assert_int_equal(v->write(v, fd, "c", 1), 1);
    assert_int_equal(v->fsync(v, fd), 0); /* another op: not counted as a write */
    assert_int_equal(thaw_vfs_fault_calls(f, THAW_VFS_WRITE), 3);
    assert_int_equal(thaw_vfs_fault_calls(f, THAW_VFS_ANY), 4);
    assert_int_equal(thaw_vfs_fault_fired(f), 1);
    /* From: every fsync from the 1st on. */
    thaw_vfs_fault_arm(f, THAW_VFS_FSYNC, 1, THAW_VFS_FAIL_FROM, -EIO);
    assert_int_equal(v->fsync(v, fd), -EIO);
    assert_int_equal(v->syncfs(v, fd), -EIO); /* a syncfs counts as an fsync */
    assert_int_equal(thaw_vfs_fault_calls(f, THAW_VFS_FSYNC), 2);
    assert_int_equal(thaw_vfs_fault_fired(f), 2);
    thaw_vfs_fault_arm(f, THAW_VFS_ANY, 0, THAW_VFS_NONE, 0);
    assert_int_equal(v->syncfs(v, fd), 0);
    /* ANY counts every op; a failed close still closes. */
    thaw_vfs_fault_arm(f, THAW_VFS_ANY, 1, THAW_VFS_FAIL_ONCE, -EIO);
    assert_int_equal(v->close(v, fd), -EIO);
    assert_int_equal(fcntl(fd, F_GETFD), -1);
    thaw_vfs_fault_arm(f, THAW_VFS_ANY, 0, THAW_VFS_NONE, 0);
    assert_int_equal(v->unlink(v, path), 0);
    thaw_vfs_fault_free(f);
}

static void test_fault_crash_tears_write(void **state)
{
    char path[PATH_MAX];
    struct stat st;
    pid_t pid;
    int status;

    (void)state;
    snprintf(path, sizeof path, "%s/f", dir);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct thaw_vfs_fault *f;
        const struct thaw_vfs *v;
        int fd;

        if (thaw_vfs_fault_new(NULL, &f))
            _exit(2);
        v = thaw_vfs_fault_vfs(f);
        fd = v->open(v, path, O_WRONLY | O_CREAT, 0600);
        thaw_vfs_fault_arm(f, THAW_VFS_ANY, 2, THAW_VFS_CRASH, 0);
        v->write(v, fd, "12345678", 8); /* call 1 */
        v->write(v, fd, "abcdefgh", 8); /* call 2: half, then exit */
        _exit(3);
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 137);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_size, 12);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_default_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fault_fail, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fault_crash_tears_write, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
