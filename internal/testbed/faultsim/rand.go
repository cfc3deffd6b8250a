package faultsim

import (
	"hash/fnv"
)

// dice makes every random choice of a run from its seed. Choices made by
// the simulation's own loop come from one stream (next); choices made
// inside the system under test, where goroutines race, are keyed by what
// they are about (roll), so that the order in which goroutines happen to
// ask does not change the answers.
type dice struct {
	seed  uint64
	state uint64
}

func newDice(seed uint64) *dice { return &dice{seed: seed, state: seed} }

// splitmix64 is a small, well-mixed generator (Steele, Lea, Flood 2014).
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// next returns the loop's next number.
func (d *dice) next() uint64 {
	d.state = splitmix64(d.state)
	return d.state
}

// intn returns a number in [0, n) from the loop's stream.
func (d *dice) intn(n int) int { return int(d.next() % uint64(n)) }

// float returns a number in [0, 1) from the loop's stream.
func (d *dice) float() float64 { return float64(d.next()>>11) / (1 << 53) }

// chance is true with probability p, from the loop's stream.
func (d *dice) chance(p float64) bool { return d.float() < p }

// roll returns a number in [0, 1) determined by the seed and key alone.
func (d *dice) roll(key string, n uint64) float64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(key))
	x := splitmix64(d.seed ^ splitmix64(h.Sum64()^splitmix64(n)))
	return float64(x>>11) / (1 << 53)
}
