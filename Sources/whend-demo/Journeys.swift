import Foundation
import SeededRandom
import WhenClient

/// A screen of the demo apps; its name comes the way the screen-names proposal asks.
struct DemoScreen: ScreenNaming {
    var name: String
    func screenName() -> String? { name }
}

/// The app's own navigator, playing the container's part too: as UIKit would, it reports the
/// lifecycle of the screens it covers, reveals and removes.
final class DemoNavigator: Navigator {
    private var stack: [DemoScreen] = []
    private let client: WhenClient

    init(client: WhenClient) { self.client = client }

    func handle(navigation: Navigation<DemoScreen>, animated: Bool) {
        switch navigation {
        case .root(let screen):
            for old in stack.reversed() { disappear(old, removed: true) }
            stack = [screen]
            appear(screen, initially: true)
        case .push(let screen), .present(let screen):
            if let top = stack.last { disappear(top, removed: false) }
            stack.append(screen)
            appear(screen, initially: true)
        case .replace(let screen):
            if let top = stack.popLast() { disappear(top, removed: true) }
            stack.append(screen)
            appear(screen, initially: true)
        case .dismiss, .pop:
            if let top = stack.popLast() { disappear(top, removed: true) }
            if let revealed = stack.last { appear(revealed, initially: false) }
        }
    }

    private func appear(_ screen: DemoScreen, initially: Bool) {
        client.emit(
            ScreenLifecycleEvent(screen: screen.name, status: .willAppear, isBeingPresentedInitially: initially))
        client.emit(ScreenLifecycleEvent(screen: screen.name, status: .didAppear, isBeingPresentedInitially: initially))
    }

    private func disappear(_ screen: DemoScreen, removed: Bool) {
        client.emit(
            ScreenLifecycleEvent(screen: screen.name, status: .willDisappear, isBeingRemovedIndefinitely: removed))
        client.emit(
            ScreenLifecycleEvent(screen: screen.name, status: .didDisappear, isBeingRemovedIndefinitely: removed))
    }
}

struct DemoError: Error, CustomStringConvertible {
    var description: String
}

/// What every journey needs: the client, a navigator decorated to report its moves, a seeded
/// random source, and the pace.
final class DemoApp {
    let client: WhenClient
    let navigator: TrackingNavigator<DemoNavigator>
    var random: SplitMix64
    let pace: () -> Void

    init(client: WhenClient, random: SplitMix64, pace: @escaping () -> Void) {
        self.client = client
        navigator = TrackingNavigator(DemoNavigator(client: client), client: client)
        self.random = random
        self.pace = pace
    }

    func go(_ navigation: Navigation<DemoScreen>) {
        navigator.handle(navigation: navigation)
        pace()
    }

    func chance(_ oneIn: UInt64) -> Bool { random.next() % oneIn == 0 }
}

// MARK: The Marvel characters browser

final class CharacterListViewModel: SingleEntryPoint {
    enum When: Codable {
        case userScrollsCharacterList(offset: Int)
        case userTapsCharacter(characterId: Int)
    }

    let app: DemoApp
    var offset = 0
    init(app: DemoApp) { self.app = app }

    func handle(_ when: When) {
        app.client.reporting(when, screen: "CharacterList") { when in
            switch when {
            case .userScrollsCharacterList(let offset): self.offset = offset
            case .userTapsCharacter(let id):
                app.go(.push(DemoScreen(name: "CharacterDetail")))
                CharacterDetailViewModel(app: app, characterId: id).browse()
                app.go(.pop)
            }
        }
        app.pace()
    }
}

final class CharacterDetailViewModel: SingleEntryPoint {
    enum When: Codable {
        case userTapsFavourite(characterId: Int, on: Bool)
        case comicsDidLoad(characterId: Int)
    }

    let app: DemoApp
    let characterId: Int
    init(app: DemoApp, characterId: Int) {
        self.app = app
        self.characterId = characterId
    }

    func browse() {
        if app.chance(2) { handle(.userTapsFavourite(characterId: characterId, on: true)) }
        handle(.comicsDidLoad(characterId: characterId))
    }

    func handle(_ when: When) {
        try? app.client.reporting(when, screen: "CharacterDetail") { when in
            if case .comicsDidLoad = when, app.chance(25) {
                throw DemoError(description: "comics request failed: HTTP 503")
            }
        }
        app.pace()
    }
}

func marvelJourney(_ app: DemoApp) {
    app.go(.root(DemoScreen(name: "CharacterList")))
    let list = CharacterListViewModel(app: app)
    for _ in 0..<(1 + Int(app.random.next() % 3)) {
        list.handle(.userScrollsCharacterList(offset: Int(app.random.next() % 400)))
        list.handle(.userTapsCharacter(characterId: 1_009_000 + Int(app.random.next() % 1000)))
    }
}

// MARK: The email-change screen (the single-entry-point article's)

final class ChangeEmailViewModel: SingleEntryPoint {
    enum When: Codable {
        case userTypesNewEmail(userEmail: String)
        case userTapsChangeEmailButton
    }

    let app: DemoApp
    var email = ""
    var savedEmail: String?
    init(app: DemoApp) { self.app = app }

    func handle(_ when: When) {
        try? app.client.reporting(when, screen: "ChangeEmail") { when in
            switch when {
            case .userTypesNewEmail(let email): self.email = email
            case .userTapsChangeEmailButton:
                if app.chance(10) { throw DemoError(description: "the address is already in use") }
                savedEmail = email
            }
        }
        app.pace()
    }
}

func emailChangeJourney(_ app: DemoApp) {
    app.go(.present(DemoScreen(name: "ChangeEmail")))
    let model = ChangeEmailViewModel(app: app)
    model.handle(.userTypesNewEmail(userEmail: "user\(app.random.next() % 100_000)@example.com"))
    model.handle(.userTapsChangeEmailButton)
    app.go(.dismiss)
}

// MARK: The GP onboarding flow

final class OnboardingViewModel: SingleEntryPoint {
    enum When: Codable {
        case userTapsGetStarted
        case userAcceptsTerms(version: String)
        case userEntersPostcode(postcode: String)
        case userSelectsPractice(practiceId: String, distanceKm: Int)
    }

    let app: DemoApp
    init(app: DemoApp) { self.app = app }

    func handle(_ when: When) {
        app.client.reporting(when) { _ in }
        app.pace()
    }
}

func onboardingJourney(_ app: DemoApp, fatalOneIn: UInt64) {
    let model = OnboardingViewModel(app: app)
    app.go(.root(DemoScreen(name: "Welcome")))
    model.handle(.userTapsGetStarted)
    app.go(.push(DemoScreen(name: "Consent")))
    model.handle(.userAcceptsTerms(version: "2026-03"))
    app.go(.push(DemoScreen(name: "PersonalDetails")))
    model.handle(.userEntersPostcode(postcode: "SW\(app.random.next() % 20) \(app.random.next() % 9)AA"))
    app.go(.push(DemoScreen(name: "ChoosePractice")))
    model.handle(
        .userSelectsPractice(practiceId: "P\(app.random.next() % 90000)", distanceKm: Int(app.random.next() % 30)))
    if fatalOneIn > 0 && app.chance(fatalOneIn) {
        // The app dies here: what a crash reporter is for.
        app.client.emit([
            "type": "error", "fatal": true, "message": "practice list index out of range", "screen": "ChoosePractice",
            "stack": ["ChoosePracticeViewModel.select(_:)", "OnboardingFlow.next()"],
        ])
        app.pace()
        return
    }
    app.go(.replace(DemoScreen(name: "Done")))
}
