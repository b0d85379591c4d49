import WhendFuzzing

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOneInput(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    fuzzPluginOutput(UnsafeBufferPointer(start: data, count: size))
}
