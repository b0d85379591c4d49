import CWhendPlugin
import Foundation
import WhendSystem

/// Why a plugin could not be loaded or started, with what to do.
/// Why a plugin was not loaded, or not started: what kind of trouble (for whoever acts on it),
/// and what happened and what to do, in words.
package struct PluginLoadError: Error, CustomStringConvertible, Equatable {
    package enum Kind: Sendable, Equatable {
        /// The configuration names it wrongly: not a plugin name, no directory to look in, one
        /// library under two names, a plugin in a role it does not have.
        case misconfigured
        /// No library of that name in the plugin directories.
        case notFound
        /// Its file or directory may be written by someone whend does not trust.
        case unsafe
        /// The file cannot be read or linked (`stat`, `dlopen`).
        case cannotOpen
        /// The library is not a whend plugin of this ABI.
        case notAPlugin
        /// The plugin refused its configuration.
        case refused
        /// Its state cannot be restored or flushed.
        case state
    }

    package var kind: Kind
    package var description: String

    package init(_ kind: Kind, description: String) {
        self.kind = kind
        self.description = description
    }
}

/// A plugin library opened with `dlopen` and checked against the ABI.
///
/// Libraries are never closed: unloading a Swift library crashes its runtime, so "unload"
/// means "stop routing records to it". Opening the same file again gives the same library,
/// whatever name or path it is reached by (a symbolic or hard link, a directory link): a file
/// is known by its device and inode, as the dynamic linker knows it.
package final class PluginLibrary: @unchecked Sendable {
    // Unchecked: every field is set once in init; `descriptor` points at a copy of the plugin's
    // description (no more than it declared, the rest zero), kept as long as the process: the
    // library is never closed.
    package let path: String
    package let descriptor: UnsafePointer<whend_plugin>
    package let name: String
    package let version: String
    package let abiVersion: UInt32
    package let roles: UInt32

    private init(path: String, descriptor: UnsafePointer<whend_plugin>) {
        self.path = path
        self.descriptor = descriptor
        name = String(cString: descriptor.pointee.name)
        version = String(cString: descriptor.pointee.version)
        abiVersion = descriptor.pointee.abi_version
        roles = descriptor.pointee.roles
    }

    /// A library file as the kernel knows it.
    private struct FileIdentity: Hashable {
        var device: UInt64
        var inode: UInt64
    }

    private static let opened = NSLock()
    nonisolated(unsafe) private static var byFile: [FileIdentity: PluginLibrary] = [:]

    /// Loads the plugins of one chain, in order. A chain holds one instance of a plugin (its
    /// `next` would call into itself while it handles the record, and wait for itself for
    /// good): two names that reach one library — a symbolic link, a copy linked hard — are
    /// refused as one name given twice is.
    package static func loadChain(_ names: [String], directories: [String]) throws(PluginLoadError)
        -> [PluginLibrary]
    {
        var libraries: [PluginLibrary] = []
        for name in names {
            let library = try load(name: name, directories: directories)
            if let index = libraries.firstIndex(where: { $0 === library }) {
                throw PluginLoadError(
                    .misconfigured,
                    description:
                        "plugins \(names[index]) and \(name) are one library (\(library.path)); a chain holds one instance of a plugin, so name it once"
                )
            }
            libraries.append(library)
        }
        return libraries
    }

    /// Where `load` would find `name`'s library (its real path) and which file is there now
    /// ("device:inode"), without opening it; nil if there is none.
    package static func locate(name: String, directories: [String]) -> (path: String, file: String)? {
        guard !name.isEmpty, name.utf8.allSatisfy({ isNameByte($0) }) else { return nil }
        for directory in directories {
            for file in ["lib\(name).so", "\(name).so"] {
                let candidate = directory + "/" + file
                guard FileManager.default.fileExists(atPath: candidate), let real = realpath(candidate, nil) else {
                    continue
                }
                let path = String(cString: real)
                free(real)
                var st = stat()
                guard stat(path, &st) == 0 else { return nil }
                return (path, "\(st.st_dev):\(st.st_ino)")
            }
        }
        return nil
    }

    /// Finds `name` in `directories` (as `lib<name>.so` or `<name>.so`), checks where it lives,
    /// opens it and checks its ABI before calling any of its code.
    package static func load(name: String, directories: [String]) throws(PluginLoadError) -> PluginLibrary {
        guard !name.isEmpty, name.utf8.allSatisfy({ isNameByte($0) }) else {
            throw PluginLoadError(
                .misconfigured,
                description: "\"\(name)\" is not a plugin name; names are made of a-z, 0-9, - and _")
        }
        guard !directories.isEmpty else {
            throw PluginLoadError(
                .misconfigured,
                description: "no plugin directory is configured; set plugin_dirs to where \(name)'s library is")
        }
        for directory in directories {
            for file in ["lib\(name).so", "\(name).so"] {
                let candidate = directory + "/" + file
                guard FileManager.default.fileExists(atPath: candidate) else { continue }
                try checkOwnership(directory, what: "plugin directory")
                guard let real = realpath(candidate, nil) else { continue }
                let path = String(cString: real)
                free(real)
                try checkOwnership(path, what: "plugin")
                return try open(path)
            }
        }
        throw PluginLoadError(
            .notFound,
            description:
                "no plugin \(name) (lib\(name).so or \(name).so) in \(directories.joined(separator: ", ")); check plugin_dirs"
        )
    }

    /// Opens a library by path (after the checks above).
    private static func open(_ path: String) throws(PluginLoadError) -> PluginLibrary {
        opened.lock()
        defer { opened.unlock() }
        var st = stat()
        guard stat(path, &st) == 0 else {
            throw PluginLoadError(
                .cannotOpen, description: "cannot stat plugin \(path): \(String(cString: strerror(errno)))")
        }
        let file = FileIdentity(device: UInt64(st.st_dev), inode: UInt64(st.st_ino))
        if let known = byFile[file] { return known }
        // A library's constructors that closed 3 and 4 left them free for the next library's.
        let handle = dlopen(path, RTLD_NOW | RTLD_LOCAL)
        PluginDescriptors.refill()
        guard let handle else {
            let why = dlerror().map { String(cString: $0) } ?? "unknown error"
            throw PluginLoadError(.cannotOpen, description: "cannot load \(path): \(why)")
        }
        // The ABI version is data: read it before calling anything of the plugin's.
        guard let versionSymbol = dlsym(handle, "whend_plugin_abi_version") else {
            throw PluginLoadError(
                .notAPlugin,
                description: "\(path) is not a whend plugin: it exports no whend_plugin_abi_version")
        }
        let built = versionSymbol.assumingMemoryBound(to: UInt32.self).pointee
        guard built == WHEND_PLUGIN_ABI_VERSION else {
            throw PluginLoadError(
                .notAPlugin,
                description:
                    "\(path) was built for plugin ABI \(built); this whend speaks ABI \(WHEND_PLUGIN_ABI_VERSION). Rebuild it against this whend's whend_plugin.h (or its WhendPluginSDK); it was not called"
            )
        }
        guard let entrySymbol = dlsym(handle, "whend_plugin_entry") else {
            throw PluginLoadError(.notAPlugin, description: "\(path) exports no whend_plugin_entry")
        }
        let entry = unsafeBitCast(entrySymbol, to: whend_plugin_entry_fn.self)
        let raw = entry()
        PluginDescriptors.refill()
        guard let raw else {
            throw PluginLoadError(.notAPlugin, description: "\(path): whend_plugin_entry returned nothing")
        }
        // Read the version and size before any other field: an older, smaller struct must not
        // be overread. ABI 1 began with the fields up to `handle`; later ones (snapshot,
        // restore) are read only when the plugin's struct has them, and are NULL otherwise.
        let abi = UnsafeRawPointer(raw).load(fromByteOffset: 0, as: UInt32.self)
        let size = Int(UnsafeRawPointer(raw).load(fromByteOffset: 4, as: UInt32.self))
        let firstSize = MemoryLayout<whend_plugin>.offset(of: \whend_plugin.snapshot)!
        guard abi == WHEND_PLUGIN_ABI_VERSION, size >= firstSize else {
            throw PluginLoadError(
                .notAPlugin,
                description:
                    "\(path): its description is for ABI \(abi) with \(size) bytes; this whend needs ABI \(WHEND_PLUGIN_ABI_VERSION) with at least \(firstSize)"
            )
        }
        // A copy of what the plugin declared, the rest zero: never read past its struct.
        let descriptor = UnsafeMutablePointer<whend_plugin>.allocate(capacity: 1)
        UnsafeMutableRawPointer(descriptor).initializeMemory(
            as: UInt8.self, repeating: 0, count: MemoryLayout<whend_plugin>.size)
        UnsafeMutableRawPointer(descriptor).copyMemory(from: raw, byteCount: min(size, MemoryLayout<whend_plugin>.size))
        guard descriptor.pointee.name != nil, descriptor.pointee.version != nil, descriptor.pointee.create != nil,
            descriptor.pointee.destroy != nil, descriptor.pointee.handle != nil
        else {
            throw PluginLoadError(
                .notAPlugin, description: "\(path): its description leaves a name or an entry point empty")
        }
        let library = PluginLibrary(path: path, descriptor: descriptor)
        byFile[file] = library
        return library
    }

    /// Loading a plugin runs its code as whend's user: only files and directories that root
    /// or whend's own user own, and that nobody else may write, are accepted.
    package static func checkOwnership(_ path: String, what: String) throws(PluginLoadError) {
        var st = stat()
        guard stat(path, &st) == 0 else {
            throw PluginLoadError(
                .cannotOpen, description: "cannot stat \(what) \(path): \(String(cString: strerror(errno)))")
        }
        guard st.st_uid == 0 || st.st_uid == geteuid() else {
            throw PluginLoadError(
                .unsafe,
                description:
                    "refusing \(what) \(path): it is owned by uid \(st.st_uid), not by root or whend's user (uid \(geteuid()))"
            )
        }
        guard st.st_mode & 0o022 == 0 else {
            throw PluginLoadError(
                .unsafe,
                description:
                    "refusing \(what) \(path): others may write it (mode \(String(st.st_mode & 0o777, radix: 8))); chmod go-w it"
            )
        }
    }

    private static func isNameByte(_ b: UInt8) -> Bool {
        (b >= 0x61 && b <= 0x7A) || (b >= 0x30 && b <= 0x39) || b == 0x2D || b == 0x5F
    }
}
