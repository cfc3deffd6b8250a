package guesttest

import (
	"testing"
	"time"
)

// TestSlotsGoHighestFirstAndTargetsToSlotZero: a cluster takes the
// highest free slot, whatever order slots came back in, so that slot 0
// is the last taken; one with a backup target waits for slot 0 even
// while another is free.
func TestSlotsGoHighestFirstAndTargetsToSlotZero(t *testing.T) {
	openSlots(Options{Disks: []string{"1G"}, Slots: 3})
	t.Cleanup(func() { slots.freed = nil })

	a, b := takeSlot(false), takeSlot(false)
	if a != 2 || b != 1 {
		t.Fatalf("two clusters took slots %d and %d, want 2 and 1", a, b)
	}
	giveBackSlot(2)
	giveBackSlot(1)
	if got := takeSlot(false); got != 2 {
		t.Fatalf("with slots 2 then 1 given back, a cluster took slot %d, want 2", got)
	}
	if got := takeSlot(false); got != 1 {
		t.Fatalf("with slots 1 and 0 free, a cluster took slot %d, want 1", got)
	}
	if got := takeSlot(false); got != 0 {
		t.Fatalf("with slot 0 alone free, a cluster took slot %d, want 0", got)
	}

	got := make(chan int)
	go func() { got <- takeSlot(true) }()
	giveBackSlot(1)
	select {
	case s := <-got:
		t.Fatalf("a cluster with a target took slot %d while slot 0 was taken", s)
	case <-time.After(50 * time.Millisecond):
	}
	giveBackSlot(0)
	if s := <-got; s != 0 {
		t.Fatalf("a cluster with a target took slot %d, want 0", s)
	}
}
