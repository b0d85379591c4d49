/// Where the fields a tracking plan reads lie in an event line, found once by the scanner
/// (which knows where every known key is) so that a plan reads them without a second pass:
/// each nil when absent or not of its type.
package struct PlanFields: Sendable {
    package var name: StringValue?
    /// The `params` object's value range.
    package var params: Range<Int>?
    package var screen: StringValue?
    package var app: StringValue?

    package init() {}
}

extension EventScanner {
    /// The plan's fields among `members`, given where each known key is.
    @inline(__always)
    static func planFields(
        _ members: [EventMember], _ index: borrowing InlineArray<18, Int32>
    ) -> PlanFields {
        func string(_ k: KnownKey) -> StringValue? {
            let i = index[k.rawValue]
            guard i >= 0 else { return nil }
            let m = members[Int(i)]
            guard m.kind == .string else { return nil }
            return StringValue(
                contents: (m.valueRange.lowerBound + 1)..<(m.valueRange.upperBound - 1), escaped: m.valueEscaped)
        }
        var fields = PlanFields()
        fields.name = string(.name)
        fields.screen = string(.screen)
        fields.app = string(.app)
        let p = index[KnownKey.params.rawValue]
        if p >= 0, members[Int(p)].kind == .object { fields.params = members[Int(p)].valueRange }
        return fields
    }
}
