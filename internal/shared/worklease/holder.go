package worklease

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Reply is one node's answer to a request for the lease.
type Reply struct {
	Node  string
	Lease Lease
	Err   error
}

// AskFunc asks every node for the lease (or, release: gives it up) and
// returns their replies and how many nodes a majority is taken over (at
// least those that did not answer too).
type AskFunc func(ctx context.Context, self Instance, release bool) (replies []Reply, members int, err error)

// Holder is a controller instance's side of the work lease: it asks the
// nodes every RenewEvery and believes it holds the lease for HeldFor
// after a request that more than half the members granted.
type Holder struct {
	// Changed, when set before the first Try, is told each time this
	// instance starts holding the lease (held, since the holding's
	// start) and stops (not held, zero time): the controller's gauges.
	// It runs under the holder's lock and must not call the holder.
	Changed func(held bool, since time.Time)

	self Instance
	ask  AskFunc
	log  hclog.Logger
	now  func() time.Time

	mu    sync.Mutex
	until time.Time // held before it
	since time.Time // the current holding's start
	// held is the context of the current holding, cancelled when it ends;
	// nil while the lease is not held.
	held     context.Context
	stopHeld context.CancelFunc
	ends     *time.Timer
	// lastHolder is who the nodes last said held it, for the log.
	lastHolder string
	warnTooOld sync.Once
}

// NewHolder returns the holder of self, which reaches the nodes with ask.
func NewHolder(self Instance, ask AskFunc, log hclog.Logger) *Holder {
	return &Holder{self: self, ask: ask, log: log, now: time.Now}
}

// SetClock sets the clock the holder counts by (the fault simulation's).
func (h *Holder) SetClock(now func() time.Time) { h.now = now }

// Self is the instance the holder asks for.
func (h *Holder) Self() Instance { return h.self }

// Held reports whether this instance holds the lease now, and since when.
func (h *Holder) Held() (since time.Time, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.now().Before(h.until) {
		return time.Time{}, false
	}
	return h.since, true
}

// Run asks for the lease every RenewEvery until ctx ends, then releases
// it.
func (h *Holder) Run(ctx context.Context) {
	t := time.NewTicker(RenewEvery)
	defer t.Stop()
	for {
		h.Try(ctx)
		select {
		case <-ctx.Done():
			h.Release()
			return
		case <-t.C:
		}
	}
}

// Try asks the nodes once and takes, keeps or loses the lease by their
// answers. The request is bounded by RenewEvery: a grant that arrives
// later is worth little, and the next try comes then.
func (h *Holder) Try(ctx context.Context) {
	sent := h.now()
	ctx, cancel := context.WithTimeout(ctx, RenewEvery)
	defer cancel()
	replies, members, err := h.ask(ctx, h.self, false)
	if err != nil {
		h.log.Warn("could not ask the nodes for the work lease", "error", err)
		h.expire()
		return
	}
	granted := 0
	for _, r := range replies {
		switch {
		case r.Err == nil && r.Lease.Granted:
			granted++
		case errors.Is(r.Err, ErrNodeTooOld):
			granted++
			h.warnTooOld.Do(func() {
				h.log.Warn("a node is older than the work lease and counts as granting it: run one controller instance until every node is upgraded",
					"node", r.Node)
			})
		}
	}
	if granted > members/2 {
		h.hold(sent.Add(HeldFor), granted, members)
		return
	}
	h.expire()
	h.noteRefusal(replies, granted, members)
}

// hold extends the holding to until.
func (h *Holder) hold(until time.Time, granted, members int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	if !now.Before(until) {
		return // the answers came too late to count
	}
	if h.held == nil || !now.Before(h.until) {
		h.endLocked()
		h.since = now
		h.held, h.stopHeld = context.WithCancel(context.Background())
		if h.Changed != nil {
			h.Changed(true, now)
		}
		h.log.Info("this controller instance holds the work lease: it runs the replication schedule and the pass over deletions",
			"instance", h.self.ID, "granted_by", granted, "nodes", members)
	}
	h.until = until
	if h.ends != nil {
		h.ends.Stop()
	}
	h.ends = time.AfterFunc(until.Sub(now), h.expire)
}

// expire ends the holding if its time is up.
func (h *Holder) expire() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.held != nil && !h.now().Before(h.until) {
		h.log.Warn("this controller instance no longer holds the work lease: a majority of the nodes did not renew it; its background work stops",
			"instance", h.self.ID, "held_since", h.since)
		h.endLocked()
	}
}

func (h *Holder) endLocked() {
	if h.held != nil && h.Changed != nil {
		h.Changed(false, time.Time{})
	}
	if h.stopHeld != nil {
		h.stopHeld()
	}
	if h.ends != nil {
		h.ends.Stop()
	}
	h.held, h.stopHeld, h.ends = nil, nil, nil
}

// noteRefusal logs who holds the lease when that changes.
func (h *Holder) noteRefusal(replies []Reply, granted, members int) {
	holder, why := holderOf(replies)
	h.mu.Lock()
	changed := holder != h.lastHolder
	h.lastHolder = holder
	h.mu.Unlock()
	if changed {
		h.log.Info("another controller instance runs the background work, or none yet", "holder", holder,
			"granted_by", granted, "nodes", members, "answers", why)
	}
}

// holderOf names the holder most nodes report, and sums up the answers.
func holderOf(replies []Reply) (string, string) {
	count := map[string]int{}
	var why []string
	for _, r := range replies {
		switch {
		case r.Err != nil:
			why = append(why, fmt.Sprintf("%s: %v", r.Node, r.Err))
		case r.Lease.GrantsAfter > 0:
			why = append(why, fmt.Sprintf("%s: grants nobody for %s more (started within the term)", r.Node, r.Lease.GrantsAfter.Round(time.Second)))
		case r.Lease.Holder.ID != "":
			count[r.Lease.Holder.ID]++
			why = append(why, fmt.Sprintf("%s: held by %s", r.Node, Describe(r.Lease.Holder)))
		default:
			why = append(why, r.Node+": held by nobody")
		}
	}
	best := ""
	for id, n := range count {
		if n > count[best] || (n == count[best] && id < best) {
			best = id
		}
	}
	return best, strings.Join(why, "; ")
}

// Describe names an instance for people: its ID, host and address.
func Describe(in Instance) string {
	s := in.ID
	if in.Host != "" {
		s += " on " + in.Host
	}
	if in.Address != "" {
		s += " (" + in.Address + ")"
	}
	return s
}

// Release gives the lease up: the instance stops believing it holds it,
// then tells the nodes, so another takes over at its next try.
func (h *Holder) Release() {
	h.mu.Lock()
	wasHeld := h.held != nil
	h.until = time.Time{}
	h.endLocked()
	h.mu.Unlock()
	if !wasHeld {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), RenewEvery)
	defer cancel()
	if _, _, err := h.ask(ctx, h.self, true); err != nil {
		h.log.Warn("could not release the work lease; another instance takes it over once it runs out", "error", err, "within", Term)
		return
	}
	h.log.Info("released the work lease", "instance", h.self.ID)
}

// Stop ends the holding in this process without telling the nodes, as
// the process's exit would: their grants run out by themselves. For a
// process that goes on after its controller died (the fault
// simulation's crash); a controller that stops cleanly releases.
func (h *Holder) Stop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.until = time.Time{}
	h.endLocked()
}

// Every runs work every period while this instance holds the lease. Its
// context ends when the holding ends (or ctx does), and not before: work
// may leave goroutines behind (a schedule round's pushes), and those stop
// when another instance may start them again. It returns when ctx ends.
func (h *Holder) Every(ctx context.Context, every time.Duration, work func(context.Context)) {
	h.EveryWhileHeld(ctx, every, work, nil)
}

// EveryWhileHeld is Every, and calls ended (when not nil) at the first
// period after a holding in which work ran has ended: what the work
// published as the holder's (gauges only the holder keeps current) is
// withdrawn there, by the same goroutine that runs work, so never while
// a round of it runs.
func (h *Holder) EveryWhileHeld(ctx context.Context, every time.Duration, work func(context.Context), ended func()) {
	t := time.NewTicker(every)
	defer t.Stop()
	var holding, workCtx context.Context
	stop := func(error) {}
	defer func() { stop(context.Canceled) }()
	for {
		switch held := h.context(); {
		case held != nil:
			if held != holding {
				stop(errLeaseEnded)
				holding = held
				workCtx, stop = mergeDone(ctx, held)
			}
			work(workCtx)
		case holding != nil:
			stop(errLeaseEnded)
			holding = nil
			if ended != nil {
				ended()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// context is the current holding's context, or nil when not held.
func (h *Holder) context() context.Context {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.held == nil || !h.now().Before(h.until) {
		return nil
	}
	return h.held
}

// errLeaseEnded is the cause a work's context ends with when its holding
// ends, whichever notices first: the holding's context, or the loop
// finding the lease expired.
var errLeaseEnded = errors.New("the work lease ended")

// mergeDone returns a context of parent that also ends when other does
// (with errLeaseEnded), and the function that ends it with a cause.
func mergeDone(parent, other context.Context) (context.Context, func(cause error)) {
	ctx, cancel := context.WithCancelCause(parent)
	stop := context.AfterFunc(other, func() { cancel(errLeaseEnded) })
	return ctx, func(cause error) {
		stop()
		cancel(cause)
	}
}
