package replication

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// A push to a backup target (docs/backups.md) is a push like any other
// (the volume's transfer, its snapshot under the copy's lock, resume
// tokens, the bandwidth limit, a base held per receiver) with three
// differences: it goes only to a target this node's operator configured,
// by name, reached as a target (TLS name tlsconfig.BackupServerName);
// its plan never asks the target to roll back or replace (planBackup);
// and it carries no bridges (the target keeps one backup per push, not
// the volume's CSI snapshots or its replicas' bases).

// backupKeyPrefix starts the name by which a target is known among a
// volume's receivers here: in base hold tags (zfs-nomad-base-backup:NAME),
// what was sent to whom, and the peer bases told to replicas. A node ID
// never holds a colon, so no target's key is a node's.
const backupKeyPrefix = "backup:"

// backupKey is target's key among the receivers.
func backupKey(target string) string { return backupKeyPrefix + target }

// isReceiverKey tells whether key names a receiver of a volume's pushes:
// a node, or a backup target.
func isReceiverKey(key string) bool {
	return contract.IsNodeID(key) || (strings.HasPrefix(key, backupKeyPrefix) && contract.IsNodeID(strings.TrimPrefix(key, backupKeyPrefix)))
}

// UseTargets gives the pusher the backup targets it may push to, by name
// (the operator's backup_targets: name to host:port), and how it reaches
// them.
func (p *Pusher) UseTargets(targets map[string]string, peers TargetPeers) {
	p.targets, p.targetPeers = targets, peers
}

// PushBackup pushes volumeID to the backup target named target, as Push
// does to a peer; purpose says why, in Transfers.
func (p *Pusher) PushBackup(ctx context.Context, volumeID, target, purpose string, interval time.Duration, report func(Progress)) (Progress, error) {
	addr, ok := p.targets[target]
	if !ok || p.targetPeers == nil {
		return Progress{}, errdefs.Wrap(errdefs.ErrNotFound, "node %s knows no backup target %q: add it to its backup_targets (docs/backups.md)", p.nodeID, target)
	}
	job := pushJob{volumeID: volumeID, addr: addr, nodeID: target, purpose: purpose, interval: interval, report: report, backup: true,
		log: p.log.With("volume_id", volumeID, "backup_target", target, "peer", addr)}
	prog, err := p.run(ctx, job, "a backup to "+target)
	p.backupEnded(volumeID, target, err)
	return prog, err
}

// BackupFailure is the last failed backup of a volume to a target, kept
// until a backup there succeeds: why a backup is late, for the status.
type BackupFailure struct {
	VolumeID, Target, Err string
	At                    time.Time
}

// maxBackupFailures bounds the failures kept (one per volume and
// target): beyond it the oldest goes.
const maxBackupFailures = 10000

// backupEnded records a backup's failure, or forgets the last one when
// it succeeded. A busy volume (Aborted: another push of it runs) or a
// cancelled call is no failure of the backup.
func (p *Pusher) backupEnded(volumeID, target string, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	key := volumeID + "\x00" + target
	switch {
	case err == nil:
		delete(p.backupFailures, key)
		return
	case errors.Is(err, errdefs.ErrAborted), errors.Is(err, context.Canceled):
		return
	}
	if p.backupFailures == nil {
		p.backupFailures = map[string]BackupFailure{}
	}
	if _, ok := p.backupFailures[key]; !ok && len(p.backupFailures) >= maxBackupFailures {
		oldest := ""
		for k, f := range p.backupFailures {
			if oldest == "" || f.At.Before(p.backupFailures[oldest].At) {
				oldest = k
			}
		}
		delete(p.backupFailures, oldest)
	}
	p.backupFailures[key] = BackupFailure{VolumeID: volumeID, Target: target, Err: err.Error(), At: p.now()}
}

// BackupFailures are the last failed backup of each volume to each
// target, of those that have not succeeded since, oldest first.
func (p *Pusher) BackupFailures() []BackupFailure {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := slices.Collect(maps.Values(p.backupFailures))
	slices.SortFunc(out, func(a, b BackupFailure) int { return a.At.Compare(b.At) })
	return out
}

// planBackup decides what a push to a backup target sends: an
// incremental from the target's newest backup when this copy holds it;
// otherwise the whole snapshot, with which the target starts a new chain
// beside the one it holds (a volume failed over to a copy that never
// had the newest backup). An interrupted stream resumes when its token
// fits this copy.
func (p *Pusher) planBackup(ctx context.Context, fs string, state ReplicaState, raw bool, snap string, snapErr error,
	listed func() ([]zfs.Snap, error), log hclog.Logger) (sendPlan, error) {
	if state.Exists && state.Role != contract.RoleBackup {
		return sendPlan{}, errdefs.Wrap(errdefs.ErrFailedPrecondition, "the backup target holds %s as %q, not as backups", fs, state.Role)
	}
	if resume, ok := p.resumePlan(ctx, fs, state, raw, log); ok {
		return resume, nil
	}
	if snapErr != nil {
		return sendPlan{}, fmt.Errorf("taking the backup's snapshot: %w", snapErr)
	}
	local, err := listed()
	if err != nil {
		return sendPlan{}, err
	}
	var newest uint64
	if n := len(state.SnapshotGUIDs); n > 0 {
		newest = state.SnapshotGUIDs[n-1]
	}
	base, guid := "", uint64(0)
	for _, s := range local {
		switch {
		case s.Name == snap:
			guid = s.GUID
		case newest != 0 && s.GUID == newest:
			base = s.Name
		}
	}
	if guid == 0 {
		if guid, err = p.guidOf(ctx, snap); err != nil {
			return sendPlan{}, fmt.Errorf("reading the backup's snapshot %s after it was taken: %w", snap, err)
		}
	}
	if base != "" {
		return sendPlan{prog: Progress{Kind: KindIncremental, Snapshot: snap, Base: base}, spec: zfs.SendSpec{Snapshot: snap, Base: base, Raw: raw}, guid: guid}, nil
	}
	if newest != 0 {
		log.Warn("this copy lacks the target's newest backup of the volume: sending in full; the target keeps its backups in an earlier chain")
	}
	return sendPlan{prog: Progress{Kind: KindFull, Snapshot: snap}, spec: zfs.SendSpec{Snapshot: snap, Raw: raw}, guid: guid}, nil
}
