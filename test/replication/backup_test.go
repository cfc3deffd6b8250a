package replication

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guestcluster"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guesttest"
	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
)

// TestBackupsToATarget: a backup target outside the cluster (zfs-node
// target, a pool of its own, a certificate of role backup) takes a
// volume's backups from the node holding it, by the name the nodes'
// backup_targets give it: full, then incremental, each one snapshot
// there, labelled for a restore and never mounted; the volume's grid
// prunes them (100y:1 keeps the first since 1970 and the newest); the
// node keeps the target's base held. The volume is encrypted (the roots
// are): its backups stay encrypted, the key never loaded there, their
// stream without its plaintext, and hold, decrypted, what the volume
// held. A target out of room fails a backup at once, saying why in the
// status too, and the next goes on from the base the node kept. Restored
// onto the other node, the volume is its own encryption root, staged
// with its key. A node's certificate answering
// at a target's address is refused before anything is sent. A backup
// broken off by the target's death goes on when it is back, the same
// command resuming where the stream stopped, within the node's
// bandwidth cap.
func TestBackupsToATarget(t *testing.T) {
	// In slot 0, beside another test: its waits are generous (30 s for a
	// hold, a minute for 4 MiB at 2 MB/s), its one check of a time a
	// lower bound.
	t.Parallel()
	impostor := "10.77.0.2:7670" // n2's agent port
	c := guesttest.StartCluster(t, 2, guestcluster.Options{EncryptedRoots: true, BackupTarget: "vault", BackupTargetDisk: guesttest.Disk(3),
		NodeArgs: []string{"-backup-targets", "vault=" + guestcluster.TargetAddress() + ",impostor=" + impostor, "-replication-bandwidth", "2M"}})
	n1 := c.Nodes[0]
	ctl := csi.NewControllerClient(guesttest.Dial(t, c.ControllerEndpoint))
	resp, err := ctl.CreateVolume(t.Context(), &csi.CreateVolumeRequest{Name: "ledger", VolumeCapabilities: []*csi.VolumeCapability{writer},
		CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 30}, Parameters: map[string]string{"node": n1.ID, "compression": "off", "backup_retention": "100y:1"}})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetVolume().GetVolumeId()
	target, err := guesttest.Mount(t.Context(), t, n1, id, "ledger", nil)
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"backup", "-peers", strings.Join(c.AgentAddresses(), ","), "-tls-ca", c.Operator.CA, "-tls-cert", c.Operator.Cert, "-tls-key", c.Operator.Key}
	ctlBin := guesttest.BinDir(t) + "/zfs-controller"
	backup := func(want string) string {
		t.Helper()
		out := guesttest.Run(t, ctlBin, append(args, "-target", "vault", "ledger")...)
		if !strings.Contains(out, "from n1 to backup target vault") || !strings.Contains(out, "done: "+want) {
			t.Fatalf("backup: want a %s backup from n1 to backup target vault:\n%s", want, out)
		}
		return regexp.MustCompile(`@zn-\d+`).FindString(out)
	}

	guesttest.Exec(t, n1, guesttest.RandomFile(target+"/a", 8)+" && sync")
	first := backup("full")
	guesttest.Exec(t, n1, guesttest.RandomFile(target+"/b", 4)+" && sync")
	backup("incremental")
	const marker = "zfs-nomad-plaintext-marker-7f3a9c"
	guesttest.Exec(t, n1, "seq 1 100000 >"+target+"/c && echo "+marker+" >"+target+"/marker && sync")
	newest := backup("incremental")
	// The node counts its three streams to the target as backups.
	if m := scrape(t, n1.Metrics); !strings.Contains(m, `zfs_nomad_replication_transfer_seconds_count{direction="out",kind="backup",result="success"} 3`) {
		t.Errorf("n1's metrics lack three successful backup streams:\n%s", m)
	}

	chain := c.Target.RootDataset + "/" + id
	snaps := strings.Fields(guesttest.Run(t, "zfs", "list", "-H", "-t", "snapshot", "-o", "name", "-s", "createtxg", chain))
	if len(snaps) != 2 || !strings.HasSuffix(snaps[0], first) || !strings.HasSuffix(snaps[1], newest) {
		t.Errorf("the target keeps %v; want two backups (100y:1: the first since 1970, %s, and the newest, %s)", snaps, first, newest)
	}
	for prop, want := range map[string]string{"zfs-nomad:role": "backup", "zfs-nomad:name": "ledger", "zfs-nomad:retention": "100y:1",
		"canmount": "off", "mounted": "no", "keystatus": "unavailable"} {
		if got := zfsGet(t, prop, chain); got != want {
			t.Errorf("the target's %s is %s=%q, want %q", chain, prop, got, want)
		}
	}
	if enc := zfsGet(t, "encryption", chain); enc == "off" {
		t.Errorf("the backup of an encrypted volume is not encrypted")
	}
	// The node holds the target's base, so its next backup is an
	// increment (in the background of the push's answer: waited for).
	source := n1.RootDataset + "/" + id + newest
	held := func() bool {
		out, err := guestcluster.Run("zfs", "holds", "-H", source)
		return err == nil && strings.Contains(out, "zfs-nomad-base-backup:vault")
	}
	for deadline := time.Now().Add(30 * time.Second); !held() && time.Now().Before(deadline); {
		time.Sleep(200 * time.Millisecond)
	}
	if !held() {
		out, _ := guestcluster.Run("zfs", "holds", "-H", source)
		t.Errorf("n1 does not hold %s, the target's base, as zfs-nomad-base-backup:vault: %s", source, out)
	}

	// The target's stream of the newest backup carries no plaintext: a
	// file's text, found in the node's decrypted stream, is not in it.
	inStream := func(send string) bool {
		_, err := guestcluster.Run("sh", "-c", send+" | grep -q -a "+marker)
		return err == nil
	}
	if !inStream("zfs send " + n1.RootDataset + "/" + id + newest) {
		t.Errorf("the marker is not in n1's decrypted stream: the check below proves nothing")
	}
	if inStream("zfs send -w " + chain + newest) {
		t.Errorf("the target's stream of %s carries the volume's plaintext", chain+newest)
	}

	// Decrypted with the volume's key (here, the cluster's), the newest
	// backup holds what the volume holds.
	guesttest.Run(t, "zfs", "load-key", "-L", "file://"+guestcluster.KeyFile(c.Dir()), chain)
	check := c.Target.Pool + "/check"
	guesttest.Run(t, "zfs", "clone", "-o", "mountpoint=/mnt/vault-check", snaps[1], check)
	got := guesttest.Run(t, "sh", "-c", guesttest.Checksums("/mnt/vault-check"))
	guesttest.Run(t, "zfs", "destroy", check)
	if want := checksums(t, n1, target); got != want {
		t.Errorf("the newest backup holds\n%s\nthe volume\n%s", got, want)
	}

	out, code := exitOf(ctlBin, append(args, "-target", "impostor", "ledger")...)
	if code == 0 || !strings.Contains(out, "backup.zfs-nomad") {
		t.Errorf("a backup to a node's agent port named as a target: exit %d, want a refusal naming backup.zfs-nomad:\n%s", code, out)
	}
	if out, err := guestcluster.Run("zfs", "list", c.Nodes[1].RootDataset+"/"+id); err == nil {
		t.Errorf("the impostor node holds a copy of the volume:\n%s", out)
	}

	// A backup broken off by the target's end (killed mid-stream) goes
	// on once the target is back: the command pushes again every 2 s
	// while data moved within its -stall, and the node resumes where the
	// stream stopped (the target's resume token), within its bandwidth
	// cap (2 MB/s: the 24 MiB take 12 s).
	guesttest.Exec(t, n1, guesttest.RandomFile(target+"/d", 24)+" && sync")
	var resumed syncBuffer
	cmd := exec.Command(ctlBin, append(args, "-target", "vault", "ledger")...)
	cmd.Stdout, cmd.Stderr = &resumed, &resumed
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	n1Agent := agent(t, c, n1)
	for deadline := time.Now().Add(time.Minute); sentToTarget(t, n1Agent, id) < 4<<20; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the backup of 24 MiB sent less than 4 MiB in a minute:\n%s", resumed.String())
		}
	}
	c.Target.Process.Kill()
	time.Sleep(3 * time.Second) // the command pushes again meanwhile, and finds no target
	if err := c.Target.Start(); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the backup whose target was killed mid-stream and back 3 s later failed: %v\n%s", err, resumed.String())
	}
	if out := resumed.String(); !strings.Contains(out, "the push broke") || !strings.Contains(out, "done: resume") {
		t.Errorf("the backup whose target was killed mid-stream: want it to say the push broke, then resume and finish:\n%s", out)
	}
	if took := time.Since(began); took < 5*time.Second {
		t.Errorf("the resumed backup took %s: at 2 MB/s what was left of 24 MiB takes longer (the cap was not applied?)", took)
	}
	snaps = strings.Fields(guesttest.Run(t, "zfs", "list", "-H", "-t", "snapshot", "-o", "name", "-s", "createtxg", chain))
	if size := zfsGet(t, "referenced", snaps[len(snaps)-1]); !strings.HasSuffix(size, "M") {
		t.Errorf("the resumed backup %s references %s, want the volume's tens of MiB", snaps[len(snaps)-1], size)
	}

	// A target out of room (its backups' dataset at a quota): the backup
	// fails saying so, the node keeps the base the next one needs, and
	// once there is room again the next backup goes on from it, not
	// from scratch.
	base := strings.SplitN(snaps[len(snaps)-1], "@", 2)[1]
	used := strings.TrimSpace(guesttest.Run(t, "zfs", "get", "-Hp", "-o", "value", "used", c.Target.RootDataset))
	guesttest.Run(t, "sh", "-c", "zfs set quota=$(("+used+" + 2097152)) "+c.Target.RootDataset)
	guesttest.Exec(t, n1, guesttest.RandomFile(target+"/e", 8)+" && sync")
	out, code = exitOf(ctlBin, append(args, "-target", "vault", "ledger")...)
	if code == 0 || !strings.Contains(out, "vault has no room") || !strings.Contains(out, "quota exceeded") {
		t.Errorf("a backup to a target out of room: exit %d, want a failure saying why:\n%s", code, out)
	}
	if holds := guesttest.Run(t, "zfs", "holds", "-H", n1.RootDataset+"/"+id+"@"+base); !strings.Contains(holds, "zfs-nomad-base-backup:vault") {
		t.Errorf("after the failed backup n1 no longer holds the target's base %s: %s", base, holds)
	}
	statusArgs := []string{"status", "-peers", strings.Join(c.AgentAddresses(), ","), "-tls-ca", c.Operator.CA, "-tls-cert", c.Operator.Cert,
		"-tls-key", c.Operator.Key, "-backup-targets", "vault=" + guestcluster.TargetAddress()}
	if out, _ := exitOf(ctlBin, statusArgs...); !strings.Contains(out, "(last try failed") || !strings.Contains(out, "vault has no room") {
		t.Errorf("zfs-controller status does not say why ledger's backup failed:\n%s", out)
	}
	guesttest.Run(t, "zfs", "set", "quota=none", c.Target.RootDataset)
	out = guesttest.Run(t, ctlBin, append(args, "-target", "vault", "ledger")...)
	if !strings.Contains(out, "done: ") || strings.Contains(out, "done: full") {
		t.Errorf("the backup once the target has room again: want it to go on from %s, not a full one:\n%s", base, out)
	}
	snaps = strings.Fields(guesttest.Run(t, "zfs", "list", "-H", "-t", "snapshot", "-o", "name", "-s", "createtxg", chain))

	// The operator restores the newest backup under a new name onto n2,
	// which never held the volume: encrypted as it was, its key the
	// volume's, every file the same.
	n2 := c.Nodes[1]
	newestID := "backup:vault:" + id + "@" + strings.SplitN(snaps[len(snaps)-1], "@", 2)[1]
	out = guesttest.Run(t, ctlBin, "restore", "-peers", strings.Join(c.AgentAddresses(), ","), "-tls-ca", c.Operator.CA, "-tls-cert", c.Operator.Cert,
		"-tls-key", c.Operator.Key, "-backup-targets", "vault="+guestcluster.TargetAddress(), "-name", "ledger-restored", "-node", n2.ID, newestID)
	restored := regexp.MustCompile(`\((vol-[0-9a-f]+)\) restored on node ` + n2.ID).FindStringSubmatch(out)
	if restored == nil {
		t.Fatalf("zfs-controller restore -name ledger-restored -node %s: want the volume restored there:\n%s", n2.ID, out)
	}
	if enc := zfsGet(t, "encryption", n2.RootDataset+"/"+restored[1]); enc == "off" {
		t.Errorf("the restore of an encrypted volume's backup is not encrypted")
	}
	// The restore is its own encryption root, with the volume's key (here
	// the cluster's raw key), which its stage must be given.
	key, err := os.ReadFile(guestcluster.KeyFile(c.Dir()))
	if err != nil {
		t.Fatal(err)
	}
	dir, err := guesttest.MountWithSecrets(t.Context(), t, n2, restored[1], "ledger-restored", nil, map[string]string{contract.SecretEncryptionKey: string(key)})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := checksums(t, n2, dir), checksums(t, n1, target); got != want {
		t.Errorf("the restored volume holds\n%s\nthe volume\n%s", got, want)
	}
}

// TestScheduledBackupsAndARestoreOntoAnotherNode: a volume whose
// backup_to names a target is backed up there by the controller's
// schedule every backup_every; deleted from the cluster, it lives on in
// its backups, which zfs-controller backups finds by the name it had; a
// CSI CreateVolume whose source is one of them makes a new volume on
// whichever node the request names (here not the one it was backed up
// from), holding what the volume held, with no snapshot, where the
// operator lets job submitters restore (backups_as_snapshots: CSI lists
// the backup too, and refuses to delete it). The operator's restore
// brings it back under its old name; a second is refused. An operator's
// delete-backups -all then removes every backup of it.
func TestScheduledBackupsAndARestoreOntoAnotherNode(t *testing.T) {
	c := guesttest.StartCluster(t, 2, guestcluster.Options{BackupTarget: "vault", BackupTargetDisk: guesttest.Disk(3),
		NodeArgs: []string{"-min-backup-interval", "10s"}, ControllerArgs: []string{"-schedule-every", "3s", "-backups-as-snapshots"}})
	n1, n2 := c.Nodes[0], c.Nodes[1]
	ctl := csi.NewControllerClient(guesttest.Dial(t, c.ControllerEndpoint))
	resp, err := ctl.CreateVolume(t.Context(), &csi.CreateVolumeRequest{Name: "orders", VolumeCapabilities: []*csi.VolumeCapability{writer},
		CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 30},
		Parameters:    map[string]string{"node": n1.ID, "compression": "off", "backup_to": "vault", "backup_every": "10s"}})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetVolume().GetVolumeId()
	target, err := guesttest.Mount(t.Context(), t, n1, id, "orders", nil)
	if err != nil {
		t.Fatal(err)
	}
	chain := c.Target.RootDataset + "/" + id
	newestBackup := func() string {
		out, _ := guestcluster.Run("zfs", "list", "-H", "-t", "snapshot", "-o", "name", "-s", "createtxg", chain)
		fields := strings.Fields(out)
		if len(fields) == 0 {
			return ""
		}
		return fields[len(fields)-1]
	}
	guesttest.Exec(t, n1, guesttest.RandomFile(target+"/a", 6)+" && seq 1 50000 >"+target+"/numbers && mkdir "+target+"/sub && "+
		"chown 1234:2345 "+target+"/a && chmod 640 "+target+"/a && chown 99:99 "+target+"/sub && chmod 750 "+target+"/sub && sync")
	want, wantOwners := checksums(t, n1, target), owners(t, n1, target)
	// The schedule's next backup holds the files: one taken after them.
	before := newestBackup()
	began := time.Now()
	for newestBackup() == before && time.Since(began) < 90*time.Second {
		time.Sleep(time.Second)
	}
	if newestBackup() == before {
		t.Fatalf("no scheduled backup within 90 s of the write (backup_every 10s, the schedule every 3s); the target holds %q", before)
	}
	t.Logf("a scheduled backup %s, %s after the write", newestBackup(), time.Since(began).Round(time.Second))

	unpublish(t, c, id, "orders")
	if _, err := ctl.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatal(err)
	}
	ctlBin := guesttest.BinDir(t) + "/zfs-controller"
	out := guesttest.Run(t, ctlBin, "backups", "-peers", strings.Join(c.AgentAddresses(), ","), "-tls-ca", c.Operator.CA, "-tls-cert", c.Operator.Cert,
		"-tls-key", c.Operator.Key, "-backup-targets", "vault="+guestcluster.TargetAddress(), "-target", "vault", "orders")
	t.Logf("backups:\n%s", out)
	ids := regexp.MustCompile(`backup:vault:`+id+`@zn-\d+`).FindAllString(out, -1)
	if len(ids) == 0 || !strings.Contains(out, "current") {
		t.Fatalf("zfs-controller backups lists no backup of the deleted volume orders:\n%s", out)
	}
	snapshotID := ids[len(ids)-1] // oldest first: the newest last

	// The operator lets job submitters see and restore backups
	// (backups_as_snapshots): CSI lists it among the snapshots, and
	// never deletes it.
	listed, err := ctl.ListSnapshots(t.Context(), &csi.ListSnapshotsRequest{SnapshotId: snapshotID})
	if err != nil || len(listed.GetEntries()) != 1 || listed.GetEntries()[0].GetSnapshot().GetSourceVolumeId() != id {
		t.Errorf("CSI ListSnapshots of %s: %v, %v; want the backup, of volume %s", snapshotID, listed, err, id)
	}
	if _, err := ctl.DeleteSnapshot(t.Context(), &csi.DeleteSnapshotRequest{SnapshotId: snapshotID}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("CSI DeleteSnapshot of a backup: %v, want FailedPrecondition", err)
	}

	resp, err = ctl.CreateVolume(t.Context(), &csi.CreateVolumeRequest{Name: "orders-again", VolumeCapabilities: []*csi.VolumeCapability{writer},
		CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 30}, Parameters: map[string]string{"node": n2.ID, "compression": "off"},
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snapshotID}}}})
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	restored := resp.GetVolume().GetVolumeId()
	if src := resp.GetVolume().GetContentSource().GetSnapshot().GetSnapshotId(); src != snapshotID {
		t.Errorf("the restored volume's source is %q, want %s", src, snapshotID)
	}
	dir, err := guesttest.Mount(t.Context(), t, n2, restored, "orders-again", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := checksums(t, n2, dir); got != want {
		t.Errorf("the restored volume holds\n%s\nthe volume held\n%s", got, want)
	}
	if got := owners(t, n2, dir); got != wantOwners {
		t.Errorf("the restored volume's owners and modes:\n%s\nthe volume's:\n%s", got, wantOwners)
	}
	ds := n2.RootDataset + "/" + restored
	if snaps := strings.TrimSpace(guesttest.Run(t, "zfs", "list", "-H", "-t", "snapshot", "-o", "name", ds)); snaps != "" {
		t.Errorf("the restored volume keeps snapshots: %s", snaps)
	}
	if role := zfsGet(t, "zfs-nomad:role", ds); role != "primary" {
		t.Errorf("the restored volume's role is %q, want primary", role)
	}

	// The operator restores it under the name it had, onto n1; a second
	// restore under that name is refused and changes nothing.
	restoreArgs := []string{"restore", "-peers", strings.Join(c.AgentAddresses(), ","), "-tls-ca", c.Operator.CA, "-tls-cert", c.Operator.Cert,
		"-tls-key", c.Operator.Key, "-backup-targets", "vault=" + guestcluster.TargetAddress(), "-node", n1.ID, snapshotID}
	out = guesttest.Run(t, ctlBin, restoreArgs...)
	if !strings.Contains(out, `volume "orders" (`+id+`) restored on node `+n1.ID) {
		t.Fatalf("zfs-controller restore under the old name:\n%s", out)
	}
	again, err := guesttest.Mount(t.Context(), t, n1, id, "orders", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := checksums(t, n1, again); got != want {
		t.Errorf("the volume restored under its old name holds\n%s\nthe volume held\n%s", got, want)
	}
	if out, code := exitOf(ctlBin, restoreArgs...); code != 1 || !strings.Contains(out, `volume "orders" exists`) {
		t.Errorf("a restore onto a name in use: exit %d, want 1 and a refusal:\n%s", code, out)
	}
	if got := checksums(t, n1, again); got != want {
		t.Errorf("a refused restore changed the volume:\n%s", got)
	}
	// It kept its parameters, backup_to among them: deleted again, it
	// stops adding backups.
	unpublish(t, c, id, "orders")
	if _, err := ctl.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatal(err)
	}

	// Only an operator's explicit command deletes backups.
	out = guesttest.Run(t, ctlBin, "delete-backups", "-peers", strings.Join(c.AgentAddresses(), ","), "-tls-ca", c.Operator.CA, "-tls-cert", c.Operator.Cert,
		"-tls-key", c.Operator.Key, "-backup-targets", "vault="+guestcluster.TargetAddress(), "-target", "vault", "-all", "orders")
	if !strings.Contains(out, "backups of "+id+" deleted from backup target vault") {
		t.Errorf("delete-backups -all orders:\n%s", out)
	}
	if left, err := guestcluster.Run("zfs", "list", "-H", "-r", "-o", "name", c.Target.RootDataset); err != nil || strings.Contains(left, id) {
		t.Errorf("after deleting every backup of %s the target holds:\n%s (%v)", id, left, err)
	}
	if got := checksums(t, n2, dir); got != want {
		t.Errorf("deleting the backups changed the restored volume:\n%s", got)
	}
}

// owners lists every file and directory under dir with its mode, owner
// and group.
func owners(t *testing.T, n *guestcluster.Node, dir string) string {
	t.Helper()
	return guesttest.Exec(t, n, "cd "+dir+" && find . | sort | xargs stat -c '%n %a %u %g'")
}

// sentToTarget is how many bytes n's running push of volume id has sent
// (0 when none runs).
func sentToTarget(t *testing.T, n pb.NodeAgentClient, id string) int64 {
	t.Helper()
	st, err := n.Status(t.Context(), &pb.StatusRequest{})
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	for _, tr := range st.GetTransfers() {
		if tr.GetVolumeId() == id {
			return tr.GetBytes()
		}
	}
	return 0
}

// syncBuffer is a strings.Builder a command's output goroutines and the
// test may use at once.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
