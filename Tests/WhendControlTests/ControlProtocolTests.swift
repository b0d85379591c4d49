import Foundation
import PropertyBased
import Testing
import WhendControl

/// The control socket's requests and answers as whenctl and whend read and write them, and as
/// earlier versions of each wrote them.
@Suite struct ControlProtocolTests {
    static func name(_ random: inout Xoshiro) -> String {
        let alphabet = Array("abcXYZ-_.09 \"\\/é漢😀\u{1}\n")
        return String((0..<Int.random(in: 1...12, using: &random)).map { _ in alphabet.randomElement(using: &random)! })
    }

    /// For any request (any plugin or pipeline name, quotes, controls and all), what whenctl
    /// sends is read by whend as that request.
    @Test func everyRequestReadsBackAsItself() throws {
        var random = Xoshiro(seed: (7, 7, 7, 7))
        for _ in 0..<500 {
            let requests: [ControlRequest] = [
                .status, .reload, .metrics, .plugins, .load(plugin: Self.name(&random)),
                .unload(plugin: Self.name(&random)), .restart(pipeline: Self.name(&random)),
            ]
            for request in requests {
                let line = request.encoded()
                #expect(!line.contains(0x0A), "one line: \(request)")
                #expect(try ControlRequest.decode(line) == request)
            }
        }
    }

    /// What whenctl sent before requests had a version still reads (a v1 whenctl never named one).
    @Test func requestsWithoutAVersionAreVersionOne() throws {
        #expect(try ControlRequest.decode(Array(#"{"command":"status"}"#.utf8)) == .status)
        #expect(
            try ControlRequest.decode(Array(#"{"plugin":"redact","command":"unload"}"#.utf8))
                == .unload(plugin: "redact"))
        #expect(
            try ControlRequest.decode(Array(#"{"command":"restart","pipeline":"screens"}"#.utf8))
                == .restart(pipeline: "screens"))
    }

    /// Every line that is not a request is refused with an error that says what to send.
    @Test func everyOtherLineIsRefusedSayingWhatToSend() {
        let cases: [(String, ControlRequestError)] = [
            ("not json", .notARequest), ("", .notARequest), (#"{"cmd":1}"#, .notARequest),
            (#"{"command":7}"#, .notARequest), (#"["status"]"#, .notARequest),
            (#"{"command":"explode"}"#, .unknownCommand("explode")),
            (#"{"command":"load"}"#, .missing("plugin", "load")),
            (#"{"command":"unload","plugin":""}"#, .missing("plugin", "unload")),
            (#"{"command":"restart","pipeline":3}"#, .missing("pipeline", "restart")),
            (#"{"command":"status","version":2}"#, .unsupportedVersion(2)),
            (#"{"command":"status","version":null}"#, .unsupportedVersion(nil)),
            (#"{"command":"status","version":"1"}"#, .unsupportedVersion(nil)),
            (#"{"command":"status","version":1.5}"#, .unsupportedVersion(nil)),
        ]
        for (line, expected) in cases {
            #expect(throws: expected, "\(line)") { try ControlRequest.decode(Array(line.utf8)) }
        }
        #expect(ControlRequestError.notARequest.description.contains("status, reload, metrics, plugins"))
        #expect(ControlRequestError.unsupportedVersion(2).description.contains("speaks version 1"))
        #expect(
            ControlRequestError.missing("plugin", "load").description.contains(#"{"command":"load","plugin":"NAME"}"#))
    }

    /// An answer as whend wrote it before the protocol was typed reads into the typed answer,
    /// and the typed answer writes the same members (`null` where nothing is configured or failing).
    @Test func answersReadAndWriteTheFieldsWhenctlAndScriptsRelyOn() throws {
        let earlier = #"""
            {"ok":true,"status":{"bytes_received":10,"config_file":null,"connections":1,"connections_refused":0,"control_socket":"/run/whend/control.sock","events_per_second":3,"events_received":2,"events_rejected":{"invalid_json":1},"journal":{"bytes":4096,"commits":2,"directory":"/var/lib/whend/journal","duplicates_skipped":0,"durability":"fsync","failing":null,"last_seq":2,"records_stored":2,"segments":1},"pending_bytes":0,"pid":42,"pipelines":[{"counters":{"screen-tracking":{"screen":1}},"cursor":2,"dead_letters":0,"failures":0,"lag":0,"lost_to_retention":0,"name":"screens","pid":43,"plugins":["screen-tracking"],"restarts":0,"skipped":0,"state":"running"}],"plugins":[{"name":"redact","state":"unloaded"}],"replies_dropped":0,"socket":"/run/whend/events.sock","state_dir":"/var/lib/whend","status_line":"ready","uptime_seconds":5,"version":"0.1.0"}}
            """#
        let answer = try #require(ControlAnswer.decode(Array(earlier.utf8)))
        let status = try #require(answer.status)
        #expect(status.configFile == nil && status.journal.failing == nil)
        #expect(status.pipelines.first?.counters["screen-tracking"]?["screen"] == 1)
        #expect(status.plugins == [PluginStatus(name: "redact", state: "unloaded")])
        #expect(status.eventsRejected == ["invalid_json": 1])
        // Written again: the same members, the same values.
        let again = try JSONSerialization.jsonObject(with: Data(answer.encoded())) as? NSDictionary
        let original = try JSONSerialization.jsonObject(with: Data(earlier.utf8)) as? NSDictionary
        #expect(again == original)
    }

    @Test func aReloadAnswerCarriesWhatChangedAndWhatWaits() throws {
        let answer = ControlAnswer(ok: false, error: "line 3: bad", changed: [], needRestart: ["socket"])
        let object = try JSONSerialization.jsonObject(with: Data(answer.encoded())) as? [String: Any]
        #expect(object?["ok"] as? Bool == false)
        #expect(object?["error"] as? String == "line 3: bad")
        #expect(object?["need_restart"] as? [String] == ["socket"])
        #expect(ControlAnswer.decode(answer.encoded()) == answer)
    }
}
