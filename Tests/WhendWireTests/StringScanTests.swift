import Foundation
import Testing

@testable import WhendWire

/// The SIMD search the event scanner crosses strings with (`firstStringSpecial`), against the
/// plain definition: the first byte that is `"`, `\` or below 0x20.
@Suite struct StringScanTests {
    func reference(_ bytes: [UInt8]) -> Int {
        bytes.firstIndex { $0 == 0x22 || $0 == 0x5C || $0 < 0x20 } ?? bytes.count
    }

    func found(_ bytes: [UInt8]) -> Int {
        bytes.withUnsafeBufferPointer { $0.isEmpty ? 0 : firstStringSpecial($0.baseAddress!, $0.count) }
    }

    /// Every byte value at every position of a 40-byte run of plain bytes (ASCII and above
    /// 0x7F, where a signed comparison would go wrong), so that each lane of the two 16-byte
    /// blocks and each byte of the tail meet each value.
    @Test func eachByteValueAtEachPositionAgreesWithTheDefinition() {
        for plain: UInt8 in [0x61, 0x20, 0x7F, 0x80, 0xC3, 0xFF] {
            for position in 0..<40 {
                for value in 0...255 {
                    var bytes = [UInt8](repeating: plain, count: 40)
                    bytes[position] = UInt8(value)
                    #expect(found(bytes) == reference(bytes), "byte \(value) at \(position) among \(plain)")
                }
            }
        }
    }

    /// Random lengths and contents weighted towards the special bytes, and searches that start
    /// and end anywhere.
    @Test func randomBuffersAgreeWithTheDefinition() {
        var generator = SystemRandomNumberGenerator()
        let alphabet: [UInt8] = [0x22, 0x5C, 0x00, 0x1F, 0x20, 0x61, 0x7F, 0x80, 0xFF, 0x0A, 0x09]
        for _ in 0..<200_000 {
            let length = Int.random(in: 0...70, using: &generator)
            let density = Int.random(in: 1...60, using: &generator)
            let bytes = (0..<length).map { _ in
                Int.random(in: 0..<density, using: &generator) == 0
                    ? alphabet.randomElement(using: &generator)! : UInt8.random(in: 0x20...0x7E, using: &generator)
            }
            let answer = found(bytes)
            guard answer == reference(bytes) else {
                Issue.record("\(bytes): \(answer), expected \(reference(bytes))")
                return
            }
        }
    }

    /// `decodedJSONString` reads strings as Foundation's JSON reader does: escapes and
    /// surrogate pairs decoded, a lone surrogate or bytes that are not UTF-8 refused.
    @Test func decodedStringsAreFoundationsOrNone() throws {
        let texts = [
            #""plain é""#, #""a\n\t\"\\\/\b\f\r""#, #""\u00e9\u0000\uD83D\ude00""#, #""\ud800""#,
            #""\udc00x""#, #""\ud800\ud800""#, #""x\uDBFF""#, #""\ud83d\u0041""#,
        ]
        for text in texts {
            let foundation = try? JSONSerialization.jsonObject(with: Data(text.utf8), options: [.fragmentsAllowed])
            #expect(decoded(Array(text.utf8)) == foundation as? String, "\(text)")
        }
        #expect(decoded([0x22, 0x61, 0xFF, 0x22]) == nil)
        #expect(decoded([0x22, 0x5C, 0x6E, 0xC3, 0x22]) == nil)
    }

    func decoded(_ text: [UInt8]) -> String? {
        text.withUnsafeBufferPointer { buffer in
            var scanner = JSONScanner(buffer)
            guard let (range, escaped) = try? scanner.scanString() else { return "(not scanned)" }
            return decodedJSONString(UnsafeBufferPointer(rebasing: buffer[range]), hasEscapes: escaped)
        }
    }
}
