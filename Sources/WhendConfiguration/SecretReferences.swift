import Foundation
import WhendSystem

/// Why a reference to a secret could not be read.
package struct SecretReferenceError: Error, CustomStringConvertible, Equatable {
    package var reference: String
    package var reason: String

    package var description: String { "\(reference): \(reason)" }
}

extension Secrets {
    /// `json` with every string value that is a reference replaced by what it names:
    /// `"$credential:NAME"` by the contents of `$CREDENTIALS_DIRECTORY/NAME` (systemd's
    /// `LoadCredential=`), `"$file:/absolute/path"` by the contents of that file; one trailing
    /// line end (LF or CRLF) is dropped. Returns the text and the values read, which are secrets wherever they
    /// are.
    package static func resolveReferences(
        _ json: String, environment: [String: String] = ProcessInfo.processInfo.environment
    ) throws(SecretReferenceError) -> (json: String, secrets: Set<String>) {
        guard json.contains(credentialPrefix) || json.contains(filePrefix) else { return (json, []) }
        var walker = JSONSpanWalker(Array(json.utf8))
        var secrets: Set<String> = []
        var failure: SecretReferenceError?
        let ok = walker.walk { string, _ in
            guard failure == nil, isReference(string) else { return nil }
            do throws(SecretReferenceError) {
                let value = try read(string, environment: environment)
                secrets.insert(value)
                return value
            } catch {
                failure = error
                return nil
            }
        }
        if let failure { throw failure }
        guard ok else { return (json, []) }
        return (walker.result, secrets)
    }

    private static func read(_ reference: String, environment: [String: String]) throws(SecretReferenceError)
        -> String
    {
        let path: String
        if reference.hasPrefix(credentialPrefix) {
            let name = String(reference.dropFirst(credentialPrefix.count))
            guard !name.isEmpty, !name.contains("/"), name != ".", name != ".." else {
                throw SecretReferenceError(
                    reference: reference, reason: "a credential's name is a file name, such as $credential:write-key")
            }
            guard let directory = environment["CREDENTIALS_DIRECTORY"], !directory.isEmpty else {
                throw SecretReferenceError(
                    reference: reference,
                    reason:
                        "$CREDENTIALS_DIRECTORY is not set: systemd sets it for a unit with LoadCredential=\(name):/path/to/file; elsewhere use $file:/path/to/file"
                )
            }
            path = directory + "/" + name
        } else {
            path = String(reference.dropFirst(filePrefix.count))
            guard path.hasPrefix("/") else {
                throw SecretReferenceError(reference: reference, reason: "the path must be absolute")
            }
        }
        guard var text = String(data: try readSecretFile(path, reference: reference), encoding: .utf8) else {
            throw SecretReferenceError(reference: reference, reason: "\(path) is not UTF-8 text")
        }
        // One line end, LF or CRLF (one Character in Swift: `hasSuffix("\n")` missed it).
        if text.hasSuffix("\n") || text.hasSuffix("\r\n") { text.removeLast() }
        guard !text.isEmpty else { throw SecretReferenceError(reference: reference, reason: "\(path) is empty") }
        return text
    }
}

extension Secrets {
    /// The most a file or credential holding a secret may hold.
    package static let maximumSecretSize = 64 * 1024

    /// The contents of the regular file at `path`, at most `maximumSecretSize` bytes; a
    /// device (`/dev/zero`), a FIFO or a directory is refused (`ConfiguredFile`).
    private static func readSecretFile(_ path: String, reference: String) throws(SecretReferenceError) -> Data {
        do {
            return Data(try ConfiguredFile.read(path, limit: maximumSecretSize))
        } catch {
            let reason: String
            switch error {
            case .cannotOpen(let code):
                reason = "cannot read \(path): \(String(cString: strerror(code))); whend's user must be able to read it"
            case .cannotRead(let code): reason = "cannot read \(path): \(String(cString: strerror(code)))"
            case .notARegularFile:
                reason = "\(path) is not a regular file; put the secret in a file of its own and name that"
            case .tooLarge:
                reason =
                    "\(path) holds more than \(maximumSecretSize / 1024) KiB; a secret file holds only the secret"
            }
            throw SecretReferenceError(reference: reference, reason: reason)
        }
    }
}
