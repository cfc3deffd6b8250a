package faultsim

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/protocol"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/memnet"
	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
)

// controllerEndpoint names the controller (and the CO beside it) on the
// network.
const controllerEndpoint = "ctl"

// rates are the chances of the network's faults, per message.
type rates struct {
	loss float64 // a request, or its answer, is lost
	dup  float64 // a request is delivered twice
	cut  float64 // a stream breaks after a message
}

// network carries gRPC between the controller and the nodes' agents in
// memory, and loses, duplicates and cuts messages and partitions links as
// the run's dice say. Every node has one listener for its whole life;
// each incarnation of its process serves the connections it hands out
// (handoff), so clients reconnect to a restarted node at once, as they
// would to a real one.
type network struct {
	dice  *dice
	rates rates

	mu       sync.Mutex
	handoffs map[string]*handoff // by address
	aliases  map[string]string   // a second endpoint of a node -> the node
	up       map[string]bool     // endpoint -> its process runs
	cut      map[[2]string]bool  // from, to: messages that way are lost
	noDial   map[[2]string]bool  // from, to: from's calls to to fail; to's calls to from work
	sent     map[string]uint64   // per link and method: how many so far
	budget   map[string]int      // endpoint -> calls left before it crashes (absent: no limit)
	hold     *pushHold           // the next push it holds, when set (holdPush)
	log      func(format string, args ...any)
	step     func() int64
	// smallBuffers: connections take gRPC's default buffers
	// (Config.SmallBuffers).
	smallBuffers bool
}

func newNetwork(d *dice, r rates, log func(string, ...any), step func() int64) *network {
	return &network{dice: d, rates: r, handoffs: map[string]*handoff{}, aliases: map[string]string{}, up: map[string]bool{controllerEndpoint: true},
		cut: map[[2]string]bool{}, noDial: map[[2]string]bool{}, sent: map[string]uint64{}, budget: map[string]int{}, log: log, step: step}
}

func addrOf(node string) string { return node + ":7670" }

func endpointOf(target string) string {
	target = strings.TrimPrefix(target, "passthrough:///")
	node, _, _ := strings.Cut(target, ":")
	return node
}

// alias makes endpoint alias a second name of node's: its address reaches
// node's listener, and its links are node's (a host listed by name and by
// IP).
func (n *network) alias(alias, node string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.aliases[alias] = node
	n.handoffs[addrOf(alias)] = n.handoffs[addrOf(node)]
}

// nodeAt names the node an endpoint reaches: the endpoint itself unless
// it is an alias.
func (n *network) nodeAt(endpoint string) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if node, ok := n.aliases[endpoint]; ok {
		return node
	}
	return endpoint
}

// pipeBytes is the buffer of each direction of an in-memory connection.
// Every dial allocates two, and a run dials thousands of times (crashes,
// cuts, reconnections); runs still referenced for a second after they end
// (a receiver's delayed tidy) kept them alive, and 1 MiB pipes took the
// whole simulation past 20 GiB of heap (killed by the OOM killer in a
// make test). The streams here are small; 64 KiB only makes a large
// write wait for its reader, as a socket does.
const pipeBytes = 64 << 10

// handoff passes the connections of one permanent listener to whichever
// incarnation serves now.
type handoff struct {
	lis   *bufconn.Listener
	conns chan net.Conn
}

func (n *network) listen(node string) *handoff {
	h := &handoff{lis: bufconn.Listen(pipeBytes), conns: make(chan net.Conn)}
	go func() {
		for {
			c, err := h.lis.Accept()
			if err != nil {
				return
			}
			h.conns <- c
		}
	}()
	n.mu.Lock()
	n.handoffs[addrOf(node)] = h
	n.mu.Unlock()
	return h
}

// incarnationListener is one incarnation's view of a handoff; closing it
// ends only that incarnation's Accept.
type incarnationListener struct {
	h      *handoff
	closed chan struct{}
	once   sync.Once
}

func (h *handoff) listener() *incarnationListener {
	return &incarnationListener{h: h, closed: make(chan struct{})}
}

func (l *incarnationListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.h.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *incarnationListener) Close() error   { l.once.Do(func() { close(l.closed) }); return nil }
func (l *incarnationListener) Addr() net.Addr { return l.h.lis.Addr() }

func (n *network) setUp(endpoint string, up bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.up[endpoint] = up
}

func (n *network) isUp(endpoint string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.up[endpoint]
}

// partition cuts (or heals) the link from one endpoint to another; a
// symmetric partition cuts both ways.
func (n *network) partition(from, to string, cut bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if cut {
		n.cut[[2]string{from, to}] = true
	} else {
		delete(n.cut, [2]string{from, to})
	}
}

func (n *network) healAll() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cut = map[[2]string]bool{}
	n.noDial = map[[2]string]bool{}
}

// blockDial makes from unable to connect to to, while to's connections
// to from carry calls and answers both ways: a firewall or a NAT that
// lets connections through one way only, so each node hears the other
// only on the connections the other dials.
func (n *network) blockDial(from, to string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.noDial[[2]string{from, to}] = true
}

// dialable says why from cannot call to ("" if it can).
func (n *network) dialable(from, to string) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.noDial[[2]string{from, to}] {
		return from + " cannot connect to " + to
	}
	return ""
}

func (n *network) isCut(from, to string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cut[[2]string{from, to}]
}

// crashAfter makes the endpoint's process die after its next calls
// (the controller's crash in the middle of an operation); a negative
// count lifts the limit.
func (n *network) crashAfter(endpoint string, calls int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if calls < 0 {
		delete(n.budget, endpoint)
		return
	}
	n.budget[endpoint] = calls
}

// spend counts one call of endpoint against its budget; false once the
// budget is spent (the process is dead).
func (n *network) spend(endpoint string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	left, limited := n.budget[endpoint]
	if !limited {
		return true
	}
	if left <= 0 {
		return false
	}
	n.budget[endpoint] = left - 1
	return true
}

// count returns the number of this message on its link in this step,
// for the dice. Counting per step and per link and method keeps the
// decisions of one step from depending on how goroutines interleaved in
// the steps before.
func (n *network) count(key string) uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	key = fmt.Sprintf("%d/%s", n.step(), key)
	c := n.sent[key]
	n.sent[key] = c + 1
	return c
}

func (n *network) logUnless(quiet bool, format string, args ...any) {
	if !quiet {
		n.log(format, args...)
	}
}

func lost(why string) error { return status.Error(codes.Unavailable, "sim: "+why) }

// deliverable says why a message from one endpoint to another is lost
// now, or "" when it gets through (before the dice).
func (n *network) deliverable(from, to string) string {
	switch {
	case !n.isUp(from):
		return from + " is down"
	case !n.isUp(to):
		return to + " is down"
	case n.isCut(from, to):
		return "link " + from + "->" + to + " is cut"
	}
	return ""
}

// dialOptions are the options of every client of endpoint from: an
// in-memory dialer, from's identity (identity.go), reconnection without
// back-off, and the faults.
func (n *network) dialOptions(from string, alive func() bool) []grpc.DialOption {
	return append(n.directDialOptions(from),
		grpc.WithChainUnaryInterceptor(n.unary(from, alive)),
		grpc.WithChainStreamInterceptor(n.stream(from, alive)))
}

// directDialOptions connect as from to any node that listens, past every
// cut and without faults: a stalling liar's link (liar.go).
func (n *network) directDialOptions(from string) []grpc.DialOption {
	dialer := func(ctx context.Context, addr string) (net.Conn, error) {
		n.mu.Lock()
		h, ok := n.handoffs[addr]
		n.mu.Unlock()
		if !ok {
			return nil, fmt.Errorf("sim: no node at %s", addr)
		}
		return h.lis.DialContext(ctx)
	}
	fast := backoff.Config{BaseDelay: time.Millisecond, Multiplier: 1, MaxDelay: time.Millisecond}
	opts := append([]grpc.DialOption{
		grpc.WithContextDialer(dialer),
		grpc.WithTransportCredentials(memnet.Identity{Name: from}),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: fast, MinConnectTimeout: time.Second}),
	}, protocol.DialOptions()...)
	if n.smallBuffers {
		opts = append(opts, grpc.WithReadBufferSize(smallBuffer), grpc.WithWriteBufferSize(smallBuffer))
	}
	return opts
}

// smallBuffer is gRPC's default buffer size (Config.SmallBuffers).
const smallBuffer = 32 << 10

// unary loses requests and answers, and delivers requests twice.
func (n *network) unary(from string, alive func() bool) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		to := n.nodeAt(endpointOf(cc.Target()))
		i := n.count(from + ">" + to + method)
		key := fmt.Sprintf("%d/%s>%s%s", n.step(), from, to, method)
		if !alive() || !n.spend(from) {
			return lost(from + " is down")
		}
		if why := cmp.Or(n.dialable(from, to), n.deliverable(from, to)); why != "" {
			return lost(why)
		}
		quiet := strings.Contains(method, "Peers/")
		if n.dice.roll(key+"/req", i) < n.rates.loss {
			n.logUnless(quiet, "net: lost %s %s->%s", short(method), from, to)
			return lost("request lost")
		}
		err := invoker(ctx, method, req, reply, cc, opts...)
		if n.dice.roll(key+"/dup", i) < n.rates.dup {
			n.logUnless(quiet, "net: duplicated %s %s->%s", short(method), from, to)
			again := reply.(proto.Message).ProtoReflect().New().Interface()
			_ = invoker(ctx, method, req, again, cc, opts...)
		}
		if why := n.deliverable(to, from); why != "" {
			return lost("answer lost: " + why)
		}
		if n.dice.roll(key+"/resp", i) < n.rates.loss {
			n.logUnless(quiet, "net: lost the answer to %s %s->%s", short(method), from, to)
			return lost("answer lost")
		}
		return err
	}
}

// stream refuses streams over cut links and breaks open ones.
func (n *network) stream(from string, alive func() bool) grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		to := n.nodeAt(endpointOf(cc.Target()))
		i := n.count(from + ">" + to + method)
		key := fmt.Sprintf("%d/%s>%s%s", n.step(), from, to, method)
		if !alive() || !n.spend(from) {
			return nil, lost(from + " is down")
		}
		if why := cmp.Or(n.dialable(from, to), n.deliverable(from, to)); why != "" {
			return nil, lost(why)
		}
		ctx, cancel := context.WithCancel(ctx)
		cs, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			cancel()
			return nil, err
		}
		return &faultyStream{ClientStream: cs, n: n, from: from, to: to, key: fmt.Sprintf("%s#%d", key, i), cancel: cancel, alive: alive,
			method: method}, nil
	}
}

// pushHold holds the stream of one snapshot in a push before its first
// data goes out, until released: the sender's zfs send is running (its
// stream made from the snapshot as it was, as a real send holds its
// snapshots), the receiver has begun and holds the copy's lock, nothing
// has landed. reached is closed when the stream gets there.
type pushHold struct {
	from, to, snapshot string
	reached            chan struct{}
	released           chan struct{}
	once               sync.Once
}

// holdPush holds the next stream from one node to another whose header
// names snapshot (its short name, as a Replication/Receive header has it).
func (n *network) holdPush(from, to, snapshot string) *pushHold {
	h := &pushHold{from: from, to: to, snapshot: snapshot, reached: make(chan struct{}), released: make(chan struct{})}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.hold = h
	return h
}

// release lets the held stream go on; the hold is gone from the network.
func (n *network) release(h *pushHold) {
	close(h.released)
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.hold == h {
		n.hold = nil
	}
}

// takeHold returns the hold for a stream from, to whose first message is
// m, once.
func (n *network) takeHold(from, to string, m any) *pushHold {
	msg, ok := m.(*pb.ReceiveMessage)
	if !ok || msg.GetHeader() == nil {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	h := n.hold
	if h == nil || h.from != from || h.to != to || h.snapshot != msg.GetHeader().GetSnapshot() {
		return nil
	}
	n.hold = nil
	return h
}

// faultyStream breaks when its link is cut, its process dies, or the dice
// say so after a message.
type faultyStream struct {
	grpc.ClientStream
	n        *network
	from, to string
	key      string
	sent     uint64
	cancel   context.CancelFunc
	alive    func() bool
	method   string
	hold     *pushHold // holds the stream before its first data
}

func (s *faultyStream) check(dir string) error {
	why := s.n.deliverable(s.from, s.to)
	if why == "" {
		why = s.n.deliverable(s.to, s.from)
	}
	if why == "" && !s.alive() {
		why = s.from + " is down"
	}
	if why == "" && s.n.dice.roll(s.key+dir, s.sent) < s.n.rates.cut {
		why = "stream broken"
		s.n.log("net: broke stream %s after %d messages", s.key, s.sent)
	}
	if why != "" {
		s.cancel()
		return lost(why)
	}
	return nil
}

func (s *faultyStream) SendMsg(m any) error {
	s.sent++
	if s.sent == 1 && s.method == pb.Replication_Receive_FullMethodName {
		s.hold = s.n.takeHold(s.from, s.to, m)
	}
	if s.sent == 1 && s.method == pb.NodeAgent_Replicate_FullMethodName {
		s.n.lastSteps(s.Context(), s.key, m)
	}
	if s.hold != nil && s.sent == 2 {
		s.hold.once.Do(func() { close(s.hold.reached) })
		select {
		case <-s.hold.released:
		case <-s.Context().Done():
		}
	}
	if err := s.check("/send"); err != nil {
		return err
	}
	return s.ClientStream.SendMsg(m)
}

func (s *faultyStream) RecvMsg(m any) error {
	if err := s.ClientStream.RecvMsg(m); err != nil {
		return err
	}
	s.sent++
	return s.check("/recv")
}

// A move's transfer (its catch-up, its final push) lasts seconds to
// hours, while the CO goes on: Nomad places other jobs, retries the
// publish, restarts nodes. In the simulation a transfer moves a few
// bytes in a millisecond, so a move's push lasts this many steps of the
// simulation's clock instead, at most, as the dice say (none half the
// time), before its request goes out; the faults of those steps (a cut,
// a crash, the CO's publish elsewhere) meet the move in the middle.
const maxMoveSteps = 4

// lastSteps holds the request m of a move's push (a Replicate whose
// purpose is a catch-up, or that fences for a move) until the step its
// dice chose, or until ctx ends (the controller stops).
func (n *network) lastSteps(ctx context.Context, key string, m any) {
	req, ok := m.(*pb.ReplicateRequest)
	if !ok || (req.GetFenceForNodeId() == "" && !strings.HasPrefix(req.GetPurpose(), "catch-up")) {
		return
	}
	steps := int64(n.dice.roll(key+"/steps", 0) * 2 * (maxMoveSteps + 1))
	if steps == 0 || steps > maxMoveSteps {
		return
	}
	until := n.step() + steps
	n.log("net: the move's push of %s to %s lasts %d steps", req.GetVolumeId(), endpointOf(req.GetTargetAddress()), steps)
	for n.step() < until {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Millisecond):
		}
	}
}

func short(method string) string {
	if i := strings.LastIndex(method, "/"); i >= 0 {
		return method[i+1:]
	}
	return method
}
