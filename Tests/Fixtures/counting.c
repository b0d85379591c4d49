/* A C plugin for the tests whose counters (host->count) are as careless as a plugin's can be:
 * for every record it counts "records" once, adds INT64_MAX to "huge" and INT64_MIN to "tiny"
 * (past what a counter holds from the second record on), counts a name never used before
 * (one per record, without end), a name of 1000 bytes, a name that quotes its configuration
 * (which may hold a secret), 60 bytes that are not UTF-8, a name of 128 bytes and one of 200
 * that begins with it, an empty name, one with a newline and a terminal escape, and one too long
 * whose configuration's token straddles the 128th byte. Ingest middleware and a pipeline stage both; it passes every record
 * on unchanged. */
#include "whend_plugin.h"
#include <stdint.h>
#include <stdio.h>
#include <string.h>

const uint32_t whend_plugin_abi_version = WHEND_PLUGIN_ABI_VERSION;

typedef struct {
    const whend_host *host;
    unsigned long long handled;
    char long_name[1001];
    char config_name[128];
    char invalid_name[61];
    char prefix_name[129];
    char extended_name[201];
    char straddling_name[256];
} counting;

static counting instances[8];
static int created;

static void *create(const whend_host *host, const char *config, size_t length, char *error, size_t capacity) {
    if (created == 8) {
        snprintf(error, capacity, "at most 8 instances");
        return NULL;
    }
    counting *c = &instances[created++];
    c->host = host;
    c->handled = 0;
    memset(c->long_name, 'x', 1000);
    c->long_name[1000] = 0;
    snprintf(c->config_name, sizeof c->config_name, "config %.*s", (int)(length < 100 ? length : 100), config);
    memset(c->invalid_name, 0xff, 60);
    c->invalid_name[60] = 0;
    memset(c->prefix_name, 'A', 128);
    c->prefix_name[128] = 0;
    memset(c->extended_name, 'A', 200);
    c->extended_name[200] = 0;
    /* Too long to count, its configuration where the 128-byte cut falls. */
    memset(c->straddling_name, 'y', 110);
    snprintf(c->straddling_name + 110, sizeof c->straddling_name - 110, "%.*s", (int)(length < 140 ? length : 140),
             config);
    return c;
}

static void destroy(void *instance) { (void)instance; }

static int handle(void *instance, const whend_record *record, whend_next_fn next, void *next_context, char *message,
                  size_t capacity) {
    (void)message, (void)capacity;
    counting *c = instance;
    const whend_host *host = c->host;
    char name[64];
    snprintf(name, sizeof name, "session-%llu", c->handled++);
    /* First of the names not counted: the one whend warns about. */
    host->count(host->context, c->straddling_name, 1);
    host->count(host->context, "records", 1);
    host->count(host->context, "huge", INT64_MAX);
    host->count(host->context, "tiny", INT64_MIN);
    host->count(host->context, name, 1);
    host->count(host->context, c->long_name, 1);
    host->count(host->context, c->config_name, 1);
    host->count(host->context, c->invalid_name, 1);
    host->count(host->context, c->prefix_name, 1);
    host->count(host->context, c->extended_name, 1000);
    host->count(host->context, "", 1);
    host->count(host->context, "new\nline\x1b[2J", 1);
    return next(next_context, record->json, record->length);
}

static const whend_plugin description = {
    WHEND_PLUGIN_ABI_VERSION, sizeof(whend_plugin), "counting", "0.1.0", WHEND_ROLE_INGEST | WHEND_ROLE_PIPELINE,
    create, destroy, handle,
};

const whend_plugin *whend_plugin_entry(void) { return &description; }
