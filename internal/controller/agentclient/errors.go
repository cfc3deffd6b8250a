package agentclient

import "github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"

// fromStatus turns an agent's gRPC status into an error of its kind, once,
// here: errors.Is finds the kind, status.Code and errdefs.Code the code the
// agent answered, and the text is the agent's own message, without gRPC's
// "rpc error: code = ... desc =" prefix, so the controller's messages read
// the same whichever call failed. An error without a status (a cancelled
// context before the call was sent) passes through unchanged.
func fromStatus(err error) error {
	if err == nil {
		return nil
	}
	return errdefs.FromStatus(err)
}
