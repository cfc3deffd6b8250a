package csiplugin

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

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
