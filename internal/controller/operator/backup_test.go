package operator

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster/clustertest"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// TestBackupTarget: a backup without -to goes where the schedule would
// put the volume's replica: a node that holds one, else the one with most
// room. The nodes' room must be asked for: placing over nodes asked
// without it found no node with room whenever no replica existed yet
// (test/nomad's backup failed so, depending on whether the schedule had
// pushed first). A replica the schedule keeps goes before a copy a move
// demoted, which the schedule removes as surplus (test/nomad's backup
// failed when that happened under it), whatever order the nodes answer
// in.
func TestBackupTarget(t *testing.T) {
	room := map[string]uint64{"n1": 5 << 30, "n2": 1 << 30, "n3": 3 << 30, "n4": 2 << 30}
	tests := []struct {
		name      string
		replicaOn []string // the nodes holding a replica of the volume
		demotedOn string   // the one of them whose replica a move demoted
		want      string
	}{
		{"no replica yet: the node with most room", nil, "", "n3"},
		{"the node that holds a replica", []string{"n2"}, "", "n2"},
		{"a kept replica before a demoted copy", []string{"n3", "n2"}, "n3", "n2"},
		{"a kept replica before a demoted copy, either order", []string{"n2", "n3"}, "n2", "n3"},
		{"a demoted copy when no other replica", []string{"n4"}, "n4", "n4"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var fakes clustertest.Fakes
			for _, id := range []string{"n1", "n2", "n3", "n4"} {
				agent := fakes.Add(agentclient.NodeInfo{NodeID: id, AvailableBytes: room[id], MaxVolumes: 100})
				if slices.Contains(tt.replicaOn, id) {
					vid := agent.PutReplica("backed-up", 1)
					if id == tt.demotedOn {
						agent.MarkDemoted(vid, time.Now())
					}
				}
			}
			cl := fakes.Cluster(t)
			nodes, _, err := cl.Nodes(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			var src cluster.Node
			for _, n := range nodes {
				if n.Info.NodeID == "n1" {
					src = n
				}
			}
			got, err := pickTarget(context.Background(), cl, src, agentclient.Volume{VolumeID: contract.VolumeIDForName("backed-up"), UsedBytes: 8 << 20}, "")
			if err != nil {
				t.Fatalf("no target: %v", err)
			}
			if got.Info.NodeID != tt.want {
				t.Errorf("backup goes to %s, want %s", got.Info.NodeID, tt.want)
			}
		})
	}
}

// TestBackupWaitsForRunningPush: a backup that meets a push of the volume
// running already (the schedule's) waits for it to end and then pushes
// its own, within -wait; without a wait, or past it, it fails Aborted
// and says so. test/nomad's backup failed when the schedule's first push
// of a new volume ran at the same moment.
func TestBackupWaitsForRunningPush(t *testing.T) {
	busy := errdefs.Wrap(errdefs.ErrAborted, "a transfer is running")
	tests := []struct {
		name      string
		busyCalls int // the node's answers Aborted before it pushes; -1: always
		wait      time.Duration
		wantErr   string // empty: done
		wantCalls int
	}{
		{"idle: pushes at once", 0, time.Minute, "", 1},
		{"busy twice: waits, then pushes", 2, time.Minute, "", 3},
		{"busy, no wait: fails at once", 1, 0, "a transfer is running", 1},
		{"busy beyond the wait: fails and says so", -1, 50 * time.Millisecond, "still busy after waiting", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fakes, src, id := backedUpVolume()
			src.RefuseTimes("Replicate", tt.busyCalls, busy)
			var out strings.Builder
			err := Backup(context.Background(), fakes.Cluster(t), id, BackupOptions{WaitBusy: tt.wait, RetryEvery: 5 * time.Millisecond}, &out)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("backup failed: %v\n%s", err, out.String())
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("backup answered %v, want an error saying %q", err, tt.wantErr)
			case tt.wantErr != "" && !errors.Is(err, errdefs.ErrAborted):
				t.Errorf("backup answered %v, not of kind Aborted", err)
			}
			pushes := 0
			for _, c := range src.Calls() {
				if strings.HasPrefix(c, "Replicate ") {
					pushes++
				}
			}
			if tt.wantCalls > 0 && pushes != tt.wantCalls {
				t.Errorf("the node was asked to push %d times, want %d", pushes, tt.wantCalls)
			}
			if waited := strings.Contains(out.String(), "waiting up to"); waited != (tt.busyCalls != 0 && tt.wait > 0) {
				t.Errorf("output says it waits: %v; output:\n%s", waited, out.String())
			}
		})
	}
}

// backedUpVolume is two fake nodes: n1 holds the primary of the volume
// id, n2 has room for its replica.
func backedUpVolume() (*clustertest.Fakes, *clustertest.FakeAgent, string) {
	fakes := &clustertest.Fakes{}
	src := fakes.Add(agentclient.NodeInfo{NodeID: "n1", AvailableBytes: 1 << 30, MaxVolumes: 100})
	fakes.Add(agentclient.NodeInfo{NodeID: "n2", AvailableBytes: 1 << 30, MaxVolumes: 100})
	return fakes, src, src.PutPrimary("backed-up", 1)
}

// TestBackupStallGuard: a backup holds the volume's one push slot, so a
// push that moves no data (a hung target or stream) is cancelled after
// the stall timeout, as the schedule's and the moves' pushes are, and the
// error says so. Without the guard the backup would wait as long as the
// command ran, and the schedule and moves of the volume with it.
func TestBackupStallGuard(t *testing.T) {
	fakes, src, id := backedUpVolume()
	released := make(chan struct{})
	src.BeforePush = func(ctx context.Context, _ string, each func(agentclient.Progress)) error {
		each(agentclient.Progress{Kind: "full", Bytes: 0}) // started, then nothing
		<-ctx.Done()
		close(released)
		return ctx.Err()
	}
	var out strings.Builder
	done := make(chan error, 1)
	go func() {
		done <- Backup(context.Background(), fakes.Cluster(t), id, BackupOptions{StallTimeout: 50 * time.Millisecond}, &out)
	}()
	select {
	case err := <-done:
		if !errors.Is(err, cluster.ErrStalled) || !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "push slot") {
			t.Fatalf("a stalled backup answered %v, want Unavailable naming the stall and the push slot", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a backup whose push moves no data still runs after 10 s (stall timeout 50 ms)")
	}
	select {
	case <-released:
	default:
		t.Error("the stalled push was not cancelled: it still holds the push slot")
	}
	if !strings.Contains(out.String(), "cancelled if no data moves for 50ms") {
		t.Errorf("the output does not say the backup's stall bound:\n%s", out.String())
	}
}

// TestBackupOutlivesABrokenStream: the stream from the source node may
// break under a running backup (on a loaded host its connection's
// keepalive ping went unanswered for 5 s, test/nomad 2026-12-07). The
// node resumes a push started again, so the command pushes again while
// data moved within the stall bound it prints, and gives up, saying
// why, once none did.
func TestBackupOutlivesABrokenStream(t *testing.T) {
	broken := errdefs.Wrap(errdefs.ErrUnavailable, "keepalive ping failed to receive ACK within timeout")
	refused := errdefs.Wrap(errdefs.ErrUnavailable, "peer 10.77.0.2:7670: connection error: desc = \"transport: authentication handshake failed: tls: failed to verify certificate: x509: certificate is valid for n2.node.zfs-nomad, not backup.zfs-nomad\"")
	tests := []struct {
		name       string
		busy       time.Duration // the volume busy (Aborted) this long first
		failure    error         // how a push breaks (nil: broken)
		moving     bool          // each broken push moved data first
		breaks     int           // pushes that break before one completes; -1: all
		wantErr    string
		wantPushes int // pushes taken, busy answers not counted; 0: any
	}{
		{"never broken: one push", 0, nil, true, 0, "", 1},
		{"broken twice after moving data: pushed three times", 0, nil, true, 2, "", 3},
		{"broken without moving data, within the bound: pushed again", 0, nil, false, 1, "", 2},
		{"always broken, no data moved: given up after the bound", 0, nil, false, -1, "no data moved for 60ms", 0},
		{"broken without moving data after a busy wait longer than the bound: pushed again", 100 * time.Millisecond, nil, false, 1, "", 2},
		{"a certificate refused: answered at once", 0, refused, false, -1, "not backup.zfs-nomad", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fakes, src, id := backedUpVolume()
			pushes := 0
			busyUntil := time.Now().Add(tt.busy)
			src.BeforePush = func(_ context.Context, _ string, each func(agentclient.Progress)) error {
				if time.Now().Before(busyUntil) {
					return errdefs.Wrap(errdefs.ErrAborted, "another operation on the volume is running")
				}
				pushes++
				if tt.breaks >= 0 && pushes > tt.breaks {
					return nil
				}
				if tt.moving {
					each(agentclient.Progress{Kind: "full", Bytes: 1 << 20})
				}
				return cmp.Or(tt.failure, broken)
			}
			var out strings.Builder
			err := Backup(context.Background(), fakes.Cluster(t), id, BackupOptions{StallTimeout: 60 * time.Millisecond, RetryEvery: 10 * time.Millisecond, WaitBusy: time.Second}, &out)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("backup failed: %v\n%s", err, out.String())
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, errdefs.ErrUnavailable)):
				t.Fatalf("backup answered %v, want Unavailable saying %q", err, tt.wantErr)
			}
			if tt.wantPushes > 0 && pushes != tt.wantPushes {
				t.Errorf("the node was asked to push %d times, want %d", pushes, tt.wantPushes)
			}
			if said := strings.Count(out.String(), "the push broke"); tt.breaks > 0 && said != tt.breaks {
				t.Errorf("the output tells of %d broken pushes, want %d:\n%s", said, tt.breaks, out.String())
			}
		})
	}
}

// TestBackupToATarget: -target hands the node the backup target's name
// alone (the node's own configuration says where it is), and never
// together with -to.
func TestBackupToATarget(t *testing.T) {
	fakes, src, id := backedUpVolume()
	var out strings.Builder
	if err := Backup(context.Background(), fakes.Cluster(t), id, BackupOptions{Target: "vault"}, &out); err != nil {
		t.Fatalf("backup to a target: %v\n%s", err, out.String())
	}
	if got := src.PushedTo(); len(got) != 1 || got[0] != (agentclient.Target{Backup: "vault"}) {
		t.Errorf("the node was asked to push to %+v, want the backup target vault alone", got)
	}
	if !strings.Contains(out.String(), "to backup target vault") {
		t.Errorf("the output does not name the target:\n%s", out.String())
	}
	err := Backup(context.Background(), fakes.Cluster(t), id, BackupOptions{Target: "vault", To: "n2"}, &out)
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("-to with -target: %v, want InvalidArgument", err)
	}
}
