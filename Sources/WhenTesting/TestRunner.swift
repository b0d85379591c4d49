import Testing
import WhenClient
import XCTest

/// The single-entry-point article's GIVEN/WHEN/THEN runner, for any `SingleEntryPoint`:
///
///     TestRunner<ChangeEmailViewModel>.GIVEN { ChangeEmailViewModel() }
///         .WHEN(.userTypesNewEmail(userEmail: "john.doe@example.com"))
///         .THEN(\.email, is: "john.doe@example.com")
///         .WHEN(.userTapsChangeEmailButton)
///         .THEN(\.savedEmail, is: "john.doe@example.com")
///         .runTests()
///
/// Works from Swift Testing (failures are recorded as issues of the running test) and from
/// XCTest (failures are XCTest failures), at the line of the failing step. When the subject is
/// a class, `runTests` also checks that it is released once the steps are done: a subject kept
/// alive by itself is a retain cycle.
public final class TestRunner<T: SingleEntryPoint> {
    private let builder: () -> T
    private var steps: [Step] = []

    private struct Step {
        var title: String
        var location: Location
        var run: (T) -> String?
    }

    private init(_ builder: @escaping () -> T) { self.builder = builder }

    public static func GIVEN(_ builder: @escaping () -> T) -> TestRunner<T> { TestRunner(builder) }

    @discardableResult
    public func WHEN(
        _ when: T.When, fileID: String = #fileID, filePath: StaticString = #filePath, line: UInt = #line,
        column: UInt = #column
    ) -> Self {
        let location = Location(fileID: fileID, filePath: filePath, line: line, column: column)
        steps.append(
            Step(title: "WHEN \(when)", location: location) { sut in
                sut.handle(when)
                return nil
            })
        return self
    }

    @discardableResult
    public func THEN<P: Equatable>(
        _ keyPath: KeyPath<T, P>, is expected: P, fileID: String = #fileID, filePath: StaticString = #filePath,
        line: UInt = #line, column: UInt = #column
    ) -> Self {
        let location = Location(fileID: fileID, filePath: filePath, line: line, column: column)
        steps.append(
            Step(title: "THEN \(keyPath) is \(expected)", location: location) { sut in
                let actual = sut[keyPath: keyPath]
                return actual == expected ? nil : "\(String(reflecting: actual)) is not \(String(reflecting: expected))"
            })
        return self
    }

    /// A THEN with any check; `check` returns false (or throws) when the state is wrong.
    @discardableResult
    public func THEN(
        _ description: String, fileID: String = #fileID, filePath: StaticString = #filePath, line: UInt = #line,
        column: UInt = #column, _ check: @escaping (T) throws -> Bool
    ) -> Self {
        let location = Location(fileID: fileID, filePath: filePath, line: line, column: column)
        steps.append(
            Step(title: "THEN \(description)", location: location) { sut in
                do {
                    return try check(sut) ? nil : "the check failed"
                } catch {
                    return "the check threw \(error)"
                }
            })
        return self
    }

    /// Builds the subject, runs the steps in order, and reports every failing THEN.
    public func runTests(fileID: String = #fileID, filePath: StaticString = #filePath, line: UInt = #line) {
        weak var released: AnyObject?
        let isObject = T.self is AnyClass
        do {
            let sut = builder()
            if isObject { released = sut as AnyObject }
            var done: [String] = ["GIVEN \(T.self)"]
            for step in steps {
                if let failure = step.run(sut) {
                    report("\(step.title): \(failure)\n  after: \(done.joined(separator: " → "))", at: step.location)
                }
                done.append(step.title)
            }
        }
        if isObject, released != nil {
            report(
                "\(T.self) was not released after the test: something it holds holds it (a retain cycle?)",
                at: Location(fileID: fileID, filePath: filePath, line: line, column: 1))
        }
    }

    private struct Location {
        var fileID: String
        var filePath: StaticString
        var line: UInt
        var column: UInt
    }

    private func report(_ message: String, at location: Location) {
        if Test.current != nil {
            Issue.record(
                Comment(rawValue: message),
                sourceLocation: SourceLocation(
                    fileID: location.fileID, filePath: "\(location.filePath)", line: Int(location.line),
                    column: Int(location.column)))
        } else {
            XCTFail(message, file: location.filePath, line: location.line)
        }
    }
}
