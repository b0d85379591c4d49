/* A C pipeline plugin for the tests. It appends each record's _seq to "seen" in its state
 * directory and passes the record on. While a file "down" exists there, it fails every record
 * (a destination that is down). Records named "poison" always fail. With {"crash_at": N} in
 * its configuration it crashes (a segfault) on _seq N, once; with {"hang_at": N} it hangs there,
 * once. A record named "derive" makes it emit a derived record. {"every": N} records only every
 * Nth _seq; its create refuses {"every": 0} with a message, as a plugin refuses a configuration it
 * cannot work with; {"create_crashes":true} makes create itself crash, {"create_hangs":true} never
 * return. */
#define _GNU_SOURCE /* memmem */
#include "whend_plugin.h"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const uint32_t whend_plugin_abi_version = WHEND_PLUGIN_ABI_VERSION;

typedef struct {
    const whend_host *host;
    unsigned long long crash_at, hang_at, every;
    char seen[4096], down[4096], crashed[4096], hung[4096];
} recorder;

static void *create(const whend_host *host, const char *config, size_t length, char *error, size_t capacity) {
    recorder *r = calloc(1, sizeof *r);
    if (!r) {
        snprintf(error, capacity, "out of memory");
        return NULL;
    }
    r->host = host;
    const char *crash = memmem(config, length, "\"crash_at\":", 11);
    if (crash) r->crash_at = strtoull(crash + 11, NULL, 10);
    const char *hang = memmem(config, length, "\"hang_at\":", 10);
    if (hang) r->hang_at = strtoull(hang + 10, NULL, 10);
    r->every = 1;
    const char *every = memmem(config, length, "\"every\":", 8);
    if (every) r->every = strtoull(every + 8, NULL, 10);
    if (r->every == 0) {
        snprintf(error, capacity, "\"every\" must be 1 or more (records every Nth _seq); it is 0");
        free(r);
        return NULL;
    }
    if (memmem(config, length, "\"create_crashes\":true", 21)) *(volatile int *)0 = 1;
    if (memmem(config, length, "\"create_hangs\":true", 19))
        for (;;) pause();
    snprintf(r->seen, sizeof r->seen, "%s/seen", host->state_directory);
    snprintf(r->down, sizeof r->down, "%s/down", host->state_directory);
    snprintf(r->crashed, sizeof r->crashed, "%s/crashed", host->state_directory);
    snprintf(r->hung, sizeof r->hung, "%s/hung", host->state_directory);
    return r;
}

static void destroy(void *instance) { free(instance); }

static int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static int named(const whend_record *record, const char *name) {
    char needle[128];
    snprintf(needle, sizeof needle, "\"name\":\"%s\"", name);
    return memmem(record->json, record->length, needle, strlen(needle)) != NULL;
}

static int handle(void *instance, const whend_record *record, whend_next_fn next, void *next_context, char *message,
                  size_t capacity) {
    recorder *r = instance;
    if (exists(r->down)) {
        snprintf(message, capacity, "destination down");
        return WHEND_FAIL;
    }
    if (named(record, "poison")) {
        snprintf(message, capacity, "cannot digest this record");
        return WHEND_FAIL;
    }
    if (r->crash_at && record->seq == r->crash_at && !exists(r->crashed)) {
        close(open(r->crashed, O_CREAT | O_WRONLY, 0600));
        *(volatile int *)0 = 1; /* a segfault, as a buggy C plugin would have */
    }
    if (r->hang_at && record->seq == r->hang_at && !exists(r->hung)) {
        close(open(r->hung, O_CREAT | O_WRONLY, 0600));
        for (;;) pause(); /* stuck, as on a call that never returns */
    }
    if (record->seq % r->every != 0) return next(next_context, record->json, record->length);
    char line[32];
    int n = snprintf(line, sizeof line, "%llu\n", (unsigned long long)record->seq);
    int fd = open(r->seen, O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (fd < 0 || write(fd, line, n) != n) {
        snprintf(message, capacity, "cannot write %s", r->seen);
        if (fd >= 0) close(fd);
        return WHEND_FAIL;
    }
    close(fd);
    if (named(record, "derive")) {
        static const char derived[] = "{\"type\":\"when\",\"name\":\"derived\",\"params\":{\"from\":\"recorder\"}}";
        if (r->host->emit(r->host->context, (const uint8_t *)derived, sizeof derived - 1) != WHEND_OK) {
            snprintf(message, capacity, "emit failed");
            return WHEND_FAIL;
        }
    }
    return next(next_context, record->json, record->length);
}

static const whend_plugin description = {
    WHEND_PLUGIN_ABI_VERSION, sizeof(whend_plugin), "recorder", "0.1.0", WHEND_ROLE_PIPELINE, create, destroy, handle,
};

const whend_plugin *whend_plugin_entry(void) { return &description; }
