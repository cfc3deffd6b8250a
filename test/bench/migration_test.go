package bench

import (
	"bufio"
	"cmp"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guestcluster"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guesttest"
)

// The volume sizes the issues name. Flags, not environment variables: the
// guest gets the test's flags, not the host's environment.
var (
	migrationMiB     = flag.Int("migration-mib", 1000, "MiB of random data in each volume BenchmarkMigration moves")
	moves            = flag.Int("moves", 5, "moves BenchmarkMigration makes to a node holding a replica, and takes the medians of")
	fullMoves        = flag.Int("full-moves", 3, "moves BenchmarkMigration makes to a node holding no copy, and takes the medians of")
	flushOnUnpublish = flag.Bool("flush-on-unpublish", false, "BenchmarkMigration's controller runs the flush at unpublish (flush_on_unpublish, off by default)")
	unpublishGap     = flag.Duration("unpublish-gap", 0, "how long after the volume's ControllerUnpublishVolume from the source BenchmarkMigration's first publish on the target comes (Nomad's claim of the replacement retries 2 s, then 4 s, ... apart)")
)

// BenchmarkMigration: planned moves as Nomad sees them, from the first
// ControllerPublishVolume to the volume staged on the new node, with
// Nomad's retry schedule (claim), against a raw zfs send | socat | zfs
// recv of the same bytes between the same nodes, measured just before
// each move. As Nomad does, it unpublishes the volume from the source
// first (which, with -flush-on-unpublish, starts the flush to its
// replicas), -unpublish-gap before the first publish. Each move:
//   - to a replica: a volume of -migration-mib MiB moved back and forth
//     -moves times, 10 MiB written before each move (the raw send: the
//     incremental of those 10 MiB);
//   - to no copy: -full-moves volumes of -migration-mib MiB, each moved
//     once to a node that holds nothing of it (the raw send: the whole
//     volume).
//
// It reports the medians of each kind, and where each move's time went,
// read from the processes' logs (moveTimeline): one move alone varies by
// a third on this machine.
func BenchmarkMigration(b *testing.B) {
	args := []string{"-schedule-every", "0"}
	if *flushOnUnpublish {
		args = append(args, "-flush-on-unpublish")
	}
	c := guesttest.StartCluster(b, 2, guestcluster.Options{LogLevel: "info", ControllerArgs: args})
	ctl := controllerClient(b, c)
	b.ResetTimer()
	toReplica := movesToAReplica(b, c, ctl)
	toNoCopy := movesToNoCopy(b, c, ctl)
	b.StopTimer()
	b.ReportMetric(median(toReplica.ratios), "replica-move/raw")
	b.ReportMetric(median(toNoCopy.ratios), "full-move/raw")
	b.Logf("planned moves, first ControllerPublishVolume to staged on the new node, with Nomad's retries (medians):\n%s\n%s\n%s\n%s",
		moveHeader, toReplica.row("to a replica, 10 MiB delta"), toNoCopy.row("to no copy, whole volume"), timelineHeader)
	for _, t := range append(toReplica.timelines, toNoCopy.timelines...) {
		b.Log(t)
	}
}

// movesToAReplica moves one volume back and forth between the cluster's
// two nodes, each move's delta since the target's replica 10 MiB.
func movesToAReplica(b *testing.B, c *guestcluster.Cluster, ctl csi.ControllerClient) moveFigures {
	b.StopTimer()
	defer b.StartTimer()
	n1, n2 := c.Nodes[0], c.Nodes[1]
	_, id := createVolume(b, c, "moving", n1.ID, 2<<30)
	fill(b, n1, id, "data", *migrationMiB)
	agentConn, err := c.DialAgent(n1.AgentAddress)
	if err != nil {
		b.Fatal(err)
	}
	defer agentConn.Close()
	push(b, agentclient.New(agentConn), id, n2) // the replica on n2

	var figures moveFigures
	for i := range *moves {
		from, to := n1, n2
		if i%2 == 1 {
			from, to = n2, n1
		}
		// The base both copies share, and the baseline's own copy of it on
		// the target (a local send: both pools are in this kernel).
		ds := from.RootDataset + "/" + id
		base := strings.TrimSpace(sh(b, "zfs list -H -t snapshot -o name -s createtxg -d 1 "+ds+" | grep @zn- | tail -1"))
		sh(b, "zfs send -L -c "+base+" | zfs recv -u "+to.Pool+"/raw")
		fill(b, from, id, fmt.Sprintf("delta-%d", i), 10)
		delta := fmt.Sprintf("%s@delta-%d", ds, i)
		sh(b, "zfs snapshot "+delta)
		b.StartTimer()
		raw := timed(func() { socatSend(b, from, to, "-i "+base+" "+delta, to.Pool+"/raw") })
		b.StopTimer()
		sh(b, "zfs destroy -r "+to.Pool+"/raw")
		figures.add(b, c, ctl, id, from, to, raw)
		waitDemoted(b, from, id)
	}
	deleteVolume(b, ctl, id) // room for movesToNoCopy's
	return figures
}

// movesToNoCopy creates -full-moves volumes on the first node and moves
// each to the second, which holds nothing of it.
func movesToNoCopy(b *testing.B, c *guestcluster.Cluster, ctl csi.ControllerClient) moveFigures {
	b.StopTimer()
	defer b.StartTimer()
	from, to := c.Nodes[0], c.Nodes[1]
	var figures moveFigures
	for i := range *fullMoves {
		_, id := createVolume(b, c, fmt.Sprintf("whole-%d", i), from.ID, int64(*migrationMiB+64)<<20)
		fill(b, from, id, "data", *migrationMiB)
		snap := from.RootDataset + "/" + id + "@raw"
		sh(b, "zfs snapshot "+snap)
		b.StartTimer()
		raw := timed(func() { socatSend(b, from, to, snap, to.Pool+"/raw") })
		b.StopTimer()
		sh(b, "zfs destroy -r "+to.Pool+"/raw && zfs destroy "+snap)
		figures.add(b, c, ctl, id, from, to, raw)
		deleteVolume(b, ctl, id)
	}
	return figures
}

// moveFigures are the moves of one kind: each one's raw send and claim,
// in seconds, their ratio, and where the claim's time went.
type moveFigures struct {
	raws, claims, ratios []float64
	wholes, wholeRatios  []float64 // from the unpublish to the stage, and against the raw send
	timelines            []moveTimeline
}

// add moves volume id from one node to the other as Nomad does: the
// unpublish from the source, then -unpublish-gap later the claim, timed
// from its first publish (and from the unpublish) to its stage; then it
// unstages it there (a later move from that node needs it unpublished).
func (f *moveFigures) add(b *testing.B, c *guestcluster.Cluster, ctl csi.ControllerClient, id string, from, to *guestcluster.Node, raw time.Duration) {
	ctx := context.Background()
	node := csi.NewNodeClient(guesttest.Dial(b, to.CSIEndpoint))
	staging := filepath.Join(to.Dir, "staging-"+id)
	unpublished := time.Now()
	if _, err := ctl.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: from.ID}); err != nil {
		b.Fatal(err)
	}
	time.Sleep(*unpublishGap)
	began := time.Now()
	b.StartTimer()
	claimed, err := claim(ctx, ctl, node, staging, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: to.ID, VolumeCapability: mountCapability})
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	took := claimed.staged.Sub(began)
	if _, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		b.Fatal(err)
	}
	whole := claimed.staged.Sub(unpublished)
	t := readTimeline(b, c, id, from, to, unpublished, began, claimed)
	b.Logf("move %s, %s to %s: raw %.2f s, claimed and staged %.2f s: %.2fx; from the unpublish %.2f s: %.2fx; %s", id, from.ID, to.ID,
		raw.Seconds(), took.Seconds(), took.Seconds()/raw.Seconds(), whole.Seconds(), whole.Seconds()/raw.Seconds(), t)
	f.raws = append(f.raws, raw.Seconds())
	f.claims = append(f.claims, took.Seconds())
	f.ratios = append(f.ratios, took.Seconds()/raw.Seconds())
	f.wholes = append(f.wholes, whole.Seconds())
	f.wholeRatios = append(f.wholeRatios, whole.Seconds()/raw.Seconds())
	f.timelines = append(f.timelines, t)
}

const moveHeader = "moves                       n   raw-s  claim-s  claim/raw  (min-max)  from-unpublish-s  /raw"

func (f moveFigures) row(kind string) string {
	if len(f.ratios) == 0 {
		return fmt.Sprintf("%-27s %d", kind, 0)
	}
	return fmt.Sprintf("%-27s %d  %6.2f  %7.2f  %8.2fx  (%.2f-%.2f)  %16.2f  %.2fx", kind, len(f.ratios), median(f.raws), median(f.claims), median(f.ratios),
		slices.Min(f.ratios), slices.Max(f.ratios), median(f.wholes), median(f.wholeRatios))
}

// moveTimeline is where one move's time went: the seconds from its first
// publish at which each step ended, read from the controller's, the
// source's and the target's logs (a step not found, -1), and what
// Nomad's retries spent.
type moveTimeline struct {
	flushed, jobStarted, caughtUp, finalStep, fenced, sending, received, sent, promoted, granted, staged float64
	publishes                                                                                            int
	backoff                                                                                              float64
}

const timelineHeader = "each move, seconds from its first publish (negative: before it, after the unpublish): flush to the target's replica ended, job started, caught up, final step began (after its look), source fenced (after the reservation), final increment's stream begun (after the snapshot), received on the target, its push ended on the source, target promoted, publish granted, staged; publishes; Nomad's backoff slept"

func (t moveTimeline) String() string {
	return fmt.Sprintf("flushed %.2f, job %.2f, caught up %.2f, final step %.2f, fenced %.2f, sending %.2f, received %.2f, sent %.2f, promoted %.2f, granted %.2f, staged %.2f; %d publishes, %.1f s backoff",
		t.flushed, t.jobStarted, t.caughtUp, t.finalStep, t.fenced, t.sending, t.received, t.sent, t.promoted, t.granted, t.staged, t.publishes, t.backoff)
}

func readTimeline(b *testing.B, c *guestcluster.Cluster, id string, from, to *guestcluster.Node, unpublished, began time.Time, claimed claimResult) moveTimeline {
	since := func(at time.Time) float64 {
		if at.IsZero() {
			return -1
		}
		return at.Sub(began).Seconds()
	}
	ctl := volumeLog(b, c.Controller.Log, id, unpublished)
	src := volumeLog(b, from.Process.Log, id, began)
	tgt := volumeLog(b, to.Process.Log, id, began)
	fenced := src.first("volume fenced for a move", time.Time{})
	return moveTimeline{
		flushed: since(ctl.first("replica flushed", time.Time{})),
		jobStarted: since(cmp.Or(ctl.first("catching the move's target up in the background", time.Time{}),
			ctl.first("moving the volume in the background", time.Time{}))),
		caughtUp:  since(ctl.first("move's target caught up", time.Time{})),
		finalStep: since(ctl.first("moving volume", time.Time{})),
		fenced:    since(fenced),
		sending:   since(src.first("sending", fenced)),
		received:  since(tgt.first("received", fenced)),
		sent:      since(src.first("sent", fenced)),
		promoted:  since(tgt.first("replica promoted to primary", time.Time{})),
		granted:   since(claimed.granted),
		staged:    since(claimed.staged),
		publishes: claimed.publishes,
		backoff:   claimed.backoff.Seconds(),
	}
}

// logLines are a process's log lines about one volume from a time on.
type logLines []logLine

type logLine struct {
	at   time.Time
	text string
}

// hclogTime is the time at the start of each of go-hclog's text lines.
const hclogTime = "2006-01-02T15:04:05.000Z0700"

func volumeLog(b *testing.B, path, id string, from time.Time) logLines {
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	var out logLines
	scan := bufio.NewScanner(f)
	scan.Buffer(make([]byte, 1<<20), 1<<20)
	for scan.Scan() {
		line := scan.Text()
		stamp, _, ok := strings.Cut(line, " ")
		if !ok || !strings.Contains(line, "volume_id="+id) {
			continue
		}
		at, err := time.Parse(hclogTime, stamp)
		if err != nil || at.Before(from) {
			continue
		}
		out = append(out, logLine{at, line})
	}
	return out
}

// first is the time of the first line, not before after, whose message is
// msg (go-hclog writes "[LEVEL]  msg: key=value" or, from a named logger,
// "name: msg: key=value").
func (ls logLines) first(msg string, after time.Time) time.Time {
	for _, l := range ls {
		if l.at.Before(after) {
			continue
		}
		if strings.Contains(l.text, "  "+msg+":") || strings.Contains(l.text, ": "+msg+":") {
			return l.at
		}
	}
	return time.Time{}
}

// waitDemoted waits until the volume's copy on n is a replica: the
// controller demotes the old primary after answering the move.
func waitDemoted(b *testing.B, n *guestcluster.Node, id string) {
	var role string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if role = strings.TrimSpace(sh(b, "zfs get -H -o value zfs-nomad:role "+n.RootDataset+"/"+id)); role == "replica" {
			return
		}
	}
	b.Fatalf("waited 30 s for the old primary on %s to be demoted to a replica: its role is still %q", n.ID, role)
}
