/* A C pipeline plugin for the tests of the boundary between a worker and whend. It printf()s a
 * line to its standard output for every record, as a plugin left with a debugging print would
 * (unless its configuration has "quiet"), and passes the record on. A record named "derive"
 * makes it emit a small derived record; one named "huge" a derived record of {"huge_bytes": N}
 * bytes (65 MiB unless said); one named "forge" makes it write, once, a frame of 64 MiB to
 * descriptor {"forge_fd": N} that declares as many derived records as it has bytes, as a broken
 * or hostile worker could; one named "counters" a progress frame there whose counters
 * are 2^64 - 1; one named "forge_cause", once, one well-formed derived frame there, of cause
 * 2^64 - 2 and origin "screen-tracking". With {"forge_pipe": true} instead of a descriptor, the
 * frames go to the worker's pipe to whend wherever it is (the first pipe open for writing from
 * descriptor 3 on), as a plugin that looks for it would find it. A record named "stray" writes
 * garbage to descriptor 3 and closes 3 and 4 (descriptors a plugin may take for free); one named
 * "crash" aborts the worker; one named "emitfail" derives {"name":"attempted"} and then fails,
 * the first two times it is handled. */
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
    size_t huge_bytes;
    int forge_fd, forge_pipe, quiet, fails;
    char forged[4096], forged_cause[4096];
} chatty;

static void *create(const whend_host *host, const char *config, size_t length, char *error, size_t capacity) {
    chatty *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(error, capacity, "out of memory");
        return NULL;
    }
    c->host = host;
    c->huge_bytes = 65u << 20;
    c->forge_fd = -1;
    const char *huge = memmem(config, length, "\"huge_bytes\":", 13);
    if (huge) c->huge_bytes = strtoull(huge + 13, NULL, 10);
    const char *forge = memmem(config, length, "\"forge_fd\":", 11);
    if (forge) c->forge_fd = atoi(forge + 11);
    c->forge_pipe = memmem(config, length, "\"forge_pipe\"", 12) != NULL;
    c->quiet = memmem(config, length, "\"quiet\"", 7) != NULL;
    snprintf(c->forged, sizeof c->forged, "%s/forged", host->state_directory);
    snprintf(c->forged_cause, sizeof c->forged_cause, "%s/forged-cause", host->state_directory);
    return c;
}

static void destroy(void *instance) { free(instance); }

static int named(const whend_record *record, const char *name) {
    char needle[128];
    snprintf(needle, sizeof needle, "\"name\":\"%s\"", name);
    return memmem(record->json, record->length, needle, strlen(needle)) != NULL;
}

static int emit(chatty *c, const char *json, size_t length, char *message, size_t capacity) {
    if (c->host->emit(c->host->context, (const uint8_t *)json, length) != WHEND_OK) {
        snprintf(message, capacity, "emit failed");
        return WHEND_FAIL;
    }
    return WHEND_OK;
}

/* Where forged frames go: the descriptor configured, or the worker's pipe to whend. */
static int forge_target(chatty *c) {
    if (!c->forge_pipe) return c->forge_fd;
    for (int fd = 3; fd < 1024; fd++) {
        struct stat st;
        int flags = fcntl(fd, F_GETFL);
        if (flags >= 0 && (flags & O_ACCMODE) == O_WRONLY && fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode)) return fd;
    }
    return -1;
}

/* A frame as the worker protocol has it: a 4-byte length, the tag of a derived batch (2), the
 * batch number, then a count of records as large as the frame's length, then zeros. */
static void forge(chatty *c) {
    struct stat st;
    int fd = forge_target(c);
    if (fd < 0 || stat(c->forged, &st) == 0) return;
    close(open(c->forged, O_CREAT | O_WRONLY, 0600));
    uint32_t length = 64u << 20;
    static uint8_t chunk[1 << 16];
    memset(chunk, 0, sizeof chunk);
    memcpy(chunk, &length, 4);
    chunk[4] = 2;
    uint64_t batch = 1, count = length;
    memcpy(chunk + 5, &batch, 8);
    memcpy(chunk + 13, &count, 8);
    size_t left = 4 + (size_t)length;
    int first = 1;
    while (left > 0) {
        size_t n = left < sizeof chunk ? left : sizeof chunk;
        if (write(fd, chunk, n) != (ssize_t)n) return;
        if (first) {
            memset(chunk, 0, 21);
            first = 0;
        }
        left -= n;
    }
}

/* A progress frame (tag 1): the cursor, then failures, dead letters and skipped records. */
static void forge_progress(chatty *c) {
    int fd = forge_target(c);
    if (fd < 0) return;
    uint8_t frame[4 + 1 + 32];
    uint32_t length = sizeof frame - 4;
    uint64_t cursor = 1, most = UINT64_MAX;
    memcpy(frame, &length, 4);
    frame[4] = 1;
    memcpy(frame + 5, &cursor, 8);
    memcpy(frame + 13, &most, 8);
    memcpy(frame + 21, &most, 8);
    memcpy(frame + 29, &most, 8);
    if (write(fd, frame, sizeof frame) != (ssize_t)sizeof frame) return;
}

/* One derived batch (tag 2) of one record: batch 1, count 1, then its cause, its origin and
 * its JSON, each run with a 4-byte length. */
static void forge_cause(chatty *c) {
    struct stat st;
    int fd = forge_target(c);
    if (fd < 0 || stat(c->forged_cause, &st) == 0) return;
    close(open(c->forged_cause, O_CREAT | O_WRONLY, 0600));
    static const char origin[] = "screen-tracking", json[] = "{\"type\":\"screen\",\"name\":\"FORGED\"}";
    uint8_t frame[256], *p = frame + 4;
    uint64_t batch = 999999, count = 1, cause = UINT64_MAX - 1;
    uint32_t n;
    *p++ = 2;
    memcpy(p, &batch, 8), p += 8;
    memcpy(p, &count, 8), p += 8;
    memcpy(p, &cause, 8), p += 8;
    n = sizeof origin - 1, memcpy(p, &n, 4), p += 4, memcpy(p, origin, n), p += n;
    n = sizeof json - 1, memcpy(p, &n, 4), p += 4, memcpy(p, json, n), p += n;
    uint32_t length = (uint32_t)(p - frame - 4);
    memcpy(frame, &length, 4);
    if (write(fd, frame, (size_t)(p - frame)) != p - frame) return;
}

static int handle(void *instance, const whend_record *record, whend_next_fn next, void *next_context, char *message,
                  size_t capacity) {
    chatty *c = instance;
    if (!c->quiet) {
        printf("chatty: handled _seq %llu\n", (unsigned long long)record->seq);
        fflush(stdout);
    }
    if (named(record, "derive")) {
        static const char derived[] = "{\"type\":\"when\",\"name\":\"derived\",\"params\":{\"from\":\"chatty\"}}";
        if (emit(c, derived, sizeof derived - 1, message, capacity) != WHEND_OK) return WHEND_FAIL;
    }
    if (named(record, "huge")) {
        static const char head[] = "{\"type\":\"when\",\"name\":\"bulk\",\"params\":{\"pad\":\"";
        static const char tail[] = "\"}}";
        size_t total = c->huge_bytes;
        char *json = malloc(total);
        if (!json) {
            snprintf(message, capacity, "out of memory");
            return WHEND_FAIL;
        }
        memcpy(json, head, sizeof head - 1);
        memset(json + sizeof head - 1, 'x', total - (sizeof head - 1) - (sizeof tail - 1));
        memcpy(json + total - (sizeof tail - 1), tail, sizeof tail - 1);
        int rc = emit(c, json, total, message, capacity);
        free(json);
        if (rc != WHEND_OK) return WHEND_FAIL;
    }
    if (named(record, "forge")) forge(c);
    if (named(record, "counters")) forge_progress(c);
    if (named(record, "forge_cause")) forge_cause(c);
    if (named(record, "stray")) {
        if (write(3, "oops\n", 5) < 0) { /* nothing there: fine */
        }
        close(3);
        close(4);
    }
    if (named(record, "crash")) abort();
    if (named(record, "emitfail")) {
        static const char attempted[] = "{\"type\":\"when\",\"name\":\"attempted\"}";
        if (emit(c, attempted, sizeof attempted - 1, message, capacity) != WHEND_OK) return WHEND_FAIL;
        if (c->fails++ < 2) {
            snprintf(message, capacity, "failing on purpose, attempt %d", c->fails);
            return WHEND_FAIL;
        }
    }
    return next(next_context, record->json, record->length);
}

static const whend_plugin description = {
    WHEND_PLUGIN_ABI_VERSION, sizeof(whend_plugin), "chatty", "0.1.0", WHEND_ROLE_PIPELINE, create, destroy, handle,
};

const whend_plugin *whend_plugin_entry(void) { return &description; }
