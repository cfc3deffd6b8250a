package protocol

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
)

func TestCheck(t *testing.T) {
	tests := []struct {
		name  string
		sent  []string // the metadata values; none: a build without versions
		want  codes.Code
		words string // the refusal must say this
	}{
		{"this build's version", []string{strconv.Itoa(Version)}, codes.OK, ""},
		{"the oldest accepted", []string{strconv.Itoa(MinVersion)}, codes.OK, ""},
		{"no version", nil, codes.FailedPrecondition, "older than protocol versions"},
		{"an older version", []string{strconv.Itoa(MinVersion - 1)}, codes.FailedPrecondition, "node n2 accepts agent protocol"},
		{"a newer version", []string{strconv.Itoa(Version + 1)}, codes.FailedPrecondition, "came with agent protocol " + strconv.Itoa(Version+1)},
		{"garbage", []string{"two"}, codes.InvalidArgument, "not a protocol version"},
		{"a negative version", []string{"-1"}, codes.InvalidArgument, "not a protocol version"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			if tt.sent != nil {
				ctx = metadata.NewIncomingContext(ctx, metadata.Pairs(Header, tt.sent[0]))
			}
			err := Check(ctx, "node n2")
			if got := status.Code(err); got != tt.want {
				t.Fatalf("Check = %v, want %s", err, tt.want)
			}
			if err != nil && !strings.Contains(err.Error(), tt.words) {
				t.Errorf("the refusal %q does not say %q", err, tt.words)
			}
		})
	}
}

// TestCallsCarryTheVersion: through real gRPC, unary and streaming calls
// of a client with DialOptions reach a server with ServerOptions, and
// the same calls without them are refused before the handler runs.
func TestCallsCarryTheVersion(t *testing.T) {
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(ServerOptions("node n2")...)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	dial := func(opts ...grpc.DialOption) healthpb.HealthClient {
		opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
		conn, err := grpc.NewClient("passthrough:///agent", opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return healthpb.NewHealthClient(conn)
	}
	for _, tt := range []struct {
		name string
		opts []grpc.DialOption
		want codes.Code
	}{
		{"with the version", DialOptions(), codes.OK},
		{"without", nil, codes.FailedPrecondition},
	} {
		t.Run(tt.name, func(t *testing.T) {
			client := dial(tt.opts...)
			ctx := context.Background()
			_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
			if got := status.Code(err); got != tt.want {
				t.Errorf("unary call: %v, want %s", err, tt.want)
			}
			stream, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
			if err == nil {
				_, err = stream.Recv()
			}
			if got := status.Code(err); got != tt.want {
				t.Errorf("streaming call: %v, want %s", err, tt.want)
			}
		})
	}
}
