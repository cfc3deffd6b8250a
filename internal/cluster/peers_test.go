package cluster

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestPeersFileReloadsOnChangeAndKeepsLastGood(t *testing.T) {
	path := filepath.Join(t.TempDir(), "peers")
	if err := os.WriteFile(path, []byte("a:1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f := &PeersFile{Path: path}
	if got, err := f.Peers(); err != nil || len(got) != 1 || got[0] != "a:1" {
		t.Fatalf("first read: %v, %v", got, err)
	}
	if err := os.WriteFile(path, []byte("a:1\nb:2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chtimes(path, time.Now().Add(time.Second), time.Now().Add(time.Second))
	if got, err := f.Peers(); err != nil || len(got) != 2 {
		t.Fatalf("after change: %v, %v", got, err)
	}
	if err := os.WriteFile(path, []byte("broken line\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chtimes(path, time.Now().Add(2*time.Second), time.Now().Add(2*time.Second))
	got, err := f.Peers()
	if err == nil || len(got) != 2 {
		t.Fatalf("broken file: got %v, %v; want the last good list and an error", got, err)
	}
}
