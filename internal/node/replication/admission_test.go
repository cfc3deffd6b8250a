package replication

import (
	"context"
	"fmt"
	"maps"
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

// putPromise gives z a promise record of testVolume ("GENERATION HOLDER"),
// as volume.Records.Reserve writes it: what this node granted.
func putPromise(z *memPool, record string) {
	if record == "" {
		return
	}
	z.put(copyrecord.PromiseShard(testRoot, testVolume), map[string]string{copyrecord.PropPromisePrefix + testVolume: record})
}

// copies lists z's datasets but the promise records'.
func copies(z *memPool) []string {
	return slices.DeleteFunc(z.names(), func(n string) bool { return strings.HasPrefix(n, testRoot+"/"+copyrecord.PromisesDataset+"/") })
}

// TestALiarsIncrementalLeavesEveryGenuineSnapshot: a peer holding a node
// certificate sends an incremental from an older snapshot of a genuine
// replica, whose header claims a newer generation and a history that
// vouches for the replica's later snapshots. Nothing a peer sends rolls a
// snapshot back unless a generation this node promised to that peer
// supersedes it: every such stream is refused before anything changes,
// and the replica keeps every snapshot and hold, nothing set aside. Only
// the node this one promised a newer generation to (a planned move's
// target, which this node granted) has them rolled back.
func TestALiarsIncrementalLeavesEveryGenuineSnapshot(t *testing.T) {
	tests := []struct {
		name        string
		promised    string // this node's promise record; "" for none
		cert        string // the node the sender's certificate names
		source      string // the node the header names
		generation  uint64
		historyFrom uint64
		want        codes.Code
		says        string // in the refusal
	}{
		{"no newer generation promised here", "", "n9", "n9", 3, 1, codes.FailedPrecondition, newestSays},
		{"the newer generation promised to another node", "3 n1", "n9", "n9", 3, 1, codes.FailedPrecondition, newestSays},
		{"a claim to be the node it was promised to", "3 n1", "n9", "n1", 3, 1, codes.PermissionDenied, "certificate names"},
		{"a generation promised to the liar, not above the replica's", "2 n9", "n9", "n9", 3, 1, codes.FailedPrecondition, newestSays},
		{"a volume being deleted", "9 " + contract.DeletionHolder, "n9", "n9", 3, 1, codes.FailedPrecondition, newestSays},
		{"a header far above every generation", "", "n9", "n9", 1000, 1, codes.FailedPrecondition, newestSays},
		{"the node promised the newer generation, after a failover", "3 n1", "n1", "n1", 3, 3, codes.FailedPrecondition, "does not hold"},
		// The legitimate flow: a planned move promoted n1 at generation
		// 3, which this node granted.
		{"the node promised the newer generation, after planned moves", "3 n1", "n1", "n1", 3, 1, codes.OK, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			z := newMemPool(testRoot)
			putPromise(z, tt.promised)
			// The genuine replica of generation 2: the liar's base zn-1,
			// and two later snapshots, the newest held as the base.
			z.put(testDataset, replicaProps("2"), "zn-1:41", "zn-5:5", "zn-6:6")
			if err := z.Hold(ctx, testDataset+"@zn-6", BaseHoldTag); err != nil {
				t.Fatal(err)
			}
			before := z.dataset(testDataset)
			r := NewReceiver(z, new(copylock.Locks), nil, testRoot, "n2", 2, hclog.NewNullLogger())
			h := header(KindIncremental, tt.generation)
			h.header.SourceNodeID, h.header.HistoryFrom = tt.source, tt.historyFrom
			s := stream(t, false, h, plainStream(KindIncremental), dataMsg([]byte(streamEnd)))
			_, err := r.Receive(s.ctx, tt.cert, s)
			if got := status.Code(errdefs.ToStatus(err)); got != tt.want || (err != nil && !strings.Contains(err.Error(), tt.says)) {
				t.Fatalf("receive: %v (%s), want %s saying %q", err, got, tt.want, tt.says)
			}
			after := z.dataset(testDataset)
			if tt.want == codes.OK {
				if got := guids(after); !slices.Equal(got, []uint64{41, 42}) {
					t.Errorf("the promised node's stream left snapshots %v, want zn-5 and zn-6 rolled back and zn-2 received", got)
				}
				return
			}
			if got, want := guids(after), guids(before); !slices.Equal(got, want) {
				t.Errorf("the replica's snapshots are %v after the refused stream, want every genuine one: %v", got, want)
			}
			if !maps.EqualFunc(after.holds, before.holds, slices.Equal) {
				t.Errorf("the replica's holds are %v after the refused stream, want %v", after.holds, before.holds)
			}
			if after.props[copyrecord.PropGeneration] != "2" {
				t.Errorf("the replica's generation is %s after the refused stream, want 2", after.props[copyrecord.PropGeneration])
			}
			if z.receives != 0 {
				t.Errorf("the refused stream reached zfs receive (%d runs)", z.receives)
			}
			if got := copies(z); len(got) != 2 {
				t.Errorf("pool holds %v, want the root and the replica alone (nothing set aside)", got)
			}
		})
	}
}

// newestSays is what a refused rollback tells its sender: what the
// replica holds, and where to send from.
const newestSays = "holds 2 snapshot(s) after the stream's base, the newest zn-6, received at generation 2"

func guids(d *memDataset) []uint64 {
	var out []uint64
	for _, s := range d.snaps {
		out = append(out, s.GUID)
	}
	return out
}

// TestALiarCannotRatchetTheGeneration: a peer holding a node certificate
// sends stream after stream of a volume, each claiming a generation as
// far above the last as the receiver allowed. The bound is measured from
// this node's promise record alone, never from the label the liar's
// previous stream set, so only the first stays within it: the copy's
// generation never passes the record plus MaxGenerationLead, whatever
// the streams' kinds.
func TestALiarCannotRatchetTheGeneration(t *testing.T) {
	const lead = MaxGenerationLead
	tests := []struct {
		name     string
		promised uint64 // this node's promise record, to n1; 0 for none
		replica  bool   // a genuine replica at the record's generation, with zn-1 (guid 41)
		kinds    []string
	}{
		{"incrementals into a genuine replica", 5, true, []string{KindIncremental, KindIncremental, KindIncremental}},
		{"a planted replica, then incrementals", 0, false, []string{KindFull, KindIncremental, KindIncremental}},
		{"planted replicas replacing each other", 0, false, []string{KindFull, KindFull, KindFull}},
		{"a full stream replacing a genuine replica, then incrementals", 5, true, []string{KindFull, KindIncremental, KindIncremental}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			z := newMemPool(testRoot)
			if tt.promised > 0 {
				putPromise(z, fmt.Sprintf("%d n1", tt.promised))
			}
			if tt.replica {
				z.put(testDataset, replicaProps(fmt.Sprint(tt.promised)), "zn-1:41")
			}
			r := NewReceiver(z, new(copylock.Locks), nil, testRoot, "n2", 2, hclog.NewNullLogger())
			bound := tt.promised + lead
			newest := uint64(41)
			for i, kind := range tt.kinds {
				gen := tt.promised + uint64(i+1)*lead
				guid := uint64(100 + i)
				from := newest
				if kind == KindFull {
					from = 0
				}
				snap := fmt.Sprintf("zn-l%d", i)
				h := message{header: &Header{VolumeID: testVolume, Kind: kind, Snapshot: snap, Generation: gen, HistoryFrom: 1, SourceNodeID: "n9"}}
				begin := testBegin(from, guid, testDataset+"@"+snap)
				s := stream(t, false, h, dataMsg(append(begin, "records"...)), dataMsg([]byte(streamEnd)))
				_, err := r.Receive(s.ctx, "n9", s)
				got := status.Code(errdefs.ToStatus(err))
				switch {
				case gen <= bound && got != codes.OK:
					t.Fatalf("stream %d (%s at generation %d, within the bound %d): %v, want it received", i+1, kind, gen, bound, err)
				case gen > bound && got != codes.FailedPrecondition:
					t.Errorf("stream %d (%s at generation %d, above the record %d plus %d): %v (%s), want FailedPrecondition", i+1, kind, gen, tt.promised, uint64(lead), err, got)
				}
				if err == nil {
					newest = guid
				}
			}
			if d := z.dataset(testDataset); d != nil {
				if g := d.props[copyrecord.PropGeneration]; g != fmt.Sprint(bound) {
					t.Errorf("after the liar's streams the copy is of generation %s, want at most the record plus the bound, %d", g, bound)
				}
			}
		})
	}
}
