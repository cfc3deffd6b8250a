package agent

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/tlsconfig"
	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
)

// BenchmarkBulkStream streams 64 MiB in replication's 1 MiB chunks over
// loopback TCP, with mutual TLS and without, through the agent port's
// options as shipped and with 1 MiB read and write buffers held by every
// connection: what the buffers' size is worth to a push
// (docs/architecture.md, "Scale"). Command:
// go test -run '^$' -bench BulkStream -count 6 ./internal/node/agent
func BenchmarkBulkStream(b *testing.B) {
	ca, err := tlsconfig.NewCA(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	srvFiles, err := ca.Issue("srv", tlsconfig.RoleNode)
	if err != nil {
		b.Fatal(err)
	}
	cliFiles, err := ca.Issue("cli", tlsconfig.RoleNode)
	if err != nil {
		b.Fatal(err)
	}
	srvM, err := tlsconfig.Load(srvFiles)
	if err != nil {
		b.Fatal(err)
	}
	cliM, err := tlsconfig.Load(cliFiles)
	if err != nil {
		b.Fatal(err)
	}
	held := struct {
		srv []grpc.ServerOption
		cli []grpc.DialOption
	}{
		srv: []grpc.ServerOption{grpc.InitialWindowSize(streamWindow), grpc.InitialConnWindowSize(connWindow),
			grpc.ReadBufferSize(1 << 20), grpc.WriteBufferSize(1 << 20)},
		cli: []grpc.DialOption{grpc.WithInitialWindowSize(streamWindow), grpc.WithInitialConnWindowSize(connWindow),
			grpc.WithReadBufferSize(1 << 20), grpc.WithWriteBufferSize(1 << 20)},
	}
	for _, tls := range []bool{true, false} {
		srvCreds, cliCreds := grpc.Creds(srvM.ServerCredentials()), grpc.WithTransportCredentials(cliM.ClientCredentials())
		name := "tls"
		if !tls {
			srvCreds, cliCreds, name = grpc.Creds(insecure.NewCredentials()), grpc.WithTransportCredentials(insecure.NewCredentials()), "plain"
		}
		b.Run(name+"/shipped", func(b *testing.B) {
			bulkStream(b, append(ServerOptions(), srvCreds), append(DialOptions(), cliCreds))
		})
		b.Run(name+"/1MiB-buffers-held", func(b *testing.B) {
			bulkStream(b, append(held.srv, srvCreds), append(held.cli, cliCreds))
		})
	}
}

func bulkStream(b *testing.B, srvOpts []grpc.ServerOption, dialOpts []grpc.DialOption) {
	const total = 64 << 20
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer(srvOpts...)
	pb.RegisterReplicationServer(srv, sink{})
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), dialOpts...)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	client := pb.NewReplicationClient(conn)
	chunk := make([]byte, 1<<20)
	b.SetBytes(total)
	b.ResetTimer()
	for range b.N {
		stream, err := client.Receive(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		for sent := 0; sent < total; sent += len(chunk) {
			if err := stream.Send(&pb.ReceiveMessage{Msg: &pb.ReceiveMessage_Data{Data: chunk}}); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := stream.CloseAndRecv(); err != nil {
			b.Fatal(err)
		}
	}
}

// sink receives and drops a stream.
type sink struct {
	pb.UnimplementedReplicationServer
}

func (sink) Receive(stream pb.Replication_ReceiveServer) error {
	for {
		if _, err := stream.Recv(); err != nil {
			return stream.SendAndClose(&pb.ReceiveResult{})
		}
	}
}
