package errdefs

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestCodeAndRoundTrip(t *testing.T) {
	tests := []struct {
		err  error
		code codes.Code
		temp bool
	}{
		{fmt.Errorf("%w: bad key", ErrInvalidArgument), codes.InvalidArgument, false},
		{fmt.Errorf("wrapped: %w", fmt.Errorf("%w: gone", ErrNotFound)), codes.NotFound, false},
		{Wrap(ErrAlreadyExists, "volume %q", "x"), codes.AlreadyExists, false},
		{Wrap(ErrOutOfRange, "big"), codes.OutOfRange, false},
		{Wrap(ErrFailedPrecondition, "mounted"), codes.FailedPrecondition, false},
		{Wrap(ErrResourceExhausted, "full"), codes.ResourceExhausted, true},
		{Wrap(ErrAborted, "busy"), codes.Aborted, true},
		{Wrap(ErrUnavailable, "node down"), codes.Unavailable, true},
		{context.DeadlineExceeded, codes.DeadlineExceeded, true},
		{errors.New("boom"), codes.Internal, false},
		{status.Error(codes.NotFound, "from a peer"), codes.NotFound, false},
	}
	for _, tc := range tests {
		if got := Code(tc.err); got != tc.code {
			t.Errorf("Code(%v) = %v, want %v", tc.err, got, tc.code)
		}
		st := ToStatus(tc.err)
		wantMsg := tc.err.Error()
		if s, ok := status.FromError(tc.err); ok {
			wantMsg = s.Message() // a peer's status passes through as it came
		}
		if status.Code(st) != tc.code || status.Convert(st).Message() != wantMsg {
			t.Errorf("ToStatus(%v) = %v", tc.err, st)
		}
		back := FromStatus(st)
		if Code(back) != tc.code || Temporary(back) != tc.temp {
			t.Errorf("FromStatus(ToStatus(%v)) = %v (temporary %v)", tc.err, back, Temporary(back))
		}
	}
	if !errors.Is(FromStatus(status.Error(codes.NotFound, "x")), ErrNotFound) {
		t.Error("a peer's NotFound is not ErrNotFound")
	}
}

// TestKindsCarryTheirCode: gRPC reads a kind's code from any error that
// wraps it, with the whole error as the message, so a handler returns
// its error as it is and the boundary (or a direct caller) sees the code.
func TestKindsCarryTheirCode(t *testing.T) {
	err := fmt.Errorf("deleting volume x: %w", Wrap(ErrFailedPrecondition, "it is mounted on node n1"))
	s, ok := status.FromError(err)
	if !ok || s.Code() != codes.FailedPrecondition || s.Message() != err.Error() {
		t.Errorf("status.FromError = %v (ok %v), want FailedPrecondition with the whole message", s, ok)
	}
	if got := status.Code(fmt.Errorf("%w: no such volume", ErrNotFound)); got != codes.NotFound {
		t.Errorf("status.Code of a wrapped kind = %v, want NotFound", got)
	}
}
