package replication

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
)

// A restarted process knows a receiver only by its holds here: the first
// push of a volume spares, for every receiver with a tag here, the
// replication snapshots after it (seedUnknown). A receiver that carries
// no tag here yet (its first push, a full stream, has not succeeded and
// been tidied) would be known to no seed, and a snapshot it came to hold
// (a bridge before a later stream broke, a stream whose answer was lost)
// would be pruned after a restart: the receiver's replica would then
// refuse every push until the volume's next move. So before the first
// replication snapshot of a push streams to such a receiver, it is held
// with the receiver's streamed tag: everything the receiver may hold of
// this node's is that snapshot or one after it, which a seed spares. The
// tidy after a successful push to the receiver releases the tag (its base
// tag holds from then on); an unsent snapshot drops it. One hold per
// receiver's first push: a receiver that keeps failing pins one snapshot
// here, and the in-process bound (maxStreamed) keeps the rest.

// markStream holds snapshot of volumeID, about to stream to receiver,
// with the receiver's streamed tag, under the copy's lock like every
// hold, unless known says the receiver has a tag here already or
// snapshot is not a replication snapshot. It returns whether the
// receiver is known afterwards.
func (p *Pusher) markStream(ctx context.Context, known bool, volumeID, receiver, snapshot string) (bool, error) {
	if known {
		return true, nil
	}
	if _, ok := contract.ReplicationSnapshotTime(snapshot); !ok {
		return false, nil
	}
	unlock, err := p.locks.Lock(ctx, volumeID, "marking the first snapshot streamed to a receiver")
	if err != nil {
		return false, err
	}
	defer unlock()
	if err := p.z.Hold(ctx, snapshot, streamedTag(receiver)); err != nil && !errors.Is(err, zfs.ErrExists) {
		return false, fmt.Errorf("holding %s, the first snapshot streamed to %s, before its stream starts: %w", snapshot, receiver, err)
	}
	return true, nil
}

// receiverKnown tells whether a snapshot here carries a tag of
// receiver's: its base's or its streamed one. tags failing to list
// counts as unknown (one hold more).
func receiverKnown(tags func() (map[string][]string, error), receiver string) bool {
	held, err := tags()
	if err != nil {
		return false
	}
	for _, ts := range held {
		if slices.Contains(receiversHeldFor(ts), receiver) {
			return true
		}
	}
	return false
}

// receiversHeldFor returns the receivers whose tags, base or streamed,
// are among tags: a seed spares what follows them.
func receiversHeldFor(tags []string) []string {
	receivers := peersHeldFor(tags)
	for _, t := range tags {
		if isStreamedTag(t) {
			receivers = append(receivers, t[len(streamedTag("")):])
		}
	}
	return receivers
}

// releaseStreamed releases the streamed tags on snapshot, one of fs that
// a push took and did not send, before it is destroyed.
func (p *Pusher) releaseStreamed(ctx context.Context, fs, snapshot string) error {
	holds, err := p.z.Holds(ctx, fs)
	if err != nil {
		return err
	}
	for _, tag := range holds[snapshot] {
		if isStreamedTag(tag) {
			if err := p.z.Release(ctx, snapshot, tag); err != nil && !errors.Is(err, zfs.ErrNotFound) {
				return err
			}
		}
	}
	return nil
}
