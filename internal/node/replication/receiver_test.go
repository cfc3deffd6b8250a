package replication

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copylock"
	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// replicaStore is the part of Pool a receive uses, over one replica
// in memory.
type replicaStore struct {
	Pool
	mu         sync.Mutex
	exists     bool
	generation uint64
	received   int
	token      string        // receive_resume_token; "" for none
	calls      []string      // AbortReceive and Receive, in order
	finishing  time.Duration // zfs receive's work after the stream's end
	started    atomic.Int32  // zfs receives started, fed or not
	promised   string        // the node's promise record of the volume; "" for none
	children   []zfs.Child   // what a listing of the root finds
	refuse     error         // zfs receive's error at the first record; nil: none
}

func (s *replicaStore) ChildProperties(context.Context, string, ...string) ([]zfs.Child, error) {
	return s.children, nil
}

func (s *replicaStore) AbortReceive(context.Context, string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, "abort")
	s.token = ""
	return nil
}

func (s *replicaStore) Properties(_ context.Context, _ string, props ...string) (map[string]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.exists {
		return nil, zfs.ErrNotFound
	}
	out := map[string]string{}
	for _, p := range props {
		switch p {
		case copyrecord.PropRole:
			out[p] = RoleReplica
		case copyrecord.PropGeneration:
			out[p] = strconv.FormatUint(s.generation, 10)
		case "receive_resume_token":
			out[p] = cmp.Or(s.token, "-")
		default:
			out[p] = "-"
		}
	}
	return out, nil
}

func (s *replicaStore) Receive(ctx context.Context, _ string, _ map[string]string, r io.Reader) error {
	s.started.Add(1)
	if s.refuse != nil {
		return s.refuse
	}
	done := make(chan error, 1)
	go func() {
		n, err := io.Copy(io.Discard, r)
		if err == nil && n == 0 {
			err = errors.New("cannot receive: failed to read from stream") // and changes nothing
		}
		time.Sleep(s.finishing)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			return err
		}
		s.mu.Lock()
		s.exists, s.received = true, s.received+1
		s.calls = append(s.calls, "receive")
		s.mu.Unlock()
		return err
	case <-ctx.Done():
		return ctx.Err() // zfs receive is killed
	}
}

func (s *replicaStore) Property(_ context.Context, name, prop string) (string, error) {
	if strings.HasSuffix(name, incomingSuffix) {
		return "", zfs.ErrNotFound
	}
	if prop == copyrecord.PropRole {
		return contract.RolePrimary, nil // keeps the tidy away
	}
	if strings.HasPrefix(prop, copyrecord.PropPromisePrefix) {
		if s.promised == "" {
			return "", zfs.ErrNotFound // no shard yet
		}
		return s.promised, nil
	}
	return "42", nil // the guid
}

func (s *replicaStore) SetProperties(context.Context, string, map[string]string) error { return nil }

// Snapshots lists the base of plainStream's incremental alone.
func (s *replicaStore) Snapshots(_ context.Context, fs string) ([]zfs.Snap, error) {
	return []zfs.Snap{{Name: fs + "@zn-1", GUID: 41}}, nil
}

// message is one message of a test stream: a header or a chunk of data.
type message struct {
	header *Header
	data   []byte
}

// fakeStream is an incoming stream fed by a channel.
type fakeStream struct {
	ctx  context.Context
	msgs chan message
	fail error  // returned once msgs are sent, instead of io.EOF
	rest []byte // of the last chunk, not read yet
}

func (f *fakeStream) next() (message, error) {
	select {
	case m, ok := <-f.msgs:
		if !ok && f.fail != nil {
			return message{}, f.fail
		}
		if !ok {
			return message{}, io.EOF
		}
		return m, nil
	case <-f.ctx.Done():
		return message{}, f.ctx.Err()
	}
}

func (f *fakeStream) Header() (Header, error) {
	m, err := f.next()
	if err != nil {
		return Header{}, err
	}
	if m.header == nil {
		return Header{}, errdefs.Wrap(errdefs.ErrInvalidArgument, "a receive stream starts with a header")
	}
	return *m.header, nil
}

func (f *fakeStream) Read(p []byte) (int, error) {
	for len(f.rest) == 0 {
		m, err := f.next()
		if err != nil {
			return 0, err
		}
		f.rest = m.data
	}
	n := copy(p, f.rest)
	f.rest = f.rest[n:]
	return n, nil
}

// receiveFrom has r receive s from a sender without a certificate.
func receiveFrom(r *Receiver, s *fakeStream) (Received, error) {
	return r.Receive(s.ctx, "", s)
}

const testVolume = "vol-0123456789abcdef0123"

func header(kind string, generation uint64) message {
	return message{header: &Header{VolumeID: testVolume, Kind: kind, Snapshot: "zn-2", Generation: generation, SourceNodeID: "n1"}}
}

// plainStream is a data message holding the first record of a plain
// stream of the kind (full: without a base) and some bytes of the rest.
func plainStream(kind string) message {
	from := uint64(41)
	if kind == KindFull {
		from = 0
	}
	return dataMsg(append(testBegin(from, 42, "tank/nomad/"+testVolume+"@zn-2"), "records"...))
}

// stream returns a stream that sends msgs and then ends, or stays open
// (sending nothing more) when open is set.
func stream(t *testing.T, open bool, msgs ...message) *fakeStream {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ch := make(chan message, len(msgs))
	for _, m := range msgs {
		ch <- m
	}
	if !open {
		close(ch)
	}
	return &fakeStream{ctx: ctx, msgs: ch}
}

func TestReceiveChecksTheGeneration(t *testing.T) {
	tests := []struct {
		name string
		kind string
		gen  uint64
		want codes.Code
	}{
		{"an incremental of the replica's generation", KindIncremental, 5, codes.OK},
		{"an incremental of a newer generation", KindIncremental, 6, codes.OK},
		{"an incremental that would lower the generation", KindIncremental, 3, codes.FailedPrecondition},
		{"a resume that would lower the generation", KindResume, 4, codes.FailedPrecondition},
		{"generation 0", KindIncremental, 0, codes.InvalidArgument},
		{"an absurd generation", KindFull, 1<<64 - 1, codes.InvalidArgument},
		{"just above the bound", KindIncremental, MaxGeneration + 1, codes.InvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			receiveAnswers(t, &replicaStore{exists: true, generation: 5}, tt.kind, tt.gen, tt.want)
		})
	}
}

// receiveAnswers receives a plain stream of kind at generation gen into z
// and checks the answer's code; a refused stream must not reach zfs
// receive.
func receiveAnswers(t *testing.T, z *replicaStore, kind string, gen uint64, want codes.Code) {
	t.Helper()
	r := NewReceiver(z, new(copylock.Locks), nil, "tank/nomad", "n2", 2, hclog.NewNullLogger())
	_, err := receiveFrom(r, stream(t, false, header(kind, gen), plainStream(kind)))
	if got := status.Code(errdefs.ToStatus(err)); got != want {
		t.Errorf("%v, want %s", err, want)
	}
	if want != codes.OK && z.received > 0 {
		t.Error("a refused stream reached zfs receive")
	}
}

// TestAStreamOfANewerReleaseIsRefused: when zfs receive refuses a stream
// at its first record because it uses a feature this node's OpenZFS lacks
// (a newer release sent it, test/crossversion), the sender hears
// FailedPrecondition, not a resumable Aborted, with a message naming the
// node, its release and what to do; nothing was received or discarded.
func TestAStreamOfANewerReleaseIsRefused(t *testing.T) {
	z := &replicaStore{refuse: fmt.Errorf("zfs receive -s -u tank/nomad/%s: exit status 1: cannot receive: stream has unsupported feature, feature flags = 10000004: %w",
		testVolume, zfs.ErrStreamUnsupported)}
	r := NewReceiver(z, new(copylock.Locks), nil, "tank/nomad", "n2", 2, hclog.NewNullLogger())
	r.OpenZFS = "2.1.11-1+deb12u1"
	_, err := receiveFrom(r, stream(t, false, header(KindFull, 1), plainStream(KindFull)))
	if got := status.Code(errdefs.ToStatus(err)); got != codes.FailedPrecondition {
		t.Fatalf("%v, want FailedPrecondition", err)
	}
	for _, want := range []string{"node n2", testVolume, "from node n1", "2.1.11-1+deb12u1", "unsupported feature", "upgrade this node"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal does not say %q: %v", want, err)
		}
	}
	if len(z.calls) != 0 {
		t.Errorf("the refusal changed the replica: %v", z.calls)
	}
}

// TestReceiveBoundsTheGeneration: a stream's generation may be at most
// MaxGenerationLead above the generation the node's promise record holds
// of the volume: a peer's header alone never plants a replica at a
// generation no majority promised, such as MaxGeneration, after which
// every promotion would need one receivers refuse.
// The replica's own label does not raise the bound: a peer's earlier
// stream set it. A node that promised the generation, or missed fewer
// reservations than the bound, receives as before.
func TestReceiveBoundsTheGeneration(t *testing.T) {
	tests := []struct {
		name     string
		replica  uint64 // the replica's generation; 0: none
		promised string
		kind     string
		gen      uint64
		want     codes.Code
	}{
		{"a new replica of a new volume", 0, "", KindFull, 1, codes.OK},
		{"a new replica within the bound", 0, "", KindFull, MaxGenerationLead, codes.OK},
		{"a planted replica at the highest generation", 0, "", KindFull, MaxGeneration, codes.FailedPrecondition},
		{"a planted replica just above the bound", 0, "", KindFull, MaxGenerationLead + 1, codes.FailedPrecondition},
		{"a new replica of a generation this node promised", 0, "3000000 n1", KindFull, 3_000_000, codes.OK},
		{"a replica after moves while this node was away", 5, "5 n1", KindIncremental, 5 + MaxGenerationLead, codes.OK},
		{"an incremental beyond the bound", 5, "5 n1", KindIncremental, 6 + MaxGenerationLead, codes.FailedPrecondition},
		{"a replica whose label alone is near the stream's", 5, "", KindIncremental, 5 + MaxGenerationLead, codes.FailedPrecondition},
		{"an incremental beyond the bound of the record", 5, "7000000 n3", KindIncremental, 7_000_001 + MaxGenerationLead, codes.FailedPrecondition},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			receiveAnswers(t, &replicaStore{exists: tt.replica > 0, generation: tt.replica, promised: tt.promised}, tt.kind, tt.gen, tt.want)
		})
	}
}

// TestNoZFSReceiveBeforeTheFirstRecord: no zfs receive starts, and the
// replica's lock is not taken, before the stream's first record: a
// sender that never sends it leaves no trace and holds nothing
// (docs/safety.md, "A receive and the lock"). zfs receive for an
// incremental or a resumed stream starts once the lock is taken, while
// the copy is checked.
func TestNoZFSReceiveBeforeTheFirstRecord(t *testing.T) {
	for _, kind := range []string{KindIncremental, KindResume, KindFull} {
		t.Run(kind, func(t *testing.T) {
			z := &replicaStore{exists: true, generation: 5}
			r := NewReceiver(z, new(copylock.Locks), nil, "tank/nomad", "n2", 2, hclog.NewNullLogger())
			r.IdleTimeout = 200 * time.Millisecond
			// Only the header: the first record never comes.
			_, err := receiveFrom(r, stream(t, true, header(kind, 5)))
			if status.Code(errdefs.ToStatus(err)) != codes.Aborted {
				t.Fatalf("a stream without its first record: %v, want Aborted (idle)", err)
			}
			if n := z.started.Load(); n > 0 {
				t.Errorf("%d zfs receives started before the first record", n)
			}
			if z.received != 0 {
				t.Errorf("the unfed stream changed the copy (%d receives)", z.received)
			}
		})
	}
}

// TestReceiveEndsWhenTheSenderStalls: a sender that goes quiet, before or
// after its header, loses its receive after the idle timeout, and the
// volume's lock is free again.
func TestReceiveEndsWhenTheSenderStalls(t *testing.T) {
	for name, msgs := range map[string][]message{
		"no header":       nil,
		"header, no data": {header(KindIncremental, 5)},
	} {
		t.Run(name, func(t *testing.T) {
			r := NewReceiver(&replicaStore{exists: true, generation: 5}, new(copylock.Locks), nil, "tank/nomad", "n2", 2, hclog.NewNullLogger())
			r.IdleTimeout = 100 * time.Millisecond
			done := make(chan error, 1)
			go func() { _, err := receiveFrom(r, stream(t, true, msgs...)); done <- err }()
			select {
			case err := <-done:
				if status.Code(errdefs.ToStatus(err)) != codes.Aborted {
					t.Errorf("stalled receive ended with %v, want Aborted", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("a stalled sender kept its receive")
			}
			if what, held := r.locks.Held(testVolume); held {
				t.Errorf("the volume's lock is still held, by %s", what)
			}
		})
	}
}

func TestReceivesAreBounded(t *testing.T) {
	r := NewReceiver(&replicaStore{exists: true, generation: 5}, new(copylock.Locks), nil, "tank/nomad", "n2", 2, hclog.NewNullLogger())
	for range MaxReceives {
		r.slots <- struct{}{}
	}
	_, err := receiveFrom(r, stream(t, false, header(KindIncremental, 5), plainStream(KindIncremental)))
	if status.Code(errdefs.ToStatus(err)) != codes.ResourceExhausted {
		t.Errorf("receive beyond %d at once: %v, want ResourceExhausted", MaxReceives, err)
	}
}

// TestFreshStreamDiscardsAPartialReceive: a sender that does not resume
// (its check refused the token) sends afresh; the receiver discards the
// partial receive first, which would otherwise make zfs receive fail.
func TestFreshStreamDiscardsAPartialReceive(t *testing.T) {
	z := &replicaStore{exists: true, generation: 5, token: "1-abc-10-789c"}
	r := NewReceiver(z, new(copylock.Locks), nil, "tank/nomad", "n2", 2, hclog.NewNullLogger())
	data := plainStream(KindIncremental)
	if _, err := receiveFrom(r, stream(t, false, header(KindIncremental, 5), data)); err != nil {
		t.Fatal(err)
	}
	if want := []string{"abort", "receive"}; !slices.Equal(z.calls, want) {
		t.Errorf("calls %v, want %v", z.calls, want)
	}
}

// TestSenderMustBeWhoItClaims: a stream's source node must be the node
// its sender's certificate names (the adapter names it: agent's
// ReplicationServer).
func TestSenderMustBeWhoItClaims(t *testing.T) {
	r := NewReceiver(&replicaStore{exists: true, generation: 5}, new(copylock.Locks), nil, "tank/nomad", "n2", 2, hclog.NewNullLogger())
	s := stream(t, false, header(KindIncremental, 5))
	_, err := r.Receive(s.ctx, "n9", s)
	if !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("a stream claiming node n1 from n9's certificate: %v, want PermissionDenied", err)
	}
}

// TestIdleClockStopsWithTheStream: once the sender's stream has ended, zfs
// receive may take longer than the idle timeout to finish; the receive is
// not cut short.
func TestIdleClockStopsWithTheStream(t *testing.T) {
	z := &replicaStore{exists: true, generation: 5, finishing: 300 * time.Millisecond}
	r := NewReceiver(z, new(copylock.Locks), nil, "tank/nomad", "n2", 2, hclog.NewNullLogger())
	r.IdleTimeout = 100 * time.Millisecond
	data := plainStream(KindIncremental)
	if _, err := receiveFrom(r, stream(t, false, header(KindIncremental, 5), data)); err != nil {
		t.Errorf("a receive that finished after its stream ended: %v", err)
	}
}

// TestNoReceiveDuringAPromotion: a receive that arrives while a replica is
// promoted (volume.Manager.Promote, holding the copy's lock) waits for
// the promotion, then finds a primary and is refused. Run beside it, it
// would have labelled the promoted copy a replica of the older generation
// again.
func TestNoReceiveDuringAPromotion(t *testing.T) {
	ctx := context.Background()
	z := newMemPool(testRoot)
	z.put(testDataset, replicaProps("1"), "zn-1:41")
	locks := new(copylock.Locks)
	r := NewReceiver(z, locks, nil, testRoot, "n2", 2, hclog.NewNullLogger())
	unlock, err := locks.Lock(ctx, testVolume, "promote")
	if err != nil {
		t.Fatal(err)
	}
	received := make(chan error, 1)
	go func() {
		_, err := receiveFrom(r, stream(t, false, header(KindIncremental, 1), plainStream(KindIncremental), dataMsg([]byte(streamEnd))))
		received <- err
	}()
	select {
	case err := <-received:
		t.Errorf("a receive ran during the promotion: %v", err)
		received <- err
	case <-time.After(300 * time.Millisecond):
	}
	if err := z.SetProperties(ctx, testDataset, map[string]string{copyrecord.PropRole: contract.RolePrimary, copyrecord.PropGeneration: "2"}); err != nil {
		t.Fatal(err)
	}
	unlock()
	if err := <-received; status.Code(errdefs.ToStatus(err)) != codes.FailedPrecondition {
		t.Errorf("the receive after the promotion: %v, want FailedPrecondition", err)
	}
	if d := z.dataset(testDataset); d.props[copyrecord.PropRole] != contract.RolePrimary || d.props[copyrecord.PropGeneration] != "2" || z.receives != 0 {
		t.Errorf("after the promotion the copy is %v with %d receives run; want the primary of generation 2, untouched", d.props, z.receives)
	}
}

// TestReceiveBoundsTheReplicasOfOnePeer: a full stream that would create
// a new replica is refused with ResourceExhausted once its sender's
// streams created MaxReplicasPerPeer of the replicas here: without the
// bound, one peer could create any number of replicas of arbitrary volume
// IDs. Other peers' replicas, replicas from before the label, streams
// into an existing replica and a node without the bound are not refused.
func TestReceiveBoundsTheReplicasOfOnePeer(t *testing.T) {
	replicas := func(from string, n int) []zfs.Child {
		var out []zfs.Child
		for i := range n {
			id := contract.VolumeIDForName(fmt.Sprintf("planted-%d", i))
			out = append(out, zfs.Child{Name: "tank/nomad/" + id,
				Props: map[string]string{copyrecord.PropVolumeID: id, copyrecord.PropRole: RoleReplica, copyrecord.PropReceivedFrom: from}})
		}
		return out
	}
	tests := []struct {
		name     string
		children []zfs.Child
		exists   bool
		kind     string
		limit    int
		want     codes.Code
	}{
		{"below the bound", replicas("n1", 2), false, KindFull, 3, codes.OK},
		{"at the bound", replicas("n1", 3), false, KindFull, 3, codes.ResourceExhausted},
		{"another peer's replicas", replicas("n3", 3), false, KindFull, 3, codes.OK},
		{"replicas from before the label", replicas("-", 3), false, KindFull, 3, codes.OK},
		{"an incremental into its replica", replicas("n1", 3), true, KindIncremental, 3, codes.OK},
		{"no bound", replicas("n1", 3), false, KindFull, 0, codes.OK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			z := &replicaStore{exists: tt.exists, generation: 5, children: tt.children}
			r := NewReceiver(z, new(copylock.Locks), nil, "tank/nomad", "n2", 2, hclog.NewNullLogger())
			r.MaxReplicasPerPeer = tt.limit
			_, err := receiveFrom(r, stream(t, false, header(tt.kind, 5), plainStream(tt.kind)))
			if got := status.Code(errdefs.ToStatus(err)); got != tt.want {
				t.Errorf("%v, want %s", err, tt.want)
			}
			if tt.want != codes.OK && z.received > 0 {
				t.Error("a refused stream reached zfs receive")
			}
		})
	}
}
