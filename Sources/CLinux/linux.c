#define _GNU_SOURCE
#include <malloc.h>
#include <spawn.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>

#include "whend_linux.h"

_Static_assert(sizeof(whend_ucred) == sizeof(struct ucred), "whend_ucred is not struct ucred's size");
_Static_assert(offsetof(whend_ucred, pid) == offsetof(struct ucred, pid), "ucred.pid moved");
_Static_assert(offsetof(whend_ucred, uid) == offsetof(struct ucred, uid), "ucred.uid moved");
_Static_assert(offsetof(whend_ucred, gid) == offsetof(struct ucred, gid), "ucred.gid moved");

int whend_spawn_file_actions_addclosefrom(posix_spawn_file_actions_t *actions, int lowest) {
    return posix_spawn_file_actions_addclosefrom_np(actions, lowest);
}

const void *whend_memmem(const void *haystack, size_t haystack_length, const void *needle, size_t needle_length) {
    return memmem(haystack, haystack_length, needle, needle_length);
}

int whend_malloc_trim(size_t pad) { return malloc_trim(pad); }
