package replication

import (
	"slices"

	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
)

// A primary never prunes a snapshot a replica may hold beyond the base
// the primary knows it holds. A receiver refuses an incremental that
// would roll back snapshots of its replica's own generation (nothing a
// peer sends rolls back what no newer promised generation supersedes),
// and a full stream into a replica of the same generation: a replica
// whose newest snapshot its primary has pruned is refused every push
// until the volume's next move or failover.
//
// A receiver comes to hold a snapshot its sender does not count as its
// base in two ways: a bridge that arrived before a later stream of the
// same push failed, and a stream whose answer was lost after the receiver
// took it. So:
//   - every snapshot whose stream to a receiver starts is spared until a
//     push to that receiver succeeds: the receiver's newest snapshot is
//     then the push's, which the tidy holds;
//   - once a push has read what the receiver holds, only the receiver's
//     newest and the later ones this process streamed stay spared (at
//     most maxStreamed of the later ones: a receiver that keeps failing
//     pins no snapshot per attempt);
//   - a process knows nothing of its predecessor's streams: the first
//     push of a volume in a process spares, for every receiver whose base
//     this node holds, every replication snapshot after that base, until
//     a push reads what that receiver holds. No clock decides which
//     snapshot is older: the listing's order (creation) does.
//
// A move's source, which the move demotes to a replica holding the final
// snapshot, is kept by the promotion (volume.Manager.holdSourcesBase) and
// by a fenced primary sending only to its move's target (Pusher.snapshot).

// maxStreamed bounds the snapshots spared for one receiver beyond its
// newest.
const maxStreamed = 8

// noteStreaming records, before its stream starts, that receiver may
// come to hold snapshot of volumeID.
func (p *Pusher) noteStreaming(volumeID, receiver, snapshot string) {
	if snapshot == "" { // a resumed stream: its snapshot was noted when it started
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.noteStreamingLocked(volumeID, receiver, snapshot)
}

func (p *Pusher) noteStreamingLocked(volumeID, receiver, snapshot string) {
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

// forgetStreamed drops what was noted of receiver once a push to it
// succeeded: it holds nothing newer than that push's snapshot, which
// noteSent records until the tidy holds it.
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
	for _, snaps := range p.unknown[volumeID] {
		out = append(out, snaps...)
	}
	return out
}

// learnReceiver brings what is spared of volumeID up to date for a push
// to receiver that has read the receiver's snapshots (held, oldest first)
// and this node's, with their holds: on the volume's first push in this
// process, what an earlier process may have streamed (seedUnknown); then,
// for receiver, only its newest of what was noted and the later ones this
// process streamed (at most maxStreamed): an earlier process's streams
// ended with it. An older one is no base the receiver needs, and one this
// node no longer has cannot be spared.
func (p *Pusher) learnReceiver(volumeID, receiver string, listed func() ([]zfs.Snap, error), holds func() (map[string][]string, error), held []uint64) {
	local, err := listed()
	if err != nil {
		return
	}
	tags, err := holds()
	if err != nil {
		return
	}
	newest := -1 // the receiver's newest snapshot, in local
	if len(held) > 0 {
		newest = slices.IndexFunc(local, func(s zfs.Snap) bool { return s.GUID == held[len(held)-1] })
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seedUnknown(volumeID, local, tags)
	noted, unknown := p.streamed[volumeID][receiver], p.unknown[volumeID][receiver]
	delete(p.unknown[volumeID], receiver)
	var kept []string
	if newest >= 0 && (slices.Contains(noted, local[newest].Name) || slices.Contains(unknown, local[newest].Name)) {
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
	if p.streamed == nil {
		p.streamed = map[string]map[string][]string{}
	}
	if p.streamed[volumeID] == nil {
		p.streamed[volumeID] = map[string][]string{}
	}
	p.streamed[volumeID][receiver] = kept
}

// seedUnknown records, on the volume's first push in this process, for
// every receiver whose base this node holds, the replication snapshots
// after that base: an earlier process may have streamed any of them to
// it without an answer. Every stream of this process is noted itself,
// after this first push has seeded, so what the listing holds besides is
// an earlier process's (or a snapshot this one took and did not send:
// spared until the receiver is read, no longer). The caller holds p.mu.
func (p *Pusher) seedUnknown(volumeID string, local []zfs.Snap, tags map[string][]string) {
	if p.seeded[volumeID] {
		return
	}
	if p.seeded == nil {
		p.seeded, p.unknown = map[string]bool{}, map[string]map[string][]string{}
	}
	p.seeded[volumeID] = true
	after := map[string]bool{} // receivers whose base is behind the snapshot
	for _, s := range local {  // oldest first
		if _, ok := contract.ReplicationSnapshotTime(s.Name); ok {
			for receiver := range after {
				if p.unknown[volumeID] == nil {
					p.unknown[volumeID] = map[string][]string{}
				}
				p.unknown[volumeID][receiver] = append(p.unknown[volumeID][receiver], s.Name)
			}
		}
		for _, receiver := range receiversHeldFor(tags[s.Name]) {
			after[receiver] = true
		}
	}
}
