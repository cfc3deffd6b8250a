package operator

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

type listed []agentclient.Backup

func (l listed) Backups(context.Context, string, string) ([]agentclient.Backup, error) { return l, nil }

// TestListBackups: a target's backups are shown by volume, oldest first,
// with the snapshot ID a restore names; a volume is named by its name
// or ID, deleted or not, and one the target holds nothing of is NotFound.
func TestListBackups(t *testing.T) {
	at := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	web, db := contract.VolumeIDForName("web"), contract.VolumeIDForName("db")
	all := listed{
		{Target: "vault", VolumeID: web, VolumeName: "web", Snapshot: "zn-2", Received: at.Add(time.Hour), CurrentChain: true},
		{Target: "vault", VolumeID: db, VolumeName: "db", Snapshot: "zn-3", Received: at, CurrentChain: true},
		{Target: "vault", VolumeID: web, VolumeName: "web", Snapshot: "zn-1", Received: at},
	}
	var out strings.Builder
	if err := ListBackups(context.Background(), all, "vault", "web", &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[1], "backup:vault:"+web+"@zn-1") || !strings.Contains(lines[1], "earlier") ||
		!strings.Contains(lines[2], "@zn-2") || !strings.Contains(lines[2], "current") {
		t.Errorf("web's backups, oldest first:\n%s", out.String())
	}
	out.Reset()
	if err := ListBackups(context.Background(), all, "vault", db, &out); err != nil || !strings.Contains(out.String(), "@zn-3") {
		t.Errorf("db's backups by ID: %v\n%s", err, out.String())
	}
	if err := ListBackups(context.Background(), all, "vault", "nothing", &out); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a volume without backups: %v, want NotFound", err)
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
