/* A C pipeline plugin for the tests that says which processes load it: its constructor, run by
 * dlopen before anything else of it, appends a line to the file MARKER (a compile-time define):
 * the loading process's pid, how many event polls it has open, then what it found on descriptors
 * 3 and 4 ("null" for /dev/null, "closed", or "other"). Then it writes a forged report to descriptor 3 and closes 3 and 4. It
 * passes every record on unchanged. */
#include "stateless.h"
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const uint32_t whend_plugin_abi_version = WHEND_PLUGIN_ABI_VERSION;

static const char *what(int descriptor) {
    struct stat found, null;
    if (fstat(descriptor, &found) != 0) return "closed";
    if (stat("/dev/null", &null) != 0) return "other";
    return S_ISCHR(found.st_mode) && found.st_rdev == null.st_rdev ? "null" : "other";
}

/* How many event polls the process has open (the runtime's among them). */
static int polls(void) {
    int count = 0;
    char path[64], target[64];
    for (int descriptor = 0; descriptor < 1024; descriptor++) {
        snprintf(path, sizeof path, "/proc/self/fd/%d", descriptor);
        ssize_t n = readlink(path, target, sizeof target - 1);
        if (n < 0) continue;
        target[n] = 0;
        if (strcmp(target, "anon_inode:[eventpoll]") == 0) count++;
    }
    return count;
}

__attribute__((constructor)) static void loaded(void) {
    char line[80];
    /* Before MARKER is opened: that takes the lowest free descriptor. */
    int n = snprintf(line, sizeof line, "%d polls=%d 3=%s 4=%s\n", (int)getpid(), polls(), what(3), what(4));
    int fd = open(MARKER, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return;
    if (write(fd, line, (size_t)n) != n) { /* the test sees a missing line */ }
    close(fd);
    /* What a careless library might do with descriptors it takes for its own: whend's helpers
     * give it /dev/null there. */
    static const char forged[] = "{\"refused\":\"forged by a constructor\"}\n{\"ok\":true}\n";
    if (write(3, forged, sizeof forged - 1) < 0) { /* nothing to do */ }
    close(3);
    close(4);
}


static int handle(void *instance, const whend_record *record, whend_next_fn next, void *next_context, char *message,
                  size_t capacity) {
    (void)instance, (void)message, (void)capacity;
    return next(next_context, record->json, record->length);
}

static const whend_plugin description = {
    WHEND_PLUGIN_ABI_VERSION, sizeof(whend_plugin), "constructor", "0.1.0", WHEND_ROLE_PIPELINE,
    create, destroy, handle,
};

const whend_plugin *whend_plugin_entry(void) { return &description; }
