package bench

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"

	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guestcluster"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guesttest"
)

var (
	drainCounts = flag.String("drain-counts", "1,8,32", "volumes BenchmarkDrain moves off a node at once")
	drainMiB    = flag.Int("drain-mib", 16, "MiB of random data in each volume BenchmarkDrain moves")
)

// BenchmarkDrain: N volumes (-drain-counts, 1, 8 and 32) of
// -drain-mib MiB each, without replicas, moved off a node at once, as a
// drain of N jobs does: one ControllerPublishVolume per volume to another
// node, retried every second while the answer says the target is being
// caught up (as Nomad's claim retries, with its backoff), and the calls of all
// volumes one at a time, as Nomad sends a plugin's controller calls, then
// NodeStageVolume there. It reports the time until every volume is staged
// on the new node, per volume,
// and against zfs send | zfs receive of the same volumes one after
// another between the same pools (the bytes alone, measured before).
func BenchmarkDrain(b *testing.B) {
	c := guesttest.StartCluster(b, 2, guestcluster.Options{LogLevel: "info", ControllerArgs: []string{"-schedule-every", "0"}})
	n1, n2 := c.Nodes[0], c.Nodes[1]
	ctx := context.Background()
	ctl := controllerClient(b, c)
	node2 := csi.NewNodeClient(guesttest.Dial(b, n2.CSIEndpoint))
	staging := func(id string) string { return filepath.Join(n2.Dir, "staging-"+id) }
	var table []string
	b.ResetTimer()
	for _, field := range strings.Split(*drainCounts, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(field))
		if err != nil || n < 1 {
			b.Fatalf("-drain-counts %q: counts must be positive numbers", *drainCounts)
		}
		b.StopTimer()
		ids := drainVolumes(b, ctl, n1, n)
		raw := timed(func() {
			for _, id := range ids {
				sh(b, fmt.Sprintf("zfs snapshot %[1]s/%[2]s@raw && zfs send -L -c %[1]s/%[2]s@raw | zfs recv -u %[3]s/raw-%[2]s", n1.RootDataset, id, n2.Pool))
			}
		})
		for _, id := range ids {
			sh(b, fmt.Sprintf("zfs destroy -r %s/raw-%s && zfs destroy %s/%s@raw", n2.Pool, id, n1.RootDataset, id))
		}
		b.StartTimer()

		var serial sync.Mutex // Nomad sends a plugin's controller calls one at a time
		var wg sync.WaitGroup
		took := make([]time.Duration, n)
		began := time.Now()
		for i, id := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := claim(ctx, oneAtATime{ctl, &serial}, node2, staging(id), &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: n2.ID, VolumeCapability: mountCapability})
				if err != nil {
					b.Error(err)
				}
				took[i] = time.Since(began)
			}()
		}
		wg.Wait()
		all := time.Since(began)
		b.StopTimer()
		row := fmt.Sprintf("%7d %9d %10.1f %12.2f %10.1f %8.2f %10.1f", n, *drainMiB, all.Seconds(), all.Seconds()/float64(n), raw.Seconds(), all.Seconds()/raw.Seconds(), maxDuration(took).Seconds())
		table = append(table, row)
		fmt.Printf("BenchmarkDrain: %s\nBenchmarkDrain: %s\n", drainHeader, row)
		for _, id := range ids {
			if _, err := node2.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging(id)}); err != nil {
				b.Fatal(err)
			}
			deleteVolume(b, ctl, id)
		}
		b.StartTimer()
	}
	b.StopTimer()
	b.Logf("volumes moved off a node at once, each alone in its calls as under Nomad (seconds):\n%s\n%s", drainHeader, strings.Join(table, "\n"))
}

const drainHeader = "volumes  MiB-each  all-moved  per-volume  raw-serial  all/raw  last-ready"

// drainVolumes creates n volumes on node, without replicas, each holding
// -drain-mib MiB of random data.
func drainVolumes(b *testing.B, ctl csi.ControllerClient, node *guestcluster.Node, n int) []string {
	ctx := context.Background()
	ids := make([]string, n)
	for i := range n {
		resp, err := ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: fmt.Sprintf("drain-%d-%d", n, i),
			CapacityRange: &csi.CapacityRange{RequiredBytes: int64(*drainMiB+64) << 20}, VolumeCapabilities: []*csi.VolumeCapability{mountCapability},
			Parameters: map[string]string{"node": node.ID, "compression": "off"}})
		if err != nil {
			b.Fatal(err)
		}
		ids[i] = resp.GetVolume().GetVolumeId()
		fill(b, node, ids[i], "data", *drainMiB)
	}
	return ids
}

// claim publishes as Nomad's claim of a volume for an allocation does
// (claimWithRetry in client/allocrunner/csi_hook.go): again while the
// answer is retryable (here: the target is being caught up), after 2 s,
// then twice as long each time up to a minute; then it stages the volume
// at staging on the node, as Nomad's client does next: a publish granted
// ahead of the move's end answers before the move is done, and the stage
// waits for it.
func claim(ctx context.Context, ctl csi.ControllerClient, node csi.NodeClient, staging string, req *csi.ControllerPublishVolumeRequest) (claimResult, error) {
	var r claimResult
	backoff := 2 * time.Second
	for deadline := time.Now().Add(30 * time.Minute); ; {
		resp, err := ctl.ControllerPublishVolume(ctx, req)
		r.publishes++
		if err == nil {
			r.granted = time.Now()
			_, err = node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: req.GetVolumeId(), StagingTargetPath: staging,
				VolumeCapability: mountCapability, PublishContext: resp.GetPublishContext()})
			r.staged = time.Now()
			return r, err
		}
		if !guestcluster.CatchingUp(err) || time.Now().After(deadline) {
			return r, err
		}
		time.Sleep(backoff)
		r.backoff += backoff
		backoff = min(2*backoff, time.Minute)
	}
}

// claimResult is what a claim took: its publishes, the time it slept
// between them, when the publish was granted and when the stage answered.
type claimResult struct {
	publishes       int
	backoff         time.Duration
	granted, staged time.Time
}

// oneAtATime sends a controller's publishes one at a time, as Nomad sends
// a plugin's controller calls.
type oneAtATime struct {
	csi.ControllerClient
	mu *sync.Mutex
}

func (o oneAtATime) ControllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest, opts ...grpc.CallOption) (*csi.ControllerPublishVolumeResponse, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.ControllerClient.ControllerPublishVolume(ctx, req, opts...)
}

func maxDuration(ds []time.Duration) time.Duration {
	var out time.Duration
	for _, d := range ds {
		out = max(out, d)
	}
	return out
}
