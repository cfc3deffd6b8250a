package agentclient

import (
	"context"
	"errors"
	"net"
	"reflect"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
)

// agent answers every call with the messages it was given, or fails
// every call with err.
type agent struct {
	pb.UnimplementedNodeAgentServer
	err      error
	node     *pb.Node
	volume   *pb.Volume
	snapshot *pb.Snapshot
	status   *pb.NodeStatus
	copy     *pb.Copy
	progress []*pb.ReplicateProgress

	gotNode     *pb.GetNodeRequest
	gotCreate   *pb.CreateVolumeRequest
	gotList     *pb.ListSnapshotsRequest
	gotReserve  *pb.ReserveRequest
	gotPromote  *pb.PromoteRequest
	gotDemote   *pb.DemoteRequest
	gotReplicas *pb.DeleteReplicaRequest
}

func (a *agent) GetNode(_ context.Context, r *pb.GetNodeRequest) (*pb.Node, error) {
	a.gotNode = r
	return a.node, a.err
}

func (a *agent) CreateVolume(_ context.Context, r *pb.CreateVolumeRequest) (*pb.Volume, error) {
	a.gotCreate = r
	return a.volume, a.err
}

func (a *agent) GetVolume(context.Context, *pb.GetVolumeRequest) (*pb.Volume, error) {
	return a.volume, a.err
}

func (a *agent) DeleteVolume(context.Context, *pb.DeleteVolumeRequest) (*pb.DeleteVolumeResponse, error) {
	return &pb.DeleteVolumeResponse{}, a.err
}

func (a *agent) ListVolumes(context.Context, *pb.ListVolumesRequest) (*pb.ListVolumesResponse, error) {
	return &pb.ListVolumesResponse{Volumes: []*pb.Volume{a.volume}}, a.err
}

func (a *agent) ListSnapshots(_ context.Context, r *pb.ListSnapshotsRequest) (*pb.ListSnapshotsResponse, error) {
	a.gotList = r
	return &pb.ListSnapshotsResponse{Snapshots: []*pb.Snapshot{a.snapshot}}, a.err
}

func (a *agent) Status(context.Context, *pb.StatusRequest) (*pb.NodeStatus, error) {
	return a.status, a.err
}

func (a *agent) GetCopy(context.Context, *pb.GetCopyRequest) (*pb.Copy, error) {
	return a.copy, a.err
}

func (a *agent) Promote(_ context.Context, r *pb.PromoteRequest) (*pb.Copy, error) {
	a.gotPromote = r
	return a.copy, a.err
}

func (a *agent) Demote(_ context.Context, r *pb.DemoteRequest) (*pb.Copy, error) {
	a.gotDemote = r
	return a.copy, a.err
}

func (a *agent) Reserve(_ context.Context, r *pb.ReserveRequest) (*pb.ReserveResponse, error) {
	a.gotReserve = r
	return &pb.ReserveResponse{Granted: false, PromisedGeneration: 7, PromisedHolder: "n2"}, a.err
}

func (a *agent) DeleteReplica(_ context.Context, r *pb.DeleteReplicaRequest) (*pb.DeleteReplicaResponse, error) {
	a.gotReplicas = r
	return &pb.DeleteReplicaResponse{Deleted: true}, a.err
}

func (a *agent) Replicate(_ *pb.ReplicateRequest, stream pb.NodeAgent_ReplicateServer) error {
	for _, p := range a.progress {
		if err := stream.Send(p); err != nil {
			return err
		}
	}
	return a.err
}

// serve returns a client of a over an in-memory connection.
func serve(t *testing.T, a *agent) *Client {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	pb.RegisterNodeAgentServer(srv, a)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("passthrough:///agent",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return New(conn)
}

func TestConversions(t *testing.T) {
	a := &agent{
		node: &pb.Node{NodeId: "n1", Topology: map[string]string{"zone": "a"}, AvailableBytes: 10, MaxQuotaBytes: 20,
			Volumes: 3, MaxVolumes: 4, UnhealthyReason: "pool degraded", Version: "v1", VolumesVersion: "vv",
			AwaitedPromotions: []*pb.AwaitedPromotion{{VolumeId: "vol-1", AfterGeneration: 3, WaitingMillis: 1500}}},
		volume: &pb.Volume{VolumeId: "vol-1", Name: "data", CapacityBytes: 1 << 30, UsedBytes: 5, Parameters: map[string]string{"replicas": "1"},
			Source: "snapshot:snap-1", NodeId: "n1", CreatedUnix: 100, Generation: 3, MovingTo: "n2", FailoverFromSnapshot: "s"},
		snapshot: &pb.Snapshot{SnapshotId: "snap-1", Name: "s1", SourceVolumeId: "vol-1", SizeBytes: 9, CreatedUnix: 200, NodeId: "n1"},
		status: &pb.NodeStatus{
			Replicas:  []*pb.Replica{{VolumeId: "vol-2", Name: "r", LastSnapshot: "zn-1", LastSnapshotUnix: 300, Resumable: true, DemotedAtUnix: 250}},
			Transfers: []*pb.Transfer{{VolumeId: "vol-1", Peer: "n2", Kind: "full", Bytes: 1, TotalBytes: 2, StartedUnix: 400}},
			SetAside:  []string{"tank/vol-3-aside-1"},
		},
		copy: &pb.Copy{VolumeId: "vol-1", NodeId: "n1", Exists: true, Role: "primary", Generation: 5, MovingTo: "n2", FencedUnixNano: 6,
			Mounted: true, LastSnapshot: "zn-2", LastSnapshotUnixNano: 7, Parameters: map[string]string{"a": "b"}, CapacityBytes: 8,
			Resumable: true, Name: "data", FailoverFromSnapshot: "f", PromisedGeneration: 9, PromisedHolder: "n3",
			SnapshotGuids: []uint64{1, 2}, ForcedGeneration: 4, LeaseFenced: true, WrittenSince: map[string]uint64{"zn-2": 10}},
		progress: []*pb.ReplicateProgress{{Kind: "full", Bytes: 1}, {Kind: "full", Snapshot: "zn-3", Base: "zn-2", Bytes: 2, TotalBytes: 3, Done: true}},
	}
	c := serve(t, a)
	ctx := context.Background()

	wantCopy := Copy{VolumeID: "vol-1", NodeID: "n1", Exists: true, Role: "primary", Generation: 5, MovingTo: "n2", FencedUnixNano: 6,
		Mounted: true, LastSnapshot: "zn-2", LastSnapshotUnixNano: 7, Parameters: map[string]string{"a": "b"}, CapacityBytes: 8,
		Resumable: true, Name: "data", FailoverFromSnapshot: "f", PromisedGeneration: 9, PromisedHolder: "n3",
		SnapshotGUIDs: []uint64{1, 2}, ForcedGeneration: 4, LeaseFenced: true, WrittenSince: map[string]uint64{"zn-2": 10}}
	wantVolume := Volume{VolumeID: "vol-1", Name: "data", CapacityBytes: 1 << 30, UsedBytes: 5, Parameters: map[string]string{"replicas": "1"},
		Source: "snapshot:snap-1", NodeID: "n1", CreatedUnix: 100, Generation: 3, MovingTo: "n2", FailoverFromSnapshot: "s"}
	wantSnapshot := Snapshot{SnapshotID: "snap-1", Name: "s1", SourceVolumeID: "vol-1", SizeBytes: 9, CreatedUnix: 200, NodeID: "n1"}

	var seen []Progress
	tests := []struct {
		name string
		call func() (any, error)
		want any
	}{
		{"GetNode", func() (any, error) { return c.GetNode(ctx, GetNodeOptions{WithoutCapacity: true, WithoutHealth: true}) },
			NodeInfo{NodeID: "n1", Topology: map[string]string{"zone": "a"}, AvailableBytes: 10, MaxQuotaBytes: 20,
				Volumes: 3, MaxVolumes: 4, UnhealthyReason: "pool degraded", Version: "v1", VolumesVersion: "vv",
				AwaitedPromotions: []AwaitedPromotion{{VolumeID: "vol-1", AfterGeneration: 3, Waiting: 1500 * time.Millisecond}}}},
		{"CreateVolume", func() (any, error) {
			return c.CreateVolume(ctx, NewVolume{Name: "data", RequiredBytes: 1, LimitBytes: 2, Parameters: map[string]string{"x": "y"}, SourceSnapshotID: "snap-1", SourceVolumeID: "vol-0"})
		}, wantVolume},
		{"GetVolume", func() (any, error) { return c.GetVolume(ctx, "vol-1") }, wantVolume},
		{"ListVolumes", func() (any, error) { return c.ListVolumes(ctx, Page{}) }, []Volume{wantVolume}},
		{"ListSnapshots", func() (any, error) {
			return c.ListSnapshots(ctx, SnapshotQuery{SnapshotID: "snap-1", SourceVolumeID: "vol-1", From: "snap-0", MaxEntries: 5})
		}, []Snapshot{wantSnapshot}},
		{"Status", func() (any, error) { return c.Status(ctx) }, NodeStatus{
			Replicas:  []Replica{{VolumeID: "vol-2", Name: "r", LastSnapshot: "zn-1", LastSnapshotUnix: 300, Resumable: true, DemotedAtUnix: 250}},
			Transfers: []Transfer{{VolumeID: "vol-1", Peer: "n2", Kind: "full", Bytes: 1, TotalBytes: 2, StartedUnix: 400}},
			SetAside:  []string{"tank/vol-3-aside-1"},
		}},
		{"GetCopy", func() (any, error) { return c.GetCopy(ctx, "vol-1") }, wantCopy},
		{"Promote", func() (any, error) {
			return c.Promote(ctx, Promotion{VolumeID: "vol-1", Generation: 5, NotBeforeUnixNano: 6, Failover: true, Forced: true, SourceNodeID: "n7"})
		}, wantCopy},
		{"Demote", func() (any, error) { return c.Demote(ctx, Demotion{VolumeID: "vol-1", Generation: 6, Aside: true}) }, wantCopy},
		{"Reserve", func() (any, error) {
			return c.Reserve(ctx, Reservation{VolumeID: "vol-1", Generation: 8, HolderNodeID: "n1", FailoverFrom: []string{"n3:7670"}, Operator: true})
		}, Promise{Granted: false, PromisedGeneration: 7, PromisedHolder: "n2"}},
		{"DeleteReplica", func() (any, error) { return c.DeleteReplica(ctx, "vol-1", true) }, true},
		{"Replicate", func() (any, error) {
			return c.Replicate(ctx, "vol-1", Target{Addr: "n2:7670", NodeID: "n2"}, "test", func(p Progress) { seen = append(seen, p) })
		}, Progress{Kind: "full", Snapshot: "zn-3", Base: "zn-2", Bytes: 2, TotalBytes: 3, Done: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.call()
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v\nwant %+v", got, tt.want)
			}
		})
	}

	// The requests carry every field of the plain types.
	if !a.gotNode.GetWithoutCapacity() || !a.gotNode.GetWithoutHealth() {
		t.Errorf("GetNode sent %v", a.gotNode)
	}
	if r := a.gotCreate; r.GetName() != "data" || r.GetRequiredBytes() != 1 || r.GetLimitBytes() != 2 || r.GetParameters()["x"] != "y" ||
		r.GetSourceSnapshotId() != "snap-1" || r.GetSourceVolumeId() != "vol-0" {
		t.Errorf("CreateVolume sent %v", r)
	}
	if r := a.gotList; r.GetSnapshotId() != "snap-1" || r.GetSourceVolumeId() != "vol-1" || r.GetFrom() != "snap-0" || r.GetMaxEntries() != 5 {
		t.Errorf("ListSnapshots sent %v", r)
	}
	if r := a.gotPromote; r.GetVolumeId() != "vol-1" || r.GetGeneration() != 5 || r.GetNotBeforeUnixNano() != 6 || !r.GetFailover() || !r.GetForced() || r.GetSourceNodeId() != "n7" {
		t.Errorf("Promote sent %v", r)
	}
	if r := a.gotDemote; r.GetVolumeId() != "vol-1" || r.GetGeneration() != 6 || !r.GetAside() {
		t.Errorf("Demote sent %v", r)
	}
	if r := a.gotReserve; r.GetVolumeId() != "vol-1" || r.GetGeneration() != 8 || r.GetHolderNodeId() != "n1" || !reflect.DeepEqual(r.GetFailoverFrom(), []string{"n3:7670"}) || !r.GetOperator() {
		t.Errorf("Reserve sent %v", r)
	}
	if r := a.gotReplicas; r.GetVolumeId() != "vol-1" || !r.GetVolumeDeleted() || r.GetSurplusNewest() != "" {
		t.Errorf("DeleteReplica sent %v", r)
	}
	if deleted, err := c.DeleteSurplus(ctx, "vol-2", "zn-4", []string{"snap-1"}); err != nil || !deleted {
		t.Errorf("DeleteSurplus: %v, %v", deleted, err)
	}
	if r := a.gotReplicas; r.GetVolumeId() != "vol-2" || r.GetVolumeDeleted() || r.GetSurplusNewest() != "zn-4" || !slices.Equal(r.GetSnapshotsElsewhere(), []string{"snap-1"}) {
		t.Errorf("DeleteSurplus sent %v", r)
	}
	if len(seen) != 2 || seen[0] != (Progress{Kind: "full", Bytes: 1}) {
		t.Errorf("Replicate reported %+v", seen)
	}
}

// An agent's refusal comes back as its error kind, with the code the
// agent answered and its message.
func TestErrors(t *testing.T) {
	tests := []struct {
		name string
		err  error
		kind error // nil: no kind
		code codes.Code
	}{
		{"not found", status.Error(codes.NotFound, "volume vol-1 does not exist"), errdefs.ErrNotFound, codes.NotFound},
		{"invalid", status.Error(codes.InvalidArgument, `parameter "mountpoint" is not allowed`), errdefs.ErrInvalidArgument, codes.InvalidArgument},
		{"precondition", status.Error(codes.FailedPrecondition, "volume is a replica here"), errdefs.ErrFailedPrecondition, codes.FailedPrecondition},
		{"exhausted", status.Error(codes.ResourceExhausted, "pool full"), errdefs.ErrResourceExhausted, codes.ResourceExhausted},
		{"aborted", status.Error(codes.Aborted, "busy"), errdefs.ErrAborted, codes.Aborted},
		{"unavailable", status.Error(codes.Unavailable, "pool suspended"), errdefs.ErrUnavailable, codes.Unavailable},
		{"internal", status.Error(codes.Internal, "broken"), nil, codes.Internal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := serve(t, &agent{err: tt.err})
			calls := map[string]func() error{
				"GetVolume": func() error { _, err := c.GetVolume(context.Background(), "vol-1"); return err },
				"Replicate": func() error {
					_, err := c.Replicate(context.Background(), "vol-1", Target{Addr: "n2"}, "test", nil)
					return err
				},
				"DeleteVolume": func() error {
					return c.DeleteVolume(context.Background(), "vol-1")
				},
			}
			for name, call := range calls {
				err := call()
				if err == nil {
					t.Fatalf("%s: no error", name)
				}
				if tt.kind != nil && !errors.Is(err, tt.kind) {
					t.Errorf("%s: %v is not %v", name, err, tt.kind)
				}
				if got := status.Code(err); got != tt.code {
					t.Errorf("%s: code %v, want %v", name, got, tt.code)
				}
				if got := errdefs.Code(err); got != tt.code {
					t.Errorf("%s: errdefs.Code %v, want %v", name, got, tt.code)
				}
				// The text is the agent's own message, without gRPC's
				// prefix, and converting again changes nothing.
				if want := status.Convert(tt.err).Message(); err.Error() != want {
					t.Errorf("%s: text %q, want %q", name, err.Error(), want)
				}
				if again := errdefs.FromStatus(err); again.Error() != err.Error() || errdefs.Code(again) != tt.code {
					t.Errorf("%s: FromStatus again: %q (%v)", name, again, errdefs.Code(again))
				}
				// The CSI servers' interceptor answers with the same status.
				if got := status.Convert(errdefs.ToStatus(err)); got.Code() != tt.code || got.Message() != status.Convert(tt.err).Message() {
					t.Errorf("%s: ToStatus %v", name, got)
				}
			}
		})
	}
}

func TestNilConvertsToZero(t *testing.T) {
	if got := copyFromPB(nil); !reflect.DeepEqual(got, Copy{}) {
		t.Errorf("copyFromPB(nil) = %+v", got)
	}
	if got := nodeStatusFromPB(nil); !reflect.DeepEqual(got, NodeStatus{}) {
		t.Errorf("nodeStatusFromPB(nil) = %+v", got)
	}
}

// Only gRPC statuses are converted: no error stays nil, and an error that
// carries no status passes through as it is.
func TestFromStatusLeavesOtherErrors(t *testing.T) {
	if err := fromStatus(nil); err != nil {
		t.Errorf("fromStatus(nil) = %v", err)
	}
	plain := errors.New("not a status")
	if err := fromStatus(plain); err != plain {
		t.Errorf("fromStatus(plain) = %v, want it unchanged", err)
	}
}
