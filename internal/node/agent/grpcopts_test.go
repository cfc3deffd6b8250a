package agent

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
)

// parkedReceives is a Replication service whose receives wait until their
// stream ends, counting how many run at once.
type parkedReceives struct {
	pb.UnimplementedReplicationServer
	running, peak atomic.Int32
}

func (p *parkedReceives) Receive(stream pb.Replication_ReceiveServer) error {
	n := p.running.Add(1)
	defer p.running.Add(-1)
	for {
		peak := p.peak.Load()
		if n <= peak || p.peak.CompareAndSwap(peak, n) {
			break
		}
	}
	<-stream.Context().Done()
	return nil
}

// TestOneConnectionCarriesBoundedStreams: a peer that opens many streams
// on one connection to the agent port gets MaxConcurrentStreams handlers
// running at most; the others wait at the client.
func TestOneConnectionCarriesBoundedStreams(t *testing.T) {
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(ServerOptions()...)
	service := &parkedReceives{}
	pb.RegisterReplicationServer(srv, service)
	go srv.Serve(lis)
	defer srv.Stop()
	conn, err := grpc.NewClient("passthrough:///agent", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := pb.NewReplicationClient(conn)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range MaxConcurrentStreams + 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if s, err := client.Receive(ctx); err == nil {
				_ = s.Send(&pb.ReceiveMessage{Msg: &pb.ReceiveMessage_Header{Header: &pb.ReceiveHeader{VolumeId: "vol-0123456789abcdef0123"}}})
				<-ctx.Done()
			}
		}()
	}
	deadline := time.Now().Add(5 * time.Second)
	for service.running.Load() < MaxConcurrentStreams && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // for any stream beyond the bound
	running, peak := service.running.Load(), service.peak.Load()
	cancel()
	wg.Wait()
	if running != MaxConcurrentStreams || peak > MaxConcurrentStreams {
		t.Errorf("%d receives running on one connection (at most %d at once), want %d", running, peak, MaxConcurrentStreams)
	}
}
