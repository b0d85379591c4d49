/* A C pipeline plugin for the tests that says which processes load it: its constructor, run by
 * dlopen before anything else of it, appends the loading process's pid to the file MARKER (a
 * compile-time define), then writes a forged report to descriptor 3 and closes 3 and 4. It passes
 * every record on unchanged. */
#include "stateless.h"
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

const uint32_t whend_plugin_abi_version = WHEND_PLUGIN_ABI_VERSION;

__attribute__((constructor)) static void loaded(void) {
    int fd = open(MARKER, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return;
    char line[32];
    int n = snprintf(line, sizeof line, "%d\n", (int)getpid());
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
