// Package crossversion proves that the streams the driver sends between
// nodes cross OpenZFS releases both ways, as they must while a cluster is
// upgraded node by node (docs/install.md, "Mixed versions"): streams sent
// on Debian 13's OpenZFS 2.3 are received on Debian 12's 2.1, and the
// reverse.
//
// Each release runs in its own guest, one after the other, and the
// streams and resume tokens travel between them as files
// (guesttest.RunPhase):
//
//	trixie (2.3):   make volumes, send them to files
//	bookworm (2.1): make and send its own; receive 2.3's and check every
//	                file, and see a stream using long names refused at its
//	                first record; receive half of 2.3's full stream and
//	                keep the resume token
//	trixie (2.3):   receive 2.1's streams and check every file; interrupt
//	                one the same way; resume-send from 2.1's token
//	bookworm (2.1): resume-send from 2.3's token; repeat the interrupted
//	                receive and resume it from 2.3's stream
//	trixie (2.3):   the same with 2.1's stream
//
// A resume token is made by the receiver and read by the sender, so a
// transfer interrupted during an upgrade resumes across releases both
// ways. Pools do not outlive a guest: a sender first receives its own
// full stream back (the same snapshot GUID the token names), and a
// receiver repeats the interrupted receive of the same bytes, which must
// leave the same token.
//
// The streams are made and received by the driver's own code (zfscmd, as
// the replication pusher and receiver call it: -L -c, raw for encrypted
// volumes, full then incremental, received with the replica properties)
// from pools created with each release's default features, as an
// operator's would be, and volumes with the properties the driver sets.
package crossversion

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs/openzfs"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs/zfscmd"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guesttest"
)

func TestMain(m *testing.M) { os.Exit(guesttest.MainPhases(m)) }

var phaseOptions = guesttest.Options{Disks: []string{"2G"}, Timeout: 8 * time.Minute}

func TestStreamsCrossOpenZFSReleases(t *testing.T) {
	if guesttest.InGuest() {
		t.Skip("the host side of the phases below: it boots their guests")
	}
	exchange := t.TempDir()
	guesttest.RunPhase(t, "trixie", "^TestPhaseSend$", exchange, phaseOptions)
	guesttest.RunPhase(t, "bookworm", "^(TestPhaseSend|TestPhaseReceive|TestPhaseInterrupt)$", exchange, phaseOptions)
	guesttest.RunPhase(t, "trixie", "^(TestPhaseReceive|TestPhaseInterrupt|TestPhaseResumeSend)$", exchange, phaseOptions)
	guesttest.RunPhase(t, "bookworm", "^(TestPhaseResumeSend|TestPhaseResumeReceive)$", exchange, phaseOptions)
	guesttest.RunPhase(t, "trixie", "^TestPhaseResumeReceive$", exchange, phaseOptions)
	for _, want := range []string{"received-2.3-on-2.1", "received-2.1-on-2.3", "refused-longname-2.3-on-2.1",
		"resumed-2.3-on-2.1", "resumed-2.1-on-2.3"} {
		if _, err := os.Stat(filepath.Join(exchange, want)); err != nil {
			t.Errorf("no %s marker: a receive phase ran no check", want)
		}
	}
}

const (
	pool      = "xv"
	root      = pool + "/nomad"
	plain     = root + "/vol-plain"
	secret    = root + "/vol-secret"
	long      = root + "/vol-long"
	resumed   = root + "/replica-resumed"
	keyPhrase = "correct horse battery staple"
	keyFile   = "/tmp/volume.key"
	mnt       = "/tmp/mnt"
)

// manifest says what the streams of one release hold.
type manifest struct {
	Release string
	// Files maps a snapshot ("s1", "s2") of the plain volume, or "secret"
	// for the encrypted one, to each file's path and SHA-256.
	Files map[string]map[string]string
	// LongNames says a stream of a volume with a file name longer than
	// 255 bytes was sent (long-s1.zstream): releases from 2.3 on, with
	// the longname feature, which older ones cannot receive.
	LongNames bool
}

// readManifests returns the manifests of the other releases' streams, by
// their directories in the exchange.
func readManifests(t *testing.T, series string) map[string]manifest {
	t.Helper()
	dirs, _ := filepath.Glob(filepath.Join(guesttest.Exchange, "from-*"))
	out := map[string]manifest{}
	for _, dir := range dirs {
		var m manifest
		data, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
		if err == nil {
			err = json.Unmarshal(data, &m)
		}
		if err != nil {
			t.Fatalf("%s: %v", dir, err)
		}
		if m.Release != series {
			out[dir] = m
		}
	}
	if len(out) == 0 {
		t.Fatalf("no streams of another release in %s", guesttest.Exchange)
	}
	return out
}

// mark leaves a marker in the exchange for the host to find.
func mark(t *testing.T, name string) {
	t.Helper()
	if t.Failed() {
		return
	}
	if err := os.WriteFile(filepath.Join(guesttest.Exchange, name), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// inPhase skips a phase outside a guest started by RunPhase, and sets up
// the pool and the root dataset every phase uses.
func inPhase(t *testing.T) string {
	t.Helper()
	if _, err := os.Stat(guesttest.Exchange); err != nil {
		t.Skip("runs in a guest that TestStreamsCrossOpenZFSReleases starts")
	}
	v, err := openzfs.Detect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("OpenZFS userland %s, kernel module %s", v.Userland, v.Kernel)
	guesttest.Pool(t, pool, guesttest.Disk(0))
	guesttest.Run(t, "zfs", "create", "-o", "canmount=off", root)
	if err := os.WriteFile(keyFile, []byte(keyPhrase), 0o600); err != nil {
		t.Fatal(err)
	}
	return seriesOf(v.Userland)
}

func seriesOf(release string) string {
	parts := strings.SplitN(release, ".", 3)
	return parts[0] + "." + parts[1]
}

// TestPhaseSend makes a plain volume with two snapshots and an encrypted
// one, and sends them as the pusher does: a full stream, an incremental,
// and a raw full stream of the encrypted volume.
func TestPhaseSend(t *testing.T) {
	series := inPhase(t)
	ctx := context.Background()
	out := filepath.Join(guesttest.Exchange, "from-"+series)
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	m := manifest{Release: series, Files: map[string]map[string]string{}}

	// The driver's volume properties (volume.Manager.Create), and the
	// compression and large records an operator may allow.
	guesttest.Run(t, "zfs", "create", "-o", "mountpoint=legacy", "-o", "refquota=1G",
		"-o", "compression=zstd", "-o", "recordsize=1M", "-o", "zfs-nomad:volume_id=vol-plain",
		"-o", "zfs-nomad:role=primary", "-o", "zfs-nomad:generation=1", plain)
	writeFiles(t, plain, func(dir string) {
		writeFile(t, filepath.Join(dir, "big.bin"), 6<<20, 1)
		for i := range 50 {
			writeFile(t, filepath.Join(dir, "small", fmt.Sprintf("f%02d", i)), 1000+i*37, int64(i+2))
		}
	})
	m.Files["s1"] = snapshotFiles(t, plain, "s1")
	writeFiles(t, plain, func(dir string) {
		writeFile(t, filepath.Join(dir, "big.bin"), 7<<20, 99)
		writeFile(t, filepath.Join(dir, "added.txt"), 4096, 100)
		if err := os.Remove(filepath.Join(dir, "small", "f07")); err != nil {
			t.Fatal(err)
		}
	})
	m.Files["s2"] = snapshotFiles(t, plain, "s2")

	guesttest.Run(t, "zfs", "create", "-o", "mountpoint=legacy", "-o", "encryption=on",
		"-o", "keyformat=passphrase", "-o", "keylocation=file://"+keyFile, "-o", "zfs-nomad:volume_id=vol-secret", secret)
	writeFiles(t, secret, func(dir string) { writeFile(t, filepath.Join(dir, "secret.bin"), 3<<20, 7) })
	m.Files["secret"] = snapshotFiles(t, secret, "s1")

	if featureEnabled(t, "longname") {
		// An operator may allow longname, or set it on the parent dataset.
		guesttest.Run(t, "zfs", "create", "-o", "mountpoint=legacy", "-o", "longname=on", long)
		writeFiles(t, long, func(dir string) { writeFile(t, filepath.Join(dir, strings.Repeat("n", 300)), 4096, 3) })
		snapshotFiles(t, long, "s1")
		send(t, ctx, zfs.SendSpec{Snapshot: long + "@s1"}, filepath.Join(out, "long-s1.zstream"))
		m.LongNames = true
	}

	send(t, ctx, zfs.SendSpec{Snapshot: plain + "@s1"}, filepath.Join(out, "plain-s1.zstream"))
	send(t, ctx, zfs.SendSpec{Snapshot: plain + "@s2", Base: plain + "@s1"}, filepath.Join(out, "plain-s1-s2.zstream"))
	send(t, ctx, zfs.SendSpec{Snapshot: secret + "@s1", Raw: true}, filepath.Join(out, "secret-s1.zstream"))
	data, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "manifest.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestPhaseReceive receives the other release's streams as the receiver
// does (unmounted, resumable, read-only replicas with legacy mounts) and
// checks every file of every snapshot.
func TestPhaseReceive(t *testing.T) {
	series := inPhase(t)
	ctx := context.Background()
	for dir, m := range readManifests(t, series) {
		t.Run("from "+m.Release, func(t *testing.T) {
			replica := root + "/replica-plain"
			receive(t, ctx, replica, map[string]string{"readonly": "on", "mountpoint": "legacy", "zfs-nomad:role": "replica"}, filepath.Join(dir, "plain-s1.zstream"))
			checkFiles(t, replica+"@s1", m.Files["s1"])
			receive(t, ctx, replica, nil, filepath.Join(dir, "plain-s1-s2.zstream"))
			checkFiles(t, replica+"@s2", m.Files["s2"])
			checkFiles(t, replica, m.Files["s2"])
			// The streams carry no properties (no -p): the receiver labels
			// its replica with -o, which must hold across releases.
			if got := strings.TrimSpace(guesttest.Run(t, "zfs", "get", "-H", "-o", "value", "zfs-nomad:role", replica)); got != "replica" {
				t.Errorf("the replica's role is %q after the receive, want the receiver's label replica", got)
			}

			encrypted := root + "/replica-secret"
			receive(t, ctx, encrypted, map[string]string{"readonly": "on", "mountpoint": "legacy"}, filepath.Join(dir, "secret-s1.zstream"))
			if got := strings.TrimSpace(guesttest.Run(t, "zfs", "get", "-H", "-o", "value", "keystatus", encrypted)); got != "unavailable" {
				t.Errorf("a raw-received replica's key is %q, want unavailable: replicas never hold a loaded key", got)
			}
			guesttest.Run(t, "zfs", "load-key", "-L", "file://"+keyFile, encrypted)
			checkFiles(t, encrypted, m.Files["secret"])
			guesttest.Run(t, "zfs", "unload-key", encrypted)
			mark(t, "received-"+m.Release+"-on-"+series)

			if m.LongNames && !featureEnabled(t, "longname") {
				refusedUpFront(t, ctx, filepath.Join(dir, "long-s1.zstream"))
				mark(t, "refused-longname-"+m.Release+"-on-"+series)
			}
		})
	}
}

// refusedUpFront receives a stream this release cannot receive: zfs
// receive must refuse it at its first record, as the driver's
// zfs.ErrStreamUnsupported (which the receiver turns into a
// FailedPrecondition naming both nodes' releases), and leave nothing
// behind: no dataset, no partial receive to resume.
func refusedUpFront(t *testing.T, ctx context.Context, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	target := root + "/replica-long"
	err = zfscmd.Cmd{}.Receive(ctx, target, map[string]string{"readonly": "on", "mountpoint": "legacy"}, f)
	t.Logf("receiving a stream with long names: %v", err)
	if !errors.Is(err, zfs.ErrStreamUnsupported) {
		t.Fatalf("receiving a stream with long names gave %v, want zfs.ErrStreamUnsupported", err)
	}
	if left := guesttest.Run(t, "zfs", "list", "-H", "-t", "all", "-o", "name", "-r", root); strings.Contains(left, "replica-long") {
		t.Errorf("the refused receive left datasets behind:\n%s", left)
	}
}

// featureEnabled reports whether the pool has the feature (a release
// without it has no such property, and the get fails).
func featureEnabled(t *testing.T, feature string) bool {
	t.Helper()
	out, err := exec.Command("zpool", "get", "-H", "-o", "value", "feature@"+feature, pool).Output()
	state := strings.TrimSpace(string(out))
	return err == nil && (state == "enabled" || state == "active")
}

// TestPhaseInterrupt receives the first half of each other release's full
// stream, as a receive does when its sender dies, and leaves the resume
// token for that release's next phase (TestPhaseResumeSend).
func TestPhaseInterrupt(t *testing.T) {
	series := inPhase(t)
	for dir := range readManifests(t, series) {
		token := interruptedReceive(t, filepath.Join(dir, "plain-s1.zstream"))
		if err := os.WriteFile(filepath.Join(dir, "token-"+series), []byte(token), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// interruptedReceive receives the first half of a stream into resumed
// and returns the resume token the receive kept.
func interruptedReceive(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	half := bytes.NewReader(data[:len(data)/2])
	if err := (zfscmd.Cmd{}).Receive(context.Background(), resumed, map[string]string{"readonly": "on", "mountpoint": "legacy"}, half); err == nil {
		t.Fatal("receiving half a stream succeeded")
	}
	token := strings.TrimSpace(guesttest.Run(t, "zfs", "get", "-H", "-o", "value", "receive_resume_token", resumed))
	if token == "" || token == "-" {
		t.Fatalf("the interrupted receive of %s kept no resume token", filepath.Base(path))
	}
	return token
}

// TestPhaseResumeSend sends the rest of this release's full stream from
// each resume token another release left for it (TestPhaseInterrupt).
func TestPhaseResumeSend(t *testing.T) {
	series := inPhase(t)
	dir := filepath.Join(guesttest.Exchange, "from-"+series)
	tokens, _ := filepath.Glob(filepath.Join(dir, "token-*"))
	if len(tokens) == 0 {
		t.Fatalf("no resume token in %s", dir)
	}
	// The pool that sent the stream is gone with its guest: receiving the
	// stream back gives the snapshot the token names, GUID and all.
	receive(t, context.Background(), plain, nil, filepath.Join(dir, "plain-s1.zstream"))
	for _, path := range tokens {
		token, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		receiver := strings.TrimPrefix(filepath.Base(path), "token-")
		send(t, context.Background(), zfs.SendSpec{ResumeToken: string(token)}, filepath.Join(dir, "resume-"+receiver+".zstream"))
	}
}

// TestPhaseResumeReceive repeats the interrupted receive of each other
// release's stream, which must keep the token that release resumed from,
// and receives the resumed stream: every file of the snapshot arrives.
func TestPhaseResumeReceive(t *testing.T) {
	series := inPhase(t)
	for dir, m := range readManifests(t, series) {
		t.Run("from "+m.Release, func(t *testing.T) {
			want, err := os.ReadFile(filepath.Join(dir, "token-"+series))
			if err != nil {
				t.Fatal(err)
			}
			if got := interruptedReceive(t, filepath.Join(dir, "plain-s1.zstream")); got != string(want) {
				t.Fatalf("repeating the interrupted receive kept another token:\n%s\nthan the first time:\n%s", got, want)
			}
			receive(t, context.Background(), resumed, nil, filepath.Join(dir, "resume-"+series+".zstream"))
			checkFiles(t, resumed+"@s1", m.Files["s1"])
			mark(t, "resumed-"+m.Release+"-on-"+series)
		})
	}
}

func send(t *testing.T, ctx context.Context, spec zfs.SendSpec, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n, err := zfscmd.Cmd{}.Send(ctx, spec, f)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("zfs %s: %d bytes", strings.Join(zfscmd.SendArgs(spec), " "), n)
}

func receive(t *testing.T, ctx context.Context, target string, props map[string]string, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := (zfscmd.Cmd{}).Receive(ctx, target, props, f); err != nil {
		t.Fatalf("receiving %s: %v", filepath.Base(path), err)
	}
}

// writeFiles mounts dataset, lets write change its files, and unmounts it.
func writeFiles(t *testing.T, dataset string, write func(dir string)) {
	t.Helper()
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	guesttest.Run(t, "mount", "-t", "zfs", dataset, mnt)
	defer guesttest.Run(t, "umount", mnt)
	write(mnt)
}

// writeFile writes size bytes of a pseudo-random sequence seeded by seed.
func writeFile(t *testing.T, path string, size int, seed int64) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	data := make([]byte, size)
	x := uint64(seed)*0x9E3779B97F4A7C15 + 1
	for i := range data {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		data[i] = byte(x)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// snapshotFiles snapshots dataset@name and returns its files' digests.
func snapshotFiles(t *testing.T, dataset, name string) map[string]string {
	t.Helper()
	guesttest.Run(t, "zfs", "snapshot", "-o", "zfs-nomad:snapshot_id="+name, dataset+"@"+name)
	return digests(t, dataset+"@"+name)
}

// checkFiles compares a dataset's or snapshot's files with want.
func checkFiles(t *testing.T, dataset string, want map[string]string) {
	t.Helper()
	got := digests(t, dataset)
	for path, sum := range want {
		if got[path] != sum {
			t.Errorf("%s: %s has digest %q, want %q", dataset, path, got[path], sum)
		}
	}
	for path := range got {
		if _, ok := want[path]; !ok {
			t.Errorf("%s: %s is there but was not sent", dataset, path)
		}
	}
}

// digests mounts a dataset or snapshot read-only and digests its files.
func digests(t *testing.T, dataset string) map[string]string {
	t.Helper()
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	guesttest.Run(t, "mount", "-t", "zfs", "-o", "ro", dataset, mnt)
	defer guesttest.Run(t, "umount", mnt)
	out := map[string]string{}
	err := filepath.WalkDir(mnt, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(data)
		out[strings.TrimPrefix(path, mnt+"/")] = hex.EncodeToString(sum[:])
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatalf("%s holds no files", dataset)
	}
	return out
}
