package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
)

// The invariant these tests check (docs/safety.md, "Why the lease and
// failover majorities intersect"): while a node holds its lease, no
// majority of all the nodes attests it silent for L+M, so no failover
// away from it is granted.

const (
	testLease  = 8 * time.Second
	testMargin = 4 * time.Second
)

// failoverGranted reports whether a majority of the n nodes attest addr
// silent for L+M, and which do.
func failoverGranted(monitors map[string]*Monitor, addr string, n int) (bool, []string) {
	var attesting []string
	for id, m := range monitors {
		if m.Attest([]string{addr}, testLease+testMargin) == nil {
			attesting = append(attesting, id)
		}
	}
	return len(attesting) > n/2, attesting
}

// TestDomainCutLeaseAndFailoverIntersect: domains X={a,b,c} and Y={d,e};
// the cut {a,b} | {c,d,e}. Counting only its domain, a would keep its
// lease through b (two of three) while c, d and e, a majority of the
// five, attest it silent: two writers. Counting every node, a holds no
// lease (two of five) by the time they do.
func TestDomainCutLeaseAndFailoverIntersect(t *testing.T) {
	nodes := []string{"a", "b", "c", "d", "e"}
	side := map[string]int{"a": 0, "b": 0, "c": 1, "d": 1, "e": 1}
	c := &clock{t: time.Unix(1000, 0)}
	monitors := map[string]*Monitor{}
	for _, id := range nodes {
		m := NewMonitor(testLease, c.now)
		m.RequirePeers()
		for _, peer := range nodes {
			if peer != id {
				m.SetPeers([]string{peer})
			}
		}
		monitors[id] = m
	}
	// Every beat each node pings every other it reaches: the pinged one
	// records the call, the pinger the answer.
	beat := func(cut bool) {
		for _, from := range nodes {
			for _, to := range nodes {
				if from == to || (cut && side[from] != side[to]) {
					continue
				}
				monitors[to].Called(from)
				monitors[from].Answered(to, to)
			}
		}
	}
	for range 8 { // long enough that nobody counts from its own start
		beat(false)
		c.t = c.t.Add(testLease / 4)
	}
	beat(false)
	for elapsed := time.Duration(0); elapsed <= testLease+testMargin; elapsed += testLease / 4 {
		c.t = c.t.Add(testLease / 4)
		beat(true)
		held := monitors["a"].Held("a")
		granted, attesting := failoverGranted(monitors, "a", len(nodes))
		if held && granted {
			t.Fatalf("%s after the cut: a holds its lease (it hears b) while %v, a majority of the %d nodes, attest it silent: a failover is granted while a may write",
				elapsed+testLease/4, attesting, len(nodes))
		}
	}
	if granted, attesting := failoverGranted(monitors, "a", len(nodes)); !granted {
		t.Errorf("after L+M only %v attest a silent: the majority side should fail it over", attesting)
	}
}

// TestOneWayReachability: a can dial b, b cannot dial a, c reaches
// neither way. a's pings to b are answered, so a keeps its lease (two of
// three); b, whose pings to a fail, must not attest a silent, since with
// c that would be a majority. b counts a's calls as hearing it and
// attests nothing.
func TestOneWayReachability(t *testing.T) {
	for _, knownBefore := range []bool{true, false} {
		t.Run(fmt.Sprintf("b heard a's answers before the cut: %v", knownBefore), func(t *testing.T) {
			nodes := []string{"a", "b", "c"}
			c := &clock{t: time.Unix(1000, 0)}
			net := newMemNet()
			monitors := map[string]*Monitor{}
			beats := map[string]*Heartbeat{}
			for _, id := range nodes {
				m := NewMonitor(testLease, c.now)
				m.RequirePeers()
				monitors[id] = m
				net.serveWith(id, &Server{NodeID: id, Domain: "d", Monitor: m,
					Promised: func(context.Context, string) (uint64, error) { return 0, nil }})
				beats[id] = &Heartbeat{Monitor: m, NodeID: id, Interval: testLease / 4,
					Peers: func() ([]string, error) { return nodes, nil }, Client: net.client(id),
					Volumes: emptyVolumes(), Log: hclog.NewNullLogger()}
			}
			if !knownBefore {
				net.cut[[2]string{"b", "a"}] = true
			}
			round := func() {
				for _, id := range nodes {
					beats[id].Beat(context.Background())
				}
				c.t = c.t.Add(testLease / 4)
			}
			for range 12 { // L+M from everyone's start
				round()
			}
			net.mu.Lock()
			net.cut[[2]string{"b", "a"}] = true
			for _, other := range []string{"a", "b"} {
				net.cut[[2]string{"c", other}], net.cut[[2]string{other, "c"}] = true, true
			}
			net.mu.Unlock()
			for elapsed := time.Duration(0); elapsed <= 2*(testLease+testMargin); elapsed += testLease / 4 {
				round()
				held := monitors["a"].Held("a")
				granted, attesting := failoverGranted(monitors, "a", len(nodes))
				if held && granted {
					t.Fatalf("%s after the cut: a holds its lease (b answers its pings) while %v attest it silent: a failover is granted while a may write",
						elapsed, attesting)
				}
			}
			if !monitors["a"].Held("a") {
				t.Error("a's pings to b are answered, yet a lost its lease")
			}
			if err := monitors["b"].Attest([]string{"a"}, testLease+testMargin); err == nil {
				t.Error("b attests a silent though a calls it every beat")
			}
		})
	}
}

func emptyVolumes() *fakeVolumes {
	return &fakeVolumes{fenced: map[string]uint64{}, mounted: map[string]uint64{"vol-0123456789abcdef0123": 1}, promised: map[string]uint64{},
		primaries: map[string]uint64{}, confirmed: map[string]uint64{}}
}

// fencingVolumes records when the self-fence began, on the test's clock.
type fencingVolumes struct {
	*fakeVolumes
	now   func() time.Time
	began time.Time
}

func (f *fencingVolumes) SelfFence(ctx context.Context) ([]string, error) {
	if f.began.IsZero() {
		f.began = f.now()
	}
	return f.fakeVolumes.SelfFence(ctx)
}

// TestMarginCoversTheSelfFence, on a fake clock: x records a's ping when
// it arrives (x's last word of a); a counts x's answer up to a ping
// timeout (L/4) later; then the link is cut and a's pings time out at
// every beat. At the moment x first attests a silent for L+M, a must have
// fenced its primaries: it began at least config.FenceAllowance before.
// With a margin of L/4 it has not; with config.MinLeaseMargin it has.
func TestMarginCoversTheSelfFence(t *testing.T) {
	const lease = 8 * time.Second
	interval := lease / 4
	tests := []struct {
		name     string
		margin   time.Duration
		answered time.Duration // after x recorded the ping, a counts its answer
		wantSafe bool
	}{
		{"old minimum, answer at once", lease / 4, 0, false},
		{"old minimum, answer at the ping's timeout", lease / 4, interval, false},
		{"config minimum, answer at once", config.MinLeaseMargin(lease), 0, true},
		{"config minimum, answer half a ping later", config.MinLeaseMargin(lease), interval / 2, true},
		{"config minimum, answer at the ping's timeout", config.MinLeaseMargin(lease), interval, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &clock{t: time.Unix(1000, 0)}
			a, x := NewMonitor(lease, c.now), NewMonitor(lease, c.now)
			a.SetPeers([]string{"x", "y"})
			x.SetPeers([]string{"a", "y"})
			c.t = c.t.Add(time.Hour) // both long started
			// a's last beat that reached x and y starts now: x records it
			// at once, a counts the answers up to a timeout later.
			sent := c.t
			x.Called("a")
			c.t = sent.Add(tt.answered)
			a.Answered("x", "x")
			a.Answered("y", "y")
			// The cut. Every later beat's pings time out: the beat's
			// pings end an interval after it began.
			vols := &fencingVolumes{fakeVolumes: emptyVolumes(), now: c.now}
			h := &Heartbeat{Monitor: a, NodeID: "a", Interval: interval, Volumes: vols, Log: hclog.NewNullLogger(),
				Peers: func() ([]string, error) { return nil, nil }}
			beganBeat := sent
			h.Client = &timingOut{wait: func() {
				if end := beganBeat.Add(interval); c.t.Before(end) {
					c.t = end
				}
			}}
			for vols.began.IsZero() && c.t.Sub(sent) < 10*lease {
				beganBeat = beganBeat.Add(interval)
				c.t = beganBeat
				h.Beat(context.Background())
			}
			if vols.began.IsZero() {
				t.Fatal("a never fenced itself")
			}
			// x attests a silent from sent+L+M on; a is read-only from
			// began+FenceAllowance on.
			fenced := vols.began.Add(config.FenceAllowance)
			c.t = fenced.Add(-time.Millisecond)
			err := x.Attest([]string{"a"}, lease+tt.margin)
			safe := err != nil
			if safe != tt.wantSafe {
				t.Errorf("margin %s: a began fencing %s after x last heard it, read-only %s after; x attests it silent %s after: safe %v, want %v",
					tt.margin, vols.began.Sub(sent), fenced.Sub(sent), lease+tt.margin, safe, tt.wantSafe)
			}
		})
	}
}

// timingOut is a client whose every call times out: wait moves the
// test's clock to the timeout, one call at a time.
type timingOut struct {
	mu   sync.Mutex
	wait func()
}

func (t *timingOut) Ping(context.Context, string) (string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.wait()
	return "", errors.New("timed out")
}

func (t *timingOut) Promises(context.Context, string, string, []string) (map[string]uint64, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.wait()
	return nil, errors.New("timed out")
}

func (*timingOut) Close() {}
