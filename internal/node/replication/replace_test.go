package replication

import (
	"context"
	"errors"
	"maps"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copylock"
	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

const (
	testRoot    = "tank/nomad"
	testDataset = testRoot + "/" + testVolume
)

func dataMsg(b []byte) message {
	return message{data: b}
}

// fullStream is a full stream of snapshot zn-2 (guid 42), whole or broken
// off after its first record.
func fullStream(t *testing.T, generation uint64, whole bool) *fakeStream {
	msgs := []message{header(KindFull, generation), dataMsg(testBegin(0, 42, "tank/nomad/"+testVolume+"@zn-2")), dataMsg([]byte("records"))}
	if !whole {
		s := stream(t, false, msgs...)
		s.fail = errors.New("connection reset by peer")
		return s
	}
	return stream(t, false, append(msgs, dataMsg([]byte(streamEnd)))...)
}

func replicaProps(generation string) map[string]string {
	return map[string]string{copyrecord.PropRole: RoleReplica, copyrecord.PropGeneration: generation, copyrecord.PropVolumeID: testVolume}
}

// TestFullReplaceKeepsTheOldReplicaUntilComplete: a full stream of a newer
// generation replaces an existing replica only once it is complete; a
// transfer that breaks leaves the old replica as it was (I2), and the
// replaced one is set aside, not destroyed (I4).
func TestFullReplaceKeepsTheOldReplicaUntilComplete(t *testing.T) {
	z := newMemPool(testRoot)
	z.put(testDataset, replicaProps("1"), "zn-1:7")
	r := NewReceiver(z, new(copylock.Locks), nil, testRoot, "n2", 2, hclog.NewNullLogger())

	_, err := receiveFrom(r, fullStream(t, 2, false))
	if status.Code(errdefs.ToStatus(err)) != codes.Aborted {
		t.Fatalf("a broken full stream: %v, want Aborted", err)
	}
	old := z.dataset(testDataset)
	if old == nil || old.props[copyrecord.PropGeneration] != "1" || len(old.snaps) != 1 || old.snaps[0].GUID != 7 {
		t.Fatalf("after a broken replacement the replica is %+v, want generation 1 with zn-1 as before", old)
	}
	if names := z.names(); !slices.Equal(names, []string{testRoot, testDataset}) {
		t.Errorf("after a broken replacement the pool holds %v, want the old replica alone", names)
	}

	if _, err := receiveFrom(r, fullStream(t, 2, true)); err != nil {
		t.Fatalf("a whole full stream: %v", err)
	}
	now := z.dataset(testDataset)
	if now == nil || now.props[copyrecord.PropGeneration] != "2" || now.props[copyrecord.PropRole] != RoleReplica || len(now.snaps) != 1 || now.snaps[0].GUID != 42 {
		t.Fatalf("after the replacement the replica is %+v, want generation 2 with zn-2", now)
	}
	var aside []string
	for _, n := range z.names() {
		if strings.HasPrefix(n, testDataset+"-aside-") {
			aside = append(aside, n)
		}
	}
	if len(aside) != 1 || z.dataset(aside[0]).props[copyrecord.PropRole] != contract.RoleSetAside || z.dataset(aside[0]).snaps[0].GUID != 7 {
		t.Fatalf("the replaced replica: %v, want it set aside with zn-1", aside)
	}
	if n := len(z.names()); n != 3 {
		t.Errorf("pool holds %v, want the root, the replica and the one set aside", z.names())
	}
}

// TestRecoverFinishesReplacements: whatever step of a replacement a crash
// interrupted, the node's recovery leaves one replica at the volume's name
// and loses no copy that may hold data.
func TestRecoverFinishesReplacements(t *testing.T) {
	incoming := incomingName(testDataset)
	tests := []struct {
		name      string
		setup     func(z *memPool)
		wantGen   string // the generation at the volume's name
		wantRole  string
		wantAside int
	}{
		{"a partial replacement is discarded", func(z *memPool) {
			z.put(testDataset, replicaProps("1"), "zn-1:7")
			z.put(incoming, map[string]string{"readonly": "on"})
			z.ds[incoming].token, z.ds[incoming].partial = "1-abc", true
		}, "1", RoleReplica, 0},
		{"a complete but unlabelled replacement is discarded", func(z *memPool) {
			z.put(testDataset, replicaProps("1"), "zn-1:7")
			z.put(incoming, map[string]string{"readonly": "on"}, "zn-2:42")
		}, "1", RoleReplica, 0},
		{"a labelled replacement takes the replica's place", func(z *memPool) {
			z.put(testDataset, replicaProps("1"), "zn-1:7")
			z.put(incoming, replicaProps("2"), "zn-2:42")
		}, "2", RoleReplica, 1},
		{"a labelled replacement whose old replica is gone", func(z *memPool) {
			z.put(incoming, replicaProps("2"), "zn-2:42")
		}, "2", RoleReplica, 0},
		{"a replacement for a replica promoted meanwhile is set aside", func(z *memPool) {
			z.put(testDataset, map[string]string{copyrecord.PropRole: contract.RolePrimary, copyrecord.PropGeneration: "3"}, "zn-1:7")
			z.put(incoming, replicaProps("2"), "zn-2:42")
		}, "3", contract.RolePrimary, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			z := newMemPool(testRoot)
			tt.setup(z)
			r := NewReceiver(z, new(copylock.Locks), nil, testRoot, "n2", 2, hclog.NewNullLogger())
			if err := r.Recover(context.Background()); err != nil {
				t.Fatal(err)
			}
			got := z.dataset(testDataset)
			if got == nil || got.props[copyrecord.PropGeneration] != tt.wantGen || got.props[copyrecord.PropRole] != tt.wantRole {
				t.Fatalf("at %s: %+v, want %s generation %s", testDataset, got, tt.wantRole, tt.wantGen)
			}
			aside := 0
			for _, n := range z.names() {
				if n == incoming {
					t.Errorf("%s is still there", incoming)
				}
				if strings.HasPrefix(n, testDataset+"-aside-") {
					aside++
				}
			}
			if aside != tt.wantAside {
				t.Errorf("%d copies set aside, want %d (pool: %v)", aside, tt.wantAside, z.names())
			}
		})
	}
}

// TestRecoverHoldsEachReplicasNewestBase: a node stopped between a receive
// and its tidy kept the hold on the previous base; its recovery moves the
// hold to the replica's newest snapshot, as tidy would have, so that a
// deleted CSI snapshot on the old base is destroyed, not deferred. Other
// holds and other copies' holds stay.
func TestRecoverHoldsEachReplicasNewestBase(t *testing.T) {
	peer := peerTag("n3")
	tests := []struct {
		name  string
		props map[string]string
		holds map[string][]string // snapshot -> tags, before
		want  map[string][]string // after
	}{
		{"a stop cut the tidy off", replicaProps("1"),
			map[string][]string{"csi-1": {BaseHoldTag}},
			map[string][]string{"zn-2": {BaseHoldTag}}},
		{"a stop between tidy's hold and its release", replicaProps("1"),
			map[string][]string{"csi-1": {BaseHoldTag}, "zn-2": {BaseHoldTag}},
			map[string][]string{"zn-2": {BaseHoldTag}}},
		{"tidied", replicaProps("1"),
			map[string][]string{"zn-2": {BaseHoldTag}},
			map[string][]string{"zn-2": {BaseHoldTag}}},
		{"a first receive whose tidy never ran", replicaProps("1"),
			map[string][]string{},
			map[string][]string{"zn-2": {BaseHoldTag}}},
		{"a peer's base stays until a receive mirrors the sender's", replicaProps("1"),
			map[string][]string{"csi-1": {BaseHoldTag, peer}},
			map[string][]string{"csi-1": {peer}, "zn-2": {BaseHoldTag}}},
		{"a primary is its own to tidy", map[string]string{copyrecord.PropRole: contract.RolePrimary, copyrecord.PropGeneration: "2"},
			map[string][]string{"csi-1": {BaseHoldTag}},
			map[string][]string{"csi-1": {BaseHoldTag}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			z := newMemPool(testRoot)
			z.put(testDataset, tt.props, "csi-1:7", "zn-2:8")
			for snap, tags := range tt.holds {
				z.ds[testDataset].holds[snap] = slices.Clone(tags)
			}
			r := NewReceiver(z, new(copylock.Locks), nil, testRoot, "n2", 2, hclog.NewNullLogger())
			if err := r.Recover(context.Background()); err != nil {
				t.Fatal(err)
			}
			got := map[string][]string{}
			for snap, tags := range z.ds[testDataset].holds {
				if len(tags) > 0 {
					got[snap] = slices.Sorted(slices.Values(tags))
				}
			}
			if !maps.EqualFunc(got, tt.want, slices.Equal) {
				t.Errorf("holds after recovery: %v, want %v", got, tt.want)
			}
		})
	}
}

// TestStreamsWithPropertiesAreRefused: a stream carrying properties (zfs
// send -p), which could set a mountpoint over a host directory or this
// driver's labels, is refused before zfs receive sees it.
func TestStreamsWithPropertiesAreRefused(t *testing.T) {
	z := newMemPool(testRoot)
	z.put(testDataset, replicaProps("1"), "zn-1:7")
	r := NewReceiver(z, new(copylock.Locks), nil, testRoot, "n2", 2, hclog.NewNullLogger())
	compound := testBegin(0, 42, "tank/nomad/"+testVolume+"@zn-2")
	compound[16] = 2 // a compound stream
	_, err := receiveFrom(r, stream(t, false, header(KindFull, 2), dataMsg(compound), dataMsg([]byte(streamEnd))))
	if status.Code(errdefs.ToStatus(err)) != codes.InvalidArgument {
		t.Errorf("a stream with properties: %v, want InvalidArgument", err)
	}
	if z.receives != 0 {
		t.Error("the stream reached zfs receive")
	}
	if got := z.dataset(testDataset); got == nil || got.props[copyrecord.PropGeneration] != "1" {
		t.Errorf("the replica changed: %+v", got)
	}
}

func TestStreamLimit(t *testing.T) {
	const gib = 1 << 30
	tests := []struct {
		name               string
		capacity, maxQuota uint64
		want               int64
	}{
		{"the volume's capacity", gib, 10 * gib, gib + gib/8 + 64<<20},
		{"a capacity above max_quota counts as max_quota", 100 * gib, 10 * gib, 10*gib + 10*gib/8 + 64<<20},
		{"no capacity: max_quota", 0, 10 * gib, 10*gib + 10*gib/8 + 64<<20},
		{"no max_quota: unbounded", gib, 0, math.MaxInt64},
		{"no overflow", math.MaxUint64, math.MaxUint64, math.MaxInt64},
	}
	for _, tt := range tests {
		if got := streamLimit(tt.capacity, tt.maxQuota); got != tt.want {
			t.Errorf("%s: %d, want %d", tt.name, got, tt.want)
		}
	}
}

// TestOversizedStreamsAreRefused: zfs receive enforces no quota, so the
// receiver ends a stream that carries more than its volume could send,
// and discards what arrived rather than keep it resumable; the replica
// stays as it was.
func TestOversizedStreamsAreRefused(t *testing.T) {
	defer func(m uint64) { streamMargin = m }(streamMargin)
	streamMargin = 0
	for _, kind := range []string{KindIncremental, KindFull} {
		t.Run(kind, func(t *testing.T) {
			z := newMemPool(testRoot)
			z.put(testDataset, replicaProps("1"), "zn-1:41")
			r := NewReceiver(z, new(copylock.Locks), nil, testRoot, "n2", 2, hclog.NewNullLogger())
			r.MaxQuota = 1000
			from := uint64(41)
			if kind == KindFull {
				from = 0
			}
			h := header(kind, 2)
			h.header.CapacityBytes = 400 // a limit of 450 bytes
			msgs := []message{h, dataMsg(testBegin(from, 42, testDataset+"@zn-2"))}
			for range 10 {
				msgs = append(msgs, dataMsg(make([]byte, 100)))
			}
			_, err := receiveFrom(r, stream(t, false, append(msgs, dataMsg([]byte(streamEnd)))...))
			if status.Code(errdefs.ToStatus(err)) != codes.InvalidArgument {
				t.Fatalf("a stream of 1300 bytes for a volume of 400: %v, want InvalidArgument", err)
			}
			got := z.dataset(testDataset)
			if got == nil || got.props[copyrecord.PropGeneration] != "1" || len(got.snaps) != 1 || got.token != "" {
				t.Errorf("the replica after an oversized stream: %+v, want it as it was, with no partial receive", got)
			}
			if names := z.names(); len(names) != 2 {
				t.Errorf("the pool holds %v, want the root and the replica", names)
			}
		})
	}
}

// TestInterruptedFirstReceiveIsSentAfresh: a first receive that was
// interrupted, whose resume token the sender will not use (the snapshot
// it names was pruned), is discarded and received whole instead of
// wedging every later push.
func TestInterruptedFirstReceiveIsSentAfresh(t *testing.T) {
	z := newMemPool(testRoot)
	z.put(testDataset, replicaProps("1"))
	z.ds[testDataset].token, z.ds[testDataset].partial = "1-abc", true
	r := NewReceiver(z, new(copylock.Locks), nil, testRoot, "n2", 2, hclog.NewNullLogger())
	if _, err := receiveFrom(r, fullStream(t, 1, true)); err != nil {
		t.Fatal(err)
	}
	got := z.dataset(testDataset)
	if got == nil || got.token != "" || len(got.snaps) != 1 || got.snaps[0].GUID != 42 {
		t.Fatalf("the replica after a fresh full stream: %+v, want zn-2 received whole", got)
	}
}

// TestIncrementalRollsBackOnlyWhatTheSendersHistoryHolds: a replica of an
// older generation with a snapshot after the stream's base takes the
// incremental, rolling that snapshot back, only when the sender's history
// vouches for the replica's generation (planned moves since) and this
// node granted the sender the newer generation (its promise record).
// Otherwise, or for a replica of the sender's own generation, the stream
// is refused and the replica stays as it was: its snapshot may hold
// writes the sender lacks (I4).
func TestIncrementalRollsBackOnlyWhatTheSendersHistoryHolds(t *testing.T) {
	tests := []struct {
		name        string
		replicaGen  string
		generation  uint64 // the sender's
		historyFrom uint64 // the sender's
		want        codes.Code
	}{
		{"planned moves since the replica's generation", "1", 3, 1, codes.OK},
		{"the history starts at the replica's generation", "2", 3, 2, codes.OK},
		{"a failover since the replica's generation", "1", 3, 2, codes.FailedPrecondition},
		{"a sender that vouches for nothing (an older version)", "1", 3, 0, codes.FailedPrecondition},
		{"a replica of the sender's generation", "3", 3, 1, codes.FailedPrecondition},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			z := newMemPool(testRoot)
			// This node granted the sender (n1) its generation: the move
			// that promoted it reserved it here.
			putPromise(z, "3 n1")
			z.put(testDataset, replicaProps(tt.replicaGen), "zn-1:41", "zn-5:5")
			if err := z.Hold(context.Background(), testDataset+"@zn-5", BaseHoldTag); err != nil {
				t.Fatal(err)
			}
			r := NewReceiver(z, new(copylock.Locks), nil, testRoot, "n2", 2, hclog.NewNullLogger())
			h := header(KindIncremental, tt.generation)
			h.header.HistoryFrom = tt.historyFrom
			_, err := receiveFrom(r, stream(t, false, h, plainStream(KindIncremental), dataMsg([]byte(streamEnd))))
			if got := status.Code(errdefs.ToStatus(err)); got != tt.want {
				t.Fatalf("receive: %v (%s), want %s", err, got, tt.want)
			}
			var snaps []uint64
			for _, s := range z.dataset(testDataset).snaps {
				snaps = append(snaps, s.GUID)
			}
			want := []uint64{41, 42}
			if tt.want != codes.OK {
				want = []uint64{41, 5}
			}
			if !slices.Equal(snaps, want) {
				t.Errorf("the replica's snapshots (guids) are %v, want %v", snaps, want)
			}
			if n := len(copies(z)); n != 2 {
				t.Errorf("pool holds %v, want the root and the replica alone", copies(z))
			}
		})
	}
}

// TestReplacedReplicaIsSetAsideWhateverTheHeaderSays: a replica with
// snapshots that a full stream replaces is set aside (I4), even when the
// sender's history_from and generation say planned moves since: those are
// the sender's word alone.
func TestReplacedReplicaIsSetAsideWhateverTheHeaderSays(t *testing.T) {
	tests := []struct {
		name        string
		historyFrom uint64 // the sender's; its generation is 2, the replica's 1
		csiSnapshot bool   // the replica holds a CSI snapshot the stream lacks
		wantAside   bool
	}{
		// The sender's header alone says so: a peer may lie, and nothing
		// the node holds confirms it.
		{"the header says planned moves since the replica's generation", 1, false, true},
		{"planned moves since, but it holds a CSI snapshot the new copy lacks", 1, true, true},
		{"a failover since", 2, false, true},
		{"a sender that vouches for nothing (an older version)", 0, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			z := newMemPool(testRoot)
			snaps := []string{"zn-1:7"}
			if tt.csiSnapshot {
				snaps = append(snaps, contract.SnapshotIDForName("before-upgrade")+":8")
			}
			z.put(testDataset, replicaProps("1"), snaps...)
			if err := z.Hold(context.Background(), testDataset+"@zn-1", BaseHoldTag); err != nil {
				t.Fatal(err)
			}
			r := NewReceiver(z, new(copylock.Locks), nil, testRoot, "n2", 2, hclog.NewNullLogger())
			s := fullStream(t, 2, true)
			h := <-s.msgs
			h.header.HistoryFrom = tt.historyFrom
			s = stream(t, false, append([]message{h}, drain(s)...)...)
			if _, err := receiveFrom(r, s); err != nil {
				t.Fatal(err)
			}
			if now := z.dataset(testDataset); now == nil || now.props[copyrecord.PropGeneration] != "2" || len(now.snaps) != 1 || now.snaps[0].GUID != 42 {
				t.Fatalf("after the replacement the replica is %+v, want generation 2 with zn-2", now)
			}
			aside := slices.ContainsFunc(z.names(), func(n string) bool { return strings.HasPrefix(n, testDataset+"-aside-") })
			if aside != tt.wantAside || len(z.names()) != map[bool]int{false: 2, true: 3}[tt.wantAside] {
				t.Errorf("pool holds %v; want the old replica set aside: %v", z.names(), tt.wantAside)
			}
		})
	}
}

// drain returns the messages left in a test stream.
func drain(s *fakeStream) []message {
	var out []message
	for m := range s.msgs {
		out = append(out, m)
	}
	return out
}
