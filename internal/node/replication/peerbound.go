package replication

import (
	"context"
	"sync"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// peerBound counts, by sending node, the replicas full streams created on
// this node (copyrecord.PropReceivedFrom), so that one peer cannot create
// replicas of arbitrary volume IDs until the pool is full. The counts are an upper bound kept in memory: each stream
// that may create a replica adds one before it runs, whether it succeeds
// or not, and nothing subtracts. They are taken afresh from one listing
// of the root at the first such stream and whenever a peer reaches the
// bound, so a peer is refused only when the listing shows it at the
// bound. A listing costs seconds at a thousand datasets, and streams that
// create replicas are the first of each volume: rare.
type peerBound struct {
	mu      sync.Mutex
	counted bool
	created map[string]int // by source node ID
}

// refuseOneReplicaTooMany refuses a full stream that would create a new
// replica when its sender already created MaxReplicasPerPeer of the
// replicas here.
func (r *Receiver) refuseOneReplicaTooMany(ctx context.Context, h Header, found copyRead) error {
	limit := r.MaxReplicasPerPeer
	if limit <= 0 || h.Kind != KindFull || found.err != nil || found.state.Exists {
		return nil
	}
	source := h.SourceNodeID
	r.peers.mu.Lock()
	n, counted := r.peers.created[source], r.peers.counted
	r.peers.mu.Unlock()
	if !counted || n >= limit {
		counts, err := r.replicasBySource(ctx)
		if err != nil {
			return err
		}
		r.peers.mu.Lock()
		r.peers.created, r.peers.counted = counts, true
		n = counts[source]
		r.peers.mu.Unlock()
	}
	if n >= limit {
		return errdefs.Wrap(errdefs.ErrResourceExhausted,
			"node %s holds %d replicas created by node %s's streams, the most max_replicas_per_peer (%d) allows: the replica of volume %s is refused; "+
				"delete replicas it no longer needs, or raise max_replicas_per_peer on this node if it holds that many volumes",
			r.nodeID, n, source, limit, h.VolumeID)
	}
	r.peers.mu.Lock()
	r.peers.created[source]++
	r.peers.mu.Unlock()
	return nil
}

// replicasBySource counts the replicas under the root by the node whose
// stream created them.
func (r *Receiver) replicasBySource(ctx context.Context) (map[string]int, error) {
	children, err := r.z.ChildProperties(ctx, r.root, copyrecord.PropVolumeID, copyrecord.PropRole, copyrecord.PropReceivedFrom)
	if err != nil {
		return nil, err
	}
	counts := map[string]int{}
	for _, ch := range children {
		if from := ch.Props[copyrecord.PropReceivedFrom]; from != "" && from != "-" && r.replicas.IsReplica(ch) {
			counts[from]++
		}
	}
	return counts, nil
}
