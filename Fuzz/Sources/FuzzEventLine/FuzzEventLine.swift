import WhendWire

/// Any bytes, as a connection's stream: every line gets an accept or an error code, never a
/// crash; and every accepted event becomes a stored record that is itself one valid JSON object.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzEventLine(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let input = UnsafeBufferPointer(start: data, count: size)
    var framer = LineFramer(maxLineBytes: 4096)
    var encoder = RecordEncoder(credentials: PeerCredentials(pid: 1, uid: 2, gid: 3, comm: "fuzz"))
    var members: [EventMember] = []
    var first = true
    var stored: [UInt8] = []
    func handle(_ piece: LineFramer.Piece) {
        guard case .line(let line) = piece else { return }
        let scanned: ScannedLine
        do {
            scanned = try EventScanner.scan(line, helloAllowed: first, reusing: &members)
        } catch {
            precondition(!error.message.isEmpty, "an error without a message")
            first = false
            return
        }
        switch scanned {
        case .empty: return
        case .hello(let hello):
            encoder = encoder.with(hello: hello)
        case .event(let event):
            stored = Array("{\"_seq\":1,".utf8)
            _ = encoder.appendBody(of: event, line: line, to: &stored)
            let record = stored.withUnsafeBufferPointer { try? StoredRecord.scan($0) }
            precondition(
                record != nil,
                "an accepted event was stored as invalid JSON: \(String(decoding: stored, as: UTF8.self))")
            precondition(record?.type == event.type.rawValue, "the stored type differs from the event's")
        }
        first = false
    }
    framer.feed(input, handle)
    framer.finish(handle)
    return 0
}
