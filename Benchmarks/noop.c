/* A pipeline plugin that passes every record on and does nothing else: what `whenctl replay`
 * costs without any plugin work, for the benchmark. */
#include "whend_plugin.h"

const uint32_t whend_plugin_abi_version = WHEND_PLUGIN_ABI_VERSION;

static void *create(const whend_host *host, const char *config, size_t length, char *error, size_t capacity) {
    (void)config, (void)length, (void)error, (void)capacity;
    return (void *)host;
}

static void destroy(void *instance) { (void)instance; }

static int handle(void *instance, const whend_record *record, whend_next_fn next, void *context, char *message,
                  size_t capacity) {
    (void)instance, (void)message, (void)capacity;
    return next(context, record->json, record->length);
}

static const whend_plugin plugin = {WHEND_PLUGIN_ABI_VERSION, sizeof(whend_plugin), "noop", "1.0",
                                    WHEND_ROLE_PIPELINE, create, destroy, handle};

const whend_plugin *whend_plugin_entry(void) { return &plugin; }
