package migration

import (
	"context"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// ReserveCreation chooses the node a new volume is created on, and has a
// majority of the nodes promise that node the volume's first generation
// before anything is created: a create whose answer was lost, retried
// while that node is silent, or one racing another controller, can then
// never make a second primary on another node (I3, docs/safety.md
// "Generations"). candidates
// are the node IDs the placement allows, best first; look is the create's
// first look at the nodes (LookForCreation), which the first step decides
// from (a later step, after another creation's reservation won, asks the
// nodes again).
//
// A node an earlier attempt was promised is the only choice: while it is
// silent the create answers Unavailable, and the CO's retry finds the
// volume there once it answers. A copy that exists already (on a node
// that answered) is returned as it is. The first generation is 1, unless
// concurrent creations split its promises so that none can win
// (creationPlan): then the next one above, for one of them.
func (m *Migrator) ReserveCreation(ctx context.Context, id string, candidates []string, look CreationLook) (cluster.Node, error) {
	for attempt := range maxSteps {
		v, err := m.lookAt(ctx, id, attempt, look)
		if err != nil {
			return cluster.Node{}, err
		}
		if !v.quorum() {
			return cluster.Node{}, m.noQuorum(id, v)
		}
		if len(v.copies) > 0 {
			return v.copies[0].node, nil
		}
		n, gen, err := v.creationPlan(id, candidates)
		if err != nil {
			return cluster.Node{}, err
		}
		// A majority may not have granted an earlier attempt's promise:
		// granting the same one again is idempotent.
		switch step, err := m.reserve(ctx, id, gen, n.Info.NodeID, v, grants{}); step {
		case goOn:
			return n, nil
		case answer:
			return cluster.Node{}, err
		}
		// lookAgain: another creation's reservation won this one's nodes.
	}
	return cluster.Node{}, errdefs.Wrap(errdefs.ErrAborted, "creating volume %s raced other creations %d times; retry", id, maxSteps)
}

// lookAt is the view of a creation's attempt: the create's look at
// first, then the nodes asked again (another creation's reservation won).
func (m *Migrator) lookAt(ctx context.Context, id string, attempt int, look CreationLook) (view, error) {
	if attempt == 0 {
		return notBeingDeleted(id, look.view)
	}
	return m.gather(ctx, id)
}

// CreationLook is what every node holds of a volume about to be created,
// with each node's capacity, from one question to each
// (LookForCreation): the create finds an earlier attempt's volume in it,
// places a new one among its nodes, and reserves the first generation
// from it.
type CreationLook struct {
	view  view
	nodes []cluster.Node // every node that answered, with its capacity
}

// LookForCreation asks every node who it is, its capacity, and what it
// holds of volume id, in one round trip each.
func (m *Migrator) LookForCreation(ctx context.Context, id string) (CreationLook, error) {
	answers, unreachable, err := cluster.AskWithCapacity(ctx, m.cluster, getCopy(id))
	if err != nil {
		return CreationLook{}, err
	}
	l := CreationLook{view: m.viewOf(id, answers, unreachable)}
	for _, a := range answers {
		l.nodes = append(l.nodes, a.Node)
	}
	return l, nil
}

// Nodes are the nodes that answered, with their capacity.
func (l CreationLook) Nodes() []cluster.Node { return l.nodes }

// Silent says which nodes did not answer ("" when every node did): a
// placement that found no matching node among those that did may have
// found one among them.
func (l CreationLook) Silent() string {
	if l.view.allAnswered() {
		return ""
	}
	return l.view.silent()
}

// Primary is the node of the newest primary of the volume an answering
// node holds: an earlier attempt made the volume there (between a move's
// promotion and the demotion of the old copy two nodes hold one, and the
// newest generation is the volume).
func (l CreationLook) Primary() (cluster.Node, bool) {
	p, ok := l.view.primary()
	return p.node, ok
}

// creationPlan is the node to create a volume no node holds on, and the
// generation to reserve for it there.
//
// Without promises: the first candidate that answered, generation 1.
// Otherwise the holder most promises of the highest generation top name
// (ties: the lowest node ID, so that racing instances choose alike),
// which must have answered: an earlier attempt may have created the
// volume there. Its reservation of top is tried again if a majority can
// still grant it (the answering nodes that promised it or less), its own
// node included, which the node's create checks. Two creations that
// chose different nodes at once can leave top split so that neither can
// ever win (each holder's own node promised the other). Then the holder
// takes top+1, which every node grants, but only when no other holder of
// top can have won a majority (its promises and every silent node are
// not more than half): a winner's create may be under way, and a later
// generation would make a second primary beside it.
func (v view) creationPlan(id string, candidates []string) (cluster.Node, uint64, error) {
	var top uint64
	for _, p := range v.promises {
		top = max(top, p.generation)
	}
	if top == 0 {
		for _, c := range candidates {
			if n, ok := v.node(c); ok {
				return n, 1, nil
			}
		}
		return cluster.Node{}, 0, errdefs.Wrap(errdefs.ErrUnavailable, "none of the nodes chosen for volume %s answered; retry", id)
	}
	votes := map[string]int{} // holder -> voters that promised it top
	for _, p := range v.promises {
		if p.generation == top && v.counts(p.recorder) {
			votes[p.holder]++
		}
	}
	holder := ""
	for h, n := range votes {
		if _, answered := v.node(h); !answered {
			return cluster.Node{}, 0, errdefs.Wrap(errdefs.ErrUnavailable, "an earlier attempt to create volume %s chose node %s, which does not answer; retry once it does (the volume may be there)", id, h)
		}
		if holder == "" || n > votes[holder] || n == votes[holder] && h < holder {
			holder = h
		}
	}
	n, _ := v.node(holder)
	if v.canGrant(holder, top) > v.voters()/2 && v.grantsItself(holder, top) {
		return n, top, nil
	}
	silent := v.voters() - v.answeringVoters()
	for h, count := range votes {
		if h != holder && count+silent > v.voters()/2 {
			return cluster.Node{}, 0, errdefs.Wrap(errdefs.ErrAborted, "another creation of volume %s chose node %s and may still be under way; retry", id, h)
		}
	}
	return n, top + 1, nil
}

// canGrant counts the answering voters (view.counts) that can promise
// gen to holder: those that promised it already, and those that promised
// nothing as high.
func (v view) canGrant(holder string, gen uint64) int {
	count := v.answeringVoters()
	for _, p := range v.promises {
		if v.counts(p.recorder) && (p.generation > gen || p.generation == gen && p.holder != holder) {
			count--
		}
	}
	return count
}

// grantsItself reports whether the holder's own node can promise it gen.
func (v view) grantsItself(holder string, gen uint64) bool {
	for _, p := range v.promises {
		if p.recorder == holder {
			return p.generation < gen || p.generation == gen && p.holder == holder
		}
	}
	return true
}
