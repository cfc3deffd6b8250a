package migration

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// grants says whose grants a reservation needs besides a majority's
// and its holder's.
type grants struct {
	// everyAnswering: every node that answered must grant, not a
	// majority (the operator's forced promotion, without a majority).
	everyAnswering bool
	// failover: every node attests the silence of those that did not
	// answer, and of any node its lease knows that is not among those that
	// did (agentclient.Reservation); every node that answered the look
	// must grant it, and a node that holds a primary of the volume
	// refuses it.
	failover bool
	// operator marks the operator's promotion: a node that keeps no lease
	// (no peers) grants its failover on the operator's word, and refuses
	// the controller's automatic one.
	operator bool
	// also names a node whose grant is needed too: a move's source, whose
	// own record must promise the target's generation before it is fenced,
	// so that the source's node refuses to lift that fence for any
	// controller instance that has not superseded the promise.
	also string
}

// reserve has a majority of the nodes promise generation gen of the
// volume to holder's copy before it is promoted with it: no other copy
// can then ever get gen (docs/safety.md, "Generations"). Granted, the
// caller goes on; refused because a newer generation exists or another
// promotion raced this one, it looks again (lookAgain, with an error
// that says who refused); anything else answers. g says whose grants it
// needs besides (grants).
func (m *Migrator) reserve(ctx context.Context, id string, gen uint64, holder string, v view, g grants) (next, error) {
	type reply struct {
		node string
		resp agentclient.Promise
		err  error
	}
	r := agentclient.Reservation{VolumeID: id, Generation: gen, HolderNodeID: holder, Operator: g.operator, Failover: g.failover,
		WitnessDigest: v.witnesses.Digest()}
	if g.failover {
		r.FailoverFrom = v.unreachable
		for _, n := range v.nodes {
			r.Answering = append(r.Answering, n.Info.NodeID)
		}
	}
	asked := v.reservationNodes(holder, g)
	answers := make(chan reply, len(asked))
	for _, n := range asked {
		go func() {
			cctx, cancel := m.call(ctx, v)
			defer cancel()
			resp, err := n.Agent.Reserve(cctx, r)
			answers <- reply{n.Info.NodeID, resp, err}
		}()
	}
	total := v.voters()
	granted, voted, holderGranted, alsoGranted, waiting, holdsPrimary := 0, 0, false, g.also == "", false, false
	var refusals []string
	for range asked {
		a := <-answers
		switch {
		case a.err != nil:
			refusals = append(refusals, fmt.Sprintf("node %s: %v", a.node, a.err))
			waiting = waiting || (g.failover && errors.Is(a.err, errdefs.ErrUnavailable))
			// A node refuses a failover's reservation with
			// FailedPrecondition while it holds a primary of the volume
			// (volume.Records.ReserveForFailover).
			holdsPrimary = holdsPrimary || (g.failover && errors.Is(a.err, errdefs.ErrFailedPrecondition))
		case a.resp.Granted:
			granted++
			if v.counts(a.node) {
				voted++
			}
			holderGranted = holderGranted || a.node == holder
			alsoGranted = alsoGranted || a.node == g.also
		default:
			refusals = append(refusals, fmt.Sprintf("node %s promised generation %d to node %s", a.node, a.resp.PromisedGeneration, a.resp.PromisedHolder))
		}
	}
	// A majority of the voters (every node, or the witnesses) promised
	// gen; the others' grants count only where named below.
	enough := voted > total/2
	switch {
	case g.everyAnswering:
		enough = granted == len(asked)
	case g.failover:
		// Every node of the look must grant too: one whose answer is
		// missing may have refused because it holds the primary now (a
		// move promoted it after the look read it), and its refusal is
		// what stops a failover on a torn look.
		enough = enough && granted == len(asked)
	}
	if enough && holderGranted && alsoGranted {
		return goOn, nil
	}
	if holdsPrimary {
		// The look was torn: a node it read as holding no primary was
		// promoted since (a move's final step). Its refusal already kept
		// the grants short of every node of the look; look again rather
		// than wait.
		m.log.Warn("no failover: a node holds the primary since the look; looking again", "volume_id", id, "generation", gen, "holder", holder,
			"refusals", strings.Join(refusals, "; "))
		return lookAgain, errdefs.Wrap(errdefs.ErrAborted, "generation %d of volume %s for node %s: a node holds the volume's primary (%s)",
			gen, id, holder, strings.Join(refusals, "; "))
	}
	if waiting {
		// Nodes that keep leases wait for the silent ones' to run out:
		// looking again at once changes nothing; the CO's retry comes
		// later.
		m.log.Warn("generation not reserved: nodes wait for the silent ones' leases to run out", "volume_id", id, "generation", gen, "holder", holder,
			"granted", granted, "voters_granted", voted, "voters", total, "refusals", strings.Join(refusals, "; "))
		return answer, errdefs.Wrap(errdefs.ErrUnavailable, "generation %d of volume %s for node %s: %d nodes granted it, %d of the %d whose grants make a majority (%s); retry",
			gen, id, holder, granted, voted, total, strings.Join(refusals, "; "))
	}
	m.log.Warn("generation not reserved; looking again", "volume_id", id, "generation", gen, "holder", holder,
		"granted", granted, "voters_granted", voted, "voters", total, "refusals", strings.Join(refusals, "; "))
	return lookAgain, errdefs.Wrap(errdefs.ErrAborted, "generation %d of volume %s for node %s: %d nodes granted it, %d of the %d whose grants make a majority (%s)",
		gen, id, holder, granted, voted, total, strings.Join(refusals, "; "))
}

// reservationNodes are the answering nodes a reservation of a generation
// for holder goes to. Without witnesses, every one: each grant counts
// toward the majority. With witnesses only theirs do, and another node's
// record decides nothing but that node's own changes of its copy, each
// checked against its record under the record's lock (docs/safety.md,
// "Witnesses"). So the reservation goes to the witnesses and to the nodes
// whose records a change of theirs reads:
//   - the holder, whose promotion or create checks that its record
//     promises it the generation (Records.checkPromised);
//   - the node g.also names, a move's source, whose fence checks that its
//     record promises the target the generation (checkPromisedTo);
//   - every node holding a copy of the volume, whose unfence checks that
//     its record promises no newer generation to another node
//     (checkNotPromisedAway);
//   - the holder of every promise the look found, which must grant a
//     newer generation for its promotion with the old one to be refused
//     for good (view.promisedAway, Migrator.supersede).
//
// What the other nodes would have recorded no decision needs: a look
// with a quorum reads a majority of the witnesses, which shares a
// witness with every reservation's majority (view.quorum), and a node's
// lease asks the witnesses. Each node then answers the
// reservations of the volumes it holds or is given, and the witnesses
// every one, instead of every node answering every reservation of the
// cluster. A failover's reservation (the operator's promotion is one)
// still goes to every answering node: each must grant it (the torn look,
// or the operator's word without a majority).
func (v view) reservationNodes(holder string, g grants) []cluster.Node {
	if v.witnesses.Empty() || g.failover || g.everyAnswering {
		return v.nodes
	}
	involved := map[string]bool{holder: true, g.also: true}
	for _, c := range v.copies {
		involved[c.nodeID()] = true
	}
	for _, p := range v.promises {
		involved[p.holder] = true
	}
	var out []cluster.Node
	for _, n := range v.nodes {
		if id := n.Info.NodeID; v.witnesses.Has(id) || involved[id] {
			out = append(out, n)
		}
	}
	return out
}
