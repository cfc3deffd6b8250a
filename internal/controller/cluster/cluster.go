// Package cluster is the controller's view of the node agents: where they
// are (a peers.Source), what each holds (asked live, never cached as truth) and
// where a new volume should go (Place).
//
// The controller keeps no state of its own. Every question ("which node holds
// volume X?") is answered by asking the agents, whose answers come from ZFS
// user properties; a restarted controller is at once as good as before.
package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/keepalive"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/connpool"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/peers"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/protocol"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/worklease"
)

// Node is one reachable agent and what it said about itself.
type Node struct {
	Addr  string
	Info  agentclient.NodeInfo
	Agent Agent
}

// Agent is a node agent as the controller's logic calls it: plain Go
// types in and out, errors of the errdefs kinds. *agentclient.Client
// implements it over gRPC; protobuf stops there. (What a node says about
// itself, GetNode, the cluster asks on its own and hands out as Info.)
type Agent interface {
	CreateVolume(ctx context.Context, v agentclient.NewVolume) (agentclient.Volume, error)
	DeleteVolume(ctx context.Context, volumeID string) error
	GetVolume(ctx context.Context, volumeID string) (agentclient.Volume, error)
	ListVolumes(ctx context.Context, page agentclient.Page) ([]agentclient.Volume, error)
	ExpandVolume(ctx context.Context, volumeID string, requiredBytes, limitBytes uint64) (capacityBytes uint64, err error)
	CreateSnapshot(ctx context.Context, sourceVolumeID, name string, createdAfterUnix int64) (agentclient.Snapshot, error)
	DeleteSnapshot(ctx context.Context, d agentclient.SnapshotDeletion) error
	ListSnapshots(ctx context.Context, q agentclient.SnapshotQuery) ([]agentclient.Snapshot, error)
	Replicate(ctx context.Context, volumeID string, to agentclient.Target, purpose string, each func(agentclient.Progress)) (agentclient.Progress, error)
	Status(ctx context.Context) (agentclient.NodeStatus, error)
	DeleteReplica(ctx context.Context, volumeID string, volumeDeleted bool) (deleted bool, err error)
	GetCopy(ctx context.Context, volumeID string) (agentclient.Copy, error)
	MoveFinal(ctx context.Context, volumeID, targetAddr, targetNodeID string) (agentclient.Progress, error)
	Unfence(ctx context.Context, volumeID string, generation uint64) (agentclient.Copy, error)
	Promote(ctx context.Context, p agentclient.Promotion) (agentclient.Copy, error)
	Demote(ctx context.Context, d agentclient.Demotion) (agentclient.Copy, error)
	Reserve(ctx context.Context, r agentclient.Reservation) (agentclient.Promise, error)
	AcquireWorkLease(ctx context.Context, self worklease.Instance, release bool) (worklease.Lease, error)
	WorkLeases(ctx context.Context) (worklease.Lease, error)
}

var _ NodeAgent = (*agentclient.Client)(nil)

// NodeAgent is an Agent that also says what its node is (GetNode): what
// the cluster reaches at each peer address.
type NodeAgent interface {
	Agent
	GetNode(ctx context.Context, opts agentclient.GetNodeOptions) (agentclient.NodeInfo, error)
}

// Unreachable records an agent that did not answer.
type Unreachable struct {
	Addr string
	Err  error
}

// Cluster reaches the node agents named by a peers.Source.
type Cluster struct {
	// ReconnectWait bounds the wait for a new connection to an agent
	// whose connection had failed, once an outage (zero:
	// DefaultReconnectWait; reconnect.go).
	ReconnectWait time.Duration

	peers   peers.Source
	timeout time.Duration
	log     hclog.Logger
	// connect returns the agent at a peer address: a gRPC client, or
	// in tests an in-memory fake (NewWithAgents).
	connect func(addr string) (NodeAgent, error)
	conns   *connpool.Pool
	outages *outages
	// stop ends what the Cluster runs in the background (Close).
	stop context.CancelFunc
}

// New returns a Cluster. Each agent call is bounded by timeout. dialOpts
// apply to every agent connection and must set transport credentials
// (mutual TLS in production). Every call carries this build's agent
// protocol version, which the node checks (package protocol).
func New(peers peers.Source, timeout time.Duration, log hclog.Logger, dialOpts ...grpc.DialOption) *Cluster {
	dialOpts = append([]grpc.DialOption{grpc.WithKeepaliveParams(agentKeepalive), grpc.WithConnectParams(agentConnect)}, dialOpts...)
	dialOpts = append(dialOpts, protocol.DialOptions()...)
	c := &Cluster{peers: peers, timeout: timeout, log: log}
	c.withConns(connpool.New(func(addr string) (*grpc.ClientConn, error) {
		return grpc.NewClient(addr, dialOpts...)
	}))
	c.connect = c.client
	return c
}

func (c *Cluster) withConns(pool *connpool.Pool) {
	stop, cancel := context.WithCancel(context.Background())
	c.conns, c.outages, c.stop = pool, newOutages(pool, stop, c.log), cancel
}

// NewWithAgents returns a Cluster whose agents connect returns, without
// gRPC: the controller's logic is tested against in-memory fakes of the
// agents (clustertest.Fakes). connect's error makes the peer unreachable.
func NewWithAgents(peers peers.Source, connect func(addr string) (NodeAgent, error), timeout time.Duration, log hclog.Logger) *Cluster {
	c := &Cluster{peers: peers, timeout: timeout, log: log, connect: connect}
	c.withConns(connpool.New(nil))
	return c
}

// agentKeepalive pings idle agent connections. A node that dies without
// closing its connections (power loss, a cut link) otherwise leaves the
// controller a connection that looks healthy: the next call to it, often
// the ControllerPublish that fails its volumes over, would wait the whole
// call timeout (30 s by default) before the node counts as unreachable.
// With pings the connection fails within Time+Timeout of going silent,
// and calls to the node fail at once. The agents' servers allow pings
// every 5 s without streams (the node's agent.ServerOptions).
var agentKeepalive = keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}

// agentConnect bounds a connection attempt (TCP and TLS handshakes) to 5 s
// instead of gRPC's 20: calls wait while a connection is being made, and
// an attempt to a dead node's address otherwise holds them that long.
var agentConnect = grpc.ConnectParams{Backoff: backoff.DefaultConfig, MinConnectTimeout: 5 * time.Second}

// Close closes all agent connections.
func (c *Cluster) Close() {
	c.stop()
	c.conns.Close()
}

// client returns a client of the agent at addr held to one node: the one
// whose certificate answers first, which its GetNode must name
// (agentclient.ForNode). The controller knows only addresses; so no node
// can answer, at an address or between two calls, as another node.
func (c *Cluster) client(addr string) (NodeAgent, error) {
	conn, err := c.conns.Get(addr)
	if err != nil {
		return nil, fmt.Errorf("agent %s: %w", addr, err)
	}
	return agentclient.ForNode(conn, ""), nil
}

// Nodes asks every agent about itself and its capacity, in parallel.
// Unhealthy agents are returned with UnhealthyReason set; agents that do
// not answer are listed in unreachable. It fails only when the peer list
// cannot be read.
func (c *Cluster) Nodes(ctx context.Context) (nodes []Node, unreachable []Unreachable, err error) {
	return askNodes(ctx, c, agentclient.GetNodeOptions{})
}

// askNodes asks every agent about itself only, as about says.
func askNodes(ctx context.Context, c *Cluster, about agentclient.GetNodeOptions) (nodes []Node, unreachable []Unreachable, err error) {
	answers, unreachable, err := ask[struct{}](ctx, c, about, nil)
	for _, a := range answers {
		nodes = append(nodes, a.Node)
	}
	return nodes, unreachable, err
}

// Answer is a reachable node and its answer to a question.
type Answer[T any] struct {
	Node   Node
	Object T
	Err    error // the node's failure to answer the question
}

// Ask is Nodes plus a question: it asks every agent about itself and, at
// the same time, calls get on it, so each node costs one round trip
// instead of two. The nodes say who they are and whether they are
// healthy, not their capacity (Info's AvailableBytes and Volumes are 0):
// counting a node's volumes reads every one of them. Answers are sorted
// by node ID.
func Ask[T any](ctx context.Context, c *Cluster, get func(context.Context, Agent) (T, error)) (answers []Answer[T], unreachable []Unreachable, err error) {
	return ask(ctx, c, agentclient.GetNodeOptions{WithoutCapacity: true}, get)
}

// AskWithCapacity is Ask whose nodes also say their capacity (as Nodes
// does): a create places its volume from the answers to its first
// question.
func AskWithCapacity[T any](ctx context.Context, c *Cluster, get func(context.Context, Agent) (T, error)) (answers []Answer[T], unreachable []Unreachable, err error) {
	return ask(ctx, c, agentclient.GetNodeOptions{}, get)
}

func ask[T any](ctx context.Context, c *Cluster, about agentclient.GetNodeOptions, get func(context.Context, Agent) (T, error)) (answers []Answer[T], unreachable []Unreachable, err error) {
	addrs, err := c.peers.Peers()
	if err != nil && len(addrs) == 0 {
		return nil, nil, fmt.Errorf("%w: no node agents known: %v", errdefs.ErrUnavailable, err)
	}
	if err != nil {
		c.log.Warn("using the last good peer list", "error", err)
	}
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	for _, addr := range addrs {
		g.Go(func() error {
			a, err := askOne(gctx, c, addr, about, get)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				unreachable = append(unreachable, Unreachable{Addr: addr, Err: err})
				return nil
			}
			answers = append(answers, a)
			return nil
		})
	}
	_ = g.Wait() // the goroutines record failures instead of returning them
	for _, u := range unreachable {
		c.log.Warn("node agent unreachable", "addr", u.Addr, "error", u.Err)
	}
	return oncePerNode(c.log, answers), unreachable, nil
}

// oncePerNode keeps one answer of each node, sorted by node ID: a node
// listed under two addresses (by name and by IP) answers at both, and
// every majority the controller takes (reservations, the work lease)
// counts nodes, never addresses. The node is the one its certificate
// names (client): an answer at another address cannot count as another
// node. An answer without an error is kept over one with. An address
// that did not answer stays unreachable: it may be an alias of a node
// that answered, but counting it only makes a majority harder to reach.
func oncePerNode[T any](log hclog.Logger, answers []Answer[T]) []Answer[T] {
	sort.SliceStable(answers, func(i, j int) bool {
		a, b := answers[i], answers[j]
		if a.Node.Info.NodeID != b.Node.Info.NodeID {
			return a.Node.Info.NodeID < b.Node.Info.NodeID
		}
		if (a.Err == nil) != (b.Err == nil) {
			return a.Err == nil
		}
		return a.Node.Addr < b.Node.Addr
	})
	out := answers[:0]
	for _, a := range answers {
		if n := len(out); n > 0 && out[n-1].Node.Info.NodeID == a.Node.Info.NodeID {
			log.Warn("one node answers at two peer addresses: it counts once; list each node once in the peers",
				"node_id", a.Node.Info.NodeID, "addr", out[n-1].Node.Addr, "also_addr", a.Node.Addr)
			continue
		}
		out = append(out, a)
	}
	return out
}

// askOne asks one agent about itself and calls get (unless nil) on it at
// the same time. A question that failed because the connection was down
// is asked again once the node has answered (node redials a failed
// connection).
//
// Both go through one client, held to one node (Cluster.client): the
// question's answer is the node's that GetNode names.
func askOne[T any](ctx context.Context, c *Cluster, addr string, about agentclient.GetNodeOptions, get func(context.Context, Agent) (T, error)) (Answer[T], error) {
	client, err := c.connect(addr)
	if err != nil {
		return Answer[T]{}, err
	}
	if get == nil {
		n, err := c.node(ctx, client, addr, about)
		return Answer[T]{Node: n}, err
	}
	question := func() Answer[T] {
		ctx, cancel := c.Call(ctx)
		defer cancel()
		obj, err := get(ctx, client)
		return Answer[T]{Object: obj, Err: err}
	}
	answered := make(chan Answer[T], 1)
	go func() { answered <- question() }()
	n, err := c.node(ctx, client, addr, about)
	a := <-answered
	if err != nil {
		return Answer[T]{}, err
	}
	if errors.Is(a.Err, errdefs.ErrUnavailable) {
		a = question()
	}
	a.Node = n
	return a, nil
}

func (c *Cluster) node(ctx context.Context, client NodeAgent, addr string, about agentclient.GetNodeOptions) (Node, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	info, err := client.GetNode(ctx, about)
	if errors.Is(err, errdefs.ErrUnavailable) && !c.outages.isDown(addr) {
		// After failures gRPC waits up to two minutes before dialling
		// again. A node that is back must be seen soon: dial now, and
		// give the new connection a moment, once an outage (outages).
		c.conns.ResetBackoff(addr)
		wait := cmp.Or(c.ReconnectWait, DefaultReconnectWait)
		rctx, rcancel := context.WithTimeout(ctx, wait)
		waiting := about
		waiting.WaitForReady = true
		info, err = client.GetNode(rctx, waiting)
		if err != nil && (errors.Is(err, errdefs.ErrUnavailable) || rctx.Err() != nil) {
			c.outages.begin(addr, wait/4)
		}
		rcancel()
	}
	if err != nil {
		return Node{}, fmt.Errorf("agent %s: %w", addr, err)
	}
	return Node{Addr: addr, Info: info, Agent: client}, nil
}

// Waiting asks every agent which of its stages wait for a move's
// promotion (NodeInfo.AwaitedPromotions), without its health or capacity:
// the work lease's holder asks every few seconds, and a node's health read
// opens its pool. The nodes' UnhealthyReason is empty whatever their
// health, so they are for this question only, never for placement.
func Waiting(ctx context.Context, c *Cluster) (nodes []Node, err error) {
	nodes, _, err = askNodes(ctx, c, agentclient.GetNodeOptions{WithoutHealth: true})
	return nodes, err
}

// Healthy returns the nodes that answered and are healthy.
func Healthy(nodes []Node) []Node {
	var out []Node
	for _, n := range nodes {
		if n.Info.UnhealthyReason == "" {
			out = append(out, n)
		}
	}
	return out
}

// Located is an object found on a node.
type Located[T any] struct {
	Node   Node
	Object T
}

// Find asks every node, in parallel, for one object with get. A node's
// NotFound means it does not hold it. It fails with ErrNotFound only when
// every node answered that it does not hold it, and with ErrUnavailable when
// some node could not answer: "not found" must never be guessed, or a
// delete would report success while data stays behind. When several nodes
// hold it, best picks (nil: the first).
func Find[T any](ctx context.Context, c *Cluster, what string, get func(context.Context, Agent) (T, error), best ...func(a, b T) bool) (Located[T], error) {
	found, errs, err := FindAll(ctx, c, get)
	if err != nil {
		return Located[T]{}, err
	}
	return pick(c, what, found, errs, best...)
}

// pick chooses among the copies of what found, or fails as Find does.
func pick[T any](c *Cluster, what string, found []Located[T], errs []error, best ...func(a, b T) bool) (Located[T], error) {
	if len(found) > 0 {
		pick := found[0]
		for _, f := range found[1:] {
			if len(best) > 0 && best[0](f.Object, pick.Object) {
				pick = f
			}
		}
		if len(found) > 1 && len(best) == 0 {
			c.log.Error("object found on more than one node; using the first", "object", what, "nodes", len(found))
		}
		return pick, nil
	}
	if len(errs) > 0 {
		return Located[T]{}, fmt.Errorf("%w: cannot tell where %s is: %v", errdefs.ErrUnavailable, what, errors.Join(errs...))
	}
	return Located[T]{}, fmt.Errorf("%w: %s", errdefs.ErrNotFound, what)
}

// FindAll asks every node, in parallel, with get, and returns what the
// nodes hold and the errors of nodes that could not answer (NotFound is
// not an error: the node does not hold it), the nodes the nodes' leases
// count and the controller's peer list does not name among them
// (Unlisted): only with no error did every node say what it holds.
func FindAll[T any](ctx context.Context, c *Cluster, get func(context.Context, Agent) (T, error)) ([]Located[T], []error, error) {
	answers, unreachable, err := Ask(ctx, c, get)
	if err != nil {
		return nil, nil, err
	}
	found, errs := locate(answers, unreachable)
	return found, errs, nil
}

// locate sorts the nodes' answers to a question into what they hold and
// the errors that keep them from saying (FindAll).
func locate[T any](answers []Answer[T], unreachable []Unreachable) ([]Located[T], []error) {
	var (
		found    []Located[T]
		answered []Node
		errs     []error
	)
	for _, a := range answers {
		switch {
		case a.Err == nil:
			found = append(found, Located[T]{Node: a.Node, Object: a.Object})
			answered = append(answered, a.Node)
		case errors.Is(a.Err, errdefs.ErrNotFound):
			answered = append(answered, a.Node)
		default:
			errs = append(errs, fmt.Errorf("node %s: %w", a.Node.Info.NodeID, a.Err))
		}
	}
	for _, u := range unreachable {
		errs = append(errs, fmt.Errorf("agent %s unreachable: %w", u.Addr, u.Err))
	}
	if unlisted := Unlisted(answered, len(errs)); unlisted != "" {
		errs = append(errs, errors.New(unlisted))
	}
	return found, errs
}

// Call bounds one agent call by the agent timeout.
func (c *Cluster) Call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.timeout)
}

// listingTimeouts is how many agent timeouts a call may take whose work
// grows with the node's datasets and cannot be paged (Status lists the
// node's root): at a thousand volumes under a slow pool, with the node's
// own periodic listings beside it, one took over 30 s (BenchmarkScale),
// and the schedule's full plan then planned nothing.
const listingTimeouts = 5

// CallListing bounds one agent call that lists the node's datasets.
func (c *Cluster) CallListing(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, listingTimeouts*c.timeout)
}

// CallCreate bounds one agent call that creates a volume, by as many
// agent timeouts as a listing: the node writes the dataset with its
// properties and, for an encrypted volume, loads and unloads its key,
// each waiting for the pool to sync a transaction group. On a guest busy
// starting Docker and Nomad, a node took 7.4 s to create an encrypted
// volume (test/nomad, whose agent timeout is 10 s); cut at one agent
// timeout, the create fails though the node finishes it.
func (c *Cluster) CallCreate(ctx context.Context) (context.Context, context.CancelFunc) {
	return c.CallListing(ctx)
}

// Each calls ask on every node of nodes at once, each call under its own
// deadline (Call), and returns the answers in the order of nodes: one
// slow node costs a fan-out one call's time, not the sum of all.
func Each[T any](ctx context.Context, c *Cluster, nodes []Node, ask func(context.Context, Node) (T, error)) []Answer[T] {
	return fanOut(ctx, nodes, func(ctx context.Context, n Node) (T, error) {
		cctx, cancel := c.Call(ctx)
		defer cancel()
		return ask(cctx, n)
	})
}

// fanOut calls ask on every node of nodes at once and returns the
// answers in the order of nodes. ask bounds its own calls.
func fanOut[T any](ctx context.Context, nodes []Node, ask func(context.Context, Node) (T, error)) []Answer[T] {
	out := make([]Answer[T], len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			obj, err := ask(ctx, n)
			out[i] = Answer[T]{Node: n, Object: obj, Err: err}
		}()
	}
	wg.Wait()
	return out
}

// Holding is what a node holds: its primaries (ListVolumes), and its
// replicas, transfers and copies set aside (Status).
type Holding struct {
	Volumes []agentclient.Volume
	Status  agentclient.NodeStatus
}

// Holdings asks every node of nodes at once what it holds: its primaries
// a page at a time, then its status, each call under its own deadline
// (Call; CallListing for the status, which lists the node's root). A page costs the node a read per volume, so a node with
// thousands of volumes is asked in calls that each fit the agent
// timeout, where one call for all of them did not (BenchmarkScale).
func Holdings(ctx context.Context, c *Cluster, nodes []Node) []Answer[Holding] {
	return fanOut(ctx, nodes, func(ctx context.Context, n Node) (Holding, error) {
		vols, err := allVolumes(ctx, c, n)
		if err != nil {
			return Holding{}, err
		}
		cctx, cancel := c.CallListing(ctx)
		defer cancel()
		st, err := n.Agent.Status(cctx)
		return Holding{Volumes: vols, Status: st}, err
	})
}

// HoldingPage is how many primaries Holdings asks a node for per call.
const HoldingPage = 200

// allVolumes lists node n's primaries in pages of HoldingPage, each
// asked for one more than it keeps: the extra one is where the next
// page starts.
func allVolumes(ctx context.Context, c *Cluster, n Node) ([]agentclient.Volume, error) {
	var out []agentclient.Volume
	from := ""
	for {
		cctx, cancel := c.Call(ctx)
		page, err := n.Agent.ListVolumes(cctx, agentclient.Page{From: from, MaxEntries: HoldingPage + 1})
		cancel()
		if err != nil {
			return nil, err
		}
		if len(page) <= HoldingPage {
			return append(out, page...), nil
		}
		out = append(out, page[:HoldingPage]...)
		from = page[HoldingPage].VolumeID
	}
}
