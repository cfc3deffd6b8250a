package replication

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
)

// memPool is a pool in memory with what a receive does to it: datasets
// with properties and snapshots, and zfs receive's rules. A stream is a
// begin record (testBegin), any bytes, and streamEnd when complete; one
// that stops short leaves a partial receive, as zfs receive -s does.
type memPool struct {
	Pool
	mu       sync.Mutex
	ds       map[string]*memDataset
	receives int // zfs receive runs
}

type memDataset struct {
	props   map[string]string
	snaps   []zfs.Snap // oldest first
	holds   map[string][]string
	token   string // an interrupted receive's resume token
	partial bool   // created by a full receive that has not completed
}

// streamEnd ends a complete test stream (the END record of a real one).
const streamEnd = "END"

func newMemPool(datasets ...string) *memPool {
	p := &memPool{ds: map[string]*memDataset{}}
	for _, name := range datasets {
		p.ds[name] = &memDataset{props: map[string]string{}, holds: map[string][]string{}}
	}
	return p
}

// put adds a dataset with props and snapshots (name:guid).
func (p *memPool) put(name string, props map[string]string, snaps ...string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	d := &memDataset{props: maps.Clone(props), holds: map[string][]string{}}
	for _, s := range snaps {
		n, g, _ := strings.Cut(s, ":")
		guid, _ := strconv.ParseUint(g, 10, 64)
		d.snaps = append(d.snaps, zfs.Snap{Name: name + "@" + n, GUID: guid})
	}
	p.ds[name] = d
}

// names lists the datasets, sorted.
func (p *memPool) names() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Sorted(maps.Keys(p.ds))
}

// dataset returns a copy of the dataset's state, or nil.
func (p *memPool) dataset(name string) *memDataset {
	p.mu.Lock()
	defer p.mu.Unlock()
	d, ok := p.ds[name]
	if !ok {
		return nil
	}
	c := *d
	c.props, c.snaps = maps.Clone(d.props), slices.Clone(d.snaps)
	return &c
}

// find returns the state of the filesystem name is, or (a snapshot name)
// belongs to; ErrNotFound when there is none. The caller holds p.mu.
func (p *memPool) find(name string) (*memDataset, error) {
	fs, _, _ := strings.Cut(name, "@")
	d, ok := p.ds[fs]
	if !ok {
		return nil, fmt.Errorf("%s: %w", name, zfs.ErrNotFound)
	}
	return d, nil
}

func (p *memPool) Receive(ctx context.Context, target string, props map[string]string, r io.Reader) error {
	data, _ := io.ReadAll(r)
	begin, err := parseBegin(data)
	if err != nil {
		return fmt.Errorf("zfs receive: invalid stream: %v", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.receives++
	d, exists := p.ds[target]
	switch {
	case begin.fromGUID == 0 && exists && !d.partial:
		return fmt.Errorf("zfs receive: destination %s exists", target)
	case begin.fromGUID != 0 && !exists:
		return fmt.Errorf("zfs receive: destination %s does not exist: %w", target, zfs.ErrNotFound)
	case begin.fromGUID != 0 && (len(d.snaps) == 0 || d.snaps[len(d.snaps)-1].GUID != begin.fromGUID):
		return fmt.Errorf("zfs receive: most recent snapshot of %s does not match incremental source", target)
	}
	if !exists {
		d = &memDataset{props: maps.Clone(props), holds: map[string][]string{}, partial: true}
		p.ds[target] = d
	}
	if !bytes.HasSuffix(data, []byte(streamEnd)) {
		d.token = "1-token-of-" + target
		return fmt.Errorf("zfs receive: cannot receive: failed to read from stream (early EOF)")
	}
	d.token, d.partial = "", false
	_, snap, _ := strings.Cut(begin.toName, "@")
	d.snaps = append(d.snaps, zfs.Snap{Name: target + "@" + snap, GUID: begin.toGUID})
	return nil
}

func (p *memPool) AbortReceive(_ context.Context, target string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	d, ok := p.ds[target]
	if !ok || d.token == "" {
		return fmt.Errorf("zfs receive -A %s: no partial receive: %w", target, zfs.ErrNotFound)
	}
	if d.partial {
		delete(p.ds, target)
		return nil
	}
	d.token = ""
	return nil
}

func (p *memPool) Properties(_ context.Context, name string, props ...string) (map[string]string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fs, snap, isSnap := strings.Cut(name, "@")
	d, err := p.find(name)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, prop := range props {
		out[prop] = "-"
		switch {
		case isSnap && prop == "guid":
			i := slices.IndexFunc(d.snaps, func(s zfs.Snap) bool { return s.Name == fs+"@"+snap })
			if i < 0 {
				return nil, fmt.Errorf("%s: %w", name, zfs.ErrNotFound)
			}
			out[prop] = strconv.FormatUint(d.snaps[i].GUID, 10)
		case prop == "receive_resume_token" && d.token != "":
			out[prop] = d.token
		case d.props[prop] != "":
			out[prop] = d.props[prop]
		}
	}
	return out, nil
}

func (p *memPool) Property(ctx context.Context, name, prop string) (string, error) {
	out, err := p.Properties(ctx, name, prop)
	return out[prop], err
}

func (p *memPool) SetProperties(_ context.Context, name string, props map[string]string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	d, ok := p.ds[name]
	if !ok {
		return fmt.Errorf("%s: %w", name, zfs.ErrNotFound)
	}
	maps.Copy(d.props, props)
	return nil
}

func (p *memPool) Snapshots(_ context.Context, fs string) ([]zfs.Snap, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	d, err := p.find(fs)
	if err != nil {
		return nil, err
	}
	return slices.Clone(d.snaps), nil
}

func (p *memPool) Holds(_ context.Context, fs string) (map[string][]string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	d, err := p.find(fs)
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for snap, tags := range d.holds {
		out[fs+"@"+snap] = slices.Clone(tags)
	}
	return out, nil
}

func (p *memPool) Hold(_ context.Context, snapshot, tag string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, snap, _ := strings.Cut(snapshot, "@")
	d, err := p.find(snapshot)
	if err != nil {
		return err
	}
	d.holds[snap] = append(d.holds[snap], tag)
	return nil
}

func (p *memPool) Release(_ context.Context, snapshot, tag string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	fs, snap, _ := strings.Cut(snapshot, "@")
	if d, ok := p.ds[fs]; ok {
		d.holds[snap] = slices.DeleteFunc(d.holds[snap], func(t string) bool { return t == tag })
	}
	return nil
}

func (p *memPool) DestroySnapshot(_ context.Context, snapshot string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	fs, snap, _ := strings.Cut(snapshot, "@")
	if d, ok := p.ds[fs]; ok {
		if len(d.holds[snap]) > 0 {
			return fmt.Errorf("zfs destroy %s: %w", snapshot, zfs.ErrBusy)
		}
		d.snaps = slices.DeleteFunc(d.snaps, func(s zfs.Snap) bool { return s.Name == snapshot })
	}
	return nil
}

// Rollback is zfs rollback -r: it destroys the snapshots after snapshot,
// and fails when one of them is held.
func (p *memPool) Rollback(_ context.Context, snapshot string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	d, err := p.find(snapshot)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(d.snaps, func(s zfs.Snap) bool { return s.Name == snapshot })
	if i < 0 {
		return fmt.Errorf("%s: %w", snapshot, zfs.ErrNotFound)
	}
	for _, s := range d.snaps[i+1:] {
		if _, short, _ := strings.Cut(s.Name, "@"); len(d.holds[short]) > 0 {
			return fmt.Errorf("zfs rollback: %s is held: %w", s.Name, zfs.ErrBusy)
		}
	}
	d.snaps = d.snaps[:i+1]
	return nil
}

func (p *memPool) DestroyRecursive(_ context.Context, fs string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, err := p.find(fs); err != nil {
		return err
	}
	for name := range p.ds {
		if name == fs || strings.HasPrefix(name, fs+"/") {
			delete(p.ds, name)
		}
	}
	return nil
}

func (p *memPool) Rename(_ context.Context, from, to string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	d, ok := p.ds[from]
	if !ok {
		return fmt.Errorf("%s: %w", from, zfs.ErrNotFound)
	}
	if _, ok := p.ds[to]; ok {
		return fmt.Errorf("%s: %w", to, zfs.ErrExists)
	}
	delete(p.ds, from)
	for i, s := range d.snaps {
		d.snaps[i].Name = to + strings.TrimPrefix(s.Name, from)
	}
	p.ds[to] = d
	return nil
}

func (p *memPool) ChildProperties(_ context.Context, parent string, props ...string) ([]zfs.Child, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []zfs.Child
	for _, name := range slices.Sorted(maps.Keys(p.ds)) {
		if zfs.Parent(name) != parent {
			continue
		}
		ch := zfs.Child{Name: name, Props: map[string]string{}}
		for _, prop := range props {
			ch.Props[prop] = p.ds[name].props[prop]
			if ch.Props[prop] == "" {
				ch.Props[prop] = "-"
			}
		}
		out = append(out, ch)
	}
	return out, nil
}
