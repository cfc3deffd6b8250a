package zfsfake_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/node/replication"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs/zfsfake"
)

var _ replication.Pool = (*zfsfake.Fake)(nil)

var ctx = context.Background()

// node is one fake pool "tank" with its replication view; seed makes its
// GUIDs its own, as each node of a simulation needs.
type node struct {
	*zfsfake.Fake
	s replication.Pool
}

func newNode(t *testing.T, seed uint64, filesystems ...string) node {
	t.Helper()
	f := zfsfake.New(1<<40, "tank")
	f.GUIDSeed = seed
	for _, fs := range filesystems {
		must(t, f.CreateFilesystem(ctx, fs, nil))
	}
	return node{f, f}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// write writes tokens to fs and snapshots it as snap.
func (n node) writeAndSnap(t *testing.T, fs, snap string, tokens ...string) {
	t.Helper()
	for _, tok := range tokens {
		must(t, n.Write(fs, tok))
	}
	must(t, n.s.Snapshot(ctx, fs+"@"+snap, nil))
}

// send returns the stream spec asks for.
func (n node) send(t *testing.T, spec zfs.SendSpec) []byte {
	t.Helper()
	var buf bytes.Buffer
	written, err := n.s.Send(ctx, spec, &buf)
	must(t, err)
	if written != int64(buf.Len()) {
		t.Fatalf("Send returned %d bytes, wrote %d", written, buf.Len())
	}
	return buf.Bytes()
}

func (n node) content(t *testing.T, name string) []string {
	t.Helper()
	c, err := n.Content(name)
	must(t, err)
	return c
}

func (n node) snaps(t *testing.T, fs string) []zfs.Snap {
	t.Helper()
	s, err := n.s.Snapshots(ctx, fs)
	must(t, err)
	return s
}

func (n node) get(t *testing.T, name, prop string) string {
	t.Helper()
	v, err := n.s.Property(ctx, name, prop)
	must(t, err)
	return v
}

func TestSendReceive(t *testing.T) {
	tests := []struct {
		name string
		raw  bool
		enc  string // the source's encryption
		want string // the replica's encryption
	}{
		{"plain", false, "", "off"},
		{"raw of an encrypted volume", true, "aes-256-gcm", "aes-256-gcm"},
		{"not raw of an encrypted volume", false, "aes-256-gcm", "off"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src, dst := newNode(t, 1), newNode(t, 2, "tank/replicas")
			props := map[string]string{}
			if tt.enc != "" {
				props["encryption"] = tt.enc
			}
			must(t, src.CreateFilesystem(ctx, "tank/v", props))
			src.SetNow(time.Unix(1_800_000_000, 0))
			src.writeAndSnap(t, "tank/v", "s1", "a", "b")
			srcSnaps := src.snaps(t, "tank/v")

			full := src.send(t, zfs.SendSpec{Snapshot: "tank/v@s1", Raw: tt.raw})
			checkBegin(t, full, 0, srcSnaps[0].GUID, "tank/v@s1")
			recvProps := map[string]string{"readonly": "on", "mountpoint": "legacy", "zfs-nomad:role": "replica"}
			must(t, dst.s.Receive(ctx, "tank/replicas/v", recvProps, bytes.NewReader(full)))

			got := dst.snaps(t, "tank/replicas/v")
			if len(got) != 1 || got[0].GUID != srcSnaps[0].GUID || got[0].Name != "tank/replicas/v@s1" || got[0].Created != 1_800_000_001 {
				t.Fatalf("received %+v, want s1 with guid %d created at the source's time", got, srcSnaps[0].GUID)
			}
			if c := dst.content(t, "tank/replicas/v"); !slices.Equal(c, []string{"a", "b"}) {
				t.Errorf("content %v after the full receive", c)
			}
			for prop, want := range map[string]string{"readonly": "on", "mountpoint": "legacy", "zfs-nomad:role": "replica", "encryption": tt.want} {
				if v := dst.get(t, "tank/replicas/v", prop); v != want {
					t.Errorf("%s = %q, want %q", prop, v, want)
				}
			}
			if ds, err := dst.Get(ctx, "tank/replicas/v"); err != nil || ds.User["zfs-nomad:role"] != "replica" || !ds.ReadOnly {
				t.Errorf("zfs.Interface sees %+v, %v", ds, err)
			}

			src.writeAndSnap(t, "tank/v", "s2", "c")
			inc := src.send(t, zfs.SendSpec{Snapshot: "tank/v@s2", Base: "tank/v@s1", Raw: tt.raw})
			srcSnaps = src.snaps(t, "tank/v")
			checkBegin(t, inc, srcSnaps[0].GUID, srcSnaps[1].GUID, "tank/v@s2")
			must(t, dst.s.Receive(ctx, "tank/replicas/v", nil, bytes.NewReader(inc)))
			got = dst.snaps(t, "tank/replicas/v")
			if len(got) != 2 || got[1].GUID != srcSnaps[1].GUID || got[1].CreateTXG <= got[0].CreateTXG {
				t.Fatalf("after the incremental: %+v, want s2 with guid %d after s1", got, srcSnaps[1].GUID)
			}
			if c := dst.content(t, "tank/replicas/v"); !slices.Equal(c, []string{"a", "b", "c"}) {
				t.Errorf("content %v after the incremental", c)
			}
			if c := dst.content(t, "tank/replicas/v@s1"); !slices.Equal(c, []string{"a", "b"}) {
				t.Errorf("s1 holds %v after the incremental", c)
			}
			if tok := dst.get(t, "tank/replicas/v", "receive_resume_token"); tok != "-" {
				t.Errorf("receive_resume_token %q after complete receives", tok)
			}
		})
	}
}

// checkBegin reads the begin record as replication's parseBegin does.
func checkBegin(t *testing.T, stream []byte, from, to uint64, toName string) {
	t.Helper()
	le := binary.LittleEndian
	if len(stream) < 312 || le.Uint32(stream) != 0 || le.Uint64(stream[8:]) != 0x2F5bacbac {
		t.Fatalf("no begin record: % x", stream[:min(len(stream), 16)])
	}
	if le.Uint64(stream[16:])&3 != 1 {
		t.Errorf("versioninfo %#x: not a plain stream", le.Uint64(stream[16:]))
	}
	name, _, _ := bytes.Cut(stream[56:312], []byte{0})
	if le.Uint64(stream[40:]) != to || le.Uint64(stream[48:]) != from || string(name) != toName {
		t.Errorf("begin record says %d -> %d %q, want %d -> %d %q", le.Uint64(stream[48:]), le.Uint64(stream[40:]), name, from, to, toName)
	}
}

func TestInterruptedReceiveResumes(t *testing.T) {
	tests := []struct {
		name        string
		incremental bool
		cut         int // bytes of the stream that arrive
	}{
		{"full, cut after the begin record", false, 312},
		{"full, cut in the payload", false, 320},
		{"full, cut in the end record", false, -5},
		{"incremental, cut after the begin record", true, 312},
		{"incremental, cut in the end record", true, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src, dst := newNode(t, 1, "tank/v"), newNode(t, 2)
			src.writeAndSnap(t, "tank/v", "s1", "a")
			spec := zfs.SendSpec{Snapshot: "tank/v@s1"}
			labels := map[string]string{"zfs-nomad:role": "replica"}
			if tt.incremental {
				must(t, dst.s.Receive(ctx, "tank/v", labels, bytes.NewReader(src.send(t, spec))))
				src.writeAndSnap(t, "tank/v", "s2", "b")
				spec = zfs.SendSpec{Snapshot: "tank/v@s2", Base: "tank/v@s1"}
			}
			stream := src.send(t, spec)
			cut := tt.cut
			if cut < 0 {
				cut += len(stream)
			}
			before := dst.Names()
			err := dst.s.Receive(ctx, "tank/v", labels, bytes.NewReader(stream[:cut]))
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("a cut stream: %v, want an early EOF", err)
			}
			if !tt.incremental && !slices.Contains(dst.Names(), "tank/v") {
				t.Fatal("an interrupted full receive left no partial filesystem")
			}
			if tt.incremental && !slices.Equal(dst.Names(), before) {
				t.Errorf("an interrupted incremental changed the datasets: %v, was %v", dst.Names(), before)
			}
			var wantContent []string // a partial new filesystem holds nothing
			if tt.incremental {
				wantContent = []string{"a"} // the target as it was
			}
			if c := dst.content(t, "tank/v"); !slices.Equal(c, wantContent) {
				t.Errorf("content %v after the interrupted receive, want %v", c, wantContent)
			}
			children, err := dst.s.ChildProperties(ctx, "tank", "receive_resume_token", "zfs-nomad:role")
			must(t, err)
			if len(children) != 1 || children[0].Props["zfs-nomad:role"] != "replica" {
				t.Fatalf("children %+v, want the partial replica with its properties", children)
			}
			token := children[0].Props["receive_resume_token"]
			if !strings.HasPrefix(token, "1-") {
				t.Fatalf("receive_resume_token %q", token)
			}
			info, err := src.s.ResumeToken(ctx, token)
			must(t, err)
			srcSnaps := src.snaps(t, "tank/v")
			want := zfs.ResumeInfo{ToName: spec.Snapshot, ToGUID: srcSnaps[len(srcSnaps)-1].GUID}
			if tt.incremental {
				want.FromGUID = srcSnaps[0].GUID
			}
			if info != want {
				t.Fatalf("the token says %+v, want %+v", info, want)
			}

			// A fresh stream is refused while the partial receive waits.
			if err := dst.s.Receive(ctx, "tank/v", nil, bytes.NewReader(stream)); err == nil || !strings.Contains(err.Error(), "partially-complete") {
				t.Errorf("a fresh stream into a partial receive: %v", err)
			}
			resumed := src.send(t, zfs.SendSpec{ResumeToken: token})
			checkBegin(t, resumed, want.FromGUID, want.ToGUID, want.ToName)
			must(t, dst.s.Receive(ctx, "tank/v", nil, bytes.NewReader(resumed)))
			if tok := dst.get(t, "tank/v", "receive_resume_token"); tok != "-" {
				t.Errorf("token %q after the resumed receive", tok)
			}
			got := dst.snaps(t, "tank/v")
			if got[len(got)-1].GUID != want.ToGUID {
				t.Errorf("snapshots %+v after resuming, want the last with guid %d", got, want.ToGUID)
			}
			if c, wantC := dst.content(t, "tank/v"), src.content(t, spec.Snapshot); !slices.Equal(c, wantC) {
				t.Errorf("content %v after resuming, want %v", c, wantC)
			}
		})
	}
}

func TestAbortReceive(t *testing.T) {
	tests := []struct {
		name        string
		incremental bool
		wantNames   []string
	}{
		{"a partial full receive goes with its filesystem", false, []string{"tank"}},
		{"a partial incremental leaves the filesystem as it was", true, []string{"tank", "tank/v", "tank/v@s1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src, dst := newNode(t, 1, "tank/v"), newNode(t, 2)
			src.writeAndSnap(t, "tank/v", "s1", "a")
			spec := zfs.SendSpec{Snapshot: "tank/v@s1"}
			if tt.incremental {
				must(t, dst.s.Receive(ctx, "tank/v", nil, bytes.NewReader(src.send(t, spec))))
				src.writeAndSnap(t, "tank/v", "s2", "b")
				spec = zfs.SendSpec{Snapshot: "tank/v@s2", Base: "@s1"}
			}
			stream := src.send(t, spec)
			_ = dst.s.Receive(ctx, "tank/v", nil, bytes.NewReader(stream[:400]))
			must(t, dst.s.AbortReceive(ctx, "tank/v"))
			if !slices.Equal(dst.Names(), tt.wantNames) {
				t.Errorf("after the abort: %v, want %v", dst.Names(), tt.wantNames)
			}
			if err := dst.s.AbortReceive(ctx, "tank/v"); !errors.Is(err, zfs.ErrNotFound) {
				t.Errorf("aborting again: %v, want ErrNotFound", err)
			}
			// The stream can now be received afresh.
			must(t, dst.s.Receive(ctx, "tank/v", nil, bytes.NewReader(stream)))
		})
	}
}

func TestSendRefuses(t *testing.T) {
	src := newNode(t, 1, "tank/v", "tank/w")
	src.writeAndSnap(t, "tank/v", "s1", "a")
	src.writeAndSnap(t, "tank/v", "s2", "b")
	src.writeAndSnap(t, "tank/w", "s1", "c")
	s2 := src.snaps(t, "tank/v")[1]
	// The token of a partial receive of s2, cut after its begin record.
	dst := newNode(t, 2)
	stream := src.send(t, zfs.SendSpec{Snapshot: "tank/v@s2"})
	_ = dst.s.Receive(ctx, "tank/x", nil, bytes.NewReader(stream[:312]))
	token := dst.get(t, "tank/x", "receive_resume_token")
	tests := []struct { // in order: the last two change the pool
		name    string
		spec    zfs.SendSpec
		prepare func()
		want    string
	}{
		{"a missing snapshot", zfs.SendSpec{Snapshot: "tank/v@nope"}, nil, "tank/v@nope"},
		{"a missing base", zfs.SendSpec{Snapshot: "tank/v@s2", Base: "tank/v@nope"}, nil, "tank/v@nope"},
		{"a base of another filesystem", zfs.SendSpec{Snapshot: "tank/v@s2", Base: "tank/w@s1"}, nil, "not an earlier snapshot"},
		{"a later base", zfs.SendSpec{Snapshot: "tank/v@s1", Base: "tank/v@s2"}, nil, "not an earlier snapshot"},
		{"a token whose snapshot was destroyed", zfs.SendSpec{ResumeToken: token},
			func() { must(t, src.s.DestroySnapshot(ctx, "tank/v@s2")) }, "tank/v@s2"},
		{"a token whose snapshot was made anew", zfs.SendSpec{ResumeToken: token},
			func() { must(t, src.s.Snapshot(ctx, "tank/v@s2", nil)) }, strconv.FormatUint(s2.GUID, 10)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.prepare != nil {
				tt.prepare()
			}
			var buf bytes.Buffer
			_, err := src.s.Send(ctx, tt.spec, &buf)
			if !errors.Is(err, zfs.ErrNotFound) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("%v, want ErrNotFound mentioning %q", err, tt.want)
			}
			if buf.Len() > 0 {
				t.Errorf("a refused send wrote %d bytes", buf.Len())
			}
		})
	}
}

func TestReceiveRefuses(t *testing.T) {
	tests := []struct {
		name    string
		prepare func(t *testing.T, src, dst node)
		spec    zfs.SendSpec
		want    string
	}{
		{"an incremental from a base the target's newest snapshot is not",
			func(t *testing.T, src, dst node) {
				src.writeAndSnap(t, "tank/v", "s3", "c")
			},
			zfs.SendSpec{Snapshot: "tank/v@s3", Base: "tank/v@s1"}, "does not match incremental source"},
		{"an incremental into a target written since its newest snapshot",
			func(t *testing.T, src, dst node) {
				must(t, dst.s.SetProperties(ctx, "tank/v", map[string]string{"readonly": "off"}))
				must(t, dst.Write("tank/v", "x"))
				src.writeAndSnap(t, "tank/v", "s3", "c")
			},
			zfs.SendSpec{Snapshot: "tank/v@s3", Base: "tank/v@s2"}, "modified since most recent snapshot"},
		{"a full stream into an existing target",
			func(t *testing.T, src, dst node) {}, zfs.SendSpec{Snapshot: "tank/v@s2"}, "exists"},
		{"an incremental into no target",
			func(t *testing.T, src, dst node) {
				must(t, dst.s.DestroyRecursive(ctx, "tank/v"))
				src.writeAndSnap(t, "tank/v", "s3", "c")
			},
			zfs.SendSpec{Snapshot: "tank/v@s3", Base: "tank/v@s2"}, "does not exist"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src, dst := newNode(t, 1, "tank/v"), newNode(t, 2)
			src.writeAndSnap(t, "tank/v", "s1", "a")
			src.writeAndSnap(t, "tank/v", "s2", "b")
			must(t, dst.s.Receive(ctx, "tank/v", map[string]string{"readonly": "on"}, bytes.NewReader(src.send(t, zfs.SendSpec{Snapshot: "tank/v@s2"}))))
			tt.prepare(t, src, dst)
			names, content := dst.Names(), dst.snapshotContents()
			err := dst.s.Receive(ctx, "tank/v", nil, bytes.NewReader(src.send(t, tt.spec)))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("%v, want an error saying %q", err, tt.want)
			}
			if !slices.Equal(dst.Names(), names) || dst.snapshotContents() != content {
				t.Errorf("a refused receive changed the target: %v %s, was %v %s", dst.Names(), dst.snapshotContents(), names, content)
			}
			if tok, err := dst.s.Property(ctx, "tank/v", "receive_resume_token"); err == nil && tok != "-" {
				t.Errorf("a refused receive left a token: %q", tok)
			}
		})
	}
}

// snapshotContents describes every dataset's content, to compare states.
func (n node) snapshotContents() string {
	var b strings.Builder
	for _, name := range n.Names() {
		c, _ := n.Content(name)
		b.WriteString(name + "=" + strings.Join(c, ",") + ";")
	}
	return b.String()
}

func TestHoldsBlockDestroyAndRollback(t *testing.T) {
	tests := []struct {
		name    string
		destroy func(n node) error
	}{
		{"DestroySnapshot", func(n node) error { return n.s.DestroySnapshot(ctx, "tank/v@s1") }},
		{"Destroy", func(n node) error { return n.Destroy(ctx, "tank/v@s1") }},
		{"DestroyRecursive", func(n node) error { return n.s.DestroyRecursive(ctx, "tank/v") }},
		{"Rollback over the held snapshot", func(n node) error { return n.s.Rollback(ctx, "tank/v@s0") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := newNode(t, 1, "tank/v")
			n.writeAndSnap(t, "tank/v", "s0", "a")
			n.writeAndSnap(t, "tank/v", "s1", "b")
			must(t, n.s.Hold(ctx, "tank/v@s1", "zfs-nomad-base"))
			must(t, n.s.Hold(ctx, "tank/v@s1", "zfs-nomad-base")) // twice is fine
			holds, err := n.s.Holds(ctx, "tank/v")
			must(t, err)
			if !slices.Equal(holds["tank/v@s1"], []string{"zfs-nomad-base"}) || len(holds) != 1 {
				t.Fatalf("holds %v", holds)
			}
			names := n.Names()
			if err := tt.destroy(n); !errors.Is(err, zfs.ErrBusy) {
				t.Fatalf("%v, want ErrBusy", err)
			}
			if !slices.Equal(n.Names(), names) {
				t.Errorf("a refused destroy changed %v to %v", names, n.Names())
			}
			must(t, n.s.Release(ctx, "tank/v@s1", "zfs-nomad-base"))
			must(t, n.s.Release(ctx, "tank/v@s1", "zfs-nomad-base")) // a missing hold is fine
			must(t, tt.destroy(n))

			// The test helper's holds and ReleaseAll are the same holds.
			if slices.Contains(n.Names(), "tank/v@s0") {
				n.PutHold("tank/v@s0", "other")
				if err := n.s.DestroySnapshot(ctx, "tank/v@s0"); !errors.Is(err, zfs.ErrBusy) {
					t.Errorf("PutHold did not block DestroySnapshot: %v", err)
				}
				must(t, n.ReleaseAll(ctx, "tank/v@s0"))
				must(t, n.s.DestroySnapshot(ctx, "tank/v@s0"))
			}
		})
	}
}

func TestRollback(t *testing.T) {
	n := newNode(t, 1, "tank/v")
	n.writeAndSnap(t, "tank/v", "s1", "a")
	n.writeAndSnap(t, "tank/v", "s2", "b")
	must(t, n.Write("tank/v", "c"))
	must(t, n.s.Rollback(ctx, "tank/v@s1"))
	if c := n.content(t, "tank/v"); !slices.Equal(c, []string{"a"}) {
		t.Errorf("content %v after rolling back to s1", c)
	}
	if got := n.snaps(t, "tank/v"); len(got) != 1 || got[0].Name != "tank/v@s1" {
		t.Errorf("snapshots %+v after rolling back to s1", got)
	}
	must(t, n.Clone(ctx, "tank/v@s1", "tank/c", nil))
	if c := n.content(t, "tank/c"); !slices.Equal(c, []string{"a"}) {
		t.Errorf("a clone of s1 holds %v", c)
	}
}

func TestWrite(t *testing.T) {
	n := newNode(t, 1, "tank/v", "tank/ro")
	must(t, n.s.Snapshot(ctx, "tank/v@s", nil))
	must(t, n.s.SetProperties(ctx, "tank/ro", map[string]string{"readonly": "on"}))
	tests := []struct {
		fs   string
		want error
	}{
		{"tank/v", nil},
		{"tank/ro", syscall.EROFS},
		{"tank/v@s", syscall.EROFS},
		{"tank/none", zfs.ErrNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.fs, func(t *testing.T) {
			err := n.Write(tt.fs, "x")
			if tt.want == nil && err != nil || tt.want != nil && !errors.Is(err, tt.want) {
				t.Errorf("%v, want %v", err, tt.want)
			}
		})
	}
	must(t, n.SetProperties(ctx, "tank/ro", map[string]string{"readonly": "off"}))
	must(t, n.Write("tank/ro", "y"))
}

func TestOneState(t *testing.T) {
	n := newNode(t, 1, "tank/v")
	must(t, n.Write("tank/v", "a"))
	must(t, n.Snapshot(ctx, "tank/v@viaFake", map[string]string{"zfs-nomad:snapshot_name": "csi"}))
	must(t, n.Write("tank/v", "b"))
	must(t, n.s.Snapshot(ctx, "tank/v@viaStreams", nil))

	snaps := n.snaps(t, "tank/v")
	if len(snaps) != 2 || snaps[0].Name != "tank/v@viaFake" || snaps[1].Name != "tank/v@viaStreams" {
		t.Fatalf("Streams sees %+v", snaps)
	}
	for _, s := range snaps {
		if s.GUID == 0 || s.CreateTXG == 0 {
			t.Errorf("%s has guid %d createtxg %d", s.Name, s.GUID, s.CreateTXG)
		}
		if n.get(t, s.Name, "guid") != strconv.FormatUint(s.GUID, 10) || n.get(t, s.Name, "createtxg") != strconv.FormatUint(s.CreateTXG, 10) {
			t.Errorf("Get disagrees with Snapshots on %s", s.Name)
		}
	}
	if snaps[0].CreateTXG >= snaps[1].CreateTXG || snaps[0].GUID == snaps[1].GUID {
		t.Errorf("snapshots %+v: createtxg must grow, GUIDs differ", snaps)
	}
	names, err := n.SnapshotNames(ctx, "tank/v")
	must(t, err)
	if !slices.Equal(names, []string{"tank/v@viaFake", "tank/v@viaStreams"}) {
		t.Errorf("zfs.Interface sees %v", names)
	}
	if c := n.content(t, "tank/v@viaFake"); !slices.Equal(c, []string{"a"}) {
		t.Errorf("viaFake froze %v", c)
	}
	if c := n.content(t, "tank/v@viaStreams"); !slices.Equal(c, []string{"a", "b"}) {
		t.Errorf("viaStreams froze %v", c)
	}
	if v := n.get(t, "tank/v@viaFake", "zfs-nomad:snapshot_name"); v != "csi" {
		t.Errorf("Streams reads the snapshot's user property as %q", v)
	}

	// Properties set either way are read either way.
	must(t, n.SetProperties(ctx, "tank/v", map[string]string{"zfs-nomad:role": "primary", "refquota": "1000"}))
	must(t, n.s.SetProperties(ctx, "tank/v", map[string]string{"zfs-nomad:generation": "2", "quota": "2000", "readonly": "on"}))
	all, err := n.s.Properties(ctx, "tank/v", "zfs-nomad:role", "zfs-nomad:generation", "zfs-nomad:unset", "refquota", "quota", "readonly", "encryption", "receive_resume_token")
	must(t, err)
	want := map[string]string{"zfs-nomad:role": "primary", "zfs-nomad:generation": "2", "zfs-nomad:unset": "-",
		"refquota": "1000", "quota": "2000", "readonly": "on", "encryption": "off", "receive_resume_token": "-"}
	for k, v := range want {
		if all[k] != v {
			t.Errorf("GetAll %s = %q, want %q", k, all[k], v)
		}
	}
	ds, err := n.Get(ctx, "tank/v")
	must(t, err)
	if ds.User["zfs-nomad:generation"] != "2" || ds.Quota != 2000 || ds.RefQuota != 1000 || !ds.ReadOnly {
		t.Errorf("zfs.Interface sees %+v", ds)
	}
	if v, ok, err := n.UserProperty(ctx, "tank/v", "zfs-nomad:generation"); v != "2" || !ok || err != nil {
		t.Errorf("UserProperty: %q %v %v", v, ok, err)
	}
	if err := n.s.SetProperties(ctx, "tank/v", map[string]string{"guid": "1"}); err == nil {
		t.Error("set a read-only property")
	}
}

func TestRenameCarriesEverything(t *testing.T) {
	n := newNode(t, 1, "tank/v")
	n.writeAndSnap(t, "tank/v", "s1", "a")
	must(t, n.Write("tank/v", "b"))
	must(t, n.s.Hold(ctx, "tank/v@s1", "h"))
	before := n.snaps(t, "tank/v")
	must(t, n.s.Rename(ctx, "tank/v", "tank/w"))
	after := n.snaps(t, "tank/w")
	if len(after) != 1 || after[0].Name != "tank/w@s1" || after[0].GUID != before[0].GUID || after[0].CreateTXG != before[0].CreateTXG {
		t.Errorf("after the rename: %+v, was %+v", after, before)
	}
	if holds, err := n.s.Holds(ctx, "tank/w"); err != nil || !slices.Equal(holds["tank/w@s1"], []string{"h"}) {
		t.Errorf("holds after the rename: %v, %v", holds, err)
	}
	if c := n.content(t, "tank/w"); !slices.Equal(c, []string{"a", "b"}) {
		t.Errorf("content after the rename: %v", c)
	}
	if err := n.s.Rename(ctx, "tank/w", "tank/w/x"); err == nil {
		t.Error("renamed a filesystem below itself")
	}
}

func TestChildren(t *testing.T) {
	n := newNode(t, 1, "tank/r", "tank/r/b", "tank/r/a", "tank/r/a/deep")
	must(t, n.s.Snapshot(ctx, "tank/r/a@s", nil))
	must(t, n.s.SetProperties(ctx, "tank/r/b", map[string]string{"zfs-nomad:role": "replica"}))
	children, err := n.s.ChildProperties(ctx, "tank/r", "zfs-nomad:role", "receive_resume_token")
	must(t, err)
	want := []zfs.Child{
		{Name: "tank/r/a", Props: map[string]string{"zfs-nomad:role": "-", "receive_resume_token": "-"}},
		{Name: "tank/r/b", Props: map[string]string{"zfs-nomad:role": "replica", "receive_resume_token": "-"}},
	}
	if len(children) != len(want) {
		t.Fatalf("children %+v, want %+v", children, want)
	}
	for i := range want {
		if children[i].Name != want[i].Name || !mapsEqual(children[i].Props, want[i].Props) {
			t.Errorf("child %d: %+v, want %+v", i, children[i], want[i])
		}
	}
	if _, err := n.s.ChildProperties(ctx, "tank/none"); !errors.Is(err, zfs.ErrNotFound) {
		t.Errorf("children of nothing: %v", err)
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestGUIDsAreDeterministic(t *testing.T) {
	guids := func(seed uint64) []uint64 {
		n := newNode(t, seed, "tank/v")
		for _, s := range []string{"a", "b", "c"} {
			must(t, n.s.Snapshot(ctx, "tank/v@"+s, nil))
		}
		var out []uint64
		for _, s := range n.snaps(t, "tank/v") {
			out = append(out, s.GUID)
		}
		return out
	}
	a, again, other := guids(1), guids(1), guids(2)
	if !slices.Equal(a, again) {
		t.Errorf("the same seed made %v, then %v", a, again)
	}
	for _, g := range a {
		if g == 0 || slices.Contains(other, g) {
			t.Errorf("guid %d: zero, or made by another seed too (%v, %v)", g, a, other)
		}
	}
	if zfsfake.New(1, "tank").GUIDSeed == zfsfake.New(1, "pool").GUIDSeed {
		t.Error("the default seed does not depend on the pools")
	}
}

func TestFaultHooks(t *testing.T) {
	n := newNode(t, 1, "tank/v")
	must(t, n.s.Snapshot(ctx, "tank/v@s", nil))
	var ops []string
	crash := errors.New("crash")
	n.Before = func(op, name string) { ops = append(ops, op+" "+name) }
	n.Fail = func(op, name string) error {
		if op == "send" || op == "hold" {
			return crash
		}
		return nil
	}
	if _, err := n.s.Send(ctx, zfs.SendSpec{Snapshot: "tank/v@s"}, io.Discard); !errors.Is(err, crash) {
		t.Errorf("send: %v", err)
	}
	if err := n.s.Hold(ctx, "tank/v@s", "t"); !errors.Is(err, crash) {
		t.Errorf("hold: %v", err)
	}
	must(t, n.s.Rollback(ctx, "tank/v@s"))
	if want := []string{"send tank/v@s", "hold tank/v@s", "rollback tank/v@s"}; !slices.Equal(ops, want) {
		t.Errorf("Before saw %v, want %v", ops, want)
	}
}

func TestReceiveStopsWithContext(t *testing.T) {
	src, dst := newNode(t, 1, "tank/v"), newNode(t, 2)
	src.writeAndSnap(t, "tank/v", "s1", "a")
	stream := src.send(t, zfs.SendSpec{Snapshot: "tank/v@s1"})
	pr, pw := io.Pipe()
	go func() { _, _ = pw.Write(stream[:312]) }() // and then nothing, as a stalled sender
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- dst.s.Receive(cctx, "tank/v", nil, pr) }()
	time.Sleep(10 * time.Millisecond) // let the begin record arrive, most likely
	cancel()
	err := <-done
	_ = pr.Close()
	if err == nil {
		t.Fatal("a receive whose context ended succeeded")
	}
	// Whether the begin record arrived or not, the receive left nothing,
	// or a partial receive: never a complete one.
	if tok, gerr := dst.s.Property(ctx, "tank/v", "receive_resume_token"); gerr == nil && tok == "-" {
		t.Errorf("%v, and tank/v exists without a partial receive", err)
	}
}
