package migration

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster/clustertest"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// TestTwoInstancesNeverGiveTwoPrimaries: the shipped controller job runs
// two instances, and a publish back to a move's source may reach the
// instance that does not run the move. Instance A moves the volume from
// n1 to n2; its reservation of generation 2 for n2 is held back on every
// node (slow property writes) while instance B publishes the volume on
// n1, and the CO stages it there as soon as B answers. Whatever the order
// of A's fence and reservation, the volume ends with at most one writable
// primary: B either finds n1 unfenced (A had not fenced yet, and then the
// staged source refuses A's fence), or finds the fence and may lift it
// only by superseding a promise n1's own node already holds. With the
// reservation beside the fence, B lifted a fence no answering node had a
// promise for yet, and A then promoted n2: two primaries.
func TestTwoInstancesNeverGiveTwoPrimaries(t *testing.T) {
	fakes := new(clustertest.Fakes)
	var nodes []*clustertest.FakeAgent
	for _, id := range []string{"n1", "n2", "n3"} {
		nodes = append(nodes, fakes.Add(agentclient.NodeInfo{NodeID: id}))
	}
	source := nodes[0]
	id := source.PutPrimary("shared", 1)
	a := New(fakes.Cluster(t), hclog.NewNullLogger())
	a.CatchUpWait = time.Millisecond
	b := New(fakes.Cluster(t), hclog.NewNullLogger())

	release := make(chan struct{})
	var held atomic.Int32
	var bAnswer string
	var once sync.Once
	// B publishes on the source once A holds a reservation call on every
	// node and, if A fences before it reserves, once the source is fenced.
	publishOnSource := func() {
		for deadline := time.Now().Add(2 * time.Second); held.Load() < 3 && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		}
		for deadline := time.Now().Add(500 * time.Millisecond); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if c, _ := source.Copy(id); c.MovingTo != "" {
				break
			}
		}
		gen, err := b.Publish(context.Background(), id, "n1")
		bAnswer = fmt.Sprintf("generation %d, %v", gen, err)
		if err == nil { // the CO stages it: a writer on n1
			c, _ := source.Copy(id)
			c.Mounted = true
			source.PutCopy(c)
		}
		close(release)
	}
	for i, n := range nodes {
		n.BeforeCall("Reserve", func() {
			held.Add(1)
			if i == 0 {
				once.Do(publishOnSource)
			}
			<-release
		})
	}
	_, _ = a.Publish(context.Background(), id, "n2")
	waitForMoveEnd(t, a)

	var writable []string
	for _, n := range nodes {
		c, ok := n.Copy(id)
		if ok && c.Role == contract.RolePrimary && c.MovingTo == "" && !c.LeaseFenced {
			writable = append(writable, fmt.Sprintf("%s at %d (mounted %v)", c.NodeID, c.Generation, c.Mounted))
		}
	}
	if len(writable) > 1 {
		t.Fatalf("writable primaries after instance B's publish on the source (%s) beside instance A's move: %v; want at most one", bAnswer, writable)
	}
	t.Logf("B's publish on n1: %s; writable primaries: %v; A's move: %+v", bAnswer, writable, a.Moves())
}

// waitForMoveEnd waits until m's one move job ended, well or not.
func waitForMoveEnd(t *testing.T, m *Migrator) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if moves := m.Moves(); len(moves) == 1 && (moves[0].Error != "" || !moves[0].Moved.IsZero()) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the move did not end: %+v", m.Moves())
		}
	}
}

// TestANodeUnderTwoAddressesCountsOnce: four nodes, n2 listed by name
// and by IP, n3 and n4 down. n1 and n2 are two of four, no majority: no
// move is decided, however many of n2's addresses answer. Counting
// addresses, three of five answered and granted, and the move promoted
// n2 while n3 and n4 could make the other majority.
func TestANodeUnderTwoAddressesCountsOnce(t *testing.T) {
	fakes := new(clustertest.Fakes)
	var nodes []*clustertest.FakeAgent
	for _, id := range []string{"n1", "n2", "n3", "n4"} {
		nodes = append(nodes, fakes.Add(agentclient.NodeInfo{NodeID: id}))
	}
	fakes.Alias("n2", "10.0.0.2:7670")
	nodes[2].SetDown(true)
	nodes[3].SetDown(true)
	id := nodes[0].PutPrimary("aliased", 1)
	m := New(fakes.Cluster(t), hclog.NewNullLogger())
	m.CatchUpFresh = -1 // the move runs in the publish: its answer is the move's
	_, err := m.Publish(context.Background(), id, "n2")
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("publish on n2 with n1 and n2 of four nodes answering (n2 at two addresses): %v, want Unavailable (no majority)", err)
	}
	if c, _ := nodes[1].Copy(id); c.Role == contract.RolePrimary {
		t.Errorf("n2 was promoted with two of four nodes: %+v", c)
	}
	for _, n := range nodes[:2] {
		if r := n.Reservations(); len(r) > 0 {
			t.Errorf("a reservation reached a node without a majority answering: %+v", r)
		}
	}
}

// TestAMovesFenceStaysWhileItsTargetIsSilent: n1's copy is fenced for a
// move to n2, and the records of n1 and n3 promise generation 3 to n1 (a
// publish back to n1 superseded the move's promise, which n2 granted
// after its promotion at 2). n2 is silent now. Its copy may be the
// primary at 2, staged: a publish on n1 keeps the fence and answers
// Unavailable. Found by the explorer (TestExplorerLong): lifting the fence
// on such a look gave two writers.
func TestAMovesFenceStaysWhileItsTargetIsSilent(t *testing.T) {
	fakes := new(clustertest.Fakes)
	n1 := fakes.Add(agentclient.NodeInfo{NodeID: "n1"})
	n2 := fakes.Add(agentclient.NodeInfo{NodeID: "n2"})
	n3 := fakes.Add(agentclient.NodeInfo{NodeID: "n3"})
	id := contract.VolumeIDForName("superseded")
	n1.PutCopy(agentclient.Copy{VolumeID: id, Name: "superseded", Role: contract.RolePrimary, Generation: 1, MovingTo: "n2", FencedUnixNano: 1, CapacityBytes: 1 << 30})
	n2.PutCopy(agentclient.Copy{VolumeID: id, Name: "superseded", Role: contract.RolePrimary, Generation: 2, Mounted: true, CapacityBytes: 1 << 30})
	for _, n := range []*clustertest.FakeAgent{n1, n2, n3} {
		n.Promise(id, 3, "n1")
	}
	n2.SetDown(true)
	m := New(fakes.Cluster(t), hclog.NewNullLogger())
	gen, err := m.Publish(context.Background(), id, "n1")
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("publish on n1, fenced for n2, with n2 silent: generation %d, %v; want Unavailable", gen, err)
	}
	if c, _ := n1.Copy(id); c.MovingTo != "n2" {
		t.Errorf("n1's copy after the publish: %+v; want still fenced for n2", c)
	}
}

// TestNoFailoverOnATornLook: instance B's look read n2 as a replica
// before instance A's move promoted it, and n1 after A demoted it: no
// primary in the look. A failover promoted n1 beside n2's new primary.
// n2 refuses a failover's reservation while it holds the primary, and
// that refusal stops the failover whatever the others granted: B looks
// again and finds n2 the primary. Found by the explorer.
func TestNoFailoverOnATornLook(t *testing.T) {
	fakes := new(clustertest.Fakes)
	n1 := fakes.Add(agentclient.NodeInfo{NodeID: "n1"})
	n2 := fakes.Add(agentclient.NodeInfo{NodeID: "n2"})
	n3 := fakes.Add(agentclient.NodeInfo{NodeID: "n3"})
	auto := map[string]string{contract.ParamFailover: contract.FailoverAuto}
	id := contract.VolumeIDForName("torn")
	replica := agentclient.Copy{VolumeID: id, Name: "torn", Role: contract.RoleReplica, Generation: 2, Parameters: auto, CapacityBytes: 1 << 30, LastSnapshotUnixNano: 5}
	n1.PutCopy(replica) // demoted by A's move
	replica.Generation = 1
	n2.PutCopy(replica) // read before A promoted it
	for _, n := range []*clustertest.FakeAgent{n1, n2, n3} {
		n.Promise(id, 2, "n2") // A's move reserved generation 2 for n2
	}
	n2.BeforeCall("Reserve", func() {
		c, _ := n2.Copy(id)
		c.Role, c.Generation, c.Mounted = contract.RolePrimary, 2, true // A's promotion, and the CO's stage
		n2.PutCopy(c)
	})
	m := New(fakes.Cluster(t), hclog.NewNullLogger())
	_, _ = m.Publish(context.Background(), id, "n1")
	if c, _ := n1.Copy(id); c.Role == contract.RolePrimary {
		t.Fatalf("n1 was failed over to (%+v) while n2 holds the primary, staged", c)
	}
}
