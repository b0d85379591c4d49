#ifndef WHEND_PLUGIN_ABI_H
#define WHEND_PLUGIN_ABI_H
#include <stdint.h>
/* Defined once in every plugin built with the Swift SDK: the ABI it was built for. */
extern const uint32_t whend_plugin_abi_version;
#endif
