# fleet — see README.md. `make demo` runs the main job; `make test` passes every test.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X github.com/fleetd/fleet/pkg/version.Version=$(VERSION)
# Static binaries: no dynamic loader at every start (a short command
# starts about 1 ms sooner here), nothing to resolve from libc. Symbols
# stay (stripping saves no start-up time, and perf needs them).
export CGO_ENABLED := 0
PREFIX  ?= /usr/local
DESTDIR ?=
GO      ?= go
CMDS    := $(notdir $(wildcard cmd/fleet-*))

.PHONY: all build test lint install clean bench bench-top demo generate check-generated fuzz

all: build

build:
	@mkdir -p bin
	$(GO) build -trimpath -tags urfave_cli_no_docs -ldflags '$(LDFLAGS)' -o bin/ ./cmd/...

# Every test: unit tests, and end-to-end tests that build the real binaries
# and run them against real gateways, a real tmux, the real agent CLIs
# (Claude Code, Codex, Gemini CLI, against a stub model on loopback), a
# private RabbitMQ node and a private three-node RabbitMQ cluster
# (installed when missing and running as root; node and cluster are
# stopped after). Two packages at a time (-p 2): the root package (the
# end-to-end scripts and the agent CLIs, about 2/3 of the time) runs
# beside the others, pkg/gateway the longest of them. What the two may
# not share is locked: the broker outage scripts take the node's test
# lock exclusively (internal/testnode: a waiting outage script goes
# first), the cluster tests the cluster's; every broker test has a vhost
# of its own, every script and agent rig its own tmux server and folder.
# Four parallel tests at a time in a package (-parallel 4, not GOMAXPROCS'
# 2): the scripts and pkg/gateway's broker tests mostly wait (presence
# rounds, the broker, gateways' drains). In the root package and
# pkg/gateway, internal/testsched hands out the four places: the agent CLI
# tests run beside the scripts, one CLI at a time; a test waiting for the
# node (an outage script or a test with 2,000 entities has it alone) or
# for the cluster holds no place; the longest tests start first.
#
# The two long packages are named first, so go test starts them first
# (it runs packages in the order they are named): pkg/gateway began only
# after 2 minutes of small packages, and ended the run 50 s after the
# root package; the small ones now run at the end beside its last tests.
#
# gotestsum (pinned, fetched through the module proxy on first use like
# staticcheck) runs go test -json: it prints each package's result and the
# whole output of every failed test, keeps every event in TEST_JSON, and
# the run ends with what the suite's time went to (scripts/testslowest):
# the run's and the longest packages' wall times and the 20 slowest tests
# and scripts, each without its wait for a turn.
GOTESTSUM ?= $(GO) run gotest.tools/gotestsum@v1.13.0
TEST_JSON ?= $(or $(TMPDIR),/tmp)/fleet-test-events.json
test:
	scripts/test-deps.sh
	scripts/rabbitmq-node.sh start
	scripts/rabbitmq-cluster.sh start
	FLEET_TEST_BROKER=$$(scripts/rabbitmq-node.sh url) FLEET_TEST_CLUSTER=$$(scripts/rabbitmq-cluster.sh urls) \
		$(GOTESTSUM) --format pkgname-and-test-fails --jsonfile $(TEST_JSON) -- -p 2 -parallel 4 -count=1 -timeout 45m . ./pkg/gateway ./...; \
		status=$$?; scripts/rabbitmq-cluster.sh stop; scripts/rabbitmq-node.sh stop; \
		$(GO) run ./scripts/testslowest $(TEST_JSON); \
		exit $$status

# Hygiene gates: gofmt (tracked and new files), go vet, go.mod/go.sum tidy,
# and staticcheck's default checks. staticcheck is pinned here and fetched
# through the module proxy on first use (then cached); `go run pkg@version`
# keeps its dependencies out of go.mod.
STATICCHECK ?= $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2
lint:
	@out=$$(gofmt -l $$(git ls-files --cached --others --exclude-standard '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) mod tidy -diff
	$(STATICCHECK) ./...

fuzz:
	$(GO) test -run '^$$' -fuzz 'FuzzDecode$$' -fuzztime 30s ./pkg/envelope
	$(GO) test -run '^$$' -fuzz FuzzOpen -fuzztime 30s ./pkg/seal

bench: build
	scripts/bench-local.sh
	scripts/bench-broker.sh
	scripts/bench-checks.sh
	scripts/bench-seal.sh
	scripts/bench-scale.sh
	scripts/bench-presence.sh
	scripts/bench-libs.sh
	scripts/bench-top.sh

# What a watcher (fleet-top, fleet-roster --watch) costs the gateway
# (issue 38 point 4); PROFILE=DIR keeps the gateway's CPU profiles.
bench-top: build
	BIN=$(if $(PROFILE),,bin) scripts/bench-top.sh

demo: build
	scripts/demo.sh

install: build
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/man/man1 \
		$(DESTDIR)$(PREFIX)/share/man/man5 $(DESTDIR)$(PREFIX)/share/man/man7 \
		$(DESTDIR)$(PREFIX)/share/bash-completion/completions $(DESTDIR)$(PREFIX)/share/zsh/site-functions \
		$(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d
	install -m 0755 $(addprefix bin/,$(CMDS)) $(DESTDIR)$(PREFIX)/bin/
	# the agent CLIs' turn hook, in PREFIX/bin, and its recipes, in
	# PREFIX/share/fleet/hooks (fleet-roster hooks install merges the same
	# recipes, built in, into each CLI's settings; fleet-agents(7))
	install -m 0755 scripts/hooks/fleet-turn $(DESTDIR)$(PREFIX)/bin/
	install -d $(DESTDIR)$(PREFIX)/share/fleet/hooks
	install -m 0644 scripts/hooks/*.json scripts/hooks/*.toml scripts/hooks/*.js $(DESTDIR)$(PREFIX)/share/fleet/hooks/
	install -m 0644 man/*.1 $(DESTDIR)$(PREFIX)/share/man/man1/
	# the config file's page and the concept pages (pkg/docs/pages)
	install -m 0644 man/*.5 $(DESTDIR)$(PREFIX)/share/man/man5/
	install -m 0644 man/*.7 $(DESTDIR)$(PREFIX)/share/man/man7/
	for c in $(CMDS); do \
		install -m 0644 completions/$$c.bash $(DESTDIR)$(PREFIX)/share/bash-completion/completions/$$c; \
		install -m 0644 completions/_$$c $(DESTDIR)$(PREFIX)/share/zsh/site-functions/_$$c; \
		install -m 0644 completions/$$c.fish $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d/$$c.fish; \
	done
	# the gateway as a systemd user service, its health check, an example config
	install -d $(DESTDIR)$(PREFIX)/lib/systemd/user $(DESTDIR)$(PREFIX)/share/doc/fleet
	for u in contrib/systemd/*; do \
		sed 's#@BINDIR@#$(PREFIX)/bin#g' $$u >$(DESTDIR)$(PREFIX)/lib/systemd/user/$$(basename $$u); \
		chmod 0644 $(DESTDIR)$(PREFIX)/lib/systemd/user/$$(basename $$u); \
	done
	install -m 0644 contrib/fleet.conf.example $(DESTDIR)$(PREFIX)/share/doc/fleet/

clean:
	rm -rf bin dist

# Man pages and completions are generated from the command definitions,
# and the section-5 and -7 pages from pkg/docs/pages/*.md.
generate:
	$(GO) run ./scripts/gendocs -out .

check-generated:
	@tmp=$$(mktemp -d); $(GO) run ./scripts/gendocs -out $$tmp && \
		diff -ru man $$tmp/man && diff -ru completions $$tmp/completions && rm -rf $$tmp && echo "generated files are up to date"
