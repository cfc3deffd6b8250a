package agent

import (
	"context"
	"sync"
	"time"
)

// healthMaxAge is how old a reading of the node's health GetNode may
// answer with.
const healthMaxAge = time.Second

// healthReadings answers a health check from its last reading while that
// reading is younger than maxAge, and reads again otherwise.
//
// Every question the controller asks a node carries a GetNode
// (cluster.Ask), so a busy controller asks many times a second, and each
// reading opens the pool and the root dataset: under load tens of
// milliseconds of libzfs a reading. A pool or root dataset that fails is
// reported at most maxAge late, which costs nothing that matters: health
// steers placement, backups and the operator's reports, and an operation
// on a failed pool fails by itself. Callers that arrive while a reading
// runs wait for it rather than read again.
type healthReadings struct {
	check  func(context.Context) error
	maxAge time.Duration
	now    func() time.Time

	mu  sync.Mutex
	at  time.Time // when err was read; zero before the first reading
	err error
}

func newHealthReadings(check func(context.Context) error, maxAge time.Duration, now func() time.Time) *healthReadings {
	return &healthReadings{check: check, maxAge: maxAge, now: now}
}

// Check returns the node's health as last read, reading it first if the
// last reading is maxAge old or older. A reading cut short by ctx is
// returned but not kept: it says nothing of the node.
func (h *healthReadings) Check(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.at.IsZero() && h.now().Sub(h.at) < h.maxAge {
		return h.err
	}
	err := h.check(ctx)
	if ctx.Err() != nil {
		return err
	}
	h.at, h.err = h.now(), err
	return err
}
