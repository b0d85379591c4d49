// The prefetch is static inline in include/whend_scan.h; this file gives the target
// the one source file a C target needs.
#include "whend_scan.h"
