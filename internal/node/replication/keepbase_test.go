package replication

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copylock"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
)

// TestAKeptBaseOutlivesTidies: a backup's base that nothing holds, kept
// for its send, survives the tidies that run meanwhile, and goes with the
// next tidy once the send has ended.
func TestAKeptBaseOutlivesTidies(t *testing.T) {
	ctx := context.Background()
	const id = "vol-0123456789abcdef0123"
	fs := "tank/nomad/" + id
	z := newMemPool()
	z.put(fs, nil, "zn-1:1", "zn-2:2", "zn-3:3", "zn-4:4")
	p := NewPusher(z, new(copylock.Locks), "tank/nomad", "n1", 2, nil, nil, hclog.NewNullLogger())
	left := func() []string {
		var out []string
		for _, s := range z.dataset(fs).snaps {
			out = append(out, s.Name)
		}
		return out
	}

	if _, err := p.keepBase(ctx, id, fs+"@zn-9"); !errors.Is(err, zfs.ErrNotFound) {
		t.Errorf("keeping a snapshot that is gone: %v, want NotFound", err)
	}
	release, err := p.keepBase(ctx, id, fs+"@zn-1")
	if err != nil {
		t.Fatal(err)
	}
	p.tidy(ctx, id, fs, fs+"@zn-4", "n2", hclog.NewNullLogger())
	if got := left(); !slices.Contains(got, fs+"@zn-1") || slices.Contains(got, fs+"@zn-2") {
		t.Errorf("a tidy while zn-1 is kept left %v, want zn-1 and the newest two", got)
	}
	release()
	release() // twice is once
	p.tidy(ctx, id, fs, fs+"@zn-4", "n2", hclog.NewNullLogger())
	if got := left(); slices.Contains(got, fs+"@zn-1") {
		t.Errorf("a tidy after the send left %v, zn-1 among them", got)
	}
	if kept := p.keptBase(id); kept != "" {
		t.Errorf("kept after the release: %v", kept)
	}
}

// TestKeepBackupBase: a backup's plan keeps its base only where nothing
// else does, and becomes a full send when the base is gone.
func TestKeepBackupBase(t *testing.T) {
	ctx := context.Background()
	const id, receiver = "vol-0123456789abcdef0123", "backup:vault"
	fs := "tank/nomad/" + id
	base := fs + "@zn-1"
	incremental := sendPlan{prog: Progress{Kind: KindIncremental, Snapshot: fs + "@zn-3", Base: base},
		spec: zfs.SendSpec{Snapshot: fs + "@zn-3", Base: base}, guid: 3}
	tests := []struct {
		name     string
		snaps    []string
		held     map[string][]string
		sent     string // the snapshot last sent to the receiver, its tidy not run
		wantKind string
		wantKept bool
	}{
		{"held with the target's tag", []string{"zn-1:1", "zn-3:3"}, map[string][]string{base: {peerTag(receiver)}}, "", KindIncremental, false},
		{"sent, not yet held", []string{"zn-1:1", "zn-3:3"}, nil, base, KindIncremental, false},
		{"held for another receiver only", []string{"zn-1:1", "zn-3:3"}, map[string][]string{base: {peerTag("n2")}}, "", KindIncremental, true},
		{"unheld (the operator deleted the target's newer backups)", []string{"zn-1:1", "zn-3:3"}, nil, "", KindIncremental, true},
		{"pruned since the plan", []string{"zn-3:3"}, nil, "", KindFull, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			z := newMemPool()
			z.put(fs, nil, tt.snaps...)
			p := NewPusher(z, new(copylock.Locks), "tank/nomad", "n1", 2, nil, nil, hclog.NewNullLogger())
			if tt.sent != "" {
				p.noteSent(id, receiver, tt.sent)
			}
			job := pushJob{volumeID: id, fs: fs, backup: true, log: hclog.NewNullLogger()}
			held := func() (map[string][]string, error) { return tt.held, nil }
			plan, release, err := p.keepBackupBase(ctx, job, incremental, held, receiver)
			if err != nil {
				t.Fatal(err)
			}
			if plan.prog.Kind != tt.wantKind || (plan.spec.Base == "") != (tt.wantKind == KindFull) || plan.spec.Base != plan.prog.Base {
				t.Errorf("plan %+v, want a %s send", plan, tt.wantKind)
			}
			if kept := p.keptBase(id) == base; kept != tt.wantKept || (release != nil) != tt.wantKept {
				t.Errorf("base kept %v (release %v), want %v", kept, release != nil, tt.wantKept)
			}
			if release != nil {
				release()
			}
		})
	}
}
