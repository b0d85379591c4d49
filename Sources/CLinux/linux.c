#define _GNU_SOURCE
#include <malloc.h>
#include <spawn.h>
#include <stddef.h>
#include <string.h>
#include <errno.h>
#include <sys/socket.h>
#include <unistd.h>

#include "whend_linux.h"

_Static_assert(sizeof(whend_ucred) == sizeof(struct ucred), "whend_ucred is not struct ucred's size");
_Static_assert(offsetof(whend_ucred, pid) == offsetof(struct ucred, pid), "ucred.pid moved");
_Static_assert(offsetof(whend_ucred, uid) == offsetof(struct ucred, uid), "ucred.uid moved");
_Static_assert(offsetof(whend_ucred, gid) == offsetof(struct ucred, gid), "ucred.gid moved");

const int whend_so_peergroups = SO_PEERGROUPS;
_Static_assert(sizeof(gid_t) == sizeof(uint32_t), "gid_t is not 32 bits");

int whend_spawn_file_actions_addclosefrom(posix_spawn_file_actions_t *actions, int lowest) {
    return posix_spawn_file_actions_addclosefrom_np(actions, lowest);
}

const void *whend_memmem(const void *haystack, size_t haystack_length, const void *needle, size_t needle_length) {
    return memmem(haystack, haystack_length, needle, needle_length);
}

int whend_malloc_trim(size_t pad) { return malloc_trim(pad); }

int whend_malloc_arena_max(int arenas) { return mallopt(M_ARENA_MAX, arenas); }

int whend_malloc_thresholds(int mmap_bytes, int trim_bytes) {
    return mallopt(M_MMAP_THRESHOLD, mmap_bytes) & mallopt(M_TRIM_THRESHOLD, trim_bytes);
}

int whend_send_descriptors(int socket, const int *descriptors, int count) {
    if (count < 0 || count > 8) {
        errno = EINVAL;
        return -1;
    }
    union {
        char buffer[CMSG_SPACE(8 * sizeof(int))];
        struct cmsghdr align;
    } control;
    memset(&control, 0, sizeof control);
    char byte = 0;
    struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    struct msghdr message = {.msg_iov = &iov, .msg_iovlen = 1};
    message.msg_control = control.buffer;
    message.msg_controllen = CMSG_SPACE(count * sizeof(int));
    struct cmsghdr *header = CMSG_FIRSTHDR(&message);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(count * sizeof(int));
    memcpy(CMSG_DATA(header), descriptors, count * sizeof(int));
    ssize_t sent;
    do {
        sent = sendmsg(socket, &message, MSG_NOSIGNAL);
    } while (sent < 0 && errno == EINTR);
    return sent == 1 ? 0 : -1;
}

int whend_receive_descriptors(int socket, int *descriptors, int capacity) {
    union {
        char buffer[CMSG_SPACE(8 * sizeof(int))];
        struct cmsghdr align;
    } control;
    char byte;
    struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    struct msghdr message = {.msg_iov = &iov, .msg_iovlen = 1};
    message.msg_control = control.buffer;
    message.msg_controllen = sizeof control.buffer;
    ssize_t got;
    do {
        got = recvmsg(socket, &message, MSG_CMSG_CLOEXEC);
    } while (got < 0 && errno == EINTR);
    if (got == 0) return -2;
    if (got < 0) return -1;
    int count = 0;
    for (struct cmsghdr *header = CMSG_FIRSTHDR(&message); header; header = CMSG_NXTHDR(&message, header)) {
        if (header->cmsg_level != SOL_SOCKET || header->cmsg_type != SCM_RIGHTS) continue;
        int n = (int)((header->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        int *received = (int *)CMSG_DATA(header);
        for (int i = 0; i < n; i++) {
            if (count < capacity) {
                descriptors[count++] = received[i];
            } else {
                close(received[i]);
            }
        }
    }
    return count;
}
