package migration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guestcluster"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guesttest"
)

// TestOwnerAndModeFollowTheVolume: a volume created with uid, gid and
// mode parameters has its root directory so wherever it is staged: on its
// first node, after a move, after a manual failover, and in a volume
// restored from its snapshot on another node; a restore that asks for
// another owner gets it. The owner writes without root; another user
// cannot.
func TestOwnerAndModeFollowTheVolume(t *testing.T) {
	t.Parallel()
	c := guesttest.StartCluster(t, 3, guestcluster.Options{
		ControllerArgs: explicitPushes(),
		NodeArgs:       []string{"-root-uids", "1000-1001", "-root-gids", "1000"},
	})
	e := &env{t: t, c: c, ctx: context.Background()}
	// The workload's user must reach the mounts, as a task reaches its
	// allocation directory: the test's directories are root's, 0700.
	for _, n := range c.Nodes {
		for dir := n.Dir; dir != "/" && dir != os.TempDir(); dir = filepath.Dir(dir) {
			if err := os.Chmod(dir, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}

	// Refused outside the operator's rules, before anything is created.
	_, err := e.controller().CreateVolume(e.ctx, &csi.CreateVolumeRequest{Name: "rooted", VolumeCapabilities: []*csi.VolumeCapability{writer},
		Parameters: map[string]string{"node": "n1", "uid": "0", "mode": "0777"}})
	wantCode(t, err, codes.InvalidArgument, "root_directory")

	id := e.create("owned", map[string]string{"uid": "1000", "gid": "1000", "mode": "2770"})
	dir := e.mustPublish(id, "n1")
	e.wantRoot("n1", dir, "1000:1000 2770")
	e.writeAs("n1", dir, 1000, "echo mine > f && mkdir sub")
	if out, err := e.node("n1").ExecAs(1001, "echo theirs > "+dir+"/g"); err == nil {
		t.Errorf("user 1001 wrote to a volume of 1000:1000 mode 2770: %s", out)
	}
	// setgid on the root: what the owner makes takes the volume's group.
	if got := strings.TrimSpace(guesttest.Exec(t, e.node("n1"), "stat -c '%u:%g' "+dir+"/f")); got != "1000:1000" {
		t.Errorf("f is owned by %s, want 1000:1000", got)
	}
	e.unpublish(id, "n1")

	// A move: n2's copy is received, then promoted.
	dir = e.mustPublish(id, "n2")
	e.wantRoot("n2", dir, "1000:1000 2770")
	e.writeAs("n2", dir, 1000, "echo moved >> f")
	e.unpublish(id, "n2")

	// Restores from a snapshot, on another node than the snapshot's: as
	// the snapshot had it, or with the owner the restore asks for.
	snap, err := e.controller().CreateSnapshot(e.ctx, &csi.CreateSnapshotRequest{SourceVolumeId: id, Name: "owned-snap"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		params map[string]string
		want   string
	}{
		{"restored", nil, "1000:1000 2770"},
		{"restored-for-1001", map[string]string{"uid": "1001"}, "1001:1000 2770"},
	} {
		rid := e.restore(tc.name, snap.GetSnapshot().GetSnapshotId(), tc.params)
		rdir := e.mustPublish(rid, "n3")
		e.wantRoot("n3", rdir, tc.want)
		uid := 1000
		if tc.params != nil {
			uid = 1001
		}
		e.writeAs("n3", rdir, uid, "echo restored > new") // f is still 1000's
		e.unpublish(rid, "n3")
		e.deleteVolume(rid)
	}

	// A manual failover: n2 (the primary) is lost, n1's replica promoted.
	e.replicate(id, "n2", "n1")
	e.loseNode("n2")
	e.promote(id, "n1")
	dir = e.mustPublish(id, "n1")
	e.wantRoot("n1", dir, "1000:1000 2770")
	if got, err := e.node("n1").ExecAs(1000, "cat "+dir+"/f"); err != nil || got != "mine\nmoved\n" {
		t.Errorf("after the failover f reads %q (%v)", got, err)
	}
}

// wantRoot fails the test unless the directory's owner, group and octal
// mode are want ("1000:1000 2770").
func (e *env) wantRoot(nodeID, dir, want string) {
	e.t.Helper()
	if got := strings.TrimSpace(guesttest.Exec(e.t, e.node(nodeID), "stat -c '%u:%g %a' "+dir)); got != want {
		e.t.Errorf("the volume's root on %s is %s, want %s", nodeID, got, want)
	}
}

// writeAs runs script in dir as user uid (group uid, no other groups).
func (e *env) writeAs(nodeID, dir string, uid int, script string) {
	e.t.Helper()
	if out, err := e.node(nodeID).ExecAs(uid, "cd "+dir+" && "+script+" && sync"); err != nil {
		e.t.Fatalf("as user %d on %s: %v\n%s", uid, nodeID, err, out)
	}
}
