import Glibc

/// Eight bytes of a file, mapped shared: one process stores a number there, others load it, each
/// in one aligned access, as often as they like (no system call). How whend and its pipeline
/// processes tell each other what changes too often for a message: the record a worker is
/// handling, the last `_seq` the journal has stored.
package final class SharedWord: @unchecked Sendable {
    // Unchecked: one process stores, the others only load; an aligned word is never torn.
    private let word: UnsafeMutablePointer<UInt64>
    private let writable: Bool

    private init(_ word: UnsafeMutablePointer<UInt64>, writable: Bool) {
        self.word = word
        self.writable = writable
    }

    /// The word of `path` (created, 0600, if need be), to store to; nil if it cannot be mapped.
    /// Its page is allocated now, not at the first store: on a full file system a store to a
    /// mapped hole is a SIGBUS.
    package static func create(_ path: String) -> SharedWord? {
        let fd = Glibc.open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        guard posix_fallocate(fd, 0, 8) == 0,
            let map = mmap(nil, 8, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), map != MAP_FAILED
        else { return nil }
        return SharedWord(map.bindMemory(to: UInt64.self, capacity: 1), writable: true)
    }

    /// The word of an existing `path`, to load from; nil if there is none.
    package static func open(_ path: String) -> SharedWord? {
        let fd = Glibc.open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var st = stat()
        guard fstat(fd, &st) == 0, st.st_size >= 8,
            let map = mmap(nil, 8, PROT_READ, MAP_SHARED, fd, 0), map != MAP_FAILED
        else { return nil }
        return SharedWord(map.bindMemory(to: UInt64.self, capacity: 1), writable: false)
    }

    deinit { munmap(word, 8) }

    package var value: UInt64 { word.pointee }

    package func store(_ value: UInt64) {
        precondition(writable, "a shared word opened to load from is stored to")
        word.pointee = value
    }
}
