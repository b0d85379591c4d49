#ifndef WHEND_SCAN_H
#define WHEND_SCAN_H

/// Asks the CPU to start loading the cache line at `p`, without waiting for it: the journal's
/// de-duplication table looks up a key a few records ahead of the one it stores, so that the
/// line (a random place in megabytes) is there when it is needed.
static inline void whend_prefetch(const void *p) { __builtin_prefetch(p); }

#endif
