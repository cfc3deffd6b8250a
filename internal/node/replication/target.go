package replication

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copylock"
	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/node/retention"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// A backup target (zfs-node target, docs/backups.md) keeps each volume's
// backups as the snapshots of ROOT/<volume-id>, its chain: every push a
// node sends it adds one. Its rules:
//
//   - A backup is destroyed only by the volume's retention grid, and the
//     newest never (it is the base of the next push, and held as such).
//   - Nothing is rolled back or replaced: an incremental stream is
//     received only onto the chain's newest backup. A full stream for a
//     volume whose chain holds backups starts a new chain; the old one is
//     renamed ROOT/<volume-id>-chain-<nanos> and kept, pruned by the same
//     grid with the current one (a volume failed over to a copy that
//     lacked the newest backup starts one so; so does a stream a lying
//     node sends, which can never make the target drop what it holds).
//   - A backup's time is the target's own clock when it arrived
//     (copyrecord.PropReceivedAt on its snapshot), never the sender's
//     word: no stream named in the future ages the real backups out.
//   - Encrypted volumes arrive raw (the pusher sends them so): the target
//     holds no key and needs none.
//   - Received datasets are never mounted (canmount=off, zfs receive -u).

// chainInfix separates a volume ID from the time in an earlier chain's
// name: ROOT/<volume-id>-chain-<unix nanos>. Not a volume ID, so no push
// ever names it.
const chainInfix = "-chain-"

// DefaultRetention prunes the backups of a volume whose parameters name
// no grid the target accepts: the first of each of the last 24 hours, 14
// days, 8 weeks and 12 months.
var DefaultRetention = retention.Grid{
	{Every: time.Hour, Count: 24},
	{Every: 24 * time.Hour, Count: 14},
	{Every: 7 * 24 * time.Hour, Count: 8},
	{Every: 30 * 24 * time.Hour, Count: 12},
}

// TargetReceiver is a backup target's end of replication: it tells
// pushing nodes what it holds of a volume and receives their streams into
// the volume's chain.
type TargetReceiver struct {
	// Default prunes the volumes whose parameters name no grid, or one
	// beyond MaxKept; DefaultRetention when nil.
	Default retention.Grid
	// MaxKept bounds the backups a volume's own grid may keep (the sum of
	// its counts); 0: retention.MaxIntervals.
	MaxKept int

	r     *Receiver // a stream's mechanics: slots, the stall guard, zfs receive and its bound
	z     Pool
	root  string
	name  string
	locks *copylock.Locks
	now   func() time.Time
	log   hclog.Logger
	// grants are the restores granted (GrantRestore).
	grants grants
}

// NewTargetReceiver returns the receiving end of the backup target name
// whose chains live under root. maxQuota bounds every stream as a node's
// max_quota does (0: unbounded).
func NewTargetReceiver(z Pool, root, name string, maxQuota uint64, log hclog.Logger) *TargetReceiver {
	locks := &copylock.Locks{}
	r := NewReceiver(z, locks, nil, root, name, 0, log)
	r.MaxQuota = maxQuota
	return &TargetReceiver{r: r, z: z, root: root, name: name, locks: locks, now: time.Now, log: log}
}

// Name is the target's name.
func (t *TargetReceiver) Name() string { return t.name }

// SetIdleTimeout sets how long a receive waits for the sender's next
// message (DefaultIdleTimeout by default).
func (t *TargetReceiver) SetIdleTimeout(d time.Duration) { t.r.IdleTimeout = d }

// OpenZFS sets the target's OpenZFS release, named when a stream of a
// newer release is refused.
func (t *TargetReceiver) OpenZFS(release string) { t.r.OpenZFS = release }

// SetMetrics records the target's receipts in m, each a backup.
func (t *TargetReceiver) SetMetrics(m *Metrics) { t.r.Metrics = ForTarget(m) }

// UseClock sets the clock that dates the backups received (time.Now by
// default).
func (t *TargetReceiver) UseClock(now func() time.Time) { t.now = now }

// ReplicaState says what the target holds of volumeID: its current
// chain, as a push plans its stream.
func (t *TargetReceiver) ReplicaState(ctx context.Context, volumeID string) (ReplicaState, error) {
	fs, err := dataset(t.root, volumeID)
	if err != nil {
		return ReplicaState{}, err
	}
	props, err := t.z.Properties(ctx, fs, copyrecord.PropRole, "receive_resume_token")
	if errors.Is(err, zfs.ErrNotFound) {
		return ReplicaState{NodeID: t.name}, nil
	}
	if err != nil {
		return ReplicaState{}, err
	}
	state := ReplicaState{Exists: true, Role: contract.RoleBackup, NodeID: t.name}
	if token := props["receive_resume_token"]; token != "-" && token != "" {
		state.ResumeToken = token
	}
	snaps, err := t.z.Snapshots(ctx, fs)
	if err != nil {
		return ReplicaState{}, err
	}
	for _, s := range snaps {
		state.SnapshotGUIDs = append(state.SnapshotGUIDs, s.GUID)
	}
	return state, nil
}

// Receive takes in one push's stream. sender is the node the sender's
// verified certificate names ("" without TLS); ctx ends when the sender
// hangs up.
func (t *TargetReceiver) Receive(ctx context.Context, sender string, in Incoming) (Received, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	guard := newStallGuard(t.r.IdleTimeout, t.r.MinRate, cancel)
	defer guard.stop()
	// Generations are the nodes' business: a target holds no primary and
	// promises nothing.
	h, err := readHeader(ctx, t.root, sender, in, guard)
	if err != nil {
		return Received{}, err
	}
	log := t.log.With("volume_id", h.VolumeID, "volume_name", h.VolumeName, "source_node", h.SourceNodeID, "kind", h.Kind, "snapshot", h.Snapshot)
	select {
	case t.r.slots <- struct{}{}:
		defer func() { <-t.r.slots }()
	default:
		return Received{}, errdefs.Wrap(errdefs.ErrResourceExhausted, "backup target %s is receiving %d streams already; retry later", t.name, MaxReceives)
	}
	begin, err := readBegin(ctx, in, guard)
	if err == nil {
		err = checkBegin(begin, h.Kind)
	}
	if err != nil {
		return Received{}, fmt.Errorf("the stream of volume %s: %w", h.VolumeID, err)
	}
	parsed, _ := parseBegin(begin) // checked above
	fs, _ := dataset(t.root, h.VolumeID)
	unlock, err := t.locks.Lock(ctx, h.VolumeID, "receive from node "+h.SourceNodeID)
	if err != nil {
		return Received{}, err
	}
	defer unlock()
	if err := t.prepare(ctx, fs, h, parsed.fromGUID, log); err != nil {
		return Received{}, err
	}
	var props map[string]string
	if h.Kind == KindFull {
		props = map[string]string{"canmount": "off"}
	}
	zr, err := t.r.startReceive(ctx, fs, props)
	if err != nil {
		return Received{}, err
	}
	log.Info("receiving a backup")
	bytes, err := t.r.zfsReceive(ctx, h, zr, false, begin, in, guard, log)
	if err != nil {
		return Received{}, err
	}
	last, err := t.r.received(ctx, fs, h)
	if err != nil {
		return Received{}, err
	}
	if err := t.settle(ctx, fs, last.Name, h); err != nil {
		return Received{}, err
	}
	if err := t.prune(ctx, h.VolumeID, log); err != nil {
		// The backup is in; what stays beyond the grid goes at the next.
		log.Warn("pruning the volume's backups failed; the next backup prunes again", "error", err)
	}
	log.Info("backup received", "bytes", bytes, "snapshot", last.Name)
	return Received{SnapshotGUID: last.GUID, Bytes: bytes}, nil
}

// prepare makes the chain ready for the stream, under the volume's lock:
// an incremental goes onto the newest backup only; a resumed stream needs
// the interrupted receive it resumes; a full stream starts a chain,
// setting aside one that holds backups and discarding one that holds
// none (a first receive interrupted and not resumed).
func (t *TargetReceiver) prepare(ctx context.Context, fs string, h Header, fromGUID uint64, log hclog.Logger) error {
	state, err := t.ReplicaState(ctx, h.VolumeID)
	if err != nil {
		return err
	}
	switch h.Kind {
	case KindResume:
		if state.ResumeToken == "" {
			return errdefs.Wrap(errdefs.ErrFailedPrecondition, "no interrupted receive of volume %s to resume on backup target %s", h.VolumeID, t.name)
		}
		return nil
	case KindIncremental:
		guids := state.SnapshotGUIDs
		if len(guids) == 0 || guids[len(guids)-1] != fromGUID {
			return errdefs.Wrap(errdefs.ErrFailedPrecondition,
				"the incremental stream of volume %s starts from a snapshot that is not the newest backup on target %s: a target never rolls back; a full push starts a new chain",
				h.VolumeID, t.name)
		}
		if state.ResumeToken != "" {
			// A fresh stream replaces an interrupted one the sender chose
			// not to resume.
			return t.r.replicas.AbortPartial(ctx, fs)
		}
		return nil
	}
	if !state.Exists {
		return nil
	}
	if len(state.SnapshotGUIDs) == 0 {
		if err := t.r.replicas.AbortPartial(ctx, fs); err != nil {
			return err
		}
		return t.z.DestroyRecursive(ctx, fs)
	}
	if state.ResumeToken != "" {
		if err := t.r.replicas.AbortPartial(ctx, fs); err != nil {
			return err
		}
	}
	aside := fs + chainInfix + strconv.FormatInt(t.now().UnixNano(), 10)
	log.Info("a full stream starts a new chain; the backups held are kept beside it", "earlier_chain", aside)
	if err := t.z.Rename(ctx, fs, aside); err != nil {
		return err
	}
	// No push continues an earlier chain: its base hold goes, so the grid
	// can prune it to nothing.
	return copyrecord.ReleaseHolds(ctx, t.z, aside, isReceiverTag)
}

// settle labels a received backup: its chain with what a restore needs
// (the volume's name, parameters and capacity) and the grid it is pruned
// by; the snapshot with the time it arrived. The newest backup is held
// as the base of the next push, and the older bases released.
func (t *TargetReceiver) settle(ctx context.Context, fs, snap string, h Header) error {
	labels := map[string]string{
		copyrecord.PropRole:       contract.RoleBackup,
		copyrecord.PropVolumeID:   h.VolumeID,
		copyrecord.PropName:       h.VolumeName,
		copyrecord.PropParameters: copyrecord.EncodeParameters(h.Parameters),
		copyrecord.PropRetention:  t.grid(h.Parameters).String(),
	}
	if h.CapacityBytes > 0 {
		labels[copyrecord.PropCapacity] = strconv.FormatUint(h.CapacityBytes, 10)
	}
	if err := t.z.SetProperties(ctx, fs, labels); err != nil {
		return fmt.Errorf("labelling the backups of %s: %w", fs, err)
	}
	at := strconv.FormatInt(t.now().Unix(), 10)
	if err := t.z.SetProperties(ctx, snap, map[string]string{copyrecord.PropReceivedAt: at}); err != nil {
		return fmt.Errorf("dating the backup %s: %w", snap, err)
	}
	if err := t.z.Hold(ctx, snap, BaseHoldTag); err != nil && !errors.Is(err, zfs.ErrExists) {
		return fmt.Errorf("holding the backup %s as the next push's base: %w", snap, err)
	}
	return releaseSuperseded(ctx, t.z, fs)
}

// grid is the retention grid of a volume with params: its own
// backup_retention, when it parses and keeps at most MaxKept, else the
// target's default.
func (t *TargetReceiver) grid(params map[string]string) retention.Grid {
	def := t.Default
	if def == nil {
		def = DefaultRetention
	}
	g, err := retention.Parse(params[contract.ParamBackupRetention])
	if err != nil || len(g) == 0 {
		return def
	}
	if max := t.MaxKept; max > 0 && g.Intervals() > max {
		return def
	}
	return g
}

// backup is one backup of a volume, in whichever of its chains.
type backup struct {
	snap     string
	received time.Time
	held     bool
}

// prune destroys the backups of volumeID, in every chain, that the
// volume's grid no longer keeps, and an earlier chain left with none.
// The grid is the one the current chain is labelled with.
func (t *TargetReceiver) prune(ctx context.Context, volumeID string, log hclog.Logger) error {
	fs, _ := dataset(t.root, volumeID)
	written, err := t.z.Property(ctx, fs, copyrecord.PropRetention)
	if err != nil {
		return err
	}
	grid, err := retention.Parse(written)
	if err != nil {
		return fmt.Errorf("the retention grid %q of %s: %w", written, fs, err)
	}
	chains, err := t.chains(ctx, volumeID)
	if err != nil {
		return err
	}
	var all []backup
	for _, chain := range chains {
		found, err := t.backups(ctx, chain)
		if err != nil {
			return err
		}
		all = append(all, found...)
	}
	times := make([]time.Time, len(all))
	for i, b := range all {
		times[i] = b.received
	}
	keep := grid.Keep(times)
	for i, b := range all {
		if keep[i] || b.held {
			continue
		}
		if err := t.z.DestroySnapshot(ctx, b.snap); err != nil && !errors.Is(err, zfs.ErrNotFound) {
			return fmt.Errorf("destroying the backup %s, beyond the grid %s: %w", b.snap, grid, err)
		}
		log.Info("backup pruned", "snapshot", b.snap, "received", b.received.UTC().Format(time.RFC3339), "grid", grid.String())
	}
	for _, chain := range chains[1:] {
		if left, err := t.z.Snapshots(ctx, chain); err == nil && len(left) == 0 {
			if err := t.z.DestroyRecursive(ctx, chain); err != nil {
				return fmt.Errorf("destroying the emptied chain %s: %w", chain, err)
			}
			log.Info("an earlier chain's last backup was pruned: chain destroyed", "chain", chain)
		}
	}
	return nil
}

// chains lists the datasets holding volumeID's backups: the current
// chain first, then the earlier ones.
func (t *TargetReceiver) chains(ctx context.Context, volumeID string) ([]string, error) {
	children, err := t.z.ChildProperties(ctx, t.root)
	if err != nil {
		return nil, err
	}
	fs := t.root + "/" + volumeID
	out := []string{fs}
	for _, c := range children {
		if strings.HasPrefix(c.Name, fs+chainInfix) {
			out = append(out, c.Name)
		}
	}
	return out, nil
}

// backups lists the backups of one chain, oldest first, dated by their
// arrival here; a snapshot without the date (received, then the target
// stopped before it dated it) counts as received when ZFS made it.
func (t *TargetReceiver) backups(ctx context.Context, chain string) ([]backup, error) {
	snaps, err := t.z.Snapshots(ctx, chain)
	if errors.Is(err, zfs.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	holds, err := t.z.Holds(ctx, chain)
	if err != nil {
		return nil, err
	}
	out := make([]backup, 0, len(snaps))
	for _, s := range snaps {
		b := backup{snap: s.Name, received: receivedAt(ctx, t.z, s), held: len(holds[s.Name]) > 0}
		out = append(out, b)
	}
	return out, nil
}

// receivedAt reads when the target received s.
func receivedAt(ctx context.Context, z Pool, s zfs.Snap) time.Time {
	v, err := z.Property(ctx, s.Name, copyrecord.PropReceivedAt)
	if secs, perr := strconv.ParseInt(v, 10, 64); err == nil && perr == nil && secs > 0 {
		return time.Unix(secs, 0)
	}
	return time.Unix(s.Created, 0)
}
