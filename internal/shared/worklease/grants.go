// Package worklease is the lease on the controller's background work.
//
// Several controller instances may serve the CSI calls at once (Nomad
// sends each call to any healthy instance): the calls' decisions rest on
// the nodes, so any instance answers any of them. The background work (the
// replication schedule, the pass over deletions a node missed) should run
// once: one instance holds it at a time, by a lease that a majority of the
// nodes grants, with no store outside the nodes (docs/architecture.md,
// "Several controllers").
//
// The node's side is Grants, the controller's Holder. The invariant: at
// any moment at most one instance believes it holds the lease, provided
// the clocks of a node and a controller run at rates within a quarter of
// each other (a wall clock that steps does not matter: both sides count
// durations on monotonic clocks). Why it holds:
//
//   - A node grants its part to one instance at a time, for Term from when
//     the request arrives, and to another only after that ran out or the
//     holder released it.
//   - An instance counts on its grants for HeldFor (four fifths of Term)
//     from before it sent the request, so its belief ends before any of
//     the grants it counted: a grant starts after the request was sent and
//     lasts Term on the node's clock, at least HeldFor on the instance's.
//   - It believes it holds the lease only with the grants of more than
//     half the members; two majorities share a node, and that node grants
//     one instance at a time.
//   - A node that restarts forgot its grants: it grants nothing for Term
//     after it starts, until every grant it may have given ran out.
//   - An instance that releases stops believing before it sends the
//     release.
//
// Another instance takes over within Term plus RenewEvery of the
// holder's last renewal: the nodes' grants run out by then, and it asks
// every RenewEvery.
package worklease

import (
	"errors"
	"sort"
	"sync"
	"time"
)

// Term is how long a node's grant lasts unless renewed.
const Term = 15 * time.Second

// RenewEvery is how often an instance asks the nodes for the lease,
// holder or not: three times a term, so two failed renewals in a row
// still leave a grant running.
const RenewEvery = Term / 3

// HeldFor is how long an instance counts on the grants it got, from
// before it asked: less than Term, for the time a request takes to
// arrive and for clocks that run at different rates.
const HeldFor = Term * 4 / 5

// seenFor is how long a node lists an instance that stopped asking.
const seenFor = 3 * Term

// Instance is a controller instance as it introduces itself.
type Instance struct {
	ID      string // random, chosen at start
	Host    string
	Address string // its metrics address
	Version string
	Started time.Time
	// NomadAlloc is its Nomad allocation's ID, when Nomad runs it.
	NomadAlloc string
}

// Lease is one node's view of the work lease.
type Lease struct {
	// Granted: the asking instance holds this node's part now.
	Granted bool
	// Holder holds it (ID empty: nobody), since HolderSince, for
	// Remaining more unless it renews.
	Holder      Instance
	HolderSince time.Time
	Remaining   time.Duration
	// GrantsAfter: the node grants nobody for this long yet (it started
	// within the term).
	GrantsAfter time.Duration
	// Seen are the instances that asked within the last three terms.
	Seen []Seen
}

// Seen is an instance a node heard from, and how long ago.
type Seen struct {
	Instance Instance
	Ago      time.Duration
}

// ErrNoID is the error of a request without an instance ID.
var ErrNoID = errors.New("the request names no controller instance")

// ErrNodeTooOld is a node's answer when it is older than the work lease.
// Such a node counts as granting: a cluster whose nodes are not all
// upgraded yet runs one controller (docs/install.md, "Upgrades").
var ErrNodeTooOld = errors.New("the node is older than the work lease")

// Grants is a node's part of the work lease. It lives in memory: a node
// that restarts grants nothing for a term (NewGrants).
type Grants struct {
	now func() time.Time

	mu     sync.Mutex
	from   time.Time // no grant before it: the node may have forgotten one
	holder Instance
	since  time.Time
	until  time.Time
	seen   map[string]seenAt
}

type seenAt struct {
	instance Instance
	at       time.Time
}

// NewGrants returns a node's grants, which start a term from now. now is
// the node's clock (time.Now, whose readings carry the monotonic clock).
func NewGrants(now func() time.Time) *Grants {
	return &Grants{now: now, from: now().Add(Term), seen: map[string]seenAt{}}
}

// NewGrantsAtOnce returns grants that start now: only for a node that
// cannot have granted anything before (a test's new node).
func NewGrantsAtOnce(now func() time.Time) *Grants {
	return &Grants{now: now, from: now(), seen: map[string]seenAt{}}
}

// Acquire grants or renews the lease to in, or releases its grant.
func (g *Grants) Acquire(in Instance, release bool) (Lease, error) {
	if in.ID == "" {
		return Lease{}, ErrNoID
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	g.seen[in.ID] = seenAt{instance: in, at: now}
	held := g.holder.ID != "" && now.Before(g.until)
	switch {
	case release:
		if g.holder.ID == in.ID {
			g.holder, g.until = Instance{}, time.Time{}
		}
	case now.Before(g.from):
	case !held || g.holder.ID == in.ID:
		if !held || g.holder.ID != in.ID {
			g.since = now
		}
		g.holder, g.until = in, now.Add(Term)
	}
	return g.lease(now, in.ID), nil
}

// Look tells the lease as this node sees it, granting nothing.
func (g *Grants) Look() Lease {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.lease(g.now(), "")
}

func (g *Grants) lease(now time.Time, asking string) Lease {
	var l Lease
	if g.holder.ID != "" && now.Before(g.until) {
		l.Holder, l.HolderSince, l.Remaining = g.holder, g.since, g.until.Sub(now)
		l.Granted = asking != "" && g.holder.ID == asking
	}
	if now.Before(g.from) {
		l.GrantsAfter = g.from.Sub(now)
	}
	for id, s := range g.seen {
		if now.Sub(s.at) > seenFor {
			delete(g.seen, id)
			continue
		}
		l.Seen = append(l.Seen, Seen{Instance: s.instance, Ago: now.Sub(s.at)})
	}
	sort.Slice(l.Seen, func(i, j int) bool { return l.Seen[i].Instance.ID < l.Seen[j].Instance.ID })
	return l
}
