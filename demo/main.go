// Command demo walks through the driver's story on real ZFS: three
// simulated nodes and a controller (package guestcluster), driven through the CSI
// API as a CO would. demo/run.sh boots the ZFS guest and runs it there;
// `make demo` calls that.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/operator"
	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guestcluster"
)

func main() {
	binDir := flag.String("bin", "/share/bin", "directory holding zfs-node and zfs-controller")
	flag.Parse()
	dir, err := os.MkdirTemp("", "zfs-demo")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := run(os.Stdout, *binDir, dir); err != nil {
		fmt.Fprintln(os.Stderr, "\ndemo failed:", err)
		os.Exit(1)
	}
}

// story narrates and fails on the first error.
type story struct {
	out    io.Writer
	binDir string
	c      *guestcluster.Cluster
	ctl    csi.ControllerClient
	node   map[string]csi.NodeClient
}

func (s *story) step(format string, args ...any) {
	fmt.Fprintf(s.out, "\n\033[1m== "+format+"\033[0m\n", args...)
}

func (s *story) say(format string, args ...any) { fmt.Fprintf(s.out, "   "+format+"\n", args...) }

func (s *story) shell(n *guestcluster.Node, script string) (string, error) {
	out, err := n.Exec(script)
	fmt.Fprintf(s.out, "   %s$ %s\n", n.ID, script)
	for _, line := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		if line != "" {
			fmt.Fprintf(s.out, "     %s\n", line)
		}
	}
	return out, err
}

func run(out io.Writer, binDir, dir string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	s := &story{out: out, binDir: binDir, node: map[string]csi.NodeClient{}}

	s.step("Three nodes, each with its own ZFS pool, network namespace and zfs-node; one zfs-controller")
	c, err := guestcluster.Start(guestcluster.Options{Nodes: 3, BinDir: binDir, Dir: dir, LogLevel: "info",
		// Nodes keep leases, as the shipped node job's do: without peers
		// a node grants no automatic failover (docs/safety.md). A short
		// lease, with the smallest margin it allows, so the failover
		// shows within the demo.
		Lease: 8 * time.Second,
		// Short intervals so the schedule shows within the demo.
		NodeArgs:       []string{"-min-replication-interval", "2s", "-lease-margin", "19s"},
		ControllerArgs: []string{"-schedule-every", "2s"},
	})
	if err != nil {
		return err
	}
	defer c.Close()
	s.c = c
	conn, err := grpc.NewClient(c.ControllerEndpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	s.ctl = csi.NewControllerClient(conn)
	for _, n := range c.Nodes {
		nc, err := grpc.NewClient(n.CSIEndpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		defer nc.Close()
		s.node[n.ID] = csi.NewNodeClient(nc)
		s.say("%s: pool %s, root dataset %s, agent at %s", n.ID, n.Pool, n.RootDataset, n.AgentAddress)
	}
	s.say("operator config on every node: max volume 10G, default 256M, volumes may set compression (lz4|off|zstd) and atime")
	return s.walk(ctx)
}

func (s *story) walk(ctx context.Context) error {
	s.step("Create a 256 MiB volume with compression=zstd; the controller places it on the node with most room")
	vol, err := s.create(ctx, &csi.CreateVolumeRequest{Name: "web-data", CapacityRange: &csi.CapacityRange{RequiredBytes: 256 << 20},
		Parameters: map[string]string{"compression": "zstd"}})
	if err != nil {
		return err
	}
	n := s.nodeOf(vol)
	s.shell(n, "zfs get -H -o property,value refquota,compression,mountpoint,zfs-nomad:name,zfs-nomad:role "+n.RootDataset+"/"+vol.GetVolumeId())

	s.step("Stage and publish it on %s, as Nomad does for an allocation there, and write files", n.ID)
	target, err := s.mount(ctx, n, vol.GetVolumeId(), "web")
	if err != nil {
		return err
	}
	if _, err := s.shell(n, "echo 'version 1' > "+target+"/index.html && seq 1 20000 > "+target+"/numbers && sha256sum "+target+"/*"); err != nil {
		return err
	}

	s.step("Snapshot it, then change a file")
	snap, err := s.ctl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "web-data-v1", SourceVolumeId: vol.GetVolumeId()})
	if err != nil {
		return err
	}
	s.say("snapshot %s, ready=%v, %d bytes", snap.GetSnapshot().GetSnapshotId(), snap.GetSnapshot().GetReadyToUse(), snap.GetSnapshot().GetSizeBytes())
	s.shell(n, "echo 'version 2' > "+target+"/index.html && cat "+target+"/index.html")

	s.step("Restore the snapshot into a new volume: it holds version 1")
	restored, err := s.createHolding(ctx, n, "restored", "version 1", &csi.CreateVolumeRequest{Name: "web-data-restored", CapacityRange: &csi.CapacityRange{RequiredBytes: 256 << 20},
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.GetSnapshot().GetSnapshotId()}}}})
	if err != nil {
		return err
	}

	s.step("Clone the live volume: the clone holds version 2, made in an instant on the same node")
	clone, err := s.createHolding(ctx, n, "clone", "version 2", &csi.CreateVolumeRequest{Name: "web-data-clone",
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: vol.GetVolumeId()}}}})
	if err != nil {
		return err
	}

	s.step("Back it up to another node now, with live progress: zfs-controller backup (operator certificate, mutual TLS)")
	other := s.c.Nodes[0]
	if other.ID == n.ID {
		other = s.c.Nodes[1]
	}
	if err := s.operator(ctx, "backup", "-to", other.ID, vol.GetVolumeId()); err != nil {
		return err
	}
	s.shell(n, "echo 'version 3' > "+target+"/index.html")
	if err := s.operator(ctx, "backup", vol.GetVolumeId()); err != nil {
		return err
	}
	s.say("the second backup found the replica on %s and sent only the change", other.ID)

	s.step("Replicas on a schedule: a volume asking for 2 replicas, at most 4 s old")
	orders, err := s.create(ctx, &csi.CreateVolumeRequest{Name: "orders", CapacityRange: &csi.CapacityRange{RequiredBytes: 128 << 20},
		Parameters: map[string]string{"replicas": "2", "replication_interval": "4s"}})
	if err != nil {
		return err
	}
	if err := s.waitForReplicas(ctx, orders.GetVolumeId(), 2); err != nil {
		return err
	}
	if err := s.status(ctx); err != nil {
		return err
	}

	if err := s.follow(ctx, orders); err != nil {
		return err
	}

	s.step("Expand the volume online to 512 MiB")
	exp, err := s.ctl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: vol.GetVolumeId(), CapacityRange: &csi.CapacityRange{RequiredBytes: 512 << 20}})
	if err != nil {
		return err
	}
	s.say("capacity now %d MiB, node expansion required: %v", exp.GetCapacityBytes()>>20, exp.GetNodeExpansionRequired())
	s.shell(n, "df -h "+target+" | tail -1")

	s.step("The operator's bounds hold whatever a job submitter asks")
	for _, bad := range []*csi.CreateVolumeRequest{
		{Name: "escape", Parameters: map[string]string{"mountpoint": "/etc"}},
		{Name: "huge", CapacityRange: &csi.CapacityRange{RequiredBytes: 20 << 30}},
		{Name: "gzip", Parameters: map[string]string{"compression": "gzip-9"}},
	} {
		_, err := s.create(ctx, bad)
		st := status.Convert(err)
		s.say("%s -> %s: %s", bad.GetName(), st.Code(), st.Message())
	}

	s.step("Topology: ask for node n3 and get it")
	pinned, err := s.create(ctx, &csi.CreateVolumeRequest{Name: "on-n3",
		AccessibilityRequirements: &csi.TopologyRequirement{Requisite: []*csi.Topology{{Segments: map[string]string{config.TopologyNodeKey: "n3"}}}}})
	if err != nil {
		return err
	}
	if got := s.nodeOf(pinned).ID; got != "n3" {
		return fmt.Errorf("volume landed on %s, want n3", got)
	}

	ledger, err := s.failover(ctx)
	if err != nil {
		return err
	}

	s.step("Clean up: unpublish everything, delete volumes and the snapshot")
	for _, v := range []*csi.Volume{vol, restored, clone} {
		if err := s.unmount(ctx, s.nodeOf(v), v.GetVolumeId()); err != nil {
			return fmt.Errorf("unmounting volume %s on %s: %w", v.GetVolumeId(), s.nodeOf(v).ID, err)
		}
	}
	// The snapshot outlives its volume; the dataset stays hidden until the snapshot goes.
	for _, v := range []*csi.Volume{vol, clone, restored, pinned, orders, ledger} {
		if err := s.deleteVolume(ctx, v.GetVolumeId()); err != nil {
			return err
		}
	}
	list, err := s.ctl.ListSnapshots(ctx, &csi.ListSnapshotsRequest{})
	if err != nil {
		return err
	}
	s.say("volumes deleted; snapshots still listed: %d (snapshots are independent of their volume)", len(list.GetEntries()))
	if _, err := s.ctl.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: snap.GetSnapshot().GetSnapshotId()}); err != nil {
		return err
	}
	// A replica that held snapshots the failed-over primary lacks is set
	// aside by the first push after the failover, not destroyed. Replicas
	// share a base (docs/replication.md), so it takes a replica that
	// missed the other's base (a push that failed, or one cut short by
	// the demo's own steps). Deletes leave set-aside copies to the
	// operator, who lets them go here as above.
	for _, n := range s.c.Nodes {
		out, _ := guestcluster.Run("sh", "-c", "zfs list -H -o name -r "+n.RootDataset+" | grep -- -aside- || true")
		if aside := strings.Fields(out); len(aside) > 0 {
			s.say("the operator lets the copies set aside on %s go too: %s", n.ID, strings.Join(aside, " "))
			if _, err := s.shell(n, "zfs list -H -o name -r "+n.RootDataset+" | grep -- -aside- | xargs -r -n1 zfs destroy -r"); err != nil {
				return err
			}
		}
	}
	for _, n := range s.c.Nodes {
		// Deletes answer once the datasets are gone; a push the schedule
		// started just before may still be settling its last snapshot.
		var left []string
		var err error
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Second) {
			left, err = guestcluster.DatasetsLeft(n.RootDataset)
			if err == nil && len(left) == 0 || time.Now().After(deadline) {
				break
			}
		}
		s.say("%s: %s, and its promise records (%s/%s)", n.ID, n.RootDataset, n.RootDataset, copyrecord.PromisesDataset)
		if err != nil || len(left) > 0 {
			return fmt.Errorf("%s still holds datasets 30 s after every volume and snapshot was deleted: %v %v", n.ID, left, err)
		}
	}
	s.step("Done: every dataset, replica and snapshot is gone; only the operator's root datasets (and each node's promise records) remain")
	return nil
}

// operator runs zfs-controller as the operator would, printing its output.
func (s *story) operator(ctx context.Context, args ...string) error {
	peers := s.c.AgentAddresses()
	op := s.c.Operator
	full := append([]string{args[0], "-peers", strings.Join(peers, ","), "-tls-ca", op.CA, "-tls-cert", op.Cert, "-tls-key", op.Key}, args[1:]...)
	fmt.Fprintf(s.out, "   $ zfs-controller %s [peers and operator certificate] %s\n", args[0], strings.Join(args[1:], " "))
	cmd := exec.CommandContext(ctx, filepath.Join(s.binDir, "zfs-controller"), full...)
	cmd.Stdout, cmd.Stderr = &indent{w: s.out}, &indent{w: s.out}
	return cmd.Run()
}

// status runs zfs-controller status. Its verdicts (exit statuses 3 to
// 6: a node down, no primary, no work-lease holder, replicas missing or
// late) are what the story shows at that moment, not failures of it:
// they are told, and the story goes on.
func (s *story) status(ctx context.Context) error {
	err := s.operator(ctx, "status")
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.ExitCode() >= operator.ExitDegraded {
		s.say("status exits %d: the report above says why", exit.ExitCode())
		return nil
	}
	return err
}

// replicas lists the replicas of a volume that the nodes report; a node
// that does not answer is left out.
func (s *story) replicas(ctx context.Context, id string) ([]agentclient.Replica, error) {
	var out []agentclient.Replica
	for _, n := range s.c.Nodes {
		conn, err := s.c.DialAgent(n.AgentAddress)
		if err != nil {
			return nil, err
		}
		st, err := agentclient.New(conn).Status(ctx)
		conn.Close()
		if err != nil {
			continue
		}
		for _, r := range st.Replicas {
			if r.VolumeID == id {
				out = append(out, r)
			}
		}
	}
	return out, nil
}

// waitForReplicas waits until want nodes hold a completed replica.
func (s *story) waitForReplicas(ctx context.Context, id string, want int) error {
	have := 0
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(time.Second) {
		reps, err := s.replicas(ctx, id)
		if err != nil {
			return err
		}
		have = 0
		for _, r := range reps {
			if r.LastSnapshot != "" {
				have++
			}
		}
		if have >= want {
			s.say("the controller's schedule placed and filled %d replicas", have)
			return nil
		}
	}
	return fmt.Errorf("volume %s has %d complete replicas after 2 minutes, want %d", id, have, want)
}

// waitForReplicaAfter waits until a replica of the volume holds a snapshot
// taken after t (snapshot times are whole seconds, so strictly after t's
// second).
func (s *story) waitForReplicaAfter(ctx context.Context, id string, t time.Time) error {
	var last int64
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(time.Second) {
		reps, err := s.replicas(ctx, id)
		if err != nil {
			return err
		}
		for _, r := range reps {
			last = max(last, r.LastSnapshotUnix)
		}
		if last > t.Unix() {
			return nil
		}
	}
	return fmt.Errorf("waited a minute for a replica of %s with a snapshot taken after %s: newest %s", id, t.Format(time.TimeOnly), time.Unix(last, 0).Format(time.TimeOnly))
}

// indent writes a child's output indented, carriage returns kept so live
// progress redraws its line.
type indent struct {
	w   io.Writer
	mid bool
}

func (i *indent) Write(b []byte) (int, error) {
	for _, c := range b {
		if !i.mid {
			fmt.Fprint(i.w, "     ")
			i.mid = true
		}
		fmt.Fprintf(i.w, "%c", c)
		if c == '\n' || c == '\r' {
			i.mid = false
		}
	}
	return len(b), nil
}

func (s *story) create(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.Volume, error) {
	req.VolumeCapabilities = []*csi.VolumeCapability{guestcluster.MountWriter()}
	resp, err := s.ctl.CreateVolume(ctx, req)
	if err != nil {
		return nil, err
	}
	v := resp.GetVolume()
	s.say("volume %q -> id %s on node %s, %d MiB", req.GetName(), v.GetVolumeId(), s.nodeOf(v).ID, v.GetCapacityBytes()>>20)
	return v, nil
}

// createHolding creates the volume req asks for from web-data's content
// (a snapshot or the volume itself), mounts it on n as label and checks
// that its index.html says want.
func (s *story) createHolding(ctx context.Context, n *guestcluster.Node, label, want string, req *csi.CreateVolumeRequest) (*csi.Volume, error) {
	v, err := s.create(ctx, req)
	if err != nil {
		return nil, err
	}
	target, err := s.mount(ctx, n, v.GetVolumeId(), label)
	if err != nil {
		return nil, err
	}
	if out, err := s.shell(n, "cat "+target+"/index.html"); err != nil || out != want+"\n" {
		return nil, fmt.Errorf("%s holds %q, want %s (%v)", label, out, want, err)
	}
	return v, nil
}

func (s *story) nodeOf(v *csi.Volume) *guestcluster.Node {
	id := v.GetVolumeContext()[config.TopologyNodeKey]
	for _, n := range s.c.Nodes {
		if n.ID == id {
			return n
		}
	}
	return nil
}

func (s *story) paths(n *guestcluster.Node, id string) (staging, target string) {
	return filepath.Join(n.Dir, "staging", id), filepath.Join(n.Dir, "alloc", id)
}

func (s *story) mount(ctx context.Context, n *guestcluster.Node, id, label string) (string, error) {
	staging, target := s.paths(n, id)
	if err := os.MkdirAll(staging, 0o755); err != nil {
		return "", err
	}
	nc := s.node[n.ID]
	if _, err := nc.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: guestcluster.MountWriter()}); err != nil {
		return "", err
	}
	if _, err := nc.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: guestcluster.MountWriter()}); err != nil {
		return "", err
	}
	s.say("%s: staged at %s, published at %s", label, staging, target)
	return target, nil
}

func (s *story) unmount(ctx context.Context, n *guestcluster.Node, id string) error {
	staging, target := s.paths(n, id)
	nc := s.node[n.ID]
	if _, err := nc.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
		return err
	}
	_, err := nc.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
	return err
}

// deleteVolume deletes a volume as `nomad volume delete` typed again
// would: a temporary refusal (a node busy, a push of the volume being
// stopped) is said and retried for a minute.
func (s *story) deleteVolume(ctx context.Context, id string) error {
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := s.ctl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
		if err == nil || !errdefs.Temporary(err) || time.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("deleting volume %s: %w", id, err)
			}
			return nil
		}
		s.say("(delete of %s: %s; retrying)", id, status.Convert(err).Message())
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}

// publish does what Nomad does for a claim on node n: ControllerPublish
// (which brings the data there), then stage and publish with the publish
// context.
func (s *story) publish(ctx context.Context, n *guestcluster.Node, id, label string) (string, error) {
	last := ""
	req := &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: n.ID, VolumeCapability: guestcluster.MountWriter()}
	resp, err := guestcluster.Publish(ctx, s.ctl, req, 3*time.Minute, func(err error) bool { // as Nomad retries a claim
		if !guestcluster.CatchingUp(err) && !errdefs.Temporary(err) {
			return false
		}
		if msg := status.Convert(err).Message(); msg != last {
			s.say("(publish: %s; retrying)", msg)
			last = msg
		}
		return true
	})
	if err != nil {
		return "", err
	}
	staging, target := s.paths(n, id)
	if err := os.MkdirAll(staging, 0o755); err != nil {
		return "", err
	}
	pc := resp.GetPublishContext()
	nc := s.node[n.ID]
	if _, err := nc.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: guestcluster.MountWriter(), PublishContext: pc}); err != nil {
		return "", err
	}
	if _, err := nc.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: guestcluster.MountWriter(), PublishContext: pc}); err != nil {
		return "", err
	}
	if after, ok := pc[contract.PublishContextAfterGeneration]; ok {
		s.say("%s: published on %s ahead of its move's end; its stage waited for the copy there to be promoted past generation %s", label, n.ID, after)
	} else {
		s.say("%s: published on %s with generation %s", label, n.ID, pc[contract.PublishContextGeneration])
	}
	return target, nil
}

// unpublish is the end of a claim on n: node unpublish and unstage, then
// ControllerUnpublish.
func (s *story) unpublish(ctx context.Context, n *guestcluster.Node, id string) error {
	if err := s.unmount(ctx, n, id); err != nil {
		return err
	}
	_, err := s.ctl.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: n.ID})
	return err
}

func (s *story) otherNode(not *guestcluster.Node) *guestcluster.Node {
	for _, n := range s.c.Nodes {
		if n.ID != not.ID {
			return n
		}
	}
	return nil
}

// follow moves a replicated volume with its workload.
func (s *story) follow(ctx context.Context, v *csi.Volume) error {
	from := s.nodeOf(v)
	s.step("Data follows the workload: a job on %s writes to %q, then Nomad moves it to another node", from.ID, "orders")
	dir, err := s.publish(ctx, from, v.GetVolumeId(), "orders")
	if err != nil {
		return err
	}
	sum, err := s.shell(from, "cd "+dir+" && dd if=/dev/urandom of=ledger bs=1M count=32 2>/dev/null && echo 'order 42' > last && sync && sha256sum ledger last")
	if err != nil {
		return err
	}
	to := s.otherNode(from)
	s.say("the job stops on %s (drain); Nomad claims the volume on %s: ControllerPublish fences the old copy, sends the final increment on top of the replica, promotes %s", from.ID, to.ID, to.ID)
	if err := s.unpublish(ctx, from, v.GetVolumeId()); err != nil {
		return err
	}
	started := time.Now()
	dir2, err := s.publish(ctx, to, v.GetVolumeId(), "orders")
	if err != nil {
		return err
	}
	s.say("moved in %.1f s", time.Since(started).Seconds())
	got, err := s.shell(to, "cd "+dir2+" && sha256sum ledger last")
	if err != nil || got != sum {
		return fmt.Errorf("after the move %s reads %q, want %q (%v)", to.ID, got, sum, err)
	}
	s.say("every file arrived; the old copy on %s is now a replica", from.ID)
	if err := s.status(ctx); err != nil {
		return err
	}
	return s.unpublish(ctx, to, v.GetVolumeId())
}

// failover loses the node of an auto-failover volume and brings it back.
func (s *story) failover(ctx context.Context) (*csi.Volume, error) {
	s.step("Failover: a volume with failover=auto and a replica; its node is lost")
	v, err := s.create(ctx, &csi.CreateVolumeRequest{Name: "ledger", CapacityRange: &csi.CapacityRange{RequiredBytes: 128 << 20},
		Parameters: map[string]string{"replicas": "1", "replication_interval": "4s", "failover": "auto"}})
	if err != nil {
		return nil, err
	}
	lost := s.nodeOf(v)
	dir, err := s.publish(ctx, lost, v.GetVolumeId(), "ledger")
	if err != nil {
		return nil, err
	}
	if _, err := s.shell(lost, "echo 'replicated' > "+dir+"/a && sync"); err != nil {
		return nil, err
	}
	if err := s.waitForReplicas(ctx, v.GetVolumeId(), 1); err != nil {
		return nil, err
	}
	// The schedule pushes every 4 s: wait for a push after the write.
	if err := s.waitForReplicaAfter(ctx, v.GetVolumeId(), time.Now()); err != nil {
		return nil, err
	}
	s.shell(lost, "echo 'written after the last replication' > "+dir+"/b && sync")
	s.say("%s's zfs-node dies and its link goes down; the job is still mounted there", lost.ID)
	lost.Kill()
	if err := lost.CutLink(); err != nil {
		return nil, err
	}
	survivor, err := s.replicaHolder(ctx, v.GetVolumeId(), lost)
	if err != nil {
		return nil, err
	}
	s.say("Nomad reschedules the job to %s: ControllerPublish promotes the freshest replica", survivor.ID)
	dir2, err := s.publish(ctx, survivor, v.GetVolumeId(), "ledger")
	if err != nil {
		return nil, err
	}
	if out, err := s.shell(survivor, "ls "+dir2+" && cat "+dir2+"/a"); err != nil || !strings.HasSuffix(out, "replicated\n") {
		return nil, fmt.Errorf("the promoted replica on %s lacks file a as replicated: %q (%v)", survivor.ID, out, err)
	}
	s.say("file b, written after the last replication, is not claimed to exist: the recovery point is logged and in metrics")
	s.metrics("zfs_nomad_failover_rpo_seconds_sum", "zfs_nomad_failover_promotion_seconds_sum", "zfs_nomad_migrations_total")

	s.step("%s comes back: its stale copy is refused, then set aside, never destroyed", lost.ID)
	if err := lost.RestoreLink(); err != nil {
		return nil, err
	}
	if err := lost.Start(); err != nil {
		return nil, err
	}
	// A fresh connection: the old one waits out gRPC's reconnect backoff.
	nc, err := grpc.NewClient(lost.CSIEndpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	s.node[lost.ID] = csi.NewNodeClient(nc)
	_, err = s.node[lost.ID].NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: v.GetVolumeId(), StagingTargetPath: filepath.Join(lost.Dir, "stale"),
		VolumeCapability: guestcluster.MountWriter(), PublishContext: map[string]string{contract.PublishContextGeneration: "2"}})
	s.say("staging the stale copy on %s: %s", lost.ID, status.Convert(err).Message())
	s.say("Nomad stops the lost allocation on %s; the next publish sets the stale copy aside", lost.ID)
	if err := s.unpublish(ctx, lost, v.GetVolumeId()); err != nil {
		return nil, err
	}
	for i := 0; ; i++ {
		if _, err := s.ctl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: v.GetVolumeId(), NodeId: survivor.ID, VolumeCapability: guestcluster.MountWriter()}); err != nil {
			return nil, err
		}
		if out, _ := guestcluster.Run("sh", "-c", "zfs list -H -o name -r "+lost.RootDataset+" | grep aside || true"); strings.TrimSpace(out) != "" {
			break
		}
		if i == 20 {
			out, _ := guestcluster.Run("zfs", "list", "-H", "-o", "name,zfs-nomad:role", "-r", lost.RootDataset)
			return nil, fmt.Errorf("waited 40 s for %s's stale copy of %s to be set aside; %s holds:\n%s", lost.ID, v.GetVolumeId(), lost.ID, out)
		}
		time.Sleep(2 * time.Second)
	}
	if err := s.status(ctx); err != nil {
		return nil, err
	}
	s.say("the operator looked at the stale copy and lets it go")
	if _, err := s.shell(lost, "zfs list -H -o name -r "+lost.RootDataset+" | grep -- -aside- | xargs -r -n1 zfs destroy -r"); err != nil {
		return nil, err
	}
	if err := s.unpublish(ctx, survivor, v.GetVolumeId()); err != nil {
		return nil, err
	}
	return v, nil
}

// replicaHolder returns the node other than not that holds a replica.
func (s *story) replicaHolder(ctx context.Context, id string, not *guestcluster.Node) (*guestcluster.Node, error) {
	for _, n := range s.c.Nodes {
		if n.ID == not.ID {
			continue
		}
		if out, _ := guestcluster.Run("zfs", "get", "-H", "-o", "value", "zfs-nomad:role", n.RootDataset+"/"+id); strings.TrimSpace(out) == "replica" {
			return n, nil
		}
	}
	return nil, fmt.Errorf("no node holds a replica of %s", id)
}

// metrics prints the controller's metric lines that start with one of
// prefixes.
func (s *story) metrics(prefixes ...string) {
	resp, err := http.Get(s.c.ControllerMetrics)
	if err != nil {
		s.say("metrics: %v", err)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	s.say("$ curl %s", s.c.ControllerMetrics)
	for _, line := range strings.Split(string(body), "\n") {
		for _, p := range prefixes {
			if strings.HasPrefix(line, p) {
				s.say("  %s", line)
			}
		}
	}
}
