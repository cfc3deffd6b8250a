package volume

import (
	"context"
	"testing"
)

// TestAwaitedPromotions: a volume is listed while any of its stages
// waits, with the first stage's generation; a stage's done counts once.
func TestAwaitedPromotions(t *testing.T) {
	m, _ := newManager(t)
	_, first := m.AwaitPromotion("vol-a", 2)
	_, second := m.AwaitPromotion("vol-a", 3)
	_, other := m.AwaitPromotion("vol-b", 1)
	if got := m.AwaitedPromotions(); len(got) != 2 || got[0].VolumeID != "vol-a" || got[0].AfterGeneration != 2 || got[1].VolumeID != "vol-b" {
		t.Fatalf("waiting: %+v", got)
	}
	first()
	first() // counts once
	if got := m.AwaitedPromotions(); len(got) != 2 {
		t.Fatalf("one of vol-a's two stages ended: %+v, want vol-a still listed", got)
	}
	second()
	other()
	if got := m.AwaitedPromotions(); len(got) != 0 {
		t.Fatalf("every stage ended: %+v", got)
	}
}

// TestAPromotionWakesTheStagesWaitingForIt: the node's promotion of its
// copy closes the channel its waiting stages got, and no other volume's;
// the stages stay listed until they end, and a stage that begins waiting
// afterwards gets a channel not yet closed.
func TestAPromotionWakesTheStagesWaitingForIt(t *testing.T) {
	ctx := context.Background()
	m, fake := newManager(t)
	id, _ := receivedReplica(t, fake, 1, nil)
	woken, done := m.AwaitPromotion(id, 1)
	defer done()
	other, otherDone := m.AwaitPromotion("vol-other", 1)
	defer otherDone()
	reserve(t, m, id, 2, "n1")
	if _, err := m.Promote(ctx, id, 2, 0, "", false); err != nil {
		t.Fatal(err)
	}
	select {
	case <-woken:
	default:
		t.Fatal("the promotion did not wake the stage waiting for it")
	}
	select {
	case <-other:
		t.Fatal("another volume's promotion woke this volume's stage")
	default:
	}
	if got := m.AwaitedPromotions(); len(got) != 2 {
		t.Errorf("waiting after the wake: %+v, want both stages listed until they end", got)
	}
	later, laterDone := m.AwaitPromotion(id, 2)
	defer laterDone()
	select {
	case <-later:
		t.Error("a stage that began waiting after the promotion got a closed channel")
	default:
	}
}
