/// Where a navigator goes, in the Navigator article's shape (plain Swift, no UIKit).
public enum Navigation<Screen> {
    case root(Screen)
    case push(Screen)
    case present(Screen)
    case replace(Screen)
    case dismiss
    case pop

    var action: String {
        switch self {
        case .root: "root"
        case .push: "push"
        case .present: "present"
        case .replace: "replace"
        case .dismiss: "dismiss"
        case .pop: "pop"
        }
    }

    var screen: Screen? {
        switch self {
        case .root(let s), .push(let s), .present(let s), .replace(let s): s
        case .dismiss, .pop: nil
        }
    }
}

public protocol Navigator {
    associatedtype Screen
    func handle(navigation: Navigation<Screen>, animated: Bool)
}

/// Decorates a navigator so that every move is also a `navigation` event, as the flow-decoration
/// proposal decorates a flow: the base navigator moves first, then the event is emitted.
public struct TrackingNavigator<Base: Navigator>: Navigator {
    public let base: Base
    public let client: WhenClient

    public init(_ base: Base, client: WhenClient) {
        self.base = base
        self.client = client
    }

    public func handle(navigation: Navigation<Base.Screen>, animated: Bool) {
        base.handle(navigation: navigation, animated: animated)
        var event: [String: Any] = ["type": "navigation", "action": navigation.action]
        if let screen = navigation.screen {
            // A screen with no name still moved the navigator: say so rather than invent one.
            event["screen"] = resolvedScreenName(of: screen) ?? "unnamed \(type(of: screen))"
        }
        client.emit(event)
    }
}

extension Navigator {
    public func handle(navigation: Navigation<Screen>) { handle(navigation: navigation, animated: true) }
}
