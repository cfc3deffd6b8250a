package lease

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// fakeVolumes records what the heartbeat does to the node's primaries.
type fakeVolumes struct {
	mu       sync.Mutex
	fenced   map[string]uint64 // fenced by the lease: id -> generation
	mounted  map[string]uint64
	promised map[string]uint64
	lifted   []string
	// primaries are every primary, by ID, with its generation; confirmed
	// those confirmed current.
	primaries map[string]uint64
	confirmed map[string]uint64
	// superseded: fenced because a newer generation was promised
	// elsewhere, id -> that generation.
	superseded map[string]uint64
}

func (f *fakeVolumes) Unconfirmed(context.Context) (map[string]uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]uint64{}
	for id, g := range f.primaries {
		if f.confirmed[id] != g {
			out[id] = g
		}
	}
	return out, nil
}

func (f *fakeVolumes) Confirm(id string, generation uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.confirmed[id] = generation
}

func (f *fakeVolumes) ForgetConfirmations() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.confirmed = map[string]uint64{}
}

func (f *fakeVolumes) SelfFence(context.Context) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ids []string
	for id, g := range f.mounted {
		if _, ok := f.fenced[id]; !ok {
			f.fenced[id] = g
			ids = append(ids, id)
		}
	}
	return ids, nil
}

func (f *fakeVolumes) LeaseFenced(context.Context) (map[string]uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]uint64{}
	for id, g := range f.fenced {
		out[id] = g
	}
	return out, nil
}

func (f *fakeVolumes) LiftLeaseFence(_ context.Context, id string, _ uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.fenced, id)
	f.lifted = append(f.lifted, id)
	return nil
}

func (f *fakeVolumes) FenceSuperseded(_ context.Context, id string, generation, newer uint64) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.superseded[id] >= newer {
		return false, nil
	}
	f.superseded[id] = newer
	f.fenced[id] = generation
	return true, nil
}

func (f *fakeVolumes) EndForced(context.Context) ([]string, error) { return nil, nil }

func (f *fakeVolumes) Promised(_ context.Context, id string) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.promised[id], nil
}

// memNet holds the nodes' lease servers in memory, by address, and
// delivers the heartbeats' calls to them as the gRPC adapter
// (agent.PeerClient, agent.PeersServer) does: the caller named, a node
// held to the answers it gives. Calls the ways that are cut fail at once.
type memNet struct {
	mu      sync.Mutex
	servers map[string]*Server // by address
	cut     map[[2]string]bool // from node, to address: calls that way fail
	liars   map[string]string  // address -> the node its certificate names, when not the one it answers as
	digests map[string]string  // node -> the digest of its witness set, when it has one
}

func newMemNet() *memNet {
	return &memNet{servers: map[string]*Server{}, cut: map[[2]string]bool{}, liars: map[string]string{}, digests: map[string]string{}}
}

// serve puts a lease server for node nodeID, with its promises, at addr.
func (n *memNet) serve(addr, nodeID string, promised map[string]uint64) {
	n.serveWith(addr, &Server{NodeID: nodeID, Domain: "d", Promised: func(_ context.Context, id string) (uint64, error) { return promised[id], nil }})
}

func (n *memNet) serveWith(addr string, s *Server) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.servers[addr] = s
}

// client is node from's client.
func (n *memNet) client(from string) PeerClient { return memClient{n: n, from: from} }

// reach returns the server at addr, if from's calls get there.
func (n *memNet) reach(from, addr string) (*Server, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	s, ok := n.servers[addr]
	if !ok || n.cut[[2]string{from, addr}] {
		return nil, errors.New("connection refused")
	}
	return s, nil
}

type memClient struct {
	n    *memNet
	from string
}

func (c memClient) Ping(_ context.Context, addr string) (string, error) {
	s, err := c.n.reach(c.from, addr)
	if err != nil {
		return "", err
	}
	nodeID, _, err := s.Ping(c.from, c.n.digests[c.from])
	if err != nil {
		return "", err
	}
	c.n.mu.Lock()
	cert, lies := c.n.liars[addr]
	c.n.mu.Unlock()
	if lies && cert != nodeID {
		return "", fmt.Errorf("%w: the certificate names %s, the answer %s", errdefs.ErrPermissionDenied, cert, nodeID)
	}
	return nodeID, nil
}

func (c memClient) Promises(ctx context.Context, addr, nodeID string, ids []string) (map[string]uint64, error) {
	s, err := c.n.reach(c.from, addr)
	if err != nil {
		return nil, err
	}
	if s.NodeID != nodeID {
		return nil, fmt.Errorf("%w: %s answered, not %s", errdefs.ErrPermissionDenied, s.NodeID, nodeID)
	}
	return s.Promises(ctx, c.from, ids)
}

func (memClient) Close() {}

func TestHeartbeatFencesLiftsAndConfirms(t *testing.T) {
	const (
		id        = "vol-0123456789abcdef0123" // fenced by the lease
		other     = "vol-ffffffffffffffffffff" // mounted
		unmounted = "vol-eeeeeeeeeeeeeeeeeeee" // confirmed by an earlier beat
	)
	tests := []struct {
		name       string
		up         []string          // peers that answer, of n2 and n3
		promisedN3 uint64            // n3's promise of the volume
		wantHeld   bool              // after one beat
		wantFenced map[string]uint64 // after the beat and the lift
		// The primaries confirmed current after the beat: before it, only
		// vol-eee... was (from an earlier beat).
		wantConfirmed []string
	}{
		{"a majority answers and promised nothing newer", []string{"n2", "n3"}, 0, true, map[string]uint64{}, []string{id, other, unmounted}},
		{"one peer of two answers", []string{"n2"}, 0, true, map[string]uint64{}, []string{id, other, unmounted}},
		{"a peer promised a newer generation", []string{"n2", "n3"}, 3, true, map[string]uint64{id: 2}, []string{other, unmounted}},
		{"no peer answers: every confirmation is forgotten", nil, 0, false, map[string]uint64{id: 2, other: 1}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			net := newMemNet()
			for _, p := range tt.up {
				promised := map[string]uint64{}
				if p == "n3" {
					promised[id] = tt.promisedN3
				}
				net.serve(p+":7670", p, promised)
			}
			vols := &fakeVolumes{fenced: map[string]uint64{id: 2}, mounted: map[string]uint64{other: 1}, promised: map[string]uint64{},
				primaries: map[string]uint64{id: 2, other: 1, unmounted: 1}, confirmed: map[string]uint64{unmounted: 1},
				superseded: map[string]uint64{}}
			h := n1Heartbeat(net, vols, 2*time.Second)
			h.Beat(context.Background())
			held := !h.lost
			if held != tt.wantHeld {
				t.Fatalf("held = %v, want %v", held, tt.wantHeld)
			}
			got, _ := vols.LeaseFenced(context.Background())
			if len(got) != len(tt.wantFenced) {
				t.Fatalf("fenced after the beat: %v, want %v", got, tt.wantFenced)
			}
			for k, v := range tt.wantFenced {
				if got[k] != v {
					t.Errorf("fenced after the beat: %v, want %v", got, tt.wantFenced)
				}
			}
			var confirmed []string
			for k := range vols.confirmed {
				confirmed = append(confirmed, k)
			}
			slices.Sort(confirmed)
			want := slices.Sorted(slices.Values(tt.wantConfirmed))
			if !slices.Equal(confirmed, want) {
				t.Errorf("confirmed after the beat: %v, want %v", confirmed, want)
			}
		})
	}
}

// TestPromisesRequestsAreBounded: a Promises request about more than
// MaxPromiseIDs volumes is refused (a peer must not make one call read
// the pool without bound), and the heartbeat asks in chunks, so a node
// with more unconfirmed primaries than that still confirms them all.
func TestPromisesRequestsAreBounded(t *testing.T) {
	ids := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("vol-%020d", i)
		}
		return out
	}
	srv := &Server{NodeID: "n2", Domain: "d", Promised: func(context.Context, string) (uint64, error) { return 0, nil }}
	for _, tt := range []struct {
		n    int
		want error
	}{{1, nil}, {MaxPromiseIDs, nil}, {MaxPromiseIDs + 1, errdefs.ErrInvalidArgument}, {100 * MaxPromiseIDs, errdefs.ErrInvalidArgument}} {
		_, err := srv.Promises(context.Background(), "n1", ids(tt.n))
		if !errors.Is(err, tt.want) {
			t.Errorf("Promises about %d volumes: %v, want %v", tt.n, err, tt.want)
		}
	}

	net := newMemNet()
	net.serve("n2:7670", "n2", map[string]uint64{})
	net.serve("n3:7670", "n3", map[string]uint64{})
	primaries := map[string]uint64{}
	for _, id := range ids(2*MaxPromiseIDs + 1) {
		primaries[id] = 1
	}
	vols := &fakeVolumes{fenced: map[string]uint64{}, mounted: map[string]uint64{}, promised: map[string]uint64{},
		primaries: primaries, confirmed: map[string]uint64{}}
	h := n1Heartbeat(net, vols, 5*time.Second)
	h.Beat(context.Background())
	if got, want := len(vols.confirmed), len(primaries); got != want {
		t.Errorf("%d primaries confirmed after the beat, want all %d", got, want)
	}
}

// n1Heartbeat is node n1's heartbeat with peers n2 and n3 on net.
func n1Heartbeat(net *memNet, vols *fakeVolumes, interval time.Duration) *Heartbeat {
	return &Heartbeat{
		Monitor:  NewMonitor(time.Minute, time.Now),
		NodeID:   "n1",
		Interval: interval,
		Peers:    func() ([]string, error) { return []string{"n2:7670", "n3:7670"}, nil },
		Client:   net.client("n1"),
		Volumes:  vols,
		Log:      hclog.NewNullLogger(),
	}
}

// TestHeartbeatLogsTheFirstHold: a process's log says when it first
// holds its lease, whether its first beat found it held or lost (the
// peers not reached yet), and every loss and regain after that.
func TestHeartbeatLogsTheFirstHold(t *testing.T) {
	tests := []struct {
		name     string
		upBefore bool // the peers answer the first beat
		want     []string
	}{
		{"held at the first beat", true, []string{"lease held: "}},
		{"lost at the first beat, held at the second", false, []string{"lease lost: ", "lease held again: "}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			net := newMemNet()
			up := func() {
				for _, p := range []string{"n2", "n3"} {
					net.serve(p+":7670", p, map[string]uint64{})
				}
			}
			if tt.upBefore {
				up()
			}
			vols := &fakeVolumes{fenced: map[string]uint64{}, mounted: map[string]uint64{}, promised: map[string]uint64{},
				primaries: map[string]uint64{}, confirmed: map[string]uint64{}, superseded: map[string]uint64{}}
			var out strings.Builder
			h := n1Heartbeat(net, vols, time.Second)
			h.Log = hclog.New(&hclog.LoggerOptions{Output: &out})
			h.Beat(context.Background())
			if !tt.upBefore {
				up()
			}
			h.Beat(context.Background())
			var got []string
			for _, line := range strings.Split(out.String(), "\n") {
				if _, msg, ok := strings.Cut(line, "lease "); ok && (strings.HasPrefix(msg, "held") || strings.HasPrefix(msg, "lost")) {
					got = append(got, "lease "+msg[:strings.Index(msg, ":")+2])
				}
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("the lease lines logged: %q, want %q\n%s", got, tt.want, out.String())
			}
		})
	}
}

// TestANodeUnderTwoAddressesVouchesOnce: four nodes, n1 lists n2 by name
// and by IP, and only n2 answers. n1 and n2 are two of four: n1 holds no
// lease and confirms nothing, however many of n2's addresses answer.
// Counting addresses, n1 heard three of five and confirmed its primary
// while n3 and n4, with the controller, could make the other majority.
func TestANodeUnderTwoAddressesVouchesOnce(t *testing.T) {
	const id = "vol-0123456789abcdef0123"
	net := newMemNet()
	n2 := &Server{NodeID: "n2", Domain: "d", Promised: func(context.Context, string) (uint64, error) { return 0, nil }}
	net.serveWith("n2.example:7670", n2)
	net.serveWith("10.0.0.2:7670", n2)
	vols := &fakeVolumes{fenced: map[string]uint64{}, mounted: map[string]uint64{id: 1}, promised: map[string]uint64{},
		primaries: map[string]uint64{id: 1}, confirmed: map[string]uint64{}, superseded: map[string]uint64{}}
	h := n1Heartbeat(net, vols, 2*time.Second)
	h.Peers = func() ([]string, error) {
		return []string{"n2.example:7670", "10.0.0.2:7670", "n3:7670", "n4:7670"}, nil
	}
	h.Beat(context.Background())
	if !h.lost {
		t.Error("n1 holds its lease with only n2 answering, at two addresses, of four nodes")
	}
	if len(vols.confirmed) != 0 {
		t.Errorf("confirmed %v with only n2 answering of four nodes; want nothing confirmed", vols.confirmed)
	}
}
