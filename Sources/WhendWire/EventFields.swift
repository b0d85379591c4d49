extension ScannedEvent {
    /// Where the fields a tracking plan reads lie in the line: `name`, `params` (its value's
    /// range), `screen` and `app`, each nil when absent or not of its type.
    package var planFields: (name: StringValue?, params: Range<Int>?, screen: StringValue?, app: StringValue?) {
        var fields: (name: StringValue?, params: Range<Int>?, screen: StringValue?, app: StringValue?)
        func string(_ m: EventMember) -> StringValue? {
            m.kind == .string
                ? StringValue(
                    contents: (m.valueRange.lowerBound + 1)..<(m.valueRange.upperBound - 1), escaped: m.valueEscaped)
                : nil
        }
        for m in members {
            switch m.key {
            case .name: fields.name = string(m)
            case .params: fields.params = m.kind == .object ? m.valueRange : nil
            case .screen: fields.screen = string(m)
            case .app: fields.app = string(m)
            default: break
            }
        }
        return fields
    }
}
