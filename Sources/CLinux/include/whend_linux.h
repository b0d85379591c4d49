#ifndef WHEND_LINUX_H
#define WHEND_LINUX_H

// The Linux calls and types whend needs that Swift's Glibc module does not import: glibc
// declares them only under _GNU_SOURCE, which the module is not built with. linux.c is, and
// checks at compile time that what is declared here matches glibc.

#include <spawn.h>
#include <stddef.h>
#include <stdint.h>

/// Linux's `struct ucred`: the peer of a Unix socket as the kernel tells it (SO_PEERCRED).
typedef struct {
    int32_t pid;
    uint32_t uid;
    uint32_t gid;
} whend_ucred;

/// The supplementary groups of a Unix socket's peer as the kernel took them at connect()
/// (SO_PEERGROUPS, Linux 4.13): room for this many; the kernel refuses (ERANGE) a peer in more.
#define WHEND_PEER_GROUPS_MAX 256
typedef struct {
    uint32_t groups[WHEND_PEER_GROUPS_MAX];
} whend_peer_groups;

/// SO_PEERGROUPS, which Swift's Glibc module does not import.
extern const int whend_so_peergroups;

/// glibc's posix_spawn_file_actions_addclosefrom_np (2.34 and later): every descriptor from
/// `lowest` up is closed in the child. 0, or an error number.
int whend_spawn_file_actions_addclosefrom(posix_spawn_file_actions_t *actions, int lowest);

/// glibc's memmem: where `needle` first occurs in `haystack`, or NULL. It skips ahead with SIMD
/// and a two-way search, where a byte-at-a-time loop compares at every position.
const void *whend_memmem(const void *haystack, size_t haystack_length, const void *needle, size_t needle_length);

/// glibc's malloc_trim: gives free pages back to the system, inside its heaps as well.
int whend_malloc_trim(size_t pad);

/// glibc's mallopt(M_ARENA_MAX, arenas): at most that many malloc arenas in the process. 1 on
/// success.
int whend_malloc_arena_max(int arenas);

/// glibc's mallopt(M_MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD), both fixed (which ends
/// glibc's raising them as large blocks are freed). 1 on success.
int whend_malloc_thresholds(int mmap_bytes, int trim_bytes);

/// Sends `count` descriptors (at most 8) with one byte over the Unix socket `socket`, in one
/// message (SCM_RIGHTS). 0, or -1 with errno set.
int whend_send_descriptors(int socket, const int *descriptors, int count);

/// Receives one message of whend_send_descriptors: the descriptors it carried (close-on-exec)
/// into `descriptors`, at most `capacity` of them. How many came (0: the message came without
/// them, say the receiver had no descriptor free); -2 at the end of the stream; -1 with errno
/// set. Descriptors beyond `capacity` are closed.
int whend_receive_descriptors(int socket, int *descriptors, int capacity);

#endif
