package migration

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster/clustertest"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/witnesses"
)

var testWitnesses = []string{"n1@n1:7670", "n2@n2:7670", "n4@n4:7670"}

// witnessView is a view of the answering nodes (by ID), each reporting
// the witness set reported (nil: none), over five nodes in all.
func witnessView(t *testing.T, answering []string, reported map[string][]string) view {
	t.Helper()
	var answers []cluster.Answer[agentclient.Copy]
	for _, id := range answering {
		w, ok := reported[id]
		if !ok {
			w = testWitnesses
		}
		answers = append(answers, cluster.Answer[agentclient.Copy]{Node: cluster.Node{Info: agentclient.NodeInfo{NodeID: id, Witnesses: w}}})
	}
	var unreachable []cluster.Unreachable
	for i := len(answering); i < 5; i++ {
		unreachable = append(unreachable, cluster.Unreachable{Addr: fmt.Sprintf("silent-%d:7670", i)})
	}
	return (&Migrator{log: hclog.NewNullLogger()}).viewOf("v", answers, unreachable)
}

// TestQuorumCountsTheWitnesses: with witnesses n1, n2, n4 of five nodes,
// a look has a quorum when a majority of the witnesses answered, however
// many other nodes did; and none while the answering nodes report
// different witness sets.
func TestQuorumCountsTheWitnesses(t *testing.T) {
	tests := []struct {
		name      string
		answering []string
		reported  map[string][]string
		want      bool
	}{
		{"three of five, one witness", []string{"n3", "n4", "n5"}, nil, false},
		{"two of five, both witnesses", []string{"n1", "n2"}, nil, true},
		{"four of five, one witness", []string{"n1", "n3", "n5", "n6"}, nil, false},
		{"every witness, but one node reports another set", []string{"n1", "n2", "n4"}, map[string][]string{"n2": {"n1@n1:7670", "n2@n2:7670", "n3@n3:7670"}}, false},
		{"every witness, but one node reports none", []string{"n1", "n2", "n4"}, map[string][]string{"n4": nil}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := witnessView(t, tt.answering, tt.reported)
			if got := v.quorum(); got != tt.want {
				t.Errorf("quorum() = %v, want %v (witnesses %v, %v)", got, tt.want, v.witnesses, v.witnessErr)
			}
			if tt.reported != nil {
				err := (&Migrator{}).noQuorum("v", v)
				if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "count different witness sets") {
					t.Errorf("noQuorum = %v, want Unavailable naming the two sets", err)
				}
			}
		})
	}
}

// TestCreationPlanCountsTheWitnesses: a creation's plan counts the
// promises and the grants of the witnesses only. Two creations split the
// top generation; only the witnesses' promises say whether one can win.
func TestCreationPlanCountsTheWitnesses(t *testing.T) {
	// p is "recorder:generation:holder"; every node answers.
	tests := []struct {
		name     string
		promises []string
		want     string
	}{
		{"an earlier attempt's promise by two witnesses: tried again", []string{"n1:1:n3", "n2:1:n3"}, "n3 1"},
		// Counted over all nodes n5 has two promises to n3's one and takes
		// generation 1. Over the witnesses only n1's counts: n3 is the
		// holder, and its own node promised n5, so it takes generation 2;
		// n5 cannot have won, with no witness's promise.
		{"promises of nodes that are not witnesses count for nothing", []string{"n3:1:n5", "n5:1:n5", "n1:1:n3"}, "n3 2"},
		// Counted over all nodes n3 has three promises and generation 1;
		// but n1 and n2, two of the three witnesses, promised n5: n3 must
		// not get it. n5's own node promised n3, so n5 takes generation 2.
		{"a witness majority for one holder, the other nodes for another", []string{"n1:1:n5", "n2:1:n5", "n3:1:n3", "n4:1:n3", "n5:1:n3"}, "n5 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := witnessView(t, []string{"n1", "n2", "n3", "n4", "n5"}, nil)
			v.promises = promisesOf(tt.promises)
			n, gen, err := v.creationPlan("vol-1", []string{"n2", "n1"})
			if got := fmt.Sprintf("%s %d", n.Info.NodeID, gen); err != nil || got != tt.want {
				t.Errorf("plan %q (%v), want %q", got, err, tt.want)
			}
		})
	}
}

func TestClusterWitnessesMustAgree(t *testing.T) {
	node := func(id string, w ...string) cluster.Node {
		return cluster.Node{Info: agentclient.NodeInfo{NodeID: id, Witnesses: w}}
	}
	set, err := cluster.Witnesses([]cluster.Node{node("n1", testWitnesses...), node("n3", testWitnesses[2], testWitnesses[0], testWitnesses[1])})
	if want, _ := witnesses.Parse(testWitnesses); err != nil || set.Digest() != want.Digest() {
		t.Errorf("the same set in another order: %v, %v", set, err)
	}
	if set, err := cluster.Witnesses([]cluster.Node{node("n1"), node("n2")}); err != nil || !set.Empty() {
		t.Errorf("no witnesses anywhere: %v, %v", set, err)
	}
	if _, err := cluster.Witnesses([]cluster.Node{node("n1", testWitnesses...), node("n2")}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("a node without witnesses beside one with them: %v, want Unavailable", err)
	}
}

// TestReserveCountsTheWitnesses: a generation is reserved once a
// majority of the witnesses granted it. n1 and n2, two of the three,
// promised a newer one: the grants of n3, n4 and n5, three of five
// nodes, are not enough.
func TestReserveCountsTheWitnesses(t *testing.T) {
	for _, refusing := range [][]string{{"n1", "n2"}, {"n3", "n5"}} {
		t.Run("refused by "+strings.Join(refusing, ","), func(t *testing.T) {
			var fakes clustertest.Fakes
			for _, id := range []string{"n1", "n2", "n3", "n4", "n5"} {
				a := fakes.Add(agentclient.NodeInfo{NodeID: id, Witnesses: testWitnesses})
				if slices.Contains(refusing, id) {
					a.Promise(testVolume, 3, "n1")
				}
			}
			m := New(fakes.Cluster(t), hclog.NewNullLogger())
			v, err := m.gather(context.Background(), testVolume)
			if err != nil {
				t.Fatal(err)
			}
			next, err := m.reserve(context.Background(), testVolume, 2, "n4", v, grants{})
			// Refused by two witnesses, three nodes granted; refused by two
			// nodes that are not, every witness granted.
			wantGranted := refusing[0] == "n3"
			if granted := next == goOn; granted != wantGranted {
				t.Errorf("reserved: %v (%v), want %v", granted, err, wantGranted)
			}
		})
	}
}

// TestReservationsGoToTheWitnessesAndTheNodesInvolved: with witnesses
// n1, n2, n4 of seven nodes, the volume's primary on n3 and replicas on
// n5 and n6, a move to n5 reserves its generation with the witnesses, the
// source, the target and the other replica's node, and not with n7, which
// holds nothing of the volume; a failover after n3's loss asks every node
// that answered. Without witnesses every node is asked.
func TestReservationsGoToTheWitnessesAndTheNodesInvolved(t *testing.T) {
	tests := []struct {
		name      string
		witnesses []string
		lost      bool // n3, the primary's node, is down: the publish fails over
		want      []string
	}{
		{"a move, with witnesses", testWitnesses, false, []string{"n1", "n2", "n3", "n4", "n5", "n6"}},
		{"a move, without witnesses", nil, false, []string{"n1", "n2", "n3", "n4", "n5", "n6", "n7"}},
		{"a failover, with witnesses", testWitnesses, true, []string{"n1", "n2", "n4", "n5", "n6", "n7"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var fakes clustertest.Fakes
			agents := map[string]*clustertest.FakeAgent{}
			for _, id := range []string{"n1", "n2", "n3", "n4", "n5", "n6", "n7"} {
				agents[id] = fakes.Add(agentclient.NodeInfo{NodeID: id, Witnesses: tt.witnesses})
			}
			agents["n3"].PutCopy(agentclient.Copy{VolumeID: testVolume, Role: contract.RolePrimary, Generation: 1})
			now := time.Now().UnixNano() // both replicas as fresh: a failover promotes the target's
			for _, id := range []string{"n5", "n6"} {
				agents[id].PutCopy(agentclient.Copy{VolumeID: testVolume, Role: contract.RoleReplica, Generation: 1, LastSnapshotUnixNano: now,
					Parameters: map[string]string{contract.ParamFailover: contract.FailoverAuto}})
			}
			m := New(fakes.Cluster(t), hclog.NewNullLogger())
			m.CatchUpWait = 10 * time.Second
			t.Cleanup(m.Stop)
			if tt.lost {
				agents["n3"].SetDown(true)
			}
			if gen, err := m.Publish(context.Background(), testVolume, "n5"); err != nil || gen != 2 {
				t.Fatalf("Publish on n5: generation %d, %v; want 2", gen, err)
			}
			var asked []string
			for id, a := range agents {
				if len(a.Reservations()) > 0 {
					asked = append(asked, id)
				}
			}
			slices.Sort(asked)
			if !slices.Equal(asked, tt.want) {
				t.Errorf("reserved with %v, want %v", asked, tt.want)
			}
		})
	}
}

// TestASupersedeReachesThePromisesHolder: with witnesses n1, n2, n4, the
// primary on n3 is fenced for a move to n5 that was promised generation 2
// and never promoted; n5 is no witness and holds no copy. A publish on
// n3 lifts the fence only once n5's own record no longer promises n5
// generation 2, so the reservation that supersedes it must reach n5.
func TestASupersedeReachesThePromisesHolder(t *testing.T) {
	var fakes clustertest.Fakes
	agents := map[string]*clustertest.FakeAgent{}
	for _, id := range []string{"n1", "n2", "n3", "n4", "n5"} {
		agents[id] = fakes.Add(agentclient.NodeInfo{NodeID: id, Witnesses: testWitnesses})
		agents[id].Promise(testVolume, 2, "n5")
	}
	agents["n3"].PutCopy(agentclient.Copy{VolumeID: testVolume, Role: contract.RolePrimary, Generation: 1, MovingTo: "n5", FencedUnixNano: 1})
	m := New(fakes.Cluster(t), hclog.NewNullLogger())
	t.Cleanup(m.Stop)
	if gen, err := m.Publish(context.Background(), testVolume, "n3"); err != nil {
		t.Fatalf("Publish on n3: generation %d, %v; want the fence lifted", gen, err)
	}
	rs := agents["n5"].Reservations()
	if len(rs) == 0 || rs[len(rs)-1].HolderNodeID != "n3" {
		t.Errorf("n5 was asked to reserve %+v: want a generation for n3", rs)
	}
}
