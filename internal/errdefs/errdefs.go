// Package errdefs holds the error kinds the driver's logic returns and the
// one place that turns them into gRPC status codes.
//
// Logic wraps a kind with detail: fmt.Errorf("%w: quota above ceiling",
// errdefs.ErrOutOfRange). The CSI and agent servers call ToStatus once, at
// the boundary. An error that already is a gRPC status (one that came back
// from a node agent) keeps its code, so a node's verdict reaches the CO
// unchanged through the controller.
package errdefs

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Permanent kinds: retrying the same request will not help.
var (
	ErrInvalidArgument    = errors.New("invalid argument")
	ErrNotFound           = errors.New("not found")
	ErrAlreadyExists      = errors.New("already exists")
	ErrOutOfRange         = errors.New("out of range")
	ErrFailedPrecondition = errors.New("failed precondition")
	ErrResourceExhausted  = errors.New("resource exhausted")
	ErrPermissionDenied   = errors.New("permission denied")
)

// Temporary kinds: the same request may succeed later.
var (
	// ErrAborted: another operation on the same object is in progress.
	ErrAborted = errors.New("operation in progress")
	// ErrUnavailable: a node, pool or ZFS cannot be reached right now.
	ErrUnavailable = errors.New("unavailable")
)

var kinds = []struct {
	err  error
	code codes.Code
}{
	{ErrInvalidArgument, codes.InvalidArgument},
	{ErrNotFound, codes.NotFound},
	{ErrAlreadyExists, codes.AlreadyExists},
	{ErrOutOfRange, codes.OutOfRange},
	{ErrFailedPrecondition, codes.FailedPrecondition},
	{ErrResourceExhausted, codes.ResourceExhausted},
	{ErrPermissionDenied, codes.PermissionDenied},
	{ErrAborted, codes.Aborted},
	{ErrUnavailable, codes.Unavailable},
	{context.DeadlineExceeded, codes.DeadlineExceeded},
	{context.Canceled, codes.Canceled},
}

// Code returns the gRPC code for err: the code of a gRPC status in its chain,
// else the code of its kind, else Internal.
func Code(err error) codes.Code {
	if err == nil {
		return codes.OK
	}
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		return se.GRPCStatus().Code()
	}
	for _, k := range kinds {
		if errors.Is(err, k.err) {
			return k.code
		}
	}
	return codes.Internal
}

// ToStatus converts err to a gRPC status error with its full message.
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	if s, ok := status.FromError(err); ok && s.Code() != codes.Unknown {
		return s.Err()
	}
	return status.Error(Code(err), err.Error())
}

// FromStatus turns a gRPC status from a peer back into an error of the
// matching kind, so logic can test it with errors.Is.
func FromStatus(err error) error {
	s, ok := status.FromError(err)
	if !ok {
		return err
	}
	for _, k := range kinds {
		if k.code == s.Code() {
			return &statusError{kind: k.err, st: s}
		}
	}
	return err
}

type statusError struct {
	kind error
	st   *status.Status
}

func (e *statusError) Error() string              { return e.st.Message() }
func (e *statusError) Unwrap() error              { return e.kind }
func (e *statusError) GRPCStatus() *status.Status { return e.st }

// Temporary reports whether retrying later may succeed.
func Temporary(err error) bool {
	switch Code(err) {
	case codes.Aborted, codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted:
		return true
	}
	return false
}

// Wrap returns an error of kind with a formatted message.
func Wrap(kind error, format string, args ...any) error {
	return &kindError{kind: kind, msg: fmt.Sprintf(format, args...)}
}

type kindError struct {
	kind error
	msg  string
}

func (e *kindError) Error() string { return e.msg }
func (e *kindError) Unwrap() error { return e.kind }
