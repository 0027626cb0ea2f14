# Rigger: the two commands a newcomer needs are `make demo` and `make test`.
# Both install what they need from Debian's packages (as root) and use the lab
# (scripts/lab: a private containerd with CRI, a registry and test images).

SHELL := /bin/bash
CARGO ?= cargo
LAB := scripts/lab
export RIGGER_LAB_DIR ?= /tmp/rigger-lab

.PHONY: all build deps fmt-check clippy test demo lab-up lab-down lab-status clean \
	docs deb package-test k8s-check deny fuzz-test fresh-root-test

# The containerd versions the tests run against: one lab node each (scripts/lab).
TEST_CONTAINERDS := 1.6,1.7,2.1,2.3,2.4

all: build

deps:
	@$(LAB) install

# Every binary, test and benchmark: the tests' dev-dependencies add features to shared
# crates (tokio's test-util), so a build of the binaries alone would be a second build of
# most dependencies once the tests are built; one build serves the demo, the tests and the
# packages.
build: deps
	$(CARGO) build --workspace --all-targets --locked

fmt-check:
	$(CARGO) fmt --all -- --check

clippy: deps
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

# Supply chain: licenses, sources, advisories (scripts/deny, deny.toml).
deny:
	scripts/deny

# Lint, build, and the unit and integration tests against the real lab (containerd 1.6,
# 1.7, 2.1, 2.3 and 2.4, the Kubernetes API and cluster), each step timed (scripts/test);
# the lab is stopped afterwards.
test:
	RIGGER_TEST_CONTAINERDS=$(TEST_CONTAINERDS) scripts/test

demo: build
	scripts/demo

# The configuration references in docs/reference/, generated from the config types
# (a test fails when they are stale).
docs: build
	target/debug/rigger-agent config-reference > docs/reference/agent-config.md
	target/debug/rigger-controller config-reference > docs/reference/controller-config.md
	for kind in imagepulljob imagelistpulljob containerrecreaterequest sidecarset nodeimage \
		pod secret lifecyclecooperator; do \
		target/debug/riggerctl explain $$kind > docs/reference/$$kind.md; done

# Debian packages (release build) into target/debian/.
deb:
	packaging/deb/build

# Build the packages from the debug build, install them into a fresh Debian root,
# upgrade, remove and purge (packaging/deb/test), and check the Kubernetes manifests.
package-test: deps build
	packaging/deb/test
	packaging/deb/boot-test
	@# The boot test must also fail when a unit is broken (here: ExecStart names no binary).
	@if packaging/deb/boot-test --break execstart >/tmp/rigger-boot-test-broken.log 2>&1; then \
		cat /tmp/rigger-boot-test-broken.log; \
		echo "package-test: the boot test passed with a broken rigger-agent unit" >&2; exit 1; \
	else echo "boot-test: a broken unit fails it, as it must"; fi
	deploy/kubernetes/check

# A fresh Debian 12 root with only the Rust toolchain: scripts/lab install, make demo, the
# whole build, a test on every containerd version (scripts/fresh-root-test).
fresh-root-test:
	scripts/fresh-root-test

k8s-check: deps
	deploy/kubernetes/check

# Every fuzz target (fuzz/) for FUZZ_SECONDS each (20 by default).
fuzz-test:
	scripts/fuzz

lab-up: deps
	$(LAB) up

lab-down:
	$(LAB) down

lab-status:
	$(LAB) status

clean: lab-down
	$(CARGO) clean
