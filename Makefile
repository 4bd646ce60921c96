# Shoal build, test and benchmark entry points. `make help` lists them.
SHELL := /bin/bash
GO ?= go
PREFIX ?= /usr/local
DESTDIR ?=
UNITDIR ?= /etc/systemd/system
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X github.com/shoal-dev/shoal/pkg/buildinfo.Version=$(VERSION)
DAEMONS := statd schedd netd vold
# shoal-logger is no daemon: containerd's shim runs one beside each task
# schedd starts, to write the task's log. shoal-init neither: a task
# started with --init runs it as its PID 1 (static, for any image).
BINS := $(addprefix bin/shoal-,$(DAEMONS)) bin/shoal-logger bin/shoal-init bin/shoalctl
PROTOC_GEN_GO_VERSION := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2
STATICCHECK_VERSION := v0.8.2
GOBIN_DIR := $(shell $(GO) env GOPATH)/bin
FUZZTIME ?= 10s
# Packages needed by the tests and the demo on a fresh Debian machine.
APT_PACKAGES := protobuf-compiler libprotobuf-dev systemd iproute2 nftables busybox-static containerd runc iperf3 tcpdump debootstrap systemd-container
# A minimal Debian with systemd, which e2e's TestSystemdNode and
# TestSystemdCluster boot in containers to run the units under a real
# systemd (this machine's PID 1 is not systemd). Built once by
# debootstrap, then reused.
NSPAWN_ROOT ?= /var/tmp/shoal-nspawn-root
DEBIAN_SUITE ?= $(shell . /etc/os-release && echo $$VERSION_CODENAME)
DEBIAN_MIRROR ?= http://deb.debian.org/debian

.PHONY: help build test unit e2e fuzz check proto deps install demo bench clean test-image nspawn-root upgrade-check upgrade-check-ci

help:
	@echo "make build   - build bin/shoal-{statd,schedd,netd,vold,logger,init} and bin/shoalctl"
	@echo "make test    - everything CI runs: checks, unit/property tests, fuzzing, e2e, upgrade check"
	@echo "make demo    - start a local Shoal and show state converging"
	@echo "make bench   - run the benchmarks and write docs/BENCHMARKS.md"
	@echo "make check   - gofmt, go vet, staticcheck, generated code current"
	@echo "make proto   - regenerate Go code from proto/"
	@echo "make upgrade-check [OLD=rev] [OLD_SCHEDD=rev] - volumes with an old vold, services with an old schedd, upgraded"
	@echo "make install - install binaries and systemd units (PREFIX, DESTDIR)"

build: $(BINS)

bin/shoal-%: FORCE
	$(GO) build -ldflags '$(LDFLAGS)' -o $@ ./cmd/$*

# vold is built without cgo: Pebble then takes its memtables and block
# cache from the Go heap, which vold keeps resident (pkg/hugeheap), instead
# of from C malloc, whose fresh 16 MiB memtable mappings cost a page fault
# (~14 µs on these VMs) per 4 KiB filled: about 1,500 faults a second per
# vold under 4 KiB synchronous writes (docs/VOLUMES.md, Performance).
bin/shoal-vold: export CGO_ENABLED := 0
bin/shoal-init: export CGO_ENABLED := 0

bin/shoalctl: FORCE
	$(GO) build -ldflags '$(LDFLAGS)' -o $@ ./cmd/ctl

FORCE:

# deps installs what the tests need when it is missing (CI runs on a fresh
# Debian machine; a developer's machine usually has it all already).
deps:
	@missing=""; \
	command -v protoc >/dev/null || missing="$$missing protobuf-compiler"; \
	[ -f /usr/include/google/protobuf/timestamp.proto ] || missing="$$missing libprotobuf-dev"; \
	command -v systemd-analyze >/dev/null || missing="$$missing systemd"; \
	command -v ip >/dev/null || missing="$$missing iproute2"; \
	command -v nft >/dev/null || missing="$$missing nftables"; \
	[ -x /bin/busybox ] || missing="$$missing busybox-static"; \
	command -v containerd >/dev/null || missing="$$missing containerd"; \
	command -v runc >/dev/null || missing="$$missing runc"; \
	command -v iperf3 >/dev/null || missing="$$missing iperf3"; \
	command -v tcpdump >/dev/null || missing="$$missing tcpdump"; \
	command -v wget >/dev/null || missing="$$missing wget"; \
	command -v debootstrap >/dev/null || missing="$$missing debootstrap"; \
	command -v systemd-nspawn >/dev/null || missing="$$missing systemd-container"; \
	command -v ssh >/dev/null || missing="$$missing openssh-client"; \
	[ -x /usr/sbin/sshd ] || missing="$$missing openssh-server"; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing; \
	fi
	@test -x $(GOBIN_DIR)/protoc-gen-go && $(GOBIN_DIR)/protoc-gen-go --version | grep -q $(PROTOC_GEN_GO_VERSION) || \
		$(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	@test -x $(GOBIN_DIR)/protoc-gen-go-grpc && $(GOBIN_DIR)/protoc-gen-go-grpc --version | grep -q $(PROTOC_GEN_GO_GRPC_VERSION:v%=%) || \
		$(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)
	@test -x $(GOBIN_DIR)/staticcheck && $(GOBIN_DIR)/staticcheck -version | grep -q '($(STATICCHECK_VERSION:v%=%))' || \
		$(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

proto: deps
	PATH="$(GOBIN_DIR):$$PATH" ./proto/gen.sh

check: deps
	@bad=$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$')); \
	if [ -n "$$bad" ]; then echo "gofmt needed:"; echo "$$bad"; exit 1; fi
	$(GO) vet ./...
	$(GOBIN_DIR)/staticcheck ./...
	PATH="$(GOBIN_DIR):$$PATH" ./proto/gen.sh
	@if ! git diff --quiet -- proto/ || [ -n "$$(git ls-files --others --exclude-standard proto/)" ]; then \
		echo "generated protobuf code is stale: run 'make proto' and commit"; git status --short proto/; exit 1; fi

# test is what CI runs (.ci/run) and what the README tells newcomers.
test: deps check build unit fuzz e2e upgrade-check-ci

unit:
	$(GO) test -count=1 -timeout 15m ./pkg/... ./bench/... ./test/units/...

# Each fuzz target runs briefly: go test allows one target per run.
FUZZ_TARGETS := pkg/tasklog:FuzzParse pkg/crdt:FuzzUnmarshal pkg/mst:FuzzDecodeNode pkg/store:FuzzDecodeRecord pkg/store:FuzzDecodeChange pkg/store:FuzzDecodeIndexOp pkg/pki:FuzzParseToken pkg/overlay:FuzzIPAMUnmarshal \
	pkg/raftgroup:FuzzUnmarshalBatch pkg/raftgroup:FuzzDecodeEnvelope pkg/volfs:FuzzDecodeOp pkg/volfs:FuzzApply pkg/volarchive:FuzzRead
fuzz:
	GO=$(GO) FUZZTIME=$(FUZZTIME) scripts/fuzz.sh $(FUZZ_TARGETS)

# e2e runs the real binaries (built by `build`) as separate processes.
e2e: build nspawn-root
	SHOAL_BIN_DIR=$(CURDIR)/bin SHOAL_NSPAWN_ROOT=$(NSPAWN_ROOT) $(GO) test -count=1 -timeout 20m ./test/e2e/...

# upgrade-check runs a volume with one replica on the vold of commit OLD
# (the last before volume levels by default), then upgrades that node
# (test/e2e TestVolumeUpgradeFromOldVold; docs/VOLUMES.md, Upgrades), and
# services on a node whose schedd is of commit OLD_SCHEDD (the last before
# schedds published the spec fields they know), upgraded and downgraded
# (TestScheddSpecFieldsOnOlderNode; docs/SCHEDULING.md, Mixed versions).
OLD ?= 3fcf164
OLD_SCHEDD ?= d9944a7
upgrade-check: build
	rm -rf bin/old.src && git worktree prune && git worktree add --detach bin/old.src $(OLD)
	cd bin/old.src && CGO_ENABLED=0 $(GO) build -o $(CURDIR)/bin/old/shoal-vold ./cmd/vold; \
		rc=$$?; cd $(CURDIR) && git worktree remove --force bin/old.src; exit $$rc
	git worktree add --detach bin/old.src $(OLD_SCHEDD)
	cd bin/old.src && CGO_ENABLED=0 $(GO) build -o $(CURDIR)/bin/old/shoal-schedd ./cmd/schedd; \
		rc=$$?; cd $(CURDIR) && git worktree remove --force bin/old.src; exit $$rc
	SHOAL_BIN_DIR=$(CURDIR)/bin SHOAL_OLD_VOLD=$(CURDIR)/bin/old/shoal-vold SHOAL_OLD_SCHEDD=$(CURDIR)/bin/old/shoal-schedd \
		$(GO) test -count=1 -timeout 8m -v -run 'TestVolumeUpgradeFromOldVold|TestScheddSpecFieldsOnOlderNode' ./test/e2e/

# upgrade-check-ci is test's upgrade-check: it needs OLD and OLD_SCHEDD in
# the clone's history, which a shallow clone or a source tarball lacks;
# there it says loudly that the check did not run rather than fail the
# rest.
upgrade-check-ci:
	@if git rev-parse -q --verify '$(OLD)^{commit}' >/dev/null 2>&1 && git rev-parse -q --verify '$(OLD_SCHEDD)^{commit}' >/dev/null 2>&1; then \
		$(MAKE) --no-print-directory upgrade-check; \
	else \
		echo "*** upgrade-check NOT RUN: commit $(OLD) or $(OLD_SCHEDD) is not in this clone (shallow?); run make upgrade-check in a full clone"; \
	fi

# nspawn-root builds NSPAWN_ROOT unless it is there (a minute, 373 MB):
# systemd, and containerd and runc for schedd's tasks. The systemd tests
# boot copies of it and never change it; a root from before containerd
# was added is built again.
nspawn-root: deps
	@test -x $(NSPAWN_ROOT)/lib/systemd/systemd -a -x $(NSPAWN_ROOT)/usr/bin/containerd -a -x $(NSPAWN_ROOT)/usr/sbin/runc || { \
		echo "debootstrap $(DEBIAN_SUITE) into $(NSPAWN_ROOT)"; \
		rm -rf $(NSPAWN_ROOT).tmp && \
		debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus,containerd,runc $(DEBIAN_SUITE) $(NSPAWN_ROOT).tmp $(DEBIAN_MIRROR) >$(NSPAWN_ROOT).log 2>&1 || \
			{ tail -20 $(NSPAWN_ROOT).log; exit 1; }; \
		rm -rf $(NSPAWN_ROOT) && mv $(NSPAWN_ROOT).tmp $(NSPAWN_ROOT); }

bench: deps build
	./bench/run.sh

# test-image writes bin/busybox.tar: an OCI archive of local/busybox:latest
# built from Debian's static busybox, for `shoalctl image load`.
test-image: deps
	$(GO) run ./pkg/testimage/cmd/mkimage -o bin/busybox.tar

demo: build test-image
	./scripts/demo.sh

install: build
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(UNITDIR)
	install -m 0755 $(BINS) $(DESTDIR)$(PREFIX)/bin/
	install -m 0644 systemd/*.service systemd/*.socket systemd/*.target $(DESTDIR)$(UNITDIR)/

clean:
	rm -rf bin
