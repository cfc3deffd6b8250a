package volume

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs/zfsfake"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

const passphrase = "correct horse battery"

func newKeyManager(t *testing.T) (*Manager, *zfsfake.Fake) {
	t.Helper()
	m, fake := newManager(t)
	m.cfg.Properties["encryption"] = config.PropertyRule{Allowed: []string{"on", "off"}}
	m.host.Encryption = fake
	return m, fake
}

func TestEncryptedCreateNeedsAGoodKeyAndLeavesItUnloaded(t *testing.T) {
	keyFile := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(keyFile, []byte("from the key file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		given    contract.Passphrase
		keyFile  string
		noKeys   bool   // a node without key support
		wantKey  string // the key that opens it; "" when the create fails
		wantErr  error
		wantText string
	}{
		{name: "key from the secrets", given: contract.Passphrase(passphrase), wantKey: passphrase},
		{name: "secrets win over the key file", given: contract.Passphrase(passphrase), keyFile: keyFile, wantKey: passphrase},
		{name: "key file without a newline", keyFile: keyFile, wantKey: "from the key file"},
		{name: "no key", wantErr: errdefs.ErrInvalidArgument, wantText: "carry no encryption_key and node n1 names no encryption_key_file"},
		{name: "short key", given: contract.Passphrase("short"), wantErr: errdefs.ErrInvalidArgument, wantText: "8 to 512 bytes on one line (it has 5 bytes)"},
		{name: "two lines", given: contract.Passphrase("first line\nsecond"), wantErr: errdefs.ErrInvalidArgument, wantText: "on one line"},
		{name: "unreadable key file", keyFile: keyFile + ".missing", wantErr: errdefs.ErrFailedPrecondition, wantText: "the key file " + keyFile + ".missing, which cannot be read"},
		{name: "node without key support", given: contract.Passphrase(passphrase), noKeys: true, wantErr: errdefs.ErrFailedPrecondition, wantText: "cannot create encrypted volumes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, fake := newKeyManager(t)
			m.cfg.EncryptionKeyFile = tt.keyFile
			if tt.noKeys {
				m.host.Encryption = nil
			}
			v, err := m.Create(context.Background(), CreateRequest{Name: "secret", Parameters: map[string]string{"encryption": "on"}, Passphrase: tt.given})
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.wantText) {
					t.Fatalf("got %v, want %v saying %q", err, tt.wantErr, tt.wantText)
				}
				if strings.Contains(err.Error(), passphrase) {
					t.Errorf("the error carries the passphrase: %v", err)
				}
				wantOnlyRoot(t, fake, "a refused create")
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !v.Encrypted || !v.KeyRoot || v.KeyLoaded {
				t.Fatalf("created volume: encrypted %v, own root %v, key loaded %v; want encrypted, its own root, key unloaded", v.Encrypted, v.KeyRoot, v.KeyLoaded)
			}
			if err := fake.LoadKey(context.Background(), v.Dataset, []byte(tt.wantKey)); err != nil {
				t.Errorf("the volume does not open with %q: %v", tt.wantKey, err)
			}
		})
	}
}

// The operator's key derivation iterations are set on the volume at its
// create; none set leaves OpenZFS's default (no pbkdf2iters given).
func TestEncryptedCreateTakesTheOperatorsKeyDerivation(t *testing.T) {
	for _, tt := range []struct {
		iterations int64
		want       string
	}{
		{0, ""},
		{100000, "100000"},
		{1300000, "1300000"},
	} {
		m, fake := newKeyManager(t)
		m.cfg.EncryptionPBKDF2Iterations = tt.iterations
		v := create(t, m, CreateRequest{Name: "secret", Parameters: map[string]string{"encryption": "on"}, Passphrase: contract.Passphrase(passphrase)})
		if got := fake.NativeProperty(v.Dataset, "pbkdf2iters"); got != tt.want {
			t.Errorf("iterations %d: the volume's pbkdf2iters is %q, want %q", tt.iterations, got, tt.want)
		}
		plain := create(t, m, CreateRequest{Name: "plain", Parameters: map[string]string{"encryption": "off"}})
		if got := fake.NativeProperty(plain.Dataset, "pbkdf2iters"); got != "" {
			t.Errorf("iterations %d: an unencrypted volume got pbkdf2iters %q", tt.iterations, got)
		}
	}
}

func TestOpenKeyLoadsOnlyTheRightKeyAndCloseKeyUnloads(t *testing.T) {
	ctx := context.Background()
	m, _ := newKeyManager(t)
	v := create(t, m, CreateRequest{Name: "secret", Parameters: map[string]string{"encryption": "on"}, Passphrase: contract.Passphrase(passphrase)})

	_, err := m.OpenKey(ctx, v, contract.Passphrase("wrong passphrase"))
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "does not unlock it; nothing was mounted") {
		t.Fatalf("wrong key: got %v, want InvalidArgument saying it does not unlock", err)
	}
	if v, _ = m.Get(ctx, v.ID); v.KeyLoaded {
		t.Fatal("a wrong key left the key loaded")
	}
	if _, err := m.OpenKey(ctx, v, nil); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("no key: got %v, want InvalidArgument", err)
	}
	opened, err := m.OpenKey(ctx, v, contract.Passphrase(passphrase))
	if err != nil || !opened {
		t.Fatalf("right key: opened %v, %v", opened, err)
	}
	if v, _ = m.Get(ctx, v.ID); !v.KeyLoaded {
		t.Fatal("the right key is not loaded")
	}
	if opened, err := m.OpenKey(ctx, v, contract.Passphrase(passphrase)); err != nil || opened {
		t.Fatalf("the right key, loaded already: opened %v, %v; want nothing to do", opened, err)
	}

	m.host.Mounted = func(string) (bool, error) { return true, nil }
	if err := m.CloseKey(ctx, v.ID); err != nil {
		t.Fatal(err)
	}
	if v, _ = m.Get(ctx, v.ID); !v.KeyLoaded {
		t.Fatal("CloseKey unloaded the key of a volume still mounted")
	}
	m.host.Mounted = func(string) (bool, error) { return false, nil }
	for range 2 { // unloading twice is no error
		if err := m.CloseKey(ctx, v.ID); err != nil {
			t.Fatal(err)
		}
	}
	if v, _ = m.Get(ctx, v.ID); v.KeyLoaded {
		t.Fatal("CloseKey left the key loaded")
	}
}

func TestAnUnencryptedVolumeNeedsNoKey(t *testing.T) {
	m, _ := newKeyManager(t)
	v := create(t, m, CreateRequest{Name: "plain"})
	if v.Encrypted {
		t.Fatal("a volume that did not ask for encryption is encrypted")
	}
	if opened, err := m.OpenKey(context.Background(), v, nil); err != nil || opened {
		t.Fatalf("OpenKey of a plain volume: opened %v, %v", opened, err)
	}
	if err := m.CloseKey(context.Background(), v.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Create(context.Background(), CreateRequest{Name: "plain2", Parameters: map[string]string{"encryption": "off"}}); err != nil {
		t.Fatalf("encryption=off needs no key: %v", err)
	}
}

// TestRestoresAndClonesKeepTheirSourcesEncryption: a volume made from an
// encrypted snapshot or volume is a raw copy, its own encryption root
// with the same key, key not loaded, and no clone of its source; one
// whose parameters ask for the other encryption is refused; the
// operator's default does not apply to it.
func TestRestoresAndClonesKeepTheirSourcesEncryption(t *testing.T) {
	ctx := context.Background()
	m, fake := newKeyManager(t)
	m.cfg.Properties["encryption"] = config.PropertyRule{Default: "on", Allowed: []string{"on", "off"}}
	src := create(t, m, CreateRequest{Name: "secret", Passphrase: contract.Passphrase(passphrase)})
	plain := create(t, m, CreateRequest{Name: "plain", Parameters: map[string]string{"encryption": "off"}})
	if !src.Encrypted || plain.Encrypted {
		t.Fatalf("encrypted: secret %v (want true, the operator's default), plain %v", src.Encrypted, plain.Encrypted)
	}
	snap := snapshot(t, m, src.ID, "secret-snap")
	for _, req := range []CreateRequest{
		{Name: "restored", SourceSnapshotID: snap.ID},
		{Name: "restored-asking", SourceSnapshotID: snap.ID, Parameters: map[string]string{"encryption": "on"}},
		{Name: "cloned", SourceVolumeID: src.ID},
	} {
		v := create(t, m, req)
		ds, err := fake.Get(ctx, v.Dataset)
		if err != nil {
			t.Fatal(err)
		}
		if !v.Encrypted || !v.KeyRoot || v.KeyLoaded || ds.Origin != "" {
			t.Errorf("%s: encrypted %v, own root %v, key loaded %v, origin %q; want an encrypted copy, its own root, key unloaded, no origin", req.Name, v.Encrypted, v.KeyRoot, v.KeyLoaded, ds.Origin)
		}
		if err := fake.LoadKey(ctx, v.Dataset, []byte(passphrase)); err != nil {
			t.Errorf("%s does not open with its source's key: %v", req.Name, err)
		}
		if names, _ := fake.SnapshotNames(ctx, v.Dataset); len(names) > 0 {
			t.Errorf("%s holds snapshots %v, want none", req.Name, names)
		}
	}
	_, err := m.Create(ctx, CreateRequest{Name: "restored-plain", SourceSnapshotID: snap.ID, Parameters: map[string]string{"encryption": "off"}})
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "keeps its encryption (encrypted)") {
		t.Fatalf("a restore asking for encryption=off: %v, want InvalidArgument", err)
	}
	v := create(t, m, CreateRequest{Name: "plain-clone", SourceVolumeID: plain.ID})
	if v.Encrypted {
		t.Error("a clone of a plain volume is encrypted: the operator's default applied to it")
	}
}

// TestPromotionLeavesTheEncryptionAsReceived: a promotion sets the
// volume's properties again on the received copy, but not encryption,
// which ZFS sets only at creation (the raw stream brought it).
func TestPromotionLeavesTheEncryptionAsReceived(t *testing.T) {
	ctx := context.Background()
	m, fake := newKeyManager(t)
	id, _ := receivedReplica(t, fake, 1, map[string]string{copyrecord.PropParameters: `{"encryption":"on"}`, copyrecord.PropCapacity: "1073741824", "encryption": "on"})
	if _, granted, err := m.records.Reserve(ctx, id, 2, "n1"); err != nil || !granted {
		t.Fatalf("reserving generation 2: granted %v, %v", granted, err)
	}
	if _, err := m.Promote(ctx, id, 2, 0, "", true); err != nil {
		t.Fatal(err)
	}
	if v, err := m.Get(ctx, id); err != nil || v.Generation != 2 || !v.Encrypted {
		t.Fatalf("after the promotion: %+v, %v; want an encrypted primary of generation 2", v, err)
	}
}

// TestARetriedRestoreDropsTheSnapshotItsCopyBrought: a raw copy receives
// its source's snapshot along and destroys it; when the create stopped in
// between, its retry destroys it.
func TestARetriedRestoreDropsTheSnapshotItsCopyBrought(t *testing.T) {
	ctx := context.Background()
	m, fake := newKeyManager(t)
	src := create(t, m, CreateRequest{Name: "secret", Parameters: map[string]string{"encryption": "on"}, Passphrase: contract.Passphrase(passphrase)})
	snap := snapshot(t, m, src.ID, "secret-snap")
	req := CreateRequest{Name: "restored", SourceSnapshotID: snap.ID}
	v := create(t, m, req)
	left := v.Dataset + "@" + snap.ID
	if err := fake.Snapshot(ctx, left, nil); err != nil { // as a stop before the destroy leaves it
		t.Fatal(err)
	}
	create(t, m, req)
	if names, _ := fake.SnapshotNames(ctx, v.Dataset); len(names) > 0 {
		t.Fatalf("after the retry %s holds %v, want no snapshot", v.Dataset, names)
	}
	if _, err := m.GetSnapshot(ctx, snap.ID); err != nil {
		t.Fatalf("the source's snapshot: %v", err)
	}
}

// TestAStageChecksTheKeyEvenWhenItIsLoaded: a loaded key (the volume
// staged at another path, or left loaded) says nothing about the caller:
// OpenKey refuses a wrong or missing passphrase all the same, and leaves
// the key as it was.
func TestAStageChecksTheKeyEvenWhenItIsLoaded(t *testing.T) {
	tests := []struct {
		name    string
		given   contract.Passphrase
		wantErr error
		want    string
	}{
		{name: "right key", given: contract.Passphrase(passphrase)},
		{name: "wrong key", given: contract.Passphrase("wrong passphrase"), wantErr: errdefs.ErrInvalidArgument, want: "does not unlock it; nothing was mounted"},
		{name: "no key", wantErr: errdefs.ErrInvalidArgument, want: "carry no encryption_key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			m, fake := newKeyManager(t)
			v := create(t, m, CreateRequest{Name: "secret", Parameters: map[string]string{"encryption": "on"}, Passphrase: contract.Passphrase(passphrase)})
			if err := fake.LoadKey(ctx, v.Dataset, []byte(passphrase)); err != nil {
				t.Fatal(err)
			}
			v, _ = m.Get(ctx, v.ID)
			opened, err := m.OpenKey(ctx, v, tt.given)
			if opened || !errors.Is(err, tt.wantErr) || (tt.wantErr != nil && !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("OpenKey with the key loaded: opened %v, %v; want %v saying %q", opened, err, tt.wantErr, tt.want)
			}
			if !fake.KeyLoaded(v.Dataset) {
				t.Error("a check of a loaded key unloaded it")
			}
		})
	}
}

// TestARetriedCreateChecksTheKeyAndLeavesItUnloaded: a create that
// failed between zfs create and the key's unload (the unload failed, or
// the root directory could not be set) leaves no key loaded, and its
// retry answers the volume only with its passphrase, with the key
// unloaded, unless the volume is staged here.
func TestARetriedCreateChecksTheKeyAndLeavesItUnloaded(t *testing.T) {
	encrypted := map[string]string{"encryption": "on"}
	owned := map[string]string{"encryption": "on", "uid": "1000"}
	tests := []struct {
		name       string
		params     map[string]string
		failUnload bool // the first create's unload fails: its key stays loaded
		failRoot   bool // the first create's root directory cannot be set
		staged     bool // the volume is mounted on the node at the retry
		retryKey   contract.Passphrase
		wantErr    error
		wantLoaded bool
	}{
		{name: "unload failed, retry with its key", params: encrypted, failUnload: true, retryKey: contract.Passphrase(passphrase)},
		{name: "unload failed, retry with a wrong key", params: encrypted, failUnload: true, retryKey: contract.Passphrase("wrong passphrase"), wantErr: errdefs.ErrInvalidArgument},
		{name: "unload failed, retry without a key", params: encrypted, failUnload: true, wantErr: errdefs.ErrInvalidArgument},
		{name: "unload failed, retry while staged", params: encrypted, failUnload: true, staged: true, retryKey: contract.Passphrase(passphrase), wantLoaded: true},
		{name: "root failed, retry with its key", params: owned, failRoot: true, retryKey: contract.Passphrase(passphrase)},
		{name: "root failed, retry with a wrong key", params: owned, failRoot: true, retryKey: contract.Passphrase("wrong passphrase"), wantErr: errdefs.ErrInvalidArgument},
		{name: "created, retry with a wrong key", params: encrypted, retryKey: contract.Passphrase("wrong passphrase"), wantErr: errdefs.ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			m, fake := newKeyManager(t)
			m.cfg.RootDirectory = config.RootDirectory{UIDs: []string{"1000"}}
			roots := &fakeRoots{}
			m.host.Roots = roots
			staged := false
			m.host.Mounted = func(string) (bool, error) { return staged, nil }
			if tt.failRoot {
				roots.failures = 1
			}
			if tt.failUnload {
				fake.Fail = func(op, name string) error {
					if op == "unload-key" {
						return errors.New("unload-key: interrupted")
					}
					return nil
				}
			}
			req := CreateRequest{Name: "secret", Parameters: tt.params, Passphrase: contract.Passphrase(passphrase)}
			_, err := m.Create(ctx, req)
			if (err != nil) != (tt.failUnload || tt.failRoot) {
				t.Fatalf("the first create: %v", err)
			}
			fake.Fail = nil
			ds := root + "/" + contract.VolumeIDForName(req.Name)
			if loaded := fake.KeyLoaded(ds); loaded != tt.failUnload {
				t.Errorf("after the first create the key is loaded: %v, want %v (only an unload that failed leaves it)", loaded, tt.failUnload)
			}

			staged = tt.staged
			req.Passphrase = tt.retryKey
			v, err := m.Create(ctx, req)
			switch {
			case tt.wantErr != nil:
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("the retry: %v, want %v", err, tt.wantErr)
				}
			case err != nil:
				t.Fatalf("the retry: %v", err)
			case v.KeyLoaded != tt.wantLoaded:
				t.Errorf("the retry answers the key loaded: %v, want %v", v.KeyLoaded, tt.wantLoaded)
			}
			if loaded := fake.KeyLoaded(ds); loaded != tt.wantLoaded {
				t.Errorf("after the retry the key is loaded: %v, want %v", loaded, tt.wantLoaded)
			}
		})
	}
}

// TestEveryCopyNotStagedHasItsKeyUnloaded: a change that leaves a copy
// staged nowhere on the node (a fence, a demotion after a move, a set
// aside, a receive into a replica, a deletion into a tombstone) unloads
// a key a crash or a failed step left loaded on it.
func TestEveryCopyNotStagedHasItsKeyUnloaded(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name   string
		change func(t *testing.T, m *Manager, fake *zfsfake.Fake, v Volume) string // returns the copy's dataset after it
	}{
		{"fence", func(t *testing.T, m *Manager, _ *zfsfake.Fake, v Volume) string {
			reserve(t, m, v.ID, 2, "n2")
			if _, err := m.Fence(ctx, v.ID, "n2"); err != nil {
				t.Fatal(err)
			}
			return v.Dataset
		}},
		{"demotion after a move", func(t *testing.T, m *Manager, fake *zfsfake.Fake, v Volume) string {
			reserve(t, m, v.ID, 2, "n2")
			if _, err := m.Fence(ctx, v.ID, "n2"); err != nil {
				t.Fatal(err)
			}
			loadKey(t, fake, v.Dataset) // loaded again after the fence
			if err := m.Demote(ctx, v.ID, 2, false); err != nil {
				t.Fatal(err)
			}
			return v.Dataset
		}},
		{"set aside", func(t *testing.T, m *Manager, fake *zfsfake.Fake, v Volume) string {
			if err := m.Demote(ctx, v.ID, 2, true); err != nil {
				t.Fatal(err)
			}
			for _, n := range fake.Names() {
				if strings.HasPrefix(n, v.Dataset+"-aside-") {
					return n
				}
			}
			t.Fatal("no copy set aside")
			return ""
		}},
		{"receive into a replica", func(t *testing.T, m *Manager, fake *zfsfake.Fake, v Volume) string {
			if err := fake.SetProperties(ctx, v.Dataset, map[string]string{copyrecord.PropRole: contract.RoleReplica}); err != nil {
				t.Fatal(err)
			}
			m.index.Received(v.ID)
			return v.Dataset
		}},
		{"deletion into a tombstone", func(t *testing.T, m *Manager, fake *zfsfake.Fake, v Volume) string {
			snapshot(t, m, v.ID, "kept")
			if err := m.Delete(ctx, v.ID); err != nil {
				t.Fatal(err)
			}
			for _, n := range fake.Names() {
				if strings.HasPrefix(n, v.Dataset+"-deleted-") && !strings.Contains(n, "@") {
					return n
				}
			}
			t.Fatal("no tombstone")
			return ""
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, fake := newKeyManager(t)
			m.host.Mounted = func(string) (bool, error) { return false, nil }
			v := create(t, m, CreateRequest{Name: "secret", Parameters: map[string]string{"encryption": "on"}, Passphrase: contract.Passphrase(passphrase)})
			loadKey(t, fake, v.Dataset) // as a crash between a stage's load and its mount leaves it
			ds := tt.change(t, m, fake, v)
			if fake.KeyLoaded(ds) {
				t.Errorf("after the %s the key of %s is loaded", tt.name, ds)
			}
		})
	}
}

// TestTheSweepUnloadsTheKeysOfCopiesNotStaged: the sweep at the node's
// start unloads the key of every encrypted copy under the root that is
// not mounted here, whatever its role, and leaves the staged one's.
func TestTheSweepUnloadsTheKeysOfCopiesNotStaged(t *testing.T) {
	ctx := context.Background()
	m, fake := newKeyManager(t)
	staged := map[string]bool{}
	m.host.Mounted = func(ds string) (bool, error) { return staged[ds], nil }
	copies := []struct {
		name, role string
		staged     bool
	}{
		{"primary-staged", contract.RolePrimary, true},
		{"primary-left-loaded", contract.RolePrimary, false}, // a create or a stage cut short
		{"replica", contract.RoleReplica, false},
		{"set-aside", contract.RoleSetAside, false},
		{"tombstone", contract.RoleDeleted, false},
	}
	for _, c := range copies {
		id := contract.VolumeIDForName(c.name)
		ds := root + "/" + id
		if c.role == contract.RoleSetAside || c.role == contract.RoleDeleted {
			ds += "-" + c.role + "-1"
		}
		props := map[string]string{copyrecord.PropVolumeID: id, copyrecord.PropRole: c.role, copyrecord.PropName: c.name, "encryption": "on"}
		if err := fake.CreateEncrypted(ctx, ds, props, []byte(passphrase)); err != nil { // its key loaded
			t.Fatal(err)
		}
		staged[ds] = c.staged
	}
	plain := create(t, m, CreateRequest{Name: "plain"})

	if err := m.SweepKeys(ctx); err != nil {
		t.Fatal(err)
	}
	for ds, want := range staged {
		if got := fake.KeyLoaded(ds); got != want {
			t.Errorf("after the sweep the key of %s is loaded: %v, want %v (staged: %v)", ds, got, want, want)
		}
	}
	if _, err := m.Get(ctx, plain.ID); err != nil {
		t.Errorf("the plain volume after the sweep: %v", err)
	}
}

// TestTheListingSweepsKeysLeftLoaded: each listing of the node's copies
// for their index unloads, apart, the keys it finds loaded on copies not
// staged.
func TestTheListingSweepsKeysLeftLoaded(t *testing.T) {
	ctx := context.Background()
	m, fake := newKeyManager(t)
	m.host.Mounted = func(string) (bool, error) { return false, nil }
	v := create(t, m, CreateRequest{Name: "secret", Parameters: map[string]string{"encryption": "on"}, Passphrase: contract.Passphrase(passphrase)})
	loadKey(t, fake, v.Dataset)
	if _, err := m.index.primaries(ctx); err != nil {
		t.Fatal(err)
	}
	waitForListing(t, &m.index.primaryIndex)
	waitForSweep(t, m)
	if fake.KeyLoaded(v.Dataset) {
		t.Error("the listing left the key of a copy not staged loaded")
	}
}

// loadKey loads the key of ds in the fake, as a crash or a failed step
// leaves it.
func loadKey(t *testing.T, fake *zfsfake.Fake, ds string) {
	t.Helper()
	if err := fake.LoadKey(context.Background(), ds, []byte(passphrase)); err != nil {
		t.Fatal(err)
	}
}
