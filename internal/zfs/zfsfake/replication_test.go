package zfsfake_test

import (
	"bytes"
	"context"
	"net"
	"slices"
	"testing"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/zfs-nomad/zfs-nomad/internal/copylock"
	"github.com/zfs-nomad/zfs-nomad/internal/replication"
	"github.com/zfs-nomad/zfs-nomad/internal/vocab"
	"github.com/zfs-nomad/zfs-nomad/internal/volume"
	"github.com/zfs-nomad/zfs-nomad/internal/zfs/zfscmd"
	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
)

// TestRealReplication runs the real Pusher and Receiver over two fakes,
// through gRPC in memory: the fake must be the pool they expect, for a
// full push, a resumed one and an incremental one.
func TestRealReplication(t *testing.T) {
	const id = "vol-0123456789abcdef0123"
	src, dst := newNode(t, 1, "tank/nomad"), newNode(t, 2, "tank/nomad")
	fs := "tank/nomad/" + id
	must(t, src.CreateFilesystem(ctx, fs, map[string]string{volume.PropRole: vocab.RolePrimary, volume.PropVolumeID: id,
		volume.PropGeneration: "1", volume.PropName: "v", "refquota": "1000000"}))
	push := pusherTo(t, src, dst)

	check := func(kind string) {
		t.Helper()
		prog, err := push(id)
		if err != nil || prog.Kind != kind {
			t.Fatalf("push: %+v, %v; want a %s push", prog, err, kind)
		}
		snaps := dst.snaps(t, fs)
		newest := snaps[len(snaps)-1]
		if got, want := dst.content(t, newest.Name), src.content(t, newest.Name); !slices.Equal(got, want) {
			t.Errorf("after the %s push the replica's %s holds %v, the source's %v", kind, newest.Name, got, want)
		}
		if tok := dst.get(t, fs, "receive_resume_token"); tok != "-" {
			t.Errorf("after the %s push the replica has a resume token", kind)
		}
	}
	must(t, src.Write(fs, "a"))
	check(replication.KindFull)

	// A push whose stream broke: the replica keeps a partial receive of
	// a snapshot the source has, and the next push resumes it.
	must(t, src.Write(fs, "b"))
	base := src.snaps(t, fs)[0].Name
	must(t, src.s.Snapshot(ctx, fs+"@zn-1"))
	stream := src.send(t, zfscmd.SendSpec{Snapshot: fs + "@zn-1", Base: base})
	if err := dst.s.Receive(ctx, fs, nil, bytes.NewReader(stream[:400])); err == nil {
		t.Fatal("a cut stream was received whole")
	}
	check(replication.KindResume)
	if got := dst.content(t, fs+"@zn-1"); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("the resumed snapshot holds %v", got)
	}

	must(t, src.Write(fs, "c"))
	check(replication.KindIncremental)
	if got := dst.content(t, fs); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("the replica holds %v", got)
	}
}

// pusherTo returns a push of a volume from src to a Receiver on dst.
func pusherTo(t *testing.T, src, dst node) func(id string) (replication.Progress, error) {
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	pb.RegisterReplicationServer(srv, replication.NewReceiver(dst.s, new(copylock.Locks), "tank/nomad", "n2", 2, hclog.NewNullLogger()))
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	dial := func(string) (*grpc.ClientConn, error) {
		return grpc.NewClient("passthrough:///bufnet", grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	}
	p := replication.NewPusher(src.s, new(copylock.Locks), "tank/nomad", "n1", 2, nil, dial, hclog.NewNullLogger())
	t.Cleanup(p.Close)
	return func(id string) (replication.Progress, error) {
		return p.Push(ctx, id, "n2", 0, func(replication.Progress) {})
	}
}
