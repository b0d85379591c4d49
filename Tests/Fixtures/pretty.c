/* A C plugin for the tests that writes JSON as a pretty-printing encoder (cJSON_Print and the
 * like) does: line breaks, tabs and spaces between tokens, escapes spelled out. As ingest
 * middleware it passes each event on with one member more, "pretty", written over four lines.
 * Built with -DPRETTY_PIPELINE it is a pipeline plugin instead, deriving such a record from
 * every record named "derive". */
#include "stateless.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const uint32_t whend_plugin_abi_version = WHEND_PLUGIN_ABI_VERSION;

static const char pretty_member[] = "\n\t\"pretty\" :{\n\t\"a\": [1,\n 2],\r\n \"s\": \"caf\\u00e9 \\/ \\ud83d\\ude00\"\n},";


static int handle(void *instance, const whend_record *record, whend_next_fn next, void *next_context, char *message,
                  size_t capacity) {
#ifdef PRETTY_PIPELINE
    const whend_host *host = instance;
    static const char needle[] = "\"name\":\"derive\"";
    int derive = 0;
    for (size_t i = 0; i + sizeof needle - 1 <= record->length; i++) {
        if (memcmp(record->json + i, needle, sizeof needle - 1) == 0) {
            derive = 1;
            break;
        }
    }
    if (derive) {
        char out[512];
        int n = snprintf(out, sizeof out,
                         "{\n  \"type\" : \"when\",\n  \"name\": \"derived\",\n  \"params\": {%s\n\t\"from\": %llu\n  }\n}\n",
                         pretty_member, (unsigned long long)record->seq);
        if (host->emit(host->context, (const uint8_t *)out, (size_t)n) != WHEND_OK) {
            snprintf(message, capacity, "emit failed");
            return WHEND_FAIL;
        }
    }
    return next(next_context, record->json, record->length);
#else
    (void)instance, (void)message, (void)capacity;
    /* {  +  the pretty member  +  the rest of the record after its brace */
    size_t extra = sizeof pretty_member - 1;
    uint8_t *out = malloc(record->length + extra + 1);
    if (!out) return WHEND_FAIL;
    out[0] = '{';
    memcpy(out + 1, pretty_member, extra);
    memcpy(out + 1 + extra, record->json + 1, record->length - 1);
    int r = next(next_context, out, record->length + extra);
    free(out);
    return r;
#endif
}

static const whend_plugin description = {
    WHEND_PLUGIN_ABI_VERSION,
    sizeof(whend_plugin),
    "pretty",
    "0.1.0",
#ifdef PRETTY_PIPELINE
    WHEND_ROLE_PIPELINE,
#else
    WHEND_ROLE_INGEST,
#endif
    create,
    destroy,
    handle,
};

const whend_plugin *whend_plugin_entry(void) { return &description; }
