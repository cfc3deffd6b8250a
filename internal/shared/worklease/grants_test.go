package worklease

import (
	"errors"
	"sync"
	"testing"
	"time"
)

// clock is a settable clock; a holder's work may read it from its own
// goroutine while a test advances it.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func newClock() *clock            { return &clock{t: time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC)} }
func instance(id string) Instance { return Instance{ID: id, Host: "h-" + id} }
func acquire(t *testing.T, g *Grants, id string) Lease {
	t.Helper()
	l, err := g.Acquire(instance(id), false)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestGrants(t *testing.T) {
	type step struct {
		after   time.Duration // advance the clock first
		id      string
		release bool
		granted bool
		holder  string // "" for nobody
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"a node grants nobody in its first term: it may have forgotten a grant", []step{
			{id: "a", holder: ""},
			{after: Term - time.Millisecond, id: "a", holder: ""},
			{after: time.Millisecond, id: "a", granted: true, holder: "a"},
		}},
		{"one holder at a time; another once the grant ran out", []step{
			{after: Term, id: "a", granted: true, holder: "a"},
			{id: "b", holder: "a"},
			{after: Term - time.Millisecond, id: "b", holder: "a"},
			{after: time.Millisecond, id: "b", granted: true, holder: "b"},
			{id: "a", holder: "b"},
		}},
		{"renewals keep it", []step{
			{after: Term, id: "a", granted: true, holder: "a"},
			{after: Term - time.Second, id: "a", granted: true, holder: "a"},
			{after: Term - time.Second, id: "a", granted: true, holder: "a"},
			{after: Term - time.Second, id: "b", holder: "a"},
		}},
		{"a release frees it at once; another's release does nothing", []step{
			{after: Term, id: "a", granted: true, holder: "a"},
			{id: "b", release: true, holder: "a"},
			{id: "b", holder: "a"},
			{id: "a", release: true, holder: ""},
			{id: "b", granted: true, holder: "b"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newClock()
			g := NewGrants(c.now)
			for i, s := range tt.steps {
				c.advance(s.after)
				l, err := g.Acquire(instance(s.id), s.release)
				if err != nil {
					t.Fatal(err)
				}
				if l.Granted != s.granted || l.Holder.ID != s.holder {
					t.Fatalf("step %d (%s, release %v): granted %v holder %q, want %v %q", i, s.id, s.release, l.Granted, l.Holder.ID, s.granted, s.holder)
				}
			}
		})
	}
}

func TestGrantsTellTheHoldingAndWhoAsked(t *testing.T) {
	c := newClock()
	g := NewGrants(c.now)
	if l := g.Look(); l.GrantsAfter != Term || l.Holder.ID != "" {
		t.Fatalf("a new node: %+v", l)
	}
	c.advance(Term)
	acquire(t, g, "a")
	c.advance(4 * time.Second)
	if l := acquire(t, g, "a"); !l.HolderSince.Equal(c.now().Add(-4*time.Second)) || l.Remaining != Term {
		t.Fatalf("a renewal keeps the holding's start and restarts the term: %+v", l)
	}
	c.advance(time.Second)
	acquire(t, g, "b")
	l := g.Look()
	if l.Granted || l.Holder.ID != "a" || l.Remaining != Term-time.Second || len(l.Seen) != 2 || l.Seen[0].Ago != time.Second || l.Seen[1].Ago != 0 {
		t.Fatalf("Look: %+v", l)
	}
	c.advance(seenFor)
	acquire(t, g, "b")
	if l := g.Look(); len(l.Seen) != 1 || l.Seen[0].Instance.ID != "b" || l.Holder.ID != "b" {
		t.Fatalf("an instance silent for three terms is no longer listed: %+v", l)
	}
	if _, err := g.Acquire(Instance{}, false); !errors.Is(err, ErrNoID) {
		t.Fatalf("a request without an ID: %v", err)
	}
}
