package agentclient

import (
	"google.golang.org/grpc/status"

	"github.com/zfs-nomad/zfs-nomad/internal/errdefs"
)

// fromStatus turns an agent's gRPC status into an error of its kind
// (errdefs.FromStatus), once, here. The error keeps the status error's
// text and its status: the messages the controller builds around it, and
// the code the CO sees, stay what they were when callers handled the
// status errors themselves. A caller that wants just the agent's message
// still gets it from errdefs.FromStatus.
func fromStatus(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	return &agentError{text: err.Error(), kind: errdefs.FromStatus(err), st: st}
}

// agentError is an agent's refusal. errors.Is finds its kind; status.Code
// and errdefs.Code its code.
type agentError struct {
	text string
	kind error
	st   *status.Status
}

func (e *agentError) Error() string              { return e.text }
func (e *agentError) Unwrap() error              { return e.kind }
func (e *agentError) GRPCStatus() *status.Status { return e.st }
