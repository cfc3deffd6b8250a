package operator

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/provision"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// BackupLister lists a backup target's backups (agentclient.Targets).
type BackupLister interface {
	Backups(ctx context.Context, target, volumeID string) ([]agentclient.Backup, error)
	Addr(target string) string
}

// unanswered says in one sentence why a target did not answer, as
// Unreached does for a node; an answer of the target's (a refusal, a
// backup it lacks) stays as it is.
func unanswered(t interface{ Addr(string) string }, target string, err error) error {
	switch errdefs.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Unknown:
		return fmt.Errorf("%w: backup target %s: %s", errdefs.ErrUnavailable, target,
			strings.Replace(Unreached(t.Addr(target), err), "zfs-node running", "zfs-node target running", 1))
	}
	return err
}

// ListBackups prints the backups each of targets holds of the volume
// named volume (its name or ID; every volume's when empty), by volume
// and target, oldest first, with the snapshot ID a restore names
// (docs/backups.md). A volume's backups outlive it: they are found by the
// name it had. A target that does not answer is left out and named in
// the error returned after the list.
func ListBackups(ctx context.Context, lister BackupLister, targets []string, volume string, out io.Writer) error {
	var shown []agentclient.Backup
	var silent []error
	for _, target := range targets {
		all, err := lister.Backups(ctx, target, "")
		if err != nil {
			silent = append(silent, unanswered(lister, target, err))
			continue
		}
		for _, b := range all {
			if volume == "" || b.VolumeID == volume || b.VolumeName == volume {
				shown = append(shown, b)
			}
		}
	}
	if len(silent) == len(targets) {
		return errors.Join(silent...)
	}
	if volume != "" && len(shown) == 0 && len(silent) == 0 {
		return errdefs.Wrap(errdefs.ErrNotFound, "no backup target (%s) holds a backup of a volume named or with the ID %q", strings.Join(targets, ", "), volume)
	}
	slices.SortFunc(shown, func(a, b agentclient.Backup) int {
		return cmp.Or(cmp.Compare(a.VolumeName, b.VolumeName), cmp.Compare(a.Target, b.Target), a.Received.Compare(b.Received), cmp.Compare(a.Snapshot, b.Snapshot))
	})
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "VOLUME\tTARGET\tRECEIVED\tSIZE\tENCRYPTED\tCHAIN\tSNAPSHOT ID")
	for _, b := range shown {
		chain := "current"
		if !b.CurrentChain {
			chain = "earlier"
		}
		encrypted := "no"
		if b.Encrypted {
			encrypted = "yes"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", b.VolumeName, b.Target, b.Received.UTC().Format(time.RFC3339), contract.Bytes(int64(b.ReferencedBytes)),
			encrypted, chain, b.Ref().SnapshotID())
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if len(silent) > 0 {
		return fmt.Errorf("%w; the list above lacks their backups", errors.Join(silent...))
	}
	return nil
}

// BackupDeleter deletes a target's backups (agentclient.Targets).
type BackupDeleter interface {
	DeleteBackups(ctx context.Context, target, volumeID, snapshot string) ([]string, error)
	Addr(target string) string
}

// DeleteBackups deletes, on target, the backup snapshot of the volume
// named volume (its name or ID: the volume may be deleted), or every
// backup of it when snapshot is empty, and says what went.
func DeleteBackups(ctx context.Context, targets BackupDeleter, target, volume, snapshot string, out io.Writer) error {
	id := volume
	if !contract.IsVolumeID(volume) {
		id = contract.VolumeIDForName(volume) // a volume's ID is its name's
	}
	deleted, err := targets.DeleteBackups(ctx, target, id, snapshot)
	if err != nil {
		return unanswered(targets, target, err)
	}
	for _, name := range deleted {
		fmt.Fprintf(out, "deleted %s\n", name)
	}
	fmt.Fprintf(out, "%d backups of %s deleted from backup target %s\n", len(deleted), id, target)
	return nil
}

// BackupFinder finds one backup on its target (agentclient.Targets).
type BackupFinder interface {
	Backup(ctx context.Context, ref contract.BackupRef) (agentclient.Backup, error)
	Addr(target string) string
}

// Restorer makes volumes (provision.Provisioner): it finds one by ID, and
// creates one, from a backup when the request's source is a backup's
// snapshot ID.
type Restorer interface {
	FindVolume(ctx context.Context, id string) (cluster.Located[agentclient.Volume], error)
	Create(ctx context.Context, req provision.CreateRequest) (agentclient.Volume, cluster.Node, error)
}

// RestoreOptions name the restored volume and its node.
type RestoreOptions struct {
	// Name is the new volume's name; empty: the name the backed-up
	// volume had (which must be free: deleted, or never made here).
	Name string
	// Node pins the new volume to a node; empty: placement picks one,
	// as for any new volume.
	Node string
}

// Restore makes a new volume from the backup backupID names (its
// snapshot ID, as ListBackups shows it), with the backed-up volume's
// capacity and parameters, through the create every volume takes
// (generation 1 reserved by a majority, the target's grant to the one
// node that receives it; docs/backups.md, "Restoring"). A name a volume
// has already is refused before anything is reserved: a restore never
// merges into or replaces a volume.
func Restore(ctx context.Context, r Restorer, targets BackupFinder, backupID string, opts RestoreOptions, out io.Writer) error {
	ref, ok := contract.ParseBackupID(backupID)
	if !ok {
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "%q is not a backup's snapshot ID: want backup:TARGET:VOLUME-ID@SNAPSHOT, as zfs-controller backups lists them", backupID)
	}
	b, err := targets.Backup(ctx, ref)
	if err != nil {
		return unanswered(targets, ref.Target, err)
	}
	name := cmp.Or(opts.Name, b.VolumeName)
	if name == "" {
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "backup %s does not say its volume's name: name the new volume with -name", backupID)
	}
	id := contract.VolumeIDForName(name)
	switch existing, err := r.FindVolume(ctx, id); {
	case err == nil:
		return errdefs.Wrap(errdefs.ErrAlreadyExists, "volume %q exists (%s, primary on node %s): restore under another name (-name), or delete it first", name, id, existing.Node.Info.NodeID)
	case !errors.Is(err, errdefs.ErrNotFound):
		return fmt.Errorf("cannot tell whether a volume named %q exists, so nothing is restored: %w", name, err)
	}
	params := maps.Clone(b.Parameters)
	delete(params, contract.ParamNode) // where the volume was says nothing of where it goes
	if opts.Node != "" {
		params[contract.ParamNode] = opts.Node
	}
	v, node, err := r.Create(ctx, provision.CreateRequest{VolumeRequest: contract.VolumeRequest{
		Name: name, RequiredBytes: b.CapacityBytes, Parameters: params, SourceSnapshotID: backupID}})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "volume %q (%s) restored on node %s from the backup of %s received %s (%s)\n",
		name, v.VolumeID, node.Info.NodeID, b.VolumeName, b.Received.UTC().Format(time.RFC3339), contract.Bytes(int64(b.ReferencedBytes)))
	fmt.Fprintf(out, "Nomad does not know it yet: nomad volume register a specification with id = %q, external_id = %q and this plugin's plugin_id (docs/backups.md, \"Restoring\").\n", name, v.VolumeID)
	if _, owned := params[contract.ParamOwnerDigest]; owned {
		fmt.Fprintf(out, "It keeps the owner secret of the volume it was a backup of: register it with that secret (secrets { %s = \"...\" }), or Nomad's registration is refused.\n", contract.SecretOwner)
	}
	return nil
}

// BackupStatus is the newest backup of a volume on one of the targets its
// backup_to names.
type BackupStatus struct {
	VolumeID string `json:"volume_id"`
	Name     string `json:"name"`
	Target   string `json:"target"`
	// Newest is when the target received the newest backup (zero: it
	// holds none).
	Newest time.Time `json:"newest,omitzero"`
	// Every is the volume's backup_every, when backup_to names the
	// target (else the target is listed for a failed backup only).
	Every string `json:"every,omitempty"`
	// Late: the target holds no backup of the volume, or its newest is
	// more than twice backup_every old, as of the report.
	Late bool `json:"late,omitempty"`
	// Error says why the target did not answer.
	Error string `json:"error,omitempty"`
	// LastFailure says why the last backup there failed, when it failed
	// after the newest backup (the node that tried keeps it until one
	// succeeds), and LastFailureAt when.
	LastFailure   string    `json:"last_failure,omitempty"`
	LastFailureAt time.Time `json:"last_failure_at,omitzero"`
}

// AddBackups adds to the report, for each primary whose backup_to names
// targets, the newest backup on each (asking each target once): what the
// schedule should keep young, and the late ones marked; and for any
// primary, a target its last backup to failed (by the operator's command
// too), and why.
func AddBackups(ctx context.Context, r *Report, targets BackupLister, now time.Time) {
	newest := newestBackups(ctx, targets)
	for _, c := range r.Copies {
		if c.Role != "primary" {
			continue
		}
		scheduled, every := contract.BackupPolicy(c.parameters)
		names := slices.Clone(scheduled)
		for _, f := range r.backupFailures {
			if f.VolumeID == c.VolumeID && !slices.Contains(names, f.Target) {
				names = append(names, f.Target)
			}
		}
		for _, target := range names {
			st := BackupStatus{VolumeID: c.VolumeID, Name: c.Name, Target: target}
			ages, err := newest(target)
			if err != nil {
				st.Error = innermost(err.Error())
			} else {
				st.Newest = ages[c.VolumeID]
			}
			if slices.Contains(scheduled, target) {
				st.Every = every.String()
				st.Late = err == nil && (st.Newest.IsZero() || now.Sub(st.Newest) > 2*every)
			}
			if f, ok := lastFailure(r.backupFailures, c.VolumeID, target); ok && f.After(st.Newest) {
				st.LastFailure, st.LastFailureAt = f.why, f.Time
			}
			r.Backups = append(r.Backups, st)
		}
	}
}

// newestBackups returns a function answering, for a target, when it
// received each volume's newest backup (by volume ID), asking each
// target once.
func newestBackups(ctx context.Context, targets BackupLister) func(target string) (map[string]time.Time, error) {
	type answer struct {
		newest map[string]time.Time
		err    error
	}
	asked := map[string]answer{}
	return func(target string) (map[string]time.Time, error) {
		if a, ok := asked[target]; ok {
			return a.newest, a.err
		}
		var a answer
		all, err := targets.Backups(ctx, target, "")
		if err != nil {
			a.err = unanswered(targets, target, err)
		} else {
			a.newest = agentclient.NewestByVolume(all)
		}
		asked[target] = a
		return a.newest, a.err
	}
}

// failure is a backup's failure: when, and why.
type failure struct {
	time.Time
	why string
}

// lastFailure is the newest of the nodes' failed backups of volumeID to
// target (a volume that moved may have failed on two nodes).
func lastFailure(all []agentclient.BackupFailure, volumeID, target string) (failure, bool) {
	var last failure
	for _, f := range all {
		if at := time.Unix(f.AtUnix, 0); f.VolumeID == volumeID && f.Target == target && at.After(last.Time) {
			last = failure{Time: at, why: f.Error}
		}
	}
	return last, !last.IsZero()
}

// backupsOf is a volume's BACKUPS cell: each target's newest backup's
// age, LATE when it is.
func backupsOf(all []BackupStatus, volumeID string, now time.Time) string {
	var cells []string
	for _, b := range all {
		if b.VolumeID != volumeID {
			continue
		}
		cell := b.Target + " "
		switch {
		case b.Error != "":
			cell += "? (target did not answer)"
		case b.Newest.IsZero() && b.Late:
			cell += "none, LATE"
		case b.Newest.IsZero():
			cell += "none"
		default:
			cell += now.Sub(b.Newest).Round(time.Second).String() + " ago"
			if b.Late {
				cell += ", LATE (every " + b.Every + ")"
			}
		}
		if b.LastFailure != "" {
			cell += fmt.Sprintf(" (last try failed %s ago: %s)", now.Sub(b.LastFailureAt).Round(time.Second), b.LastFailure)
		}
		cells = append(cells, cell)
	}
	return strings.Join(cells, "; ")
}
