package csiplugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/metrics"
)

// TestInterceptorConvertsErrors: the interceptor is where a handler's
// error becomes its gRPC status (the handlers return plain errors): a kind
// keeps its code, an unexpected error is Internal, a peer's status passes
// through, all with their messages.
func TestInterceptorConvertsErrors(t *testing.T) {
	tests := []struct {
		err  error
		code codes.Code
	}{
		{fmt.Errorf("volume x: %w", errdefs.Wrap(errdefs.ErrNotFound, "no such volume")), codes.NotFound},
		{errors.New("boom"), codes.Internal},
		{context.DeadlineExceeded, codes.DeadlineExceeded},
		{status.Error(codes.Unavailable, "from a node"), codes.Unavailable},
	}
	intercept := LoggingInterceptor(hclog.NewNullLogger())
	info := &grpc.UnaryServerInfo{FullMethod: "/csi.v1.Controller/DeleteVolume"}
	for _, tt := range tests {
		_, err := intercept(context.Background(), nil, info, func(context.Context, any) (any, error) { return nil, tt.err })
		if s := status.Convert(err); s.Code() != tt.code || s.Message() != status.Convert(tt.err).Message() && s.Message() != tt.err.Error() {
			t.Errorf("%v became %v, want %v with its message", tt.err, err, tt.code)
		}
		if _, ok := err.(interface{ GRPCStatus() *status.Status }); !ok {
			t.Errorf("%v is not a gRPC status error after the interceptor", tt.err)
		}
	}
}

// TestCallMetrics: each call counted by its short method name and its
// gRPC code, the refused as the answered.
func TestCallMetrics(t *testing.T) {
	registry := metrics.NewRegistry()
	calls := CallMetrics(registry, "zfs_nomad_csi_call_seconds", "CSI calls.")
	info := &grpc.UnaryServerInfo{FullMethod: "/csi.v1.Controller/ControllerPublishVolume"}
	ok := func(context.Context, any) (any, error) { return "done", nil }
	refused := func(context.Context, any) (any, error) {
		return nil, status.Error(codes.FailedPrecondition, "moving")
	}
	for _, h := range []grpc.UnaryHandler{ok, refused, refused} {
		_, _ = calls(context.Background(), nil, info, h)
	}
	var b strings.Builder
	if _, err := registry.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`zfs_nomad_csi_call_seconds_count{code="OK",method="ControllerPublishVolume"} 1`,
		`zfs_nomad_csi_call_seconds_count{code="FailedPrecondition",method="ControllerPublishVolume"} 2`,
		`zfs_nomad_csi_call_seconds_bucket{code="OK",method="ControllerPublishVolume",le="0.005"} 1`,
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the metrics lack %s:\n%s", want, b.String())
		}
	}
}

// TestServerLoggerNeverWaitsForStderr: a serving process's log calls
// return while nobody reads its stderr (a CO's log collector that
// stopped), so the lease's beat and the self-fence, which log, are never
// held by it; a command's logger (NewLogger) would wait.
func TestServerLoggerNeverWaitsForStderr(t *testing.T) {
	tests := []struct {
		name      string
		newLogger func() hclog.Logger
		wantDone  bool
	}{
		// The logger that must not wait gets a minute (the race detector
		// on a busy host formats 20,000 lines slowly); one that waits
		// never finishes, so three seconds show it.
		{"a serving process's logger", func() hclog.Logger {
			log, _ := NewServerLogger("test", func(string) string { return "" })
			return log
		}, true},
		{"a command's logger", func() hclog.Logger { return NewLogger("test", func(string) string { return "" }) }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			saved := os.Stderr
			os.Stderr = w
			log := tt.newLogger()
			os.Stderr = saved
			done := make(chan struct{})
			go func() {
				// About 2 MB, far beyond a pipe's buffer (64 KiB).
				for i := range 20000 {
					log.Info("a line no one reads", "volume_id", "vol-0123456789abcdef0123", "i", i)
				}
				close(done)
			}()
			wait := 3 * time.Second
			if tt.wantDone {
				wait = time.Minute
			}
			select {
			case <-done:
			case <-time.After(wait):
			}
			finished := isClosed(done)
			r.Close() // the blocked write, if any, fails now
			w.Close()
			if finished != tt.wantDone {
				t.Fatalf("the log calls finished while nobody read stderr: %v, want %v", finished, tt.wantDone)
			}
		})
	}
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
