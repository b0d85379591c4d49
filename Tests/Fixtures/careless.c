#define _GNU_SOURCE /* memmem */
/* A C pipeline plugin for the tests that takes descriptors 3 and 4 for free ones of its own in
 * every call: its `create`, and each `handle`, writes a line to each and closes both. It
 * derives one record per `when` record ({"type":"seen","of":SEQ}) and passes every record on. */
#include "whend_plugin.h"
#include <stdio.h>
#include <string.h>
#include <unistd.h>

const uint32_t whend_plugin_abi_version = WHEND_PLUGIN_ABI_VERSION;

static void misuse(void) {
    static const char junk[] = "written by a careless plugin\n";
    if (write(3, junk, sizeof junk - 1) < 0) { /* nothing to do */ }
    if (write(4, junk, sizeof junk - 1) < 0) { /* nothing to do */ }
    close(3);
    close(4);
}

static void *create(const whend_host *host, const char *config, size_t length, char *error, size_t capacity) {
    (void)config, (void)length, (void)error, (void)capacity;
    misuse();
    return (void *)host;
}

static void destroy(void *instance) { (void)instance; }

static int handle(void *instance, const whend_record *record, whend_next_fn next, void *next_context, char *message,
                  size_t capacity) {
    const whend_host *host = instance;
    (void)message, (void)capacity;
    misuse();
    static const char when[] = "\"type\":\"when\"";
    if (memmem(record->json, record->length, when, sizeof when - 1) && !memmem(record->json, record->length, "\"_origin\"", 9)) {
        char derived[64];
        int n = snprintf(derived, sizeof derived, "{\"type\":\"seen\",\"of\":%llu}", (unsigned long long)record->seq);
        if (host->emit(host->context, (const uint8_t *)derived, (size_t)n) != WHEND_OK) return WHEND_FAIL;
    }
    return next(next_context, record->json, record->length);
}

static const whend_plugin description = {
    WHEND_PLUGIN_ABI_VERSION, sizeof(whend_plugin), "careless", "0.1.0", WHEND_ROLE_PIPELINE, create, destroy, handle,
};

const whend_plugin *whend_plugin_entry(void) { return &description; }
