# zfs-nomad: a ZFS CSI driver for Nomad. `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X github.com/zfs-nomad/zfs-nomad/internal/shared/version.Version=$(VERSION)
# Development tools are built from hack/tools/go.mod (pinned) into a cache
# outside the repo.
TOOLS := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/zfs-nomad/tools/$(shell sha256sum hack/tools/go.sum | cut -c1-12)
GO_TEST_TIMEOUT ?= 45m

.PHONY: help deps prepare need-headers fast build release check unit race simulation alerts images test test-trixie test-shim guest-image-trixie test-nomad test-nomad-trixie test-nomad-drain test-nomad-oldest test-witnesses sanity-encrypted nomad bench scale soak sim guest-image proto demo demo-nomad clean

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

deps: ## install host prerequisites (Debian 12: contrib, libzfs headers, QEMU, ...)
	@./hack/install-host-deps.sh

# build needs only Go and, for the node, the libzfs headers (Debian:
# libzfslinux-dev from contrib): it installs nothing, so it can run on a
# Nomad client or a build host as it is (make deps sets up a test host).
build: ## build bin/zfs-node (cgo, libzfs) and bin/zfs-controller (no cgo); needs Go and the libzfs headers
	@command -v go >/dev/null || { echo "make build: Go is not on PATH: install Go $$(sed -n 's/^go //p' go.mod) or newer" >&2; exit 1; }
	@pkg-config --exists libzfs 2>/dev/null || [ -e /usr/include/libzfs/libzfs.h ] || { echo "make build: the libzfs headers are missing (zfs-node links libzfs): on Debian install libzfslinux-dev from contrib, on Ubuntu libzfslinux-dev; make deps installs every test prerequisite" >&2; exit 1; }
	./hack/gobuild.sh -l "$(LDFLAGS)" -o bin/zfs-node ./cmd/zfs-node
	CGO_ENABLED=0 go build -trimpath -ldflags "$(LDFLAGS)" -o bin/zfs-controller ./cmd/zfs-controller

# One zfs-node per supported OpenZFS series, each built against its Debian
# release's libzfs (in that release's guest chroot), the controller, the
# images as docker-archive files, and SHA256SUMS (hack/release.sh).
release: ## dist/VERSION/: zfs-controller, zfs-node per OpenZFS series (2.1: Debian 12, 2.3: Debian 13), their images (docker-archive), SHA256SUMS
	./hack/release.sh $(VERSION)

$(TOOLS)/staticcheck $(TOOLS)/protoc-gen-go $(TOOLS)/protoc-gen-go-grpc: hack/tools/go.mod hack/tools/go.sum
	@mkdir -p $(TOOLS)
	cd hack/tools && go build -o $(TOOLS)/ honnef.co/go/tools/cmd/staticcheck google.golang.org/protobuf/cmd/protoc-gen-go google.golang.org/grpc/cmd/protoc-gen-go-grpc

# check, unit and race install nothing: with the libzfs headers missing
# they say so and stop (make deps installs them; make test runs it).
need-headers:
	@pkg-config --exists libzfs 2>/dev/null || [ -e /usr/include/libzfs/libzfs.h ] || { echo "the libzfs headers are missing (zfs-node's cgo needs them): make deps installs them (Debian: libzfslinux-dev from contrib)" >&2; exit 1; }

# The fast tier, for every change: static checks and every unit test
# under the race detector (the simulation's 30 seeds a shape); no guest,
# nothing installed (docs/testing.md, "Which command proves what").
fast: check race ## the fast tier for every change: make check and the unit tests under the race detector; installs nothing

check: need-headers $(TOOLS)/staticcheck ## gofmt, go vet, the controller/node edge (hack/edges.sh), staticcheck (both libzfs builds), go mod tidy
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	go vet ./...
	go vet -tags openzfs_2_2 ./internal/node/zfs/libzfs ./cmd/zfs-node
	./hack/edges.sh
	$(TOOLS)/staticcheck ./...
	$(TOOLS)/staticcheck -tags openzfs_2_2 ./internal/node/zfs/libzfs ./cmd/zfs-node
	go mod tidy -diff
	cd hack/tools && go mod tidy -diff

unit: need-headers ## unit tests only (skips the packages that need real ZFS)
	ZFS_NOMAD_SKIP_GUEST=1 go test -count=1 ./...

# The race detector over the host packages (the guest packages skip
# themselves), the simulation on 30 seeds of each shape: a race is a
# defect even where the tests pass (about 4 min on 2 cores). The
# explorer runs on one P (docs/simulation.md, "The explorer"): the race
# detector would only slow it, so it runs in make test without.
race: need-headers ## unit tests and a short simulation under the race detector
	ZFS_NOMAD_SKIP_GUEST=1 go test -race -count=1 $$(go list ./... | grep -v /internal/testbed/faultsim)
	ZFS_NOMAD_SKIP_GUEST=1 go test -race -count=1 -timeout 60m -skip '^TestExplorer' ./internal/testbed/faultsim -args -seeds 30

# The simulation's full seed counts and the explorer, without the race
# detector. make test runs race and this instead of race and unit: every
# other unit test already ran under the race detector, and a second run
# without it proves nothing the first did not (a fresh machine compiled
# every test binary twice for it).
# Its run takes about 10 minutes of two cores (docs/simulation.md), go
# test's default timeout: it is bounded by 60, because make test's host
# lane runs it at the idle CPU priority beside the guest, which leaves
# it little: on 2026-12-07 (QEMU keeping 1.8 of the 2 cores busy through
# test/migration's and test/replication's parallel slots) it had not
# ended after 30 minutes there. The guest lane takes longer still, so
# the bound costs make test nothing unless the simulation hangs.
simulation: need-headers ## the fault simulation's full seed counts and the explorer (make test's share of make unit)
	ZFS_NOMAD_SKIP_GUEST=1 go test -count=1 -timeout 60m ./internal/testbed/faultsim

# The alert rules of monitoring/, checked and unit-tested with promtool
# from Debian's prometheus package, unpacked into the cache (hack/prometheus.sh:
# nothing installed). In make test's host lane.
alerts: ## the Prometheus alert rules (monitoring/alerts.yml): promtool check rules and their unit tests (promtool from Debian's package, cached)
	bin=$$(./hack/prometheus.sh) && $$bin/promtool check rules monitoring/alerts.yml && cd monitoring && $$bin/promtool test rules alerts_test.yml

# Builds with buildah from Debian's mirrors and the host's Go: no container
# registry needed (see hack/images.sh). The docker-archive files in
# bin/images are what test/nomad loads into its clients' Docker Engines.
IMAGES_DIR := $(CURDIR)/bin/images
images: ## build the zfs-controller and zfs-node images (docker/), run each one's --version, write bin/images/*.tar
	@VERSION=$(VERSION) ARCHIVE_DIR=$(IMAGES_DIR) ./hack/images.sh

# prepare builds side by side what make test needs and a cache may lack: both
# guest images, Nomad and the plugin images (hack/prepare.sh says why).
prepare: deps ## build, side by side, what make test needs and the cache lacks: both guest images, Nomad, the plugin images
	@VERSION=$(VERSION) ARCHIVE_DIR=$(IMAGES_DIR) ./hack/prepare.sh

guest-image: deps ## build (or find cached) the default ZFS guest image: Debian 12, OpenZFS 2.1
	@./guest/image.sh -D >/dev/null

guest-image-trixie: deps ## build (or find cached) the Debian 13 guest image, OpenZFS 2.3 (make test-trixie)
	@ZFS_NOMAD_GUEST=trixie ./guest/image.sh >/dev/null

# Packages that need ZFS boot a guest each: one package at a time keeps
# one guest at a time on a 2-core machine (a loop rather than go test -p
# 1, which would compile on one core too).
# OUTSIDE_MAKE_TEST: tests make test skips to stay within CI's 90 minutes
# (docs/testing.md, "What make test leaves out"); make test-nomad and
# make test-witnesses run them.
OUTSIDE_MAKE_TEST := ^TestNomadRawExec$$|^TestFailoverCountsTheWitnesses$$
# The guest images are built (or found) first, side by side; Nomad and the
# plugin images, which only test/nomad needs, are built beside the guest
# tests at the idle CPU priority (hack/test.sh says why).
test: deps ## everything: checks, the race detector, the images, unit tests, real-ZFS tests, csi-sanity, test-trixie-conformance and Nomad end to end in the guest; host and guest work side by side (hack/test.sh; within CI's 90 min: docs/testing.md)
	./hack/prepare.sh guest-bookworm guest-trixie
	VERSION=$(VERSION) ARCHIVE_DIR=$(IMAGES_DIR) ZFS_NOMAD_IMAGES=$(IMAGES_DIR) GO_TEST_TIMEOUT=$(GO_TEST_TIMEOUT) OUTSIDE_MAKE_TEST='$(OUTSIDE_MAKE_TEST)' ./hack/test.sh

# The guest packages again on Debian 13's OpenZFS 2.3 (zfs-node built
# against its libzfs, with the openzfs_2_2 build: docs/architecture.md,
# "OpenZFS versions"), only where the ZFS steps differ by release: the
# driver's logic above them is the same binary's and runs on the default
# guest, and test/crossversion already sends and receives full,
# incremental and resumed streams between 2.1 and 2.3 both ways.
# test/migration runs one test per kind of ZFS step a move makes: a
# planned move (incremental sends, promotion of the target), a restore on
# a replica (a clone, then receives into the replica it depends on), a
# fence (readonly set on a mounted primary), encrypted volumes (keys
# loaded and unloaded at stage and unstage, raw sends).
TRIXIE_MIGRATION_TESTS := ^(TestPlannedMove|TestARestoreOnAReplica|TestPartitionedPrimaryTurnsReadOnly|TestEncryptedVolumesOpenOnlyWhereStaged)$$
# test/replication: resume tokens, receive refusals, renames and
# rollbacks of replicas, destroys racing receives, encryption, and a
# backup target on 2.3 (its chain, pruning, holds, a full target, an
# encrypted volume's restore).
TRIXIE_REPLICATION_TESTS := ^(TestResumeAfterInterruption|TestRefusesStrangersAndBadStreams|TestBrokenReplaceKeepsTheReplica|TestEncryptedVolumeStaysEncrypted|TestDeleteRacesTidies|TestReplicaAheadOfAMovedPrimary|TestBackupsToATarget)$$/^(receiver_killed|history_from)
# make test runs the conformance half: every libzfs call the driver makes
# and the node's stage, publish, mounts and quotas on 2.3; with
# test/crossversion's streams between 2.1 and 2.3 that is what differs
# by release. The subsets above (about 11 min more on 2 cores) run in
# make test-trixie, before a release (docs/testing.md, "What make test
# leaves out").
test-trixie-conformance: guest-image-trixie ## libzfs conformance and test/node in the Debian 13 guest (OpenZFS 2.3): the part of test-trixie in make test
	status=0; for p in ./internal/node/zfs/libzfs ./test/node; do ZFS_NOMAD_GUEST=trixie go test -count=1 -timeout 40m $$p || status=1; done; exit $$status

# The shim build on OpenZFS 2.1: no release ships it there (2.1 is
# go-libzfs's, docs/architecture.md), and make test runs it on 2.3, where
# it is shipped; this run keeps the two builds interchangeable on 2.1.
test-shim: guest-image ## the shim build's libzfs conformance on OpenZFS 2.1 (not in make test: no release ships it there)
	go test -count=1 -tags openzfs_2_2 ./internal/node/zfs/libzfs

test-trixie: test-trixie-conformance ## test-trixie-conformance, then the parts of test/replication and test/migration whose ZFS steps differ, in the Debian 13 guest (OpenZFS 2.3)
	ZFS_NOMAD_GUEST=trixie go test -count=1 -timeout 20m -run '$(TRIXIE_REPLICATION_TESTS)' ./test/replication
	ZFS_NOMAD_GUEST=trixie go test -count=1 -timeout 30m -run '$(TRIXIE_MIGRATION_TESTS)' ./test/migration

# make soak N=5 [PKGS="./test/migration ./demo"]: the guest packages (and
# the demo, and test/nomad) N times each, every run's log kept.
N ?= 5
soak: guest-image images ## run the guest test packages and the demo N times (N=5), to flush out flaky tests; logs kept
	nomad=$$(./hack/nomad.sh) && ZFS_NOMAD_NOMAD=$$nomad ZFS_NOMAD_IMAGES=$(IMAGES_DIR) ./hack/soak.sh $(N) $(PKGS)

# make sim SEEDS=5000 [FIRST=1]: the fault-injection simulation's long
# mode (docs/simulation.md): every failing seed listed, each replayable with
# go test ./internal/testbed/faultsim -run 'TestSimulation$$' -seed N -v.
SEEDS ?= 5000
FIRST ?= 1
sim: ## the fault-injection simulation, SEEDS seeds (5000) from FIRST (1), every failure listed
	ZFS_NOMAD_SKIP_GUEST=1 go test -count=1 -timeout 180m -run 'TestSimulation$$' ./internal/testbed/faultsim -v -args -seeds $(SEEDS) -first-seed $(FIRST) -keep-going

nomad: ## build (or find cached) the Nomad binary for the end-to-end test (about 6 min, once)
	@./hack/nomad.sh

test-nomad: guest-image images ## the driver under a real Nomad (1 server, 3 clients) in the guest, from the nomad/ job files: docker, then raw_exec
	nomad=$$(./hack/nomad.sh) && prometheus=$$(./hack/prometheus-server.sh) && ZFS_NOMAD_NOMAD=$$nomad ZFS_NOMAD_PROMETHEUS=$$prometheus ZFS_NOMAD_IMAGES=$(IMAGES_DIR) go test -count=1 -v -timeout 40m ./test/nomad/ -args -failover-with-holder -failover-manual

# The docker scenario on Debian 13's OpenZFS 2.3 with its node image (not
# in make test: the Debian 13 images take a few minutes to build once).
test-nomad-trixie: guest-image-trixie ## test-nomad's docker scenario in the Debian 13 guest, with the Debian 13 node image
	@VERSION=$(VERSION) TAG=dev-debian13 DEBIAN_RELEASE=trixie ARCHIVE_DIR=$(IMAGES_DIR)-debian13 ./hack/images.sh
	nomad=$$(./hack/nomad.sh) && prometheus=$$(./hack/prometheus-server.sh) && ZFS_NOMAD_GUEST=trixie ZFS_NOMAD_PROMETHEUS=$$prometheus ZFS_NOMAD_NOMAD=$$nomad ZFS_NOMAD_IMAGES=$(IMAGES_DIR)-debian13 go test -count=1 -v -timeout 40m -run TestNomadEndToEnd ./test/nomad/ -args -failover-with-holder -failover-manual

# The oldest Nomad the driver supports (docs/install.md), not in make
# test: its end-to-end run costs about 17 min more (docs/testing.md).
test-nomad-oldest: guest-image images ## test-nomad's docker scenario under Nomad 1.10.2, the oldest release the driver supports
	nomad=$$(NOMAD_VERSION=v1.10.2 ./hack/nomad.sh) && prometheus=$$(./hack/prometheus-server.sh) && ZFS_NOMAD_NOMAD=$$nomad ZFS_NOMAD_PROMETHEUS=$$prometheus ZFS_NOMAD_IMAGES=$(IMAGES_DIR) go test -count=1 -v -timeout 40m -run 'TestNomadEndToEnd$$' ./test/nomad/ -args -failover-with-holder -failover-manual

test-nomad-drain: guest-image images ## test-nomad plus a drain of a client holding eight volumes (not in make test)
	nomad=$$(./hack/nomad.sh) && prometheus=$$(./hack/prometheus-server.sh) && ZFS_NOMAD_NOMAD=$$nomad ZFS_NOMAD_PROMETHEUS=$$prometheus ZFS_NOMAD_IMAGES=$(IMAGES_DIR) go test -count=1 -v -timeout 60m -run TestNomadEndToEnd ./test/nomad/ -args -drain-many -failover-with-holder -failover-manual

test-witnesses: guest-image ## the failover with a witness set on real ZFS (TestFailoverCountsTheWitnesses; not in make test)
	go test -count=1 -v -timeout 20m -run '^TestFailoverCountsTheWitnesses$$' ./test/migration

sanity-encrypted: guest-image ## csi-sanity's specs with plain volumes and again with encrypted ones (the encrypted half is not in make test: test/sanity says why)
	go test -count=1 -v -timeout 30m ./test/sanity -args -sanity.encrypted

bench: guest-image ## replication throughput vs zfs send|socat|zfs recv and the local pipe, in the guest
	go test -run '^$$' -bench . -benchtime 1x -count 1 -timeout 40m ./test/bench/

# The cluster-scale figures (docs/architecture.md, "Scale"): real node
# and controller code in one process over fake pools, at each node count
# of SCALE_NODES with 100 volumes a node. About 15 minutes on 2 cores.
# SCALE_WITNESSES configures that many witnesses (the first nodes; 0:
# none, every node counts).
SCALE_NODES ?= 3,10,30,100
SCALE_WITNESSES ?= 0
scale: ## the cluster-scale figures at SCALE_NODES nodes (3,10,30,100), 100 volumes each, on the host (SCALE_WITNESSES=5: with witnesses)
	ZFS_NOMAD_SKIP_GUEST=1 go test -count=1 -timeout 60m -run 'TestScaleFigures$$' ./internal/testbed/scalesim -v -args -scale-nodes $(SCALE_NODES) -scale-witnesses $(SCALE_WITNESSES)

proto: $(TOOLS)/protoc-gen-go $(TOOLS)/protoc-gen-go-grpc ## regenerate proto/*.pb.go
	PATH=$(TOOLS):$$PATH protoc -I proto --go_out=proto --go_opt=paths=source_relative \
	  --go-grpc_out=proto --go-grpc_opt=paths=source_relative agentpb/agent.proto

demo: deps build guest-image ## live demo: three nodes and a controller in the ZFS guest
	./demo/run.sh

demo-nomad: guest-image ## live demo under a real Nomad: 1 server, 3 clients, the nomad/ job files
	./demo/nomad.sh

clean: ## remove build output (caches live in ~/.cache/zfs-nomad)
	rm -rf bin dist
