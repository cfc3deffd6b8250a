// Package errdefs holds the error kinds the driver's logic returns and the
// one place that turns them into gRPC status codes.
//
// Logic wraps a kind with detail: fmt.Errorf("%w: quota above ceiling",
// errdefs.ErrOutOfRange). Each kind carries its gRPC code, so status.Code
// reads it from any error that wraps one; the servers' interceptor
// (csiplugin.LoggingInterceptor) calls ToStatus once, at the boundary,
// for every handler of the CSI services and the node agent. An error that
// already is a gRPC status (one that came back from a node agent) keeps
// its code, so a node's verdict reaches the CO unchanged through the
// controller; FromStatus turns such a status back into its kind.
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
	ErrInvalidArgument    error = &kind{"invalid argument", codes.InvalidArgument}
	ErrNotFound           error = &kind{"not found", codes.NotFound}
	ErrAlreadyExists      error = &kind{"already exists", codes.AlreadyExists}
	ErrOutOfRange         error = &kind{"out of range", codes.OutOfRange}
	ErrFailedPrecondition error = &kind{"failed precondition", codes.FailedPrecondition}
	ErrResourceExhausted  error = &kind{"resource exhausted", codes.ResourceExhausted}
	ErrPermissionDenied   error = &kind{"permission denied", codes.PermissionDenied}
)

// Temporary kinds: the same request may succeed later.
var (
	// ErrAborted: another operation on the same object is in progress.
	ErrAborted error = &kind{"operation in progress", codes.Aborted}
	// ErrUnavailable: a node, pool or ZFS cannot be reached right now.
	ErrUnavailable error = &kind{"unavailable", codes.Unavailable}
)

// kind is an error kind. It carries its gRPC code: gRPC's status.Code and
// status.FromError find it in any error that wraps it, and take the
// message from the whole error.
type kind struct {
	msg  string
	code codes.Code
}

func (k *kind) Error() string              { return k.msg }
func (k *kind) GRPCStatus() *status.Status { return status.New(k.code, k.msg) }

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
// matching kind, so logic can test it with errors.Is. Its text is the
// peer's message, without gRPC's "rpc error: code = ... desc =" prefix;
// its code stays the peer's, also for codes that have no kind here
// (Internal). An error that carries no status is returned as it is.
func FromStatus(err error) error {
	if err == nil {
		return nil
	}
	s, ok := status.FromError(err)
	if !ok {
		return err
	}
	for _, k := range kinds {
		if k.code == s.Code() {
			return &statusError{kind: k.err, st: s}
		}
	}
	return &statusError{st: s}
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
