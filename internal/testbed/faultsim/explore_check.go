package faultsim

import (
	"fmt"
	"slices"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
)

// explChecks are the invariants the explorer checks after every step:
// the simulation's (check.go), with one difference in I3. The operator's
// promote -force gives a generation with the grants of the nodes that
// answer, not a majority's, on the operator's word that the silent nodes
// hold nothing newer (docs/safety.md, "Generations"); a majority that
// never heard of it may give the same generation again, which the
// controller then reports as a conflict and stages neither. So a
// generation first seen on a primary the operator forced is not held to
// being given once. Every other part of I3, and I1, holds for it.
type explChecks struct {
	generations map[string]uint64 // the last generation of each copy, by node
	primaries   map[uint64]string // the node first seen primary at each generation
	forced      map[uint64]bool   // generations seen on a forced primary
}

func (x *explRun) check() error {
	c := x.w.checker
	if err := c.pending; err != nil {
		return err
	}
	if err := c.unlocked.Load(); err != nil {
		return *err
	}
	id := x.vol.id
	for _, check := range []func(string) error{c.oneWriter, x.generationsGrow, c.nothingLost, c.mountsStay} {
		if err := check(id); err != nil {
			return err
		}
	}
	for _, n := range x.w.nodes {
		if err := c.indexAgrees(n); err != nil {
			return err
		}
	}
	return nil
}

// generationsGrow is I3 as check.go has it, but for forced generations.
func (x *explRun) generationsGrow(id string) error {
	k := &x.checks
	if k.generations == nil {
		k.generations, k.primaries, k.forced = map[string]uint64{}, map[uint64]string{}, map[uint64]bool{}
	}
	fs := rootDataset + "/" + id
	for _, n := range x.w.nodes {
		if !slices.Contains(n.pool.Names(), fs) {
			continue
		}
		role, gen, err := x.w.checker.label(n, fs)
		if err != nil {
			continue // a replica being received carries no label yet
		}
		if last := k.generations[n.id]; gen < last {
			return fmt.Errorf("I3 broken: the copy of %s on %s went from generation %d to %d", id, n.id, last, gen)
		}
		k.generations[n.id] = gen
		if role != contract.RolePrimary {
			continue
		}
		if x.w.checker.user(n, fs, copyrecord.PropForced) == fmt.Sprint(gen) {
			k.forced[gen] = true
		}
		if first, ok := k.primaries[gen]; ok && first != n.id && !k.forced[gen] {
			return fmt.Errorf("I3 broken: generation %d of %s was given to the copies on %s and on %s", gen, id, first, n.id)
		}
		if _, ok := k.primaries[gen]; !ok {
			k.primaries[gen] = n.id
		}
	}
	return nil
}
