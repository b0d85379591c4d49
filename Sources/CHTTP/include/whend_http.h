#ifndef WHEND_HTTP_H
#define WHEND_HTTP_H

// One HTTP POST with libcurl's easy interface, on the calling thread, for the built-in plugins
// that deliver batches (analytics, otlp). Each limit is enforced inside libcurl's own calls, on
// that thread: the deadline (CURLOPT_TIMEOUT_MS), the cut of a body past its capacity (the
// write callback refuses the rest) and a stop (the progress callback). Nothing waits on
// another thread's queue to take effect, whatever the load.

#include <stddef.h>

/// A stop another thread can ask for: an exchange under way aborts at libcurl's next progress
/// call (several a second while it waits, each time data moves).
typedef struct whend_http_stop whend_http_stop;
whend_http_stop *whend_http_stop_create(void);
void whend_http_stop_request(whend_http_stop *stop);
void whend_http_stop_destroy(whend_http_stop *stop);

/// A connection kept from one exchange to the next (only after a whole 2xx, and only while the
/// peer has sent nothing unasked on it); one thread at a time.
typedef struct whend_http_client whend_http_client;
whend_http_client *whend_http_client_create(void);
void whend_http_client_destroy(whend_http_client *client);

enum {
    /// An answer came: `status` holds it.
    WHEND_HTTP_ANSWERED = 0,
    /// An answer came but not whole: a body longer than `body_capacity` (its first
    /// `body_capacity` bytes are kept and the rest was not read), or a 2xx whose body then
    /// passed the deadline or broke off. `status` holds it.
    WHEND_HTTP_CUT = 1,
    /// Nothing complete within the deadline.
    WHEND_HTTP_TIMED_OUT = 2,
    /// The stop was asked for.
    WHEND_HTTP_STOPPED = 3,
    /// No answer (no connection, a TLS failure, a broken answer): `problem` says what.
    WHEND_HTTP_FAILED = 4,
};

typedef struct {
    long status;
    size_t body_length;
    /// The answer's Retry-After and Location, empty when absent (or too long to be usable).
    char retry_after[256];
    char location[4096];
    char problem[512];
} whend_http_answer;

/// POSTs `body` to `url` (http or https only; redirects are not followed) with `headers`
/// ("Name: value" each), within `timeout_ms` for the whole exchange. At most `body_capacity`
/// bytes of the answer's body go to `answer_body`. Returns one of the WHEND_HTTP_ values.
int whend_http_post(
    whend_http_client *client, const char *url, const char *const *headers, size_t header_count,
    const void *body, size_t body_length, long timeout_ms, whend_http_stop *stop,
    unsigned char *answer_body, size_t body_capacity, whend_http_answer *answer);

#endif
