# whend — two commands do all the set-up: `make run` and `make test`.
SWIFT ?= swift
# C libraries and tools whend builds with, from Debian.
DEBIAN_PACKAGES := libzstd-dev libsystemd-dev libnats-dev zlib1g-dev libcurl4-openssl-dev zstd pkg-config
# What the tests use besides: systemd-socket-activate and systemd-analyze (systemd), a small
# ext4 filesystem to freeze (e2fsprogs, util-linux), strip for the .deb (binutils), JetStream
# for the nats plugin (nats-server), FUSE from Python for the power-cut file system (python3-fusepy),
# man to read the installed man pages (man-db), what the README's tour uses (socat, jq), and
# promtool to check the metrics as Prometheus reads them (prometheus), Python's venv for
# the readers from PyPI below (python3-venv), and a browser for `whenctl ui`'s page, headless,
# with the driver Selenium speaks to (chromium, chromium-driver), and gdb, for where a suite that
# hangs waits (Tests/run-suite.sh).
TEST_PACKAGES := systemd e2fsprogs util-linux binutils nats-server python3-fusepy man-db socat jq prometheus \
	python3-venv chromium chromium-driver gdb
# Readers of whend's formats that nobody here wrote, from PyPI, in a virtual environment of the
# tests' own: pyzstd's seekable-format reader, Segment's own Python library, OpenTelemetry's
# generated protobuf code (the OTLP decoder), Selenium, which drives the browser, and jsonschema,
# the validator the tracking plan's verdicts are compared with.
TEST_VENV := .build/test-venv
TEST_PYTHON_PACKAGES := pyzstd==0.20.0 segment-analytics-python==2.4.0 opentelemetry-proto==1.45.2 selenium==4.51.0 jsonschema==4.26.0

.PHONY: deps test-deps build release run test soak strict lint docs bench bench-client fuzz fuzz-differential harnesses deb package-check system-test clean

# Installs what is missing, and nothing when all is there (so `make run` needs no root twice);
# waits up to ten minutes for another apt or dpkg to let go of their lock instead of failing.
define install_missing
	@missing=""; for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		if [ "$$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi; \
		$$sudo apt-get -o DPkg::Lock::Timeout=600 update -qq && \
		DEBIAN_FRONTEND=noninteractive $$sudo apt-get -o DPkg::Lock::Timeout=600 install -y -qq $$missing; \
	fi
endef

deps:
	$(call install_missing,$(DEBIAN_PACKAGES))

test-deps:
	$(call install_missing,$(DEBIAN_PACKAGES) $(TEST_PACKAGES))
	@test -x $(TEST_VENV)/bin/python || /usr/bin/python3 -m venv $(TEST_VENV)
	@$(TEST_VENV)/bin/python -c "import pyzstd, segment.analytics, opentelemetry.proto, selenium, jsonschema" 2>/dev/null || \
		$(TEST_VENV)/bin/pip install -q $(TEST_PYTHON_PACKAGES)

build: deps
	$(SWIFT) build

release: deps
	$(SWIFT) build -c release

# The daemon on its embedded defaults, in the foreground; Ctrl-C stops it gracefully. An
# installed package's /etc/whend/whend.conf is not read (it is the service's, and only root and
# the group whend-config may read it): set WHEND_CONFIG to run on a file of your own.
run: build
	WHEND_CONFIG="$${WHEND_CONFIG:-/dev/null}" .build/debug/whend

# Warnings in whend's own code fail the build (a dropped result is often a dropped error).
test: test-deps
	@mkdir -p .build
	@$(SWIFT) build --build-tests > .build/build-tests.log 2>&1; status=$$?; cat .build/build-tests.log; \
	if [ $$status -ne 0 ]; then exit $$status; fi; \
	if grep -E "^$(CURDIR)/(Sources|Plugins|Tests)/[^:]+:[0-9]+:[0-9]+: warning:" .build/build-tests.log; then \
		echo "warnings in whend's code are errors: fix the above"; exit 1; fi
	WHEND_CONFIG=/dev/null SWIFT=$(SWIFT) bash Tests/run-suite.sh

# Longer variants of the reliability tests: SOAK_ROUNDS SIGKILL rounds instead of 20,
# POWERCUT_ROUNDS power cuts instead of 10, and KILL_SCHEDULES generated kill schedules of the
# pipelines' workers and whend instead of 16.
SOAK_ROUNDS ?= 300
POWERCUT_ROUNDS ?= 200
KILL_SCHEDULES ?= 1000
soak: test-deps
	$(SWIFT) build --build-tests
	WHEND_CONFIG=/dev/null WHEND_SOAK_ROUNDS=$(SOAK_ROUNDS) WHEND_POWERCUT_ROUNDS=$(POWERCUT_ROUNDS) WHEND_KILL_SCHEDULES=$(KILL_SCHEDULES) \
		$(SWIFT) test --skip-build \
		--filter "CrashConsistencyTests|HostileClientTests|FaultTests|PowerCutTests|KillTimingTests"

# The ingest benchmark: release builds of whend and of Benchmarks/, rsyslog unpacked beside them,
# one corpus of BENCH_EVENTS events sent to each. Prints the table and the bars, and writes them
# into BENCHMARKS.md and the headline into the README (Benchmarks/record-report.sh). BENCH_ONLY=shipped
# runs whend as it ships beside rsyslog and nothing else; BENCH_ONLY=latency, the ack latency;
# BENCH_ONLY=plan, ingest with a tracking plan of 100 events beside ingest without one.
BENCH_EVENTS ?= 1000000
BENCH_ROUNDS ?= 3
# The NATS forwarding's peer: libnats alone, publishing what whend's nats pipeline publishes.
NATS_PEER = cc -O2 -Wall -Wextra -Werror Benchmarks/nats-peer.c -o Benchmarks/.build/nats-peer -lnats
bench: deps
	$(SWIFT) build -c release
	Benchmarks/fetch-peer.sh
	$(SWIFT) build -c release --package-path Benchmarks
	cc -shared -fPIC -O2 -I Sources/CWhendPlugin/include Benchmarks/noop.c -o Benchmarks/.build/libnoop.so
	$(NATS_PEER)
	bash -c 'set -o pipefail; Benchmarks/.build/release/whend-bench --whend .build/release/whend --whenctl .build/release/whenctl \
		--rsyslog-root Benchmarks/.peer/root --events $(BENCH_EVENTS) --rounds $(BENCH_ROUNDS) \
		--noop-plugin Benchmarks/.build/libnoop.so $(if $(wildcard /usr/sbin/nats-server),--nats-server /usr/sbin/nats-server --nats-peer Benchmarks/.build/nats-peer) \
		$(if $(BENCH_ONLY),--only $(BENCH_ONLY)) | tee .build/bench-report.txt'
	Benchmarks/record-report.sh .build/bench-report.txt \
		"make bench$(if $(BENCH_ONLY), BENCH_ONLY=$(BENCH_ONLY))$(if $(filter-out 3,$(BENCH_ROUNDS)), BENCH_ROUNDS=$(BENCH_ROUNDS))"

# What WhenClient.emit costs the app's thread with the daemon up, down and stopped, against one
# blocking send(2) per event in the same run.
CLIENT_BENCH_EVENTS ?= 200000
bench-client: deps
	$(SWIFT) build -c release
	$(SWIFT) build -c release --package-path Benchmarks --product whenclient-bench
	Benchmarks/.build/release/whenclient-bench --whend .build/release/whend --events $(CLIENT_BENCH_EVENTS) --rounds $(BENCH_ROUNDS)

# libFuzzer over each input format, FUZZ_SECONDS per target. Findings are written to
# Fuzz/findings/ (crash-*); the growing corpus lives in Fuzz/.corpus/ beside the seeds.
FUZZ_SECONDS ?= 300
FUZZ_TARGETS := FuzzEventLine:event-line:8192 FuzzSegment:segment:65536 FuzzConfiguration:configuration:4096 \
	FuzzPluginOutput:plugin-output:8192
fuzz: deps
	$(SWIFT) build --package-path Fuzz --sanitize=fuzzer -c release
	@mkdir -p Fuzz/findings
	@set -e; for spec in $(FUZZ_TARGETS); do \
		target=$${spec%%:*}; rest=$${spec#*:}; corpus=$${rest%%:*}; maxlen=$${rest#*:}; \
		mkdir -p Fuzz/.corpus/$$corpus; \
		echo "fuzzing $$target for $(FUZZ_SECONDS) s…"; \
		SWIFT_BACKTRACE=enable=no Fuzz/.build/release/$$target Fuzz/.corpus/$$corpus Fuzz/corpus/$$corpus \
			-max_total_time=$(FUZZ_SECONDS) -max_len=$$maxlen -rss_limit_mb=2048 -timeout=10 \
			-artifact_prefix=Fuzz/findings/$$target- -print_final_stats=1 2>&1 | grep -E "^(Done|stat::number_of_executed_units|SUMMARY)|crash-|timeout-|oom-" ; \
	done; \
	if ls Fuzz/findings/* >/dev/null 2>&1; then echo "findings in Fuzz/findings/: make each a regression test"; exit 1; fi

# Today's event-line scanner and encoder side by side with FUZZ_REFERENCE's (a commit), for
# FUZZ_SECONDS on the event-line corpus: a line on which they disagree is a finding (written to
# Fuzz/findings/FuzzEventLineDifferential-*). For changes to the scanner that must not change
# what it accepts, refuses or stores. The Fuzz package declares the differential target only
# when WHEND_FUZZ_REFERENCE is set, and it is built in a scratch directory of its own, its
# manifest never taken from a cache, so that neither build's plan is the other's.
FUZZ_REFERENCE ?= d1739a8
HAVE_FUZZ_REFERENCE = git cat-file -e "$(FUZZ_REFERENCE)^{commit}" 2>/dev/null
fuzz-differential: deps
	@$(HAVE_FUZZ_REFERENCE) || { echo "fuzz-differential: commit $(FUZZ_REFERENCE) is not in this clone:" \
		"fetch the history (git fetch --unshallow) or set FUZZ_REFERENCE"; exit 1; }
	rm -rf Fuzz/.reference && mkdir -p Fuzz/.reference/WhendWireReference Fuzz/findings Fuzz/.corpus/event-line
	git archive $(FUZZ_REFERENCE) Sources/WhendWire | tar -x -C Fuzz/.reference/WhendWireReference --strip-components=2
	sed -i 's/\bWhendWire\./WhendWireReference./g' Fuzz/.reference/WhendWireReference/*.swift
	sed '/^import WhendWire$$/d; /^import WhendRecord$$/d' Sources/WhendFuzzing/EventLineOutcomes.swift \
		> Fuzz/.reference/WhendWireReference/EventLineOutcomes.swift
	WHEND_FUZZ_REFERENCE=$(FUZZ_REFERENCE) $(SWIFT) build --package-path Fuzz --scratch-path Fuzz/.build-differential \
		--manifest-cache none --sanitize=fuzzer -c release --product FuzzEventLineDifferential
	SWIFT_BACKTRACE=enable=no Fuzz/.build-differential/release/FuzzEventLineDifferential Fuzz/.corpus/event-line \
		Fuzz/corpus/event-line -max_total_time=$(FUZZ_SECONDS) -max_len=8192 -rss_limit_mb=2048 -timeout=10 \
		-artifact_prefix=Fuzz/findings/FuzzEventLineDifferential- -print_final_stats=1

# The benchmarks and the fuzz targets are packages of their own: CI builds them, and runs each
# fuzz target (the differential one too) briefly on its seeds, so that a change to whend's
# modules cannot leave them broken.
harnesses: deps
	$(SWIFT) build --package-path Benchmarks
	$(NATS_PEER)
	$(MAKE) fuzz FUZZ_SECONDS=10
	@if $(HAVE_FUZZ_REFERENCE); then $(MAKE) fuzz-differential FUZZ_SECONDS=10; \
	else echo "fuzz-differential skipped: $(FUZZ_REFERENCE) is not in this (shallow) clone"; fi

# An installable package: static release binaries, units, default configuration, docs.
deb: test-deps
	packaging/build-deb.sh .build-deb

# The units as systemd sees them: `verify` (the binaries they name must be installed, so
# install the .deb first), the configuration's mode (it may hold secrets: not world-readable),
# the hardening score (exposure at most 2.0), the installed whend run for a few seconds with
# its built-in plugins, and its man pages and completions.
package-check: test-deps
	@mode=$$(stat -c '%a %U:%G' /etc/whend/whend.conf); test "$$mode" = "640 root:whend-config" \
		|| { echo "package-check: /etc/whend/whend.conf is $$mode, not 640 root:whend-config (it may hold secrets)"; exit 1; }
	systemd-analyze verify /lib/systemd/system/whend.service /lib/systemd/system/whend.socket \
		/lib/systemd/system/whend-control.socket
	systemd-analyze security --no-pager --offline=yes --threshold=20 /lib/systemd/system/whend.service
	packaging/smoke-test.sh /usr/bin
	packaging/docs-check.sh

# whend under a live systemd 252: the .deb installed into a minimal Debian 12 root (built with
# debootstrap once, then cached), booted with systemd-nspawn; see packaging/system-test.sh.
system-test: deb
	$(call install_missing,debootstrap systemd-container)
	packaging/system-test.sh

# Everything, tests included, with every warning an error (dependencies too), in a scratch
# directory of its own so that `make test`'s build is not redone. CI runs it.
strict: deps
	$(SWIFT) build --build-tests --scratch-path .build-strict -Xswiftc -warnings-as-errors

# The DocC catalogues of the two libraries others build on (WhenClient for apps, WhendPluginSDK
# for plugin authors), converted by the toolchain's docc from symbol graphs of the debug build's
# modules: a link to a symbol that does not exist, or any other warning, fails. The archives are
# left in .build/docs/ (open one with `docc preview`).
DOCS_MODULES := WhenClient WhendPluginSDK
docs: build
	@set -e; maps=""; for m in .build/debug/C*.build/module.modulemap; do maps="$$maps -Xcc -fmodule-map-file=$(CURDIR)/$$m"; done; \
	for module in $(DOCS_MODULES); do \
		rm -rf .build/docs/$$module.graphs && mkdir -p .build/docs/$$module.graphs; \
		$(SWIFT) symbolgraph-extract -module-name $$module -I .build/debug/Modules -target $$(uname -m)-unknown-linux-gnu \
			$$maps -output-dir .build/docs/$$module.graphs; \
		docc convert Sources/$$module/$$module.docc --additional-symbol-graph-dir .build/docs/$$module.graphs \
			--fallback-display-name $$module --fallback-bundle-identifier org.whend.$$module \
			--output-path .build/docs/$$module.doccarchive --warnings-as-errors; \
	done

# The format, and no hand-written Swift file over 500 lines (generated protobuf code aside): a
# file that long holds more than one concept.
lint:
	$(SWIFT) format lint --strict --recursive Sources Tests Plugins Package.swift Benchmarks/Sources Benchmarks/Package.swift \
		Fuzz/Sources Fuzz/Differential Fuzz/Package.swift
	@long=$$(git ls-files -co --exclude-standard '*.swift' | grep -v '\.pb\.swift$$' | \
		while read -r f; do test -f "$$f" && echo "$$f"; done | xargs wc -l | \
		awk '$$2 != "total" && $$1 > 500 { print $$2 " (" $$1 " lines)" }'); \
	if [ -n "$$long" ]; then echo "over 500 lines, split by concept:"; echo "$$long"; exit 1; fi

clean:
	rm -rf .build .build-static .build-deb .build-strict Fuzz/.build Fuzz/.build-differential Fuzz/.reference
