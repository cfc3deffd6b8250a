package replication

import (
	"slices"

	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
)

// A primary never prunes a snapshot a replica may hold beyond the base
// the primary knows it holds. A receiver refuses an incremental that
// would roll back snapshots of its replica's own generation (nothing a
// peer sends rolls back what no newer promised generation supersedes),
// and a full stream into a replica of the same generation: a replica
// whose newest snapshot its primary has pruned is refused every push
// until the volume's next move or failover. A receiver can come to hold
// a snapshot its sender does not count as its base in two ways: a bridge
// that arrived before a later stream of the same push failed, and a
// stream whose answer was lost after the receiver took it. So every
// snapshot whose stream to a receiver starts is spared from pruning until
// a push to that receiver succeeds: the receiver's newest snapshot is
// then the push's, which the tidy holds.
//
// The record lives in this process only: a zfs-node restarted between
// such a stream and the receiver's next successful push prunes by age
// again (docs/replication.md, "Invariants").

// maxStreamed bounds the snapshots spared for one receiver beyond its
// newest: each is a push to it that failed after its stream started, and
// a receiver that keeps failing must not pin a snapshot per attempt.
const maxStreamed = 8

// noteStreaming records, before its stream starts, that receiver may
// come to hold snapshot of volumeID.
func (p *Pusher) noteStreaming(volumeID, receiver, snapshot string) {
	if snapshot == "" { // a resumed stream: its snapshot was noted when it started
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.streamed == nil {
		p.streamed = map[string]map[string][]string{}
	}
	if p.streamed[volumeID] == nil {
		p.streamed[volumeID] = map[string][]string{}
	}
	if !slices.Contains(p.streamed[volumeID][receiver], snapshot) {
		p.streamed[volumeID][receiver] = append(p.streamed[volumeID][receiver], snapshot)
	}
}

// forgetStreamed drops what noteStreaming recorded of receiver once a
// push to it succeeded: it holds nothing newer than that push's snapshot,
// which noteSent records until the tidy holds it.
func (p *Pusher) forgetStreamed(volumeID, receiver string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.forgetStreamedLocked(volumeID, receiver)
}

func (p *Pusher) forgetStreamedLocked(volumeID, receiver string) {
	delete(p.streamed[volumeID], receiver)
	if len(p.streamed[volumeID]) == 0 {
		delete(p.streamed, volumeID)
	}
}

// mayHold returns the snapshots of volumeID some receiver may hold beyond
// the base this node holds for it: pruning spares them.
func (p *Pusher) mayHold(volumeID string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, snaps := range p.streamed[volumeID] {
		out = append(out, snaps...)
	}
	return out
}

// trimStreamed keeps, of what noteStreaming recorded of receiver, what
// may still matter once a push has read the receiver's snapshots (held,
// oldest first) and this node's (listed): the receiver's newest, and the
// newer ones, whose streams may yet land (at most maxStreamed). An older
// one is no base the receiver needs, and one this node no longer has
// cannot be spared.
func (p *Pusher) trimStreamed(volumeID, receiver string, listed func() ([]zfs.Snap, error), held []uint64) {
	local, err := listed()
	if err != nil {
		return
	}
	newest := -1 // the receiver's newest snapshot, in local
	if len(held) > 0 {
		newest = slices.IndexFunc(local, func(s zfs.Snap) bool { return s.GUID == held[len(held)-1] })
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	noted := p.streamed[volumeID][receiver]
	if len(noted) == 0 {
		return
	}
	var kept []string
	if newest >= 0 && slices.Contains(noted, local[newest].Name) {
		kept = append(kept, local[newest].Name)
	}
	var later []string
	for _, s := range local[newest+1:] {
		if slices.Contains(noted, s.Name) {
			later = append(later, s.Name)
		}
	}
	kept = append(kept, later[max(0, len(later)-maxStreamed):]...)
	if len(kept) == 0 {
		p.forgetStreamedLocked(volumeID, receiver)
		return
	}
	p.streamed[volumeID][receiver] = kept
}
