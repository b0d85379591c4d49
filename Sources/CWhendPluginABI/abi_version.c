#include "whend_plugin.h"
#include "whend_plugin_abi.h"

/* Exported as data so that the host reads it before it calls any of the plugin's code. */
__attribute__((visibility("default"))) const uint32_t whend_plugin_abi_version = WHEND_PLUGIN_ABI_VERSION;
