package volume

import "testing"

// TestAwaitedPromotions: a volume is listed while any of its stages
// waits, with the first stage's generation; a stage's done counts once.
func TestAwaitedPromotions(t *testing.T) {
	m, _ := newManager(t)
	first := m.AwaitPromotion("vol-a", 2)
	second := m.AwaitPromotion("vol-a", 3)
	other := m.AwaitPromotion("vol-b", 1)
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
