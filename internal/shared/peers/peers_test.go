package peers

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestFileReloadsOnChangeAndKeepsLastGood(t *testing.T) {
	path := filepath.Join(t.TempDir(), "peers")
	if err := os.WriteFile(path, []byte("a:1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f := &File{Path: path}
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

func TestParse(t *testing.T) {
	got, err := Parse([]byte("# agents\n10.0.0.1:7670\n\n10.0.0.2:7670 # rack 2\n10.0.0.1:7670\n[::1]:7670\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"10.0.0.1:7670", "10.0.0.2:7670", "[::1]:7670"}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
	for _, bad := range []string{"nohost", "host:", ":7670"} {
		if _, err := Parse([]byte(bad)); err == nil {
			t.Errorf("Parse(%q) succeeded", bad)
		}
	}
}

// TestConfigured: a named peers file wins over the list.
func TestConfigured(t *testing.T) {
	if _, ok := Configured([]string{"a:1"}, "/etc/peers").(*File); !ok {
		t.Error("with a peers file: not the file")
	}
	if got, err := Configured([]string{"a:1"}, "").Peers(); err != nil || len(got) != 1 || got[0] != "a:1" {
		t.Errorf("without a peers file: %v, %v; want the list", got, err)
	}
}
