/*
 * whend plugin ABI, version 1.
 *
 * A plugin is a shared library that exports two symbols:
 *
 *   const uint32_t whend_plugin_abi_version;          data: the ABI it was built for
 *   const whend_plugin *whend_plugin_entry(void);      its description and entry points
 *
 * The host reads whend_plugin_abi_version with dlsym before it calls anything, refuses the
 * plugin if it is not WHEND_PLUGIN_ABI_VERSION, then calls whend_plugin_entry and checks
 * struct_size before it reads any other field. Structs only ever grow at their end; a host
 * never reads past the struct_size a plugin declares, a plugin never past the host's.
 *
 * Records are JSON objects as stored in the journal (PROTOCOL.md §7), passed as bytes that are
 * valid only during the call. A middleware handles a record and may call next() with it, or
 * with a changed record, once (or not at all: the record is dropped), as the seed's middleware
 * does.
 *
 * A record is in whend's canonical form, whatever its sender wrote: one line, members
 * "key":value with no whitespace between tokens, every string spelled one way (escapes resolved;
 * then only \" \\ \n \r \t and \u00xx, lower case, for other control characters are written as
 * escapes, all else as UTF-8; an unpaired surrogate stays a \u escape). So "app": "x" and
 * "app":"\u0078" both arrive as "app":"x". Look a field up at the record's top level, not at the
 * first place its bytes occur: the same key may be nested (in context, in params) before it
 * (docs/writing-plugins.md, "In C", has a lookup). What a plugin passes to next() or emit() may be any valid
 * JSON object with a string "type", pretty-printed or not: whend stores it in the same form, on
 * one line, or refuses it naming the plugin; its members whose keys begin with '_' are dropped.
 */
#ifndef WHEND_PLUGIN_H
#define WHEND_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define WHEND_PLUGIN_ABI_VERSION 1u

/* Roles a plugin may take (a bit set). */
#define WHEND_ROLE_INGEST 1u   /* in the daemon, before the journal: may change, drop or reject */
#define WHEND_ROLE_PIPELINE 2u /* in a pipeline worker, after the journal, from a cursor */
/* A pipeline stage that finishes records later (an asynchronous publish): returning WHEND_OK
 * from handle only accepts the record, and the pipeline's cursor passes it once the plugin
 * calls host->complete with its _seq. Records accepted but never completed are handled again
 * after a restart. At most one stage of a pipeline may be deferred. */
#define WHEND_ROLE_DEFERRED 4u

/* What handle() returns. */
#define WHEND_OK 0     /* handled: next() was called, or the record is dropped on purpose */
#define WHEND_REJECT 1 /* ingest only: refuse the event; the client gets `rejected` and message */
#define WHEND_FAIL 2   /* the plugin could not handle it now (a pipeline retries with backoff) */

/* Log levels for whend_host.log. */
#define WHEND_LOG_DEBUG 0
#define WHEND_LOG_INFO 1
#define WHEND_LOG_WARNING 2
#define WHEND_LOG_ERROR 3

typedef struct whend_record {
    const uint8_t *json; /* one JSON object, not NUL-terminated */
    size_t length;
    uint64_t seq; /* the record's _seq; 0 before the journal (ingest) */
} whend_record;

/* The continuation: pass the record (or a changed one) on. Returns WHEND_OK, or what a later
 * plugin returned. */
typedef int (*whend_next_fn)(void *next_context, const uint8_t *json, size_t length);

/* Services the host offers a plugin instance; valid until destroy() returns. */
typedef struct whend_host {
    uint32_t abi_version;
    uint32_t struct_size;
    void *context;
    /* A line in whend's log, attributed to the plugin. */
    void (*log)(void *context, int level, const char *message);
    /* Appends a derived record (a JSON object) to the journal with _origin and _cause set by
     * the host. Returns WHEND_OK or WHEND_FAIL. What one record derives may come to at most
     * 64 MiB: past that, emit fails, nothing derived from the record is stored, and the record
     * goes to the pipeline's dead letters. What a handle() that returns WHEND_REJECT or
     * WHEND_FAIL emitted is discarded: only the attempt that passes the record derives. (A
     * plugin's stdout and stderr go to whend's log; descriptors 3 and 4 are /dev/null as each
     * library loads and each instance is created, and nothing of whend's is ever there.) */
    int (*emit)(void *context, const uint8_t *json, size_t length);
    /* Adds delta to the plugin's counter `name` (shown by whenctl plugins and in metrics). */
    void (*count)(void *context, const char *name, int64_t delta);
    /* A directory that is this instance's own, kept across restarts: <state>/plugins/<name>,
     * or <name>@<pipeline> for the instances in a plugin's further pipelines. */
    const char *state_directory;
    /* Added within ABI 1 (present when struct_size covers it): a WHEND_ROLE_DEFERRED plugin
     * says that record `seq` is done. Callable from any thread. */
    void (*complete)(void *context, uint64_t seq);
    /* Added within ABI 1 (present when struct_size covers it): a WHEND_ROLE_DEFERRED plugin that
     * finishes records in the order it was given them says that every record it was given up to
     * and including `seq` is done: one call for many. Callable from any thread. */
    void (*complete_through)(void *context, uint64_t seq);
} whend_host;

typedef struct whend_plugin {
    uint32_t abi_version;
    uint32_t struct_size;
    const char *name;    /* [a-z0-9_-]+ */
    const char *version; /* free text, e.g. "1.2.0" */
    uint32_t roles;      /* WHEND_ROLE_* */
    /* Creates an instance from its configuration (a JSON object, "{}" when none). On failure
     * returns NULL and writes why into error (NUL-terminated, at most error_capacity bytes).
     * Refuse here a configuration the instance cannot work with: `whend --check-config` and a
     * reload create an instance first, in a short-lived process of their own with an empty
     * scratch state directory, destroy it without giving it a record, and refuse the
     * configuration with this message. So create may run more often than records are handled,
     * and must not act on anything outside its state directory that a running instance owns. */
    void *(*create)(const whend_host *host, const char *config_json, size_t config_length, char *error,
                    size_t error_capacity);
    void (*destroy)(void *instance);
    /* Handles one record. On WHEND_REJECT or WHEND_FAIL, writes why into message. Calls for
     * one instance never overlap: the host serialises them. */
    int (*handle)(void *instance, const whend_record *record, whend_next_fn next, void *next_context,
                  char *message, size_t message_capacity);
    /* Added within ABI 1 (read only when struct_size covers them; either may be NULL): the
     * instance's state, saved by a pipeline's worker together with its cursor, so that a
     * restarted worker resumes with the state it had there instead of an empty one.
     * snapshot() hands the state to write() (in one call or several) and returns WHEND_OK, or
     * WHEND_FAIL with nothing saved. restore(), called after create() and before any record,
     * takes what snapshot() wrote (for the same plugin version) and returns WHEND_OK, or
     * WHEND_FAIL with why in error: the worker then rebuilds the state from the journal. */
    int (*snapshot)(void *instance, void (*write)(void *write_context, const uint8_t *bytes, size_t length),
                    void *write_context);
    int (*restore)(void *instance, const uint8_t *bytes, size_t length, char *error, size_t error_capacity);
    /* Added within ABI 1 (read only when struct_size covers it; may be NULL): makes durable
     * what the instance wrote or holds for the records it has handled, and returns WHEND_OK,
     * or WHEND_FAIL with why in error. Durable means on stable storage, as the cursor is: a
     * buffered write is written AND synced (fdatasync/fsync; a new file's directory synced
     * too), so that neither a SIGKILL nor a power cut loses it once flush returned WHEND_OK.
     * A pipeline's worker calls it before it saves its cursor or a snapshot (at most every
     * tenth of a second while records flow), and moves neither past those records until it
     * succeeds: a plugin may then batch its writes, and sync once per flush rather than once
     * per record, and still lose nothing. A plugin whose writes are each durable when made
     * (written beside, synced, renamed) or that derives only records needs none. */
    int (*flush)(void *instance, char *error, size_t error_capacity);
} whend_plugin;

typedef const whend_plugin *(*whend_plugin_entry_fn)(void);

#ifdef __cplusplus
}
#endif

#endif
