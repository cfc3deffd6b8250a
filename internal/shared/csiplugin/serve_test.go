package csiplugin

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
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
