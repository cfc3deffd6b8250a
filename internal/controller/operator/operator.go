// Package operator holds the operator's commands (zfs-controller backup,
// zfs-controller status): they talk to the node agents directly, with an
// operator certificate, through the same peer list the controller uses.
package operator

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sort"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/migration"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// BackupOptions says where a backup goes and how long it waits.
type BackupOptions struct {
	// To is the node to push to; empty means where the schedule would
	// place the volume's replica (pickTarget).
	To string
	// Target is the backup target to push to, by the name the nodes'
	// backup_targets give it (docs/backups.md); To is then empty.
	Target string
	// WaitBusy bounds the wait for another operation on the volume (a
	// scheduled push, a move) to end; zero means give up at once.
	WaitBusy time.Duration
	// RetryEvery is how often a busy volume is tried again; zero means
	// every two seconds.
	RetryEvery time.Duration
	// StallTimeout cancels the push once it moved no data for this long
	// (zero: cluster.DefaultStallTimeout), as scheduled pushes and
	// catch-ups are: the push holds the volume's one push slot, so a hung
	// target or stream would otherwise keep the schedule and every move
	// of the volume out for as long as the command runs.
	StallTimeout time.Duration
}

// Backup pushes a volume now from its node to the backup target
// opts.Target, or to the node opts.To (or, if both are empty, where the
// schedule would place its replica: a node holding one, else the one
// with most room in its replication domain) and prints live progress to
// out.
//
// A volume whose node is pushing it already (the schedule's round, whose
// snapshot may predate the operator's request) answers Aborted: the
// backup waits for that push to end and then pushes its own, for up to
// opts.WaitBusy, so that what the node held when the command was typed
// reaches the target.
func Backup(ctx context.Context, cl *cluster.Cluster, volumeID string, opts BackupOptions, out io.Writer) error {
	if opts.To != "" && opts.Target != "" {
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "a backup goes to a node (-to) or to a backup target (-target), not both")
	}
	src, err := cluster.Find(ctx, cl, "volume "+volumeID, func(ctx context.Context, a cluster.Agent) (agentclient.Volume, error) {
		return a.GetVolume(ctx, volumeID)
	})
	if err != nil {
		return err
	}
	// where names the destination in the route line, who in errors.
	to, where, who := agentclient.Target{Backup: opts.Target}, "backup target "+opts.Target, "backup target "+opts.Target
	if opts.Target == "" {
		target, err := pickTarget(ctx, cl, src.Node, src.Object, opts.To)
		if err != nil {
			return err
		}
		to, where, who = agentclient.Target{Addr: target.Addr, NodeID: target.Info.NodeID}, target.Info.NodeID, "node "+target.Info.NodeID
	}
	stall := cmp.Or(opts.StallTimeout, cluster.DefaultStallTimeout)
	fmt.Fprintf(out, "backing up %s (%s) from %s to %s (cancelled if no data moves for %s)\n",
		volumeID, src.Object.Name, src.Node.Info.NodeID, where, stall)
	start := time.Now()
	reported := false // the node has taken a push and reported on it
	push := func(moved func()) (agentclient.Progress, error) {
		var most int64
		return cluster.Push(ctx, src.Node, volumeID, to, "backup", stall, func(p agentclient.Progress) {
			if p.Bytes > most || !reported {
				most, reported = max(most, p.Bytes), true
				moved()
			}
			fmt.Fprintf(out, "\r%s", FormatProgress(p, time.Since(start)))
		})
	}
	last, err := againWhenBroken(ctx, stall, retryEvery(opts), out, func(moved func()) (agentclient.Progress, error) {
		return whenIdle(ctx, opts, out, func() (agentclient.Progress, error) { return push(moved) })
	})
	if errors.Is(err, cluster.ErrStalled) {
		// Unavailable: the target, or the link to it, did not take the
		// data; the slot is free again for the schedule and moves.
		err = fmt.Errorf("%w: backup of volume %s to %s cancelled, freeing the volume's push slot: no data moved for %s "+
			"(check %s and the link to it, then run the backup again; -stall changes the bound): %w",
			errdefs.ErrUnavailable, volumeID, who, stall, who, err)
	}
	if err != nil {
		fmt.Fprintln(out)
		return err
	}
	if !last.Done {
		return errors.New("the node ended the backup without reporting completion")
	}
	fmt.Fprintf(out, "\ndone: %s snapshot %s\n", last.Kind, last.Snapshot)
	return nil
}

// whenIdle calls push until it answers anything but Aborted (another
// operation on the volume is running), trying again every
// opts.RetryEvery for up to opts.WaitBusy; it says once on out what it
// waits for.
func whenIdle(ctx context.Context, opts BackupOptions, out io.Writer, push func() (agentclient.Progress, error)) (agentclient.Progress, error) {
	every := retryEvery(opts)
	deadline := time.Now().Add(opts.WaitBusy)
	told := false
	for {
		last, err := push()
		if !errors.Is(err, errdefs.ErrAborted) {
			return last, err
		}
		if time.Now().Add(every).After(deadline) {
			if told {
				err = fmt.Errorf("still busy after waiting %s (raise -wait to wait longer): %w", opts.WaitBusy, err)
			}
			return last, err
		}
		if !told {
			fmt.Fprintf(out, "waiting up to %s for the volume's running operation to end: %v\n", opts.WaitBusy, err)
			told = true
		}
		select {
		case <-ctx.Done():
			return agentclient.Progress{}, fmt.Errorf("gave up waiting for the volume's running operation: %w", ctx.Err())
		case <-time.After(every):
		}
	}
}

// retryEvery is how often a busy or broken push is tried again.
func retryEvery(opts BackupOptions) time.Duration {
	if opts.RetryEvery <= 0 {
		return 2 * time.Second
	}
	return opts.RetryEvery
}

// againWhenBroken calls push again, every `every`, while it fails
// Unavailable (the stream from the source node broke: a keepalive ping
// unanswered on a loaded host, a reset connection, the node plugin
// restarting) and data moved within stall, the bound the command
// prints. The node resumes where the broken push stopped (the
// receiver keeps a resume token), so a stall of the source shorter
// than the bound costs the operator a line of output, not the backup.
// A TLS handshake refused (a target's certificate not of its role, a
// CA that differs) is Unavailable too, but no retry mends it: it is
// answered at once. push calls moved when the node first reports on a
// push and whenever data moves. The bound counts from then, or from the
// first break if none came before it: never from the command's start,
// whose wait for a busy volume (-wait) is no stall.
func againWhenBroken(ctx context.Context, stall, every time.Duration, out io.Writer, push func(moved func()) (agentclient.Progress, error)) (agentclient.Progress, error) {
	var lastMoved time.Time // zero until the node reports or a push breaks
	moved := func() { lastMoved = time.Now() }
	for {
		last, err := push(moved)
		if err == nil || !errors.Is(err, errdefs.ErrUnavailable) || errors.Is(err, cluster.ErrStalled) || tlsRefusal(err.Error()) {
			return last, err
		}
		if lastMoved.IsZero() {
			lastMoved = time.Now()
		}
		if time.Since(lastMoved)+every > stall {
			return last, fmt.Errorf("the push broke and no data moved for %s: %w", stall, err)
		}
		fmt.Fprintf(out, "\nthe push broke (%v): pushing again in %s, from where it stopped (given up once no data moved for %s)\n", err, every, stall)
		select {
		case <-ctx.Done():
			return last, fmt.Errorf("gave up pushing again after the push broke (%v): %w", err, ctx.Err())
		case <-time.After(every):
		}
	}
}

// pickTarget chooses where a backup goes: the node asked for, else where
// the schedule would place the volume's replica (cluster.ReplicaTargets):
// a healthy node that holds one already, else the one with most room in
// the volume's replication domain. Among the holders, a replica the
// schedule keeps goes before a copy a move demoted: the schedule removes
// such a copy once the kept replicas are as fresh, and a backup pushing
// into it would fail when that happens under it.
func pickTarget(ctx context.Context, cl *cluster.Cluster, src cluster.Node, vol agentclient.Volume, want string) (cluster.Node, error) {
	srcNode := src.Info.NodeID
	if want != "" {
		nodes, _, err := cl.Nodes(ctx)
		if err != nil {
			return cluster.Node{}, err
		}
		for _, n := range cluster.Healthy(nodes) {
			if id := n.Info.NodeID; id == want && id != srcNode {
				return n, nil
			}
		}
		return cluster.Node{}, errdefs.Wrap(errdefs.ErrNotFound, "node %q is not a healthy node other than the volume's own", want)
	}
	// Placement needs each node's room (cluster.Ask leaves it out), then
	// which of them hold a replica already.
	nodes, _, err := cl.Nodes(ctx)
	if err != nil {
		return cluster.Node{}, err
	}
	healthy := cluster.Healthy(nodes)
	var kept, demoted []cluster.Node
	for _, a := range cluster.Each(ctx, cl, healthy, func(ctx context.Context, n cluster.Node) (agentclient.NodeStatus, error) {
		return n.Agent.Status(ctx)
	}) {
		if a.Err != nil {
			continue
		}
		switch r, ok := replicaIn(a.Object, vol.VolumeID); {
		case ok && r.DemotedAtUnix != 0:
			demoted = append(demoted, a.Node)
		case ok:
			kept = append(kept, a.Node)
		}
	}
	targets, err := cluster.ReplicaTargets(src, vol.UsedBytes, 1, slices.Concat(kept, demoted), healthy)
	if len(targets) == 0 {
		return cluster.Node{}, fmt.Errorf("no node to back volume %s up to from node %s: %w", vol.VolumeID, srcNode, err)
	}
	return targets[0], nil
}

// replicaIn is the node's replica of volumeID, if its status lists one.
func replicaIn(st agentclient.NodeStatus, volumeID string) (agentclient.Replica, bool) {
	for _, r := range st.Replicas {
		if r.VolumeID == volumeID {
			return r, true
		}
	}
	return agentclient.Replica{}, false
}

// FormatProgress renders one progress line: bytes, rate and ETA.
func FormatProgress(p agentclient.Progress, elapsed time.Duration) string {
	rate := 0.0
	if elapsed > 0 {
		rate = float64(p.Bytes) / elapsed.Seconds()
	}
	line := fmt.Sprintf("%-11s %9s", p.Kind, contract.Bytes(p.Bytes))
	if total := p.TotalBytes; total > 0 {
		pct := min(100, 100*float64(p.Bytes)/float64(total))
		line += fmt.Sprintf(" of %s (%3.0f%%)", contract.Bytes(total), pct)
		if rate > 0 && !p.Done {
			eta := time.Duration(float64(max(0, total-p.Bytes)) / rate * float64(time.Second))
			line += fmt.Sprintf("  %s/s  ETA %s", contract.Bytes(int64(rate)), eta.Round(time.Second))
		}
	} else if rate > 0 {
		line += fmt.Sprintf("  %s/s", contract.Bytes(int64(rate)))
	}
	return line
}

// Report is what zfs-controller status finds: every copy of every
// volume on the nodes that answered, the transfers running, the stale
// primaries set aside, and the nodes that did not answer. Its JSON form
// (status -json) is for scripts.
type Report struct {
	// SchemaVersion is SchemaVersion: scripts check it.
	SchemaVersion int `json:"schema_version"`
	// Nodes: every node agent of the peer list, answering or not.
	Nodes     []NodeStatus     `json:"nodes"`
	Copies    []CopyStatus     `json:"copies"`
	Transfers []TransferStatus `json:"transfers"`
	SetAside  []SetAsideCopy   `json:"set_aside"`
	// Moves: what the controller instances catch up in the background,
	// or whose final step waits for the CO's retry (AddMoves).
	Moves []Move `json:"moves,omitempty"`
	// Backups: the newest backup of each primary on each target its
	// backup_to names (AddBackups; none without backup_targets).
	Backups []BackupStatus `json:"backups,omitempty"`
	// Controllers: the controller instances the nodes heard from, and
	// which one holds the work lease.
	Controllers []ControllerStatus `json:"controllers"`
	// Unreachable: the nodes that did not answer (as in Nodes), a node
	// that answered who it is but not what it holds, and each controller
	// instance asked for its moves in vain.
	Unreachable []Unreachable `json:"unreachable"`

	// backupFailures are the nodes' last failed backups, which
	// AddBackups shows beside the late ones.
	backupFailures []agentclient.BackupFailure
}

// Move is a move a controller instance runs in the background.
type Move struct {
	// Controller names the instance that runs it: its ID, or the address
	// it was asked at.
	Controller string `json:"controller,omitempty"`
	migration.MoveStatus
}

// CopyStatus is one copy of a volume on one node.
type CopyStatus struct {
	VolumeID string `json:"volume_id"`
	Name     string `json:"name"`
	Node     string `json:"node"`
	Role     string `json:"role"` // "primary" or "replica"
	// Of a primary: its generation, a move in progress, the failover it
	// came from, and whether another primary has the same generation
	// (docs/safety.md, I3: neither is staged until an operator sets one
	// aside).
	Generation   uint64 `json:"generation,omitempty"`
	MovingTo     string `json:"moving_to,omitempty"`
	FailedOverAt string `json:"failed_over_at,omitempty"`
	Conflict     bool   `json:"conflict,omitempty"`
	// Of a replica: the newest snapshot received and when its source took
	// it (zero: none completed yet), and whether a receive was cut and
	// waits to be resumed.
	LastSnapshot     string    `json:"last_snapshot,omitempty"`
	LastSnapshotTime time.Time `json:"last_snapshot_time,omitzero"`
	Resumable        bool      `json:"resumable,omitempty"`

	// parameters are a primary's, whose backup_to AddBackups reads.
	parameters map[string]string
}

// TransferStatus is a push running on its source node.
type TransferStatus struct {
	VolumeID   string    `json:"volume_id"`
	From       string    `json:"from"`
	To         string    `json:"to"`
	Kind       string    `json:"kind"`
	Bytes      int64     `json:"bytes"`
	TotalBytes int64     `json:"total_bytes,omitempty"`
	Started    time.Time `json:"started"`
	// Purpose says why it runs: "schedule", "backup", "catch-up for the
	// move to n2", "final step of the move to n2".
	Purpose string `json:"purpose,omitempty"`
}

// SetAsideCopy is a stale primary set aside after a failover.
type SetAsideCopy struct {
	Node    string `json:"node"`
	Dataset string `json:"dataset"`
}

// Unreachable is a node agent that did not answer, or answered only in
// part: Node is its ID when known, else its address.
type Unreachable struct {
	Node  string `json:"node"`
	Error string `json:"error"`
}

// Status asks every node for its copies, transfers and copies set aside.
func Status(ctx context.Context, cl *cluster.Cluster) (Report, error) {
	nodes, unreachable, err := cl.Nodes(ctx)
	if err != nil {
		return Report{}, err
	}
	report := Report{SchemaVersion: SchemaVersion, Nodes: nodeStatuses(nodes, unreachable),
		Copies: []CopyStatus{}, Transfers: []TransferStatus{}, SetAside: []SetAsideCopy{}, Unreachable: []Unreachable{}}
	for _, a := range cluster.Holdings(ctx, cl, nodes) {
		id, vols, st := a.Node.Info.NodeID, a.Object.Volumes, a.Object.Status
		if a.Err != nil {
			problem := Unreached(a.Node.Addr, a.Err)
			report.Unreachable = append(report.Unreachable, Unreachable{Node: id, Error: problem})
			report.nodeFailed(id, problem)
			continue
		}
		for _, v := range vols {
			report.Copies = append(report.Copies, CopyStatus{VolumeID: v.VolumeID, Name: v.Name, Node: id, Role: "primary",
				Generation: v.Generation, MovingTo: v.MovingTo, FailedOverAt: v.FailoverFromSnapshot, parameters: v.Parameters})
		}
		report.backupFailures = append(report.backupFailures, st.BackupFailures...)
		for _, name := range st.SetAside {
			report.SetAside = append(report.SetAside, SetAsideCopy{Node: id, Dataset: name})
		}
		for _, r := range st.Replicas {
			c := CopyStatus{VolumeID: r.VolumeID, Name: r.Name, Node: id, Role: "replica", LastSnapshot: r.LastSnapshot, Resumable: r.Resumable}
			if c.LastSnapshot != "" {
				c.LastSnapshotTime = time.Unix(r.LastSnapshotUnix, 0).UTC()
			}
			report.Copies = append(report.Copies, c)
		}
		for _, t := range st.Transfers {
			report.Transfers = append(report.Transfers, TransferStatus{VolumeID: t.VolumeID, From: id, To: t.Peer, Kind: t.Kind,
				Bytes: t.Bytes, TotalBytes: t.TotalBytes, Started: time.Unix(t.StartedUnix, 0).UTC(), Purpose: t.Purpose})
		}
	}
	for _, u := range unreachable {
		report.Unreachable = append(report.Unreachable, Unreachable{Node: u.Addr, Error: Unreached(u.Addr, u.Err)})
	}
	report.Controllers = controllerStatuses(ctx, cl, nodes, cluster.Members(nodes, len(unreachable)), time.Now())
	markConflicts(report.Copies)
	sort.Slice(report.Copies, func(i, j int) bool {
		a, b := report.Copies[i], report.Copies[j]
		if a.VolumeID != b.VolumeID {
			return a.VolumeID < b.VolumeID
		}
		if a.Role != b.Role {
			return a.Role < b.Role
		}
		return a.Node < b.Node
	})
	return report, nil
}

// PrintStatus writes a report as tables for people, with lags as of now.
func PrintStatus(out io.Writer, r Report, now time.Time) {
	printNodes(out, r.Nodes, now)
	printControllers(out, r.Controllers, now)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	header := "VOLUME\tNAME\tNODE\tROLE\tLAST SNAPSHOT\tLAG"
	if len(r.Backups) > 0 {
		header += "\tBACKUPS"
	}
	fmt.Fprintln(tw, header)
	for _, c := range r.Copies {
		line := fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s", c.VolumeID, c.Name, c.Node, describeRole(c), c.LastSnapshot, lag(c, now))
		if len(r.Backups) > 0 && c.Role == "primary" {
			line += "\t" + backupsOf(r.Backups, c.VolumeID, now)
		}
		fmt.Fprintln(tw, line)
	}
	tw.Flush()
	fmt.Fprintf(out, "\ntransfers running: %d\n", len(r.Transfers))
	for _, t := range r.Transfers {
		progress := FormatProgress(agentclient.Progress{Kind: t.Kind, Bytes: t.Bytes, TotalBytes: t.TotalBytes}, now.Sub(t.Started))
		purpose := ""
		if t.Purpose != "" {
			purpose = "  (" + t.Purpose + ")"
		}
		fmt.Fprintf(out, "  %s: %s -> %s  %s%s\n", t.VolumeID, t.From, t.To, progress, purpose)
	}
	printMoves(out, r.Moves, now)
	if len(r.SetAside) > 0 {
		fmt.Fprintf(out, "\nstale primaries set aside after a failover (an operator decides what to keep, then zfs destroy -r):\n")
		for _, a := range r.SetAside {
			fmt.Fprintf(out, "  %s on %s\n", a.Dataset, a.Node)
		}
	}
	// The nodes' problems head the report (printNodes).
	for _, u := range r.unreachableBesidesNodes() {
		fmt.Fprintf(out, "unreachable: %s: %s\n", u.Node, u.Error)
	}
}

// printMoves writes the controller's moves: a catch-up running shows as a
// transfer too; one caught up waits for the CO's retry of the publish,
// which runs the move's final step.
func printMoves(out io.Writer, moves []Move, now time.Time) {
	if len(moves) == 0 {
		return
	}
	fmt.Fprintf(out, "\nmoves in progress: %d\n", len(moves))
	instances := map[string]bool{}
	for _, m := range moves {
		instances[m.Controller] = true
	}
	for _, m := range moves {
		state := "catching up: " + FormatProgress(agentclient.Progress{Bytes: m.Bytes, TotalBytes: m.TotalBytes}, now.Sub(m.Started))
		switch {
		case m.Error != "":
			state = "failed (the publish's retry starts another): " + m.Error
		case !m.Moved.IsZero():
			state = fmt.Sprintf("moved %s ago; the publish's retry finds it there", now.Sub(m.Moved).Round(time.Second))
		case !m.NothingToMove.IsZero():
			state = fmt.Sprintf("not moved: %s ago its final step found it published again on its node, or no longer its primary there; the publish's retry decides afresh", now.Sub(m.NothingToMove).Round(time.Second))
		case m.FinalStep:
			state = fmt.Sprintf("final step running (fence, last increment, promotion), %s after the start", now.Sub(m.Started).Round(time.Second))
		case !m.CaughtUp.IsZero():
			state = fmt.Sprintf("caught up %s ago; final step pending: the next publish retry runs it", now.Sub(m.CaughtUp).Round(time.Second))
		}
		if !m.PublishedAhead.IsZero() && m.Moved.IsZero() {
			state += fmt.Sprintf("; published ahead of its end %s ago: the node's stage waits for it", now.Sub(m.PublishedAhead).Round(time.Second))
		}
		if len(instances) > 1 {
			state += " (controller " + m.Controller + ")"
		}
		fmt.Fprintf(out, "  %s: %s -> %s  %s\n", m.VolumeID, m.From, m.To, state)
	}
}

// describeRole is a copy's role as the status table shows it.
func describeRole(c CopyStatus) string {
	if c.Role != "primary" {
		return c.Role
	}
	role := fmt.Sprintf("primary g%d", c.Generation)
	if c.MovingTo != "" {
		role += ", moving to " + c.MovingTo
	}
	if c.FailedOverAt != "" {
		role += ", failed over at " + c.FailedOverAt
	}
	if c.Conflict {
		role += ", CONFLICT: another primary has this generation"
	}
	return role
}

// lag is how far a replica is behind as of now.
func lag(c CopyStatus, now time.Time) string {
	if c.Role != "replica" {
		return ""
	}
	lag := "never completed"
	if !c.LastSnapshotTime.IsZero() {
		lag = now.Sub(c.LastSnapshotTime).Round(time.Second).String()
	}
	if c.Resumable {
		lag += " (interrupted, resumable)"
	}
	return lag
}

// Promote is the operator's failover for a volume whose primary's node is
// lost and whose policy is manual: it promotes the replica on node (the
// freshest if empty) and says what may have been lost.
func Promote(ctx context.Context, m *migration.Migrator, volumeID, node string, force bool, out io.Writer) error {
	c, err := m.Promote(ctx, volumeID, node, force)
	if err != nil {
		return err
	}
	at := time.Unix(0, c.LastSnapshotUnixNano).UTC().Format(time.RFC3339)
	fmt.Fprintf(out, "volume %s: the replica on node %s is the primary now (generation %d).\n", volumeID, c.NodeID, c.Generation)
	fmt.Fprintf(out, "It holds the data as of %s (snapshot %s); writes on the lost primary after that are not in it.\n", at, c.LastSnapshot)
	fmt.Fprintf(out, "If the old primary's node returns, its copy is set aside (renamed %s-aside-<time>), never mounted.\n", volumeID)
	if force {
		// docs/install.md, "What the cluster must guarantee", 5.
		fmt.Fprintf(out, "Forced: the nodes that did not answer are declared lost. Before one of them comes back, stop its allocations and set its copy aside\n"+
			"(on it: zfs rename <root_dataset>/%[1]s <root_dataset>/%[1]s-aside-lost), or destroy it: should node %[2]s be down when they return,\n"+
			"they would be a majority that never heard of generation %[3]d, and could stage their older copy.\n", volumeID, c.NodeID, c.Generation)
	}
	return nil
}

// primaryRole describes a primary: its generation, a move in progress, a
// failover it came from.
// markConflicts marks primaries that share a volume and a generation
// with another primary (docs/safety.md, I3).
func markConflicts(copies []CopyStatus) {
	type key struct {
		volume     string
		generation uint64
	}
	count := map[key]int{}
	for _, c := range copies {
		if c.Role == "primary" {
			count[key{c.VolumeID, c.Generation}]++
		}
	}
	for i, c := range copies {
		if c.Role == "primary" && count[key{c.VolumeID, c.Generation}] > 1 {
			copies[i].Conflict = true
		}
	}
}

// RemoveReplica deletes node's replica of a volume: the replica a delete
// could not reach while its node was down, or one the operator no longer
// wants. Without force it refuses when no reachable node holds the
// volume's primary, since the replica may then be the last copy.
func RemoveReplica(ctx context.Context, cl *cluster.Cluster, volumeID, node string, force bool, out io.Writer) error {
	primaries, errs, err := cluster.FindAll(ctx, cl, func(ctx context.Context, a cluster.Agent) (agentclient.Volume, error) {
		return a.GetVolume(ctx, volumeID)
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
		if n.Info.NodeID != node {
			continue
		}
		cctx, cancel := cl.Call(ctx)
		defer cancel()
		deleted, err := n.Agent.DeleteReplica(cctx, volumeID, false)
		if err != nil {
			return fmt.Errorf("node %s: %w", node, err)
		}
		if !deleted {
			fmt.Fprintf(out, "node %s holds no replica of %s\n", node, volumeID)
			return nil
		}
		fmt.Fprintf(out, "removed the replica of %s on node %s\n", volumeID, node)
		return nil
	}
	return fmt.Errorf("node %s did not answer or is not a node of this cluster", node)
}

// AddMoves asks the controller instances, at their metrics addresses,
// for the moves they catch up or whose final step waits
// (migration.Moves), and adds them to the report: the instance at addr
// when it is set; otherwise every instance the nodes heard from
// (r.Controllers, which Status fills), or the one at fallback when they
// know none. An instance it cannot reach is reported unreachable. No
// address at all: the report has no moves.
func AddMoves(ctx context.Context, r *Report, addr, fallback string) {
	type instance struct{ name, addr string }
	var ask []instance
	switch {
	case addr != "":
		ask = []instance{{addr, addr}}
	case len(r.Controllers) > 0:
		for _, c := range r.Controllers {
			if c.Address != "" {
				ask = append(ask, instance{c.ID, c.Address})
			}
		}
	case fallback != "":
		ask = []instance{{fallback, fallback}}
	}
	// At once: an instance whose host is gone costs the fetch's timeout.
	answers := make([]struct {
		moves []migration.MoveStatus
		err   error
	}, len(ask))
	var wg sync.WaitGroup
	for i, in := range ask {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i].moves, answers[i].err = fetchMoves(ctx, in.addr)
		}()
	}
	wg.Wait()
	for i, in := range ask {
		if err := answers[i].err; err != nil {
			r.Unreachable = append(r.Unreachable, Unreachable{Node: "controller " + in.name, Error: "moves in progress unknown: " + err.Error()})
			continue
		}
		if r.Moves == nil {
			r.Moves = []Move{}
		}
		for _, m := range answers[i].moves {
			r.Moves = append(r.Moves, Move{Controller: in.name, MoveStatus: m})
		}
	}
	sort.SliceStable(r.Moves, func(i, j int) bool { return r.Moves[i].VolumeID < r.Moves[j].VolumeID })
}

// fetchMoves reads the controller's moves at addr (host:port; an empty
// or wildcard host is this host).
func fetchMoves(ctx context.Context, addr string) ([]migration.MoveStatus, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(host, port)+migration.MovesPath, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", migration.MovesPath, resp.Status)
	}
	var moves []migration.MoveStatus
	if err := json.NewDecoder(resp.Body).Decode(&moves); err != nil {
		return nil, fmt.Errorf("%s: %w", migration.MovesPath, err)
	}
	return moves, nil
}
