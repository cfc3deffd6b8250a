package worklease

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// nodes is an AskFunc over Grants on one clock.
type nodes struct {
	c      *clock
	grants []*Grants
	down   map[int]bool
	asked  []bool // each call's release
}

func newNodes(c *clock, n int) *nodes {
	ns := &nodes{c: c, down: map[int]bool{}}
	for range n {
		ns.grants = append(ns.grants, NewGrants(c.now))
	}
	return ns
}

func (ns *nodes) ask(_ context.Context, self Instance, release bool) ([]Reply, int, error) {
	ns.asked = append(ns.asked, release)
	var replies []Reply
	for i, g := range ns.grants {
		if ns.down[i] {
			continue
		}
		l, err := g.Acquire(self, release)
		replies = append(replies, Reply{Node: fmt.Sprintf("n%d", i+1), Lease: l, Err: err})
	}
	return replies, len(ns.grants), nil
}

func TestHolderHoldsWithAMajority(t *testing.T) {
	c := newClock()
	ns := newNodes(c, 3)
	h := NewHolder(instance("a"), ns.ask, hclog.NewNullLogger())
	h.SetClock(c.now)
	h.Try(context.Background())
	if _, ok := h.Held(); ok {
		t.Fatal("held while every node is in its first term")
	}
	c.advance(Term)
	ns.down[0] = true
	h.Try(context.Background())
	since, ok := h.Held()
	if !ok || !since.Equal(c.now()) {
		t.Fatalf("two of three granted: held %v since %v", ok, since)
	}
	c.advance(HeldFor - time.Millisecond)
	if _, ok := h.Held(); !ok {
		t.Fatal("not held within HeldFor of the request")
	}
	ns.down[1] = true
	h.Try(context.Background())
	if _, ok := h.Held(); !ok {
		t.Fatal("a failed renewal ended the holding before its time")
	}
	c.advance(time.Millisecond)
	if _, ok := h.Held(); ok {
		t.Fatal("held past HeldFor without a majority's renewal")
	}
	ns.down = map[int]bool{}
	h.Try(context.Background())
	if since, ok := h.Held(); !ok || !since.Equal(c.now()) {
		t.Fatalf("taken again: held %v since %v, want a new holding from now", ok, since)
	}
}

// TestHolderTellsItsChanges: Changed hears each start and end of a
// holding, once each, as the gauges of the holder need.
func TestHolderTellsItsChanges(t *testing.T) {
	c := newClock()
	ns := newNodes(c, 3)
	h := NewHolder(instance("a"), ns.ask, hclog.NewNullLogger())
	h.SetClock(c.now)
	var told []string
	h.Changed = func(held bool, since time.Time) {
		told = append(told, fmt.Sprintf("%v %s", held, since.Format(time.TimeOnly)))
	}
	c.advance(Term)
	h.Try(context.Background())
	first := c.now().Format(time.TimeOnly)
	h.Try(context.Background()) // a renewal is no change
	c.advance(HeldFor)          // run out without a renewal...
	h.Try(context.Background()) // ...and taken again
	again := c.now().Format(time.TimeOnly)
	h.Release()
	h.Release() // released already: no change
	zero := time.Time{}.Format(time.TimeOnly)
	want := []string{"true " + first, "false " + zero, "true " + again, "false " + zero}
	if fmt.Sprint(told) != fmt.Sprint(want) {
		t.Errorf("Changed heard %q, want %q", told, want)
	}
}

func TestHolderAnswersTooLateDoNotCount(t *testing.T) {
	c := newClock()
	ns := newNodes(c, 3)
	c.advance(Term)
	slow := func(ctx context.Context, self Instance, release bool) ([]Reply, int, error) {
		c.advance(HeldFor) // the answers took the whole of HeldFor
		return ns.ask(ctx, self, release)
	}
	h := NewHolder(instance("a"), slow, hclog.NewNullLogger())
	h.SetClock(c.now)
	h.Try(context.Background())
	if _, ok := h.Held(); ok {
		t.Fatal("held on grants whose time counted from the request had run out")
	}
}

func TestHolderReleasesBeforeItTellsTheNodes(t *testing.T) {
	c := newClock()
	ns := newNodes(c, 3)
	c.advance(Term)
	var heldWhileReleasing bool
	var h *Holder
	ask := func(ctx context.Context, self Instance, release bool) ([]Reply, int, error) {
		if release {
			_, heldWhileReleasing = h.Held()
		}
		return ns.ask(ctx, self, release)
	}
	h = NewHolder(instance("a"), ask, hclog.NewNullLogger())
	h.SetClock(c.now)
	h.Try(context.Background())
	h.Release()
	if heldWhileReleasing {
		t.Fatal("the instance still believed it held the lease when the nodes let it go")
	}
	b := NewHolder(instance("b"), ns.ask, hclog.NewNullLogger())
	b.SetClock(c.now)
	b.Try(context.Background())
	if _, ok := b.Held(); !ok {
		t.Fatal("another instance did not take over at once after a release")
	}
	ns.asked = nil
	NewHolder(instance("c"), ns.ask, hclog.NewNullLogger()).Release()
	if len(ns.asked) != 0 {
		t.Fatal("an instance that never held the lease told the nodes it let it go")
	}
}

// TestEveryWorksOnlyWhileHeld: work runs only while the lease is held,
// its context ends with the holding, and ended is called once it has.
func TestEveryWorksOnlyWhileHeld(t *testing.T) {
	c := newClock()
	ns := newNodes(c, 3)
	h := NewHolder(instance("a"), ns.ask, hclog.NewNullLogger())
	h.SetClock(c.now)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	works := make(chan context.Context, 100)
	ended := make(chan struct{}, 100)
	go h.EveryWhileHeld(ctx, time.Millisecond, func(ctx context.Context) { works <- ctx }, func() { ended <- struct{}{} })
	select {
	case <-works:
		t.Fatal("worked without the lease")
	case <-time.After(50 * time.Millisecond):
	}
	c.advance(Term)
	h.Try(ctx)
	work := <-works
	if work.Err() != nil {
		t.Fatal("the work's context ended while the lease is held")
	}
	select {
	case <-ended:
		t.Fatal("ended was called while the lease is held")
	default:
	}
	ns.down = map[int]bool{0: true, 1: true}
	c.advance(HeldFor)
	// The loop notices the expiry before Try ends the holding (as under
	// load it may): the work still learns that the lease ended.
	time.Sleep(20 * time.Millisecond)
	h.Try(ctx)
	select {
	case <-work.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the work's context did not end with the holding")
	}
	if !errors.Is(context.Cause(work), context.Cause(work)) || context.Cause(work).Error() != "the work lease ended" {
		t.Fatalf("cause: %v", context.Cause(work))
	}
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Fatal("ended was not called when the holding ended")
	}
	for len(works) > 0 {
		<-works
	}
	select {
	case <-works:
		t.Fatal("worked after the lease ended")
	case <-time.After(50 * time.Millisecond):
	}
}

// TestAtMostOneHolder tries hard to make two instances believe they hold
// the lease at once: instances ask at random moments, requests reach each
// node late or never, answers are lost, nodes restart and forget their
// grants, instances release, and every node's clock runs at its own rate,
// up to a fifth faster or slower than the instances'. After every event
// it counts the instances that believe they hold the lease.
func TestAtMostOneHolder(t *testing.T) {
	for seed := uint64(1); seed <= 300; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 0))
			c := newClock()
			start := c.now()
			nNodes := 3 + 2*r.IntN(2)
			rates := make([]float64, nNodes)
			grants := make([]*Grants, nNodes)
			for i := range grants {
				rates[i] = 0.8 + 0.4*r.Float64()
				rate := rates[i]
				grants[i] = NewGrants(func() time.Time { return start.Add(time.Duration(float64(c.now().Sub(start)) * rate)) })
			}
			var holders []*Holder
			held := 0
			for i := range 2 + r.IntN(2) {
				self := instance(fmt.Sprintf("c%d", i))
				ask := func(_ context.Context, self Instance, release bool) ([]Reply, int, error) {
					var replies []Reply
					for j := range grants {
						// The request arrives up to 1.5 s after the one before, or
						// never; a node's grants are read at arrival.
						if r.IntN(10) == 0 {
							continue
						}
						c.advance(time.Duration(r.IntN(1500)) * time.Millisecond)
						l, err := grants[j].Acquire(self, release)
						if r.IntN(10) == 0 {
							continue // the answer is lost
						}
						replies = append(replies, Reply{Node: fmt.Sprint(j), Lease: l, Err: err})
					}
					c.advance(time.Duration(r.IntN(1500)) * time.Millisecond)
					return replies, len(grants), nil
				}
				h := NewHolder(self, ask, hclog.NewNullLogger())
				h.SetClock(c.now)
				holders = append(holders, h)
			}
			for event := range 3000 {
				switch k := r.IntN(100); {
				case k < 70:
					holders[r.IntN(len(holders))].Try(context.Background())
				case k < 72:
					j := r.IntN(nNodes)
					rate := rates[j]
					grants[j] = NewGrants(func() time.Time { return start.Add(time.Duration(float64(c.now().Sub(start)) * rate)) })
				case k < 74:
					holders[r.IntN(len(holders))].Release()
				default:
					c.advance(time.Duration(r.IntN(3000)) * time.Millisecond)
				}
				var believers []string
				for _, h := range holders {
					if _, ok := h.Held(); ok {
						believers = append(believers, h.self.ID)
					}
				}
				if len(believers) > 1 {
					t.Fatalf("event %d: %v all believe they hold the lease", event, believers)
				}
				if len(believers) == 1 {
					held++
				}
			}
			if held == 0 {
				t.Fatal("nobody ever held the lease: the test proves nothing")
			}
		})
	}
}
