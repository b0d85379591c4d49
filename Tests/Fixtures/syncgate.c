/* Preloaded into whend (LD_PRELOAD) by the tests of what a restart makes durable. While the file
 * named by WHEND_TEST_SYNC_GATE exists, an fdatasync of a journal segment (a ".zst" file) made
 * by a thread that has never written to one — the journal's sync thread, not its writer — waits
 * before it enters the kernel, and the file WHEND_TEST_SYNC_GATE".waiting" says one waits. A
 * whend SIGKILLed then dies with those syncs never made, its writer having gone on writing and
 * sealing segments meanwhile: a sync thread a little behind the writer, held still. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static __thread int wrote_segment;

static int is_segment(int fd) {
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    return n > 4 && memcmp(path + n - 4, ".zst", 4) == 0;
}

ssize_t write(int fd, const void *buffer, size_t count) {
    static ssize_t (*real)(int, const void *, size_t);
    if (!real) real = (ssize_t (*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
    if (!wrote_segment && is_segment(fd)) wrote_segment = 1;
    return real(fd, buffer, count);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    const char *gate = getenv("WHEND_TEST_SYNC_GATE");
    if (gate && !wrote_segment && is_segment(fd) && access(gate, F_OK) == 0) {
        char waiting[4096];
        snprintf(waiting, sizeof waiting, "%s.waiting", gate);
        close(open(waiting, O_CREAT | O_WRONLY | O_CLOEXEC, 0600));
        while (access(gate, F_OK) == 0) usleep(5000);
    }
    return real(fd);
}
