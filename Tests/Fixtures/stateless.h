/* The life cycle of a fixture plugin that keeps no state of its own: the instance is the host
 * (for the services its handle calls), whatever the configuration. */
#ifndef WHEND_FIXTURE_STATELESS_H
#define WHEND_FIXTURE_STATELESS_H
#include "whend_plugin.h"

static void *create(const whend_host *host, const char *config, size_t length, char *error, size_t capacity) {
    (void)config, (void)length, (void)error, (void)capacity;
    return (void *)host;
}

static void destroy(void *instance) { (void)instance; }
#endif
