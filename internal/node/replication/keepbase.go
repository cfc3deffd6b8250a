package replication

import (
	"context"
	"errors"
	"slices"

	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
)

// A send's base outlives the send. A push's base is the newest snapshot
// its receiver shares with this node, which this node keeps: held with
// the receiver's tag by the tidy after the push that sent it, spared
// until that tidy has held it (sentTo), or spared as one the receiver
// may hold beyond its base (mayHold). A backup's base is the target's
// newest backup, held the same way, unless the operator deleted the
// target's newer backups: then it is an older snapshot that nothing here
// holds or spares, and the tidy after another push of the volume may
// prune it under the send, which would fail. So such a base is looked
// for again under the copy's lock, which every prune holds, and spared
// until the push ends (keepBase): a prune that came first removed it,
// and the backup goes in full; a prune that comes later spares it.

// keepBackupBase keeps the base of plan, a backup's, for the push to
// receiver, unless receiver's tag holds it or it was sent to receiver
// and its tidy has not held it yet. Without its base left, the plan
// becomes a full send. release ends the sparing; nil when nothing is
// spared.
func (p *Pusher) keepBackupBase(ctx context.Context, job pushJob, plan sendPlan, held func() (map[string][]string, error), receiver string) (_ sendPlan, release func(), err error) {
	base := plan.spec.Base
	if plan.prog.Kind != KindIncremental || base == "" {
		return plan, nil, nil
	}
	if tags, err := held(); err == nil && slices.Contains(tags[base], peerTag(receiver)) || p.sentTo(job.volumeID)[receiver] == base {
		return plan, nil, nil
	}
	release, err = p.keepBase(ctx, job.volumeID, base)
	if errors.Is(err, zfs.ErrNotFound) {
		job.log.Warn("the target's newest backup of the volume was pruned here since the push planned from it: sending in full; the target keeps its backups in an earlier chain", "base", base)
		plan.prog.Kind, plan.prog.Base, plan.spec.Base = KindFull, "", ""
		return plan, nil, nil
	}
	return plan, release, err
}

// keepBase spares base, a snapshot of volumeID, from every prune until
// release is called, once it has found it under the copy's lock; it
// fails with zfs.ErrNotFound when the snapshot is gone. A push runs as
// its volume's one transfer (copylock), so a volume keeps one base at a
// time.
func (p *Pusher) keepBase(ctx context.Context, volumeID, base string) (release func(), err error) {
	unlock, err := p.locks.Lock(ctx, volumeID, "keeping a backup's base for its send")
	if err != nil {
		return nil, err
	}
	defer unlock()
	if _, err := p.guidOf(ctx, base); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.kept == nil {
		p.kept = map[string]string{}
	}
	p.kept[volumeID] = base
	return func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.kept[volumeID] == base {
			delete(p.kept, volumeID)
		}
	}, nil
}

// keptBase is the snapshot of volumeID that its running backup keeps as
// its base, if any: pruning spares it.
func (p *Pusher) keptBase(volumeID string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.kept[volumeID]
}
