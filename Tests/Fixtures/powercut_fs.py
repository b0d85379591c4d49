#!/usr/bin/python3
"""A file system that forgets what was not synced, for power-cut tests.

    powercut_fs.py BACKING MOUNTPOINT

Mounts a FUSE file system at MOUNTPOINT whose durable state lives in BACKING, with LazyFS's
semantics: data written but not yet fsync'ed (or fdatasync'ed) lives only in this process's
memory, and so do creates, renames, unlinks and mkdirs until their directory is fsync'ed. A
power cut is: SIGKILL this process, then lazily unmount MOUNTPOINT (`umount -l`). Everything not
synced is gone; mounting BACKING again shows exactly what was durable.

While the file BACKING/fail-syncs exists, every file sync fails with EIO as a failed writeback
does on Linux: what it covered is dropped from the durable state, yet stays readable, and a
later sync reports success without writing it.

While the file BACKING/hold exists, each write and each sync of a journal segment (a `.zst`
file) whose kind ("write", "fsync") the file names waits, as on a slow disk, and
BACKING/held names the kind of the one waiting: a test can order what the threads of whend do.
Since requests are served one at a time, everything else on the mount waits too.

BACKING holds `tree.json` (the durable directory tree: each directory's entries, by inode) and
`data/INODE` (each file's durable content). Stricter than ext4 (whose metadata journal usually
keeps a create) on purpose: a program that keeps its promises only by luck fails here.

Needs Debian's python3-fusepy (libfuse2) and /dev/fuse. Single-threaded: the kernel's requests
are served one at a time, so no locking is needed.
"""

import errno
import json
import os
import stat
import sys
import time

try:
    from fusepy import FUSE, FuseOSError, Operations  # Debian's python3-fusepy
except ImportError:
    from fuse import FUSE, FuseOSError, Operations  # fusepy from PyPI


class Node:
    def __init__(self, ino, kind, mode):
        self.ino = ino
        self.kind = kind  # "d" or "f"
        self.mode = mode
        self.data = bytearray()  # a file's content as programs see it
        self.dirty_from = None  # first byte changed since the last sync
        self.children = {}  # a directory's entries as programs see them: name -> ino
        self.mtime = time.time()


class PowerCutFS(Operations):
    def __init__(self, backing):
        self.backing = backing
        self.data_dir = os.path.join(backing, "data")
        os.makedirs(self.data_dir, exist_ok=True)
        self.nodes = {}
        self.durable_tree = {}  # dir ino -> {name: ino}, as last synced
        self.durable_kinds = {}  # ino -> [kind, mode]
        self.handles = {}
        self.next_handle = 1
        self.load()

    # The durable state ------------------------------------------------------------------------

    def load(self):
        path = os.path.join(self.backing, "tree.json")
        if os.path.exists(path):
            with open(path) as f:
                saved = json.load(f)
            self.durable_tree = {int(k): {n: int(i) for n, i in v.items()} for k, v in saved["tree"].items()}
            self.durable_kinds = {int(k): v for k, v in saved["kinds"].items()}
            self.next_ino = saved["next_ino"]
        else:
            self.durable_tree = {1: {}}
            self.durable_kinds = {1: ["d", 0o755]}
            self.next_ino = 2
            self.save_tree()
        # What a mount shows: the tree reachable from the root, as synced.
        reachable = set()
        stack = [1]
        while stack:
            ino = stack.pop()
            if ino in reachable or ino not in self.durable_kinds:
                continue
            reachable.add(ino)
            kind, mode = self.durable_kinds[ino]
            node = Node(ino, kind, mode)
            if kind == "d":
                entries = self.durable_tree.get(ino, {})
                node.children = {n: i for n, i in entries.items() if i in self.durable_kinds}
                stack.extend(node.children.values())
            else:
                try:
                    with open(os.path.join(self.data_dir, str(ino)), "rb") as f:
                        node.data = bytearray(f.read())
                except FileNotFoundError:
                    pass  # named durably, its content never synced: empty
            self.nodes[ino] = node
        # Content of files no durable name reaches is gone for good.
        for name in os.listdir(self.data_dir):
            if int(name) not in reachable:
                os.unlink(os.path.join(self.data_dir, name))

    def save_tree(self):
        saved = {"tree": self.durable_tree, "kinds": self.durable_kinds, "next_ino": self.next_ino}
        path = os.path.join(self.backing, "tree.json")
        with open(path + ".tmp", "w") as f:
            json.dump(saved, f)
            f.flush()
            os.fsync(f.fileno())
        os.rename(path + ".tmp", path)
        fd = os.open(self.backing, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)

    def sync_file(self, node):
        if node.kind != "f" or node.dirty_from is None:
            return
        path = os.path.join(self.data_dir, str(node.ino))
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            start = min(node.dirty_from, len(node.data))
            os.pwrite(fd, bytes(node.data[start:]), start)
            os.ftruncate(fd, len(node.data))
            os.fsync(fd)
        finally:
            os.close(fd)
        node.dirty_from = None

    def sync_dir(self, node):
        self.durable_tree[node.ino] = dict(node.children)
        for name, ino in node.children.items():
            child = self.nodes[ino]
            self.durable_kinds[ino] = [child.kind, child.mode]
            if child.kind == "d":
                self.durable_tree.setdefault(ino, {})
        self.save_tree()

    # Paths ------------------------------------------------------------------------------------

    def resolve(self, path):
        node = self.nodes[1]
        for part in path.strip("/").split("/"):
            if not part:
                continue
            if node.kind != "d" or part not in node.children:
                raise FuseOSError(errno.ENOENT)
            node = self.nodes[node.children[part]]
        return node

    def parent_of(self, path):
        head, name = os.path.split(path.rstrip("/"))
        parent = self.resolve(head or "/")
        if parent.kind != "d":
            raise FuseOSError(errno.ENOTDIR)
        return parent, name

    def node_for(self, path, fh):
        if fh and fh in self.handles:
            return self.handles[fh]
        return self.resolve(path)

    def make(self, path, kind, mode):
        parent, name = self.parent_of(path)
        if name in parent.children:
            raise FuseOSError(errno.EEXIST)
        node = Node(self.next_ino, kind, stat.S_IMODE(mode))
        self.next_ino += 1
        self.nodes[node.ino] = node
        parent.children[name] = node.ino
        parent.mtime = time.time()
        return node

    def handle(self, node):
        fh = self.next_handle
        self.next_handle += 1
        self.handles[fh] = node
        return fh

    # Operations -------------------------------------------------------------------------------

    def getattr(self, path, fh=None):
        node = self.node_for(path, fh)
        kind = stat.S_IFDIR if node.kind == "d" else stat.S_IFREG
        size = len(node.data) if node.kind == "f" else 4096
        return {
            "st_mode": kind | node.mode,
            "st_nlink": 2 if node.kind == "d" else 1,
            "st_size": size,
            "st_blocks": (size + 511) // 512,
            "st_uid": os.getuid(),
            "st_gid": os.getgid(),
            "st_atime": node.mtime,
            "st_mtime": node.mtime,
            "st_ctime": node.mtime,
        }

    def readdir(self, path, fh):
        return [".", ".."] + list(self.resolve(path).children)

    def mkdir(self, path, mode):
        self.make(path, "d", mode)

    def rmdir(self, path):
        parent, name = self.parent_of(path)
        node = self.resolve(path)
        if node.kind != "d":
            raise FuseOSError(errno.ENOTDIR)
        if node.children:
            raise FuseOSError(errno.ENOTEMPTY)
        del parent.children[name]

    def create(self, path, mode, fi=None):
        return self.handle(self.make(path, "f", mode))

    def open(self, path, flags):
        node = self.resolve(path)
        if node.kind == "d" and flags & (os.O_WRONLY | os.O_RDWR):
            raise FuseOSError(errno.EISDIR)
        return self.handle(node)

    def opendir(self, path):
        return self.handle(self.resolve(path))

    def release(self, path, fh):
        self.handles.pop(fh, None)

    def releasedir(self, path, fh):
        self.handles.pop(fh, None)

    def read(self, path, size, offset, fh):
        return bytes(self.node_for(path, fh).data[offset : offset + size])

    def hold(self, kind, path):
        flag = os.path.join(self.backing, "hold")
        if not (path or "").endswith(".zst"):
            return
        held = os.path.join(self.backing, "held")
        while True:
            try:
                with open(flag) as f:
                    if kind not in f.read().split():
                        break
            except FileNotFoundError:
                break
            if not os.path.exists(held):
                with open(held + ".tmp", "w") as f:
                    f.write(kind)
                os.rename(held + ".tmp", held)
            time.sleep(0.005)
        if os.path.exists(held):
            os.unlink(held)

    def write(self, path, data, offset, fh):
        self.hold("write", path)
        node = self.node_for(path, fh)
        if offset > len(node.data):
            node.data.extend(b"\0" * (offset - len(node.data)))
        node.data[offset : offset + len(data)] = data
        node.dirty_from = offset if node.dirty_from is None else min(node.dirty_from, offset)
        node.mtime = time.time()
        return len(data)

    def truncate(self, path, length, fh=None):
        node = self.node_for(path, fh)
        if length < len(node.data):
            del node.data[length:]
        else:
            node.data.extend(b"\0" * (length - len(node.data)))
        node.dirty_from = length if node.dirty_from is None else min(node.dirty_from, length)
        node.mtime = time.time()

    def fsync(self, path, datasync, fh):
        self.hold("fsync", path)
        node = self.node_for(path, fh)
        if os.path.exists(os.path.join(self.backing, "fail-syncs")):
            # A failed writeback as Linux has it: the error is reported once, the pages stay
            # readable but are marked clean, so a later sync "succeeds" without writing them.
            # They are gone at the next power cut.
            node.dirty_from = None
            raise FuseOSError(errno.EIO)
        self.sync_file(node)

    def fsyncdir(self, path, datasync, fh):
        self.sync_dir(self.node_for(path, fh))

    def unlink(self, path):
        parent, name = self.parent_of(path)
        if name not in parent.children:
            raise FuseOSError(errno.ENOENT)
        if self.nodes[parent.children[name]].kind == "d":
            raise FuseOSError(errno.EISDIR)
        del parent.children[name]

    def rename(self, old, new):
        old_parent, old_name = self.parent_of(old)
        new_parent, new_name = self.parent_of(new)
        if old_name not in old_parent.children:
            raise FuseOSError(errno.ENOENT)
        moving = self.nodes[old_parent.children[old_name]]
        if new_name in new_parent.children:
            target = self.nodes[new_parent.children[new_name]]
            if target.kind == "d" and (moving.kind != "d" or target.children):
                raise FuseOSError(errno.ENOTEMPTY if target.children else errno.EISDIR)
        del old_parent.children[old_name]
        new_parent.children[new_name] = moving.ino

    def chmod(self, path, mode):
        self.resolve(path).mode = stat.S_IMODE(mode)

    def chown(self, path, uid, gid):
        pass

    def utimens(self, path, times=None):
        self.resolve(path).mtime = times[1] if times else time.time()

    def access(self, path, amode):
        self.resolve(path)
        return 0

    def statfs(self, path):
        blocks = 1 << 24  # 64 GiB of 4 KiB blocks, all free: retention by free space is not tested here
        return {"f_bsize": 4096, "f_frsize": 4096, "f_blocks": blocks, "f_bfree": blocks, "f_bavail": blocks,
                "f_files": 1 << 20, "f_ffree": 1 << 20, "f_namemax": 255}

    def flush(self, path, fh):
        return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: powercut_fs.py BACKING MOUNTPOINT")
    FUSE(PowerCutFS(sys.argv[1]), sys.argv[2], foreground=True, nothreads=True, hard_remove=True,
         big_writes=True, attr_timeout=0, entry_timeout=0, negative_timeout=0, default_permissions=True,
         fsname="powercut")
