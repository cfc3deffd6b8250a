package lease

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

func TestRetire(t *testing.T) {
	const need = testLease + testMargin
	tests := []struct {
		name    string
		peers   bool
		retire  string
		answer  time.Duration // n4 last answered this long ago; 0: never
		call    time.Duration // n4 last called this long ago; 0: never
		started time.Duration // the monitor started this long ago
		wantErr error
		wantMsg string
		// kept: the count keeps n4's address, which never answered: it
		// may be any node, so it counts as one until this node restarts.
		kept bool
	}{
		{name: "itself", peers: true, retire: "n1", started: time.Hour, wantErr: errdefs.ErrInvalidArgument},
		{name: "no name", peers: true, retire: "", started: time.Hour, wantErr: errdefs.ErrInvalidArgument},
		{name: "no peers", peers: false, retire: "n4", started: time.Hour, wantErr: errdefs.ErrFailedPrecondition, wantMsg: "knows no peers"},
		{name: "answered lately", peers: true, retire: "n4", answer: 5 * time.Second, started: time.Hour, wantErr: errdefs.ErrFailedPrecondition, wantMsg: "(7s more)"},
		{name: "called lately", peers: true, retire: "n4", answer: time.Minute, call: 5 * time.Second, started: time.Hour, wantErr: errdefs.ErrFailedPrecondition, wantMsg: "heard from n4 5s ago"},
		{name: "never heard, this node just started", peers: true, retire: "n4", started: 5 * time.Second, wantErr: errdefs.ErrFailedPrecondition},
		{name: "silent for the lease and its margin", peers: true, retire: "n4", answer: need, call: need, started: time.Hour},
		{name: "never heard since a start long ago", peers: true, retire: "n4", started: time.Hour, kept: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &clock{t: time.Unix(1000, 0)}
			m := NewMonitor(testLease, c.now)
			c.t = c.t.Add(tt.started)
			if tt.peers {
				m.RequirePeers()
				m.SetPeers([]string{"a1", "a2", "a3", "a4"})
				for i, id := range []string{"n1", "n2", "n3"} {
					m.Answered("a"+string(rune('1'+i)), id)
				}
				if tt.answer > 0 {
					c.t = c.t.Add(-tt.answer)
					m.Answered("a4", "n4")
					c.t = c.t.Add(tt.answer)
				}
				if tt.call > 0 {
					c.t = c.t.Add(-tt.call)
					m.Called("n4")
					c.t = c.t.Add(tt.call)
				}
			}
			before := m.Members("n1")
			err := m.Retire("n1", tt.retire, need)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.wantMsg) {
					t.Fatalf("Retire = %v, want %v saying %q", err, tt.wantErr, tt.wantMsg)
				}
				if m.Retired(tt.retire) || m.Members("n1") != before {
					t.Errorf("a refused retirement changed the count: %d nodes, was %d", m.Members("n1"), before)
				}
				return
			}
			if err != nil {
				t.Fatalf("Retire: %v", err)
			}
			want := before - 1
			if tt.kept {
				want = before
			}
			if got := m.Members("n1"); got != want {
				t.Errorf("after retiring n4 the lease counts %d nodes, want %d", got, want)
			}
			if err := m.Retire("n1", tt.retire, need); err != nil {
				t.Errorf("retiring it again: %v, want nil", err)
			}
		})
	}
}

// TestARetiredNodeCountsForNothing: once retired, a node's answers do not
// count for the lease nor are its promises asked, and its own pings and
// questions are refused, so it cannot count this node for its lease.
func TestARetiredNodeCountsForNothing(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	m := NewMonitor(testLease, c.now)
	m.RequirePeers()
	m.SetPeers([]string{"a1", "a2", "a3", "a4"})
	m.Answered("a1", "n1")
	m.Answered("a4", "n4")
	c.t = c.t.Add(time.Hour)
	m.Answered("a1", "n1")
	m.Answered("a2", "n2")
	if m.Held("n1") {
		t.Fatal("two of four nodes heard, and the lease is held")
	}
	if err := m.Retire("n1", "n4", testLease+testMargin); err != nil {
		t.Fatal(err)
	}
	if !m.Held("n1") {
		t.Error("two of the three nodes left heard, and the lease is not held")
	}
	if err := m.Retire("n1", "n3", 0); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "one node per start") {
		t.Errorf("retiring a second node before a restart: %v, want FailedPrecondition (one node per start)", err)
	}
	m.Answered("a4", "n4") // it came back, answering at its old address
	m.Answered("a3", "n3")
	if got := m.Members("n1"); got != 3 {
		t.Errorf("a retired node's answer counted it again: %d nodes, want 3", got)
	}
	if got := m.others("n1"); !slices.Equal(got, []string{"a2", "a3"}) {
		t.Errorf("the peers asked to confirm are %v, want [a2 a3]", got)
	}
	if silent := m.Silent("n1"); len(silent) != 0 {
		t.Errorf("a retired node is listed among the silent: %v", silent)
	}
	s := &Server{NodeID: "n1", Domain: "d", Monitor: m, Promised: func(context.Context, string) (uint64, error) { return 0, nil }}
	if _, _, err := s.Ping("n4", ""); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("the retired node's ping: %v, want PermissionDenied", err)
	}
	if _, err := s.Promises(context.Background(), "n4", []string{"v"}); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("the retired node's question: %v, want PermissionDenied", err)
	}
	if _, _, err := s.Ping("n2", ""); err != nil {
		t.Errorf("another node's ping: %v", err)
	}
}

// TestRetiringKeepsLeaseAndFailoverApart drives five nodes through random
// partitions while n1, n2 and n3 try to retire n5 and, once all three
// did, n4: each node retires when Retire lets it (a peer silent for
// L+M, one node per start, so never n4). The
// retired nodes keep running, as if the operator stopped nothing: the
// worst case. At every beat, no node holds its lease while a majority of
// the nodes the controller counts attests it silent for L+M (docs/
// safety.md, "Retiring a node"). The controller lists either every node
// or those not retired everywhere, and counts the largest of its list
// and every listed node's Members, as cluster.Members does.
func TestRetiringKeepsLeaseAndFailoverApart(t *testing.T) {
	ids := []string{"n1", "n2", "n3", "n4", "n5"}
	const need = testLease + testMargin
	for seed := range uint64(100) {
		rng := rand.New(rand.NewPCG(seed, 7))
		c := &clock{t: time.Unix(1000, 0)}
		monitors := map[string]*Monitor{}
		servers := map[string]*Server{}
		for _, id := range ids {
			m := NewMonitor(testLease, c.now)
			m.RequirePeers()
			m.SetPeers(ids) // a node's address is its ID
			monitors[id] = m
			servers[id] = &Server{NodeID: id, Monitor: m}
		}
		up := map[[2]string]bool{}
		links := func() {
			isolated, p := "", 0.5+0.5*rng.Float64()
			if rng.IntN(3) == 0 {
				isolated = ids[rng.IntN(len(ids))]
			}
			for _, a := range ids {
				for _, b := range ids {
					up[[2]string{a, b}] = a == b || (a != isolated && b != isolated && rng.Float64() < p)
				}
			}
		}
		beat := func() {
			c.t = c.t.Add(testLease / 4)
			for _, a := range ids {
				for _, b := range ids {
					if up[[2]string{a, b}] {
						if _, _, err := servers[b].Ping(a, ""); err == nil {
							monitors[a].Answered(b, b)
						}
					}
				}
			}
		}
		retiredByAll := func(x string) bool {
			for _, id := range ids[:3] {
				if !monitors[id].Retired(x) {
					return false
				}
			}
			return true
		}
		check := func(round int) {
			listed := ids
			if rng.IntN(2) == 0 {
				listed = slices.DeleteFunc(slices.Clone(ids), retiredByAll)
			}
			members := len(listed)
			for _, id := range listed {
				members = max(members, monitors[id].Members(id))
			}
			for _, x := range ids {
				if !monitors[x].Held(x) {
					continue
				}
				var attesting []string
				for _, y := range listed {
					if y != x && monitors[y].Attest([]string{x}, need) == nil {
						attesting = append(attesting, y)
					}
				}
				if len(attesting) > members/2 {
					t.Fatalf("seed %d, round %d: %s holds its lease while %v, a majority of the %d nodes counted, attest it silent (n5 retired by all: %v, n4 by n1..n3: %v %v %v)",
						seed, round, x, attesting, members, retiredByAll("n5"), monitors["n1"].Retired("n4"), monitors["n2"].Retired("n4"), monitors["n3"].Retired("n4"))
				}
			}
		}
		for round := range 80 {
			links()
			for range 1 + rng.IntN(8) {
				beat()
				check(round)
			}
			target := "n5"
			if retiredByAll("n5") {
				target = "n4"
			}
			for _, id := range ids[:3] {
				if rng.IntN(3) == 0 {
					_ = monitors[id].Retire(id, target, need) // refused while heard: fine
				}
			}
		}
	}
}
