package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guestcluster"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guesttest"
)

// BenchmarkSnapshotBytes is what a volume's first push to a new replica
// sends with the CSI snapshots that follow the volume, against the stream
// of the newest state alone. The volume holds a 4 MiB file of random
// data, 1 MiB of it rewritten before each of ten CSI snapshots, so the
// snapshots reference 14 MiB of distinct blocks.
func BenchmarkSnapshotBytes(b *testing.B) {
	c := guesttest.StartCluster(b, 2, guestcluster.Options{LogLevel: "info"})
	n1, n2 := c.Nodes[0], c.Nodes[1]
	ctx := context.Background()
	ctl, id := createVolume(b, c, "snapshot-bytes", n1.ID, 1<<30)
	src := n1.RootDataset + "/" + id
	mnt := filepath.Join(n1.Dir, "snapshot-bytes")
	sh(b, fmt.Sprintf("mkdir -p %s && mount -t zfs %s %s && dd if=/dev/urandom of=%s/f bs=1M count=4 2>/dev/null", mnt, src, mnt, mnt))
	for i := range 10 {
		sh(b, fmt.Sprintf("dd if=/dev/urandom of=%s/f bs=1M count=1 seek=%d conv=notrunc 2>/dev/null && sync", mnt, i%4))
		if _, err := ctl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{SourceVolumeId: id, Name: fmt.Sprintf("s%d", i)}); err != nil {
			b.Fatal(err)
		}
	}
	sh(b, "umount "+mnt)
	newest := src + "@" + contract.SnapshotIDForName("s9")
	alone, err := strconv.ParseFloat(strings.TrimSpace(sh(b, "zfs send -nP -L -c "+newest+" | awk '$1==\"size\"{print $2}'")), 64)
	if err != nil {
		b.Fatal(err)
	}
	agentConn, err := c.DialAgent(n1.AgentAddress)
	if err != nil {
		b.Fatal(err)
	}
	defer agentConn.Close()
	agent := agentclient.New(agentConn)

	var sent float64
	var took usage
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var last agentclient.Progress
		took.add(measure(b, func() {
			if last, err = agent.Replicate(ctx, id, agentclient.Target{Addr: n2.AgentAddress, NodeID: n2.ID}, "bench", nil); err != nil {
				b.Fatal(err)
			}
		}))
		sent += float64(last.Bytes)
		held := strings.TrimSpace(sh(b, "zfs list -H -o name -t snapshot -d 1 "+n2.RootDataset+"/"+id+" | grep -c @snap- || true"))
		if held != "10" {
			b.Fatalf("the replica holds %s CSI snapshots, want 10", held)
		}
		dropReplica(b, n1, n2, id)
	}
	b.StopTimer()
	perPush := sent / float64(b.N)
	b.ReportMetric(perPush, "bytes-with-snapshots")
	b.ReportMetric(alone, "bytes-newest-alone")
	b.ReportMetric(perPush/alone, "with/alone")
	b.ReportMetric(took.wall.Seconds()/float64(b.N), "push-s")
	b.Logf("first push of a volume with 10 CSI snapshots: %.0f bytes (all 10 on the replica), %.2f s; its newest state alone: %.0f bytes; %.2fx",
		perPush, took.wall.Seconds()/float64(b.N), alone, perPush/alone)
}
