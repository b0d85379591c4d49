import Testing
import WhenClient
import WhenTesting
import XCTest

/// The single-entry-point article's view model, as an app would write it.
final class ChangeEmailViewModel: SingleEntryPoint {
    enum When: Codable {
        case userTypesNewEmail(userEmail: String)
        case userTapsChangeEmailButton
    }

    var email = ""
    var savedEmail: String?
    var onSave: (() -> Void)?

    func handle(_ when: When) {
        switch when {
        case .userTypesNewEmail(let newEmail): email = newEmail
        case .userTapsChangeEmailButton:
            savedEmail = email
            onSave?()
        }
    }
}

@Suite struct TestRunnerTests {
    @Test func aStoryThatHoldsPasses() {
        TestRunner<ChangeEmailViewModel>.GIVEN { ChangeEmailViewModel() }
            .WHEN(.userTypesNewEmail(userEmail: "john.doe@example.com"))
            .THEN(\.email, is: "john.doe@example.com")
            .THEN(\.savedEmail, is: nil)
            .WHEN(.userTapsChangeEmailButton)
            .THEN(\.savedEmail, is: "john.doe@example.com")
            .THEN("the email is kept") { $0.email == "john.doe@example.com" }
            .runTests()
    }

    @Test func aWrongThenIsAnIssueThatSaysWhatAndAfterWhichSteps() {
        withKnownIssue {
            TestRunner<ChangeEmailViewModel>.GIVEN { ChangeEmailViewModel() }
                .WHEN(.userTypesNewEmail(userEmail: "a@example.com"))
                .THEN(\.savedEmail, is: "a@example.com")
                .runTests()
        } matching: { issue in
            let text = issue.comments.map(\.rawValue).joined()
            return text.contains("nil is not Optional(\"a@example.com\")") && text.contains("userTypesNewEmail")
                && text.contains("GIVEN ChangeEmailViewModel")
        }
    }

    @Test func aSubjectThatKeepsItselfAliveIsReported() {
        withKnownIssue {
            TestRunner<ChangeEmailViewModel>.GIVEN {
                let model = ChangeEmailViewModel()
                model.onSave = { model.email = "" }  // a retain cycle
                return model
            }
            .WHEN(.userTapsChangeEmailButton)
            .runTests()
        } matching: { issue in
            issue.comments.map(\.rawValue).joined().contains("was not released")
        }
    }
}

/// The same runner from XCTest, as the article uses it.
final class TestRunnerXCTests: XCTestCase {
    func testUserStory() {
        TestRunner<ChangeEmailViewModel>.GIVEN { ChangeEmailViewModel() }
            .WHEN(.userTypesNewEmail(userEmail: "john.doe@example.com"))
            .THEN(\.email, is: "john.doe@example.com")
            .WHEN(.userTapsChangeEmailButton)
            .THEN(\.savedEmail, is: "john.doe@example.com")
            .runTests()
    }

    /// Failures caught here rather than failing the test, to check that the runner reports them.
    private var caught: [(description: String, line: Int)] = []
    private var catching = false

    override func recordFailure(
        withDescription description: String, inFile filePath: String, atLine lineNumber: Int, expected: Bool
    ) {
        if catching {
            caught.append((description, lineNumber))
        } else {
            super.recordFailure(withDescription: description, inFile: filePath, atLine: lineNumber, expected: expected)
        }
    }

    func testAWrongThenIsAnXCTestFailureAtItsLine() {
        catching = true
        let line = #line + 3
        TestRunner<ChangeEmailViewModel>.GIVEN { ChangeEmailViewModel() }
            .WHEN(.userTypesNewEmail(userEmail: "a@example.com"))
            .THEN(\.email, is: "b@example.com")
            .runTests()
        catching = false
        XCTAssertEqual(caught.count, 1)
        XCTAssertEqual(caught.first?.line, line)
        XCTAssertTrue(caught.first?.description.contains("\"a@example.com\" is not \"b@example.com\"") == true)
    }
}
