package faultsim

// check runs the simulation's invariants (check.go) on the explored
// volume after every step.
func (x *explRun) check() error {
	c := x.w.checker
	if err := c.pending; err != nil {
		return err
	}
	if err := c.unlocked.Load(); err != nil {
		return *err
	}
	id := x.vol.id
	for _, check := range []func(string) error{c.oneWriter, c.generationsGrow, c.nothingLost, c.mountsStay, c.replicasFollow} {
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
