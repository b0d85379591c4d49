import ArgumentParser
import Foundation
import WhendJournal
import WhendWire

/// `whenctl export`: one session as a Swift test for the GIVEN/WHEN/THEN runner, or as NDJSON.
struct Export: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Write a session as a Swift test for WhenTesting's GIVEN/WHEN/THEN runner, or as NDJSON.",
        discussion: """
            The session's `when` records become .WHEN(.caseName(label: value, …)) steps in order, \
            each followed by a THEN placeholder to fill in; the screens it went through are comments. \
            Values are Swift literals; unlabelled associated values (_0, _1) are positional; a nested \
            object is .init(…) (a struct), or .case(…) when it is one key holding an object (an enum). \
            Fill in --subject with the type whose handle(_ when:) the test drives.
            """
    )

    @OptionGroup var location: JournalLocationOptions

    @Option(name: .long, help: "The session to export.")
    var session: String

    @Option(name: .long, help: "Only this app's session of that id.")
    var app: String?

    @Option(name: .long, help: "swift-testing, xctest or ndjson.")
    var format: Format = .swiftTesting

    @Option(name: .long, help: "The type under test (a SingleEntryPoint).")
    var subject: String = "ViewModel"

    @Option(name: .long, help: "The app's module, imported with @testable.")
    var module: String?

    enum Format: String, ExpressibleByArgument {
        case swiftTesting = "swift-testing"
        case xctest
        case ndjson
    }

    func run() throws {
        let directory = try location.existingDirectory()
        var lines: [[UInt8]] = []
        let wantedSession = Array(session.utf8)
        let wantedApp = app.map { Array($0.utf8) }
        JournalReader(directory: directory).read { record, _ in
            guard let fields = try? record.fields(), fields.session == wantedSession,
                wantedApp == nil || fields.app == wantedApp
            else { return true }
            lines.append(Array(record.line))
            return true
        } onProblem: {
            printError("whenctl export: warning: \($0)")
        }
        guard !lines.isEmpty else {
            throw Failure("no records of session \(session) in \(directory.path); `whenctl sessions` lists them")
        }
        let out = Output()
        if format == .ndjson {
            for line in lines { line.withUnsafeBufferPointer { out.write($0) } }
        } else {
            out.write(try SwiftTestExport(subject: subject, module: module, xctest: format == .xctest).render(lines))
        }
        out.flush()
    }
}

/// Renders a session's records as a Swift test file.
struct SwiftTestExport {
    var subject: String
    var module: String?
    var xctest: Bool

    func render(_ lines: [[UInt8]]) throws -> String {
        var steps: [String] = []
        var screen: String?
        var apps: Set<String> = []
        var sessionID = ""
        var whens = 0
        for line in lines {
            guard case .object(let members) = try OrderedJSON.parse(line) else { continue }
            func string(_ key: String) -> String? {
                if case .string(let s)? = members.first(where: { $0.0 == key })?.1 { return s }
                return nil
            }
            if let app = string("app") { apps.insert(app) }
            sessionID = string("session") ?? sessionID
            var shown: String?
            switch string("type") {
            case "screen": shown = string("name")
            case "lifecycle": shown = string("status") == "didAppear" ? string("screen") : nil
            case "navigation":
                shown =
                    ["root", "push", "present", "replace"].contains(string("action") ?? "") ? string("screen") : nil
            case "when" where string("_origin") == nil:
                guard let name = string("name") else { continue }
                var params: [(String, OrderedJSON)] = []
                if case .object(let p)? = members.first(where: { $0.0 == "params" })?.1 { params = p }
                whens += 1
                steps.append("        .WHEN(\(Self.caseExpression(name, params)))")
                steps.append("        // .THEN(\\.<property>, is: <expected>)")
            default: break
            }
            if let shown, shown != screen {
                screen = shown
                steps.append("        // screen: \(shown)")
            }
        }
        let identifier = Self.identifier("session " + sessionID)
        var text = """
            // Exported by `whenctl export` from session \(sessionID) of \(apps.sorted().joined(separator: ", ")): \(whens) `when` record(s).
            // Fill in each THEN with what the state must be after the step above it.


            """
        text += xctest ? "import XCTest\n" : "import Testing\n"
        text += "import WhenTesting\n"
        if let module { text += "@testable import \(module)\n" }
        let runner = ["    TestRunner<\(subject)>.GIVEN { \(subject)() }"] + steps + ["        .runTests()"]
        if xctest {
            text += "\nfinal class \(identifier.prefix(1).uppercased() + identifier.dropFirst())Tests: XCTestCase {\n"
            text += "    func test\(identifier.prefix(1).uppercased() + identifier.dropFirst())() {\n"
            text += runner.map { "    " + $0 }.joined(separator: "\n") + "\n    }\n}\n"
        } else {
            text += "\n@Test func \(identifier)() {\n" + runner.joined(separator: "\n") + "\n}\n"
        }
        return text
    }

    /// `.name`, or `.name(label: value, …)` with `_0`, `_1` positional.
    static func caseExpression(_ name: String, _ params: [(String, OrderedJSON)]) -> String {
        guard !params.isEmpty else { return "." + name }
        return ".\(name)(\(arguments(params)))"
    }

    static func arguments(_ members: [(String, OrderedJSON)]) -> String {
        members.map { key, value in
            let positional = key.hasPrefix("_") && Int(key.dropFirst()) != nil
            return (positional ? "" : "\(key): ") + literal(value)
        }.joined(separator: ", ")
    }

    static func literal(_ value: OrderedJSON) -> String {
        switch value {
        case .string(let s): return swiftString(s)
        case .number(let n): return n
        case .bool(let b): return b ? "true" : "false"
        case .null: return "nil"
        case .array(let a): return "[" + a.map(literal).joined(separator: ", ") + "]"
        case .object(let members):
            if members.count == 1, case .object(let inner) = members[0].1 {
                return caseExpression(members[0].0, inner)  // an enum case in its Codable form
            }
            return ".init(\(arguments(members)))"
        }
    }

    static func swiftString(_ s: String) -> String {
        var out = "\""
        for scalar in s.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case _ where scalar.value < 0x20 || scalar.value == 0x7F:
                out += "\\u{\(String(scalar.value, radix: 16))}"
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out + "\""
    }

    /// A Swift identifier from any text: letters and digits, camel-cased.
    static func identifier(_ text: String) -> String {
        let words = text.split { !($0.isLetter || $0.isNumber) || !$0.isASCII }
        var out = ""
        for (i, w) in words.enumerated() {
            out += i == 0 ? w.lowercased() : w.prefix(1).uppercased() + w.dropFirst()
        }
        if out.isEmpty || out.first!.isNumber { out = "session" + out }
        return out
    }
}

/// JSON with the order of object members kept (argument labels must come in declaration order).
indirect enum OrderedJSON {
    case string(String)
    case number(String)
    case bool(Bool)
    case null
    case array([OrderedJSON])
    case object([(String, OrderedJSON)])

    struct Malformed: Error, CustomStringConvertible {
        var description: String
    }

    static func parse(_ bytes: [UInt8]) throws -> OrderedJSON {
        var i = 0
        let value = try parseValue(bytes, &i)
        return value
    }

    private static func skipBlanks(_ b: [UInt8], _ i: inout Int) {
        while i < b.count, [0x20, 0x09, 0x0A, 0x0D].contains(b[i]) { i += 1 }
    }

    /// After a member or an element: true past a `,` (another follows), false past `closer`.
    private static func another(_ b: [UInt8], _ i: inout Int, closer: UInt8, in what: String) throws -> Bool {
        skipBlanks(b, &i)
        guard i < b.count else { throw Malformed(description: "unexpected end") }
        if b[i] == UInt8(ascii: ",") {
            i += 1
            return true
        }
        guard b[i] == closer else { throw Malformed(description: what) }
        i += 1
        return false
    }

    private static func parseValue(_ b: [UInt8], _ i: inout Int) throws -> OrderedJSON {
        skipBlanks(b, &i)
        guard i < b.count else { throw Malformed(description: "unexpected end") }
        switch b[i] {
        case UInt8(ascii: "{"):
            i += 1
            var members: [(String, OrderedJSON)] = []
            skipBlanks(b, &i)
            if i < b.count, b[i] == UInt8(ascii: "}") {
                i += 1
                return .object([])
            }
            while true {
                skipBlanks(b, &i)
                guard case .string(let key) = try parseValue(b, &i) else { throw Malformed(description: "key") }
                skipBlanks(b, &i)
                guard i < b.count, b[i] == UInt8(ascii: ":") else { throw Malformed(description: "colon") }
                i += 1
                members.append((key, try parseValue(b, &i)))
                if try !another(b, &i, closer: UInt8(ascii: "}"), in: "object") { return .object(members) }
            }
        case UInt8(ascii: "["):
            i += 1
            var elements: [OrderedJSON] = []
            skipBlanks(b, &i)
            if i < b.count, b[i] == UInt8(ascii: "]") {
                i += 1
                return .array([])
            }
            while true {
                elements.append(try parseValue(b, &i))
                if try !another(b, &i, closer: UInt8(ascii: "]"), in: "array") { return .array(elements) }
            }
        case UInt8(ascii: "\""):
            // The string's exact JSON text, decoded by Foundation (escapes and all).
            let start = i
            i += 1
            while i < b.count, b[i] != UInt8(ascii: "\"") { i += b[i] == UInt8(ascii: "\\") ? 2 : 1 }
            i += 1
            let text = Data(b[start..<min(i, b.count)])
            guard let s = try JSONSerialization.jsonObject(with: text, options: [.fragmentsAllowed]) as? String else {
                throw Malformed(description: "string")
            }
            return .string(s)
        case UInt8(ascii: "t"):
            i += 4
            return .bool(true)
        case UInt8(ascii: "f"):
            i += 5
            return .bool(false)
        case UInt8(ascii: "n"):
            i += 4
            return .null
        default:
            let start = i
            while i < b.count, (0x30...0x39).contains(b[i]) || [0x2D, 0x2B, 0x2E, 0x65, 0x45].contains(b[i]) { i += 1 }
            guard i > start else { throw Malformed(description: "value") }
            return .number(String(decoding: b[start..<i], as: UTF8.self))
        }
    }
}
