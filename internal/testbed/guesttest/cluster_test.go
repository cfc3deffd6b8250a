package guesttest

import (
	"testing"
	"time"
)

// TestSlotsGoLowestFirstAndTargetsToSlotZero: a cluster takes the lowest
// free slot, whatever order slots came back in, and one with a backup
// target waits for slot 0 even while another is free.
func TestSlotsGoLowestFirstAndTargetsToSlotZero(t *testing.T) {
	openSlots(Options{Disks: []string{"1G"}, Slots: 2})
	t.Cleanup(func() { slots.freed = nil })

	a, b := takeSlot(false), takeSlot(false)
	if a != 0 || b != 1 {
		t.Fatalf("two clusters took slots %d and %d, want 0 and 1", a, b)
	}
	giveBackSlot(0)
	giveBackSlot(1)
	if got := takeSlot(false); got != 0 {
		t.Fatalf("with slots 1 then 0 given back, a cluster took slot %d, want 0", got)
	}

	got := make(chan int)
	go func() { got <- takeSlot(true) }()
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
