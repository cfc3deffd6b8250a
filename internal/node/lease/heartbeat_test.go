package lease

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
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

func (f *fakeVolumes) Promised(_ context.Context, id string) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.promised[id], nil
}

// peerNet serves lease.Servers on in-memory listeners, by address.
type peerNet struct {
	t         *testing.T
	listeners map[string]*bufconn.Listener
	servers   map[string]*grpc.Server
}

func (n *peerNet) serve(addr, nodeID string, promised map[string]uint64) {
	lis := bufconn.Listen(1 << 16)
	srv := grpc.NewServer()
	pb.RegisterPeersServer(srv, &Server{NodeID: nodeID, Domain: "d", Promised: func(_ context.Context, id string) (uint64, error) { return promised[id], nil }})
	go srv.Serve(lis)
	n.t.Cleanup(srv.Stop)
	n.listeners[addr], n.servers[addr] = lis, srv
}

func (n *peerNet) dial(addr string) (*grpc.ClientConn, error) {
	return grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
			lis, ok := n.listeners[a]
			if !ok {
				return nil, net.ErrClosed
			}
			return lis.DialContext(ctx)
		}))
}

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
			net := &peerNet{t: t, listeners: map[string]*bufconn.Listener{}, servers: map[string]*grpc.Server{}}
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
			defer h.closeConns()
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
		want codes.Code
	}{{1, codes.OK}, {MaxPromiseIDs, codes.OK}, {MaxPromiseIDs + 1, codes.InvalidArgument}, {100 * MaxPromiseIDs, codes.InvalidArgument}} {
		_, err := srv.Promises(context.Background(), &pb.PromisesRequest{VolumeIds: ids(tt.n)})
		if status.Code(err) != tt.want {
			t.Errorf("Promises about %d volumes: %v, want %s", tt.n, err, tt.want)
		}
	}

	net := &peerNet{t: t, listeners: map[string]*bufconn.Listener{}, servers: map[string]*grpc.Server{}}
	net.serve("n2:7670", "n2", map[string]uint64{})
	net.serve("n3:7670", "n3", map[string]uint64{})
	primaries := map[string]uint64{}
	for _, id := range ids(2*MaxPromiseIDs + 1) {
		primaries[id] = 1
	}
	vols := &fakeVolumes{fenced: map[string]uint64{}, mounted: map[string]uint64{}, promised: map[string]uint64{},
		primaries: primaries, confirmed: map[string]uint64{}}
	h := n1Heartbeat(net, vols, 5*time.Second)
	defer h.closeConns()
	h.Beat(context.Background())
	if got, want := len(vols.confirmed), len(primaries); got != want {
		t.Errorf("%d primaries confirmed after the beat, want all %d", got, want)
	}
}

// n1Heartbeat is node n1's heartbeat with peers n2 and n3 on net.
func n1Heartbeat(net *peerNet, vols *fakeVolumes, interval time.Duration) *Heartbeat {
	return &Heartbeat{
		Monitor:  NewMonitor(time.Minute, time.Now),
		NodeID:   "n1",
		Interval: interval,
		Peers:    func() ([]string, error) { return []string{"n2:7670", "n3:7670"}, nil },
		Dial:     net.dial,
		Volumes:  vols,
		Log:      hclog.NewNullLogger(),
	}
}
