#ifndef WHEND_SCAN_H
#define WHEND_SCAN_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/// Where the next `"` or `\` is in p[0..<n], or n if there is none. Sixteen bytes at a time
/// where the CPU has SSE2 (every x86-64), eight at a time elsewhere: most of a record's bytes
/// are inside strings, and this is how a reader of records crosses them. Static inline, so
/// that Swift inlines it into its callers.
static inline size_t whend_find_quote_or_backslash(const uint8_t *p, size_t n) {
    size_t i = 0;
#if defined(__SSE2__)
    const __m128i quote = _mm_set1_epi8('"');
    const __m128i backslash = _mm_set1_epi8('\\');
    for (; i + 16 <= n; i += 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(p + i));
        int mask = _mm_movemask_epi8(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)));
        if (mask != 0) return i + (size_t)__builtin_ctz((unsigned)mask);
    }
#endif
    const uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        uint64_t q = w ^ (ones * '"'), b = w ^ (ones * '\\');
        uint64_t found = ((q - ones) & ~q & highs) | ((b - ones) & ~b & highs);
        if (found != 0) return i + (size_t)(__builtin_ctzll(found) / 8);
    }
    for (; i < n; i++) {
        if (p[i] == '"' || p[i] == '\\') return i;
    }
    return n;
}

/// Asks the CPU to start loading the cache line at `p`, without waiting for it: the journal's
/// de-duplication table looks up a key a few records ahead of the one it stores, so that the
/// line (a random place in megabytes) is there when it is needed.
static inline void whend_prefetch(const void *p) { __builtin_prefetch(p); }

#endif
