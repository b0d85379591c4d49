#include "whend_http.h"

#include <curl/curl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct whend_http_stop {
    atomic_int requested;
};

whend_http_stop *whend_http_stop_create(void) { return calloc(1, sizeof(whend_http_stop)); }

void whend_http_stop_request(whend_http_stop *stop) { atomic_store(&stop->requested, 1); }

void whend_http_stop_destroy(whend_http_stop *stop) { free(stop); }

struct whend_http_client {
    CURL *easy;
    /// The socket of the connection the last exchange left open for the next, if any.
    curl_socket_t kept;
};

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static CURLcode global_status = CURLE_FAILED_INIT;

static void global_init(void) { global_status = curl_global_init(CURL_GLOBAL_DEFAULT); }

whend_http_client *whend_http_client_create(void) {
    pthread_once(&global_once, global_init);
    if (global_status != CURLE_OK) return NULL;
    whend_http_client *client = calloc(1, sizeof(whend_http_client));
    if (client == NULL) return NULL;
    client->easy = curl_easy_init();
    client->kept = CURL_SOCKET_BAD;
    if (client->easy == NULL) {
        free(client);
        return NULL;
    }
    return client;
}

void whend_http_client_destroy(whend_http_client *client) {
    if (client == NULL) return;
    curl_easy_cleanup(client->easy);
    free(client);
}

/// Closes every connection the client keeps, with the handle that holds them: 0 if no new
/// handle could be made (the old one stays).
static int forget_connections(whend_http_client *client) {
    CURL *fresh = curl_easy_init();
    if (fresh == NULL) return 0;
    curl_easy_cleanup(client->easy);
    client->easy = fresh;
    return 1;
}

/// What the callbacks of one exchange share.
typedef struct {
    whend_http_stop *stop;
    unsigned char *body;
    size_t capacity;
    size_t length;
    int cut;
    whend_http_answer *answer;
} exchange;

static size_t on_body(char *data, size_t size, size_t count, void *context) {
    exchange *x = context;
    size_t bytes = size * count;
    size_t room = x->capacity - x->length;
    size_t kept = bytes < room ? bytes : room;
    memcpy(x->body + x->length, data, kept);
    x->length += kept;
    if (kept < bytes) {
        // Anything but the whole chunk makes libcurl end the transfer here, before it reads more.
        x->cut = 1;
        return 0;
    }
    return bytes;
}

/// Copies the value of header line `line` into `into` if its name is `name`; a value too long
/// for `into` is dropped whole (a cut Location would name another place).
static void take_header(const char *line, size_t length, const char *name, char *into, size_t capacity) {
    size_t name_length = strlen(name);
    if (length <= name_length || strncasecmp(line, name, name_length) != 0 || line[name_length] != ':') return;
    const char *value = line + name_length + 1;
    const char *end = line + length;
    while (value < end && (*value == ' ' || *value == '\t')) value++;
    while (end > value && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' ' || end[-1] == '\t')) end--;
    size_t value_length = (size_t)(end - value);
    if (value_length >= capacity) {
        into[0] = 0;
        return;
    }
    memcpy(into, value, value_length);
    into[value_length] = 0;
}

static size_t on_header(char *line, size_t size, size_t count, void *context) {
    exchange *x = context;
    size_t length = size * count;
    // A new status line (after a 1xx) starts the headers of another answer.
    if (length >= 5 && strncmp(line, "HTTP/", 5) == 0) {
        x->answer->retry_after[0] = 0;
        x->answer->location[0] = 0;
    }
    take_header(line, length, "Retry-After", x->answer->retry_after, sizeof x->answer->retry_after);
    take_header(line, length, "Location", x->answer->location, sizeof x->answer->location);
    return length;
}

static int on_progress(void *context, curl_off_t down_total, curl_off_t down_now, curl_off_t up_total,
                       curl_off_t up_now) {
    (void)down_total, (void)down_now, (void)up_total, (void)up_now;
    const exchange *x = context;
    return x->stop != NULL && atomic_load(&x->stop->requested) ? 1 : 0;
}

int whend_http_post(
    whend_http_client *client, const char *url, const char *const *headers, size_t header_count,
    const void *body, size_t body_length, long timeout_ms, whend_http_stop *stop,
    unsigned char *answer_body, size_t body_capacity, whend_http_answer *answer) {
    memset(answer, 0, sizeof *answer);
    if (client == NULL) {
        snprintf(answer->problem, sizeof answer->problem, "libcurl could not be set up");
        return WHEND_HTTP_FAILED;
    }
    exchange x = {.stop = stop, .body = answer_body, .capacity = body_capacity, .answer = answer};
    if (client->kept != CURL_SOCKET_BAD) {
        // A kept connection must be quiet: bytes the peer sent unasked (a second answer to the
        // last request, from a confused server or proxy) would be read as this request's
        // answer. libcurl does not look, so the connection is dropped with the handle.
        struct pollfd waiting = {.fd = client->kept, .events = POLLIN | POLLPRI};
        if (poll(&waiting, 1, 0) != 0 && !forget_connections(client)) {
            snprintf(answer->problem, sizeof answer->problem, "libcurl could not be set up");
            return WHEND_HTTP_FAILED;
        }
        client->kept = CURL_SOCKET_BAD;
    }
    CURL *easy = client->easy;
    // Options of a previous exchange do not carry over; its connections do.
    curl_easy_reset(easy);
    struct curl_slist *list = NULL;
    // Without this, libcurl waits up to a second for a "100 Continue" before a large body.
    struct curl_slist *grown = curl_slist_append(list, "Expect:");
    for (size_t i = 0; grown != NULL && i < header_count; i++) {
        list = grown;
        grown = curl_slist_append(list, headers[i]);
    }
    if (grown == NULL) {
        curl_slist_free_all(list);
        snprintf(answer->problem, sizeof answer->problem, "out of memory for the request's headers");
        return WHEND_HTTP_FAILED;
    }
    list = grown;
    char error[CURL_ERROR_SIZE] = {0};
    curl_easy_setopt(easy, CURLOPT_URL, url);
    curl_easy_setopt(easy, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(easy, CURLOPT_FOLLOWLOCATION, 0L);
    // Signals are not libcurl's to use in a multi-threaded process (its DNS timeouts use them).
    curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(easy, CURLOPT_POST, 1L);
    curl_easy_setopt(easy, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_length);
    curl_easy_setopt(easy, CURLOPT_HTTPHEADER, list);
    curl_easy_setopt(easy, CURLOPT_USERAGENT, "whend");
    curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(easy, CURLOPT_WRITEDATA, &x);
    curl_easy_setopt(easy, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(easy, CURLOPT_HEADERDATA, &x);
    curl_easy_setopt(easy, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(easy, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(easy, CURLOPT_XFERINFODATA, &x);
    curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, error);
    CURLcode result = curl_easy_perform(easy);
    curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &answer->status);
    // The list and the error buffer are this call's: no option may point at them afterwards.
    curl_easy_setopt(easy, CURLOPT_HTTPHEADER, NULL);
    curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, NULL);
    curl_slist_free_all(list);
    answer->body_length = x.length;
    int accepted = answer->status >= 200 && answer->status < 300;
    if (result == CURLE_OK && accepted) {
        // Reused for the next batch only after a whole 2xx: after any other answer the peer
        // may still be in the middle of something.
        curl_socket_t socket = CURL_SOCKET_BAD;
        if (curl_easy_getinfo(easy, CURLINFO_ACTIVESOCKET, &socket) == CURLE_OK) client->kept = socket;
        return WHEND_HTTP_ANSWERED;
    }
    forget_connections(client);
    if (result == CURLE_OK) return WHEND_HTTP_ANSWERED;
    // The endpoint said 2xx: it has the batch, however the rest of its answer went (cut past
    // the capacity, trickled past the deadline, broken off, or a stop came). Sending it again
    // would repeat it.
    if (accepted || (result == CURLE_WRITE_ERROR && x.cut && answer->status > 0)) return WHEND_HTTP_CUT;
    if (result == CURLE_ABORTED_BY_CALLBACK) return WHEND_HTTP_STOPPED;
    if (result == CURLE_OPERATION_TIMEDOUT) return WHEND_HTTP_TIMED_OUT;
    snprintf(answer->problem, sizeof answer->problem, "%s", error[0] ? error : curl_easy_strerror(result));
    return WHEND_HTTP_FAILED;
}
