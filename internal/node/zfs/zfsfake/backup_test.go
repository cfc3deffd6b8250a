package zfsfake_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/zfs-nomad/zfs-nomad/internal/node/agent"
	"github.com/zfs-nomad/zfs-nomad/internal/node/copylock"
	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/node/replication"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
)

// targetRoot is where the backup target of these tests keeps its chains.
const targetRoot = "tank/backups"

// backupSetup is a primary on n1 and a backup target "vault" whose clock
// the test moves.
type backupSetup struct {
	src, vault node
	id, fs     string
	now        time.Time
	target     *replication.TargetReceiver
	dial       func(string) (*grpc.ClientConn, error)
}

func newBackupSetup(t *testing.T, params map[string]string) *backupSetup {
	b := &backupSetup{id: "vol-0123456789abcdef0123", now: time.Date(2026, 12, 3, 0, 30, 0, 0, time.UTC)}
	b.fs = "tank/nomad/" + b.id
	b.src, b.vault = newNode(t, 1, "tank/nomad"), newNode(t, 7, targetRoot)
	must(t, b.src.CreateFilesystem(ctx, b.fs, map[string]string{copyrecord.PropRole: contract.RolePrimary, copyrecord.PropVolumeID: b.id,
		copyrecord.PropGeneration: "1", copyrecord.PropName: "web-data", copyrecord.PropParameters: copyrecord.EncodeParameters(params), "refquota": "1000000"}))
	b.target = replication.NewTargetReceiver(b.vault.s, targetRoot, "vault", 0, hclog.NewNullLogger())
	b.target.UseClock(func() time.Time { return b.now })
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	pb.RegisterReplicationServer(srv, &agent.ReplicationServer{Receiver: b.target})
	pb.RegisterBackupsServer(srv, &agent.BackupsServer{Target: b.target})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	b.dial = func(string) (*grpc.ClientConn, error) {
		return grpc.NewClient("passthrough:///vault", grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	}
	return b
}

// pusher returns a pusher on n that knows the target as "vault".
func (b *backupSetup) pusher(t *testing.T, n node, nodeID string) *replication.Pusher {
	p := replication.NewPusher(n.s, new(copylock.Locks), "tank/nomad", nodeID, 2, nil, agent.NewReplicationPeers(b.dial), hclog.NewNullLogger())
	p.UseTargets(map[string]string{"vault": "vault"}, agent.NewReplicationPeers(b.dial))
	t.Cleanup(p.Close)
	return p
}

func (b *backupSetup) backup(t *testing.T, p *replication.Pusher, want string) {
	t.Helper()
	prog, err := p.PushBackup(ctx, b.id, "vault", "test", 0, func(replication.Progress) {})
	if err != nil || prog.Kind != want {
		t.Fatalf("backup: %+v, %v; want a %s push", prog, err, want)
	}
}

// chain lists the snapshots of the target's current chain.
func (b *backupSetup) chain(t *testing.T) []string {
	t.Helper()
	var names []string
	for _, s := range b.vault.snaps(t, targetRoot+"/"+b.id) {
		names = append(names, s.Name)
	}
	return names
}

// TestBackupsFollowTheGrid: each backup to a target is one snapshot
// there, full then incremental, the newest holding what the primary held;
// the volume's grid, dated by the target's clock, prunes the rest: with
// 1h:3 and a backup every hour, the first of each of the last three
// hours stays. The chain is labelled with what a restore needs, and
// never mounted.
func TestBackupsFollowTheGrid(t *testing.T) {
	b := newBackupSetup(t, map[string]string{contract.ParamBackupRetention: "1h:3"})
	p := b.pusher(t, b.src, "n1")
	for i, word := range []string{"a", "b", "c", "d", "e"} {
		must(t, b.src.Write(b.fs, word))
		kind := replication.KindIncremental
		if i == 0 {
			kind = replication.KindFull
		}
		b.backup(t, p, kind)
		// A second backup in the same hour: a grid of hours keeps the
		// first of it, and the newest.
		if i == 2 {
			b.now = b.now.Add(time.Minute)
			b.backup(t, p, replication.KindIncremental)
		}
		b.now = b.now.Add(time.Hour)
	}
	chain := b.chain(t)
	if len(chain) != 3 {
		t.Fatalf("the target keeps %d backups, want 3 (1h:3): %v", len(chain), chain)
	}
	if got, want := b.vault.content(t, chain[2]), b.src.content(t, b.fs); !slices.Equal(got, want) {
		t.Errorf("the newest backup holds %v, the primary %v", got, want)
	}
	if got := b.vault.content(t, chain[0]); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("the oldest backup kept holds %v, want the third hour's first, a b c", got)
	}
	fs := targetRoot + "/" + b.id
	for prop, want := range map[string]string{copyrecord.PropRole: contract.RoleBackup, copyrecord.PropName: "web-data",
		copyrecord.PropRetention: "1h:3", "canmount": "off"} {
		if got := b.vault.get(t, fs, prop); got != want {
			t.Errorf("the chain's %s is %q, want %q", prop, got, want)
		}
	}
}

// TestATargetNeverRollsBackOrForgets: a copy that lacks the target's
// newest backup (a volume failed over to a replica that never had it)
// sends in full, and the target starts a new chain beside the old one,
// whose backups stay until the grid drops them; a stream dated in the
// future by its sender's clock ages nothing out.
func TestATargetNeverRollsBackOrForgets(t *testing.T) {
	b := newBackupSetup(t, map[string]string{contract.ParamBackupRetention: "1h:24"})
	p := b.pusher(t, b.src, "n1")
	for _, word := range []string{"a", "b"} {
		must(t, b.src.Write(b.fs, word))
		b.backup(t, p, map[string]string{"a": replication.KindFull, "b": replication.KindIncremental}[word])
		b.now = b.now.Add(time.Hour)
	}
	before := b.chain(t)

	// Another node's copy of the volume, without either backup.
	other := newNode(t, 2, "tank/nomad")
	must(t, other.CreateFilesystem(ctx, b.fs, map[string]string{copyrecord.PropRole: contract.RolePrimary, copyrecord.PropVolumeID: b.id,
		copyrecord.PropGeneration: "2", copyrecord.PropName: "web-data", "refquota": "1000000"}))
	must(t, other.Write(b.fs, "x"))
	q := b.pusher(t, other, "n2")
	q.UseClock(func() time.Time { return b.now.Add(365 * 24 * time.Hour) }) // its snapshot is named a year ahead
	b.backup(t, q, replication.KindFull)

	if got := b.vault.content(t, b.chain(t)[0]); !slices.Equal(got, []string{"x"}) {
		t.Errorf("the new chain holds %v, want the other copy's x", got)
	}
	children, err := b.vault.s.ChildProperties(ctx, targetRoot)
	must(t, err)
	var earlier []string
	for _, c := range children {
		if strings.HasPrefix(c.Name, targetRoot+"/"+b.id+"-chain-") {
			earlier = append(earlier, c.Name)
		}
	}
	if len(earlier) != 1 {
		t.Fatalf("earlier chains: %v, want the one the full push set aside", earlier)
	}
	kept := b.vault.snaps(t, earlier[0])
	if len(kept) != len(before) {
		t.Errorf("the earlier chain keeps %d backups, had %d", len(kept), len(before))
	}

	// The first copy's next backup starts a chain again: nothing it sends
	// follows the other's.
	must(t, b.src.Write(b.fs, "c"))
	b.now = b.now.Add(time.Hour)
	b.backup(t, p, replication.KindFull)
	if got := b.vault.content(t, b.chain(t)[0]); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("the newest chain holds %v", got)
	}
}

// TestABackupGoesOnlyToAConfiguredTarget: a push names a target by the
// name the node's operator gave it, or is refused before anything is
// taken or sent.
func TestABackupGoesOnlyToAConfiguredTarget(t *testing.T) {
	b := newBackupSetup(t, nil)
	p := b.pusher(t, b.src, "n1")
	before := len(b.src.snaps(t, b.fs))
	_, err := p.PushBackup(ctx, b.id, "elsewhere", "test", 0, func(replication.Progress) {})
	if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "backup_targets") {
		t.Errorf("a backup to an unknown target: %v, want NotFound naming backup_targets", err)
	}
	if n := len(b.src.snaps(t, b.fs)); n != before {
		t.Errorf("a refused backup left %d snapshots, were %d", n, before)
	}
}

// TestARestoreNeedsItsGrant: a node restores a backup only with the
// target's grant of that backup to that node: the whole volume as it was
// backed up, into a new dataset with the properties the create sets,
// without the backup's snapshot. A grant for another backup or node, or
// none, is refused; a backup the create's check refuses leaves nothing.
func TestARestoreNeedsItsGrant(t *testing.T) {
	b := newBackupSetup(t, nil)
	must(t, b.src.Write(b.fs, "a"))
	b.backup(t, b.pusher(t, b.src, "n1"), replication.KindFull)
	must(t, b.src.Write(b.fs, "b")) // after the backup: not restored
	held := b.chain(t)
	snap := held[len(held)-1][strings.Index(held[len(held)-1], "@")+1:]
	ref := contract.BackupRef{Target: "vault", VolumeID: b.id, Snapshot: snap}

	n2 := newNode(t, 2, "tank/nomad")
	q := b.pusher(t, n2, "n2")
	into := "tank/nomad/vol-99999999999999999999"
	props := map[string]string{copyrecord.PropRole: contract.RolePrimary, copyrecord.PropName: "restored"}
	fine := func(bool, uint64) error { return nil }
	if err := q.Restore(ctx, ref, "no-such-grant", into, props, fine); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("a restore without a grant: %v, want PermissionDenied", err)
	}
	grant, _, err := b.target.GrantRestore(ctx, b.id, snap, "n2")
	must(t, err)
	refused := errdefs.Wrap(errdefs.ErrOutOfRange, "too big")
	if err := q.Restore(ctx, ref, grant, into, props, func(bool, uint64) error { return refused }); !errors.Is(err, errdefs.ErrOutOfRange) {
		t.Errorf("a restore its check refuses: %v, want the check's error", err)
	}
	if _, err := n2.s.Property(ctx, into, "type"); err == nil {
		t.Errorf("a refused restore left %s", into)
	}
	if err := q.Restore(ctx, ref, grant, into, props, fine); err != nil {
		t.Fatalf("restore: %v", err)
	}
	if got := n2.content(t, into); !slices.Equal(got, []string{"a"}) {
		t.Errorf("the restored volume holds %v, want the backup's a", got)
	}
	if got := n2.get(t, into, copyrecord.PropName); got != "restored" {
		t.Errorf("the restored volume's name is %q, want the create's", got)
	}
	if snaps := n2.snaps(t, into); len(snaps) != 0 {
		t.Errorf("the restored volume keeps snapshots %v, want none", snaps)
	}

	// The target holds the grant to its node and backup.
	for _, tc := range []struct{ caller, snap string }{{"n3", snap}, {"n2", "zn-1"}} {
		err := b.target.SendBackup(ctx, tc.caller, b.id, tc.snap, grant, func(replication.Backup) error { return nil }, func([]byte) error { return nil })
		if !errors.Is(err, errdefs.ErrPermissionDenied) {
			t.Errorf("the grant of %s to n2 shown by %s for %s: %v, want PermissionDenied", snap, tc.caller, tc.snap, err)
		}
	}
}

// TestAnOperatorDeletesBackups: an operator deletes one backup (the held
// newest too: the next push then starts a new chain), or every backup of
// a volume in every chain.
func TestAnOperatorDeletesBackups(t *testing.T) {
	b := newBackupSetup(t, map[string]string{contract.ParamBackupRetention: "1h:24"})
	p := b.pusher(t, b.src, "n1")
	for i, word := range []string{"a", "b", "c"} {
		must(t, b.src.Write(b.fs, word))
		b.backup(t, p, map[bool]string{true: replication.KindFull, false: replication.KindIncremental}[i == 0])
		// The push's tidy runs after it returns: the last one prunes the
		// source's older snapshots, which the full push below relies on
		// (before it, the backup below would be planned from the chain's
		// oldest, and fail when the tidy pruned it under the send).
		tidied(t, b.src, b.fs, "backup:vault") // the target's key among the receivers
		b.now = b.now.Add(time.Hour)
	}
	short := func(full string) string { return full[strings.Index(full, "@")+1:] }
	chain := b.chain(t)
	for _, snap := range []string{chain[1], chain[2]} { // the middle, then the held newest
		deleted, err := b.target.DeleteBackups(ctx, b.id, short(snap))
		if err != nil || len(deleted) != 1 || deleted[0] != snap {
			t.Fatalf("deleting %s: %v, %v", snap, deleted, err)
		}
	}
	if got := b.chain(t); len(got) != 1 || got[0] != chain[0] {
		t.Fatalf("left %v, want only %s", got, chain[0])
	}
	must(t, b.src.Write(b.fs, "d"))
	b.backup(t, p, replication.KindFull) // the source lacks the chain's newest now
	if _, err := b.target.DeleteBackups(ctx, b.id, "zn-1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("deleting a backup that is not there: %v, want NotFound", err)
	}
	deleted, err := b.target.DeleteBackups(ctx, b.id, "")
	if err != nil || len(deleted) != 2 {
		t.Fatalf("deleting every backup: %v, %v; want the two chains' two backups", deleted, err)
	}
	if left, err := b.target.Backups(ctx, b.id); err != nil || len(left) != 0 {
		t.Errorf("after deleting every backup: %v, %v", left, err)
	}
	children, err := b.vault.s.ChildProperties(ctx, targetRoot)
	must(t, err)
	if len(children) != 0 {
		t.Errorf("chains left: %v", children)
	}
}

// TestAFullTargetFailsTheBackupAndKeepsTheBase: a target whose pool or
// quota has no room refuses the backup as ResourceExhausted, saying so
// (not Aborted: no retry finds room until someone makes it); the node
// records the failure for the status until a backup succeeds, and keeps
// the target's base: once there is room the next backup is an increment
// from it.
func TestAFullTargetFailsTheBackupAndKeepsTheBase(t *testing.T) {
	b := newBackupSetup(t, nil)
	p := b.pusher(t, b.src, "n1")
	must(t, b.src.Write(b.fs, "a"))
	b.backup(t, p, replication.KindFull)
	b.vault.Fail = func(op, name string) error {
		if op == "receive" {
			return fmt.Errorf("cannot receive incremental stream: destination %s space quota exceeded.: %w", name, zfs.ErrNoSpace)
		}
		return nil
	}
	must(t, b.src.Write(b.fs, "b"))
	_, err := p.PushBackup(ctx, b.id, "vault", "test", 0, func(replication.Progress) {})
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "no room") {
		t.Fatalf("a backup to a full target: %v, want ResourceExhausted saying it has no room", err)
	}
	if f := p.BackupFailures(); len(f) != 1 || f[0].VolumeID != b.id || f[0].Target != "vault" || !strings.Contains(f[0].Err, "no room") {
		t.Errorf("the node's record of failed backups: %+v; want the full target's", f)
	}
	b.vault.Fail = nil
	b.backup(t, p, replication.KindIncremental)
	if f := p.BackupFailures(); len(f) != 0 {
		t.Errorf("after a backup succeeded the node still records failures: %+v", f)
	}
}

// TestAFailedBackupMarksNothing: only a replica's first stream is held
// with its receiver's streamed tag (a replica ahead of its primary
// refuses every push); a backup target whose base is gone takes a full
// stream into a new chain, so failed backups pin no snapshot here.
func TestAFailedBackupMarksNothing(t *testing.T) {
	b := newBackupSetup(t, nil)
	p := b.pusher(t, b.src, "n1")
	b.vault.Fail = func(op, name string) error {
		if op == "receive" {
			return errors.New("the target's disk failed")
		}
		return nil
	}
	for _, word := range []string{"a", "b", "c"} {
		must(t, b.src.Write(b.fs, word))
		if _, err := p.PushBackup(ctx, b.id, "vault", "test", 0, func(replication.Progress) {}); err == nil {
			t.Fatal("a backup to a target whose receives fail succeeded")
		}
	}
	holds, err := b.src.Holds(ctx, b.fs)
	must(t, err)
	for snap, tags := range holds {
		for _, tag := range tags {
			if strings.HasPrefix(tag, "zfs-nomad-streamed-") {
				t.Errorf("after failed backups %s is held with %s", snap, tag)
			}
		}
	}
}
