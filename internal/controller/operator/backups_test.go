package operator

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/provision"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

type listed []agentclient.Backup

// Backups answers the backups of target; "lost" does not answer.
func (l listed) Backups(_ context.Context, target, _ string) ([]agentclient.Backup, error) {
	if target == "lost" {
		return nil, errdefs.Wrap(errdefs.ErrUnavailable, "connection error: desc = \"transport: Error while dialing: dial tcp 10.0.0.9:7680: connect: connection refused\"")
	}
	var out []agentclient.Backup
	for _, b := range l {
		if b.Target == target {
			out = append(out, b)
		}
	}
	return out, nil
}

// TestListBackups: the targets' backups are shown by volume and target,
// oldest first, with the snapshot ID a restore names; a volume is named
// by its name or ID, deleted or not, and one no target holds anything of
// is NotFound; a target that does not answer is named after the list of
// the others'.
func TestListBackups(t *testing.T) {
	at := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	web, db := contract.VolumeIDForName("web"), contract.VolumeIDForName("db")
	all := listed{
		{Target: "vault", VolumeID: web, VolumeName: "web", Snapshot: "zn-2", Received: at.Add(time.Hour), CurrentChain: true, Encrypted: true},
		{Target: "vault", VolumeID: db, VolumeName: "db", Snapshot: "zn-3", Received: at, CurrentChain: true},
		{Target: "offsite", VolumeID: db, VolumeName: "db", Snapshot: "zn-4", Received: at, CurrentChain: true},
		{Target: "vault", VolumeID: web, VolumeName: "web", Snapshot: "zn-1", Received: at},
	}
	var out strings.Builder
	if err := ListBackups(context.Background(), all, []string{"vault"}, "web", &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[1], "backup:vault:"+web+"@zn-1") || !strings.Contains(lines[1], "earlier") ||
		!strings.Contains(lines[2], "@zn-2") || !strings.Contains(lines[2], "current") || !strings.Contains(lines[0], "ENCRYPTED") ||
		!strings.Contains(lines[2], " yes ") || !strings.Contains(lines[1], " no ") {
		t.Errorf("web's backups, oldest first:\n%s", out.String())
	}
	out.Reset()
	if err := ListBackups(context.Background(), all, []string{"vault"}, db, &out); err != nil || !strings.Contains(out.String(), "@zn-3") {
		t.Errorf("db's backups by ID: %v\n%s", err, out.String())
	}
	if err := ListBackups(context.Background(), all, []string{"offsite", "vault"}, "nothing", &out); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a volume without backups: %v, want NotFound", err)
	}
	out.Reset()
	err := ListBackups(context.Background(), all, []string{"lost", "offsite", "vault"}, "db", &out)
	if err == nil || !strings.Contains(err.Error(), "backup target lost: nothing listens at lost.example:7680 (connection refused): is zfs-node target running there") ||
		!strings.Contains(out.String(), "offsite") || !strings.Contains(out.String(), "@zn-3") {
		t.Errorf("every target's backups of db, one target silent: %v\n%s", err, out.String())
	}
}

type deleter struct{ volumeID, snapshot string }

func (d *deleter) DeleteBackups(_ context.Context, _, volumeID, snapshot string) ([]string, error) {
	d.volumeID, d.snapshot = volumeID, snapshot
	return []string{"vault/backups/" + volumeID + "@zn-1"}, nil
}

// TestDeleteBackups: a volume is named by its name or ID, deleted or not
// (a volume's ID is its name's), and the command says what went.
func TestDeleteBackups(t *testing.T) {
	id := contract.VolumeIDForName("web")
	for _, volume := range []string{"web", id} {
		var d deleter
		var out strings.Builder
		if err := DeleteBackups(context.Background(), &d, "vault", volume, "zn-1", &out); err != nil {
			t.Fatal(err)
		}
		if d.volumeID != id || d.snapshot != "zn-1" || !strings.Contains(out.String(), "deleted vault/backups/"+id+"@zn-1") {
			t.Errorf("%s: asked to delete %+v; output:\n%s", volume, d, out.String())
		}
	}
}

type restorer struct {
	existing map[string]string // volume ID to its node
	findErr  error
	created  []provision.CreateRequest
}

func (r *restorer) FindVolume(_ context.Context, id string) (cluster.Located[agentclient.Volume], error) {
	if node, ok := r.existing[id]; ok {
		return cluster.Located[agentclient.Volume]{Node: cluster.Node{Info: agentclient.NodeInfo{NodeID: node}}, Object: agentclient.Volume{VolumeID: id}}, nil
	}
	return cluster.Located[agentclient.Volume]{}, cmp.Or(r.findErr, errdefs.Wrap(errdefs.ErrNotFound, "volume %s", id))
}

func (r *restorer) Create(_ context.Context, req provision.CreateRequest) (agentclient.Volume, cluster.Node, error) {
	r.created = append(r.created, req)
	return agentclient.Volume{VolumeID: contract.VolumeIDForName(req.Name)}, cluster.Node{Info: agentclient.NodeInfo{NodeID: "n2"}}, nil
}

type found agentclient.Backup

func (f found) Backup(_ context.Context, ref contract.BackupRef) (agentclient.Backup, error) {
	if ref.Target != f.Target {
		return agentclient.Backup{}, errdefs.Wrap(errdefs.ErrUnavailable, "backup target %s does not answer", ref.Target)
	}
	if ref != agentclient.Backup(f).Ref() {
		return agentclient.Backup{}, errdefs.Wrap(errdefs.ErrNotFound, "no backup %s", ref.SnapshotID())
	}
	return agentclient.Backup(f), nil
}

// TestRestore: a backup is restored through a create with the backed-up
// volume's capacity and parameters, under its old name or another, on
// the node named (never the node it came from); a name in use, a node
// set that cannot say whether it is, or an ID that is no backup's, is
// refused before anything is created.
func TestRestore(t *testing.T) {
	web := contract.VolumeIDForName("web")
	backup := found{Target: "vault", VolumeID: web, VolumeName: "web", Snapshot: "zn-7", CapacityBytes: 1 << 30,
		Parameters: map[string]string{"node": "n1", "compression": "lz4"}}
	id := agentclient.Backup(backup).Ref().SnapshotID()
	tests := []struct {
		name     string
		backupID string
		opts     RestoreOptions
		r        restorer
		wantErr  error
		wantName string
		wantNode string
	}{
		{name: "under its old name, where placement picks", backupID: id, wantName: "web"},
		{name: "under a new name, on a named node", backupID: id, opts: RestoreOptions{Name: "web-2", Node: "n3"}, r: restorer{existing: map[string]string{web: "n1"}}, wantName: "web-2", wantNode: "n3"},
		{name: "its old name in use", backupID: id, r: restorer{existing: map[string]string{web: "n1"}}, wantErr: errdefs.ErrAlreadyExists},
		{name: "the nodes cannot tell", backupID: id, r: restorer{findErr: errdefs.ErrUnavailable}, wantErr: errdefs.ErrUnavailable},
		{name: "no such backup", backupID: "backup:vault:" + web + "@zn-8", wantErr: errdefs.ErrNotFound},
		{name: "not a backup's ID", backupID: "snap-1", wantErr: errdefs.ErrInvalidArgument},
		{name: "its target does not answer", backupID: "backup:offsite:" + web + "@zn-7", wantErr: errdefs.ErrUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out strings.Builder
			err := Restore(context.Background(), &tt.r, backup, tt.backupID, tt.opts, &out)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) || len(tt.r.created) > 0 {
					t.Fatalf("restore: %v, created %v; want %v and nothing created", err, tt.r.created, tt.wantErr)
				}
				return
			}
			if err != nil || len(tt.r.created) != 1 {
				t.Fatalf("restore: %v, created %v", err, tt.r.created)
			}
			req := tt.r.created[0]
			if req.Name != tt.wantName || req.SourceSnapshotID != id || req.RequiredBytes != 1<<30 ||
				req.Parameters["node"] != tt.wantNode || req.Parameters["compression"] != "lz4" {
				t.Errorf("created %+v; want %s from %s, 1 GiB, node %q, compression kept", req, tt.wantName, id, tt.wantNode)
			}
			if !strings.Contains(out.String(), "nomad volume register") {
				t.Errorf("the command does not say how Nomad learns of the volume:\n%s", out.String())
			}
		})
	}
	if backup.Parameters["node"] != "n1" {
		t.Errorf("the backup's parameters changed: %v", backup.Parameters)
	}
}

// byTarget answers each target's backups; a target it lacks does not answer.
type byTarget map[string][]agentclient.Backup

func (b byTarget) Backups(_ context.Context, target, _ string) ([]agentclient.Backup, error) {
	all, ok := b[target]
	if !ok {
		return nil, errors.New("connection refused")
	}
	return all, nil
}

// TestStatusShowsBackupAges: status shows, for each primary whose
// backup_to names targets, each target's newest backup by age, LATE when
// the target holds none or its newest is more than twice backup_every
// old, and a target that does not answer as unknown; beside them, why
// the last backup failed, if it failed after the newest, also to a
// target backup_to does not name (an operator's backup).
func TestStatusShowsBackupAges(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	web, db, tmp := contract.VolumeIDForName("web"), contract.VolumeIDForName("db"), contract.VolumeIDForName("tmp")
	r := Report{Copies: []CopyStatus{
		{VolumeID: web, Name: "web", Node: "n1", Role: "primary", Generation: 1, parameters: map[string]string{contract.ParamBackupTo: "vault,offsite,lost", contract.ParamBackupEvery: "1h"}},
		{VolumeID: web, Name: "web", Node: "n2", Role: "replica"},
		{VolumeID: db, Name: "db", Node: "n2", Role: "primary", Generation: 1, parameters: map[string]string{contract.ParamBackupTo: "vault", contract.ParamBackupEvery: "1h"}},
		{VolumeID: tmp, Name: "tmp", Node: "n2", Role: "primary", Generation: 1},
	}}
	targets := byTarget{
		"vault":   {{VolumeID: web, Received: now.Add(-30 * time.Minute)}, {VolumeID: web, Received: now.Add(-90 * time.Minute)}, {VolumeID: db, Received: now.Add(-3 * time.Hour)}},
		"offsite": {},
	}
	r.backupFailures = []agentclient.BackupFailure{
		{VolumeID: db, Target: "vault", Error: "vault has no room for volume " + db, AtUnix: now.Add(-2 * time.Minute).Unix()},
		{VolumeID: web, Target: "vault", Error: "before the newest backup: no longer news", AtUnix: now.Add(-time.Hour).Unix()},
		{VolumeID: tmp, Target: "vault", Error: "an operator's backup failed", AtUnix: now.Add(-time.Minute).Unix()},
	}
	AddBackups(context.Background(), &r, targets, now)
	var got []string
	for _, b := range r.Backups {
		got = append(got, fmt.Sprintf("%s %s late=%v err=%v", b.Name, b.Target, b.Late, b.Error != ""))
	}
	want := []string{"web vault late=false err=false", "web offsite late=true err=false", "web lost late=false err=true", "db vault late=true err=false",
		"tmp vault late=false err=false"}
	if !slices.Equal(got, want) {
		t.Errorf("backups:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	var out strings.Builder
	PrintStatus(&out, r, now)
	for _, line := range []string{
		"vault 30m0s ago; offsite none, LATE; lost ? (target did not answer)",
		"vault 3h0m0s ago, LATE (every 1h0m0s) (last try failed 2m0s ago: vault has no room for volume " + db + ")",
		"vault none (last try failed 1m0s ago: an operator's backup failed)",
	} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("status lacks %q:\n%s", line, out.String())
		}
	}
	if strings.Contains(out.String(), "no longer news") {
		t.Errorf("status shows a failure older than the newest backup:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "BACKUPS") {
		t.Errorf("status has no BACKUPS column:\n%s", out.String())
	}
}

func (listed) Addr(target string) string   { return target + ".example:7680" }
func (byTarget) Addr(target string) string { return target + ".example:7680" }
func (found) Addr(target string) string    { return target + ".example:7680" }
func (*deleter) Addr(target string) string { return target + ".example:7680" }
