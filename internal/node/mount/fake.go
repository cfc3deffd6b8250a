package mount

import (
	"fmt"
	"slices"
	"strings"
	"sync"
)

// Fake is an in-memory mount table for tests and the fault-injection
// simulation: it answers as the kernel's would (a bind mount shows its
// source's dataset) and records each change it was asked for. It is safe
// for concurrent use.
type Fake struct {
	mu      sync.Mutex
	entries map[string]Entry // by mount point
	calls   []string
}

// NewFake returns an empty mount table.
func NewFake() *Fake { return &Fake{entries: map[string]Entry{}} }

// Lookup returns what is mounted at path.
func (t *Fake) Lookup(path string) (Entry, bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.entries[path]
	return e, ok, nil
}

// MountZFS mounts dataset at target.
func (t *Fake) MountZFS(dataset, target string, flags []string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.calls = append(t.calls, "mount "+dataset+" "+target)
	t.entries[target] = Entry{Root: "/", MountPoint: target, Options: strings.Join(flags, ","), FSType: "zfs", Source: dataset}
	return nil
}

// Bind mounts what is mounted at source at target too.
func (t *Fake) Bind(source, target string, flags []string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.calls = append(t.calls, "bind "+source+" "+target)
	src, ok := t.entries[source]
	if !ok {
		return fmt.Errorf("bind of %s: nothing is mounted there", source)
	}
	t.entries[target] = Entry{Root: "/", MountPoint: target, Options: strings.Join(flags, ","), FSType: src.FSType, Source: src.Source}
	return nil
}

// Unmount unmounts target.
func (t *Fake) Unmount(target string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.calls = append(t.calls, "unmount "+target)
	delete(t.entries, target)
	return nil
}

// Statfs reports nothing: the table holds no data.
func (t *Fake) Statfs(string) (Stats, error) { return Stats{}, nil }

// Calls returns the changes asked for so far, as "mount DATASET TARGET",
// "bind SOURCE TARGET" and "unmount TARGET".
func (t *Fake) Calls() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.calls)
}

// Mounted reports whether dataset is mounted anywhere.
func (t *Fake) Mounted(dataset string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, e := range t.entries {
		if e.Source == dataset {
			return true
		}
	}
	return false
}

// Datasets returns the datasets mounted, each once, sorted.
func (t *Fake) Datasets() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for _, e := range t.entries {
		if !slices.Contains(out, e.Source) {
			out = append(out, e.Source)
		}
	}
	slices.Sort(out)
	return out
}

// Reset empties the table, as a reboot does.
func (t *Fake) Reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	clear(t.entries)
}
