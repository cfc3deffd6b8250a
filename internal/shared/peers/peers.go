// Package peers says where the node agents are: a fixed list, or a file
// that Nomad's template renders from its service discovery. The
// controller asks every agent; each node asks its peers for its lease.
package peers

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"
)

// Source says where the node agents are.
type Source interface {
	Peers() ([]string, error)
}

// Configured says where the agents are by a configuration's `peers` and
// `peers_file`: the file when one is named, else the list.
func Configured(list []string, file string) Source {
	if file != "" {
		return &File{Path: file}
	}
	return Static(list)
}

// Static is a fixed list of agent addresses, for clusters without
// service discovery.
type Static []string

func (s Static) Peers() ([]string, error) { return s, nil }

// File reads agent addresses from a file, one host:port per line
// ('#' starts a comment), and re-reads it when it changes. Under Nomad a
// template block renders it from native service discovery, so the plugin
// needs no Nomad API token (see nomad/ and docs/install.md).
type File struct {
	Path string

	mu      sync.Mutex
	modTime time.Time
	size    int64
	peers   []string
}

func (f *File) Peers() ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, err := os.Stat(f.Path)
	if err != nil {
		return f.peers, fmt.Errorf("peers file: %w", err)
	}
	if st.ModTime().Equal(f.modTime) && st.Size() == f.size && f.peers != nil {
		return f.peers, nil
	}
	data, err := os.ReadFile(f.Path)
	if err != nil {
		return f.peers, fmt.Errorf("peers file: %w", err)
	}
	peers, err := Parse(data)
	if err != nil {
		return f.peers, fmt.Errorf("peers file %s: %w", f.Path, err)
	}
	f.peers, f.modTime, f.size = peers, st.ModTime(), st.Size()
	return peers, nil
}

// Parse reads one host:port per line; blank lines and comments are
// skipped, duplicates dropped.
func Parse(data []byte) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		line = strings.TrimSpace(line)
		if line == "" || seen[line] {
			continue
		}
		if i := strings.LastIndexByte(line, ':'); i <= 0 || i == len(line)-1 {
			return nil, fmt.Errorf("line %d: %q is not host:port", n, line)
		}
		seen[line] = true
		out = append(out, line)
	}
	return out, sc.Err()
}
