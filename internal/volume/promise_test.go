package volume

import (
	"context"
	"testing"

	"github.com/zfs-nomad/zfs-nomad/internal/vocab"
)

// TestReserve: a node promises a generation of a volume once, to one
// holder: above everything it promised or holds, again to the same holder
// (a retry), never to a second holder; deleting the volume forgets it.
func TestReserve(t *testing.T) {
	ctx := context.Background()
	m, fake := newManager(t)
	id := vocab.VolumeIDForName("v")
	if err := fake.CreateFilesystem(ctx, "tank/nomad/"+id, map[string]string{PropVolumeID: id, PropRole: vocab.RoleReplica, PropGeneration: "3"}); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name    string
		gen     uint64
		holder  string
		granted bool
		stands  Promise // what a refusal names
	}{
		{"not above the copy held here", 3, "n2", false, Promise{3, "n1"}},
		{"above it", 4, "n2", true, Promise{}},
		{"the same again (a retry)", 4, "n2", true, Promise{}},
		{"the same generation to another holder", 4, "n3", false, Promise{4, "n2"}},
		{"a lower one", 2, "n3", false, Promise{4, "n2"}},
		{"a higher one to another holder", 5, "n3", true, Promise{}},
	}
	for _, s := range steps {
		got, granted, err := m.Reserve(ctx, id, s.gen, s.holder)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if granted != s.granted || !granted && got != s.stands {
			t.Errorf("%s: granted %v (%+v), want %v (%+v)", s.name, granted, got, s.granted, s.stands)
		}
	}
	if p, _ := m.Promised(ctx, id); p != (Promise{5, "n3"}) {
		t.Errorf("promised %+v, want generation 5 to n3", p)
	}
	if err := m.Forget(ctx, id); err != nil {
		t.Fatal(err)
	}
	if p, _ := m.Promised(ctx, id); p != (Promise{}) {
		t.Errorf("after Forget: %+v, want nothing", p)
	}
}
