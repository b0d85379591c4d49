/// A screen that knows its name for analytics (the screen-names proposal).
public protocol ScreenNaming {
    func screenName() -> String?
}

/// A screen that carries an accessibility identifier (the name's first fallback).
public protocol AccessibilityIdentifying {
    var accessibilityIdentifier: String? { get }
}

/// A screen driven by a view model (whose type name is the last fallback).
public protocol ViewModelProviding {
    var viewModelForScreenName: Any? { get }
}

/// The screen's name as the proposal resolves it: its own `screenName()`, else its
/// accessibility identifier, else the name of its view model's type. An empty name is no name.
public func resolvedScreenName(of screen: Any) -> String? {
    func nonEmpty(_ s: String?) -> String? { s.flatMap { $0.isEmpty ? nil : $0 } }
    if let named = screen as? ScreenNaming, let name = nonEmpty(named.screenName()) { return name }
    if let identified = screen as? AccessibilityIdentifying, let name = nonEmpty(identified.accessibilityIdentifier) {
        return name
    }
    if let driven = screen as? ViewModelProviding, let model = driven.viewModelForScreenName {
        if let named = model as? ScreenNaming, let name = nonEmpty(named.screenName()) { return name }
        return nonEmpty(String(describing: type(of: model)))
    }
    return nil
}

/// A screen's lifecycle changed (the lifecycle-observation proposal).
public struct ScreenLifecycleEvent: Sendable, Equatable {
    public enum Status: String, Sendable {
        case willAppear, didAppear, willDisappear, didDisappear
    }

    public var screen: String
    public var status: Status
    /// Presented by its container for the first time (only on willAppear/didAppear).
    public var isBeingPresentedInitially: Bool
    /// Leaving its container for good (only on willDisappear/didDisappear).
    public var isBeingRemovedIndefinitely: Bool

    public init(
        screen: String, status: Status, isBeingPresentedInitially: Bool = false,
        isBeingRemovedIndefinitely: Bool = false
    ) {
        self.screen = screen
        self.status = status
        self.isBeingPresentedInitially = isBeingPresentedInitially
        self.isBeingRemovedIndefinitely = isBeingRemovedIndefinitely
    }
}
