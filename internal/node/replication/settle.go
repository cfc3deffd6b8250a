package replication

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
)

// What a receive leaves on the replica once its stream is in: the
// snapshot it brought, the labels that follow the sender's, and, after
// the answer to the sender, the base holds and pruning of tidy.

// settleReceived makes a received stream the copy (a replacement takes
// the old replica's place; an incremental's labels follow the sender's)
// and returns the newest snapshot it now holds.
func (r *Receiver) settleReceived(ctx context.Context, fs string, h Header, into intoTarget, log hclog.Logger) (zfs.Snap, error) {
	if into.replacing {
		if err := r.replace(ctx, fs, into.target, r.fullLabels(h), log); err != nil {
			return zfs.Snap{}, err
		}
	}
	last, err := r.received(ctx, fs, h)
	if err != nil {
		return zfs.Snap{}, err
	}
	if h.Kind != KindFull {
		if err := r.relabel(ctx, fs, r.labels(h)); err != nil {
			return zfs.Snap{}, err
		}
	}
	return last, nil
}

// received reads the snapshot a receive brought: the one its header
// names, or for a resumed stream, whose header does not, the newest.
func (r *Receiver) received(ctx context.Context, fs string, h Header) (zfs.Snap, error) {
	if h.Kind != KindResume {
		name := fs + "@" + h.Snapshot
		guid, err := r.z.Property(ctx, name, "guid")
		if err != nil {
			return zfs.Snap{}, fmt.Errorf("reading the received snapshot %s: %w", name, err)
		}
		n, err := strconv.ParseUint(guid, 10, 64)
		if err != nil {
			return zfs.Snap{}, fmt.Errorf("reading the received snapshot %s: guid %q: %w", name, guid, err)
		}
		return zfs.Snap{Name: name, GUID: n}, nil
	}
	snaps, err := r.z.Snapshots(ctx, fs)
	if err != nil || len(snaps) == 0 {
		return zfs.Snap{}, fmt.Errorf("reading the received snapshot of %s: %v", fs, err)
	}
	return snaps[len(snaps)-1], nil
}

// relabel updates a replica's labels (a new generation, parameters or
// capacity) when they differ: a property change waits for a sync, which
// the answer to the sender, and so a move, would wait for.
func (r *Receiver) relabel(ctx context.Context, fs string, labels map[string]string) error {
	keys := slices.Collect(maps.Keys(labels))
	current, err := r.z.Properties(ctx, fs, keys...)
	if err != nil {
		return fmt.Errorf("reading the labels of replica %s: %w", fs, err)
	}
	if maps.Equal(current, labels) {
		return nil
	}
	if err := r.z.SetProperties(ctx, fs, labels); err != nil {
		return fmt.Errorf("labelling replica %s: %w", fs, err)
	}
	return nil
}

// tidyDelay is how long the receiver waits before tidying after a
// receive. A move promotes the replica right after its last receive, and
// each of tidy's holds, releases and destroys is a change the pool syncs:
// running at once, they made the promotion wait for several syncs instead
// of two (336 against about 130 ms in the guest).
const tidyDelay = time.Second

// tidy runs after a successful receive, without delaying the sender (a
// move waits for it), and after tidyDelay. It holds the snapshot just
// received as the new base before anything releases the old one, so some
// common snapshot is always held. Its peer tags become the sender's
// (mirrorPeerBases): those it kept as a primary (before a move demoted
// it) go, the sender's other replicas' bases are held. Then old
// replication snapshots are pruned; held bases always stay. A replica
// promoted meanwhile is left alone: it is the primary's to tidy.
func (r *Receiver) tidy(volumeID, fs, received string, peerBases map[uint64][]string, log hclog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), tidyTimeout)
	defer cancel()
	select {
	case <-ctx.Done():
		return
	case <-time.After(tidyDelay):
	}
	unlock, err := r.locks.Lock(ctx, volumeID, "tidy after a receive")
	if err != nil {
		return // busy with another receive: it holds its own base
	}
	defer unlock()
	if role, err := r.z.Property(ctx, fs, copyrecord.PropRole); err != nil || role != RoleReplica {
		return
	}
	if err := r.z.Hold(ctx, received, BaseHoldTag); err != nil {
		log.Warn("holding the new base failed; the old base stays held until a receive holds a newer one", "snapshot", received, "error", err)
		return
	}
	if err := mirrorPeerBases(ctx, r.z, fs, peerBases); err != nil {
		log.Warn("holding the sender's peer bases failed; next receive retries", "error", err)
	}
	dropOldBases(ctx, r.z, fs, r.keep, nil, "receive", log)
}

// holdNewestBases does for every replica what tidy does after a receive,
// for the receives whose tidy a stop cut off (it runs a second after the
// answer): without it, the previous base kept its hold until the
// volume's next receive, and a CSI snapshot deleted meanwhile was only
// marked for a deferred destroy, its space kept. A replica's newest
// snapshot is the one it received last, which its sender holds as this
// node's base, so it is held before the older holds go. A replica it
// cannot tidy is logged and left for its next receive.
func (r *Receiver) holdNewestBases(ctx context.Context) error {
	children, err := r.z.ChildProperties(ctx, r.root, copyrecord.PropRole)
	if err != nil {
		return fmt.Errorf("listing %s: %w", r.root, err)
	}
	for _, ch := range children {
		id := ch.Name[strings.LastIndexByte(ch.Name, '/')+1:]
		if ch.Props[copyrecord.PropRole] != RoleReplica || !contract.IsVolumeID(id) {
			continue
		}
		if err := r.holdNewestBase(ctx, id, ch.Name); err != nil {
			r.log.Warn("moving the base hold to the replica's newest snapshot failed; its next receive does", "volume_id", id, "error", err)
		}
	}
	return nil
}

func (r *Receiver) holdNewestBase(ctx context.Context, id, fs string) error {
	unlock, err := r.locks.Lock(ctx, id, "holding the newest base")
	if err != nil {
		return err
	}
	defer unlock()
	snaps, err := r.z.Snapshots(ctx, fs) // oldest first
	if err != nil || len(snaps) == 0 {
		return err
	}
	holds, err := r.z.Holds(ctx, fs)
	if err != nil {
		return err
	}
	newest := snaps[len(snaps)-1].Name
	if !slices.Contains(holds[newest], BaseHoldTag) {
		if err := r.z.Hold(ctx, newest, BaseHoldTag); err != nil && !errors.Is(err, zfs.ErrExists) {
			return err
		}
	}
	return releaseSuperseded(ctx, r.z, fs)
}

// maxPeerBases bounds the peer bases a receiver holds for one volume: a
// volume has at most a few replicas, and each entry pins a snapshot here.
const maxPeerBases = 32

// peerBases reads the header's peer bases: GUID to the peers whose base
// the sender holds it as, leaving out this node and any node ID that is
// not one (it becomes part of a hold tag here), and any beyond
// maxPeerBases.
func (r *Receiver) peerBases(h Header) map[uint64][]string {
	out := map[uint64][]string{}
	for i, b := range h.PeerBases {
		if i >= maxPeerBases {
			break
		}
		if id := b.NodeID; id != r.nodeID && isReceiverKey(id) {
			out[b.GUID] = append(out[b.GUID], id)
		}
	}
	return out
}

// mirrorPeerBases makes the holds of a replica's peer tags those of its
// sender (docs/replication.md, "Replicas share a base"): each snapshot
// the sender holds as a peer's base, and this replica has, is held here
// with that peer's tag, and no other snapshot keeps a peer tag; nor does
// any keep a streamed tag, which only a primary's pushes need. Promoted,
// the replica then keeps what every other replica shares with it, and its
// first push to each goes on incrementally from there. The holds are made
// before any is released.
func mirrorPeerBases(ctx context.Context, z Pool, fs string, peerBases map[uint64][]string) error {
	snaps, err := z.Snapshots(ctx, fs)
	if err != nil {
		return err
	}
	holds, err := z.Holds(ctx, fs)
	if err != nil {
		return fmt.Errorf("listing holds on %s: %w", fs, err)
	}
	want := map[string]map[string]bool{} // snapshot -> peer tags
	for _, s := range snaps {
		for _, peer := range peerBases[s.GUID] {
			if want[s.Name] == nil {
				want[s.Name] = map[string]bool{}
			}
			want[s.Name][peerTag(peer)] = true
		}
	}
	for snap, tags := range want {
		for tag := range tags {
			if !slices.Contains(holds[snap], tag) {
				if err := z.Hold(ctx, snap, tag); err != nil && !errors.Is(err, zfs.ErrNotFound) {
					return fmt.Errorf("holding %s with %s: %w", snap, tag, err)
				}
			}
		}
	}
	for snap, tags := range holds {
		for _, tag := range tags {
			if isStreamedTag(tag) || isPeerTag(tag) && !want[snap][tag] {
				if err := z.Release(ctx, snap, tag); err != nil && !errors.Is(err, zfs.ErrNotFound) {
					return fmt.Errorf("releasing %s on %s: %w", tag, snap, err)
				}
			}
		}
	}
	return nil
}

// fullLabels are a replica's labels with its volume ID, which a full
// receive sets once.
func (r *Receiver) fullLabels(h Header) map[string]string {
	labels := r.labels(h)
	labels[copyrecord.PropVolumeID] = h.VolumeID
	labels[copyrecord.PropReceivedFrom] = h.SourceNodeID
	return labels
}

// labels are the properties a replica carries so that it can become the
// primary (identity, generation, parameters and capacity), and its quota:
// the primary's capacity, so that the replica shows what it may grow to,
// and a promoted copy has its quota from the first moment.
func (r *Receiver) labels(h Header) map[string]string {
	labels := map[string]string{
		copyrecord.PropRole:       RoleReplica,
		copyrecord.PropName:       h.VolumeName,
		copyrecord.PropGeneration: strconv.FormatUint(h.Generation, 10),
		// What the replica's history holds is what its sender's did:
		// a planned move promoting it keeps the value.
		copyrecord.PropHistoryFrom: strconv.FormatUint(copyrecord.BoundHistoryFrom(h.HistoryFrom, h.Generation), 10),
		copyrecord.PropParameters:  copyrecord.EncodeParameters(h.Parameters),
		copyrecord.PropCapacity:    strconv.FormatUint(h.CapacityBytes, 10),
	}
	if r.QuotaProperty != "" && h.CapacityBytes > 0 {
		labels[r.QuotaProperty] = strconv.FormatUint(h.CapacityBytes, 10)
	}
	return labels
}
