package lease

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/witnesses"
)

// PeerClient is how the heartbeat calls its peers: agent.PeerClient over
// the agent port on a node, in memory in the tests.
type PeerClient interface {
	// Ping asks the peer at addr which node it is. An answer as a node
	// other than the one the peer's certificate names fails with
	// errdefs.ErrPermissionDenied: it must not count as that node.
	Ping(ctx context.Context, addr string) (nodeID string, err error)
	// Promises asks node nodeID, at addr, for the highest generation it
	// promised of each of ids (at most MaxPromiseIDs); an answer from
	// another node fails with errdefs.ErrPermissionDenied.
	Promises(ctx context.Context, addr, nodeID string, ids []string) (map[string]uint64, error)
	// Close ends the connections to the peers.
	Close()
}

// Volumes is what the heartbeat does to the node's primaries
// (volume.Fences).
type Volumes interface {
	// SelfFence makes the mounted primaries read-only; it returns the IDs
	// it fenced now.
	SelfFence(ctx context.Context) ([]string, error)
	// LeaseFenced lists the primaries fenced by the lease, by ID, with
	// their generations.
	LeaseFenced(ctx context.Context) (map[string]uint64, error)
	// LiftLeaseFence makes one writable again at its generation.
	LiftLeaseFence(ctx context.Context, id string, generation uint64) error
	// Promised is the highest generation of the volume this node promised.
	Promised(ctx context.Context, id string) (uint64, error)
	// Unconfirmed lists the primaries not confirmed current since the
	// process started or the lease was lost, with their generations;
	// Confirm records one confirmed; ForgetConfirmations forgets them all
	// (volume.Fences: staging an unmounted primary waits for it).
	Unconfirmed(ctx context.Context) (map[string]uint64, error)
	Confirm(id string, generation uint64)
	ForgetConfirmations()
	// FenceSuperseded makes the primary of volume id at generation
	// read-only, mounted or not, because generation newer was promised
	// elsewhere; it reports whether it fenced it now.
	FenceSuperseded(ctx context.Context, id string, generation, newer uint64) (bool, error)
	// EndForced puts the primaries the operator promoted without a
	// majority (promote -force) back under the lease, the confirmations
	// and the superseded-copy fence; it returns their IDs.
	EndForced(ctx context.Context) ([]string, error)
}

// Heartbeat pings the peers every Interval (a quarter of the lease),
// fences the node's mounted primaries while it does not hold the lease,
// and lifts them once it does again and a majority of all its peers
// confirms that no newer copy was promoted meanwhile.
type Heartbeat struct {
	Monitor  *Monitor
	NodeID   string
	Interval time.Duration
	// Peers lists the agent addresses (a peers file may change); Client
	// calls them.
	Peers   func() ([]string, error)
	Client  PeerClient
	Volumes Volumes
	// Held, when set, is told whether the lease is held after each beat
	// (a metric).
	Held func(bool)
	Log  hclog.Logger

	// What the last beat left, for the next (see step). Zero before the
	// first beat: the node starts as if it held the lease and fenced
	// volumes may exist, since a restart keeps the marks on the datasets.
	lost, noneFenced bool
	// beaten: a beat ran. The first that finds the lease held says so,
	// so a process's log shows when it first held its lease after a
	// start, as it shows every loss and regain.
	beaten bool
	// allConfirmed: every primary was confirmed current since the lease
	// was last held (false at start: a restart forgets).
	allConfirmed bool
	// lastBeat, gap: when the last beat began, and how long before it
	// the one before began. A gap near the lease means the beats
	// themselves were late (a starved process), not the peers silent.
	lastBeat time.Time
	gap      time.Duration
}

// Run beats every Interval until ctx ends.
func (h *Heartbeat) Run(ctx context.Context) {
	ticker := time.NewTicker(h.Interval)
	defer ticker.Stop()
	defer h.Client.Close()
	for {
		h.Beat(ctx)
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// Beat runs one beat. Run calls it every Interval; the fault-injection
// simulation (internal/testbed/faultsim) calls it on its own clock.
func (h *Heartbeat) Beat(ctx context.Context) {
	now := h.Monitor.now()
	if !h.lastBeat.IsZero() {
		h.gap = now.Sub(h.lastBeat)
	}
	h.lastBeat = now
	held, fencedSome := h.step(ctx, !h.lost, !h.noneFenced)
	h.lost, h.noneFenced, h.beaten = !held, !fencedSome, true
}

// step is one beat: ping the peers, then fence the mounted primaries if
// the lease is lost, or lift fenced ones the peers confirm if it is
// held. wasHeld and fencedSome are what the previous step left; it
// returns them for the next.
func (h *Heartbeat) step(ctx context.Context, wasHeld, fencedSome bool) (held, stillFenced bool) {
	h.beat(ctx)
	held = h.Monitor.Held(h.NodeID)
	switch {
	case !held:
		if wasHeld {
			h.Log.Warn("lease lost: no majority of the peers (every domain) answered within the lease; mounted primaries become read-only",
				"lease", h.Monitor.lease, "silent", h.Monitor.Silent(h.NodeID), "since_last_beat", h.gap.Round(time.Millisecond))
		}
		fenced, err := h.Volumes.SelfFence(ctx)
		if err != nil {
			h.Log.Error("making primaries read-only failed; retrying at the next beat", "error", err)
		}
		fencedSome = fencedSome || len(fenced) > 0 || err != nil
		// A failover may follow: every primary must be confirmed again.
		h.Volumes.ForgetConfirmations()
		h.allConfirmed = false
	default:
		switch {
		case !h.beaten:
			h.Log.Info("lease held: a majority of the peers (every domain) answers")
		case !wasHeld:
			h.Log.Info("lease held again: a majority of the peers (every domain) answers")
		}
		if fencedSome {
			fencedSome = h.lift(ctx)
		}
		h.endForced(ctx)
		if !h.allConfirmed {
			h.allConfirmed = h.confirm(ctx)
		}
	}
	if h.Held != nil {
		h.Held(held)
	}
	return held, fencedSome
}

// endForced ends the exemptions of the copies the operator forced
// without a majority: this node hears a majority now, so they are
// confirmed like any primary (their confirmation round is this beat's).
func (h *Heartbeat) endForced(ctx context.Context) {
	ended, err := h.Volumes.EndForced(ctx)
	if err != nil {
		h.Log.Error("putting the operator's forced primaries back under the lease failed; retrying at the next beat", "error", err)
	}
	if len(ended) > 0 {
		h.allConfirmed = false
	}
}

// beat pings every peer at once, each within the interval.
func (h *Heartbeat) beat(ctx context.Context) {
	addrs, err := h.Peers()
	if err != nil {
		h.Log.Warn("reading the peers failed; using the last list", "error", err)
	}
	if addrs != nil {
		h.Monitor.SetPeers(addrs)
	}
	h.fanOut(ctx, h.Monitor.Peers(), func(ctx context.Context, addr string) {
		nodeID, err := h.Client.Ping(ctx, addr)
		switch {
		case errors.Is(err, errdefs.ErrPermissionDenied):
			// A node may answer only as itself: a certificate that names
			// another node than the answer would count one node as
			// another.
			h.Log.Warn("a peer's answer is not counted", "addr", addr, "error", err)
		case err == nil:
			h.Monitor.Answered(addr, nodeID)
			return
		}
		h.Monitor.Failed(addr, err)
	})
}

// fanOut calls every peer at addrs at once, all within the interval.
func (h *Heartbeat) fanOut(ctx context.Context, addrs []string, call func(ctx context.Context, addr string)) {
	ctx, cancel := context.WithTimeout(ctx, h.Interval)
	defer cancel()
	var wg sync.WaitGroup
	for _, addr := range addrs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			call(ctx, addr)
		}()
	}
	wg.Wait()
}

// lift asks the peers about each primary fenced by the lease whether a
// newer generation was promised, and lifts each that a majority confirms.
// It reports whether some stay fenced.
func (h *Heartbeat) lift(ctx context.Context) bool {
	fenced, err := h.Volumes.LeaseFenced(ctx)
	if err != nil {
		h.Log.Warn("listing the primaries fenced by the lease failed; retrying at the next beat", "error", err)
		return true
	}
	ok := h.vouched(ctx, fenced)
	remain := false
	for id, gen := range fenced {
		if !ok[id] {
			remain = true
			continue
		}
		if err := h.Volumes.LiftLeaseFence(ctx, id, gen); err != nil {
			h.Log.Warn("making the volume writable again failed", "volume_id", id, "error", err)
			remain = true
		}
	}
	return remain
}

// confirm asks the peers about the primaries not confirmed current since
// the process started or the lease was lost, and confirms each a majority
// vouches for. It reports whether all are confirmed.
func (h *Heartbeat) confirm(ctx context.Context) bool {
	pending, err := h.Volumes.Unconfirmed(ctx)
	if err != nil {
		h.Log.Warn("listing the primaries to confirm failed; retrying at the next beat", "error", err)
		return false
	}
	ok := h.vouched(ctx, pending)
	for id, gen := range pending {
		if ok[id] {
			h.Volumes.Confirm(id, gen)
		}
	}
	return len(ok) == len(pending)
}

// vouched asks the peers, in one round, about volumes (ID -> this
// node's generation) and returns those a majority confirms current. A
// copy for which a newer generation was promised, by this node or by a
// peer that answered, is made read-only at once, mounted or not: another
// copy may be the primary now (docs/safety.md, I4).
func (h *Heartbeat) vouched(ctx context.Context, volumes map[string]uint64) map[string]bool {
	ok := map[string]bool{}
	if len(volumes) == 0 {
		return ok
	}
	ids := make([]string, 0, len(volumes))
	for id := range volumes {
		ids = append(ids, id)
	}
	answers := h.askPromises(ctx, ids)
	for id, gen := range volumes {
		current, newer := h.confirmed(ctx, id, gen, answers)
		if current {
			ok[id] = true
		}
		if newer > gen {
			h.fenceSuperseded(ctx, id, gen, newer)
		}
	}
	return ok
}

// fenceSuperseded makes this node's copy of volume id read-only: newer
// was promised elsewhere. A failure is retried at the next beat: the copy
// stays unconfirmed (or fenced), so it is asked about again.
func (h *Heartbeat) fenceSuperseded(ctx context.Context, id string, gen, newer uint64) {
	fenced, err := h.Volumes.FenceSuperseded(ctx, id, gen, newer)
	switch {
	case err != nil:
		h.Log.Error("making the copy read-only failed although a newer generation was promised elsewhere; retrying at the next beat",
			"volume_id", id, "generation", gen, "promised", newer, "error", err)
	case fenced:
		h.Log.Warn("a newer generation of the volume was promised elsewhere: this node's copy is made read-only and neither made writable nor staged; the controller settles it",
			"volume_id", id, "generation", gen, "promised", newer)
	}
}

// confirmed reports whether a majority of the nodes its lease counts
// (this node included, unless witnesses count and it is not one)
// answered and none of them promised a generation above gen: any
// failover needed a majority's promise above it, and two majorities of
// one set share a node.
// newer is the highest generation above gen that this node or a peer
// that answered promised, 0 if none.
func (h *Heartbeat) confirmed(ctx context.Context, id string, gen uint64, answers []map[string]uint64) (current bool, newer uint64) {
	own, err := h.Volumes.Promised(ctx, id)
	if own > gen {
		newer = own
	}
	self, total := h.Monitor.votes(h.NodeID)
	agreed := 0
	if self {
		agreed = 1
	}
	for _, a := range answers {
		if a[id] > gen {
			newer = max(newer, a[id])
			continue
		}
		agreed++
	}
	return err == nil && newer == 0 && agreed > total/2, newer
}

// askPromises asks every peer that answered, of every domain, for its
// promises of ids; it returns the answers of those that answered, one
// per node (by the node ID its certificate names), however many of its
// addresses are listed.
func (h *Heartbeat) askPromises(ctx context.Context, ids []string) []map[string]uint64 {
	var (
		mu     sync.Mutex
		byNode = map[string]map[string]uint64{}
	)
	h.fanOut(ctx, h.Monitor.others(h.NodeID), func(ctx context.Context, addr string) {
		// Only the node that answered the ping at addr may vouch there.
		node := h.Monitor.nodeOf(addr)
		answer, err := h.promisesOf(ctx, addr, node, ids)
		if err != nil || node == "" || node == h.NodeID {
			return
		}
		mu.Lock()
		byNode[node] = answer
		mu.Unlock()
	})
	return slices.Collect(maps.Values(byNode))
}

// promisesOf asks one peer for its promises of ids, MaxPromiseIDs at a
// time. A peer counts only with its answer about every ID: one missing
// would read as "promised nothing newer" (confirmed).
func (h *Heartbeat) promisesOf(ctx context.Context, addr, nodeID string, ids []string) (map[string]uint64, error) {
	out := make(map[string]uint64, len(ids))
	for len(ids) > 0 {
		chunk := ids[:min(len(ids), MaxPromiseIDs)]
		ids = ids[len(chunk):]
		answer, err := h.Client.Promises(ctx, addr, nodeID, chunk)
		if err != nil {
			return nil, err
		}
		for id, g := range answer {
			out[id] = g
		}
	}
	return out, nil
}

// Close closes the connections to the peers; Run does it when it ends.
func (h *Heartbeat) Close() { h.Client.Close() }

// Server answers the peers' pings and questions about promises (served
// over gRPC by agent.PeersServer), and records each caller as heard in
// Monitor (Monitor.Called) before it answers: a caller that counts this
// answer for its lease was then recorded here no earlier than it asked
// (docs/safety.md, "Why the lease and failover majorities intersect").
type Server struct {
	NodeID, Domain string
	// WitnessDigest is the digest of this node's witness set ("" for
	// none: every node counts). A ping from a node that counts another
	// set is refused: its lease would be counted over a set this node's
	// failovers are not.
	WitnessDigest string
	Promised      func(ctx context.Context, id string) (uint64, error)
	// Monitor, when set, records the callers.
	Monitor *Monitor
}

// called records caller, the node its verified certificate names ("" for
// none: not recorded), in Monitor.
func (s *Server) called(caller string) {
	if s.Monitor != nil && caller != "" && caller != s.NodeID {
		s.Monitor.Called(caller)
	}
}

// Ping answers caller's ping: this node's ID and failure domain. A
// retired caller is refused, and so is one whose witness set
// (witnessDigest) is not this node's: an answer would count for its
// lease.
func (s *Server) Ping(caller, witnessDigest string) (nodeID, domain string, err error) {
	s.called(caller)
	if err := s.refuseRetired(caller); err != nil {
		return "", "", err
	}
	if witnessDigest != s.WitnessDigest {
		return "", "", errdefs.Wrap(errdefs.ErrFailedPrecondition, "node %s counts the witness set %s and node %s the set %s: list the same witnesses on every node (docs/operations.md, \"Witnesses\"); until then node %s's answers count for nothing there",
			s.NodeID, witnesses.Describe(nil, s.WitnessDigest), caller, witnesses.Describe(nil, witnessDigest), s.NodeID)
	}
	return s.NodeID, s.Domain, nil
}

// refuseRetired refuses a call from a node this node retired (Monitor.
// Retire). It is still recorded as heard (called): that only delays the
// failovers this node grants away from it.
func (s *Server) refuseRetired(caller string) error {
	if s.Monitor == nil || caller == "" || !s.Monitor.Retired(caller) {
		return nil
	}
	return errdefs.Wrap(errdefs.ErrPermissionDenied, "node %s was retired on node %s (zfs-controller retire-node) and counts for nothing here; a node that returns rejoins once every node restarted with it in their peers (docs/operations.md)", caller, s.NodeID)
}

// MaxPromiseIDs bounds the volumes one Promises request asks about: each
// is a read of the pool, and a peer must not make one call cost without
// bound. It is above the primaries a node usually holds (the heartbeat
// asks about its unconfirmed primaries, in chunks of this size).
const MaxPromiseIDs = 1000

// Promises answers caller with the highest generation this node promised
// of each of ids.
func (s *Server) Promises(ctx context.Context, caller string, ids []string) (map[string]uint64, error) {
	if n := len(ids); n > MaxPromiseIDs {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "a Promises request asks about %d volumes, more than %d: ask in chunks", n, MaxPromiseIDs)
	}
	s.called(caller)
	if err := s.refuseRetired(caller); err != nil {
		return nil, err
	}
	out := make(map[string]uint64, len(ids))
	for _, id := range ids {
		g, err := s.Promised(ctx, id)
		if err != nil {
			return nil, err
		}
		out[id] = g
	}
	return out, nil
}
