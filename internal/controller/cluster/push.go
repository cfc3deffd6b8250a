package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
)

// DefaultStallTimeout is how long a push may move no data before it is
// cancelled, when its caller names no other bound.
const DefaultStallTimeout = 2 * time.Minute

// ErrStalled ends a push that moved no data for its stall timeout.
var ErrStalled = errors.New("the push moved no data for the stall timeout; cancelled")

// Push has source push its primary of volumeID to the agent of node to
// (when to names the node, only its certificate may answer there), and
// reports each progress to each (when set). A push that moves no byte
// for stall (DefaultStallTimeout when stall is not positive) is
// cancelled with ErrStalled: a hung peer or
// stream must not hold a push, and whatever waits for it, forever. Its
// answer is an error unless the push completed.
func Push(ctx context.Context, source Node, volumeID string, to agentclient.Target, purpose string, stall time.Duration, each func(agentclient.Progress)) (agentclient.Progress, error) {
	if stall <= 0 {
		stall = DefaultStallTimeout
	}
	ctx, progressed, stop := stallGuard(ctx, stall)
	defer stop()
	last, err := source.Agent.Replicate(ctx, volumeID, to, purpose, func(p agentclient.Progress) {
		progressed(p.Bytes)
		if each != nil {
			each(p)
		}
	})
	if cause := context.Cause(ctx); errors.Is(cause, ErrStalled) {
		err = cause
	}
	if err == nil && !last.Done {
		err = errors.New("the push ended without completing")
	}
	return last, err
}

// stallGuard returns a context that is cancelled with ErrStalled once
// progressed has not been called with a larger byte count for timeout.
// stop releases the guard.
func stallGuard(ctx context.Context, timeout time.Duration) (_ context.Context, progressed func(bytes int64), stop func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	var mu sync.Mutex
	var most int64
	timer := time.AfterFunc(timeout, func() { cancel(fmt.Errorf("%w (%s)", ErrStalled, timeout)) })
	progressed = func(bytes int64) {
		mu.Lock()
		defer mu.Unlock()
		if bytes > most {
			most = bytes
			timer.Reset(timeout)
		}
	}
	return ctx, progressed, func() { timer.Stop(); cancel(nil) }
}
