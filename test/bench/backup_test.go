package bench

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guestcluster"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guesttest"
)

// BenchmarkBackup: a volume holding -replication-mib MiB of random data
// backed up in full from node n1 to a backup target (zfs-node target, its
// own pool and network namespace) by the driver's push, and restored from
// there onto node n2 by a CSI CreateVolume naming the backup (the
// controller's reservation, the target's grant, the node's fetch), each
// against zfs send | socat | zfs recv of the same data along the same
// path (n1 to the target's pool; the target's backup to n2), measured in
// the same run.
func BenchmarkBackup(b *testing.B) {
	c := guesttest.StartCluster(b, 2, guestcluster.Options{LogLevel: "info", BackupTarget: "vault", BackupTargetDisk: guesttest.Disk(3),
		ControllerArgs: []string{"-backups-as-snapshots"}})
	n1, n2, vault := c.Nodes[0], c.Nodes[1], c.Target
	v := filledVolume(b, c, n1)
	ctl, id, src, size, agent := v.ctl, v.id, v.dataset, v.size, v.agent
	chain := vault.RootDataset + "/" + id

	var toTarget, backup, fromTarget, restore usage
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		toTarget.add(measure(b, func() {
			if err := n1.SendToTarget(vault, "zfs send -L -c "+src+"@bench", vault.Pool+"/socat"); err != nil {
				b.Fatal(err)
			}
		}))
		sh(b, "zfs destroy -r "+vault.Pool+"/socat")

		backup.add(measure(b, func() {
			if _, err := agent.Replicate(context.Background(), id, agentclient.Target{Backup: vault.Name}, "bench", nil); err != nil {
				b.Fatal(err)
			}
		}))
		newest := strings.TrimSpace(sh(b, "zfs list -H -t snapshot -o name -s createtxg "+chain+" | tail -1"))

		fromTarget.add(measure(b, func() {
			if err := vault.SendOverTCP(n2, "zfs send -L -c "+newest, n2.Pool+"/socat"); err != nil {
				b.Fatal(err)
			}
		}))
		sh(b, "zfs destroy -r "+n2.Pool+"/socat")

		ref := contract.BackupRef{Target: vault.Name, VolumeID: id, Snapshot: strings.SplitN(newest, "@", 2)[1]}
		var restored string
		restore.add(measure(b, func() {
			resp, err := ctl.CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: fmt.Sprintf("bench-restored-%d", i),
				CapacityRange: &csi.CapacityRange{RequiredBytes: 2 << 30}, Parameters: map[string]string{"node": n2.ID, "compression": "off"},
				VolumeCapabilities: []*csi.VolumeCapability{mountCapability},
				VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
					Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: ref.SnapshotID()}}}})
			if err != nil {
				b.Fatal(err)
			}
			restored = resp.GetVolume().GetVolumeId()
		}))
		if _, err := ctl.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: restored}); err != nil {
			b.Fatal(err)
		}
		dropBackups(b, vault, n1, id)
	}
	b.StopTimer()
	mibps := func(u usage) float64 { return size / (1 << 20) / (u.wall.Seconds() / float64(b.N)) }
	b.ReportMetric(mibps(toTarget), "socat-to-target-MiB/s")
	b.ReportMetric(mibps(backup), "backup-MiB/s")
	b.ReportMetric(mibps(backup)/mibps(toTarget), "backup/socat")
	b.ReportMetric(mibps(fromTarget), "socat-from-target-MiB/s")
	b.ReportMetric(mibps(restore), "restore-MiB/s")
	b.ReportMetric(mibps(restore)/mibps(fromTarget), "restore/socat")
	b.Logf("stream %.0f MiB; to the target: socat %.1f, backup %.1f MiB/s (%.2f); from it: socat %.1f, restore %.1f MiB/s (%.2f)",
		size/(1<<20), mibps(toTarget), mibps(backup), mibps(backup)/mibps(toTarget), mibps(fromTarget), mibps(restore), mibps(restore)/mibps(fromTarget))
}

// dropBackups removes the volume's chain on the target and the node's
// hold on its base, so the next backup is a full one.
func dropBackups(b *testing.B, vault *guestcluster.Target, n1 *guestcluster.Node, id string) {
	chain := vault.RootDataset + "/" + id
	sh(b, "zfs list -H -t snapshot -o name "+chain+" | xargs -n1 zfs release zfs-nomad-base 2>/dev/null; zfs destroy -r "+chain)
	sh(b, "zfs list -H -t snapshot -o name -d 1 "+n1.RootDataset+"/"+id+" | grep @zn- | xargs -n1 zfs release zfs-nomad-base-backup:"+vault.Name+" 2>/dev/null; true")
}
