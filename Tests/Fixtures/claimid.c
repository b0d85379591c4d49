/* A C pipeline plugin for the tests of resends: for every record named "claim" it derives a
 * record that carries an app, a session and an id — {"app":"victim","session":"s","id":"dN"},
 * N the claim's _seq — as a client's event could, and passes the record on. */
#define _GNU_SOURCE /* memmem */
#include "stateless.h"
#include <stdio.h>
#include <string.h>

const uint32_t whend_plugin_abi_version = WHEND_PLUGIN_ABI_VERSION;


static int handle(void *instance, const whend_record *record, whend_next_fn next, void *next_context, char *message,
                  size_t capacity) {
    const whend_host *host = instance;
    static const char needle[] = "\"name\":\"claim\"";
    if (memmem(record->json, record->length, needle, sizeof needle - 1)) {
        char derived[160];
        int n = snprintf(derived, sizeof derived,
                         "{\"type\":\"when\",\"name\":\"claimed\",\"app\":\"victim\",\"session\":\"s\",\"id\":\"d%llu\"}",
                         (unsigned long long)record->seq);
        if (host->emit(host->context, (const uint8_t *)derived, (size_t)n) != WHEND_OK) {
            snprintf(message, capacity, "emit failed");
            return WHEND_FAIL;
        }
    }
    return next(next_context, record->json, record->length);
}

static const whend_plugin description = {
    WHEND_PLUGIN_ABI_VERSION, sizeof(whend_plugin), "claimid", "0.1.0", WHEND_ROLE_PIPELINE, create, destroy, handle,
};

const whend_plugin *whend_plugin_entry(void) { return &description; }
