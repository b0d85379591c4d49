import Foundation

/// The `When` middleware of the single-entry-point article, for any `Encodable` enum: every
/// `When` is sent in its Codable form, as is; the handler runs; an error it throws is sent as an
/// `error` event named after the case, and rethrown.
///
///     func handle(_ when: When) {
///         try? whend.reporting(when, screen: "ChangeEmail") { when in … }
///     }
extension WhenClient {
    public func reporting<W: Encodable>(_ when: W, screen: String? = nil, next: (W) throws -> Void) rethrows {
        let form = Self.codableForm(of: when)
        var event: [String: Any] = ["type": "when"]
        switch form {
        case .object(_, let json): event["when"] = json
        case .name(let name): event["name"] = name
        }
        if let screen { event["screen"] = screen }
        emit(event)
        do {
            try next(when)
        } catch {
            var report: [String: Any] = ["type": "error", "message": String(describing: error), "name": form.name]
            if let screen { report["screen"] = screen }
            emit(report)
            throw error
        }
    }

    enum CodableForm {
        /// `{"caseName":{…}}`, as the encoder wrote it.
        case object(name: String, json: RawJSON)
        /// A raw-value enum, or anything whose form is not one object: sent by name.
        case name(String)

        var name: String {
            switch self {
            case .object(let name, _), .name(let name): name
            }
        }
    }

    static func codableForm<W: Encodable>(of when: W) -> CodableForm {
        guard let data = try? JSONEncoder().encode(when),
            let json = try? JSONSerialization.jsonObject(with: data, options: [.fragmentsAllowed])
        else { return .name(caseName(of: when)) }
        if let object = json as? [String: Any], object.count == 1, let name = object.keys.first,
            object[name] is [String: Any], Self.isCaseName(name)
        {
            return .object(name: name, json: RawJSON(Array(data)))
        }
        if let string = json as? String, Self.isCaseName(string) { return .name(string) }
        return .name(caseName(of: when))
    }

    /// `userTapsChangeEmailButton` of `.userTapsChangeEmailButton(…)`, for values without a
    /// usable Codable form.
    static func caseName(of value: Any) -> String {
        let described = String(describing: value)
        let name = String(described.prefix { $0.isLetter || $0.isNumber || $0 == "_" })
        return isCaseName(name) ? name : "unnamed"
    }

    /// PROTOCOL.md §6: `[A-Za-z_][A-Za-z0-9_]*`, at most 255 bytes.
    static func isCaseName(_ s: String) -> Bool {
        guard let first = s.utf8.first, s.utf8.count <= 255, !(UInt8(ascii: "0")...UInt8(ascii: "9")).contains(first)
        else { return false }
        return s.utf8.allSatisfy {
            ($0 >= 0x41 && $0 <= 0x5A) || ($0 >= 0x61 && $0 <= 0x7A) || ($0 >= 0x30 && $0 <= 0x39) || $0 == 0x5F
        }
    }
}

/// A type whose business logic has one entry point, `handle(_ when:)` (the single-entry-point
/// article): a view model, a controller, a service.
public protocol SingleEntryPoint {
    associatedtype When
    func handle(_ when: When)
}
