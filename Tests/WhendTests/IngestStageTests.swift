import Foundation
import Testing
import WhendConfiguration
import WhendRecord
import WhendWire

@testable import WhendDaemon
@testable import WhendPluginHost

/// The ingest path without a socket: lines in, records for the journal and answers out.
@Suite struct IngestStageTests {
    func stage(_ configure: (inout DaemonConfiguration) -> Void = { _ in }) -> IngestStage {
        var configuration = DaemonConfiguration(environment: ["HOME": "/nonexistent"])
        configure(&configuration)
        return IngestStage(
            configuration: configuration, ingest: PluginChain([]),
            limiter: SenderRateLimiter(
                rate: configuration.rateLimit, burst: configuration.rateBurst, by: configuration.rateLimitBy),
            credentials: PeerCredentials(pid: 42, uid: 1000, gid: 100, comm: "app"), connectionID: 7)
    }

    func take(_ stage: inout IngestStage, _ line: String) -> IngestStage.Answer? {
        var bytes = Array(line.utf8)
        return bytes.withUnsafeMutableBufferPointer { stage.take(.line(UnsafeBufferPointer($0))) }
    }

    func rejection(_ answer: IngestStage.Answer?) -> (line: UInt64, code: WireErrorCode)? {
        if case .rejected(let line, let error) = answer { return (line, error.code) }
        return nil
    }

    @Test func aHelloIsWelcomedAndItsDefaultsAndTheSendersFieldsAreStamped() {
        var s = stage()
        s.beginRead(bytes: 200)
        guard case .welcome(let welcome) = take(&s, #"{"hello":{"protocol":1,"app":"a","session":"s","acks":true}}"#)
        else {
            Issue.record("no welcome")
            return
        }
        #expect(String(decoding: welcome, as: UTF8.self).hasPrefix(#"{"welcome":"#))
        #expect(s.acks)
        #expect(take(&s, #"{"type":"when","name":"x"}"#) == nil)
        guard let (batch, lines) = s.takeBatch() else {
            Issue.record("the event is not in the batch")
            return
        }
        #expect(lines == [1])
        let body = String(decoding: batch.bodies, as: UTF8.self)
        #expect(body.hasPrefix(#""type":"when","name":"x","params":{},"app":"a","session":"s","_rt":"#), "\(body)")
        #expect(body.hasSuffix(#","_pid":42,"_uid":1000,"_gid":100,"_comm":"app"}"#), "\(body)")
        #expect(s.takeBatch() == nil)
    }

    @Test func badLinesAreAnsweredByNumberAndGoNoFurther() {
        var s = stage()
        s.beginRead(bytes: 100)
        #expect(rejection(take(&s, #"{"type":"lifecycle","screen":"A"}"#))! == (1, .missingField))
        #expect(take(&s, #"{"type":"when","name":"ok"}"#) == nil)
        #expect(rejection(s.take(.tooLarge(70_000)))! == (3, .tooLarge))
        #expect(take(&s, "") == nil)  // an empty line is not counted
        #expect(rejection(take(&s, "[1]"))! == (4, .notAnObject))
        #expect(s.takeBatch()?.lines == [2])
    }

    @Test func theRateLimitRefusesWhatIsOverIt() {
        var s = stage {
            $0.rateLimit = 1
            $0.rateBurst = 2
        }
        s.beginRead(bytes: 100)
        let answers = (1...4).map { _ in rejection(take(&s, #"{"type":"when","name":"x"}"#))?.code }
        #expect(answers == [nil, nil, .rateLimited, .rateLimited])
        #expect(s.takeBatch()?.lines == [1, 2])
    }
}

extension IngestStage.Answer: Equatable {
    public static func == (a: Self, b: Self) -> Bool {
        switch (a, b) {
        case (.welcome(let x), .welcome(let y)), (.refuse(let x), .refuse(let y)): return x == y
        case (.rejected(let l1, let e1), .rejected(let l2, let e2)): return l1 == l2 && e1 == e2
        default: return false
        }
    }
}
