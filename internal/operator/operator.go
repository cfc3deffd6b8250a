// Package operator holds the operator's commands (zfs-controller backup,
// zfs-controller status): they talk to the node agents directly, with an
// operator certificate, through the same peer list the controller uses.
package operator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/migration"
	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
)

// Backup pushes a volume now from its node to the node toNode (or, if
// empty, the healthy node with the most free space, preferring one that
// already holds a replica) and prints live progress to out.
func Backup(ctx context.Context, cl *cluster.Cluster, volumeID, toNode string, out io.Writer) error {
	src, err := cluster.Find(ctx, cl, "volume "+volumeID, func(ctx context.Context, a pb.NodeAgentClient) (*pb.Volume, error) {
		return a.GetVolume(ctx, &pb.GetVolumeRequest{VolumeId: volumeID})
	})
	if err != nil {
		return err
	}
	target, err := pickTarget(ctx, cl, src.Node.Info.GetNodeId(), volumeID, toNode)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "backing up %s (%s) from %s to %s\n", volumeID, src.Object.GetName(), src.Node.Info.GetNodeId(), target.Info.GetNodeId())
	start := time.Now()
	last, err := cluster.Replicate(ctx, src.Node.Client, volumeID, target.Addr, func(p *pb.ReplicateProgress) {
		fmt.Fprintf(out, "\r%s", FormatProgress(p, time.Since(start)))
	})
	if err != nil {
		fmt.Fprintln(out)
		return err
	}
	if !last.GetDone() {
		return errors.New("the node ended the backup without reporting completion")
	}
	fmt.Fprintf(out, "\ndone: %s snapshot %s\n", last.GetKind(), last.GetSnapshot())
	return nil
}

// pickTarget chooses where a backup goes.
func pickTarget(ctx context.Context, cl *cluster.Cluster, srcNode, volumeID, want string) (cluster.Node, error) {
	nodes, _, err := cl.Nodes(ctx)
	if err != nil {
		return cluster.Node{}, err
	}
	var best cluster.Node
	bestHasReplica := false
	for _, n := range cluster.Healthy(nodes) {
		id := n.Info.GetNodeId()
		if id == srcNode {
			continue
		}
		if want != "" {
			if id == want {
				return n, nil
			}
			continue
		}
		hasReplica := holdsReplica(ctx, cl, n, volumeID)
		better := best.Info == nil ||
			(hasReplica && !bestHasReplica) ||
			(hasReplica == bestHasReplica && n.Info.GetAvailableBytes() > best.Info.GetAvailableBytes())
		if better {
			best, bestHasReplica = n, hasReplica
		}
	}
	if want != "" {
		return cluster.Node{}, errdefs.Wrap(errdefs.ErrNotFound, "node %q is not a healthy node other than the volume's own", want)
	}
	if best.Info == nil {
		return cluster.Node{}, errdefs.Wrap(errdefs.ErrResourceExhausted, "no healthy node other than %s to back up to", srcNode)
	}
	return best, nil
}

func holdsReplica(ctx context.Context, cl *cluster.Cluster, n cluster.Node, volumeID string) bool {
	cctx, cancel := cl.Call(ctx)
	defer cancel()
	st, err := n.Client.Status(cctx, &pb.StatusRequest{})
	if err != nil {
		return false
	}
	for _, r := range st.GetReplicas() {
		if r.GetVolumeId() == volumeID {
			return true
		}
	}
	return false
}

// FormatProgress renders one progress line: bytes, rate and ETA.
func FormatProgress(p *pb.ReplicateProgress, elapsed time.Duration) string {
	rate := 0.0
	if elapsed > 0 {
		rate = float64(p.GetBytes()) / elapsed.Seconds()
	}
	line := fmt.Sprintf("%-11s %9s", p.GetKind(), Bytes(p.GetBytes()))
	if total := p.GetTotalBytes(); total > 0 {
		pct := min(100, 100*float64(p.GetBytes())/float64(total))
		line += fmt.Sprintf(" of %s (%3.0f%%)", Bytes(total), pct)
		if rate > 0 && !p.GetDone() {
			eta := time.Duration(float64(max(0, total-p.GetBytes())) / rate * float64(time.Second))
			line += fmt.Sprintf("  %s/s  ETA %s", Bytes(int64(rate)), eta.Round(time.Second))
		}
	} else if rate > 0 {
		line += fmt.Sprintf("  %s/s", Bytes(int64(rate)))
	}
	return line
}

// Bytes renders a byte count with a binary unit.
func Bytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}

// Status prints every node's volumes, the replicas of each with their lag,
// and the transfers running now.
func Status(ctx context.Context, cl *cluster.Cluster, out io.Writer, now time.Time) error {
	nodes, unreachable, err := cl.Nodes(ctx)
	if err != nil {
		return err
	}
	var rows []row
	var transfers, setAside []string
	for _, n := range nodes {
		id := n.Info.GetNodeId()
		cctx, cancel := cl.Call(ctx)
		vols, verr := n.Client.ListVolumes(cctx, &pb.ListVolumesRequest{})
		st, serr := n.Client.Status(cctx, &pb.StatusRequest{})
		cancel()
		if err := errors.Join(verr, serr); err != nil {
			fmt.Fprintf(out, "node %s: %v\n", id, err)
			continue
		}
		for _, v := range vols.GetVolumes() {
			rows = append(rows, row{volume: v.GetVolumeId(), name: v.GetName(), node: id, role: primaryRole(v), generation: v.GetGeneration()})
		}
		for _, name := range st.GetSetAside() {
			setAside = append(setAside, fmt.Sprintf("%s on %s", name, id))
		}
		for _, r := range st.GetReplicas() {
			lag := now.Sub(time.Unix(r.GetLastSnapshotUnix(), 0)).Round(time.Second).String()
			if r.GetLastSnapshot() == "" {
				lag = "never completed"
			}
			if r.GetResumable() {
				lag += " (interrupted, resumable)"
			}
			rows = append(rows, row{volume: r.GetVolumeId(), name: r.GetName(), node: id, role: "replica", snapshot: r.GetLastSnapshot(), lag: lag})
		}
		for _, t := range st.GetTransfers() {
			transfers = append(transfers, fmt.Sprintf("%s: %s -> %s  %s", t.GetVolumeId(), id, t.GetPeer(),
				FormatProgress(&pb.ReplicateProgress{Kind: t.GetKind(), Bytes: t.GetBytes(), TotalBytes: t.GetTotalBytes()}, now.Sub(time.Unix(t.GetStartedUnix(), 0)))))
		}
	}
	markConflicts(rows)
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].volume != rows[j].volume {
			return rows[i].volume < rows[j].volume
		}
		return rows[i].role < rows[j].role
	})
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VOLUME\tNAME\tNODE\tROLE\tLAST SNAPSHOT\tLAG")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.volume, r.name, r.node, r.role, r.snapshot, r.lag)
	}
	tw.Flush()
	fmt.Fprintf(out, "\ntransfers running: %d\n", len(transfers))
	for _, t := range transfers {
		fmt.Fprintln(out, "  "+t)
	}
	if len(setAside) > 0 {
		fmt.Fprintf(out, "\nstale primaries set aside after a failover (an operator decides what to keep, then zfs destroy -r):\n")
		for _, a := range setAside {
			fmt.Fprintln(out, "  "+a)
		}
	}
	for _, u := range unreachable {
		fmt.Fprintf(out, "unreachable: %s: %v\n", u.Addr, u.Err)
	}
	return nil
}

// Promote is the operator's failover for a volume whose primary's node is
// lost and whose policy is manual: it promotes the replica on node (the
// freshest if empty) and says what may have been lost.
func Promote(ctx context.Context, m *migration.Migrator, volumeID, node string, force bool, out io.Writer) error {
	c, err := m.Promote(ctx, volumeID, node, force)
	if err != nil {
		return err
	}
	at := time.Unix(0, c.GetLastSnapshotUnixNano()).UTC().Format(time.RFC3339)
	fmt.Fprintf(out, "volume %s: the replica on node %s is the primary now (generation %d).\n", volumeID, c.GetNodeId(), c.GetGeneration())
	fmt.Fprintf(out, "It holds the data as of %s (snapshot %s); writes on the lost primary after that are not in it.\n", at, c.GetLastSnapshot())
	fmt.Fprintf(out, "If the old primary's node returns, its copy is set aside (renamed %s-aside-<time>), never mounted.\n", volumeID)
	return nil
}

// primaryRole describes a primary: its generation, a move in progress, a
// failover it came from.
// row is one copy in the status table.
type row struct {
	volume, name, node, role, snapshot, lag string
	generation                              uint64 // of a primary; 0 for a replica
}

// markConflicts marks primaries that share a volume and a generation
// with another primary (docs/safety.md, I3): neither is staged until an
// operator sets one aside.
func markConflicts(rows []row) {
	type key struct {
		volume     string
		generation uint64
	}
	count := map[key]int{}
	for _, r := range rows {
		if r.generation > 0 {
			count[key{r.volume, r.generation}]++
		}
	}
	for i, r := range rows {
		if r.generation > 0 && count[key{r.volume, r.generation}] > 1 {
			rows[i].role += ", CONFLICT: another primary has this generation"
		}
	}
}

func primaryRole(v *pb.Volume) string {
	role := fmt.Sprintf("primary g%d", v.GetGeneration())
	if v.GetMovingTo() != "" {
		role += ", moving to " + v.GetMovingTo()
	}
	if v.GetFailoverFromSnapshot() != "" {
		role += ", failed over at " + v.GetFailoverFromSnapshot()
	}
	return role
}

// RemoveReplica deletes node's replica of a volume: the replica a delete
// could not reach while its node was down, or one the operator no longer
// wants. Without force it refuses when no reachable node holds the
// volume's primary, since the replica may then be the last copy.
func RemoveReplica(ctx context.Context, cl *cluster.Cluster, volumeID, node string, force bool, out io.Writer) error {
	primaries, errs, err := cluster.FindAll(ctx, cl, func(ctx context.Context, a pb.NodeAgentClient) (*pb.Volume, error) {
		return a.GetVolume(ctx, &pb.GetVolumeRequest{VolumeId: volumeID})
	})
	if err != nil {
		return err
	}
	if len(primaries) == 0 && !force {
		return fmt.Errorf("no reachable node holds volume %s as primary (%d nodes could not answer): the replica on %s may be its last copy; "+
			"if the volume was deleted while %s was down, run again with -force", volumeID, len(errs), node, node)
	}
	nodes, _, err := cl.Nodes(ctx)
	if err != nil {
		return err
	}
	for _, n := range nodes {
		if n.Info.GetNodeId() != node {
			continue
		}
		cctx, cancel := cl.Call(ctx)
		defer cancel()
		resp, err := n.Client.DeleteReplica(cctx, &pb.DeleteReplicaRequest{VolumeId: volumeID})
		if err != nil {
			return fmt.Errorf("node %s: %w", node, err)
		}
		if !resp.GetDeleted() {
			fmt.Fprintf(out, "node %s holds no replica of %s\n", node, volumeID)
			return nil
		}
		fmt.Fprintf(out, "removed the replica of %s on node %s\n", volumeID, node)
		return nil
	}
	return fmt.Errorf("node %s did not answer or is not a node of this cluster", node)
}
