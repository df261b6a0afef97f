# nsmd — see README.md. Targets a newcomer can guess.
GO      ?= go
BIN     := bin/nsmd
PKGS    := ./...
export GOFLAGS := -buildvcs=false
# What `nsmd version`, /v1/status and nsmd_build_info report (the toolchain's
# VCS stamping is off above, and does not work in git worktrees).
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)
MODIFIED ?= $(shell test -n "$$(git status --porcelain --untracked-files=no 2>/dev/null)" && echo true || echo false)
AGENT    := github.com/nsmd/nsmd/agent
LDFLAGS  := -X $(AGENT).version=$(VERSION) -X $(AGENT).revision=$(REVISION) -X $(AGENT).modified=$(MODIFIED)

.PHONY: all build run test unit e2e prev-release fencecontrol soak bench benchmarks fuzz lint cluster-files clean vm-kernel deb

all: build

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/nsmd

# A local 3-node cluster in one process on 127.0.0.1-3, VIP 127.0.0.100.
run: build
	$(BIN) dev

# Every tier this machine can run: unit + in-process cluster tests, then the
# e2e tier (it skips, saying why, when not root or without network namespaces).
test: lint
	$(GO) test -race -count=1 -timeout 10m $$($(GO) list ./... | grep -v /e2e)
	$(GO) -C deploy/pkg test -count=1 -timeout 5m -v ./...
	$(MAKE) e2e

# E2E_RUN=TestName runs one e2e test (with NSMD_E2E_SEED=N, a schedule).
E2E_RUN ?= .
e2e: build prev-release fencecontrol
	old=$${NSMD_E2E_OLD_BIN:-}; if [ -z "$$old" ] && [ -x out/nsmd-prev ]; then old=$(CURDIR)/out/nsmd-prev; fi; \
	NSMD_E2E_OLD_BIN=$$old NSMD_E2E_FENCECONTROL_BIN=$(CURDIR)/out/nsmd-fencecontrol NSMD_BIN=$(CURDIR)/$(BIN) NSMD_VM_KERNEL_DIR=$(CURDIR)/out/vm-kernel $(GO) test -count=1 -timeout 45m -v -run '$(E2E_RUN)' ./e2e/

# The fencing drills' negative control: a build whose new leader waits by
# its own fence settings alone, ignoring the other servers' promises
# (cluster/fencecontrol_on.go). For tests only; never install it.
fencecontrol:
	mkdir -p out
	$(GO) build -tags fencecontrol -ldflags "$(LDFLAGS)" -o out/nsmd-fencecontrol ./cmd/nsmd

# The previous release (the commit e2e/previous-release names), built from
# this clone's history into out/nsmd-prev for the rolling-upgrade tests; a
# clone without that commit (a shallow one) says so and the tests skip.
PREV_RELEASE = $(shell sed -n 's/^commit //p' e2e/previous-release)
prev-release:
	@if git cat-file -e '$(PREV_RELEASE)^{commit}' 2>/dev/null; then \
	  rm -rf out/prev-src && mkdir -p out/prev-src && git archive $(PREV_RELEASE) | tar -x -C out/prev-src && \
	  (cd out/prev-src && $(GO) build -o $(CURDIR)/out/nsmd-prev ./cmd/nsmd) && rm -rf out/prev-src && \
	  echo "prev-release: out/nsmd-prev is $(PREV_RELEASE)"; \
	else echo "prev-release: commit $(PREV_RELEASE) is not in this clone: the rolling-upgrade tests will skip"; fi

# The long run of the checked fault schedules (root): SCHEDULES of them
# (default 200), the summary table appended to out/soak.md, failing
# histories as HTML under out/histories.
SCHEDULES ?= 200
SEED ?= $(shell date +%s)
soak: build
	mkdir -p out
	NSMD_BIN=$(CURDIR)/$(BIN) NSMD_E2E_SEED=$(SEED) NSMD_E2E_SCHEDULES=$(SCHEDULES) NSMD_E2E_SUMMARY=$(CURDIR)/out/soak.md NSMD_E2E_OUT=$(CURDIR)/out/histories \
	  $(GO) test -count=1 -timeout 6h -v -run TestCheckedFaultSchedules ./e2e/

# The Debian cloud kernels the real-kernel e2e tier boots under QEMU (root:
# apt-get download): Debian 12's 6.1 into out/vm-kernel/6.1, Debian 13's 6.12
# into out/vm-kernel/6.12 (a private apt state; the host's sources stay as
# they are). Without them those tests skip and say so.
vm-kernel:
	e2e/vmkernel.sh $(CURDIR)/out/vm-kernel

# The Debian package DEB_OUT/nsmd_<version>_amd64.deb, built with nFPM by
# deploy/pkg (its own module: nFPM's dependencies stay out of go.mod). The
# version comes from git describe, or NSMD_VERSION.
DEB_OUT ?= out
deb:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o $(abspath $(DEB_OUT))/deb/nsmd ./cmd/nsmd
	$(GO) -C deploy/pkg build -o $(abspath $(DEB_OUT))/nsmd-pkg .
	$(abspath $(DEB_OUT))/nsmd-pkg -config deploy/pkg/nfpm.yaml -binary $(abspath $(DEB_OUT))/deb/nsmd -out $(abspath $(DEB_OUT))

bench:
	$(GO) test -run '^$$' -bench . -benchmem -count=1 ./oncrpc ./fsm ./nsm ./cluster

# Every figure of BENCHMARKS.md, side by side with rpc.statd and sm-notify (root).
benchmarks: build
	bench/run.sh

# Short fuzzing of every decoder (FUZZTIME each, default 10s).
FUZZTIME ?= 10s
fuzz:
	@set -e; for pkg in ./oncrpc ./fsm ./nsm ./nlm ./cld ./cluster ./tickle; do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
	    echo "== $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 2s $$pkg; \
	  done; \
	done

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) -C deploy/pkg vet ./...
	@$(MAKE) --no-print-directory cluster-files
	@# The replication layer replicates: SM_NOTIFY and the lock-manager
	@# callbacks are composed with a node by its callers (cluster/DESIGN.md).
	@if $(GO) list -deps ./cluster | grep -qx 'github.com/nsmd/nsmd/nsm'; then \
	  echo "package cluster must not depend on package nsm"; exit 1; fi

# Every non-test Go file of cluster/ has a row in cluster/DESIGN.md's file
# table ("Where things are"): the first column names it in backquotes.
cluster-files:
	@listed=$$(awk '/^## Where things are/ {t = 1; next} t && /^## / {t = 0} t && /^\|/' cluster/DESIGN.md | \
	  cut -d'|' -f2 | grep -o '`[^`]*\.go`' | tr -d '`'); \
	  missing=; for f in cluster/*.go; do \
	    case $$f in *_test.go) continue;; esac; \
	    echo "$$listed" | grep -qxF "$${f#cluster/}" || missing="$$missing $${f#cluster/}"; \
	  done; \
	  if [ -n "$$missing" ]; then echo "cluster/DESIGN.md's file table (Where things are) has no row for:$$missing"; exit 1; fi

clean:
	rm -rf bin
