package replication

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// A sendPlan is what one push sends.
type sendPlan struct {
	prog Progress
	spec zfs.SendSpec
	guid uint64 // of the snapshot sent; 0 when resuming, whose header does not say
	// bridges are the streams before spec's: the peer bases the target
	// lacks (bridge).
	bridges []streamSpec
	// rollback is the newest snapshot (GUID) of the peer's replica when
	// the peer must roll its snapshots after the plan's base back; 0
	// otherwise.
	rollback uint64
	// current: the peer holds the plan's snapshot already (a fenced
	// copy's, which an earlier push sent): nothing is sent.
	current bool
}

// plan decides what to send, from what the receiver holds and what this
// primary's header says of it: an incremental from the newest common
// snapshot when there is one; a full send that replaces the replica when
// there is none and the replica is of an older generation. A replica of
// an older generation that holds snapshots after the newest common one
// gets the incremental only when this copy's history vouches for that
// generation (the receiver then rolls them back) and the receiver has
// not refused that (rollbackRefused); otherwise the full send, and the
// receiver sets the replica aside (I4).
// snap is the new replication snapshot, or snapErr why it could not be
// taken.
func (p *Pusher) plan(ctx context.Context, fs string, state ReplicaState, h Header, raw bool, snap string, snapErr error,
	listed func() ([]zfs.Snap, error), log hclog.Logger) (sendPlan, error) {
	generation := h.Generation
	if state.Exists && state.Role != RoleReplica {
		return sendPlan{}, errdefs.Wrap(errdefs.ErrFailedPrecondition, "the peer holds %s as %q, not as a replica", fs, state.Role)
	}
	if resume, ok := p.resumePlan(ctx, fs, state, raw, log); ok {
		return resume, nil
	}
	if snapErr != nil {
		return sendPlan{}, fmt.Errorf("taking the replication snapshot: %w", snapErr)
	}
	local, err := listed()
	if err != nil {
		return sendPlan{}, err
	}
	remote := map[uint64]bool{}
	for _, g := range state.SnapshotGUIDs {
		remote[g] = true
	}
	base, baseGUID, guid := "", uint64(0), uint64(0)
	for _, s := range local { // oldest first: the last match is the newest common snapshot
		switch {
		case s.Name == snap:
			guid = s.GUID
		case remote[s.GUID]:
			base, baseGUID = s.Name, s.GUID
		}
	}
	if guid == 0 {
		// Listed before it was taken: its GUID alone is read now.
		if guid, err = p.guidOf(ctx, snap); err != nil {
			return sendPlan{}, fmt.Errorf("reading the replication snapshot %s after it was taken: %w", snap, err)
		}
	}
	if remote[guid] {
		// A fenced copy's snapshot, which an earlier push sent (its
		// answer lost, or a catch-up after the final push).
		return sendPlan{prog: Progress{Kind: KindIncremental, Snapshot: snap, Base: snap}, guid: guid, current: true}, nil
	}
	remoteGUIDs := state.SnapshotGUIDs
	newerThere := len(remoteGUIDs) > 0 && remoteGUIDs[len(remoteGUIDs)-1] != baseGUID
	incremental := sendPlan{prog: Progress{Kind: KindIncremental, Snapshot: snap, Base: base}, spec: zfs.SendSpec{Snapshot: snap, Base: base, Raw: raw}, guid: guid}
	vouched := base != "" && newerThere && state.Generation < generation && state.Generation >= h.HistoryFrom
	switch {
	case vouched && p.rollbackRefused(fs, state):
		// The peer refused that rollback before: its own promise record
		// does not show this node's generation superseding them (it
		// missed the reservation). A full stream replaces the replica,
		// which the receiver sets aside (I4).
		log.Warn("the peer refused to roll back its replica's snapshots after the newest common one (its promise record holds no generation of this node's above them): sending in full; the peer sets its replica aside",
			"peer_generation", state.Generation, "history_from", h.HistoryFrom, "base", base)
	case vouched:
		// Snapshots after the newest common one, taken by a primary of
		// a generation this copy's history holds whole (a planned move
		// ended it with a final snapshot this copy has): earlier
		// states, nothing this copy lacks. The receiver rolls them back
		// only if its promise record agrees (Receiver.rollBackTo).
		log.Info("the peer's replica has snapshots of an earlier generation after the newest common one; this copy's history holds them: the peer rolls them back",
			"peer_generation", state.Generation, "history_from", h.HistoryFrom, "base", base)
		incremental.rollback = remoteGUIDs[len(remoteGUIDs)-1]
		return incremental, nil
	case base != "" && newerThere && state.Generation < generation:
		// Taken by an older generation's primary this copy's history
		// does not vouch for (it was promoted by a failover): maybe
		// writes this one never had. A full stream replaces the
		// replica, which the receiver sets aside (I4).
		log.Warn("the peer's replica has snapshots of an older generation that this node lacks: sending in full; the peer sets its replica aside",
			"peer_generation", state.Generation, "history_from", h.HistoryFrom)
	case base != "":
		return incremental, nil
	case state.Exists && len(remoteGUIDs) == 0:
		// A first receive that was interrupted and not resumed: the
		// peer's copy holds nothing yet; it discards the partial state.
	case state.Exists && state.Generation < generation:
		// replaced below
	case state.Exists:
		return sendPlan{}, errdefs.Wrap(errdefs.ErrFailedPrecondition, "the peer's replica of %s shares no snapshot with this node; remove it for a full send", fs)
	}
	return sendPlan{prog: Progress{Kind: KindFull, Snapshot: snap}, spec: zfs.SendSpec{Snapshot: snap, Raw: raw}, guid: guid}, nil
}

// resumePlan is the plan that resumes the receiver's interrupted receive,
// when it has one whose token fits this copy. Otherwise a fresh stream
// follows, and the receiver discards its partial receive when it gets one
// that is not a resume.
func (p *Pusher) resumePlan(ctx context.Context, fs string, state ReplicaState, raw bool, log hclog.Logger) (sendPlan, bool) {
	token := state.ResumeToken
	if token == "" {
		return sendPlan{}, false
	}
	if err := p.checkResumeToken(ctx, fs, token, raw); err != nil {
		log.Warn("not resuming the receiver's interrupted receive: its resume token does not fit; sending afresh", "error", err)
		return sendPlan{}, false
	}
	return sendPlan{prog: Progress{Kind: KindResume}, spec: zfs.SendSpec{ResumeToken: token}}, true
}

// A receiver rolls its replica's snapshots after a push's base back only
// when its own promise record holds a generation above the replica's
// promised to the pushing node (Receiver.rollBackTo). One that missed the
// reservation (it was away while a majority granted it) refuses with
// FailedPrecondition, and every push planned alike would be refused
// until the volume's next reservation reached it. So the refusal is
// remembered, with the replica's newest snapshot, and the next push to
// that replica sends in full: the receiver sets the old replica aside
// (retire) and holds a current one again.

// rollbackRefused reports whether the peer of state refused to roll its
// replica of fs back while the replica's newest snapshot was what it is
// now.
func (p *Pusher) rollbackRefused(fs string, state ReplicaState) bool {
	guids := state.SnapshotGUIDs
	if len(guids) == 0 {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	newest, ok := p.refused[refusedKey(fs, state.NodeID)]
	return ok && newest == guids[len(guids)-1]
}

// noteRollback records how a push of fs to peer ended: a refusal
// (FailedPrecondition) of a plan that had the peer roll its replica back
// makes the next push to it full; a push that succeeded clears it.
func (p *Pusher) noteRollback(fs, peer string, plan sendPlan, err error) {
	key := refusedKey(fs, peer)
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case err == nil:
		delete(p.refused, key)
	case plan.rollback != 0 && errors.Is(err, errdefs.ErrFailedPrecondition):
		if p.refused == nil {
			p.refused = map[string]uint64{}
		}
		p.refused[key] = plan.rollback
	}
}

func refusedKey(fs, peer string) string { return fs + " " + peer }

// bridge makes a push carry the snapshots the target lacks that it must
// have, newer than the plan's base (all of them for a full send), oldest
// first, each sent from the one before; the plan's own snapshot follows
// from the newest. They are:
//   - the peer bases (docs/replication.md, "Replicas share a base"): the
//     snapshots this primary holds as the bases of its other replicas, so
//     that whichever replica is promoted next, every other replica shares
//     its base with it; the header tells the target which is whose;
//   - the CSI snapshots (docs/replication.md, "CSI snapshots"), so that a
//     snapshot outlives the loss of the node it was taken on and follows
//     its volume when it moves; a deleted one (deferred, kept by a clone)
//     is not sent.
//
// A resume carries none: the next push does.
func (p *Pusher) bridge(plan sendPlan, state ReplicaState, header *Header,
	listed func() ([]zfs.Snap, error), held func() (map[string][]string, error), sentTo map[string]string) (sendPlan, error) {
	holds, err := held()
	if err != nil {
		return sendPlan{}, fmt.Errorf("listing the holds of %s: %w", zfs.Parent(plan.prog.Snapshot), err)
	}
	local, err := listed()
	if err != nil {
		return sendPlan{}, err
	}
	target := state.NodeID
	remote := map[uint64]bool{}
	for _, g := range state.SnapshotGUIDs {
		remote[g] = true
	}
	bases := peerBases(local, holds, sentTo)
	delete(bases, target)
	isBase := map[string]bool{}
	header.PeerBases = nil
	for _, peer := range slices.Sorted(maps.Keys(bases)) {
		header.PeerBases = append(header.PeerBases, PeerBase{GUID: bases[peer].GUID, NodeID: peer})
		isBase[bases[peer].Name] = true
	}
	if plan.prog.Kind == KindResume {
		return plan, nil
	}
	from, after := plan.spec.Base, plan.spec.Base == ""
	for _, s := range local { // oldest first
		switch {
		case s.Name == plan.spec.Snapshot:
			plan.spec.Base = from
			return plan, nil
		case s.Name == plan.spec.Base:
			after = true
		case after && !remote[s.GUID] && (isBase[s.Name] || copyrecord.IsLiveCSISnapshot(s)):
			spec := zfs.SendSpec{Snapshot: s.Name, Base: from, Raw: plan.spec.Raw}
			plan.bridges = append(plan.bridges, streamSpec{kind: kindOf(spec), spec: spec, guid: s.GUID})
			from = s.Name
		}
	}
	// The new snapshot was listed before it was taken: it comes after
	// every listed one.
	plan.spec.Base = from
	return plan, nil
}

// kindOf names the kind of stream spec sends.
func kindOf(spec zfs.SendSpec) string {
	switch {
	case spec.ResumeToken != "":
		return KindResume
	case spec.Base == "":
		return KindFull
	}
	return KindIncremental
}

// peersHeldFor returns the peers whose base hold tags are among tags.
func peersHeldFor(tags []string) []string {
	var peers []string
	for _, t := range tags {
		if isPeerTag(t) {
			peers = append(peers, strings.TrimPrefix(t, peerTag("")))
		}
	}
	return peers
}

// peerBases returns each peer's base among local: the newest snapshot
// held with its tag, or sent to it last by this process (the hold
// follows a push's answer in the background, and a push to another peer
// right after must count it already).
func peerBases(local []zfs.Snap, holds map[string][]string, sent map[string]string) map[string]zfs.Snap {
	bases := map[string]zfs.Snap{}
	for _, s := range local { // oldest first: the newest wins
		for _, peer := range peersHeldFor(holds[s.Name]) {
			bases[peer] = s
		}
		for peer, name := range sent {
			if name == s.Name {
				bases[peer] = s
			}
		}
	}
	return bases
}

// sentTo returns, by peer, the snapshots of volumeID this process sent
// and its tidy has not held yet.
func (p *Pusher) sentTo(volumeID string) map[string]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.sent[volumeID])
}

// forgetSent drops what noteSent recorded once the hold carries it, so
// the record holds only the pushes whose tidy has not run.
func (p *Pusher) forgetSent(volumeID, peer, snapshot string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sent[volumeID][peer] == snapshot {
		delete(p.sent[volumeID], peer)
		if len(p.sent[volumeID]) == 0 {
			delete(p.sent, volumeID)
		}
	}
}

// noteSent records that peer received snapshot of volumeID.
func (p *Pusher) noteSent(volumeID, peer, snapshot string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sent == nil {
		p.sent = map[string]map[string]string{}
	}
	if p.sent[volumeID] == nil {
		p.sent[volumeID] = map[string]string{}
	}
	p.sent[volumeID][peer] = snapshot
}

// listAhead lists the snapshots of fs in the background and returns the
// wait for the listing.
func (p *Pusher) listAhead(ctx context.Context, fs string) func() ([]zfs.Snap, error) {
	return ahead(func() ([]zfs.Snap, error) { return p.z.Snapshots(ctx, fs) })
}

// ahead runs read in the background and returns the wait for its
// answer; every call of the wait returns the one answer (the plan and
// bridge both read the snapshot listing).
func ahead[T any](read func() (T, error)) func() (T, error) {
	var out T
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		out, err = read()
	}()
	return func() (T, error) {
		<-done
		return out, err
	}
}

func (p *Pusher) guidOf(ctx context.Context, snap string) (uint64, error) {
	v, err := p.z.Property(ctx, snap, "guid")
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(v, 10, 64)
}

// checkResumeToken checks what a receiver's resume token asks this node to
// send: a snapshot of this very volume that still exists, from a base of
// this volume, raw when the volume is sent only raw. The token is the
// peer's word: unchecked, it could make zfs send stream any snapshot of
// the pool, or an encrypted volume's plaintext; and one whose snapshot
// was pruned here would fail every push, and every move, for good.
func (p *Pusher) checkResumeToken(ctx context.Context, fs, token string, raw bool) error {
	info, err := p.z.ResumeToken(ctx, token)
	if err != nil {
		return err
	}
	if !strings.HasPrefix(info.ToName, fs+"@") {
		return fmt.Errorf("the token asks for %s, which is not a snapshot of %s", info.ToName, fs)
	}
	snaps, err := p.z.Snapshots(ctx, fs)
	if err != nil {
		return err
	}
	have := map[uint64]string{}
	for _, s := range snaps {
		have[s.GUID] = s.Name
	}
	if have[info.ToGUID] != info.ToName {
		return fmt.Errorf("the token asks for %s (guid %d), which this node no longer has", info.ToName, info.ToGUID)
	}
	if info.FromGUID != 0 && have[info.FromGUID] == "" {
		return fmt.Errorf("the token's incremental base (guid %d) is not a snapshot of %s here", info.FromGUID, fs)
	}
	if raw && !info.Raw {
		return fmt.Errorf("the token asks for a stream that is not raw, but %s is encrypted and leaves this node only raw", fs)
	}
	return nil
}

// sentSnapshot names the snapshot the peer says it received (guid): the
// planned one, which must be it, or for a resumed stream the one of
// fs's snapshots with that guid.
func (p *Pusher) sentSnapshot(ctx context.Context, fs string, plan sendPlan, guid uint64) (string, error) {
	if plan.guid == 0 {
		return p.snapshotByGUID(ctx, fs, guid)
	}
	if guid != plan.guid {
		return "", fmt.Errorf("the peer received snapshot guid %d, but %s (guid %d) was sent", guid, plan.prog.Snapshot, plan.guid)
	}
	return plan.prog.Snapshot, nil
}

// snapshotByGUID names fs's snapshot with guid: the one the peer says it
// received.
func (p *Pusher) snapshotByGUID(ctx context.Context, fs string, guid uint64) (string, error) {
	snaps, err := p.z.Snapshots(ctx, fs)
	if err != nil {
		return "", err
	}
	for _, s := range snaps {
		if s.GUID == guid {
			return s.Name, nil
		}
	}
	return "", fmt.Errorf("the peer received snapshot guid %s, which %s does not have", strconv.FormatUint(guid, 10), fs)
}
