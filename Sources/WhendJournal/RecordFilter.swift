import WhendRecord

/// Which records a reader wants: the filters `whenctl cat`/`tail` and a subscription
/// (PROTOCOL.md §9) share, so that one request means one set of records wherever it is made.
package struct RecordFilter: Sendable, Equatable {
    package var app: [UInt8]?
    package var session: [UInt8]?
    /// Record types (`when`, `screen`, a derived type such as `screen_time`); empty for any.
    package var types: Set<String> = []
    /// `when` events' names; empty for any.
    package var names: Set<String> = []
    /// Only records a pipeline derived (true), or only clients' events (false).
    package var derived: Bool?
    /// Only records derived by this pipeline.
    package var pipeline: [UInt8]?
    package var fromSeq: UInt64?
    package var toSeq: UInt64?
    package var sinceMicros: Int64?
    package var untilMicros: Int64?

    package init(
        app: [UInt8]? = nil, session: [UInt8]? = nil, types: Set<String> = [], names: Set<String> = [],
        derived: Bool? = nil, pipeline: [UInt8]? = nil, fromSeq: UInt64? = nil, toSeq: UInt64? = nil,
        sinceMicros: Int64? = nil, untilMicros: Int64? = nil
    ) {
        self.app = app
        self.session = session
        self.types = types
        self.names = names
        self.derived = derived
        self.pipeline = pipeline
        self.fromSeq = fromSeq
        self.toSeq = toSeq
        self.sinceMicros = sinceMicros
        self.untilMicros = untilMicros
    }

    /// True when deciding needs more than `_seq`: the line must then be scanned.
    package var needsFields: Bool {
        app != nil || session != nil || !types.isEmpty || !names.isEmpty || derived != nil || pipeline != nil
            || sinceMicros != nil || untilMicros != nil
    }

    /// Whether `record` is wanted, scanning it only when a filter needs more than `_seq`.
    package func matches(_ record: JournalRecord) -> Bool {
        if let fromSeq, (record.seq ?? 0) < fromSeq { return false }
        guard needsFields else { return true }
        guard let fields = try? record.fields() else { return false }
        return matches(fields)
    }

    package func matches(_ r: StoredRecord) -> Bool {
        if let app, r.app != app { return false }
        if let session, r.session != session { return false }
        if !types.isEmpty, !types.contains(r.type ?? "") { return false }
        if !names.isEmpty, r.type != "when" || !names.contains(r.name ?? "") { return false }
        if let derived, r.isDerived != derived { return false }
        if let pipeline, r.pipeline != pipeline { return false }
        if let fromSeq, (r.seq ?? 0) < fromSeq { return false }
        if let sinceMicros, (r.receivedMicros ?? .min) < sinceMicros { return false }
        if let untilMicros, (r.receivedMicros ?? .max) >= untilMicros { return false }
        return true
    }

    /// True once no later record can match (`_seq` past `toSeq`).
    package func isPastEnd(_ r: JournalRecord) -> Bool {
        if let toSeq, let seq = r.seq, seq > toSeq { return true }
        return false
    }
}
