import Foundation
import Testing

/// `whenctl ui` in a real browser: a real whend (with the built-in pipelines, whose screens,
/// sessions and crash reports the page shows), a real `whenctl ui` process, and headless
/// Chromium driven by Selenium. Each test leaves a screenshot in `.build/ui-screenshots/`.
@Suite(.serialized) struct UITests {
    /// whend, `whenctl ui` and a browser, for one test.
    struct Rig {
        let daemon: TestDaemon
        let ui: UIProcess
        let browser: UIBrowser

        init(_ name: String, arguments: [String] = []) throws {
            daemon = TestDaemon("ui-\(name)", arguments: ["--builtin-pipelines", "true"] + arguments)
            try daemon.start()
            ui = try UIProcess(daemon)
            browser = try UIBrowser()
        }

        /// Sends `events` with `whenctl emit` as one session; every one must be stored.
        func emit(app: String, session: String, _ events: [String]) throws {
            let r = try whenctl(["emit", "--socket", daemon.socketPath, "--app", app, "--session", session] + events)
            #expect(r.status == 0, "whenctl emit: \(r.error)")
        }

        /// Until every pipeline has handled what the journal holds (and what they derived).
        func waitForPipelines() throws {
            let r = try daemon.whenctl(["plugins", "--wait", "--timeout", "60"])
            #expect(r.status == 0, "whenctl plugins --wait: \(r.error)")
        }

        /// Opens the page with its token (on the view `fragment` names) and waits until its live
        /// stream has caught up.
        func open(_ fragment: String = "") throws {
            try browser.get(ui.url + (fragment.isEmpty ? "" : "&" + fragment.dropFirst()))
            try browser.wait(
                "const s = document.getElementById('live-status'); return s && s.textContent.startsWith('live')")
        }

        func stop() {
            daemon.stop()
        }
    }

    /// Screens of one onboarding, as an app reports them: navigation and lifecycle.
    static func journey(_ screens: [String]) -> [String] {
        var events: [String] = []
        for (i, screen) in screens.enumerated() {
            if i > 0 {
                events.append(#"{"type":"lifecycle","screen":"\#(screens[i - 1])","status":"willDisappear"}"#)
                events.append(#"{"type":"lifecycle","screen":"\#(screens[i - 1])","status":"didDisappear"}"#)
            }
            events.append(#"{"type":"navigation","action":"\#(i == 0 ? "root" : "push")","screen":"\#(screen)"}"#)
            events.append(#"{"type":"lifecycle","screen":"\#(screen)","status":"willAppear"}"#)
            events.append(#"{"type":"lifecycle","screen":"\#(screen)","status":"didAppear"}"#)
            events.append(#"{"type":"when","name":"userLeaves\#(screen)","screen":"\#(screen)"}"#)
        }
        return events
    }

    /// whend's data is served to the token only, and only under this server's own name: another
    /// site's page that has its name resolve to 127.0.0.1 is refused. The page itself holds
    /// nothing and is served to anyone who names the server rightly.
    @Test func thePageNeedsItsTokenAndItsOwnHostName() throws {
        let rig = try Rig("guard")
        defer { rig.stop() }
        // 32 bytes, in hex, and another for another run; in the fragment, which is never sent.
        #expect(rig.ui.token.count == 64 && rig.ui.token.allSatisfy(\.isHexDigit), "\(rig.ui.token)")
        #expect(rig.ui.url == "\(rig.ui.base)/#token=\(rig.ui.token)")
        #expect(try UIProcess(rig.daemon).token != rig.ui.token)
        let host = "127.0.0.1:\(rig.ui.port)"
        let bearer = "Authorization: Bearer \(rig.ui.token)"

        for path in ["/api/overview", "/api/stream", "/api/record/1", "/api/sessions", "/api/metrics", "/nothing"] {
            let noToken = try rawHTTP(port: rig.ui.port, path: path, host: host)
            #expect(noToken.status == 403 && noToken.body.contains("needs the token"), "\(path): \(noToken)")
        }
        let wrong = String(repeating: "0", count: 64)
        for (path, headers) in [
            ("/api/overview?token=\(wrong)", []), ("/api/overview", ["Authorization: Bearer \(wrong)"]),
            ("/api/overview", ["Authorization: Basic \(rig.ui.token)"]),
            ("/api/overview?token=\(rig.ui.token.prefix(63))", []),
            // A cookie is no way in: browsers send one to every port of the host.
            ("/api/overview", ["Cookie: whenctl_ui_\(rig.ui.port)=\(rig.ui.token)", "Cookie: token=\(rig.ui.token)"]),
        ] {
            let refused = try rawHTTP(port: rig.ui.port, path: path, host: host, headers: headers)
            #expect(refused.status == 403, "\(path) \(headers): \(refused)")
        }
        // The page's parts are served without the token, and never set a cookie.
        for path in ["/", "/app.js", "/views.js", "/style.css", "/?token=\(rig.ui.token)"] {
            let asset = try rawHTTP(port: rig.ui.port, path: path, host: host)
            #expect(asset.status == 200 && !asset.body.contains(rig.ui.token), "\(path): \(asset.status)")
            #expect(!asset.head.lowercased().contains("set-cookie"), "\(path): \(asset.head)")
        }
        for foreign in ["evil.example:\(rig.ui.port)", "127.0.0.1:1", "localhost", "127.0.0.1.nip.io:\(rig.ui.port)"] {
            for path in ["/", "/api/overview"] {
                let rebound = try rawHTTP(port: rig.ui.port, path: path, host: foreign, headers: [bearer])
                #expect(
                    rebound.status == 421
                        && rebound.body.contains("127.0.0.1:\(rig.ui.port) and localhost:\(rig.ui.port) only"),
                    "\(foreign)\(path): \(rebound)")
            }
        }
        for extra in ["Host: evil.example", "Host: \(host)", "host: localhost:\(rig.ui.port)"] {
            let twice = try rawHTTP(port: rig.ui.port, path: "/api/overview", host: host, headers: [bearer, extra])
            #expect(twice.status == 400 && twice.body.contains("one Host"), "\(extra): \(twice)")
        }
        for name in [host, "localhost:\(rig.ui.port)"] {
            #expect(try rawHTTP(port: rig.ui.port, path: "/api/overview", host: name, headers: [bearer]).status == 200)
            #expect(
                try rawHTTP(port: rig.ui.port, path: "/api/overview?token=\(rig.ui.token)", host: name).status == 200)
        }

        // In the browser: without the token the page says what to open; with it, it works, and
        // the token leaves the address bar for the page's local storage, not a cookie.
        try rig.browser.get(rig.ui.base + "/")
        let refused = try rig.browser.js("return document.body.innerText") as? String ?? ""
        #expect(refused.contains("needs the token") && refused.contains("#token="), "\(refused)")
        rig.browser.screenshot("01-refused-without-token")
        try rig.open()
        #expect(try rig.browser.js("return document.title") as? String == "whend debugger")
        #expect(try rig.browser.js("return location.href") as? String == rig.ui.base + "/")
        #expect(try rig.browser.js("return document.cookie") as? String == "")
        try rig.browser.wait("return document.getElementById('daemon').textContent.includes('whend 0.1')")
        rig.browser.screenshot("02-page-with-token")
        // A record opened in a tab of its own (a link opened in a new tab, an address pasted)
        // has the token too.
        try rig.emit(app: "com.example.mail", session: "t1", [#"{"type":"when","name":"inANewTab"}"#])
        try rig.browser.newTab(rig.ui.base + "/#record/1")
        try rig.browser.wait("return document.getElementById('record-json').textContent.includes('inANewTab')")
    }

    /// No other server on 127.0.0.1 learns the token from the browser: not the page's own
    /// origin on another port (browsers send a host's cookies to all its ports), not through a
    /// referrer, not after the page was reloaded or left.
    @Test func noOtherLocalServerIsSentTheToken() throws {
        let rig = try Rig("token-leak")
        defer { rig.stop() }
        let other = try HeaderRecorder()
        try rig.open()
        try rig.browser.get(rig.ui.base + "/#sessions")
        try rig.browser.wait("return document.getElementById('daemon').textContent.includes('whend 0.1')")
        for path in ["/", "/app.js", "/api/overview"] {
            try rig.browser.get("http://127.0.0.1:\(other.port)\(path)")
            try rig.browser.get("http://localhost:\(other.port)\(path)")
        }
        let seen = other.requests()
        #expect(seen.count >= 6, "\(seen)")
        #expect(!seen.contains { $0.contains(rig.ui.token) }, "\(seen)")
    }

    /// A web server that held the port before `whenctl ui` took it cannot have left a script in
    /// the browser's cache (or anything else kept per origin) to run in the page and read its
    /// token: the page's origin is a host name of this run's own. (On 127.0.0.1:PORT, the
    /// script it cached as /app.js ran as the page's own and put the token in a cookie, which
    /// the browser then sent to every port of 127.0.0.1.)
    @Test func aServerThatHeldThePortBeforeCannotPlantAScript() throws {
        let daemon = TestDaemon("ui-planted", arguments: ["--builtin-pipelines", "true"])
        try daemon.start()
        defer { daemon.stop() }
        let planted = #"document.cookie = "stolen=" + encodeURIComponent(location.hash) + "; path=/";"#
        let earlier = try HeaderRecorder(
            pages: [
                "/": ("text/html", #"<!doctype html><title>a dev server</title><script src="/app.js"></script>"#),
                "/app.js": ("text/javascript", planted),
            ], cacheControl: "max-age=31536000")
        let browser = try UIBrowser()
        try browser.get("http://127.0.0.1:\(earlier.port)/")
        try browser.wait("return document.cookie.startsWith('stolen=')")
        try browser.js("document.cookie = 'stolen=; max-age=0; path=/'")
        earlier.stop()

        let ui = try UIProcess(daemon, arguments: ["--port", String(earlier.port)])
        try browser.get(ui.url)
        try browser.wait(
            "const s = document.getElementById('live-status'); return s && s.textContent.startsWith('live')")
        let thief = try HeaderRecorder()
        try browser.get("http://127.0.0.1:\(thief.port)/")
        let seen = thief.requests()
        #expect(!seen.isEmpty && !seen.contains { $0.contains(ui.token) }, "\(seen)")
    }

    /// The page shows what the user running `whenctl ui` may read, no more: a user whend does
    /// not let subscribe sees `forbidden` where the records would be; a member of
    /// `subscribe_group` sees the records, and is told that the control socket (an operator's)
    /// is not theirs.
    @Test(.enabled(if: getuid() == 0 && FileManager.default.isExecutableFile(atPath: "/usr/bin/setpriv")))
    func thePageShowsOnlyWhatItsUserMaySee() throws {
        let daemon = TestDaemon("ui-users", arguments: ["--builtin-pipelines", "true", "--subscribe-group", "users"])
        try daemon.start()
        defer { daemon.stop() }
        // The sockets' directory must let other users reach the event socket.
        chmod(daemon.directory, 0o755)
        try sendSession(daemon, app: "com.example.mail", session: "u1", [#"{"type":"when","name":"seenByMembers"}"#])
        let browser = try UIBrowser()

        let outsider = try UIProcess(
            daemon, as: ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"])
        try browser.get(outsider.url)
        let refused =
            try browser.wait(
                "const t = document.getElementById('live-status').textContent; return t.includes('forbidden') && t")
            as? String ?? ""
        #expect(refused.contains("subscribe"), "\(refused)")
        #expect(try browser.texts("#live-list .record").isEmpty)
        try browser.wait("return document.getElementById('daemon').textContent.includes('whend:')")
        browser.screenshot("14-not-a-subscriber")

        let member = try UIProcess(daemon, as: ["/usr/bin/setpriv", "--reuid=65534", "--regid=100", "--clear-groups"])
        try browser.get(member.url)
        try browser.wait(
            "return [...document.querySelectorAll('#live-list .record')].some(r => r.textContent.includes('seenByMembers'))"
        )
        let header =
            try browser.wait(
                "const t = document.getElementById('daemon').textContent; return t.includes('whend:') && t") as? String
            ?? ""
        #expect(header.contains("control.sock"), "\(header)")
        browser.screenshot("15-a-subscriber-not-an-operator")
    }

    /// An event `whenctl emit` sends is on the live view within a second of being sent.
    @Test func anEmittedEventAppearsOnTheLiveViewWithinASecond() throws {
        let rig = try Rig("live")
        defer { rig.stop() }
        try rig.open()
        // The moment a row for it is added, by the page's own clock (the same as the test's).
        _ = try rig.browser.js(
            """
            window.seenAt = null;
            new MutationObserver(() => {
              if (!window.seenAt && [...document.querySelectorAll('#live-list .record')].some(r => r.textContent.includes('userTapsLiveButton')))
                window.seenAt = Date.now();
            }).observe(document.getElementById('live-list'), {childList: true});
            """)
        let sent = Date()
        try rig.emit(app: "com.example.live", session: "l1", [#"{"type":"when","name":"userTapsLiveButton"}"#])
        let seenAt = try rig.browser.wait("return window.seenAt", timeout: 5) as? Double ?? 0
        let latency = seenAt / 1000 - sent.timeIntervalSince1970
        #expect(latency < 1, "the event showed \(latency) s after whenctl emit started")
        let row = try rig.browser.texts("#live-list .record[data-type=when]").first ?? ""
        #expect(row.contains("com.example.live/l1") && row.contains("userTapsLiveButton"), "\(row)")
        rig.browser.screenshot("03-live-event")

        // Paused, new records are held and counted, and shown on Resume.
        try rig.browser.click("#pause")
        try rig.emit(app: "com.example.live", session: "l1", [#"{"type":"when","name":"userWaits"}"#])
        try rig.browser.wait("return document.getElementById('live-status').textContent.includes('1 new held')")
        #expect(try rig.browser.texts("#live-list .record .what").allSatisfy { !$0.contains("userWaits") })
        try rig.browser.click("#pause")
        #expect(try rig.browser.texts("#live-list .record .what").first == "userWaits")
        // Raw: the records as stored, from the journal again.
        try rig.browser.click("#view-mode")
        let raw =
            try rig.browser.wait(
                "const r = document.querySelectorAll('#live-list .record code.raw'); return r.length == 2 && [...r].map(e => e.textContent)"
            ) as? [String] ?? []
        #expect(raw.count == 2 && raw.allSatisfy { $0.hasPrefix(#"{"_seq":"#) }, "\(raw)")
    }

    /// The page's stream outlives whend: while whend is down the page says so and tries again,
    /// and once whend is back the browser's reconnect (its Last-Event-ID) resumes after the last
    /// record shown: nothing is missed and nothing shown twice.
    @Test func theLiveViewResumesAfterWhendRestartsMissingAndRepeatingNothing() throws {
        let rig = try Rig("resume")
        defer { rig.stop() }
        try rig.emit(app: "com.example.mail", session: "r1", (0..<3).map { #"{"type":"when","name":"before\#($0)"}"# })
        try rig.open()
        try rig.browser.wait("return document.querySelectorAll('#live-list .record[data-type=when]').length == 3")
        rig.daemon.stop()
        try rig.browser.wait(
            "return /unreachable|reconnecting|closed/.test(document.getElementById('live-status').textContent)")
        rig.browser.screenshot("12-whend-down")
        try rig.daemon.start()
        try rig.emit(app: "com.example.mail", session: "r1", (0..<3).map { #"{"type":"when","name":"after\#($0)"}"# })
        try rig.browser.wait(
            "return [...document.querySelectorAll('#live-list .record')].some(r => r.textContent.includes('after2'))",
            timeout: 15)
        let shown =
            try rig.browser.js(
                "return [...document.querySelectorAll('#live-list .record')].map(r => Number(r.dataset.seq))") as? [Int]
            ?? []
        let stored = rig.daemon.records().compactMap { $0["_seq"] as? Int }
        #expect(shown.sorted() == stored, "shown \(shown.sorted()), stored \(stored)")
        rig.browser.screenshot("13-resumed")
    }

    /// A filter by session shows that session's records and no other's, from the journal and as
    /// they come.
    @Test func aSessionFilterShowsOnlyThatSession() throws {
        let rig = try Rig("filter")
        defer { rig.stop() }
        for session in ["wanted", "other"] {
            try rig.emit(
                app: "com.example.mail", session: session, (0..<3).map { #"{"type":"when","name":"before\#($0)"}"# })
        }
        try rig.open()
        try rig.browser.type("#f-session", "wanted")
        try rig.browser.click("#f-apply")
        try rig.browser.wait(
            "return document.querySelectorAll('#live-list .record').length >= 3 && document.getElementById('live-status').textContent.startsWith('live')"
        )
        for session in ["other", "wanted"] {
            try rig.emit(app: "com.example.mail", session: session, [#"{"type":"when","name":"after"}"#])
        }
        try rig.browser.wait(
            "return [...document.querySelectorAll('#live-list .record')].some(r => r.textContent.includes('after'))",
            timeout: 5)
        // Time for a record of the other session to arrive, if the filter let it through.
        usleep(500_000)
        let sessions =
            try rig.browser.js(
                "return [...document.querySelectorAll('#live-list .record')].map(r => r.dataset.session)") as? [String]
            ?? []
        let names = try rig.browser.texts("#live-list .record .what")
        #expect(!sessions.isEmpty && sessions.allSatisfy { $0 == "wanted" }, "\(sessions)")
        #expect(names.filter { $0.hasPrefix("before") || $0.hasPrefix("after") }.count == 4, "\(names)")
        rig.browser.screenshot("04-session-filter")
    }

    /// A session's timeline lists the screens it showed, in order, as screen-tracking saw them,
    /// each with its time on screen; a click on one shows its record.
    @Test func aSessionTimelineListsItsScreensInOrder() throws {
        let rig = try Rig("timeline")
        defer { rig.stop() }
        let screens = ["Welcome", "Consent", "PersonalDetails", "ChoosePractice"]
        try rig.emit(app: "uk.nhs.gp-onboarding", session: "t1", Self.journey(["Other"]))
        try rig.emit(app: "uk.nhs.gp-onboarding", session: "t2", Self.journey(screens))
        try rig.waitForPipelines()
        try rig.open("#sessions")
        try rig.browser.wait("return document.querySelector('#sessions-table tr.session-row[data-session=\"t2\"] a')")
        try rig.browser.click("#sessions-table tr.session-row[data-session=\"t2\"] a")
        try rig.browser.wait("return document.getElementById('session-status').textContent.includes('record(s)')")
        let shown = try rig.browser.texts("#timeline .tl-screen .screen-name")
        #expect(shown == screens, "\(shown)")
        let chips = try rig.browser.texts("#timeline-screens .chip")
        #expect(chips == screens, "\(chips)")
        let durations = try rig.browser.texts("#timeline .tl-screen .duration")
        #expect(durations.dropLast().allSatisfy { $0.hasSuffix("s on screen") }, "\(durations)")
        let whens = try rig.browser.texts("#timeline .tl-when .what")
        #expect(whens == screens.map { "userLeaves\($0)" }, "\(whens)")
        rig.browser.screenshot("05-session-timeline")
        try rig.browser.click("#timeline .tl-screen .screen-name")
        let record =
            try rig.browser.wait(
                "return document.getElementById('record-json').textContent.includes('screen-tracking') && document.getElementById('record-json').textContent"
            ) as? String ?? ""
        #expect(record.contains(#""name": "Welcome""#), "\(record)")
        rig.browser.screenshot("06-record")
    }

    /// A crash report shows its error and the breadcrumbs before it, oldest first, each linked to
    /// its record.
    @Test func aCrashReportShowsItsBreadcrumbs() throws {
        let rig = try Rig("crash")
        defer { rig.stop() }
        try rig.emit(
            app: "uk.nhs.gp-onboarding", session: "c1",
            Self.journey(["Welcome", "ChoosePractice"]) + [
                #"{"type":"when","name":"userSelectsPractice","params":{"practiceId":"P1"}}"#,
                #"{"type":"error","message":"practice list index out of range","fatal":true,"screen":"ChoosePractice","stack":["ChoosePracticeViewModel.select(_:)"]}"#,
            ])
        try rig.waitForPipelines()
        try rig.open("#crashes")
        try rig.browser.wait("return document.querySelector('#crash-list tr.crash-row a')")
        try rig.browser.click("#crash-list tr.crash-row a")
        try rig.browser.wait("return document.querySelectorAll('#crumbs tr.crumb').length > 0")
        let message = try rig.browser.texts("#crash-detail .error-message")
        #expect(message == ["practice list index out of range"])
        let crumbs = try rig.browser.texts("#crumbs tr.crumb td:nth-child(4)")
        let expected = ["root Welcome", "Welcome willAppear", "Welcome didAppear"]
        #expect(Array(crumbs.prefix(3)) == expected, "\(crumbs)")
        #expect(crumbs.contains { $0.hasPrefix("userSelectsPractice") && $0.contains("P1") }, "\(crumbs)")
        let seqs = try rig.browser.texts("#crumbs tr.crumb td:first-child a").compactMap { Int($0.dropFirst()) }
        #expect(seqs == seqs.sorted() && seqs.count == crumbs.count, "\(seqs)")
        rig.browser.screenshot("07-crash-report")
    }

    /// The views fed by the control socket: pipelines with their counters, rates, the screen
    /// flow, and the events whend refused, with why and who sent them.
    @Test func pipelinesRatesFlowAndRejections() throws {
        let rig = try Rig("views")
        defer { rig.stop() }
        try rig.emit(app: "com.example.marvel", session: "f1", Self.journey(["CharacterList", "CharacterDetail"]))
        try rig.waitForPipelines()
        try rig.open("#pipelines")
        try rig.browser.wait("return document.querySelectorAll('#pipelines-table tr.pipeline-row').length >= 4")
        let pipelines =
            try rig.browser.js(
                "return [...document.querySelectorAll('#pipelines-table tr.pipeline-row')].map(r => r.dataset.pipeline)"
            ) as? [String] ?? []
        #expect(Set(pipelines).isSuperset(of: ["screens", "sessions", "crashes", "analytics"]), "\(pipelines)")
        rig.browser.screenshot("08-pipelines")
        try rig.browser.js("location.hash = '#flow'")
        try rig.browser.wait("return document.querySelector('#flow-svg g.node[data-name=\"CharacterDetail\"]')")
        let edges = try rig.browser.texts("#flow-svg g.edge title")
        #expect(edges.contains("CharacterList → CharacterDetail: 1"), "\(edges)")
        rig.browser.screenshot("09-flow")
        try rig.browser.js("location.hash = '#rates'")
        try rig.browser.wait("return document.querySelectorAll('#rates-svg path.series').length > 0", timeout: 15)
        rig.browser.screenshot("10-rates")
        let refused = try whenctl([
            "emit", "--socket", rig.daemon.socketPath, "--app", "com.example.mail",
            #"{"type":"lifecycle","screen":"Detail"}"#,
        ])
        #expect(refused.status == 1)
        try rig.browser.js("location.hash = '#rejections'")
        try rig.browser.wait("return document.querySelectorAll('#rejections-table tbody tr').length == 1")
        let cells = try rig.browser.texts("#rejections-table tbody tr td")
        #expect(cells.count == 7 && cells[1] == "missing_field" && cells[2] == "com.example.mail", "\(cells)")
        #expect(cells.count == 7 && cells[5].contains("status") && cells[6].contains(#""screen":"Detail""#), "\(cells)")
        rig.browser.screenshot("11-rejections")
        // Every view was drawn without a script error or a refused script, style or request.
        let errors = try rig.browser.consoleLog().filter { $0.hasPrefix("SEVERE") }
        #expect(errors.isEmpty, "\(errors)")
    }

    /// The tracking plan's violations, below the rejected events: the counts and the latest,
    /// stored in report mode.
    @Test func planViolationsBesideTheRejections() throws {
        let plan = scratchDirectory("ui-plan") + "/plan.json"
        try #"{"events":{"userTapsCharacter":{"type":"object","required":["characterId"]}}}"#.write(
            toFile: plan, atomically: true, encoding: .utf8)
        let rig = try Rig("plan", arguments: ["--tracking-plan", plan])
        defer { rig.stop() }
        try rig.emit(
            app: "com.example.marvel", session: "p1",
            [#"{"type":"when","name":"userTapsCharacter","params":{"id":7}}"#])
        try rig.open("#rejections")
        try rig.browser.wait("return document.querySelectorAll('#violations-latest tbody tr').length == 1")
        let counts = try rig.browser.texts("#violations-counts tbody tr td")
        #expect(counts == ["1", "userTapsCharacter", "required"], "\(counts)")
        let cells = try rig.browser.texts("#violations-latest tbody tr td")
        #expect(cells.count == 8 && cells[1] == "stored" && cells[5] == "$.params", "\(cells)")
        rig.browser.screenshot("12-plan-violations")
        let errors = try rig.browser.consoleLog().filter { $0.hasPrefix("SEVERE") }
        #expect(errors.isEmpty, "\(errors)")
    }
}
