/* A C ingest plugin for the tests: drops events named debug…, rejects "forbidden", passes the
 * rest on, and counts what it saw. Built by the tests with cc; -DGATE_ABI=2 builds it for an
 * ABI this whend does not speak, and -DGATE_MARKER="path" makes whend_plugin_entry leave a
 * file behind, so that a test can tell whether any of its code ran. */
#define _GNU_SOURCE /* memmem */
#include "whend_plugin.h"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef GATE_ABI
#define GATE_ABI WHEND_PLUGIN_ABI_VERSION
#endif

const uint32_t whend_plugin_abi_version = GATE_ABI;

typedef struct {
    const whend_host *host;
} gate;

static void *create(const whend_host *host, const char *config, size_t length, char *error, size_t capacity) {
    (void)config;
    (void)length;
    gate *g = calloc(1, sizeof *g);
    if (!g) {
        snprintf(error, capacity, "out of memory");
        return NULL;
    }
    g->host = host;
    host->log(host->context, WHEND_LOG_INFO, "gate is open");
    return g;
}

static void destroy(void *instance) { free(instance); }

static int contains(const whend_record *r, const char *needle) {
    return memmem(r->json, r->length, needle, strlen(needle)) != NULL;
}

static int handle(void *instance, const whend_record *record, whend_next_fn next, void *next_context, char *message,
                  size_t capacity) {
    gate *g = instance;
    g->host->count(g->host->context, "seen", 1);
    if (contains(record, "\"name\":\"debug")) return WHEND_OK; /* dropped: next is not called */
    if (contains(record, "\"name\":\"forbidden\"")) {
        snprintf(message, capacity, "forbidden events are not allowed here");
        return WHEND_REJECT;
    }
    return next(next_context, record->json, record->length);
}

static const whend_plugin description = {
    GATE_ABI, sizeof(whend_plugin), "gate", "0.1.0", WHEND_ROLE_INGEST, create, destroy, handle,
};

const whend_plugin *whend_plugin_entry(void) {
#ifdef GATE_MARKER
    close(open(GATE_MARKER, O_CREAT | O_WRONLY, 0600));
#endif
    return &description;
}
